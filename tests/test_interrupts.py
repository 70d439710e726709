"""Interruptions: SIGTERM and SIGINT save a checkpoint and a resumed run ends as the uninterrupted one,
`--resume` of a run killed before its first checkpoint starts it afresh, and under several processes
a lost rank is named by the others and `torchrun --max-restarts` resumes the run by itself.

Every process a test starts runs in a session of its own, killed with all it started when the test
leaves, so that none outlives its test."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_distributed import free_port
from test_faults import cli_pretrain
from test_finetune_cli import finetune_argv, pair_rows, write_csv

from bertforge.checkpoint import list_checkpoints, read_weights
from bertforge.cli import main
from bertforge.errors import Interrupted
from bertforge.plots import pyplot, save_png
from bertforge.signals import StopSignals

BERTFORGE = [sys.executable, "-m", "bertforge"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
# A constant learning rate, so that a run of 100,000 steps stopped at step k is, up to step k, the run
# of k + 2 steps it is compared with; one thread, so that every process computes alike.
RECIPE = [
    "--set", "train.schedule=constant", "--set", "train.warmup_ratio=0", "--set", "train.log_every=1",
    "--set", "train.eval_every=100000", "--set", "runtime.threads=1",
]  # fmt: skip
ENDLESS = ["--max-steps", "100000"]


def default_sigint() -> None:
    """Ctrl-C as a terminal delivers it, even where pytest itself runs with SIGINT ignored (a shell
    starts background jobs so, and a process keeps an ignored signal ignored, as bertforge does)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def python_sigint():
    """In-process tests see Python's own Ctrl-C handler, whatever this process inherited."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, inherited)


@pytest.fixture(autouse=True)
def keep_threads():
    """In-process runs set torch's thread count (`runtime.threads`); later tests get it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@contextlib.contextmanager
def started(command: list, log: Path, **env: str) -> Iterator[subprocess.Popen]:
    """`command` in a session of its own, its output in `log`; on leaving, the session and every
    process started from it (torchrun's workers have sessions of their own) are killed."""
    with log.open("wb") as output:
        process = subprocess.Popen(
            [str(part) for part in command],
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
            preexec_fn=default_sigint,
        )
    try:
        yield process
    finally:
        stray = descendants(process.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        for pid in stray:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait()


def parents() -> dict[int, int]:
    """Every process's parent, by PID."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            found[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    return found


def descendants(pid: int) -> list[int]:
    tree, found, generation = parents(), [], [pid]
    while generation:
        generation = [child for child, parent in tree.items() if parent in generation]
        found += generation
    return found


def wait_until(condition, process: subprocess.Popen, log: Path, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None, f"the process ended early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def metrics(run: Path, split: str = "train") -> list[dict]:
    """The run's metrics lines of `split`, without speeds (a line being written is left out)."""
    lines = []
    path = run / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):
            record = json.loads(line)
            for speed in ("tokens_per_s", "elapsed_s"):
                record.pop(speed, None)
            lines.append(record)
    return [record for record in lines if record["split"] == split]


def steps(run: Path) -> list[int]:
    return [record["step"] for record in metrics(run)]


def last_step(run: Path) -> int:
    return int(list_checkpoints(run)[-1].name.split("_")[1])


def assert_same_weights(first: Path, second: Path) -> None:
    a, b = read_weights(first / "model.safetensors"), read_weights(second / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a), "the weights differ"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.slow
