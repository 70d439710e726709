"""The input pipeline (`bertforge.loader`): DataLoader workers that outlive the epoch, the next
epoch's pairs built ahead, and exact resume through both."""

from __future__ import annotations

import os
import shutil
import threading

import pytest
import torch
from conftest import metrics_lines, tiny_config

from bertforge import loader
from bertforge.checkpoint import read_config
from bertforge.pretrain import pretrain

forked = pytest.mark.skipif(loader.start_method() != "fork", reason="workers persist where they are forked")


class Numbered(torch.utils.data.Dataset):
    """Five micro-batches per epoch, each naming its epoch, position and the process that made it."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return 5

    def __getitem__(self, index: int) -> dict:
        return {"at": torch.tensor([self.epoch, index]), "pid": torch.tensor(os.getpid())}


def stream(epoch: int, index: int, workers: int, count: int, rank: int = 0, world_size: int = 1) -> list:
    source = loader.EpochBatches({"batches": Numbered})
    batches = loader.micro_batches(
        source, lambda e: ("batches", e), epoch, index, workers, False, rank, world_size
    )
    taken = [next(batches) for _ in range(count)]
    batches.close()
    return [(e, i, batch["at"].tolist(), int(batch["pid"])) for e, i, batch in taken]


@forked
def test_persistent_workers_survive_the_epoch_boundary():
    main = stream(0, 0, workers=0, count=15)
    assert [at for _, _, at, _ in main] == [[e, b] for e in range(3) for b in range(5)]
    assert [(e, i) for e, i, _, _ in main] == [(e, b + 1) for e in range(3) for b in range(5)]
    workers = stream(0, 0, workers=2, count=15)
    assert [row[:3] for row in workers] == [row[:3] for row in main]  # the same batches, in order
    pids = [{pid for e, _, _, pid in workers if e == epoch} for epoch in range(3)]
    assert len(pids[0]) == 2 and os.getpid() not in pids[0]
    assert pids[0] == pids[1] == pids[2]  # the same two processes served every epoch
    resumed = stream(1, 3, workers=2, count=7)  # from the middle of epoch 1
    assert [row[:3] for row in resumed] == [row[:3] for row in main[8:]]
    ranked = stream(0, 0, workers=2, count=4, rank=1, world_size=2)  # rank 1 of 2: b = 1, 3 of 4 usable
    assert [row[2] for row in ranked] == [[0, 1], [0, 3], [1, 1], [1, 3]]


@forked
def test_the_workers_stop_with_the_stream():
    source = loader.EpochBatches({"batches": Numbered})
    batches = loader.micro_batches(source, lambda e: ("batches", e), 0, 0, 2, False)
    pids = {int(next(batches)[2]["pid"]) for _ in range(6)}
    batches.close()
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, 0)  # already reaped: the workers are gone


def test_the_next_epoch_is_built_ahead_in_the_background():
    built = []

    def build(epoch: int) -> list:
        built.append((epoch, threading.current_thread().name))
        if epoch == 3:
            raise ValueError("no epoch 3")
        return [epoch] * 3

    ahead = loader.Ahead(build)
    assert ahead(0) == [0, 0, 0]
    ahead.settle()
    assert sorted(built) == [(0, threading.current_thread().name), (1, "bertforge-epoch-1")]
    assert ahead(1) == [1, 1, 1] and ahead(1) == [1, 1, 1]  # taken from the background, kept
    ahead.settle()
    assert sorted(epoch for epoch, _ in built) == [0, 1, 2]
    assert ahead(2) == [2, 2, 2]
    with pytest.raises(ValueError, match="no epoch 3"):  # raised where the epoch is asked for
        ahead(3)


@pytest.mark.slow
@forked
def test_a_run_with_persistent_workers_resumes_exactly_across_epochs(
    tmp_path, short_corpus, small_tokenizer_dir
):
    runs = {}
    for workers in (0, 2):
        config = tiny_config(short_corpus, max_steps=12, eval_every=5, keep_checkpoints=3, batch_size=16)
        config.data.max_seq_length = 32  # epochs of 3 or 4 steps
        config.data.mlm_probability, config.data.final_mlm_probability = 0.3, 0.15  # a rate per epoch
        config.runtime.num_workers = workers
        runs[workers] = tmp_path / f"workers{workers}"
        pretrain(config, runs[workers], tokenizer_dir=small_tokenizer_dir, show_progress=False)
    logged = metrics_lines(runs[2], "train")
    assert len({line["mlm_probability"] for line in logged}) >= 3  # several epochs
    assert [x["loss"] for x in logged] == [x["loss"] for x in metrics_lines(runs[0], "train")]
    cut = tmp_path / "cut"
    shutil.copytree(runs[2], cut)
    for later in ("step_000010", "step_000012"):
        shutil.rmtree(cut / "checkpoints" / later)
    shutil.rmtree(cut / "final")
    pretrain(read_config(cut), cut, resume=True, show_progress=False)
    assert [x["loss"] for x in metrics_lines(cut, "train")] == [x["loss"] for x in logged]
