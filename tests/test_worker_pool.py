"""The worker pool: jobs run in spawned workers of their own threads and come back in order; a user's
error, a bug and a worker that dies each end `map` with one clear exception; a signal to the parent
stops the workers' jobs once, starts no more, and is raised as `Interrupted`."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from test_faults import wait_for

from bertforge.errors import BertforgeError, Interrupted
from bertforge.signals import StopSignals
from bertforge.worker_pool import ORPHAN_POLL_S, WorkerPool, auto_jobs, share_threads, work, worker_pool

# ------------------------------------------------------------- jobs (module level: workers import them)


def where_and_what(value: int) -> tuple[int, int, int, int]:
    return os.getpid(), os.getpgrp(), torch.get_num_threads(), value * value


def refuse(value: int) -> None:
    raise BertforgeError(f"value {value} is not allowed; give another")


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def divide(value: int) -> float:
    return 1 / value


def die(code: int) -> None:
    os._exit(code)


def train_until_stopped(marks: str, index: int) -> str:
    """A training loop's way with signals: note the start, run until a signal, then 'save' and stop."""
    Path(marks, f"started_{index}").touch()
    with StopSignals() as signals:
        deadline = time.monotonic() + 60
        while not signals.received and time.monotonic() < deadline:
            time.sleep(0.01)
    if not signals.received:
        return "never stopped"
    checkpoint = Path(marks, f"checkpoint_{index}")
    checkpoint.touch()
    raise Interrupted(signals.received, 7, checkpoint, report=True)


