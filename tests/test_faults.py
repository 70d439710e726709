"""Faults a run must survive: a second run on its folder, divergence, damaged checkpoints, and
tokenizer training that must not depend on the process it runs in."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import assert_clean_failure, metrics_lines, tiny_config

from bertforge.checkpoint import list_checkpoints, read_config, read_weights
from bertforge.errors import BertforgeError
from bertforge.io import LOCK_FILE, entry_lock
from bertforge.pretrain import pretrain

TINY = [
    "--set", "model.num_hidden_layers=2", "--set", "model.hidden_size=32",
    "--set", "model.num_attention_heads=2", "--set", "model.intermediate_size=64",
    "--set", "model.max_position_embeddings=64", "--set", "data.max_seq_length=64",
    "--set", "train.batch_size=8", "--set", "runtime.precision=fp32", "--quiet",
]  # fmt: skip


def cli_pretrain(corpus: Path, tokenizer: Path, out: Path, *extra: str) -> list[str]:
    paths = ["--corpus", str(corpus), "--tokenizer", str(tokenizer), "--out", str(out)]
    return ["pretrain", *paths, *TINY, *extra]


def bertforge_process(*argv: str) -> subprocess.Popen:
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-m", "bertforge", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def wait_for(condition, process: subprocess.Popen | None, seconds: float = 60) -> None:
    """Until `condition()` holds; fail after `seconds`, or at once if `process` (when given) ends."""
    deadline = time.monotonic() + seconds
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(process.stderr.read().decode())
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def all_saved_weights_finite(run: Path) -> bool:
    files = list(run.rglob("*.safetensors"))
    return bool(files) and all(
        torch.isfinite(tensor).all() for path in files for tensor in read_weights(path).values()
    )


def flip_bytes(path: Path, count: int = 16) -> None:
    """Overwrite `count` bytes in the middle of a file with their complement."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + count] = bytes(255 - b for b in data[middle : middle + count])
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_a_locked_run_folder_is_refused_and_freed_when_its_owner_is_killed(
    tmp_path, capsys, wiki_slice, small_tokenizer_dir
):
    run = tmp_path / "run"
    owner = bertforge_process(
        *cli_pretrain(wiki_slice, small_tokenizer_dir, run, "--max-steps", "100000"),
        "--set", "train.checkpoint_every=2", "--set", "train.eval_every=100000",
    )  # fmt: skip
    try:
        wait_for(lambda: list_checkpoints(run), owner)
        assert (run / LOCK_FILE).read_text().strip() == str(owner.pid)
        second = cli_pretrain(wiki_slice, small_tokenizer_dir, run, "--max-steps", "3")
        assert_clean_failure(capsys, second, f"in use by another bertforge run (process {owner.pid})")
        assert_clean_failure(capsys, ["pretrain", "--out", str(run), "--resume"], f"process {owner.pid}")
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert (run / LOCK_FILE).exists()  # left behind by the killed owner, but no longer held
    step = int(list_checkpoints(run)[-1].name.split("_")[1])
    config = read_config(run)
    config.train.max_steps = step + 1
    result = pretrain(config, run, resume=True, show_progress=False)
    assert result["step"] == step + 1 and not (run / LOCK_FILE).exists()


def test_a_run_that_creates_its_folder_and_fails_early_leaves_nothing(tmp_path, capsys, small_tokenizer_dir):
    run = tmp_path / "run"
    argv = cli_pretrain(tmp_path / "missing.txt", small_tokenizer_dir, run)
    assert_clean_failure(capsys, argv, "does not exist")
    assert not run.exists()


def test_a_cache_entry_is_built_by_one_process_while_the_other_waits(tmp_path):
    entry, order = tmp_path / "tokenizers" / "key", []
    with entry_lock(entry):
        waiter = threading.Thread(target=lambda: entry_lock(entry).__enter__() or order.append("waiter"))
        waiter.start()
        time.sleep(0.3)
        order.append("builder")
    waiter.join(5)
    assert order == ["builder", "waiter"]


