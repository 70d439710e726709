"""What `--resume` must never do: train a new model over a finished run's final/, load a checkpoint
whose state.json (or any other file) is not what was written, forget settings a resume changed,
touch a folder of another kind, or talk of `--resume` after a Ctrl-C that left nothing to resume."""

from __future__ import annotations

import json
import re
import shutil
import signal
import warnings
from pathlib import Path

import pytest
import torch
from conftest import assert_clean_failure, metrics_lines, tiny_config
from test_faults import cli_pretrain
from test_finetune_cli import finetune_argv, pair_rows, write_csv

from bertforge import pretrain as pretrain_module
from bertforge.checkpoint import list_checkpoints, read_config, read_weights
from bertforge.cli import main
from bertforge.errors import BertforgeError
from bertforge.io import file_sha256
from bertforge.pretrain import pretrain
from bertforge.progress import metrics_text
from bertforge.train import Trainer


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (hidden ones, such as a lock, included) by relative path."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def same_weights(first: Path, second: Path) -> bool:
    a, b = read_weights(first / "model.safetensors"), read_weights(second / "model.safetensors")
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def trained(run: Path) -> list[dict]:
    """The run's "train" lines without their speed, which no two runs share."""
    return [{k: v for k, v in line.items() if k != "tokens_per_s"} for line in metrics_lines(run, "train")]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------- a finished run without its checkpoints


