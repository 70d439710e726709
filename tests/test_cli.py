"""The command line: help texts, an end-to-end run, and one clear message for every bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_clean_failure, tiny_config

from bertforge.cli import main
from bertforge.config import save_json

TINY = [
    "--set",
    "model.num_hidden_layers=2",
    "--set",
    "model.hidden_size=32",
    "--set",
    "model.num_attention_heads=2",
    "--set",
    "model.intermediate_size=64",
    "--set",
    "model.max_position_embeddings=64",
    "--set",
    "data.max_seq_length=64",
    "--set",
    "tokenizer.vocab_size=2000",
    "--set",
    "data.eval_max_pairs=64",
    "--set",
    "train.eval_every=3",
    "--batch-size",
    "8",
    "--quiet",
]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "bertforge", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("tokenizer", "prepare", "pretrain", "evaluate"):
        assert command in out


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["tokenizer", "train", "--help"], "--vocab-size"),
        (["prepare", "--help"], "--tokenizer"),
        (["pretrain", "--help"], "--resume"),
        (["evaluate", "--help"], "--json"),
    ],
)
def test_each_subcommand_has_help(capsys, argv, expected):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert expected in capsys.readouterr().out


def test_end_to_end_from_raw_text(tmp_path, wiki_slice, wiki_valid_slice):
    """tokenizer train -> prepare -> pretrain -> evaluate, as a user would type them."""
    env_cache = tmp_path / "cache"
    tok = run_cli(
        "tokenizer",
        "train",
        "--corpus",
        str(wiki_slice),
        "--vocab-size",
        "2000",
        "--out",
        str(tmp_path / "tok"),
    )
    assert tok.returncode == 0, tok.stderr
    assert (tmp_path / "tok" / "vocab.txt").is_file()
    prep = run_cli(
        "prepare",
        "--corpus",
        str(wiki_slice),
        "--tokenizer",
        str(tmp_path / "tok"),
        "--out",
        str(tmp_path / "shards"),
    )
    assert prep.returncode == 0, prep.stderr
    assert json.loads((tmp_path / "shards" / "meta.json").read_text())["num_documents"] > 10

    run = tmp_path / "run"
    result = run_cli(
        "pretrain",
        "--corpus",
        str(wiki_slice),
        "--valid",
        str(wiki_valid_slice),
        "--out",
        str(run),
        "--max-steps",
        "6",
        "--cache-dir",
        str(env_cache),
        *TINY,
    )
    assert result.returncode == 0, result.stderr
    assert "held-out: mlm_loss" in result.stdout and "real tokens/s" in result.stdout
    for name in (
        "config.json",
        "metrics.jsonl",
        "loss.png",
        "final/model.safetensors",
        "final/vocab.txt",
        "final/config.json",
        "tokenizer/tokenizer.json",
    ):
        assert (run / name).is_file(), name

    evaluation = run_cli(
        "evaluate",
        "--model",
        str(run),
        "--corpus",
        str(wiki_valid_slice),
        "--json",
        "--cache-dir",
        str(env_cache),
        "--quiet",
    )
    assert evaluation.returncode == 0, evaluation.stderr
    metrics = json.loads(evaluation.stdout)
    assert set(metrics) == {"mlm_loss", "perplexity", "mlm_accuracy", "nsp_loss", "nsp_accuracy"}
    last_valid = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert metrics["mlm_loss"] == pytest.approx(last_valid["mlm_loss"], rel=1e-5)


def pretrain_argv(corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["pretrain", "--corpus", str(corpus), "--out", str(out), "--max-steps", "2", *TINY, *extra]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        (b"", "empty"),
        (b"\xff\xfe not utf-8 \x80\x81\n", "UTF-8"),
    ],
)
def test_bad_corpus_files(tmp_path, capsys, content, message):
    corpus = tmp_path / "corpus.txt"
    if content is not None:
        corpus.write_bytes(content)
    assert_clean_failure(capsys, pretrain_argv(corpus, tmp_path / "run"), message)
    assert not (tmp_path / "run").exists()


def test_single_document_with_nsp_is_refused(tmp_path, capsys):
    corpus = tmp_path / "one.txt"
    corpus.write_text(
        "One document. It has several sentences. None of them is separated by a blank line.\n" * 30
    )
    assert_clean_failure(capsys, pretrain_argv(corpus, tmp_path / "run"), "one document")
    assert not (tmp_path / "run").exists()


def test_unknown_format(tmp_path, capsys, wiki_slice):
    assert_clean_failure(
        capsys, pretrain_argv(wiki_slice, tmp_path / "run", "--set", "data.format=xml"), "data.format"
    )


@pytest.mark.parametrize(
    "setting, message",
    [
        ("model.num_attention_heads=3", "divisible"),
        ("data.max_seq_length=100", "max_position_embeddings"),
        ("data.mlm_probability=1.2", "mlm_probability"),
        ("train.nonsense=1", "unknown setting"),
    ],
)
def test_impossible_config(tmp_path, capsys, wiki_slice, setting, message):
    assert_clean_failure(capsys, pretrain_argv(wiki_slice, tmp_path / "run", "--set", setting), message)
    assert not (tmp_path / "run").exists()


def test_output_folder_holding_another_run(tmp_path, capsys, wiki_slice):
    out = tmp_path / "run"
    out.mkdir()
    save_json(tiny_config(), out / "config.json")
    assert_clean_failure(capsys, pretrain_argv(wiki_slice, out), "holds another run")
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]


def test_tokenizer_that_does_not_match_the_model(tmp_path, capsys, tiny_pretrained_run, wiki_slice):
    from bertforge.config import TokenizerConfig
    from bertforge.tokenizer import train_tokenizer

    model = tmp_path / "model"
    shutil.copytree(tiny_pretrained_run / "final", model)
    other = train_tokenizer([wiki_slice], TokenizerConfig(vocab_size=1000), tmp_path / "other")
    for name in ("tokenizer.json", "vocab.txt", "bertforge_tokenizer.json"):
        shutil.copy(tmp_path / "other" / name, model / name)
    assert other.vocab_size != 2000
    assert_clean_failure(
        capsys, ["evaluate", "--model", str(model), "--corpus", str(wiki_slice)], "do not match"
    )


def test_damaged_checkpoint(tmp_path, capsys, tiny_pretrained_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    weights = run / "checkpoints" / "step_000003" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert_clean_failure(
        capsys, ["pretrain", "--out", str(run), "--resume", "--max-steps", "5", "--quiet"], "damaged"
    )
    state = run / "checkpoints" / "step_000003" / "state.json"
    state.write_text("{not json")
    assert_clean_failure(capsys, ["pretrain", "--out", str(run), "--resume", "--quiet"], "damaged")


def test_incompatible_checkpoint(tmp_path, capsys, tiny_pretrained_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    argv = ["pretrain", "--out", str(run), "--resume", "--set", "model.hidden_size=64", "--quiet"]
    assert_clean_failure(capsys, argv, "shape")


def test_resume_without_a_run(tmp_path, capsys):
    assert_clean_failure(
        capsys, ["pretrain", "--out", str(tmp_path / "nothing"), "--resume"], "no bertforge run"
    )


def test_evaluate_an_exported_folder_and_at_another_length(tmp_path, capsys, tiny_pretrained_run, wiki_slice):
    exported = tmp_path / "hf"
    assert main(["export", "--model", str(tiny_pretrained_run), "--out", str(exported)]) == 0
    capsys.readouterr()

    def evaluate(model: Path, *extra: str) -> dict:
        argv = ["evaluate", "--model", str(model), "--corpus", str(wiki_slice), "--json", "--quiet", *extra]
        assert main(argv) == 0
        return json.loads(capsys.readouterr().out)

    ours = evaluate(tiny_pretrained_run)
    assert evaluate(exported) == pytest.approx(ours, rel=1e-5)
    assert evaluate(tiny_pretrained_run, "--max-length", "64") == ours  # the run's own length
    shorter = evaluate(tiny_pretrained_run, "--max-length", "24")
    assert shorter["mlm_loss"] != pytest.approx(ours["mlm_loss"], rel=1e-4)
    too_long = ["evaluate", "--model", str(exported), "--corpus", str(wiki_slice), "--max-length", "65"]
    assert_clean_failure(capsys, too_long, "between 8 and the model's 64 positions")


def test_evaluate_a_folder_that_is_not_a_model(tmp_path, capsys, wiki_slice):
    (tmp_path / "empty").mkdir()
    assert_clean_failure(
        capsys,
        ["evaluate", "--model", str(tmp_path / "empty"), "--corpus", str(wiki_slice)],
        "not a bertforge model folder",
    )


@pytest.mark.parametrize("command", ["prepare", "tokenizer"])
def test_output_that_is_a_file_or_a_full_folder(tmp_path, capsys, wiki_slice, small_tokenizer_dir, command):
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    argv = {
        "prepare": ["prepare", "--corpus", str(wiki_slice), "--tokenizer", str(small_tokenizer_dir)],
        "tokenizer": ["tokenizer", "train", "--corpus", str(wiki_slice)],
    }[command]
    assert_clean_failure(capsys, [*argv, "--out", str(taken)], "not an empty folder")
    assert taken.read_text() == "not a folder"