def wait_for_go(marks: str, index: int) -> int:
    """Say which process runs this, then wait (a minute at most) for the test's go."""
    Path(marks, f"worker_{os.getpid()}").touch()
    deadline = time.monotonic() + 60
    while not Path(marks, "go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return index


class SignalOnTaking:
    """A queue's lock that raises SIGTERM in its process just after it is taken: the worst moment for
    a stop signal to reach a worker between jobs (`signal.raise_signal` runs the handler at once)."""

    def __init__(self, lock) -> None:
        self.lock, self.signalled = lock, False

    def acquire(self, *args) -> bool:
        taken = self.lock.acquire(*args)
        if taken and not self.signalled:
            self.signalled = True
            signal.raise_signal(signal.SIGTERM)
        return taken

    def release(self) -> None:
        self.lock.release()


def worker_signalled_as_it_takes_a_job(todo, done, stopping) -> None:
    """A worker (`work`) whose first stop signal lands as it takes the job queue's lock; its exit code
    says whether it left that lock free (0) or held, so that no other worker could take a job (1)."""
    lock = todo._rlock
    todo._rlock = SignalOnTaking(lock)
    work(todo, done, stopping, 1, os.getppid())
    free = lock.acquire(False)
    if free:
        lock.release()
    sys.exit(0 if free else 1)


def process_state(pid: int) -> str:
    """The kernel's one-letter state of a process: T when stopped."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def parent_of_two_workers(job: str, marks: str, jobs: int) -> subprocess.Popen:
    """A process (SIGTSTP at its default, as under a shell) whose pool of two workers runs `jobs`
    calls of `job`, one of this module's functions, `job(marks, index)`; it prints their values."""
    script = (
        "import signal, sys; signal.signal(signal.SIGTSTP, signal.SIG_DFL)\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from bertforge.worker_pool import WorkerPool\n"
        f"from test_worker_pool import {job}\n"
        "with WorkerPool(2, 1) as pool:\n"
        f"    print(pool.map({job}, [({marks!r}, i) for i in range({jobs})], lambda i, value: None))\n"
    )
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# ---------------------------------------------------------------------------------------- tests


def test_jobs_run_in_workers_with_their_share_of_threads_and_come_back_in_order():
    events = []  # ("start" or "end", index), as the parent hears of them
    with WorkerPool(2, 1) as pool:
        results = pool.map(
            where_and_what,
            [(v,) for v in range(6)],
            lambda i, value: events.append(("end", i)),
            lambda i: events.append(("start", i)),
        )
        waits = []
        again = pool.map(where_and_what, [(10,)], lambda i, value: None)
        assert pool.map(nap, [(1.0,)], lambda i, value: None, None, lambda: waits.append(1)) == [1.0]
    assert [r[3] for r in results] == [v * v for v in range(6)] and again[0][3] == 100
    assert len(waits) >= 2  # the parent polled while the job slept
    assert sorted(events) == [(kind, i) for kind in ("end", "start") for i in range(6)]
    under_way = [sum(+1 if kind == "start" else -1 for kind, _ in events[: k + 1]) for k in range(12)]
    assert all(events.index(("start", i)) < events.index(("end", i)) for i in range(6))
    assert max(under_way) <= 2 and under_way[-1] == 0  # two workers: no more than two jobs at once
    pids = {r[0] for r in results}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert again[0][0] in pids  # the same workers serve every map
    assert all(r[1] == r[0] for r in results)  # each leads its own process group: Ctrl-C reaches the parent
    assert {r[2] for r in results} == {1}
    assert multiprocessing.active_children() == []


def test_a_users_error_in_a_job_is_raised_with_its_message():
    with (
        WorkerPool(2, 1) as pool,
        pytest.raises(BertforgeError, match="value 3 is not allowed; give another"),
    ):
        pool.map(refuse, [(3,)], lambda i, value: None)


def refuse_the_first(index: int) -> int:
    if index == 0:
        refuse(index)
    time.sleep(1.0)  # the others still run when the first fails
    return index


def test_a_users_error_in_one_of_more_jobs_than_workers_is_raised_with_its_message():
    """The jobs still queued when it fails are never run: no worker crashed."""
    with (
        WorkerPool(2, 1) as pool,
        pytest.raises(BertforgeError, match="value 0 is not allowed; give another"),
    ):
        pool.map(refuse_the_first, [(index,) for index in range(5)], lambda i, value: None)


def test_a_bug_in_a_job_is_raised_with_the_workers_traceback():
    with WorkerPool(1, 1) as pool, pytest.raises(RuntimeError, match="(?s)in divide.*ZeroDivisionError"):
        pool.map(divide, [(1,), (0,)], lambda i, value: None)


def test_a_worker_that_dies_is_reported_with_its_exit_code():
    with (
        WorkerPool(2, 1) as pool,
        pytest.raises(RuntimeError, match=r"ended before its job did \(the workers' exit codes: .*\b3\b"),
    ):
        pool.map(die, [(3,)], lambda i, value: None)
    assert multiprocessing.active_children() == []


def test_a_signal_to_the_parent_stops_each_running_job_once_and_starts_no_more(tmp_path):
    def signal_once_both_started() -> None:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("started_*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    with WorkerPool(2, 1) as pool:
        threading.Thread(target=signal_once_both_started, daemon=True).start()
        with pytest.raises(Interrupted) as stop:
            pool.map(train_until_stopped, [(str(tmp_path), i) for i in range(5)], lambda i, value: None)
    assert stop.value.signum == signal.SIGTERM and stop.value.step == 7
    started = sorted(p.name for p in tmp_path.glob("started_*"))
    assert len(started) == 2  # the queued jobs were not started
    # each running job received one signal: it "saved" and stopped instead of dying at a second one
    assert sorted(p.name for p in tmp_path.glob("checkpoint_*")) == [
        s.replace("started", "checkpoint") for s in started
    ]
    assert multiprocessing.active_children() == []


CTRL_C_AT_START = """
import os, signal
from test_worker_pool import where_and_what
from bertforge.worker_pool import WorkerPool

with WorkerPool(2, 1) as pool:
    pool.start()
    signal.signal(signal.SIGINT, lambda *_: None)  # this parent lives on, to see whether its workers do
    os.killpg(os.getpgrp(), signal.SIGINT)  # Ctrl-C: to the terminal's whole process group
    print(pool.map(where_and_what, [(2,), (3,)], lambda i, value: None)[-1][-1])
"""


def test_ctrl_c_while_the_workers_start_prints_no_traceback_from_them():
    """A worker is in the terminal's process group until it leaves it, in the middle of importing
    torch: Ctrl-C then must not end it with a traceback of its own."""
    tests = str(Path(__file__).parent)
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_AT_START],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        start_new_session=True,  # its own process group, which the signal reaches
    )
    assert "Traceback" not in done.stderr and done.returncode == 0, done.stderr
    assert done.stdout == "9\n"