def test_a_finished_run_whose_checkpoints_are_gone_is_not_trained_over(tmp_path, capsys, tiny_pretrained_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    shutil.rmtree(run / "checkpoints")
    before = snapshot(run)
    resume = ["pretrain", "--out", str(run), "--resume", "--max-steps", "20", "--quiet"]
    err = assert_clean_failure(capsys, resume, f"{run} holds a finished run whose checkpoints are gone")
    assert f"--init {run}" in err
    with pytest.raises(BertforgeError, match="would train a new model over final/"):
        pretrain(read_config(run), run, resume=True, show_progress=False)
    assert snapshot(run) == before  # final/, metrics.jsonl and all, byte for byte

    (run / "checkpoints").mkdir()  # an empty checkpoints/ is no checkpoint either
    assert_clean_failure(capsys, resume, "whose checkpoints are gone")


# ---------------------------------------------------------------------- every file of a checkpoint


@pytest.fixture(scope="module")
def six_step_run(tmp_path_factory, wiki_slice, small_tokenizer_dir) -> Path:
    """An uninterrupted run of 6 steps, with checkpoints at steps 2, 4 and 6."""
    run = tmp_path_factory.mktemp("six") / "run"
    config = tiny_config(wiki_slice, max_steps=6, eval_every=6, checkpoint_every=2, keep_checkpoints=3)
    pretrain(config, run, tokenizer_dir=small_tokenizer_dir, show_progress=False)
    return run


def stopped_at_step_4(full: Path, into: Path) -> Path:
    """`full` as it stood after step 4: its checkpoints up to step 4, its metrics up to there."""
    shutil.copytree(full, into)
    shutil.rmtree(into / "final")
    shutil.rmtree(into / "checkpoints" / "step_000006")
    lines = (into / "metrics.jsonl").read_text().splitlines(keepends=True)
    (into / "metrics.jsonl").write_text("".join(line for line in lines if json.loads(line)["step"] <= 4))
    return into


def test_every_file_of_a_checkpoint_is_recorded_in_its_checksums(six_step_run):
    checkpoint = list_checkpoints(six_step_run)[-1]
    recorded = json.loads((checkpoint / "checksums.json").read_text())["sha256"]
    assert set(recorded) == {p.name for p in checkpoint.iterdir()} - {"checksums.json"}
    assert {"state.json", "optimizer.pt", "model.safetensors", "config.json"} <= set(recorded)


@pytest.mark.parametrize(
    "damage",
    ["a digit of state.json", "a byte of optimizer.pt", "checksums.json removed", "checksums.json damaged"],
)
def test_a_damaged_checkpoint_file_is_skipped_for_the_previous_intact_one(tmp_path, six_step_run, damage):
    run = stopped_at_step_4(six_step_run, tmp_path / "run")
    newest = run / "checkpoints" / "step_000004"
    if damage == "a digit of state.json":  # one digit: still valid JSON, and a different data position
        state = (newest / "state.json").read_text()
        position = re.search(r'"batch": (\d+)', state)
        changed = f'"batch": {int(position.group(1)) + 200}'
        (newest / "state.json").write_text(state.replace(position.group(0), changed, 1))
    elif damage == "a byte of optimizer.pt":
        data = bytearray((newest / "optimizer.pt").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (newest / "optimizer.pt").write_bytes(bytes(data))
    elif damage == "checksums.json removed":
        (newest / "checksums.json").unlink()
    else:
        (newest / "checksums.json").write_text('{"sha256": {"model.safetensors": "0"}}')

    with pytest.warns(UserWarning, match=r"step_000004.*resuming from step_000002 instead"):
        result = pretrain(read_config(run), run, resume=True, show_progress=False)
    assert result["step"] == 6
    assert trained(run) == trained(six_step_run)  # steps 3 to 6 trained again, as the first time
    assert same_weights(run / "final", six_step_run / "final")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"step": "two"}, "holds step = 'two', not a whole number from 0"),
        ({"step": -5}, "holds step = -5, not a whole number from 0"),
        ({"micro_batch": 0}, "holds micro_batch = 0, not a whole number from 1"),
        ({"world_size": 0}, "holds world_size = 0, not a whole number from 1"),
        ({"elapsed_s": "x"}, "holds elapsed_s = 'x', not a number of seconds from 0"),
        ({"elapsed_s": -5.0}, "holds elapsed_s = -5.0, not a number of seconds from 0"),
        ({"elapsed_s": float("nan")}, "holds elapsed_s = nan, not a number of seconds from 0"),
        ({"rng": None}, "does not hold a bertforge training state"),
        ({"rng": {"torch_cpu": "xx"}}, "holds a damaged random state"),
    ],
)
def test_a_state_json_of_impossible_values_is_a_damaged_checkpoint_even_with_its_checksum(
    tmp_path, six_step_run, change, message
):
    run = stopped_at_step_4(six_step_run, tmp_path / "run")
    newest = run / "checkpoints" / "step_000004"
    state = json.loads((newest / "state.json").read_text())
    (newest / "state.json").write_text(json.dumps({**state, **change}))
    checksums = json.loads((newest / "checksums.json").read_text())
    checksums["sha256"]["state.json"] = file_sha256(newest / "state.json")  # edited, not damaged in transit
    (newest / "checksums.json").write_text(json.dumps(checksums))
    with pytest.warns(UserWarning, match=rf"{re.escape(message)}.*resuming from step_000002 instead"):
        result = pretrain(read_config(run), run, resume=True, show_progress=False)
    assert result["step"] == 6 and trained(run) == trained(six_step_run)


def test_a_checkpoint_of_the_older_layout_without_checksums_is_read(tmp_path, six_step_run):
    """Its state.json recorded the hashes of the other files, and nothing recorded its own: it is
    checked as far as it can be, and the run continues from it."""
    run = stopped_at_step_4(six_step_run, tmp_path / "run")
    newest = run / "checkpoints" / "step_000004"
    state = json.loads((newest / "state.json").read_text())
    del state["checksums"]
    (newest / "state.json").write_text(json.dumps(state))
    (newest / "checksums.json").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no checkpoint is reported damaged
        pretrain(read_config(run), run, resume=True, show_progress=False)
    assert same_weights(run / "final", six_step_run / "final")


# ------------------------------------------------------------------ settings changed on resume


