"""`bertforge prepare` writes token shards that `pretrain --shards` trains on: the run is the one the
corpus itself gives, it resumes, and shards of another tokenizer or of changed text are refused. One
process at a time prepares a folder, and what a killed one left is removed by the next."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import WIKI_TRAIN, assert_clean_failure, metrics_lines

from bertforge import shards as shards_module
from bertforge.cli import main
from bertforge.config import TokenizerConfig
from bertforge.shards import prepare_shards
from bertforge.tokenizer import load_tokenizer, train_tokenizer

SETTINGS = {
    "model.num_hidden_layers": 2,
    "model.hidden_size": 32,
    "model.num_attention_heads": 2,
    "model.intermediate_size": 64,
    "model.max_position_embeddings": 64,
    "data.max_seq_length": 64,
    "train.eval_every": 2,
}
TINY = [
    *(arg for name, value in SETTINGS.items() for arg in ("--set", f"{name}={value}")),
    *("--batch-size", "8", "--max-steps", "2", "--precision", "fp32", "--quiet"),
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, wiki_slice, small_tokenizer_dir) -> Path:
    folder = tmp_path_factory.mktemp("prepared") / "shards"
    argv = [
        "prepare",
        "--corpus",
        str(wiki_slice),
        "--tokenizer",
        str(small_tokenizer_dir),
        "--out",
        str(folder),
    ]
    assert main(argv) == 0
    return folder


def train_losses(run: Path) -> list[tuple[int, float]]:
    return [(line["step"], line["loss"]) for line in metrics_lines(run, "train")]


def test_prepare_names_the_command_that_trains_on_its_shards(
    wiki_valid_slice, small_tokenizer_dir, capsys, tmp_path
):
    argv = ["prepare", "--corpus", str(wiki_valid_slice), "--tokenizer", str(small_tokenizer_dir)]
    assert main([*argv, "--out", str(tmp_path / "again")]) == 0
    out = capsys.readouterr().out
    assert f"bertforge pretrain --shards {tmp_path / 'again'} --tokenizer {small_tokenizer_dir}" in out


def test_pretraining_on_prepared_shards_is_pretraining_on_their_corpus(
    prepared, wiki_slice, small_tokenizer_dir, tmp_path
):
    tokenizer = ["--tokenizer", str(small_tokenizer_dir)]
    assert (
        main(["pretrain", "--corpus", str(wiki_slice), "--out", str(tmp_path / "corpus"), *tokenizer, *TINY])
        == 0
    )
    assert (
        main(["pretrain", "--shards", str(prepared), "--out", str(tmp_path / "shards"), *tokenizer, *TINY])
        == 0
    )
    assert train_losses(tmp_path / "shards") == train_losses(tmp_path / "corpus")
    data = json.loads((tmp_path / "shards" / "config.json").read_text())["data"]
    assert data["shards"] == [os.path.abspath(prepared)] and data["corpus"] == []
    hashes = json.loads((tmp_path / "shards" / "data.json").read_text())["sha256"]
    assert list(hashes) == [os.path.abspath(prepared)]

    assert (
        main(["pretrain", "--out", str(tmp_path / "shards"), "--resume", "--max-steps", "3", "--quiet"]) == 0
    )
    assert train_losses(tmp_path / "shards")[-1][0] == 3
    held_out = ["--valid", str(wiki_slice), "--out", str(tmp_path / "memorised")]  # the shards' own text
    with pytest.warns(UserWarning, match=f"is also training text \\({re.escape(str(prepared))}\\)"):
        assert main(["pretrain", "--shards", str(prepared), *held_out, *tokenizer, *TINY]) == 0


def test_shards_of_another_tokenizer_are_refused(prepared, wiki_valid_slice, tmp_path, capsys):
    other = train_tokenizer([wiki_valid_slice], TokenizerConfig(vocab_size=500), tmp_path / "other")
    assert load_tokenizer(tmp_path / "other").fingerprint == other.fingerprint
    argv = ["pretrain", "--shards", str(prepared), "--tokenizer", str(tmp_path / "other")]
    assert_clean_failure(
        capsys, [*argv, "--out", str(tmp_path / "run"), *TINY], "prepared with another tokenizer"
    )
    assert not (tmp_path / "run").exists()


def test_shards_need_their_tokenizer_and_no_corpus_beside_them(prepared, wiki_slice, tmp_path, capsys):
    argv = ["pretrain", "--shards", str(prepared), "--out", str(tmp_path / "run"), *TINY]
    assert_clean_failure(capsys, argv, "needs the tokenizer that prepared them")
    assert_clean_failure(capsys, [*argv, "--corpus", str(wiki_slice)], "give one: --corpus or --shards")
    assert not (tmp_path / "run").exists()


def test_resume_refuses_shards_prepared_again_from_other_text(
    prepared, wiki_valid_slice, small_tokenizer_dir, tmp_path, capsys
):
    folder = tmp_path / "shards"
    shutil.copytree(prepared, folder)
    run = ["--out", str(tmp_path / "run")]
    assert (
        main(["pretrain", "--shards", str(folder), "--tokenizer", str(small_tokenizer_dir), *run, *TINY]) == 0
    )
    shutil.rmtree(folder)  # prepared again, from other text
    prepare_shards(wiki_valid_slice, load_tokenizer(small_tokenizer_dir), folder, show_progress=False)
    resume = ["pretrain", *run, "--resume", "--max-steps", "3", "--quiet"]
    assert_clean_failure(
        capsys, resume, f"data changed since the run in {tmp_path / 'run'} started: {folder}"
    )


def prepare_argv(corpus: Path, tokenizer: Path, out: Path) -> list[str]:
    return ["prepare", "--corpus", str(corpus), "--tokenizer", str(tokenizer), "--out", str(out)]


def test_a_folder_being_prepared_is_refused_to_a_second_prepare(
    tmp_path, capsys, monkeypatch, wiki_slice, wiki_valid_slice, small_tokenizer_dir
):
    out, results = tmp_path / "shards", []
    started, go_on = threading.Event(), threading.Event()
    batches = shards_module._document_batches

    def held_once(documents):  # the first preparation waits in its first batch until told to go on
        for batch in batches(documents):
            if not started.is_set():
                started.set()
                go_on.wait(60)
            yield batch

    monkeypatch.setattr(shards_module, "_document_batches", held_once)
    first = threading.Thread(
        target=lambda: results.append(main(prepare_argv(wiki_slice, small_tokenizer_dir, out)))
    )
    first.start()
    try:
        assert started.wait(60)
        capsys.readouterr()  # the first one's progress so far
        second = prepare_argv(wiki_valid_slice, small_tokenizer_dir, out)
        assert_clean_failure(capsys, second, f"{out} is being written by another bertforge process (process ")
    finally:
        go_on.set()
        first.join(60)
    assert results == [0]
    assert json.loads((out / "meta.json").read_text())["source"]["path"] == str(wiki_slice.resolve())
    capsys.readouterr()
    assert_clean_failure(capsys, second, "already exists and is not an empty folder")  # once it is done
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]


def test_what_a_killed_prepare_left_is_removed_by_the_next(tmp_path, wiki_slice, small_tokenizer_dir):
    out = tmp_path / "shards"
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = prepare_argv(WIKI_TRAIN, small_tokenizer_dir, out)  # 11 MB: seconds of tokenizing to kill it in
    killed = subprocess.Popen([sys.executable, "-m", "bertforge", *argv], env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".shards.tmp-*/tokens.bin")):
            assert killed.poll() is None and time.monotonic() < deadline, "prepare ended before it was killed"
            time.sleep(0.01)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    assert not out.exists() and list(tmp_path.glob(".shards.tmp-*"))
    assert main(prepare_argv(wiki_slice, small_tokenizer_dir, out)) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]


def test_a_shard_folder_given_twice_is_read_once(prepared):
    from bertforge.config import DataConfig
    from bertforge.pretrain import training_text

    data = DataConfig(shards=[str(prepared), str(prepared / "."), os.path.relpath(prepared)])
    files, shard_sets = training_text(data)
    assert files == [] and len(shard_sets) == 1  # as a corpus file named twice counts once


def test_damaged_prepared_shards_are_one_line(tmp_path, capsys, prepared, small_tokenizer_dir):
    shards = tmp_path / "shards"
    shutil.copytree(prepared, shards)
    pristine = {p.name: p.read_bytes() for p in shards.iterdir()}
    meta = json.loads(pristine["meta.json"])
    offsets = np.frombuffer(pristine["sentence_offsets.bin"], dtype=np.int64).copy()
    offsets[3], offsets[4] = offsets[4], offsets[3] - 1  # falls in the middle
    unnamed = {k: v for k, v in meta.items() if k != "tokenizer_fingerprint"}
    damages = {
        "does not name the tokenizer": ("meta.json", json.dumps(unnamed).encode()),
        "sentence_offsets.bin does not start at 0 and rise": ("sentence_offsets.bin", offsets.tobytes()),
        "says vocab_size 5000": ("meta.json", json.dumps({**meta, "vocab_size": 5000}).encode()),
    }
    train = ["pretrain", "--shards", str(shards), "--tokenizer", str(small_tokenizer_dir), "--max-steps", "1"]
    for words, (name, data) in damages.items():
        (shards / name).write_bytes(data)
        assert_clean_failure(capsys, [*train, "--out", str(tmp_path / "run")], words)
        (shards / name).write_bytes(pristine[name])
