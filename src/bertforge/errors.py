"""The one exception type for mistakes a user can fix (bad input, impossible settings), and the
interruption of a run by a signal.

The CLI catches `BertforgeError`, prints its message and exits non-zero without a traceback.
Internal invariants use `assert`; anything else that escapes is a bug and keeps its traceback.
`Interrupted` ends the process with the status of the signal that stopped the run.
"""

from __future__ import annotations

import shlex
import signal
from pathlib import Path


class BertforgeError(Exception):
    """A problem with the user's input or settings; the message names it and says how to fix it."""


def to_utf8(path: Path, encoding: str = "latin1") -> str:
    """The advice for a file that is not UTF-8: a command that converts it from `encoding`."""
    return f"convert it to UTF-8, e.g. `{rewrite_command(path, f'iconv -f {encoding} -t utf-8', 'utf8')}`"


def rewrite_command(path: Path, filter_command: str, tag: str) -> str:
    """A shell line that writes `path` through `filter_command` beside it as NAME.TAG.SUFFIX; a gzip file
    is unpacked first, and its copy keeps the ending inside (`train.tsv.gz`: `train.TAG.tsv`)."""
    packed = path.suffix.lower() == ".gz"
    source = path.with_suffix("") if packed else path
    target = shlex.quote(str(source.with_name(f"{source.stem}.{tag}{source.suffix or '.txt'}")))
    if packed:
        return f"gunzip -c {shlex.quote(str(path))} | {filter_command} > {target}"
    return f"{filter_command} < {shlex.quote(str(path))} > {target}"


class Interrupted(KeyboardInterrupt):
    """The training loop stopped at signal `signum` after step `step`, saved in `checkpoint`.
    `resume_command`, set by the command that ran the loop, continues the run; `report`: whether this
    process tells the user (under torchrun, rank 0 speaks for all)."""

    def __init__(self, signum: int, step: int, checkpoint: Path, report: bool) -> None:
        super().__init__(signum)
        self.signum, self.step, self.checkpoint, self.report = signum, step, checkpoint, report
        self.resume_command = ""

    @property
    def exit_status(self) -> int:
        return 128 + self.signum  # a shell's status for a process ended by the signal

    def __str__(self) -> str:
        how = f": {self.resume_command}" if self.resume_command else " --resume"
        name = signal.Signals(self.signum).name
        return f"stopped by {name} after step {self.step}, saved in {self.checkpoint}; continue with{how}"