def sigterm_after_step(monkeypatch, step: int) -> None:
    """SIGTERM to this process as the loop ends step `step`, as `kill` would send it."""
    original = Trainer.optimizer_step

    def step_then_signal(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.state.step == step:
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(Trainer, "optimizer_step", step_then_signal)


def test_settings_changed_on_resume_are_the_runs_from_then_on(
    tmp_path, capsys, monkeypatch, wiki_slice, small_tokenizer_dir
):
    first = tmp_path / "first"
    every_step = ["--set", "train.log_every=1"]  # log windows that an interruption does not cut
    assert main(cli_pretrain(wiki_slice, small_tokenizer_dir, first, "--max-steps", "2", *every_step)) == 0
    run, reference = tmp_path / "run", tmp_path / "reference"
    shutil.copytree(first, run)
    shutil.copytree(first, reference)
    more = ["--resume", "--max-steps", "6", "--seed", "3", "--quiet"]

    with monkeypatch.context() as patch:
        sigterm_after_step(patch, 4)
        assert main(["pretrain", "--out", str(run), *more]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert err.endswith(f"continue with: bertforge pretrain --out {run} --resume\n"), err
    saved = read_config(run)
    assert (saved.train.max_steps, saved.runtime.seed) == (6, 3)  # the run folder's config says so

    assert main(["pretrain", "--out", str(run), "--resume", "--quiet"]) == 0  # the printed command
    assert "trained 6 steps" in capsys.readouterr().out
    assert main(["pretrain", "--out", str(reference), *more]) == 0  # the same resume, uninterrupted
    assert trained(run) == trained(reference)
    assert same_weights(run / "final", reference / "final")


def test_a_resume_lowered_to_a_signals_stop_step_ends_there_with_its_own_figures_and_model(
    tmp_path, capsys, monkeypatch, wiki_slice, wiki_valid_slice, small_tokenizer_dir
):
    """A run finished at step 4, resumed to 8 and stopped by a signal after step 6, then resumed with
    --max-steps 6: step 6 is evaluated (once) and final/ becomes step 6's model, not step 4's."""
    run = tmp_path / "run"
    every = ["--valid", str(wiki_valid_slice), "--set", "train.eval_every=4", "--set", "train.log_every=1"]
    assert main(cli_pretrain(wiki_slice, small_tokenizer_dir, run, "--max-steps", "4", *every)) == 0
    with monkeypatch.context() as patch:
        sigterm_after_step(patch, 6)
        assert main(["pretrain", "--out", str(run), "--resume", "--max-steps", "8", "--quiet"]) == 128 + 15
    capsys.readouterr()

    def held_out_line() -> str:
        assert main(["pretrain", "--out", str(run), "--resume", "--max-steps", "6", "--quiet"]) == 0
        return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("held-out"))

    printed = held_out_line()
    valid = metrics_lines(run, "valid")
    assert [line["step"] for line in valid] == [0, 4, 6]
    assert same_weights(run / "final", run / "checkpoints" / "step_000006")
    assert (
        main(
            [
                "evaluate",
                "--model",
                str(run / "final"),
                "--corpus",
                str(wiki_valid_slice),
                "--json",
                "--quiet",
            ]
        )
        == 0
    )
    figures = json.loads(capsys.readouterr().out)
    assert figures["mlm_loss"] == pytest.approx(valid[-1]["mlm_loss"], rel=1e-5)
    assert valid[-1]["mlm_loss"] != valid[-2]["mlm_loss"]
    shown = {k: v for k, v in valid[-1].items() if k not in ("step", "split", "tokens", "unigram_entropy")}
    assert printed == "held-out: " + metrics_text(shown)
    written = (run / "final" / "model.safetensors").stat().st_mtime_ns
    assert held_out_line() == printed and metrics_lines(run, "valid") == valid  # at its end: nothing again
    assert (run / "final" / "model.safetensors").stat().st_mtime_ns == written


def test_a_refused_change_on_resume_leaves_the_runs_config_as_it_was(tmp_path, capsys, tiny_pretrained_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    before = (run / "config.json").read_bytes()
    argv = ["pretrain", "--out", str(run), "--resume", "--max-steps", "6", "--quiet"]
    argv += ["--set", "train.gradient_accumulation_steps=2"]  # micro-batches of 4 where the run has 8
    assert_clean_failure(capsys, argv, "micro-batches of 8 sequences")
    assert (run / "config.json").read_bytes() == before


def test_a_resume_with_another_batch_size_names_it_and_the_way_back(tmp_path, capsys, tiny_pretrained_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)  # batches of 8 sequences, one micro-batch each
    argv = ["pretrain", "--out", str(run), "--resume", "--max-steps", "6", "--batch-size", "16", "--quiet"]
    message = (
        "was trained with micro-batches of 8 sequences, and train.batch_size = 16 with "
        "train.gradient_accumulation_steps = 1 makes them 16: resume with the run's batch settings (drop "
        "--batch-size and --set train.gradient_accumulation_steps), or with "
        "train.gradient_accumulation_steps=2"
    )
    assert_clean_failure(capsys, argv, message)


def test_a_resume_to_fewer_steps_than_the_run_has_taken_is_refused(tmp_path, capsys, tiny_pretrained_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)  # 3 steps taken
    before = snapshot(run)
    argv = ["pretrain", "--out", str(run), "--resume", "--max-steps", "2", "--quiet"]
    assert_clean_failure(capsys, argv, "is at step 3, past train.max_steps = 2")
    assert snapshot(run) == before


# ------------------------------------------------------------------- folders of another kind


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, tiny_pretrained_run) -> Path:
    folder = tmp_path_factory.mktemp("finetuned")
    train = write_csv(folder / "train.csv", pair_rows(48, 0))
    valid = write_csv(folder / "valid.csv", pair_rows(16, 1))
    assert main(finetune_argv(tiny_pretrained_run, train, valid, folder / "run", "--epochs", "1")) == 0
    return folder / "run"


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_pretrained_run) -> Path:
    out = tmp_path_factory.mktemp("exported") / "hf"
    assert main(["export", "--model", str(tiny_pretrained_run), "--out", str(out)]) == 0
    return out


