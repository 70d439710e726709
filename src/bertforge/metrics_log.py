"""`metrics.jsonl`, a run's log of metrics: one strict-JSON record per line, each with `step` and
`split` ("train", "valid"; during a sequence-length warmup "valid_short", the held-out metrics at its
`seq_len`, and at its end "warmup_end", the first step at the full `seq_len`), appended as the run
goes, truncated to the last checkpoint on resume, and read back (a last line torn by a crash is
dropped on repair). Each appended record also goes to `--report-to` (`bertforge.reporting`).

On CUDA a train record also has `mfu` and `peak_memory_gib` (`DeviceFigures`); elsewhere it has not.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from bertforge import flops, reporting
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
            if (
                isinstance(record, dict)
                and isinstance(record.get("step"), int)
                and isinstance(record.get("split"), str)
            ):
                records.append(record)
            elif not (repair and number == len(lines)):
                raise BertforgeError(
                    f"{self.path} line {number} is not a metrics record; the file is damaged "
                    "(repair or delete that line)"
                )
        return records


class DeviceFigures:
    """What a log window adds to its train record on CUDA: `mfu`, the model FLOPs per second of its
    steps (`bertforge.flops`: the work of its real tokens at the batches' sequence length) as a share
    of the GPUs' dense bf16 peak, left out for a GPU that `flops.PEAK_BF16_TFLOPS` does not know; and
    `peak_memory_gib`, the most memory tensors held on this GPU since the last train record. Both are
    read on the host, without waiting for the GPU. Elsewhere nothing: a CPU run's records stay as
    they are."""

    def __init__(self, model_config, device: torch.device, world_size: int = 1) -> None:
        self.config = model_config  # sizes as `flops` reads them; None: no MFU
        self.device = device
        self.on_cuda = device.type == "cuda"
        peak = flops.peak_bf16_flops(torch.cuda.get_device_name(device)) if self.on_cuda else None
        self.peak = peak * world_size if peak else None  # every rank's tokens are counted

    def __call__(self, totals: dict[str, float], tokens: float, seconds: float, seq_len: int) -> dict:
        """The figures of a window of `seconds` that trained `tokens` real tokens (all ranks), with the
        loss sums `totals` (its predicted positions and NSP pairs), in sequences of `seq_len`."""
        if not self.on_cuda:
            return {}
        figures = {}
        if self.peak and self.config is not None:
            predicted = totals.get("mlm_count", totals.get("clm_count", 0.0))
            work = flops.training_flops(self.config, tokens, seq_len, predicted, totals.get("nsp_count", 0.0))
            figures["mfu"] = round(flops.mfu(work, seconds, self.peak), 4)
        figures["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(self.device) / 2**30, 3)
        torch.cuda.reset_peak_memory_stats(self.device)
        return figures


def nonfinite(value) -> bool:
    return isinstance(value, float) and not math.isfinite(value)
