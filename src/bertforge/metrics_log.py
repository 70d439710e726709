"""`metrics.jsonl`, a run's log of metrics: one strict-JSON record per line, each with `step` and
`split` ("train", "valid"; during a sequence-length warmup "valid_short", the held-out metrics at its
`seq_len`, and at its end "warmup_end", the first step at the full `seq_len`), appended as the run
goes, truncated to the last checkpoint on resume, and read back (a last line torn by a crash is
dropped on repair). Each appended record also goes to `--report-to` (`bertforge.reporting`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from bertforge import reporting
from bertforge.errors import BertforgeError
from bertforge.io import append_text, atomic_write_text


class MetricsLog:
    """`metrics.jsonl`: one JSON object per line, each with `step` and `split`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def truncate_after(self, step: int) -> None:
        """On resume, drop lines the interrupted run wrote after its last checkpoint, and a last line
        torn by a crash in the middle of writing it."""
        if self.path.exists():
            kept = [line for line in self.read(repair=True) if line["step"] <= step]
            atomic_write_text(self.path, "".join(json.dumps(line) + "\n" for line in kept))

    def append(self, record: dict) -> None:
        """Strict JSON: a non-finite number is written as null (bare NaN is not JSON)."""
        finite = {key: None if nonfinite(value) else value for key, value in record.items()}
        append_text(self.path, json.dumps(finite, allow_nan=False) + "\n")
        reporting.report(self.path.parent, finite)  # --report-to (only rank 0 appends)

    def read(self, repair: bool = False) -> list[dict]:
        """The records; with `repair`, an unreadable last line (torn by a crash) is left out."""
        if not self.path.exists():
            return []
        lines = [
            line for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines() if line
        ]
        records = []
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                records.append(record)
            elif not (repair and number == len(lines)):
                raise BertforgeError(
                    f"{self.path} line {number} is not a metrics record; the file is damaged "
                    "(repair or delete that line)"
                )
        return records


def nonfinite(value) -> bool:
    return isinstance(value, float) and not math.isfinite(value)