def kinds(tiny_pretrained_run: Path, finetuned: Path, exported: Path, tmp_path: Path) -> dict[str, tuple]:
    """Each kind of folder that is not a pretraining run: (folder, words that must name it)."""
    glue = tmp_path / "glue"
    glue.mkdir()
    (glue / "glue_task.json").write_text("{}")
    shutil.copytree(finetuned, glue / "RTE" / "scratch" / "seed_1")  # a task of it: a fine-tuning run
    shutil.move(glue / "RTE" / "scratch" / "seed_1" / "finetune.json", glue / "RTE" / "finetune.json")
    of_glue = f"of the GLUE benchmark in {glue}"
    seeds = tmp_path / "seeds"
    shutil.copytree(finetuned, seeds / "seed_1")
    shutil.move(seeds / "seed_1" / "finetune.json", seeds / "finetune.json")
    compared = tmp_path / "compared"  # --compare-scratch: RUN/pretrained/seed_N and RUN/scratch/seed_N
    shutil.copytree(finetuned, compared / "scratch" / "seed_2")
    shutil.move(compared / "scratch" / "seed_2" / "finetune.json", compared / "finetune.json")
    return {
        "fine-tuning run": (finetuned, "holds a fine-tuning run (it has finetune.json)"),
        "its seed": (seeds / "seed_1", f"holds one seed of the fine-tuning run in {seeds}"),
        "an arm's seed": (compared / "scratch" / "seed_2", f"one seed of the fine-tuning run in {compared}"),
        "an arm": (compared / "scratch", f"holds one arm of the fine-tuning run in {compared}"),
        "a GLUE task": (glue / "RTE", f"holds the RTE task {of_glue}"),
        "a GLUE task's arm": (glue / "RTE" / "scratch", f"holds one arm of the RTE task {of_glue}"),
        "a GLUE task's seed": (glue / "RTE" / "scratch" / "seed_1", f"one seed of the RTE task {of_glue}"),
        "classifier": (finetuned / "final", "holds a fine-tuned classifier (it has labels.json)"),
        "GLUE benchmark": (glue, "holds a GLUE benchmark (it has glue_task.json)"),
        "Hugging Face": (exported, "holds a Hugging Face model (its config.json has a model_type)"),
        "model folder": (tiny_pretrained_run / "final", "holds a model folder (it has model.safetensors"),
        "checkpoint": (list_checkpoints(tiny_pretrained_run)[-1], "holds a training checkpoint of the"),
    }


