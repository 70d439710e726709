"""Exact resume after `kill -9`: a `bertforge pretrain` process is killed with SIGKILL, at a random
moment or inside a checkpoint write, resumed with `--resume`, and ends with every tensor of
`final/model.safetensors` equal, bit for bit, to the uninterrupted run's (CPU, fp32, one thread), its
logged losses the same, and nothing the killed writer left behind.

The kill inside a checkpoint write is made deterministic by a child process that wraps one of the
writer's steps so that it sends SIGKILL to itself there."""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from test_faults import cli_pretrain
from test_interrupts import metrics, started, steps

from bertforge.checkpoint import list_checkpoints, read_weights
from bertforge.cli import main

STEPS = 40  # far more than a kill at a random moment needs to land before the run ends
SETTINGS = [
    "--max-steps", str(STEPS), "--set", "train.checkpoint_every=3", "--set", "train.log_every=1",
    "--set", "train.eval_every=100000", "--set", "runtime.threads=1",
]  # fmt: skip
BERTFORGE = [sys.executable, "-m", "bertforge"]
SEED = 20240611  # the random moments: one draw per test run, the same in every test run


@pytest.fixture(autouse=True)
def keep_threads():
    """In-process runs set torch's thread count (`runtime.threads`); later tests get it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, wiki_slice, small_tokenizer_dir) -> Path:
    threads = torch.get_num_threads()
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    assert main(cli_pretrain(wiki_slice, small_tokenizer_dir, run, *SETTINGS)) == 0
    torch.set_num_threads(threads)
    return run


def assert_resumes_to(run: Path, reference: Path) -> None:
    """`--resume` finishes `run` as `reference` ended: the same losses at every step and every tensor
    of the final model equal; no temporary or set-aside folder of the killed writer is left."""
    assert main(["pretrain", "--out", str(run), "--resume", "--quiet"]) == 0
    assert steps(run) == list(range(1, STEPS + 1))
    assert metrics(run) == metrics(reference)
    ours = read_weights(run / "final" / "model.safetensors")
    theirs = read_weights(reference / "final" / "model.safetensors")
    assert ours.keys() == theirs.keys() and len(ours) > 10
    different = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    assert not different, f"{len(different)} of {len(ours)} tensors differ: {different[:5]}"
    assert not hidden_entries(run / "checkpoints")


def hidden_entries(folder: Path) -> list[str]:
    """What a writer keeps beside its folders until it is done: temporaries and folders set aside."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.slow
def test_a_kill_at_a_random_moment_resumes_to_the_uninterrupted_model(
    tmp_path, uninterrupted, wiki_slice, small_tokenizer_dir
):
    draw = random.Random(SEED)
    logged, delay = draw.randint(4, 16), draw.uniform(0.0, 0.05)  # mid-step, often mid-checkpoint
    run, log = tmp_path / "run", tmp_path / "run.log"
    command = [*BERTFORGE, *cli_pretrain(wiki_slice, small_tokenizer_dir, run, *SETTINGS)]
    with started(command, log) as process:
        deadline = time.monotonic() + 120
        while len(steps(run)) < logged:
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.005)
        time.sleep(delay)
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
    assert logged <= len(steps(run)) < STEPS and list_checkpoints(run)
    assert not (run / "final").exists()
    assert_resumes_to(run, uninterrupted)


# A child that runs `bertforge` with one step of the checkpoint writer wrapped: the first time that
# step runs for the checkpoint of step 6 (or, for "pruning", for any folder) it does its work, or half
# of it, and the process sends SIGKILL to itself.
KILLER = """
import os, signal, sys
from pathlib import Path
import bertforge.checkpoint as checkpoint
from bertforge.cli import main
from bertforge.io import move_aside

POINT = os.environ["KILL_POINT"]
real_weights, real_remove, real_replace = checkpoint.save_weights, checkpoint.remove_folder, os.replace


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def in_step_6(path):
    return path.parent.name.startswith(".step_000006.tmp-")


def save_weights(model, path):
    real_weights(model, path)
    if POINT == "weights" and in_step_6(path):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])  # the file half written
        die()


def replace(source, target):
    if POINT == "renaming" and Path(source).name.startswith(".step_000006.tmp-"):
        die()  # every file written, the folder not yet renamed into place
    real_replace(source, target)


def remove_folder(path):
    if POINT == "pruning":  # the first prune: step 9's checkpoint removes step 3's
        move_aside(path, "del")  # renamed aside, not yet deleted
        die()
    real_remove(path)


checkpoint.save_weights, checkpoint.remove_folder, os.replace = save_weights, remove_folder, replace
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("point", ["weights", "renaming", "pruning"])
@pytest.mark.slow
def test_a_kill_inside_a_checkpoint_write_resumes_to_the_uninterrupted_model(
    tmp_path, point, uninterrupted, wiki_slice, small_tokenizer_dir
):
    run, log = tmp_path / "run", tmp_path / "run.log"
    command = [sys.executable, "-c", KILLER, *cli_pretrain(wiki_slice, small_tokenizer_dir, run, *SETTINGS)]
    with started(command, log, KILL_POINT=point) as process:
        assert process.wait(timeout=120) == -signal.SIGKILL, log.read_text()[-3000:]
    leftovers = [name.split("-")[0] for name in hidden_entries(run / "checkpoints")]
    if point == "pruning":  # the third checkpoint (step 9) prunes the first; the second is kept
        assert [p.name for p in list_checkpoints(run)] == ["step_000006", "step_000009"]
        assert leftovers == [".step_000003.del"]
    else:  # the checkpoint of step 6 was never renamed into place; step 3's is the newest
        assert [p.name for p in list_checkpoints(run)] == ["step_000003"]
        assert leftovers == [".step_000006.tmp"]
    assert_resumes_to(run, uninterrupted)


def test_a_folder_written_atomically_is_on_disk_before_it_appears(tmp_path, monkeypatch):
    """After a power loss a renamed folder must not hold empty files, nor be missing: every file and
    folder inside is fsynced before the rename, and the folder that holds it after."""
    from bertforge.io import atomic_directory, atomic_write_text

    out, synced, real_fsync = tmp_path / "model", [], os.fsync

    def fsync(fd):
        synced.append((Path(os.readlink(f"/proc/self/fd/{fd}")).name, out.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with atomic_directory(out) as staged:
        (staged / "weights").write_bytes(b"w")
        (staged / "tokenizer").mkdir()
        (staged / "tokenizer" / "vocab.txt").write_text("a\n")
    names = {name for name, _ in synced[:-1]}
    assert {"weights", "tokenizer", "vocab.txt", staged.name} <= names
    assert not any(appeared for _, appeared in synced[:-1])
    assert synced[-1] == (tmp_path.name, True)
    synced.clear()
    atomic_write_text(out / "notes.json", "{}")  # a file: its bytes, then its folder's entry
    assert [name for name, _ in synced] == [synced[0][0], "model"] and synced[0][0].startswith(".notes.json")