def test_a_signal_saves_the_step_and_the_resumed_run_ends_as_the_uninterrupted_one(
    tmp_path, signum, wiki_slice, small_tokenizer_dir
):
    run, log = tmp_path / "run", tmp_path / "run.log"
    with started(
        [*BERTFORGE, *cli_pretrain(wiki_slice, small_tokenizer_dir, run, *RECIPE, *ENDLESS)], log
    ) as p:
        wait_until(lambda: len(steps(run)) >= 2, p, log)
        p.send_signal(signum)
        assert p.wait(timeout=60) == 128 + signum
    step = last_step(run)
    assert steps(run) == list(range(1, step + 1))  # nothing after the saved step
    assert log.read_text().strip().splitlines()[-1] == (
        f"bertforge: stopped by {signum.name} after step {step}, saved in {run}/checkpoints/step_{step:06d}; "
        f"continue with: bertforge pretrain --out {run} --resume"
    )

    assert main(["pretrain", "--out", str(run), "--resume", "--max-steps", str(step + 2), "--quiet"]) == 0
    reference = tmp_path / "reference"
    argv = cli_pretrain(wiki_slice, small_tokenizer_dir, reference, *RECIPE, "--max-steps", str(step + 2))
    assert main(argv) == 0
    assert metrics(run) == metrics(reference)
    assert_same_weights(run / "final", reference / "final")


@pytest.mark.slow
def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_it_afresh(
    tmp_path, wiki_slice, small_tokenizer_dir
):
    run, log = tmp_path / "run", tmp_path / "run.log"
    with started(
        [*BERTFORGE, *cli_pretrain(wiki_slice, small_tokenizer_dir, run, *RECIPE, *ENDLESS)], log
    ) as p:
        wait_until(lambda: steps(run), p, log)
        os.killpg(p.pid, signal.SIGKILL)
    assert not list_checkpoints(run) and (run / "config.json").is_file()

    resume = [*BERTFORGE, "pretrain", "--out", run, "--resume", "--max-steps", "3", "--quiet"]
    with started(resume, log) as p:  # outside pytest's capture of warnings
        assert p.wait(timeout=120) == 0, log.read_text()[-3000:]
    notices = [line for line in log.read_text().splitlines() if line.startswith("bertforge:")]
    assert notices == [
        f"bertforge: warning: {run} has no checkpoint yet (its run stopped before the first one); "
        "starting the run afresh"
    ]
    reference = tmp_path / "reference"
    assert main(cli_pretrain(wiki_slice, small_tokenizer_dir, reference, *RECIPE, "--max-steps", "3")) == 0
    assert steps(run) == [1, 2, 3] and metrics(run) == metrics(reference)
    assert_same_weights(run / "final", reference / "final")


@pytest.mark.slow
def test_finetune_saves_the_step_at_sigterm_and_resumes_to_the_uninterrupted_run(
    tmp_path, tiny_pretrained_run
):
    train = write_csv(tmp_path / "train.csv", pair_rows(800, 0))  # 100 steps per epoch
    valid = write_csv(tmp_path / "valid.csv", pair_rows(16, 1))
    settings = [
        "--epochs",
        "2",
        "--precision",
        "fp32",
        "--set",
        "runtime.threads=1",
        "--set",
        "train.log_every=1",
    ]
    run, log = tmp_path / "run", tmp_path / "run.log"
    with started([*BERTFORGE, *finetune_argv(tiny_pretrained_run, train, valid, run, *settings)], log) as p:
        wait_until(lambda: steps(run), p, log)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 128 + signal.SIGTERM
    last_line = log.read_text().strip().splitlines()[-1]
    assert last_line.endswith(f"; continue with: bertforge finetune --out {run} --resume")
    assert list_checkpoints(run) and not (run / "result.json").exists()

    assert main(["finetune", "--out", str(run), "--resume", "--quiet"]) == 0
    reference = tmp_path / "reference"
    assert main(finetune_argv(tiny_pretrained_run, train, valid, reference, *settings)) == 0
    assert metrics(run, "valid") == metrics(reference, "valid")
    assert_same_weights(run / "final", reference / "final")


