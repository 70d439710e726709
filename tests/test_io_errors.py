"""I/O faults end in one line: a full or read-only disk (a patched writer raising ENOSPC / EROFS),
torn and damaged files, impossible sizes and arguments, messages that name the real cause, and
import-hf reading weights only from inside its source folder."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SHARED_DATA, assert_clean_failure, metrics_lines
from safetensors import SafetensorError

from bertforge import io
from bertforge.cache import cached_shards, cached_tokenizer
from bertforge.checkpoint import list_checkpoints, read_config
from bertforge.cli import main
from bertforge.errors import BertforgeError
from bertforge.export import export_model
from bertforge.io import WriteError, write_error
from bertforge.labeled import json_line
from bertforge.metrics_log import MetricsLog
from bertforge.pretrain import pretrain
from bertforge.shards import TOKENS_FILE
from bertforge.tokenizer import load_tokenizer

REFUSALS = [(errno.ENOSPC, "no space left on device"), (errno.EROFS, "the file system is read-only")]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def copy_run(source: Path, tmp_path: Path) -> Path:
    """A copy of a finished run, as if stopped after its last checkpoint (no final/ yet)."""
    run = tmp_path / "run"
    shutil.copytree(source, run)
    shutil.rmtree(run / "final")
    return run


def refuse_writes(monkeypatch, code: int, makers: tuple[str, ...] = ("mkstemp", "mkdtemp")) -> None:
    """Atomic writes fail as that disk would, at their first temporary file (mkstemp: single files)
    or folder (mkdtemp: folders such as final/)."""

    def refused(*args, dir=None, **kwargs):
        raise OSError(code, os.strerror(code), str(dir))

    for maker in makers:
        monkeypatch.setattr(io.tempfile, maker, refused)


@pytest.mark.parametrize(("code", "words"), REFUSALS)
def test_a_refused_checkpoint_is_one_line_and_the_last_good_one_stays(
    tmp_path, capsys, monkeypatch, tiny_pretrained_run, code, words
):
    run = copy_run(tiny_pretrained_run, tmp_path)
    (kept,) = list_checkpoints(run)
    before = snapshot(kept)

    def full_disk(obj, handle, *args, **kwargs):  # half the file reaches the disk, then it is full
        handle.write(b"\0" * 100)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(torch, "save", full_disk)
    err = assert_clean_failure(
        capsys, ["pretrain", "--out", str(run), "--resume", "--max-steps", "4", "--quiet"], words
    )
    assert f"{kept.name}, is kept" in err and "--resume" in err
    assert list_checkpoints(run) == [kept] and snapshot(kept) == before
    assert [p.name for p in (run / "checkpoints").iterdir()] == [kept.name]  # no temporary leftovers


@pytest.mark.parametrize(("code", "words"), REFUSALS)
def test_refused_model_files_and_exports_are_one_line(
    tmp_path, capsys, monkeypatch, tiny_pretrained_run, small_tokenizer_dir, code, words
):
    lines = tmp_path / "lines.txt"
    lines.write_text("the cat sat\n")
    refuse_writes(monkeypatch, code)
    for argv, target in [
        (["export", "--model", str(tiny_pretrained_run)], "hf"),
        (["embed", "--model", str(tiny_pretrained_run), "--input", str(lines)], "e.npy"),
        (["tokenizer", "train", "--corpus", str(lines), "--vocab-size", "50"], "tok"),
    ]:
        out = tmp_path / target
        assert_clean_failure(capsys, [*argv, "--out", str(out)], f"cannot write {out}: {words}")
        assert not out.exists()


def test_a_refused_final_folder_keeps_the_checkpoint(tmp_path, capsys, monkeypatch, tiny_pretrained_run):
    run = copy_run(tiny_pretrained_run, tmp_path)
    before = snapshot(run / "checkpoints")
    refuse_writes(monkeypatch, errno.ENOSPC, ("mkdtemp",))  # the run is done: it only writes final/
    argv = ["pretrain", "--out", str(run), "--resume", "--quiet"]
    assert_clean_failure(capsys, argv, f"cannot write {run / 'final'}: no space left on device")
    assert snapshot(run / "checkpoints") == before and not (run / "final").exists()


def test_disk_errors_hidden_in_library_exceptions_are_recognised(tmp_path):
    target = tmp_path / "model.safetensors"
    rust = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert isinstance(write_error(target, rust), WriteError)
    torch_error = RuntimeError("[enforce fail at inline_container.cc] unexpected pos")
    torch_error.__context__ = OSError(errno.EROFS, "Read-only file system")  # from the Python handle
    assert "read-only" in str(write_error(target, torch_error))
    assert write_error(target, ValueError("a bug")) is None
    elsewhere = OSError(errno.EACCES, "Permission denied", "/etc/shadow")  # reading another file
    assert write_error(target, elsewhere) is None
    assert isinstance(WriteError(target, errno.ENOSPC), OSError)  # `except OSError` still catches it


def test_an_unwritable_cache_is_one_line(tmp_path, capsys, monkeypatch, wiki_slice):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("BERTFORGE_CACHE", str(blocker / "cache"))
    argv = ["pretrain", "--corpus", str(wiki_slice), "--out", str(tmp_path / "run"), "--max-steps", "1"]
    assert_clean_failure(capsys, [*argv, "--quiet"], "set BERTFORGE_CACHE to a writable folder")


def test_a_torn_last_metrics_line_is_dropped_on_resume(tmp_path, tiny_pretrained_run):
    run = copy_run(tiny_pretrained_run, tmp_path)
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 4, "split": "tr')  # the crash came mid-line
    config = read_config(run)
    config.train.max_steps = 4
    pretrain(config, run, resume=True, show_progress=False)
    assert [r["step"] for r in metrics_lines(run, "train")] == [1, 2, 3, 4]


def test_a_damaged_metrics_line_before_the_last_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "split": "train"}\nNOT JSON\n{"step": 2, "split": "train"}\n')
    with pytest.raises(BertforgeError, match="line 2 is not a metrics record"):
        MetricsLog(path).truncate_after(2)


def test_a_metrics_line_without_its_split_is_named_by_plot(tmp_path, capsys, tiny_pretrained_run):
    run = copy_run(tiny_pretrained_run, tmp_path)
    first, *rest = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join([first, '{"step": 5}\n', *rest]))
    assert_clean_failure(
        capsys, ["plot", str(run), "--out", str(tmp_path / "p.png")], "line 2 is not a metrics record"
    )


def test_a_truncated_optimizer_state_is_named(tmp_path, capsys, tiny_pretrained_run):
    run = copy_run(tiny_pretrained_run, tmp_path)
    (checkpoint,) = list_checkpoints(run)
    state = json.loads((checkpoint / "state.json").read_text())
    # as written before checkpoints recorded their hashes: only loading it can find the damage
    del state["sha256"], state["checksums"]
    (checkpoint / "state.json").write_text(json.dumps(state))
    (checkpoint / "checksums.json").unlink()
    os.truncate(checkpoint / "optimizer.pt", 1000)
    argv = ["pretrain", "--out", str(run), "--resume", "--max-steps", "4", "--quiet"]
    assert_clean_failure(capsys, argv, "optimizer.pt is damaged")


def test_a_pipe_given_as_a_file_is_named_as_one(tmp_path, capsys, tiny_pretrained_run):
    """/dev/stdin or <(...): read more than once (hashed, sniffed, tokenized), a pipe would be empty."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    message = f"{fifo} is not a regular file (a pipe or a device); save the text to a file"
    model = ["--model", str(tiny_pretrained_run)]
    assert_clean_failure(capsys, ["fill-mask", *model, "--input", str(fifo)], message)
    assert_clean_failure(capsys, ["evaluate", *model, "--corpus", str(fifo)], message)
    pretrain = ["pretrain", "--preset", "tiny", "--corpus", str(fifo), "--out", str(tmp_path / "run")]
    assert_clean_failure(capsys, pretrain, message)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "value, fault", [("[" * 5000 + "]" * 5000, "maximum recursion depth"), ("1" * 5000, "Exceeds the limit")]
)
def test_json_that_pythons_decoder_cannot_hold_is_one_line(tmp_path, capsys, value, fault):
    """A nesting deeper than Python's recursion limit, or an integer over 4,300 digits, in any field."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        '{"text": "A sentence."}\n{"text": "Another.", "meta": ' + value + "}\n", encoding="utf-8"
    )
    out = tmp_path / "tok"
    argv = ["tokenizer", "train", "--corpus", str(corpus), "--vocab-size", "100", "--out", str(out)]
    assert_clean_failure(capsys, argv, f"line 2: not valid JSON ({fault}")
    assert not out.exists()
    with pytest.raises(BertforgeError, match=rf"train.jsonl line 3 is not valid JSON \({fault}"):
        json_line(tmp_path / "train.jsonl", 3, '{"text": "good", "label": 1, "meta": ' + value + "}")


def test_impossible_arguments_and_sizes_are_one_line(tmp_path, capsys, tiny_pretrained_run, wiki_slice):
    lines = tmp_path / "lines.txt"
    lines.write_text("the cat sat\n")
    folder = tmp_path / "vectors.npy"
    folder.mkdir()
    embed = ["embed", "--model", str(tiny_pretrained_run), "--input", str(lines), "--out", str(folder)]
    assert_clean_failure(capsys, embed, "is a folder")
    classify = ["classify", "--model", str(tiny_pretrained_run), "--batch-size", "0", "a text"]
    assert_clean_failure(capsys, classify, "--batch-size must be positive, got 0")
    out = tmp_path / "run"
    for setting, message in [
        ("model.max_position_embeddings=100000000", "is above 65,536"),
        ("model.hidden_size=1000000", "above bertforge's limit of 10 billion"),
    ]:
        argv = ["pretrain", "--corpus", str(wiki_slice), "--out", str(out), "--set", setting, "--quiet"]
        assert_clean_failure(capsys, [*argv, "--set", "model.num_attention_heads=1"], message)
        assert not out.exists()


def test_cached_shards_with_ids_beyond_the_vocabulary_are_named(tmp_path, small_tokenizer_dir):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat .\nit was a sunny day .\n\nanother document here .\n")
    tokenizer = load_tokenizer(small_tokenizer_dir)
    shards = cached_shards(corpus, tokenizer, "text", tmp_path / "cache", show_progress=False)
    path, dtype = shards.path / TOKENS_FILE, shards.tokens.dtype
    del shards  # closes the memory map
    tokens = np.fromfile(path, dtype=dtype)
    tokens[1] = tokenizer.vocab_size + 7  # a flipped bit in the cache
    tokens.tofile(path)
    with pytest.raises(BertforgeError, match=r"damaged cache entry .* token id 2007.*delete that folder"):
        cached_shards(corpus, tokenizer, "text", tmp_path / "cache", show_progress=False)


def edit_model_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["model"].update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_messages_name_the_real_cause(tmp_path, capsys, tiny_pretrained_run):
    layers = tmp_path / "layers"
    shutil.copytree(tiny_pretrained_run / "final", layers)
    edit_model_config(layers, num_hidden_layers=-1)
    err = assert_clean_failure(capsys, ["fill-mask", "--model", str(layers), "a [MASK]"], "num_hidden_layers")
    assert "must be positive, got -1" in err and "does not fit" not in err

    hidden = tmp_path / "hidden"
    shutil.copytree(tiny_pretrained_run / "final", hidden)
    edit_model_config(hidden, hidden_size=64)
    err = assert_clean_failure(capsys, ["fill-mask", "--model", str(hidden), "a [MASK]"], "hidden_size is 64")
    assert "vocabulary" not in err

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    argv = ["export", "--model", str(tiny_pretrained_run), "--out", str(a_file)]
    assert_clean_failure(capsys, argv, "is a file; --out must name a new folder")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, tiny_pretrained_run) -> Path:
    out = tmp_path_factory.mktemp("hf") / "model"
    export_model(tiny_pretrained_run, out)
    return out


def sharded_copy(hf_folder: Path, folder: Path, shard_name: str) -> Path:
    """A copy of `hf_folder` whose weights are named by an index as `shard_name`."""
    shutil.copytree(hf_folder, folder)
    weights = folder / "model.safetensors"
    index = {"metadata": {}, "weight_map": dict.fromkeys(load_keys(weights), shard_name)}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return weights


def load_keys(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        return list(handle.keys())


def test_import_reads_weights_only_from_inside_its_folder(tmp_path, capsys, hf_folder):
    outside = tmp_path / "outside.safetensors"
    for name, shard in [("dotdot", "../outside.safetensors"), ("absolute", str(outside))]:
        weights = sharded_copy(hf_folder, tmp_path / name, shard)
        shutil.move(weights, outside)
        argv = ["import-hf", "--from", str(tmp_path / name), "--out", str(tmp_path / f"{name}-out")]
        assert_clean_failure(capsys, argv, "outside its folder")

    linked = tmp_path / "linked"
    shutil.copytree(hf_folder, linked)
    (linked / "model.safetensors").unlink()
    (linked / "model.safetensors").symlink_to(outside)
    argv = ["import-hf", "--from", str(linked), "--out", str(tmp_path / "linked-out")]
    assert_clean_failure(capsys, argv, f"leads to {outside.resolve()}, outside {linked}")
    assert not (tmp_path / "linked-out").exists()


def test_import_follows_a_hugging_face_cache_snapshot_into_its_blobs(tmp_path, capsys, hf_folder):
    repo = tmp_path / "models--someone--bert"
    snapshot_dir = repo / "snapshots" / "abc123"
    shutil.copytree(hf_folder, snapshot_dir)
    (repo / "blobs").mkdir()
    shutil.move(snapshot_dir / "model.safetensors", repo / "blobs" / "f00d")
    (snapshot_dir / "model.safetensors").symlink_to(Path("../../blobs/f00d"))
    assert main_ok(["import-hf", "--from", str(snapshot_dir), "--out", str(tmp_path / "imported")])


def main_ok(argv: list[str]) -> bool:
    return main(argv) == 0


def fill_disk_at(monkeypatch, name: str) -> None:
    """Files named `name` are written to /dev/full, which refuses every write as a full disk does: the
    disk fills up in the middle of writing them."""
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    open_path = Path.open

    def opening(path, mode="r", *args, **kwargs):
        full = path.name == name and any(flag in mode for flag in "wax")
        return open_path(Path("/dev/full") if full else path, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", opening)


def test_a_disk_that_fills_up_under_prepared_shards_is_one_line(
    tmp_path, capsys, monkeypatch, wiki_slice, small_tokenizer_dir
):
    fill_disk_at(monkeypatch, TOKENS_FILE)
    out = tmp_path / "shards"
    argv = ["prepare", "--corpus", str(wiki_slice), "--tokenizer", str(small_tokenizer_dir)]
    assert main([*argv, "--out", str(out)]) == 2
    *progress, last = capsys.readouterr().err.splitlines()  # prepare shows its progress
    assert last == f"bertforge: error: cannot write {out}: {io.REASONS[errno.ENOSPC]}"
    assert all(line.startswith("tokenizing") for line in progress)
    assert not list(tmp_path.iterdir())  # no partial folder, no temporary, no lock

    cache = tmp_path / "cache"
    argv = ["pretrain", "--corpus", str(wiki_slice), "--tokenizer", str(small_tokenizer_dir)]
    argv += ["--out", str(tmp_path / "run"), "--cache-dir", str(cache), "--quiet"]
    err = assert_clean_failure(capsys, argv, f"cannot write {cache / 'shards'}")
    assert re.search(r"shards/\w+: no space left on device", err), err
    assert not list((cache / "shards").iterdir()) and not (tmp_path / "run").exists()


def test_an_out_path_under_a_file_is_one_line(tmp_path, capsys, tiny_pretrained_run, wiki_slice):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    lines = tmp_path / "lines.txt"
    lines.write_text("the cat sat\n")
    model = ["--model", str(tiny_pretrained_run)]
    for argv, out in [
        (["export", *model], a_file / "sub"),
        (["embed", *model, "--input", str(lines)], a_file / "vectors.npy"),
        (["tokenizer", "train", "--corpus", str(lines), "--vocab-size", "50"], a_file / "sub" / "tok"),
        (
            ["prepare", "--corpus", str(wiki_slice), "--tokenizer", str(tiny_pretrained_run / "tokenizer")],
            a_file / "sub",
        ),
        (["pretrain", "--corpus", str(wiki_slice), "--max-steps", "1"], a_file / "sub"),
    ]:
        err = assert_clean_failure(capsys, [*argv, "--out", str(out)], f"{a_file} is a file, not a folder")
        assert "File exists" not in err and "Not a directory" not in err
    assert a_file.read_text() == ""


def test_impossible_numbers_on_the_command_line_are_one_line(
    tmp_path, capsys, tiny_pretrained_run, wiki_slice
):
    out, model = tmp_path / "run", ["--model", str(tiny_pretrained_run)]
    pretrain = ["pretrain", "--corpus", str(wiki_slice), "--out", str(out), "--quiet"]
    seed = "runtime.seed must be from 0 to 4,294,967,295 (2**32 - 1, NumPy's largest seed), got"
    for argv, message in [
        ([*pretrain, "--set", "train.adam_beta1=1.0"], "train.adam_beta1 must be in [0, 1), got 1.0"),
        ([*pretrain, "--set", "train.adam_beta2=1.0"], "train.adam_beta2 must be in [0, 1), got 1.0"),
        ([*pretrain, "--set", "train.adam_beta2=-0.5"], "train.adam_beta2 must be in [0, 1), got -0.5"),
        ([*pretrain, "--seed", "-1"], f"{seed} -1"),
        ([*pretrain, "--seed", "99999999999999999999"], f"{seed} 99999999999999999999"),
        ([*pretrain, "--set", "runtime.num_workers=100000"], "runtime.num_workers must be -1 (auto) or"),
        (["generate", *model, "a", "--seed", str(2**64)], "--seed must be from 0 to 4,294,967,295"),
        (["generate", *model, "a", "--temperature", "nan"], "--temperature must be in (0, 100], got nan"),
        (["fill-mask", *model, "a [MASK]", "--top-k", str(10**20)], "--top-k must be at most 2,147,483,647"),
        (["showcase", *model, "--corpus", str(wiki_slice), "--seed", "-1"], "--seed must be from 0"),
        (["evaluate", *model, "--corpus", str(wiki_slice), "--max-pairs", "-1"], "--max-pairs must not be"),
    ]:
        assert_clean_failure(capsys, argv, message)
        assert not out.exists()
    finetune = ["finetune", *model, "--train", "t.csv", "--valid", "v.csv", "--out", str(out)]
    finetune += ["--text-column", "text", "--label-column", "label"]
    assert_clean_failure(capsys, [*finetune, "--epochs", str(10**20)], "--epochs must be at most")
    with pytest.raises(SystemExit, match="2"):  # argparse's own error line
        main([*finetune, "--seeds", f"1,{2**32}"])
    assert f"a seed must be from 0 to 4,294,967,295 (2**32 - 1, NumPy's largest seed), got {2**32}" in (
        capsys.readouterr().err
    )


def test_a_corpus_that_changes_while_it_is_read_leaves_no_cache_entry(
    tmp_path, monkeypatch, small_tokenizer_dir
):
    import bertforge.cache

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat .\n\nanother document here .\n")
    tokenizer = load_tokenizer(small_tokenizer_dir)
    build = bertforge.cache.build_shards

    def build_while_written(*args, **kwargs):
        build(*args, **kwargs)
        with corpus.open("a") as handle:  # another program still writing the file
            handle.write("\nmore text arrives .\n")

    monkeypatch.setattr(bertforge.cache, "build_shards", build_while_written)
    with pytest.raises(BertforgeError, match="corpus.txt changed while it was read"):
        cached_shards(corpus, tokenizer, "text", tmp_path / "cache", show_progress=False)
    assert not list((tmp_path / "cache" / "shards").iterdir())


def test_damaged_cache_entries_are_named_as_entries_to_delete(tmp_path, wiki_slice, small_tokenizer_dir):
    from bertforge.config import TokenizerConfig

    config = TokenizerConfig(vocab_size=500)
    tokenizer = cached_tokenizer([wiki_slice], config, "text", tmp_path / "cache", show_progress=False)
    (entry,) = (tmp_path / "cache" / "tokenizers").iterdir()
    saved = (entry / "tokenizer.json").read_text()
    (entry / "tokenizer.json").write_text(saved.replace('"the":', '"teh":', 1))  # valid, but edited
    with pytest.raises(BertforgeError, match="damaged cache entry .*delete that folder"):
        cached_tokenizer([wiki_slice], config, "text", tmp_path / "cache", show_progress=False)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat .\n\nanother document here .\n")
    shards = cached_shards(corpus, tokenizer, "text", tmp_path / "cache", show_progress=False)
    path = shards.path
    del shards
    os.truncate(path / TOKENS_FILE, 2)
    with pytest.raises(BertforgeError, match="tokens.bin has 2 bytes.*delete that folder \\(it is rebuilt"):
        cached_shards(corpus, tokenizer, "text", tmp_path / "cache", show_progress=False)


def test_a_checkpoint_refuses_a_tokenizer_its_run_did_not_start_with(
    tmp_path, capsys, tiny_pretrained_run, wiki_slice
):
    from bertforge.config import TokenizerConfig
    from bertforge.tokenizer import train_tokenizer

    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    shutil.rmtree(run / "tokenizer")
    other = SHARED_DATA / "tinyshakespeare" / "input.txt"
    train_tokenizer([other], TokenizerConfig(vocab_size=2000), run / "tokenizer", show_progress=False)
    checkpoint = list_checkpoints(run)[-1]
    assert_clean_failure(
        capsys,
        ["fill-mask", "--model", str(checkpoint), "the [MASK] ."],
        "is not the tokenizer this run started with",
    )


def test_a_tokenizer_with_gaps_in_its_ids_is_refused(tmp_path, small_tokenizer_dir):
    folder = tmp_path / "gaps"
    shutil.copytree(small_tokenizer_dir, folder)
    (folder / "bertforge_tokenizer.json").unlink()
    described = json.loads((folder / "tokenizer.json").read_text())
    described["model"]["vocab"]["the"] = 70000
    (folder / "tokenizer.json").write_text(json.dumps(described))
    with pytest.raises(BertforgeError, match="numbers its tokens with 1 gaps|with .* gaps"):
        load_tokenizer(folder)
