"""Shared fixtures: paths to the shared data, a small WikiText slice, a tiny config, a private cache,
and readers of what runs write; and the check, before anything is collected, that every test
dependency (pyproject's `test` extra) is installed: a missing one fails the run instead of turning
the tests that need it into skips."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bertforge.config import RunConfig, TokenizerConfig

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
WIKI_TRAIN = SHARED_DATA / "wikitext-2" / "wiki.train.tokens"
WIKI_VALID = SHARED_DATA / "wikitext-2" / "wiki.valid.tokens"


def missing_test_dependencies(requirements: list[str]) -> list[str]:
    """The requirements (`name>=version` strings) that are not installed, or installed at a version
    they exclude, each as `requirement (why)`."""
    from packaging.requirements import Requirement

    missing = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{text} (not installed)")
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            missing.append(f"{text} ({version} is installed)")
    return missing


def pytest_configure(config):
    """Refuse to run without the test extra: without transformers, say, the parity tests would
    otherwise skip and the suite would pass. In one of several test processes (`pytest -n`), use one
    thread, and give the programs its tests start one too (torch reads OMP_NUM_THREADS as it starts):
    a program of two threads beside the other test process leaves one of them waiting, which made such
    tests twice as slow as alone."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"
    if not PYPROJECT.is_file():
        return
    extras = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    # ruff and pytest-xdist are `make test`'s own (the lint step, two test processes); no test imports them.
    needed = [r for r in extras["test"] if not r.startswith(("ruff", "pytest-xdist"))]
    missing = missing_test_dependencies(needed)
    if missing:
        raise pytest.UsageError(
            f"the test dependencies are not all installed: {', '.join(missing)}; "
            "install them with `pip install -e '.[test]'` (or `make test`)"
        )


# The files that take longest (measured on a 2-core CPU), longest first. `make test` hands whole files
# to its two processes in collection order (`--dist loadfile --no-loadscope-reorder`): the long ones
# start first and the short ones fill the end, instead of one long file running on after the rest.
LONGEST_FILES = (
    "test_benchmarks.py",
    "test_interrupts.py",
    "test_glue.py",
    "test_worker_pool.py",
    "test_finetune.py",
    "test_distributed.py",
    "test_train.py",
    "test_kill_resume.py",
    "test_cli.py",
    "test_glue_versus.py",
    "test_finetune_cli.py",
    "test_resume_guards.py",
    "test_clm.py",
    "test_faults.py",
    "test_gpu_paths.py",  # with inductor's cache empty, as on a fresh machine
    "test_inference_cli.py",
    "test_fault_matrix.py",
    "test_resume_faults.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FILES)))  # stable: order within kept


# What `Figure.savefig` writes in tests that are not marked `rendered`: a PNG's signature, no pixels.
STAND_IN_PNG = b"\x89PNG\r\n\x1a\n(figure built, not rendered)"


@pytest.fixture(autouse=True)
def figures_built_not_rendered(request, monkeypatch):
    """Laying out and rendering a PNG is most of a tiny run's time (a second of matplotlib's text
    layout per figure, hundreds of figures in the suite): tests build every figure (so data a figure
    cannot take still fails) and write a stand-in; those marked `rendered` lay out and draw the pixels,
    as do the commands the tests start as programs or in workers."""
    if request.node.get_closest_marker("rendered"):
        return
    from matplotlib.figure import Figure

    monkeypatch.setattr(Figure, "tight_layout", lambda _figure, **_: None)
    monkeypatch.setattr(Figure, "savefig", lambda _figure, out, **_: out.write(STAND_IN_PNG))


@pytest.fixture(autouse=True, scope="session")
def private_cache(tmp_path_factory):
    """Keep the tokenizer and shard cache out of the user's home during tests: one cache for the whole
    test run, set before any fixture, so that the fixtures shared by many tests use it too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BERTFORGE_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        yield


# Where ../shared is not beside the checkout (a GPU machine), the device check generates text
# (benchmarks/gpu_check.py) and names its folder: its train.txt and valid.txt replace the slices.
CARRIED_CORPUS = os.environ.get("BERTFORGE_TEST_CORPUS")


@pytest.fixture(scope="session")
def wiki_slice(tmp_path_factory) -> Path:
    """The first ~40 WikiText-2 training articles (about 0.6 MB) as a corpus file."""
    if CARRIED_CORPUS:
        return Path(CARRIED_CORPUS) / "train.txt"
    lines = WIKI_TRAIN.read_text(encoding="utf-8").splitlines(keepends=True)[:2400]
    path = tmp_path_factory.mktemp("corpus") / "wiki.slice.tokens"
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def wiki_valid_slice(tmp_path_factory) -> Path:
    if CARRIED_CORPUS:
        return Path(CARRIED_CORPUS) / "valid.txt"
    lines = WIKI_VALID.read_text(encoding="utf-8").splitlines(keepends=True)[:800]
    path = tmp_path_factory.mktemp("corpus") / "wiki.valid.slice.tokens"
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.fixture
def short_corpus(tmp_path, wiki_slice):
    """Four documents' openings: epochs of a few steps."""
    corpus = tmp_path / "short.tokens"
    lines = wiki_slice.read_text(encoding="utf-8").splitlines(True)
    heads = [i for i, line in enumerate(lines) if line.startswith(" = ") and not line.startswith(" = =")]
    corpus.write_text("".join(line for h in heads[:4] for line in lines[h : h + 12]), encoding="utf-8")
    return corpus


@pytest.fixture(scope="session")
def small_tokenizer_dir(tmp_path_factory, wiki_slice) -> Path:
    """A 2,000-token WordPiece vocabulary trained on the slice."""
    from bertforge.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("tokenizer") / "tok"
    train_tokenizer([wiki_slice], TokenizerConfig(vocab_size=2000), out)
    return out


@pytest.fixture(scope="session")
def tiny_pretrained_run(tmp_path_factory, wiki_slice, small_tokenizer_dir) -> Path:
    """A tiny model pretrained for 3 steps: a real run folder for tests that only read it or copy it."""
    from bertforge.pretrain import pretrain

    run = tmp_path_factory.mktemp("pretrained") / "run"
    pretrain(
        tiny_config(wiki_slice, max_steps=3, eval_every=3),
        run,
        tokenizer_dir=small_tokenizer_dir,
        show_progress=False,
    )
    return run


STSB_TRAIN_PAIRS, STSB_VALID_PAIRS = 600, 300


@pytest.fixture(scope="session")
def stsb(tmp_path_factory) -> tuple[Path, Path]:
    """The first 600 pairs of STS-B's training file as training data, the next 300 as validation data
    (GLUE's ten columns and header, scores 0-5 written as "3.800")."""
    header, *rows = (SHARED_DATA / "glue" / "stsb" / "train.tsv").read_text(encoding="utf-8").splitlines()
    folder = tmp_path_factory.mktemp("stsb")
    train, valid = folder / "train.tsv", folder / "dev.tsv"
    train.write_text("\n".join([header, *rows[:STSB_TRAIN_PAIRS]]) + "\n", encoding="utf-8")
    valid_rows = rows[STSB_TRAIN_PAIRS : STSB_TRAIN_PAIRS + STSB_VALID_PAIRS]
    valid.write_text("\n".join([header, *valid_rows]) + "\n", encoding="utf-8")
    return train, valid


def stsb_finetune_argv(model: Path, data: tuple[Path, Path], out: Path, *extra: str) -> list[str]:
    """`bertforge finetune` on STS-B's pairs in `data` (train, valid), 48 tokens, fp32, quiet."""
    train, valid = data
    return [
        "finetune", "--model", str(model), "--train", str(train), "--valid", str(valid),
        "--text-column", "sentence1", "--text-pair-column", "sentence2", "--label-column", "score",
        "--out", str(out), "--max-length", "48", "--precision", "fp32", "--quiet", *extra,
    ]  # fmt: skip


# A tiny GPT-1 in our `ModelConfig` field names (OpenAIGPT's activation and epsilon), for parity tests.
HF_TINY_GPT_SIZES = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    hidden_act="gelu_new",
    max_position_embeddings=16,
    layer_norm_eps=1e-5,
    initializer_range=0.2,
    objective="clm",
)

