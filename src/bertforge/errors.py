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
    """The advice for a file that is not UTF-8: a command that converts it from `encoding` (a gzip
    file unpacked first), written beside it."""
    if path.suffix.lower() == ".gz":
        converted = path.with_suffix("").with_suffix(".utf8.txt")
        unpack = f"gunzip -c {shlex.quote(str(path))}"
        command = f"{unpack} | iconv -f {encoding} -t utf-8 > {shlex.quote(str(converted))}"
    else:
        converted = path.with_name(f"{path.stem}.utf8{path.suffix}")
        command = f"iconv -f {encoding} -t utf-8 {shlex.quote(str(path))} > {shlex.quote(str(converted))}"
    return f"convert it to UTF-8, e.g. `{command}`"


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
