"""`bertforge prepare` writes token shards that `pretrain --shards` trains on: the run is the one the
corpus itself gives, it resumes, and shards of another tokenizer or of changed text are refused."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import assert_clean_failure, metrics_lines

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
    prepare_shards(wiki_valid_slice, load_tokenizer(small_tokenizer_dir), folder, show_progress=False)
    resume = ["pretrain", *run, "--resume", "--max-steps", "3", "--quiet"]
    assert_clean_failure(
        capsys, resume, f"data changed since the run in {tmp_path / 'run'} started: {folder}"
    )
