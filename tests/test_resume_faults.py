"""What `--resume` must never do: load a checkpoint whose state.json (or any other file) is not
what was written."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from conftest import metrics_lines, tiny_config

from bertforge.checkpoint import list_checkpoints, read_config, read_weights
from bertforge.pretrain import pretrain


def same_weights(first: Path, second: Path) -> bool:
    a, b = read_weights(first / "model.safetensors"), read_weights(second / "model.safetensors")
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def trained(run: Path) -> list[dict]:
    """The run's "train" lines without their speed, which no two runs share."""
    return [{k: v for k, v in line.items() if k != "tokens_per_s"} for line in metrics_lines(run, "train")]


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