# A tiny BERT in Hugging Face `BertConfig` / our `ModelConfig` field names, for parity tests.
HF_TINY_SIZES = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    type_vocab_size=2,
    initializer_range=0.02,
    layer_norm_eps=1e-12,
    pad_token_id=0,
)


def metrics_lines(run: Path, split: str | None = None) -> list[dict]:
    """The records of `run`/metrics.jsonl (only those of `split` when given), read as strict JSON:
    a bare NaN or Infinity, which `MetricsLog` must never write, fails the test."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    text = (Path(run) / "metrics.jsonl").read_text(encoding="utf-8")
    records = [json.loads(line, parse_constant=refuse) for line in text.splitlines()]
    return [record for record in records if split is None or record["split"] == split]


def assert_clean_failure(capsys, argv: list[str], message: str) -> str:
    """Exit status 2, one `bertforge: error:` line naming the problem, no traceback."""
    from bertforge.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertforge: error:") and message in err, err
    assert "Traceback" not in err and err.count("\n") == 1
    return err


def corpus_of(tokens, vocab_size: int = 40) -> SimpleNamespace:
    """A token sequence as the corpus statistics read a `TokenShards` (tokens, count, vocabulary)."""
    tokens = np.asarray(tokens, dtype=np.uint16)
    return SimpleNamespace(tokens=tokens, num_tokens=len(tokens), vocab_size=vocab_size)


def tiny_config(corpus: Path | None = None, valid: Path | None = None, **train) -> RunConfig:
    """A model small enough for a CPU test to train in seconds."""
    config = RunConfig()
    model = config.model
    model.num_hidden_layers, model.hidden_size, model.num_attention_heads = 2, 32, 2
    model.intermediate_size, model.max_position_embeddings = 64, 64
    config.tokenizer.vocab_size = 2000
    config.data.max_seq_length = 64
    config.data.eval_max_pairs = 64
    config.data.corpus = [str(corpus)] if corpus else []
    config.data.valid = str(valid) if valid else ""
    config.train.batch_size = 8
    config.train.max_steps = 8
    config.train.eval_every = 4
    config.train.log_every = 1
    config.train.learning_rate = 1e-3
    config.runtime.precision = "fp32"  # the same arithmetic on every machine; "auto" has its own tests
    for key, value in train.items():
        setattr(config.train, key, value)
    return config
