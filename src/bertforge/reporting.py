"""Metrics for other viewers than `metrics.jsonl`: `--report-to tensorboard`.

The `pretrain` and `finetune` commands open `reporting_to(out, target)` (and a fine-tuning worker
process enters it again for its run). Within it, every record a run
appends to its `metrics.jsonl` (`metrics_log.MetricsLog.append` calls `report`; only rank 0 appends) is
also written as TensorBoard scalars, tagged `split/key` (`valid/mlm_loss`) at the record's step,
under OUT/tensorboard/. A run in a subfolder of OUT (a fine-tuning seed's OUT/seed_1) writes to the
same subfolder of OUT/tensorboard/, so TensorBoard shows each seed as a run of its own. A resumed
run purges the events the interrupted one wrote after its last checkpoint, as it drops those
lines from `metrics.jsonl`. Outside the block nothing is reported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from bertforge.errors import BertforgeError

TARGETS = ("none", "tensorboard")
FOLDER = "tensorboard"
INSTALL = "pip install 'bertforge[tensorboard]'"
# Fields that place a record rather than measure the model.
BOOKKEEPING = frozenset({"step", "split", "epoch", "tokens", "elapsed_s", "seq_len"})


def open_tensorboard_writer(log_dir: Path, purge_step: int):
    """A `torch.utils.tensorboard.SummaryWriter`; events at or after `purge_step` from an earlier
    process in `log_dir` are hidden (a resumed run writes them again)."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)


class TensorBoardReporter:
    """One event writer per run folder under `root`, opened at the run's first record."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.writers: dict[Path, object] = {}

    def report(self, run_dir: Path, record: dict) -> None:
        run_dir = Path(run_dir).resolve()
        if run_dir != self.root and self.root not in run_dir.parents:
            return  # another folder's metrics (no command writes them inside the block)
        if run_dir not in self.writers:
            log_dir = self.root / FOLDER / run_dir.relative_to(self.root)
            self.writers[run_dir] = open_tensorboard_writer(log_dir, purge_step=record["step"])
        writer = self.writers[run_dir]
        for key, value in scalars(record).items():
            writer.add_scalar(f"{record['split']}/{key}", value, record["step"])
        writer.flush()  # a user watching the run sees each record as it is logged

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()


def scalars(record: dict) -> dict[str, float]:
    """The record's numbers that measure the model (a confusion matrix or a label list is no scalar)."""
    return {
        key: value
        for key, value in record.items()
        if key not in BOOKKEEPING and isinstance(value, int | float) and not isinstance(value, bool)
    }


_reporters: list[TensorBoardReporter] = []


@contextlib.contextmanager
def reporting_to(out: Path, target: str) -> Iterator[None]:
    """Report the metrics of the runs in `out` to `target` ("none" or "tensorboard") within the block."""
    if target == "none":
        yield
        return
    try:
        import tensorboard  # noqa: F401  (SummaryWriter imports it only when a writer opens)
    except ImportError:
        raise BertforgeError(
            f"--report-to {target} needs the tensorboard package, which is not installed: {INSTALL}"
        ) from None
    reporter = TensorBoardReporter(out)
    _reporters.append(reporter)
    try:
        yield
    finally:
        _reporters.remove(reporter)
        reporter.close()


def continue_flag() -> str:
    """The ` --report-to` flag of a command that continues this one, so that it goes on reporting
    ("" when nothing is reported)."""
    return " --report-to tensorboard" if _reporters else ""


def reported_roots() -> list[Path]:
    """The folders whose runs' metrics are reported now (a worker process reports to them too)."""
    return [reporter.root for reporter in _reporters]


def report(run_dir: Path, record: dict) -> None:
    """Hand a record just appended to `run_dir`/metrics.jsonl to the active reporters."""
    for reporter in _reporters:
        reporter.report(run_dir, record)