def diverging_after(monkeypatch, steps: int) -> None:
    """From the optimizer's step `steps` + 1 on, each step leaves the weights non-finite, as a learning
    rate far too high does (the settings refuse a learning rate above 1)."""
    step, taken = torch.optim.AdamW.step, []

    def diverging(self, *args, **kwargs):
        result = step(self, *args, **kwargs)
        taken.append(1)
        if len(taken) > steps:
            with torch.no_grad():
                for group in self.param_groups:
                    for param in group["params"]:
                        param.mul_(float("inf"))
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", diverging)


def test_a_diverging_run_stops_with_one_line(tmp_path, capsys, monkeypatch, wiki_slice, small_tokenizer_dir):
    run = tmp_path / "run"
    argv = cli_pretrain(wiki_slice, small_tokenizer_dir, run, "--max-steps", "1")
    assert_clean_failure(capsys, [*argv, "--lr", "1e39"], "train.learning_rate must be in (0, 1], got 1e+39")
    diverging_after(monkeypatch, 0)
    err = assert_clean_failure(capsys, argv, "diverged at step 1: the weights became non-finite")
    assert "learning rate" in err
    assert not run.exists()  # nothing resumable was reached: no model, finite or not


def test_divergence_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, wiki_slice, small_tokenizer_dir):
    run = tmp_path / "run"
    config = tiny_config(wiki_slice, max_steps=4, eval_every=4, checkpoint_every=2, keep_checkpoints=4)
    pretrain(config, run, tokenizer_dir=small_tokenizer_dir, show_progress=False)
    before = {p.name: (p / "model.safetensors").read_bytes() for p in list_checkpoints(run)}

    config = read_config(run)
    config.train.max_steps = 8
    diverging_after(monkeypatch, 0)
    with pytest.raises(BertforgeError, match="diverged at step 5: the weights"):
        pretrain(config, run, resume=True, show_progress=False)

    assert {p.name: (p / "model.safetensors").read_bytes() for p in list_checkpoints(run)} == before
    assert all_saved_weights_finite(run)
    lines = metrics_lines(run)  # strict JSON
    assert max(line["step"] for line in lines) == 4


def test_metrics_log_writes_non_finite_numbers_as_null(tmp_path):
    from bertforge.metrics_log import MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.append({"step": 1, "split": "valid", "loss": float("nan"), "accuracy": 0.5})
    assert metrics_lines(tmp_path) == [{"step": 1, "split": "valid", "loss": None, "accuracy": 0.5}]


def test_resume_skips_damaged_checkpoints_and_matches_the_uninterrupted_run(
    tmp_path, wiki_slice, small_tokenizer_dir
):
    full = tmp_path / "full"
    config = tiny_config(wiki_slice, max_steps=6, eval_every=6, checkpoint_every=2, keep_checkpoints=3)
    pretrain(config, full, tokenizer_dir=small_tokenizer_dir, show_progress=False)
    state = json.loads((full / "checkpoints" / "step_000006" / "state.json").read_text())
    assert set(state["sha256"]) == {"model.safetensors", "optimizer.pt", "config.json"}

    cut = tmp_path / "cut"  # stopped after step 6, then two checkpoints damaged on disk
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "final")
    flip_bytes(cut / "checkpoints" / "step_000006" / "model.safetensors")
    flip_bytes(cut / "checkpoints" / "step_000004" / "optimizer.pt")
    with pytest.warns(UserWarning, match=r"step_000006 is damaged.*step_000004 is damaged.*from step_000002"):
        pretrain(read_config(cut), cut, resume=True, show_progress=False)

    for a, b in zip(metrics_lines(full, "train"), metrics_lines(cut, "train"), strict=True):
        assert a["loss"] == b["loss"] and a["step"] == b["step"]
    full_weights = read_weights(full / "final" / "model.safetensors")
    cut_weights = read_weights(cut / "final" / "model.safetensors")
    assert all(torch.equal(full_weights[k], cut_weights[k]) for k in full_weights)