def test_pretrain_resume_refuses_a_folder_of_another_kind_before_touching_it(
    tmp_path, capsys, tiny_pretrained_run, finetuned, exported
):
    for name, (folder, words) in kinds(tiny_pretrained_run, finetuned, exported, tmp_path).items():
        before = snapshot(folder)
        err = assert_clean_failure(capsys, ["pretrain", "--out", str(folder), "--resume", "--quiet"], words)
        assert "not a pretraining run to resume" in err, name
        assert snapshot(folder) == before, name  # not even a lock file
        with pytest.raises(BertforgeError, match="not a pretraining run"):
            pretrain(tiny_config(), folder, resume=True, show_progress=False)
        assert snapshot(folder) == before, name
    err = assert_clean_failure(capsys, ["pretrain", "--out", str(finetuned), "--resume"], "fine-tuning run")
    assert err.rstrip().endswith(f"continue it with: bertforge finetune --out {finetuned} --resume")
    again = tmp_path / "again"
    again.mkdir()
    found = kinds(tiny_pretrained_run, finetuned, exported, again)
    for name in ("its seed", "an arm's seed", "an arm"):  # finetune --resume points from a part to its run
        part, words = found[name]
        err = assert_clean_failure(capsys, ["finetune", "--out", str(part), "--resume"], words)
        run = part.parent.parent if name == "an arm's seed" else part.parent
        assert err.rstrip().endswith(f"continue it with: bertforge finetune --out {run} --resume")
    benchmark = again / "glue"
    for name in ("a GLUE task", "a GLUE task's arm", "a GLUE task's seed"):  # the benchmark continues them
        part, words = found[name]
        for command in ("finetune", "glue"):
            err = assert_clean_failure(capsys, [command, "--out", str(part), "--resume"], words)
            assert err.rstrip().endswith(f"continue it with: bertforge glue --out {benchmark} --resume")


def test_finetune_and_glue_resume_refuse_a_pretraining_run_and_leave_it_alone(
    tmp_path, capsys, tiny_pretrained_run
):
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    before = snapshot(run)
    continues = f"continue it with: bertforge pretrain --out {run} --resume"
    err = assert_clean_failure(capsys, ["finetune", "--out", str(run), "--resume"], "not a fine-tuning run")
    assert "holds a pretraining run" in err and continues in err
    err = assert_clean_failure(capsys, ["glue", "--out", str(run), "--resume"], "not a GLUE benchmark")
    assert "holds a pretraining run" in err and continues in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_clean_failure(capsys, ["glue", "--out", str(empty), "--resume"], "no glue benchmark to resume")
    assert snapshot(run) == before


def test_a_new_run_into_a_folder_of_another_kind_names_it_and_asks_for_a_new_out(
    tmp_path, capsys, tiny_pretrained_run, finetuned, wiki_slice
):
    """Not `--resume`, which would then refuse the folder as another kind of run."""
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    before = [snapshot(run), snapshot(finetuned)]
    argv = ["pretrain", "--corpus", str(wiki_slice), "--out", str(finetuned), "--quiet"]
    err = assert_clean_failure(capsys, argv, "holds a fine-tuning run (it has finetune.json); choose a new")
    assert "--resume" not in err
    train, valid = finetuned.parent / "train.csv", finetuned.parent / "valid.csv"
    err = assert_clean_failure(
        capsys, finetune_argv(run, train, valid, run), "holds a pretraining run; choose"
    )
    assert "--resume" not in err
    assert [snapshot(run), snapshot(finetuned)] == before


# ------------------------------------------------------------------ Ctrl-C with nothing to resume