def test_a_second_ctrl_c_while_a_checkpoint_is_written_stops_once_it_is_whole(
    tmp_path, wiki_slice, small_tokenizer_dir, monkeypatch, capsys
):
    """Both Ctrl-Cs arrive inside torch.save of step 2's checkpoint: the first asks the loop to stop,
    the second, acted on there, would break torch's zip writer into a RuntimeError ("unexpected pos",
    as the fault matrix once caught). Held until the checkpoint is whole, it stops the run with step 2
    kept, and `--resume` ends as the uninterrupted run."""
    save, calls = torch.save, []

    def interrupted_save(*args, **kwargs):
        if not calls:
            calls.append("interrupted")
            try:
                signal.raise_signal(signal.SIGINT)
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos") from None
        return save(*args, **kwargs)

    monkeypatch.setattr(torch, "save", interrupted_save)
    run, reference = tmp_path / "run", tmp_path / "reference"
    settings = [*RECIPE, "--set", "train.checkpoint_every=2", "--max-steps", "6"]
    assert main(cli_pretrain(wiki_slice, small_tokenizer_dir, run, *settings)) == 130
    assert calls and last_step(run) == 2 and steps(run) == [1, 2]
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert last_line.endswith(
        f"from its last checkpoint (step_000002) with: bertforge pretrain --out {run} --resume"
    )
    assert main(["pretrain", "--out", str(run), "--resume", "--quiet"]) == 0
    assert main(cli_pretrain(wiki_slice, small_tokenizer_dir, reference, *settings)) == 0
    assert metrics(run) == metrics(reference)
    assert_same_weights(run / "final", reference / "final")


def test_a_stop_whose_signal_also_ended_the_reader_of_the_output_still_saves_its_step(
    tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir, monkeypatch, capsys
):
    """Ctrl-C reaches the whole foreground job: in `bertforge pretrain ... | tee log` the reader is gone
    when the stop step's held-out line is written. The step is saved all the same and the run ends as a
    stop (130), not as a reader that left (141) with the step lost."""
    from bertforge import train as train_module

    optimizer_step, evaluate = train_module.Trainer.optimizer_step, train_module.Trainer.evaluate

    def step_then_ctrl_c(self, stream, lr):
        optimizer_step(self, stream, lr)
        if self.state.step == 3:
            signal.raise_signal(signal.SIGINT)

    def evaluate_into_a_closed_pipe(self, step, bar):
        if self.signals.received:
            raise BrokenPipeError(32, "Broken pipe")
        evaluate(self, step, bar)

    monkeypatch.setattr(train_module.Trainer, "optimizer_step", step_then_ctrl_c)
    monkeypatch.setattr(train_module.Trainer, "evaluate", evaluate_into_a_closed_pipe)
    monkeypatch.setattr(train_module, "reader_left", lambda stream: True)  # a test's capture is no pipe
    run = tmp_path / "run"
    settings = [*RECIPE, "--valid", str(wiki_valid_slice), "--set", "train.eval_every=1", *ENDLESS]
    assert main(cli_pretrain(wiki_slice, small_tokenizer_dir, run, *settings)) == 130
    assert last_step(run) == 3 and "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("second", [False, True])
def test_a_stopped_finetune_names_the_command_that_continues_it_with_its_jobs(
    tmp_path, tiny_pretrained_run, monkeypatch, capsys, second
):
    """The command keeps --jobs (each run's share of the threads decides its last bits); a second Ctrl-C,
    acted on at once, is told the same command rather than "nothing half-written was kept"."""
    from bertforge import train as train_module

    optimizer_step, save = train_module.Trainer.optimizer_step, train_module.Trainer.save_checkpoint

    def step_then_ctrl_c(self, stream, lr):
        optimizer_step(self, stream, lr)
        if self.state.step == 3:
            signal.raise_signal(signal.SIGINT)

    def save_then_ctrl_c(self, step):
        save(self, step)
        if step == 3:  # the first Ctrl-C put Python's handler back: this one raises KeyboardInterrupt
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(train_module.Trainer, "optimizer_step", step_then_ctrl_c)
    if second:
        monkeypatch.setattr(train_module.Trainer, "save_checkpoint", save_then_ctrl_c)
    train = write_csv(tmp_path / "train.csv", pair_rows(200, 0))
    valid = write_csv(tmp_path / "valid.csv", pair_rows(16, 1))
    run = tmp_path / "run"
    argv = finetune_argv(tiny_pretrained_run, train, valid, run, "--seeds", "1,2", "--jobs", "1", "--quiet")
    assert main(argv) == 130
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith(f"continue with: bertforge finetune --out {run} --resume --jobs 1")
    )


