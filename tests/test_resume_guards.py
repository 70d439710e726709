"""What a run must not take on trust or leave behind: a resumed run refuses changed text and flags
that would reshape its model; data paths are absolute; leftovers of killed writers (run folders,
checkpoint pruning, the cache) are cleaned at the next start; a stray label draws a warning; and
messages name the real cause."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from conftest import assert_clean_failure, tiny_config

from bertforge import io
from bertforge.cache import remove_orphans
from bertforge.checkpoint import list_checkpoints, prune_checkpoints, read_state, verify_files
from bertforge.cli import main
from bertforge.config import TokenizerConfig
from bertforge.corpus import READER_VERSION
from bertforge.io import RunFolderLock, entry_lock
from bertforge.labeled import label_names, read_labeled
from bertforge.pretrain import pretrain
from bertforge.tokenizer import train_tokenizer
from bertforge.train import TrainState


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def own_corpus_run(tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir) -> Path:
    """A 2-step run on copies of the corpus and validation text that a test may change."""
    corpus, valid = tmp_path / "train.txt", tmp_path / "valid.txt"
    shutil.copy(wiki_slice, corpus)
    shutil.copy(wiki_valid_slice, valid)
    run = tmp_path / "run"
    config = tiny_config(corpus, valid, max_steps=2, eval_every=2)
    pretrain(config, run, tokenizer_dir=small_tokenizer_dir, show_progress=False)
    return run


# ------------------------------------------------------------------------ item 7: resume and its data


def test_resume_refuses_changed_text_unless_allowed(own_corpus_run, capsys):
    run = own_corpus_run
    corpus, valid = run.parent / "train.txt", run.parent / "valid.txt"
    with corpus.open("a") as handle:
        handle.write("\n = A new article = \n\n Text that was not there when the run started .\n")
    before = snapshot(run)
    resume = ["pretrain", "--out", str(run), "--resume", "--max-steps", "3", "--quiet"]
    err = assert_clean_failure(capsys, resume, f"data changed since the run in {run} started: {corpus};")
    assert "--allow-changed-data" in err and str(valid) not in err
    assert snapshot(run) == before  # nothing written, not even the lock

    assert main([*resume, "--allow-changed-data"]) == 0
    assert "trained 3 steps" in capsys.readouterr().out
    assert main([*resume[:-3], "--max-steps", "4", "--quiet"]) == 0  # data.json now holds the new text

    valid.write_text(valid.read_text() + "\n = Another = \n\n More text .\n")
    assert_clean_failure(capsys, [*resume[:-3], "--max-steps", "5"], f"started: {valid};")
    other = run.parent / "other.txt"
    shutil.copy(corpus, other)  # the same text under another name is another corpus
    argv = [*resume[:-3], "--max-steps", "5", "--corpus", str(other)]
    message = f"started: {valid}; the run in {run} started on {corpus}, not on {other};"
    assert_clean_failure(capsys, argv, message)
    argv = [*resume[:-3], "--max-steps", "5", "--corpus", str(corpus), "--corpus", str(other)]
    assert_clean_failure(capsys, argv, f"the run in {run} did not start on {other};")


def test_resume_refuses_the_text_read_as_another_format_or_field(own_corpus_run, tmp_path, capsys):
    resume = ["pretrain", "--out", str(own_corpus_run), "--resume", "--max-steps", "3", "--quiet"]
    for flags in (["--format", "jsonl"], ["--set", "data.format=text"]):
        err = assert_clean_failure(capsys, [*resume, *flags], "read its text as format 'auto';")
        assert "--allow-changed-data" in err
    assert main([*resume, "--text-column", "body"]) == 0  # plain text has no columns: nothing changes
    assert "trained 3 steps" in capsys.readouterr().out

    records = tmp_path / "records.jsonl"  # a text field and another
    lines = (own_corpus_run.parent / "train.txt").read_text().splitlines()  # a record a line
    records.write_text("".join(json.dumps({"text": t, "body": t[::-1]}) + "\n" for t in lines if t.strip()))
    run = tmp_path / "jsonl-run"
    argv = ["pretrain", "--corpus", str(records), "--out", str(run), "--preset", "tiny", "--max-steps", "2",
            "--batch-size", "4", "--set", "data.max_seq_length=32", "--set", "tokenizer.vocab_size=300",
            "--quiet"]  # fmt: skip
    assert main(argv) == 0
    again = ["pretrain", "--out", str(run), "--resume", "--max-steps", "3", "--quiet"]
    assert_clean_failure(
        capsys, [*again, "--text-column", "body"], "format 'auto', text field or column 'text';"
    )


def test_a_resume_at_the_runs_end_writes_nothing(tmp_path, capsys, tiny_pretrained_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    before = snapshot(run)
    argv = ["pretrain", "--out", str(run), "--resume", "--lr", "7e-4", "--max-steps", "3", "--quiet"]
    assert main(argv) == 0
    assert "already reached its end" in capsys.readouterr().out
    changed = {name for name, data in snapshot(run).items() if before.get(name) != data}
    assert not {"config.json", "final/config.json", "final/model.safetensors"} & changed, changed


def test_a_resume_at_the_runs_end_draws_a_plot_a_stop_left_undrawn(tmp_path, tiny_pretrained_run):
    """A signal (or kill -9) between final/ and loss.png leaves a finished run without its plot."""
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    (run / "loss.png").unlink()
    weights = (run / "final" / "model.safetensors").read_bytes()
    assert main(["pretrain", "--out", str(run), "--resume", "--quiet"]) == 0
    assert (run / "loss.png").read_bytes().startswith(b"\x89PNG")
    assert (run / "final" / "model.safetensors").read_bytes() == weights


def test_saved_settings_a_model_cannot_be_read_with_are_named(
    tmp_path, capsys, tiny_pretrained_run, wiki_valid_slice
):
    model = tmp_path / "model"
    shutil.copytree(tiny_pretrained_run / "final", model)
    config = json.loads((model / "config.json").read_text())
    config["data"]["max_seq_length"] = 0
    (model / "config.json").write_text(json.dumps(config))
    argv = ["evaluate", "--model", str(model), "--corpus", str(wiki_valid_slice)]
    err = assert_clean_failure(capsys, argv, f"{model / 'config.json'}: data.max_seq_length must be")
    assert "edited or is damaged" in err


def test_a_given_tokenizer_is_what_the_run_config_records(tmp_path, capsys, wiki_slice, small_tokenizer_dir):
    run = tmp_path / "run"
    argv = ["pretrain", "--corpus", str(wiki_slice), "--tokenizer", str(small_tokenizer_dir),
            "--out", str(run), "--preset", "tiny", "--max-steps", "1", "--quiet"]  # fmt: skip
    assert_clean_failure(capsys, [*argv, "--set", "tokenizer.kind=wordlevel"], "drop one")
    assert not run.exists()
    assert main([*argv, "--set", "data.max_seq_length=32", "--set", "train.batch_size=4"]) == 0
    recorded = json.loads((run / "config.json").read_text())["tokenizer"]
    given = json.loads((small_tokenizer_dir / "bertforge_tokenizer.json").read_text())
    assert recorded["vocab_size"] == 2000 and recorded["kind"] == given["kind"] == "wordpiece"
    assert recorded["lowercase"] is given["lowercase"]


def test_finetune_refuses_settings_that_start_a_pretraining(tmp_path, capsys, tiny_pretrained_run):
    argv = ["finetune", "--model", str(tiny_pretrained_run), "--train", "t.tsv", "--valid", "v.tsv",
            "--out", str(tmp_path / "ft"), "--text-column", "s", "--label-column", "label"]  # fmt: skip
    for setting in ("train.embedding_init=normal", "train.mlm_bias_init=zero"):
        assert_clean_failure(capsys, [*argv, "--set", setting], "the encoder's weights come from --model")


def test_tokenizer_train_names_its_own_flags(tmp_path, capsys, wiki_slice):
    argv = ["tokenizer", "train", "--corpus", str(wiki_slice), "--out", str(tmp_path / "tok")]
    assert_clean_failure(capsys, [*argv, "--vocab-size", "0"], "--vocab-size must be positive")


def test_resume_refuses_text_read_by_another_sentence_splitter(
    tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir, capsys
):
    plain = []
    for source in (wiki_slice, wiki_valid_slice):  # WikiText without its ` = Title = ` lines: plain text
        lines = source.read_text(encoding="utf-8").splitlines()
        plain.append(tmp_path / source.name)
        plain[-1].write_text(
            "\n".join(line for line in lines if not line.strip().startswith("=")), encoding="utf-8"
        )
    run = tmp_path / "run"
    pretrain(tiny_config(*plain, max_steps=2, eval_every=2), run, small_tokenizer_dir, show_progress=False)
    data = json.loads((run / "data.json").read_text(encoding="utf-8"))
    assert data["text_reader"] == READER_VERSION
    del data["text_reader"]  # version 1, where a line break did not end a sentence
    (run / "data.json").write_text(json.dumps(data), encoding="utf-8")
    before = snapshot(run)
    resume = ["pretrain", "--out", str(run), "--resume", "--max-steps", "3", "--quiet"]
    err = assert_clean_failure(capsys, resume, "version 1 of the text reader")
    assert "--allow-changed-data" in err
    assert snapshot(run) == before
    assert main([*resume, "--allow-changed-data"]) == 0
    assert json.loads((run / "data.json").read_text(encoding="utf-8"))["text_reader"] == READER_VERSION
    assert main([*resume[:-3], "--max-steps", "4", "--quiet"]) == 0
    wikitext = tmp_path / "wikitext"  # every format's sentences come from the one reader
    pretrain(tiny_config(wiki_slice, max_steps=2), wikitext, small_tokenizer_dir, show_progress=False)
    data = json.loads((wikitext / "data.json").read_text(encoding="utf-8"))
    (wikitext / "data.json").write_text(json.dumps({**data, "text_reader": 2}), encoding="utf-8")
    argv = ["pretrain", "--out", str(wikitext), "--resume", "--max-steps", "3", "--quiet"]
    assert_clean_failure(capsys, argv, f"version 2 of the text reader, and this is version {READER_VERSION}")


@pytest.mark.slow
def test_resume_refuses_a_tokenizer_other_than_the_runs_own(own_corpus_run, tmp_path, capsys, wiki_slice):
    run = own_corpus_run
    resume = ["pretrain", "--out", str(run), "--resume", "--max-steps", "3", "--quiet"]
    shutil.move(run / "tokenizer", tmp_path / "own")
    train_tokenizer([wiki_slice], TokenizerConfig(vocab_size=500), run / "tokenizer")
    before = snapshot(run)
    assert_clean_failure(capsys, resume, f"{run / 'tokenizer'} is not the tokenizer this run started with")
    data = json.loads((run / "data.json").read_text(encoding="utf-8"))
    del data["tokenizer"]  # as a run from before data.json held it: the model's rows still tell
    (run / "data.json").write_text(json.dumps(data), encoding="utf-8")
    assert_clean_failure(capsys, resume, "the tokenizer has 500 tokens but the model in")
    assert {k: v for k, v in snapshot(run).items() if k != "data.json"} == {
        k: v for k, v in before.items() if k != "data.json"
    }
    shutil.rmtree(run / "tokenizer")
    shutil.move(tmp_path / "own", run / "tokenizer")
    assert main(resume) == 0


def test_data_paths_are_absolute_so_a_run_resumes_from_another_folder(
    tmp_path, monkeypatch, capsys, wiki_slice, small_tokenizer_dir
):
    from test_faults import TINY

    (tmp_path / "data").mkdir()
    shutil.copy(wiki_slice, tmp_path / "data" / "train.txt")
    monkeypatch.chdir(tmp_path)
    argv = ["pretrain", "--corpus", "data/train.txt", "--valid", "data/train.txt", "--out", "run"]
    assert main([*argv, "--tokenizer", str(small_tokenizer_dir), "--max-steps", "1", *TINY]) == 0
    data = json.loads((tmp_path / "run" / "config.json").read_text())["data"]
    assert data["corpus"] == [str(tmp_path / "data" / "train.txt")]
    assert data["valid"] == str(tmp_path / "data" / "train.txt")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["pretrain", "--out", str(tmp_path / "run"), "--resume", "--max-steps", "2", "--quiet"]) == 0
    assert "trained 2 steps" in capsys.readouterr().out


# ------------------------------------------------------------------ item 8: flags a resume cannot honour


def test_resume_refuses_flags_that_would_reshape_the_model(tmp_path, capsys, tiny_pretrained_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    resume = ["pretrain", "--out", str(run), "--resume", "--quiet"]
    assert_clean_failure(capsys, [*resume, "--preset", "mini"], "drop --preset")
    assert_clean_failure(
        capsys, [*resume, "--config", "x.toml", "--tokenizer", "t"], "drop --config, --tokenizer"
    )
    argv = [*resume, "--set", "model.hidden_size=64", "--set", "tokenizer.lowercase=false"]
    err = assert_clean_failure(capsys, argv, "drop --set model.hidden_size, tokenizer.lowercase")
    assert f"--init {run}" in err
    err = assert_clean_failure(
        capsys, [*resume, "--set", "train.layer_decay=0.8"], "drop --set train.layer_decay"
    )
    assert "optimizer groups" in err  # its saved optimizer state has the groups of one rate
    new_run = ["pretrain", "--corpus", "x.txt", "--out", str(tmp_path / "new"), "--allow-changed-data"]
    assert_clean_failure(capsys, new_run, "--allow-changed-data applies to --resume only")
    # a --set that repeats the run's own value changes nothing and is accepted
    assert main([*resume, "--set", "model.hidden_size=32", "--max-steps", "4"]) == 0


# ---------------------------------------------------------------------------- item 8: leftovers


def test_leftovers_in_a_run_folder_are_removed_at_the_next_start(tmp_path, tiny_pretrained_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    (run / ".metrics.jsonl.tmp-k1lled").write_text("half")  # a file write killed mid-way
    (run / "checkpoints" / ".step_000009.tmp-abc_12").mkdir()  # a checkpoint write killed mid-way
    (run / "checkpoints" / ".step_000009.tmp-abc_12" / "model.safetensors").write_bytes(b"partial")
    (run / "checkpoints" / ".step_000001.del-xyz").mkdir()  # a pruning killed mid-way
    final = run / "final"
    aside = run / ".final.old-q9"
    aside.mkdir()
    final.rename(aside / "final")  # a replacement killed between its two renames: the old copy returns
    kept = snapshot(aside / "final")

    with RunFolderLock(run):
        names = {p.name for p in run.rglob("*")}
    assert not [name for name in names if io.LEFTOVER.match(name)], names
    assert snapshot(run / "final") == kept


def test_leftovers_of_a_benchmarks_seeds_are_removed_at_the_next_start(tmp_path):
    run = tmp_path / "glue"  # OUT/task/arm/seed_N/checkpoints/, the deepest layout
    checkpoints = run / "rte" / "scratch" / "seed_1" / "checkpoints"
    (checkpoints / ".step_000038.tmp-abc123").mkdir(parents=True)
    (checkpoints / ".step_000038.tmp-abc123" / "model.safetensors").write_bytes(b"partial")
    with RunFolderLock(run):
        pass
    assert not list(checkpoints.iterdir())


def test_a_folder_holding_only_leftovers_takes_a_new_run(tmp_path, wiki_slice, small_tokenizer_dir):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".config.json.tmp-abcd").write_text("{")  # killed while writing its first file
    config = tiny_config(wiki_slice, max_steps=1, eval_every=1)
    assert pretrain(config, run, tokenizer_dir=small_tokenizer_dir, show_progress=False)["step"] == 1


def test_pruning_renames_a_checkpoint_before_deleting_it(tmp_path, monkeypatch, tiny_pretrained_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    checkpoints = run / "checkpoints"
    newest = list_checkpoints(run)[-1]
    for step in (1, 2):
        shutil.copytree(newest, checkpoints / f"step_{step:06d}")

    def killed_midway(path, ignore_errors=False):  # deletes one file, then the process dies
        next(p for p in Path(path).rglob("*") if p.is_file()).unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(io.shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        prune_checkpoints(run, keep=2, saved_step=3)
    monkeypatch.undo()
    assert [p.name for p in list_checkpoints(run)] == ["step_000002", "step_000003"]
    for path in list_checkpoints(run):  # what keeps a checkpoint's name is whole
        verify_files(path, read_state(path))
    with RunFolderLock(run):
        assert not list(checkpoints.glob(".*"))


def test_pruning_keeps_the_checkpoint_just_written_over_a_later_damaged_one(tmp_path):
    """A resume that went back past damaged checkpoints saves older steps than theirs: those count."""
    run = tmp_path / "run"
    for step in (3, 6, 9):  # 6 and 9: damaged, skipped by the resume from 3
        (run / "checkpoints" / f"step_{step:06d}").mkdir(parents=True)
    (run / "checkpoints" / "step_000004").mkdir()
    prune_checkpoints(run, keep=1, saved_step=4)
    assert [p.name for p in list_checkpoints(run)] == ["step_000004"]
    (run / "checkpoints" / "step_000005").mkdir()
    prune_checkpoints(run, keep=2, saved_step=5)
    assert [p.name for p in list_checkpoints(run)] == ["step_000004", "step_000005"]


def test_orphaned_cache_builds_are_removed_unless_a_live_process_builds_them(tmp_path):
    cache = tmp_path / "cache"
    orphan = cache / "shards" / ".0a1b2c.tmp-x1"
    live = cache / "tokenizers" / ".3d4e5f.tmp-y2"
    for folder in (orphan, live):
        folder.mkdir(parents=True)
        (folder / "tokens.bin").write_bytes(b"partial")
    (cache / "shards" / ".0a1b2c.lock").write_text("12345\n")  # left by the killed builder, unlocked
    with entry_lock(cache / "tokenizers" / "3d4e5f"):  # another build of this entry is under way
        remove_orphans(cache)
        assert not orphan.exists() and live.exists()
    remove_orphans(cache)
    assert not live.exists()
    assert not [p for p in cache.rglob("*") if p.is_file()]


# ---------------------------------------------------------------------------- item 8: a stray label


def write_labels(path: Path, labels: list[str]) -> Path:
    path.write_text("sentence\tlabel\n" + "".join(f"text number {i}\t{y}\n" for i, y in enumerate(labels)))
    return path


def test_a_stray_label_draws_a_warning_that_lists_the_classes(tmp_path):
    path = write_labels(tmp_path / "train.tsv", ["0", "1"] * 150 + ["maybe"])
    with pytest.warns(UserWarning) as caught:
        names = label_names(read_labeled(path, "sentence", "label"))
    assert names == ["0", "1", "maybe"]
    message = str(caught[0].message)
    assert "'maybe' is on under 1% of the 301 rows (first on line 302)" in message
    assert "the classes found are (rows): '0' (150), '1' (150), 'maybe' (1)" in message

    many = write_labels(tmp_path / "many.tsv", [str(i % 200) for i in range(1000)])  # 0.5% each
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(label_names(read_labeled(many, "sentence", "label"))) == 200


def test_the_cli_prints_the_stray_label_warning_as_one_line(tmp_path, tiny_pretrained_run):
    from test_faults import bertforge_process

    train = write_labels(tmp_path / "train.tsv", ["0", "1"] * 150 + ["maybe"])
    valid = write_labels(tmp_path / "valid.tsv", ["0", "1", "perhaps"])
    argv = ["finetune", "--model", str(tiny_pretrained_run), "--train", str(train), "--valid", str(valid)]
    argv += ["--text-column", "sentence", "--label-column", "label", "--out", str(tmp_path / "out")]
    process = bertforge_process(*argv, "--max-length", "32", "--quiet")  # outside pytest's warning capture
    _, err = process.communicate(timeout=120)
    lines = err.decode().splitlines()
    assert process.returncode == 2 and len(lines) == 2, lines
    assert lines[0].startswith(f"bertforge: warning: {train}: 'maybe' is on under 1%")
    assert lines[1].startswith("bertforge: error:") and "'perhaps'" in lines[1]


def test_a_worker_that_opens_the_folder_again_repeats_no_warning(tmp_path, tiny_pretrained_run):
    """The parent showed the stray label's warning; a worker of `--jobs` reads the same file silently."""
    from bertforge.finetune import FinetuneTask, finetuning_config, prepare, worker_job

    train = write_labels(tmp_path / "train.tsv", ["0", "1"] * 150 + ["maybe"])
    valid = write_labels(tmp_path / "valid.tsv", ["0", "1"])
    task = FinetuneTask(str(tiny_pretrained_run), str(train), str(valid), "sentence", "label", seeds=[1, 2])
    config, out = finetuning_config(), tmp_path / "out"
    config.data.max_seq_length = 32
    with pytest.warns(UserWarning, match="'maybe' is on under 1%"):
        prepare(task, config, out, resume=False, show_progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        job = worker_job(task, config, out)
    assert caught == [] and job.labels == ["0", "1", "maybe"]


# --------------------------------------------------------------- item 8: messages that name the cause


def edit_json(path: Path, section: str | None, **changes) -> None:
    raw = json.loads(path.read_text())
    (raw[section] if section else raw).update(changes)
    path.write_text(json.dumps(raw))


def test_messages_name_the_real_cause(tmp_path, capsys, tiny_pretrained_run):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert_clean_failure(
        capsys, ["pretrain", "--out", str(a_file), "--resume"], "is a file; --out must name a folder"
    )
    err = assert_clean_failure(
        capsys, ["fill-mask", "--model", str(a_file), "a [MASK]"], "is a file, not a folder"
    )
    assert "does not exist" not in err

    rows = tmp_path / "rows"
    shutil.copytree(tiny_pretrained_run / "final", rows)
    edit_json(rows / "config.json", "model", vocab_size=2400)
    err = assert_clean_failure(
        capsys,
        ["fill-mask", "--model", str(rows), "a [MASK]"],
        "model.vocab_size is 2400 but the weights have 2000",
    )
    assert "tokenizer" not in err

    hf = tmp_path / "hf"
    assert main(["export", "--model", str(tiny_pretrained_run), "--out", str(hf)]) == 0
    edit_json(hf / "config.json", None, num_hidden_layers=-1)
    argv = ["import-hf", "--from", str(hf), "--out", str(tmp_path / "imported")]
    err = assert_clean_failure(
        capsys, argv, f"{hf / 'config.json'}: model.num_hidden_layers must be positive"
    )
    assert "does not fit" not in err and not (tmp_path / "imported").exists()


def test_train_state_keeps_the_state_json_layout_and_reads_older_checkpoints():
    state = TrainState(
        step=4, epoch=1, batch=3, elapsed_s=2.5, tokens=900, last_valid={"mlm_loss": 7.0}, micro_batch=8
    )
    saved = state.state_dict()
    assert list(saved) == [
        "step", "epoch", "batch", "elapsed_s", "tokens", "last_valid", "valid_step", "micro_batch",
        "world_size", "warmup_end_epoch", "masking_epoch", "masking_rate",
    ]  # fmt: skip
    restored = TrainState()
    restored.load_state_dict(json.loads(json.dumps({**saved, "rng": {}, "sha256": {}})))
    assert restored == state
    older = TrainState(micro_batch=16, world_size=2)  # written before micro_batch and world_size were kept
    older.load_state_dict(
        {"step": 3, "epoch": 0, "batch": 6, "elapsed_s": 1.0, "tokens": 50, "last_valid": {}}
    )
    assert (older.step, older.batch, older.micro_batch, older.world_size) == (3, 6, 16, 2)
    assert older.warmup_end_epoch is None  # a sequence-length warmup, if any, had not ended
    assert older.masking_epoch is None and older.masking_rate is None  # its next epoch sets its rate
    assert older.valid_step is None  # a resume at its end evaluates nothing again
