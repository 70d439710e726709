"""Independent jobs (fine-tuning runs) in parallel worker processes, each with a share of the threads.

A small model's step cannot keep a CPU's cores busy from one process: its matmuls are too small to
split well between threads, so two runs of one thread each finish sooner than the same two runs one
after the other with two threads each (`docs/records/glue.md`). `WorkerPool` starts its workers
(spawned, so that nothing of the parent's threads or devices is inherited) when it is first used;
each takes the next job, calls it and sends back what it returned.

Signals: the workers leave the terminal's process group, so that Ctrl-C reaches the parent alone.
The parent records the signal (`bertforge.signals.StopSignals`), starts no more jobs and forwards it
once to every worker, whose training loop stops at its next step with a checkpoint (a worker between
jobs ends; `JobSignals`); then it raises `Interrupted` for the first run that stopped. A second
signal is forwarded too and stops them at once. A worker whose parent was killed (so that it
forwarded nothing) signals itself the same way.
Ctrl-Z (SIGTSTP) suspends the workers with the parent, and `fg` or `bg` resumes them with it
(`SuspendTogether`).
A job's `BertforgeError` stops the others the same way and is raised in the parent with its
message; any other exception is a bug and is raised with the worker's traceback.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from bertforge.config import RuntimeConfig
from bertforge.errors import BertforgeError, Interrupted
from bertforge.runtime import resolve_device
from bertforge.signals import STOP_SIGNALS, StoppedEarly, StopSignals

POLL_S = 0.2  # how often the parent looks at its signals and its workers while it waits
ORPHAN_POLL_S = 1.0  # how often a worker looks whether its parent is still there
STOP_WAIT_S = 30.0  # how long a worker has to finish after the pool is closed


@dataclass
class Outcome:
    """A job's start or end, as a worker reports it. `kind` and `value`: "started" (the job began; no
    value), "done" (what the job returned), "stopped" (the signal, the step and the checkpoint; None
    for the last two outside a training loop), "error" (a `BertforgeError`'s message), "crash" (a
    traceback), "skipped" (not started: the pool stops)."""

    index: int
    kind: str
    value: object = None


def worker_runtime(runtime: RuntimeConfig, precision: str, threads: int) -> RuntimeConfig:
    """A run's runtime settings in a worker: the precision the parent chose (not measured again with a
    share of the threads), that share, and no data-loader processes (a daemonic worker may start none)."""
    return replace(runtime, precision=precision, threads=threads, num_workers=0)


def auto_jobs(device: str | None) -> int:
    """The fine-tuning runs at once by default: two on a CPU with two or more threads (one small
    model's step leaves them half idle: docs/records/glue.md), else one."""
    if resolve_device(device or "auto").type != "cpu" or torch.get_num_threads() < 2:
        return 1
    return 2


def check_jobs(jobs: int) -> None:
    if jobs < 1:
        raise BertforgeError(f"`jobs` must be at least 1; got {jobs}")


@dataclass(frozen=True)
class ThreadShare:
    """How a command's runs share the threads: `jobs` side by side with `threads` each, and `workers`
    to start now (fewer than `jobs` when fewer runs are left)."""

    jobs: int
    threads: int
    workers: int


def share_threads(jobs: int, threads: int, runs: int, unfinished: int) -> ThreadShare:
    """`jobs` of the `runs` side by side (no more than there are), each with an equal share of
    `threads`, in workers for the `unfinished` ones. The share follows from all the runs, not from
    those left, so that a continued command trains and scores each run as the uninterrupted one
    would have: another thread count changes a run's last bits, and they grow."""
    check_jobs(jobs)
    jobs = min(jobs, max(1, runs))
    return ThreadShare(jobs, max(1, threads // jobs), max(1, min(jobs, unfinished)))


def jobs_flag(jobs: int | None) -> str:
    """The `--jobs N` a continue command repeats when the user gave one (`share_threads`: the count
    decides each run's share of the threads, and with it the run's last bits); "" for the default."""
    return f" --jobs {jobs}" if jobs is not None else ""


def worker_pool(share: ThreadShare) -> contextlib.AbstractContextManager:
    """The share's workers; for one job at a time, none (the runs run in this process)."""
    if share.jobs == 1:
        return contextlib.nullcontext()
    return WorkerPool(share.workers, share.threads)


class WorkerPool:
    """`jobs` worker processes of `threads` threads each, started on first use; `map` runs calls."""

    def __init__(self, jobs: int, threads: int) -> None:
        self.jobs, self.threads = jobs, threads
        self.workers: list = []

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.todo, self.done, self.stopping = context.Queue(), context.Queue(), context.Event()
        self.workers = [
            context.Process(
                target=work,
                args=(self.todo, self.done, self.stopping, self.threads, os.getpid()),
                daemon=True,  # ended with the parent, whatever ends it
            )
            for _ in range(self.jobs)
        ]
        # Until a worker leaves the terminal's process group (`work`), Ctrl-C reaches it too, in the
        # middle of importing torch: started with SIGINT ignored (kept through exec, and by Python),
        # it prints no traceback. Its own handlers take over in `work`.
        ignoring = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if ignoring else None
        try:
            for worker in self.workers:
                worker.start()
        finally:
            if ignoring:
                signal.signal(signal.SIGINT, previous)

    def map(
        self,
        function: Callable,
        arguments: list[tuple],
        on_done: Callable[[int, object], None],
        on_start: Callable[[int], None] | None = None,
        on_wait: Callable[[], None] | None = None,
    ) -> list:
        """`function(*args)` for each of `arguments`, `jobs` at a time; `on_start(index)` as a worker
        begins one, `on_done(index, value)` as each finishes, `on_wait()` every `POLL_S` in between;
        the values in the order of `arguments`. `function` must be importable by name."""
        if not self.workers or not all(worker.is_alive() for worker in self.workers):
            self.close()  # a pool that was stopped starts afresh
            self.start()
        for index, args in enumerate(arguments):
            self.todo.put((index, function, args))
        waiting = Waiting(len(arguments))
        with StopSignals() as signals, SuspendTogether(self.workers):
            try:
                self.collect(waiting, signals, on_done, on_start or (lambda _index: None), on_wait)
            except KeyboardInterrupt:  # a second signal: the workers stop at once too
                self.stop(signal.SIGINT)
                raise
        return waiting.values(signals.received, [worker.exitcode for worker in self.workers])

    def collect(
        self,
        waiting: Waiting,
        signals: StopSignals,
        on_done: Callable[[int, object], None],
        on_start: Callable[[int], None],
        on_wait: Callable[[], None] | None,
    ) -> None:
        """Receive outcomes until every job has one, or, once stopping, until the workers have ended.
        A signal, a failed job or a worker that ended stops them."""
        while not waiting.complete():
            ended = any(worker.exitcode is not None for worker in self.workers)
            if (signals.received or waiting.failed() or ended) and not self.stopping.is_set():
                self.stop(signals.received or signal.SIGTERM)
            try:
                outcome = self.done.get(timeout=POLL_S)
            except queue.Empty:
                if not any(worker.is_alive() for worker in self.workers):
                    return
                if on_wait is not None:
                    on_wait()
                continue
            if outcome.kind == "started":
                on_start(outcome.index)
                continue
            waiting.outcomes[outcome.index] = outcome
            if outcome.kind == "done":
                on_done(outcome.index, outcome.value)

    def stop(self, signum: int) -> None:
        """Start no more jobs, forward `signum` to every live worker and let each end after its job."""
        self.stopping.set()
        signal_workers(self.workers, signum)
        for _ in self.workers:
            self.todo.put(None)

    def close(self) -> None:
        if not self.workers:
            return
        for _ in self.workers:
            self.todo.put(None)
        for worker in self.workers:
            worker.join(STOP_WAIT_S)
            if worker.is_alive():
                worker.terminate()
                worker.join()
        self.workers = []


class SuspendTogether:
    """While in the block, SIGTSTP (Ctrl-Z) stops the workers, then this process; when this process is
    continued (`fg`, `bg`, SIGCONT), so are they. The terminal's stop reaches this process alone: the
    workers left its process group. Outside the main thread, or where SIGTSTP is ignored, nothing
    changes."""

    def __init__(self, workers: list) -> None:
        self.workers, self.installed, self.previous = workers, False, None

    def __enter__(self) -> SuspendTogether:
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGTSTP) is not signal.SIG_IGN:
            self.previous = signal.signal(signal.SIGTSTP, self.suspend)
            self.installed = True
        return self

    def suspend(self, _signum: int, _frame) -> None:
        signal_workers(self.workers, signal.SIGSTOP)
        # SIGSTOP: the kernel drops a default SIGTSTP in an orphaned process group
        os.kill(os.getpid(), signal.SIGSTOP)  # returns once continued
        signal_workers(self.workers, signal.SIGCONT)

    def __exit__(self, *_exc) -> None:
        if self.installed:
            signal.signal(signal.SIGTSTP, signal.SIG_DFL if self.previous is None else self.previous)


def signal_workers(workers: list, signum: int) -> None:
    for worker in workers:
        if worker.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signum)


class Waiting:
    """The parent's account of one `map`: each job's outcome."""

    def __init__(self, count: int) -> None:
        self.count, self.outcomes = count, {}

    def complete(self) -> bool:
        return len(self.outcomes) == self.count

    def failed(self) -> bool:
        return any(outcome.kind in ("error", "crash") for outcome in self.outcomes.values())

    def values(self, signum: int, exit_codes: list) -> list:
        """The jobs' values in order, or the first failure raised: a bug, a user's error, a signal."""
        ended = sorted(self.outcomes.values(), key=lambda outcome: outcome.index)
        unfinished = not self.complete() or any(outcome.kind == "skipped" for outcome in ended)
        errors = any(outcome.kind == "error" for outcome in ended)
        if signum:
            ended.append(Outcome(self.count, "stopped", (signum, None, None)))
        elif unfinished and not errors:  # after a job's error the pool stops: the queued jobs never run
            why = f"it ended before its job did (the workers' exit codes: {', '.join(map(str, exit_codes))})"
            ended.append(Outcome(self.count, "crash", why))
        for kind in ("crash", "error", "stopped"):
            failed = [outcome for outcome in ended if outcome.kind == kind]
            if kind == "crash" and failed:
                raise RuntimeError(f"a fine-tuning worker failed:\n{failed[0].value}")
            if kind == "error" and failed:
                raise BertforgeError(failed[0].value)
            if failed:
                raise stopped(failed)
        return [self.outcomes[index].value for index in range(self.count)]


def stopped(failed: list[Outcome]) -> Interrupted:
    """`Interrupted` for the first run that saved a checkpoint when it stopped, else `StoppedEarly`."""
    for outcome in failed:
        signum, step, checkpoint = outcome.value
        if step is not None:
            return Interrupted(signum, step, Path(checkpoint), report=True)
    return StoppedEarly(
        failed[0].value[0], "before the runs under way saved a checkpoint", "run the same command again"
    )


# ------------------------------------------------------------------------------------ in a worker


def work(todo, done, stopping, threads: int, parent: int) -> None:
    """A worker's life: take a job, run it, report its outcome; end at None, at a stop signal between
    jobs, or once the parent is gone."""
    os.setpgrp()  # the terminal's Ctrl-C goes to the parent, which forwards it once
    signals = JobSignals()
    for signum in STOP_SIGNALS:
        signal.signal(signum, signals.handle)
    sys.unraisablehook = signals.unraisable
    # A suspended worker whose parent dies gets SIGHUP, then SIGCONT, from the kernel (its process
    # group is orphaned); once continued, `stop_when_orphaned` stops its run with a checkpoint.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    torch.set_num_threads(threads)
    threading.Thread(target=stop_when_orphaned, args=(parent,), daemon=True).start()
    with contextlib.suppress(KeyboardInterrupt):  # a third signal while a stopped job's outcome is made
        while os.getppid() == parent and not signals.received:
            try:
                job = todo.get(timeout=1.0)
            except queue.Empty:
                continue
            if job is None:
                return
            index, function, args = job
            if stopping.is_set() or signals.received:
                done.put(Outcome(index, "skipped"))
                continue
            done.put(Outcome(index, "started"))
            done.put(signals.run(index, function, args))


class JobSignals:
    """A worker's SIGINT and SIGTERM: inside a job they raise KeyboardInterrupt, as in a process of
    its own (a training loop records them itself); between jobs they are only recorded, and the
    worker ends before its next job. Raised there, one could leave a queue's lock held by a dead
    worker, or half a message read, and its partner would wait forever for the next job."""

    def __init__(self) -> None:
        self.received, self.in_job = 0, False

    def handle(self, signum: int, _frame) -> None:
        self.received = signum
        if self.in_job:
            raise KeyboardInterrupt

    def unraisable(self, unraisable) -> None:
        """`sys.unraisablehook`: a KeyboardInterrupt this handler raised inside a finalizer (a weakref's
        callback during garbage collection) is dropped by Python there; it is not printed as a
        traceback either. The signal stays recorded: the job runs on to its end, then the worker ends."""
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and self.received:
            return
        sys.__unraisablehook__(unraisable)

    def run(self, index: int, function: Callable, args: tuple) -> Outcome:
        try:
            self.in_job = True
            if self.received:  # it came after the loop looked, before the job began
                raise KeyboardInterrupt
            return outcome(index, function, args)
        except KeyboardInterrupt:  # outside a training loop, or its second signal
            return Outcome(index, "stopped", (self.received, None, None))
        finally:
            self.in_job = False


def stop_when_orphaned(parent: int) -> None:
    """Signal this worker once its parent is gone (killed, so it forwarded nothing): the run under way
    stops at its next step with a checkpoint, as at Ctrl-C, instead of training on for no one."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)


def outcome(index: int, function: Callable, args: tuple) -> Outcome:
    try:
        return Outcome(index, "done", function(*args))
    except Interrupted as stop:
        return Outcome(index, "stopped", (stop.signum, stop.step, str(stop.checkpoint)))
    except BertforgeError as error:
        return Outcome(index, "error", str(error))
    except Exception:
        return Outcome(index, "crash", traceback.format_exc())