def ctrl_c(*_args, **_kwargs):
    raise KeyboardInterrupt  # what Python's SIGINT handler raises


def test_ctrl_c_before_the_run_folder_exists_says_to_run_the_command_again(
    tmp_path, capsys, monkeypatch, wiki_slice
):
    run = tmp_path / "run"
    monkeypatch.setattr(pretrain_module, "cached_tokenizer", ctrl_c)  # while the tokenizer is trained
    argv = ["pretrain", "--corpus", str(wiki_slice), "--out", str(run), "--quiet"]
    assert main(argv) == 130
    err = one_error_line(capsys)
    assert err == (
        f"bertforge: stopped by SIGINT before the run in {run} started; nothing of it was kept: run the "
        "same command again (the tokenizer and shards that were complete are reused from the cache)\n"
    )
    assert not run.exists()


def test_sigterm_while_the_cache_writes_shards_removes_them_and_says_to_run_the_command_again(
    tmp_path, capsys, monkeypatch, wiki_slice, small_tokenizer_dir
):
    """SIGTERM before the loop unwinds as Ctrl-C does (its default action left the cache's temporary)."""
    from bertforge import shards

    add = shards._ShardWriter.add

    def terminated_midway(self, *args):
        add(self, *args)
        signal.raise_signal(signal.SIGTERM)  # what a scheduler sends, half the shards written

    monkeypatch.setattr(shards._ShardWriter, "add", terminated_midway)
    run, cache = tmp_path / "run", tmp_path / "cache"
    argv = [
        "pretrain",
        "--corpus",
        str(wiki_slice),
        "--out",
        str(run),
        "--tokenizer",
        str(small_tokenizer_dir),
    ]
    before = signal.getsignal(signal.SIGTERM)
    assert main([*argv, "--cache-dir", str(cache), "--quiet"]) == 128 + signal.SIGTERM
    assert one_error_line(capsys) == (
        f"bertforge: stopped by SIGTERM before the run in {run} started; nothing of it was kept: run the "
        "same command again (the tokenizer and shards that were complete are reused from the cache)\n"
    )
    assert not run.exists() and not list((cache / "shards").iterdir())  # no temporary left
    assert signal.getsignal(signal.SIGTERM) is before


def test_ctrl_c_while_a_resumed_run_prepares_names_its_last_checkpoint(
    tmp_path, capsys, monkeypatch, tiny_pretrained_run
):
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    before = snapshot(run)
    monkeypatch.setattr(pretrain_module, "cached_shards", ctrl_c)  # while the shards are read
    assert main(["pretrain", "--out", str(run), "--resume", "--max-steps", "6", "--quiet"]) == 130
    assert one_error_line(capsys) == (
        "bertforge: stopped by SIGINT; continue the run from its last checkpoint (step_000003) with: "
        f"bertforge pretrain --out {run} --resume\n"
    )
    assert snapshot(run) == before


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", ["tokenizer", "prepare"])
def test_ctrl_c_in_tokenizer_train_or_prepare_says_nothing_was_kept(
    tmp_path, capsys, monkeypatch, wiki_slice, small_tokenizer_dir, command, signum
):
    from bertforge import shards, tokenizer
    from bertforge.signals import Terminated

    def stopped(*_args, **_kwargs):
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated  # what each signal raises

    out = tmp_path / "out"
    if command == "tokenizer":
        monkeypatch.setattr(tokenizer, "train_tokenizer", stopped)
        argv = ["tokenizer", "train", "--corpus", str(wiki_slice), "--out", str(out)]
    else:
        monkeypatch.setattr(shards, "prepare_shards", stopped)
        argv = ["prepare", "--corpus", str(wiki_slice), "--tokenizer", str(small_tokenizer_dir)]
        argv += ["--out", str(out)]
    assert main(argv) == 128 + signum
    err = one_error_line(capsys)
    assert "--resume" not in err
    assert err == (
        f"bertforge: stopped by {signal.Signals(signum).name} before {out} was complete; nothing of it was "
        "kept: run the same command again\n"
    )
