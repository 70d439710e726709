"""The command line: help texts, an end-to-end run, and one clear message for every bad input."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import PYPROJECT, assert_clean_failure, metrics_lines, tiny_config, tomllib
from safetensors.torch import save_file

from bertforge.cli import main
from bertforge.config import save_json
from bertforge.tokenizer import load_tokenizer

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


def run_in_process(*args: str) -> subprocess.CompletedProcess:
    """`bertforge ARGS` called in this process (a start of the program costs seconds), its output
    caught as a program's would be."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(list(args))
    return subprocess.CompletedProcess(["bertforge", *args], code, stdout.getvalue(), stderr.getvalue())


class SignalledImport:
    """`signum` raised while `bertforge.cli` (and torch with it) is being imported: `KeyboardInterrupt`
    raised there, as a Ctrl-C would before the program holds the signals, or a real signal."""

    def __init__(self, signum: int | None) -> None:
        self.signum = signum

    def find_spec(self, name, path=None, target=None):
        if name == "bertforge.cli":
            if self.signum is None:
                raise KeyboardInterrupt
            signal.raise_signal(self.signum)
        return None


@pytest.mark.parametrize(
    "signum, line, status",
    [
        (None, "interrupted by Ctrl-C", 130),
        (signal.SIGINT, "interrupted by Ctrl-C", 130),
        (signal.SIGTERM, "stopped by SIGTERM", 143),
    ],
    ids=["KeyboardInterrupt", "SIGINT", "SIGTERM"],
)
def test_a_signal_while_the_program_imports_torch_is_one_line(monkeypatch, capsys, signum, line, status):
    import bertforge
    from bertforge.__main__ import start

    inherited = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    # As a program started from a terminal has them, whatever this process inherited (a background job
    # ignores SIGINT, and a signal ignored stays ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    monkeypatch.delitem(sys.modules, "bertforge.cli")
    monkeypatch.delattr(bertforge, "cli")
    monkeypatch.setattr(sys, "meta_path", [SignalledImport(signum), *sys.meta_path])
    try:
        assert start() == status
        assert capsys.readouterr().err == f"bertforge: {line} while starting; nothing was done\n"
        assert ("bertforge.cli" in sys.modules) == (signum is not None)  # held: the imports ended whole
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == (
            signal.default_int_handler,
            signal.SIG_DFL,
        )
    finally:
        signal.signal(signal.SIGINT, inherited[0])
        signal.signal(signal.SIGTERM, inherited[1])
    scripts = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts["bertforge"] == "bertforge.__main__:start"  # the installed program starts there too