def test_a_signal_to_a_worker_as_it_takes_a_job_leaves_the_queue_free_for_the_other_worker():
    """A stop signal between jobs is recorded, not raised inside the queue's code: raised there, it
    could end the worker with the queue's lock held, and its partner would wait forever for work."""
    context = multiprocessing.get_context("spawn")
    todo, done, stopping = context.Queue(), context.Queue(), context.Event()
    worker = context.Process(target=worker_signalled_as_it_takes_a_job, args=(todo, done, stopping))
    worker.start()
    worker.join(60)
    assert worker.exitcode == 0  # it ended at the signal, and the lock it had taken is free
    todo.put((0, where_and_what, (3,)))
    assert todo.get(timeout=10)[2] == (3,)  # the job queue still serves jobs


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the processes' states in /proc")
def test_ctrl_z_suspends_the_workers_with_the_parent_and_fg_resumes_them(tmp_path):
    """The workers left the terminal's process group, so Ctrl-Z reaches the parent alone: it stops
    them before itself, and they go on when it is continued, and finish their jobs."""
    marks = str(tmp_path)
    parent = parent_of_two_workers("wait_for_go", marks, 2)
    try:
        wait_for(lambda: len(list(tmp_path.glob("worker_*"))) == 2, parent)
        processes = [parent.pid] + [int(p.name.removeprefix("worker_")) for p in tmp_path.glob("worker_*")]
        os.kill(parent.pid, signal.SIGTSTP)
        wait_for(lambda: [process_state(pid) for pid in processes] == ["T"] * 3, None, 15)
        os.kill(parent.pid, signal.SIGCONT)
        wait_for(lambda: "T" not in [process_state(pid) for pid in processes], None, 15)
        Path(marks, "go").touch()
        out, err = parent.communicate(timeout=60)
    finally:
        parent.kill()
        parent.wait()
    assert parent.returncode == 0, err.decode()
    assert out.decode().strip() == "[0, 1]"


@pytest.mark.parametrize(
    "suspended",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads a state in /proc"),
        ),
    ],
)
def test_workers_whose_parent_is_killed_stop_their_jobs_with_a_checkpoint_and_start_no_more(
    tmp_path, suspended
):
    """A SIGKILLed parent forwards no signal: each worker sees it is gone and signals itself, so its
    run stops at the next step with a checkpoint instead of training on (here for a minute). Killed
    while suspended (Ctrl-Z), the kernel hangs up on its stopped workers, then continues them: they
    outlive the hang-up and stop the same way."""
    marks = str(tmp_path)
    parent = parent_of_two_workers("train_until_stopped", marks, 5)
    try:
        wait_for(lambda: len(list(tmp_path.glob("started_*"))) == 2, parent)
        if suspended:
            os.kill(parent.pid, signal.SIGTSTP)
            wait_for(lambda: process_state(parent.pid) == "T", parent, 15)  # it stopped its workers first
    finally:
        parent.kill()
        parent.wait()
    started = sorted(p.name for p in tmp_path.glob("started_*"))
    checkpoints = [name.replace("started", "checkpoint") for name in started]

    def saved() -> bool:
        return sorted(p.name for p in tmp_path.glob("checkpoint_*")) == checkpoints

    wait_for(saved, None, 30)  # well before a minute of training would end: a loaded machine may be late
    time.sleep(2 * ORPHAN_POLL_S)
    assert sorted(p.name for p in tmp_path.glob("started_*")) == started  # no queued job was started


def test_two_runs_at_a_time_by_default_on_a_cpu_with_two_threads_or_more():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert auto_jobs("cpu") == 1 and auto_jobs(None) in (1, 2)
        torch.set_num_threads(2)
        assert auto_jobs("cpu") == 2
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(BertforgeError, match="`jobs` must be at least 1; got 0"):
        share_threads(0, 2, 3, 3)
    # one run left of four, two at a time: one worker of one thread
    pool = worker_pool(share_threads(2, 2, 4, 1))
    assert isinstance(pool, WorkerPool) and (pool.jobs, pool.threads) == (1, 1)


def test_a_stop_signal_lost_in_a_finalizer_prints_no_traceback(capsys, monkeypatch):
    """A worker's signal raises KeyboardInterrupt wherever the job is; inside a finalizer (a weakref's
    callback during garbage collection) Python drops it and would print "Exception ignored" with a
    traceback. The worker prints nothing of it (the signal stays recorded); other lost exceptions are
    printed as usual."""
    from bertforge.worker_pool import JobSignals

    class Finalized:
        def __init__(self, error: BaseException) -> None:
            self.error = error

        def __del__(self) -> None:
            raise self.error

    signals = JobSignals()
    signals.received = signal.SIGTERM
    monkeypatch.setattr(sys, "unraisablehook", signals.unraisable)
    Finalized(KeyboardInterrupt())  # dropped at once, its finalizer raising
    assert capsys.readouterr().err == ""
    Finalized(ValueError("a bug"))
    assert "ValueError: a bug" in capsys.readouterr().err