def test_no_intact_checkpoint_is_one_error_and_old_checkpoints_without_hashes_load(
    tmp_path, capsys, wiki_slice, small_tokenizer_dir
):
    run = tmp_path / "run"
    config = tiny_config(wiki_slice, max_steps=2, eval_every=2)
    pretrain(config, run, tokenizer_dir=small_tokenizer_dir, show_progress=False)
    checkpoint = list_checkpoints(run)[-1]
    old = tmp_path / "old"
    shutil.copytree(run, old)

    flip_bytes(checkpoint / "optimizer.pt")
    err = assert_clean_failure(capsys, ["pretrain", "--out", str(run), "--resume"], "no intact checkpoint")
    assert "optimizer.pt differs from what was written" in err

    state_path = list_checkpoints(old)[-1] / "state.json"
    state = json.loads(state_path.read_text())
    del state["sha256"], state["checksums"]  # as written before checkpoints recorded their hashes
    state_path.write_text(json.dumps(state))
    (state_path.parent / "checksums.json").unlink()
    config = read_config(old)
    config.train.max_steps = 3
    assert pretrain(config, old, resume=True, show_progress=False)["step"] == 3


@pytest.mark.slow
def test_tokenizer_training_gives_the_same_files_in_two_processes(tmp_path, wiki_slice):
    outs = [tmp_path / "a", tmp_path / "b"]
    argv = ["tokenizer", "train", "--corpus", str(wiki_slice), "--vocab-size", "2000", "--out"]
    processes = [bertforge_process(*argv, str(out)) for out in outs]
    for process in processes:
        assert process.wait(120) == 0, process.stderr.read().decode()
    for name in ("vocab.txt", "tokenizer.json", "bertforge_tokenizer.json"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name


# ------------------------------------------------- one writer per output of the one-shot commands


@pytest.mark.parametrize("command", ["tokenizer train", "export", "import-hf", "embed"])
def test_a_second_writer_of_one_out_is_refused(command, tmp_path, capsys, wiki_slice, tiny_pretrained_run):
    """Two processes started together on one --out would both report success, the output holding only
    the one written last: the second is refused while the first holds the output's lock."""
    from bertforge.export import export_model
    from bertforge.io import builder_lock

    texts = tmp_path / "texts.txt"
    texts.write_text("the first text .\nthe second text .\n", encoding="utf-8")
    exported = tmp_path / "hf"
    if command == "import-hf":
        export_model(tiny_pretrained_run, exported)
    out = tmp_path / ("vectors.npy" if command == "embed" else "out")
    argv = {
        "tokenizer train": ["tokenizer", "train", "--corpus", str(wiki_slice), "--vocab-size", "200"],
        "export": ["export", "--model", str(tiny_pretrained_run)],
        "import-hf": ["import-hf", "--from", str(exported)],
        "embed": ["embed", "--model", str(tiny_pretrained_run), "--input", str(texts)],
    }[command] + ["--out", str(out)]
    first = builder_lock(out)
    assert first.acquire(wait=False)  # as a first process on the same --out would hold it
    try:
        assert_clean_failure(capsys, argv, f"{out} is being written by another bertforge process")
    finally:
        first.release()
    assert not out.exists()
    from bertforge.cli import main

    assert main([*argv, "--quiet"] if command == "embed" else argv) == 0  # alone, it writes
    assert out.exists()


def test_equal_weights_give_equal_weight_files(tmp_path, small_tokenizer_dir):
    """safetensors writes its metadata in hash-map order; the files are rewritten in key order, so a
    `sha256sum` of two runs' equal weights agrees (and the metadata still reads)."""
    from safetensors import safe_open

    from bertforge.checkpoint import save_weights
    from bertforge.model import BertForPreTraining
    from bertforge.tokenizer import load_tokenizer

    torch.manual_seed(0)
    model, tokenizer = BertForPreTraining(tiny_config().model), load_tokenizer(small_tokenizer_dir)
    files = [tmp_path / f"{i}.safetensors" for i in range(6)]
    for path in files:
        save_weights(model, path, tokenizer)
    assert len({path.read_bytes() for path in files}) == 1
    with safe_open(str(files[0]), "pt") as weights:
        assert weights.metadata()["format"] == "pt" and len(weights.metadata()) == 3
    assert torch.equal(read_weights(files[0])["bert.embeddings.word_embeddings.weight"],
                       model.bert.embeddings.word_embeddings.weight)  # fmt: skip