@pytest.mark.parametrize("argv", [["--help"], ["pretrain", "--help"], ["pretrain", "--no-such-flag"]])
def test_help_and_usage_errors_answer_without_importing_torch(argv):
    """Torch takes seconds to import; only a command that runs needs it."""
    lines = ["import sys", "from bertforge.cli import main", "try:", f"    main({argv!r})", "finally:"]
    code = "\n".join([*lines, "    print('torch' in sys.modules)"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == (0 if "--help" in argv else 2), done.stderr
    assert done.stdout.splitlines()[-1] == "False"


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("tokenizer", "prepare", "pretrain", "evaluate"):
        assert command in out
    from bertforge.cli import build_parser

    examples = out[out.index("examples:") :].replace("\\\n", " ").splitlines()[1:]
    assert len(examples) >= 8
    for example in examples:  # each example line is a command that parses as written
        build_parser().parse_args(shlex.split(example)[1:])


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


@pytest.mark.parametrize(
    "argv, message",
    [
        (["nope"], "invalid choice: 'nope'"),
        (
            ["finetune", "--jobs", "0"],
            "give a whole number of runs, 1 or more; see `bertforge finetune --help`",
        ),
        (["pretrain", "--max-steps", "abc"], "argument --max-steps: invalid"),
        (["attention", "a b", "--heads", "0"], "layers and heads count from 1"),
        (
            ["fill-mask", "--model", "m", "--bogus"],
            "unrecognized arguments: --bogus; see `bertforge fill-mask --help`",
        ),
        (
            ["tokenizer", "train", "--corpus", "c", "--out", "o", "--bogus"],
            "unrecognized arguments: --bogus; see `bertforge tokenizer train --help`",
        ),
        (
            ["pretrain", "--corpas", "README.md", "--out", "o"],
            "unrecognized arguments: --corpas README.md (did you mean --corpus?); see `bertforge pretrain",
        ),
        (
            ["tokenizer", "train", "--corpus", "c", "--out", "o", "--vocab-sise=8000"],
            "(did you mean --vocab-size?); see `bertforge tokenizer train --help`",
        ),
    ],
)
def test_a_usage_error_is_one_line_pointing_at_help(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("bertforge: error:") and message in err, err
    assert err.count("\n") == 1 and "usage:" not in err


@dataclass
class Pipeline:
    """What a user gets from typing tokenizer train, prepare, pretrain and evaluate in turn."""

    folder: Path
    tokenizer: subprocess.CompletedProcess
    prepare: subprocess.CompletedProcess
    pretrain: subprocess.CompletedProcess
    evaluate: subprocess.CompletedProcess

    @property
    def run(self) -> Path:
        return self.folder / "run"


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, wiki_slice, wiki_valid_slice) -> Pipeline:
    """tokenizer train -> prepare -> pretrain -> evaluate, as a user would type them: run once for the
    tests below, each of which checks what one command gave (in this process; other tests here start
    the program itself)."""
    folder = tmp_path_factory.mktemp("pipeline")
    corpus, valid, run = str(wiki_slice), str(wiki_valid_slice), str(folder / "run")
    cache = ("--cache-dir", str(folder / "cache"))
    with pytest.MonkeyPatch.context() as patch:  # its own cache, which the commands below fill
        patch.setenv("BERTFORGE_CACHE", str(folder / "cache"))
        tok = run_in_process(
            "tokenizer", "train", "--corpus", corpus, "--vocab-size", "2000", "--out", str(folder / "tok")
        )
        prep = run_in_process(
            "prepare", "--corpus", corpus, "--tokenizer", str(folder / "tok"), "--out", str(folder / "shards")
        )
        trained = run_in_process(
            *("pretrain", "--corpus", corpus, "--valid", valid, "--out", run, "--max-steps", "6", *cache),
            *("--precision", "fp32"),  # evaluate's default, so its metrics must equal the run's last ones
            *TINY,
        )
        evaluated = run_in_process("evaluate", "--model", run, "--corpus", valid, "--json", *cache, "--quiet")
    return Pipeline(folder, tok, prep, trained, evaluated)


def test_tokenizer_train_writes_a_vocabulary(pipeline):
    assert pipeline.tokenizer.returncode == 0, pipeline.tokenizer.stderr
    vocab = (pipeline.folder / "tok" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert f"tokenizer: {len(vocab):,} wordpiece tokens" in pipeline.tokenizer.stdout
    assert ("asked for" in pipeline.tokenizer.stdout) == (len(vocab) < 2000)  # a small text: maybe fewer


def test_a_vocabulary_smaller_than_asked_for_says_so(tmp_path, capsys):
    from bertforge.cli import main

    corpus = tmp_path / "small.txt"
    corpus.write_text("The film was good. The film was bad. A cat sat on the mat.\n", encoding="utf-8")
    argv = ["tokenizer", "train", "--corpus", str(corpus), "--kind", "wordlevel", "--min-freq", "1"]
    assert main([*argv, "--vocab-size", "5000", "--out", str(tmp_path / "tok")]) == 0
    size = len((tmp_path / "tok" / "vocab.txt").read_text(encoding="utf-8").splitlines())
    assert size < 20 and f"{size} wordlevel tokens (of 5,000 asked for: no more occur in the text" in (
        capsys.readouterr().out
    )


def test_prepare_writes_shards_of_the_documents(pipeline):
    assert pipeline.prepare.returncode == 0, pipeline.prepare.stderr
    meta = json.loads((pipeline.folder / "shards" / "meta.json").read_text())
    assert meta["num_documents"] > 10 and meta["num_tokens"] >= 1000
    assert (
        f"{meta['num_sentences']:,} sentences, {meta['num_tokens']:,} tokens written"
        in pipeline.prepare.stdout
    )


def test_pretrain_reports_held_out_metrics_and_speed(pipeline):
    assert pipeline.pretrain.returncode == 0, pipeline.pretrain.stderr
    assert "held-out: mlm_loss" in pipeline.pretrain.stdout and "real tokens/s" in pipeline.pretrain.stdout
    assert "tokenizer: " not in pipeline.pretrain.stdout  # --quiet: its training says nothing
    # The lines at evaluations during the run (steps 3 and 6) and the last one write figures alike.
    held_out = [line for line in pipeline.pretrain.stdout.splitlines() if "held-out" in line]
    assert len(held_out) >= 3, pipeline.pretrain.stdout
    for line in held_out:
        figures = line.split(": ", 1)[1].split(", ")
        assert all(re.fullmatch(r"\w+ -?\d+\.\d{4}", figure) for figure in figures), line


def test_pretrain_writes_the_run_folder(pipeline):
    assert pipeline.pretrain.returncode == 0, pipeline.pretrain.stderr
    for name in (
        "config.json",
        "metrics.jsonl",
        "loss.png",
        "final/model.safetensors",
        "final/vocab.txt",
        "final/config.json",
        "tokenizer/tokenizer.json",
    ):
        assert (pipeline.run / name).is_file(), name


def test_evaluate_prints_every_held_out_metric(pipeline):
    assert pipeline.evaluate.returncode == 0, pipeline.evaluate.stderr
    metrics = json.loads(pipeline.evaluate.stdout)
    metric_names = {"mlm_loss", "perplexity", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "unigram_entropy"}
    assert set(metrics) == metric_names
    assert 3.0 < metrics["unigram_entropy"] < math.log(2000)  # a 2,000-piece vocabulary, far from uniform


def test_evaluate_gives_the_runs_last_held_out_loss(pipeline):
    assert pipeline.evaluate.returncode == 0, pipeline.evaluate.stderr
    metrics = json.loads(pipeline.evaluate.stdout)
    last_valid = metrics_lines(pipeline.run)[-1]
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


def test_a_labelled_table_pretrains_on_its_text_column_alone(tmp_path, capsys, wiki_slice):
    from bertforge.cache import cached_shards, default_cache_dir
    from bertforge.corpus import read_documents
    from bertforge.tokenizer import load_tokenizer

    sentences = [sentence for document in read_documents(wiki_slice) for sentence in document][:400]
    table = tmp_path / "train.tsv"  # SST-2's layout: a sentence and its label a row
    table.write_text("sentence\tlabel\n" + "".join(f"{s}\t{i % 2}\n" for i, s in enumerate(sentences)))
    assert_clean_failure(capsys, pretrain_argv(table, tmp_path / "run"), "has no column 'text'")
    assert not (tmp_path / "run").exists()
    argv = pretrain_argv(table, tmp_path / "run", "--text-column", "sentence", "--no-nsp")
    assert main(argv) == 0
    tokenizer = load_tokenizer(tmp_path / "run" / "tokenizer")
    shards = cached_shards(table, tokenizer, "auto", default_cache_dir(), False, "sentence")
    assert len(shards.document_offsets) - 1 == len(
        sentences
    )  # a row a document; the header and labels are not text
    text_alone = sum(map(len, tokenizer.encode_batch(sentences)))
    assert shards.num_tokens == text_alone
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [record for record in metrics if record["split"] == "train"]
    assert train and all(record["loss"] > 0 for record in train)


def test_unknown_format(tmp_path, capsys, wiki_slice):
    assert_clean_failure(
        capsys, pretrain_argv(wiki_slice, tmp_path / "run", "--set", "data.format=xml"), "data.format"
    )


@pytest.mark.parametrize(
    "objective, message",
    [
        ("mlm", "has one document, and next sentence prediction takes its random sentences from others"),
        ("clm", "has 9 tokens, fewer than one sequence of 64; give more text to evaluate on"),
    ],
)
def test_a_validation_file_too_small_to_evaluate_on_is_named(
    tmp_path, capsys, wiki_slice, objective, message
):
    valid = tmp_path / "valid.txt"
    valid.write_text("one sentence here .\nand another one .\n", encoding="utf-8")
    argv = ["pretrain", "--objective", objective, "--preset", "tiny", "--corpus", str(wiki_slice)]
    argv += [
        "--valid",
        str(valid),
        "--out",
        str(tmp_path / "run"),
        "--set",
        "data.max_seq_length=64",
        "--quiet",
    ]
    assert_clean_failure(capsys, argv, f"the validation file {valid} {message}")
    assert not (tmp_path / "run").exists()


def test_an_empty_corpus_path_is_refused_not_read_as_this_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.md").write_text("some words of mine\n\nand more of them\n")
    argv = ["pretrain", "--corpus", "", "--out", str(tmp_path / "run"), "--max-steps", "2", *TINY]
    assert_clean_failure(capsys, argv, "--corpus holds an empty path (an unset shell variable?)")
    assert not (tmp_path / "run").exists()


def test_a_validation_file_that_is_also_training_text_is_warned_about(tmp_path, wiki_slice):
    copy = tmp_path / "copy.tokens"
    shutil.copy(wiki_slice, copy)
    expected = re.escape(f"the validation file {copy} is also training text ({wiki_slice})")
    with pytest.warns(UserWarning, match=expected):
        assert main([*pretrain_argv(wiki_slice, tmp_path / "run", "--valid", str(copy)), "--quiet"]) == 0


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
    assert_clean_failure(capsys, pretrain_argv(wiki_slice, out), "already holds a run (begun or finished)")
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]


def test_an_output_folder_of_other_files_is_refused_without_offering_resume(tmp_path, capsys, wiki_slice):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    message = "holds files but no bertforge run; choose a new"
    assert_clean_failure(capsys, pretrain_argv(wiki_slice, out), message)
    argv = ["pretrain", "--out", str(out), "--resume"]
    assert_clean_failure(capsys, argv, "holds no bertforge run to resume; start one without --resume")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_run_that_lost_its_config_names_the_checkpoints_copy(tmp_path, capsys, tiny_pretrained_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    (run / "config.json").unlink()
    newest = sorted((run / "checkpoints").iterdir())[-1] / "config.json"
    message = f"holds checkpoints but no config.json; copy {newest} into {run}, then resume"
    assert_clean_failure(capsys, ["pretrain", "--out", str(run), "--resume", "--quiet"], message)
    shutil.copy(newest, run / "config.json")
    assert main(["pretrain", "--out", str(run), "--resume", "--max-steps", "4", "--quiet"]) == 0


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


def same_size_tokenizer(tmp_path, wiki_slice) -> Path:
    """Another tokenizer of the tiny model's 2,000 tokens: cased, so other pieces and other ids."""
    from bertforge.config import TokenizerConfig
    from bertforge.tokenizer import train_tokenizer

    other = train_tokenizer(
        [wiki_slice], TokenizerConfig(vocab_size=2000, lowercase=False), tmp_path / "other"
    )
    assert other.vocab_size == 2000
    return tmp_path / "other"


@pytest.mark.parametrize("replaced", ["every tokenizer file", "tokenizer.json of an older folder"])
def test_tokenizer_of_the_same_size_from_another_model(
    tmp_path, capsys, tiny_pretrained_run, wiki_slice, replaced
):
    """The weights name the tokenizer they were trained with; a folder written before they did still
    has its tokenizer's fingerprint in bertforge_tokenizer.json, which catches tokenizer.json replaced."""
    from bertforge.checkpoint import read_weights

    model, other = tmp_path / "model", same_size_tokenizer(tmp_path, wiki_slice)
    shutil.copytree(tiny_pretrained_run / "final", model)
    names = ["tokenizer.json", "vocab.txt", "bertforge_tokenizer.json"]
    if replaced != "every tokenizer file":
        save_file(read_weights(model / "model.safetensors"), str(model / "model.safetensors"))  # no metadata
        names = ["tokenizer.json"]
    for name in names:
        shutil.copy(other / name, model / name)
    argv = ["evaluate", "--model", str(model), "--corpus", str(wiki_slice)]
    assert_clean_failure(capsys, argv, "is not the tokenizer the model in")


def test_model_folder_without_its_tokenizer(tmp_path, capsys, tiny_pretrained_run, wiki_slice):
    model = tmp_path / "run" / "final"
    shutil.copytree(tiny_pretrained_run / "final", model)
    shutil.copytree(same_size_tokenizer(tmp_path, wiki_slice), tmp_path / "tokenizer")  # not the model's
    (model / "tokenizer.json").unlink()
    argv = ["evaluate", "--model", str(model), "--corpus", str(wiki_slice)]
    assert_clean_failure(capsys, argv, f"model folder {model} has no tokenizer.json")


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
    assert_clean_failure(capsys, argv, "keeps the model, tokenizer and optimizer groups of the run")


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
    assert_clean_failure(capsys, [*argv, "--out", str(taken)], "is a file; --out must name a new folder")
    assert taken.read_text() == "not a folder"


def test_a_repeated_corpus_is_read_whole_or_refused(tmp_path, capsys, small_tokenizer_dir):
    """`tokenizer train` learns from every --corpus given; `prepare` takes one and says so, where a
    repeat used to keep the last alone."""
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("alpha beta gamma .\nalpha beta .\n", encoding="utf-8")
    second.write_text("delta epsilon .\ndelta epsilon .\n", encoding="utf-8")
    out = tmp_path / "tok"
    argv = ["tokenizer", "train", "--corpus", str(first), "--corpus", str(second), "--kind", "wordlevel"]
    assert main([*argv, "--min-freq", "2", "--out", str(out)]) == 0
    tokens = set(load_tokenizer(out).backend.get_vocab())
    assert {"alpha", "beta", "delta", "epsilon"} <= tokens
    argv = [
        "prepare",
        "--corpus",
        str(first),
        "--corpus",
        str(second),
        "--tokenizer",
        str(small_tokenizer_dir),
    ]
    assert_clean_failure(
        capsys, [*argv, "--out", str(tmp_path / "shards")], "prepare takes one --corpus file"
    )
    pattern = ["prepare", "--corpus", str(tmp_path / "*.txt"), "--tokenizer", str(small_tokenizer_dir)]
    assert_clean_failure(
        capsys, [*pattern, "--out", str(tmp_path / "shards")], "one --corpus file, not a pattern"
    )
    assert not (tmp_path / "shards").exists()


def write_parquet(path: Path, columns: dict) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return path


@pytest.mark.slow
def test_pretrain_on_several_corpora_then_resume(tmp_path, capsys, wiki_slice):
    """WikiText plus a folder of task text (gzipped lines and a Parquet column): all feed the tokenizer."""
    extra = tmp_path / "task"
    extra.mkdir()
    reviews = "".join(f"The zorblax film number {i} was great. I liked it.\n\n" for i in range(300))
    (extra / "reviews.txt.gz").write_bytes(gzip.compress(reviews.encode()))
    bodies = [f"A quuxle story, part {i}. It ends well." for i in range(300)]
    write_parquet(extra / "stories.parquet", {"label": list(range(300)), "body": bodies})
    run, cache = tmp_path / "run", tmp_path / "cache"
    common = ["--cache-dir", str(cache), *TINY]
    argv = ["pretrain", "--corpus", str(wiki_slice), "--corpus", str(extra), "--text-column", "body"]
    assert main([*argv, "--out", str(run), "--max-steps", "2", *common]) == 0
    data = json.loads((run / "config.json").read_text())["data"]
    assert data["corpus"] == [str(wiki_slice), str(extra)] and data["text_column"] == "body"
    vocabulary = set((run / "tokenizer" / "vocab.txt").read_text().split())
    assert {"zorblax", "quuxle"} <= vocabulary  # the tokenizer saw the gzip and Parquet files
    assert len(list((cache / "shards").iterdir())) == 3  # one shard folder per file
    capsys.readouterr()
    shown = [arg for arg in common if arg != "--quiet"]
    assert main(["pretrain", "--out", str(run), "--resume", "--max-steps", "3", *shown]) == 0
    out = capsys.readouterr().out
    assert "trained 3 steps" in out and "already reached its end" not in out
    assert f"resuming from {run / 'checkpoints' / 'step_000002'} (step 2)" in out
    assert re.search(r"tokens in \d+ s \(", out)  # seconds, not "0.0 min"
    assert main(["pretrain", "--out", str(run), "--resume", *common]) == 0  # nothing left to train
    out = capsys.readouterr().out
    assert "the run had already reached its end (3 steps); to train on, resume with a larger" in out


def bad_second_corpus(tmp_path: Path, case: str) -> str:
    if case == "corrupt gzip":
        text = "".join(f"Line {i} of a long text. It goes on.\n\n" for i in range(3000)).encode()
        (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(text)[:4000])
        return str(tmp_path / "cut.txt.gz")
    if case == "parquet without the column":
        return str(write_parquet(tmp_path / "docs.parquet", {"body": ["One.", "Two."]}))
    if case == "empty file":
        (tmp_path / "empty.txt").write_text("")
        return str(tmp_path / "empty.txt")
    return str(tmp_path / {"missing file": "missing.txt", "empty glob": "*.md"}[case])


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing file", "missing.txt does not exist"),
        ("empty glob", "*.md' matches no file"),
        ("empty file", "empty.txt is empty"),
        ("corrupt gzip", "cut.txt.gz is not a readable gzip file"),
        ("parquet without the column", "has no column 'text'; its columns are: body"),
    ],
)
def test_a_bad_second_corpus_fails_cleanly(tmp_path, capsys, wiki_slice, case, message):
    run, cache = tmp_path / "run", tmp_path / "cache"
    argv = ["pretrain", "--corpus", str(wiki_slice), "--corpus", bad_second_corpus(tmp_path, case)]
    assert_clean_failure(capsys, [*argv, "--out", str(run), "--cache-dir", str(cache), *TINY], message)
    assert not run.exists()
    assert not [path for path in cache.rglob("*") if path.is_file()]  # no tokenizer, no shards


@pytest.mark.parametrize(
    "valid, message",
    [
        ("folder", "validation path {} is a folder"),
        ("missing.txt", "validation file {} does not exist"),
        ("empty.txt", "validation file {} is empty"),
    ],
)
def test_a_bad_validation_file_is_named_as_one(tmp_path, capsys, wiki_slice, valid, message):
    (tmp_path / "folder").mkdir()
    (tmp_path / "empty.txt").write_text("")
    path, run = tmp_path / valid, tmp_path / "run"
    argv = ["pretrain", "--corpus", str(wiki_slice), "--valid", str(path), "--out", str(run), *TINY]
    assert_clean_failure(capsys, argv, message.format(path))
    assert not run.exists()


def test_a_run_whose_config_holds_one_corpus_string_resumes(
    tmp_path, capsys, tiny_pretrained_run, wiki_slice
):
    """config.json files written before data.corpus became a list hold a single string."""
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    saved = json.loads((run / "config.json").read_text())
    saved["data"]["corpus"] = str(wiki_slice)
    (run / "config.json").write_text(json.dumps(saved))
    assert main(["pretrain", "--out", str(run), "--resume", "--max-steps", "4", "--quiet"]) == 0
    assert "trained 4 steps" in capsys.readouterr().out


def test_errors_show_the_library_names_as_the_commands_flags():
    from bertforge.cli import COMMON_FLAGS, in_flags
    from bertforge.commands.finetuning import SETTING_FLAGS

    flags = COMMON_FLAGS | SETTING_FLAGS
    assert in_flags("x is a file; `out` must name a folder", flags) == "x is a file; --out must name a folder"
    assert in_flags("pass `resume=True` to continue it", flags) == "pass --resume to continue it"
    assert in_flags("lower train.batch_size", flags) == "lower --batch-size"
    assert in_flags("use runtime.device=cuda", flags) == "use --device=cuda"
    unrelated = "xtrain.batch_size and train.batch_size_of_x, data.max_seq_length2, out of memory"
    assert in_flags(unrelated, flags) == unrelated


@pytest.mark.parametrize(
    "device, message",
    [
        ("xpu", "'xpu' is not a device (--device); use auto, cpu, cuda, cuda:N or mps"),
        ("cuda:x", "'cuda:x' is not a device (--device)"),
        ("mps", "--device asks for mps but this torch has no Apple GPU; use --device=cpu"),
        ("cuda", "--device asks for CUDA but no GPU is visible; use --device=cpu"),
    ],
)
def test_a_device_that_is_not_there_is_one_line(pipeline, capsys, device, message):
    import torch

    present = {"mps": torch.backends.mps.is_available(), "cuda": torch.cuda.is_available()}
    if present.get(device):
        pytest.skip(f"this machine has {device}")
    argv = ["fill-mask", "--model", str(pipeline.folder / "run"), "--device", device, "the [MASK] sat ."]
    assert_clean_failure(capsys, argv, message)


def test_a_gpu_index_past_the_visible_ones_is_one_line(monkeypatch):
    import torch

    from bertforge.errors import BertforgeError
    from bertforge.runtime import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(BertforgeError, match=r"'cuda:2', but 2 GPU\(s\) are visible: use cuda:0 to cuda:1"):
        resolve_device("cuda:2")


def test_paths_left_over_by_an_unquoted_glob_are_named_as_such(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("words\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["pretrain", "--corpus", "a.txt", "b.txt", "--out", "run"])  # what `--corpus *.txt` becomes
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert "unrecognized arguments: b.txt (a glob the shell expanded? quote it" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["classify", "--model", "M", "fine", "caf\udce9"],
        ["fill-mask", "--model", "M", "caf\udce9"],
        ["nsp", "--model", "M", "a", "caf\udce9"],
        ["generate", "--model", "M", "caf\udce9"],
        ["attention", "--model", "M", "a", "caf\udce9"],
    ],
)
def test_a_text_argument_that_is_not_utf8_is_one_line(capsys, argv):
    """A Latin-1 terminal's "café" reaches Python as a lone surrogate, which the tokenizer refuses with a
    TypeError traceback."""
    assert_clean_failure(capsys, argv, "the text b'caf\\xe9' holds the byte 0xe9, which is not UTF-8")