def test_a_second_signal_acts_at_once():
    """The first SIGINT or SIGTERM is only recorded; the handlers before the block are then back, so a
    second Ctrl-C raises KeyboardInterrupt at once."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals:
        signal.raise_signal(signal.SIGINT)
        assert signals.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    with StopSignals() as signals:
        signal.raise_signal(signal.SIGTERM)
        assert signals.received == signal.SIGTERM
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    stop = Interrupted(signal.SIGTERM, 7, Path("run/checkpoints/step_000007"), report=True)
    assert stop.exit_status == 143 and "continue with --resume" in str(stop)


class SignalledWhileDrawn:
    """A matplotlib artist that receives SIGINT while it is drawn, inside code that turns a
    KeyboardInterrupt into another exception, as matplotlib's C++ converters do ("ValueError: Invalid
    bounding box", seen ending a stopped fine-tuning worker's run as a bug)."""

    def __init__(self) -> None:
        self.drawn = False

    def __call__(self):
        from matplotlib.lines import Line2D

        figure = pyplot().figure()
        artist = self

        class Line(Line2D):
            def draw(self, renderer):
                try:
                    signal.raise_signal(signal.SIGINT)
                except KeyboardInterrupt:
                    raise ValueError("Invalid bounding box") from None
                super().draw(renderer)
                artist.drawn = True

        figure.add_artist(Line([0.1, 0.9], [0.1, 0.9]))
        return figure


@pytest.mark.rendered
def test_a_signal_while_a_png_is_drawn_acts_once_it_is_drawn(tmp_path):
    drawing = SignalledWhileDrawn()
    with pytest.raises(KeyboardInterrupt):
        save_png(drawing, tmp_path / "curves.png")
    assert drawing.drawn and not list(tmp_path.iterdir())  # drawn whole, then stopped before writing
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with StopSignals() as signals:  # inside a training loop, the loop's handler records it after the draw
        save_png(SignalledWhileDrawn(), tmp_path / "curves.png")
        assert signals.received == signal.SIGINT and (tmp_path / "curves.png").stat().st_size > 0


def rank_pid(launcher: int, rank: int) -> int:
    """The PID of the torchrun worker (a child of `launcher`) with RANK=`rank`."""
    for child in (pid for pid, parent in parents().items() if parent == launcher):
        if f"RANK={rank}".encode() in Path(f"/proc/{child}/environ").read_bytes().split(b"\0"):
            return child
    raise AssertionError(f"no rank {rank} among the children of {launcher}")


@pytest.mark.slow
def test_the_others_name_a_lost_rank_and_stop(tmp_path, wiki_slice, small_tokenizer_dir):
    """Two ranks started as torchrun would start them; rank 0 (which also holds the rendezvous store)
    is killed and rank 1 stops within a minute with one line naming it."""
    run = tmp_path / "run"
    argv = [
        *BERTFORGE,
        *cli_pretrain(wiki_slice, small_tokenizer_dir, run, *RECIPE, *ENDLESS, "--device", "cpu"),
    ]
    world = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
    with (
        started(argv, logs[0], RANK="0", LOCAL_RANK="0", **world) as first,
        started(argv, logs[1], RANK="1", LOCAL_RANK="1", **world) as second,
    ):
        wait_until(lambda: steps(run), first, logs[0])
        first.kill()
        assert second.wait(timeout=60) == 2
    lines = logs[1].read_text().splitlines()  # the log holds the run's output too
    assert [line for line in lines if line.startswith("bertforge: error:")] == [
        f"bertforge: error: lost rank 0 (process {first.pid}) of 2: it ended mid-run, so this process "
        f"(rank 1) stops too; continue with: torchrun --nproc_per_node=2 -m bertforge pretrain --out {run} "
        "--resume"
    ]


DDP = [*RECIPE, "--device", "cpu"]
DDP_STEPS = 40


