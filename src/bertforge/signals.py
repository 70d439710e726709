"""SIGINT and SIGTERM during training: recorded, not acted on, so that the loop stops between steps
with a checkpoint (`StopSignals`); data workers ignore them (`ignore_stop_signals`), the loop
stops them. Code that a KeyboardInterrupt must not reach halfway holds them until it ends
(`stop_signals_held`). Ctrl-C before a loop has saved anything, or in a command without one, is
reported as `StoppedEarly`, which says what to do instead of `--resume`; outside a loop SIGTERM
unwinds as Ctrl-C does (`sigterm_unwinds`), so that its temporaries are removed too.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from bertforge.errors import Interrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def ignore_stop_signals(_worker_id: int) -> None:
    """A data worker's start (`DataLoader(worker_init_fn=...)`): the signal reaches the whole process
    group, and the loop, not the signal, ends the workers."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


class Terminated(KeyboardInterrupt):
    """SIGTERM raised where Ctrl-C raises KeyboardInterrupt (`sigterm_unwinds`)."""

    signum = signal.SIGTERM


def _raise_terminated(_signum: int, _frame) -> None:
    raise Terminated


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block SIGTERM raises `Terminated`, as Ctrl-C raises KeyboardInterrupt: what a command
    was writing is removed on the way out (the default action ended the process there and then, its
    temporaries left behind). A SIGTERM the process ignores (nohup), or one off the main thread, is
    left as it is; a training loop records it (`StopSignals`) and stops with a checkpoint."""
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or previous is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is _raise_terminated:  # kept where a rank set it ignored since
            signal.signal(signal.SIGTERM, previous)


def signal_of(stop: KeyboardInterrupt) -> int:
    """The signal a KeyboardInterrupt stands for: SIGTERM for `Terminated`, else SIGINT (Ctrl-C)."""
    return getattr(stop, "signum", signal.SIGINT)


class StopSignals:
    """While in the block, SIGINT and SIGTERM only set `received` (the signal's number; 0 while none).

    The handler also puts the previous handlers back, so a second signal acts at once (Ctrl-C raises
    KeyboardInterrupt). A signal the process ignored stays ignored (a job started with nohup), and
    outside the main thread, where Python cannot handle signals, nothing changes.
    """

    def __init__(self) -> None:
        self.received = 0
        self.previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self.previous[signum] = signal.signal(signum, self.record)
        return self

    def record(self, signum: int, _frame) -> None:
        self.received = signum
        self.restore()

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self.previous = {}

    def __exit__(self, *_exc) -> None:
        self.restore()


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends, then act as they would have (a second one acts at
    once). matplotlib's C++ drawing code turns a KeyboardInterrupt raised inside it into another
    exception, such as "ValueError: Invalid bounding box", which would end a stopped run as a bug."""
    with StopSignals() as signals:
        yield
    if signals.received:
        signal.raise_signal(signals.received)


class StoppedEarly(Interrupted):
    """A signal that stopped a command where no checkpoint of the step under way was saved: before a
    training loop started (a tokenizer or shards being built), or a second signal. `when` says where
    it stopped ("" when that says nothing), `then` what to do: run the command again, or the command
    that continues the run from what it kept (`resume_command`, where the command sets it)."""

    def __init__(self, signum: int, when: str, then: str, report: bool = True) -> None:
        super().__init__(signum, 0, Path(), report)
        self.when, self.then = when, then

    def __str__(self) -> str:
        when = f" {self.when}" if self.when else ""
        then = f"continue with: {self.resume_command}" if self.resume_command else self.then
        return f"stopped by {signal.Signals(self.signum).name}{when}; {then}"