def torchrun(*arguments) -> list:
    return [*TORCHRUN, *arguments]


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory, wiki_slice, small_tokenizer_dir) -> Path:
    """An uninterrupted two-process run of DDP_STEPS steps."""
    run = tmp_path_factory.mktemp("ddp") / "reference"
    argv = cli_pretrain(wiki_slice, small_tokenizer_dir, run, *DDP, "--max-steps", str(DDP_STEPS))
    with started(torchrun("-m", "bertforge", *argv), run.with_suffix(".log")) as p:
        assert p.wait(timeout=300) == 0, run.with_suffix(".log").read_text()[-3000:]
    return run


@pytest.mark.slow
def test_torchrun_command_line_gives_one_report_and_one_run_folder(ddp_reference):
    """`torchrun --nproc_per_node=2 -m bertforge pretrain`, end to end: rank 0 reports and logs, once."""
    assert ddp_reference.with_suffix(".log").read_text().count(f"trained {DDP_STEPS} steps") == 1
    assert steps(ddp_reference) == list(range(1, DDP_STEPS + 1))
    assert (ddp_reference / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_torchrun_passes_sigterm_on_and_every_rank_stops_after_the_same_step(
    tmp_path, ddp_reference, wiki_slice, small_tokenizer_dir
):
    run, log = tmp_path / "run", tmp_path / "run.log"
    argv = cli_pretrain(wiki_slice, small_tokenizer_dir, run, *DDP, *ENDLESS)
    with started(torchrun("-m", "bertforge", *argv), log) as p:
        wait_until(lambda: len(steps(run)) >= 2, p, log)
        p.send_signal(signal.SIGTERM)  # to torchrun, which sends it on to both ranks
        p.wait(timeout=60)
    step = last_step(run)
    assert step < DDP_STEPS and steps(run) == list(range(1, step + 1))
    resume = f"torchrun --nproc_per_node=2 -m bertforge pretrain --out {run} --resume"
    assert f"after step {step}, saved in {run}/checkpoints/step_{step:06d}; continue with: {resume}\n" in (
        log.read_text()
    )

    argv = ["pretrain", "--out", run, "--resume", "--max-steps", DDP_STEPS]
    with started(torchrun("-m", "bertforge", *argv), log) as p:
        assert p.wait(timeout=300) == 0, log.read_text()[-3000:]
    assert metrics(run) == metrics(ddp_reference)
    assert_same_weights(run / "final", ddp_reference / "final")


@pytest.mark.slow
def test_torchrun_restarts_a_group_that_lost_a_rank_and_it_resumes_by_itself(
    tmp_path, ddp_reference, wiki_slice, small_tokenizer_dir
):
    run, log = tmp_path / "run", tmp_path / "run.log"
    settings = [*DDP, "--max-steps", str(DDP_STEPS), "--set", "train.checkpoint_every=4"]
    argv = cli_pretrain(wiki_slice, small_tokenizer_dir, run, *settings)
    with started(torchrun("--max-restarts=1", "-m", "bertforge", *argv), log) as p:
        wait_until(lambda: list_checkpoints(run), p, log)
        lost = rank_pid(p.pid, 1)
        os.kill(lost, signal.SIGKILL)
        assert p.wait(timeout=300) == 0, log.read_text()[-3000:]
    output = log.read_text()
    assert f"bertforge: error: lost rank 1 (process {lost}) of 2" in output
    assert f"bertforge: torchrun restarted the run in {run}; continuing it" in output
    assert steps(run) == list(range(1, DDP_STEPS + 1))
    assert metrics(run) == metrics(ddp_reference)
    assert_same_weights(run / "final", ddp_reference / "final")


@pytest.mark.parametrize("status", [130, 143])
def test_after_a_stop_by_a_signal_the_ending_process_ignores_ctrl_c(monkeypatch, status):
    """A second Ctrl-C after the stop's checkpoint and line, or one as a finished command exits, must
    not break torch's exit handlers into a traceback while the interpreter shuts down."""
    import signal

    from bertforge import cli

    monkeypatch.setattr(cli, "main", lambda: status)
    before = signal.getsignal(signal.SIGINT)
    try:
        assert cli.run() == status
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    monkeypatch.setattr(cli, "main", lambda: 0)
    try:  # a command that ended well too: a Ctrl-C as it exits comes after its work
        assert cli.run() == 0 and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
