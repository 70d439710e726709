"""Multi-process training (DDP, gloo on CPU): the same curve as one process, and resume under DDP."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp
from conftest import metrics_lines, tiny_config

from bertforge import distributed
from bertforge.checkpoint import list_checkpoints, read_config
from bertforge.config import TrainConfig, apply_objective
from bertforge.distributed import batch_plan
from bertforge.errors import BertforgeError
from bertforge.heartbeat import SILENCE_LIMIT_S, Heartbeat
from bertforge.pretrain import pretrain

WORLD_SIZE = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_config(corpus, valid, dropout: float, objective: str = "mlm"):
    # 4 micro-batches of 2 per step: one process accumulates 4, each of two ranks accumulates 2.
    config = tiny_config(corpus, valid, max_steps=6, eval_every=3, keep_checkpoints=3)
    apply_objective(config, objective)
    config.model.intermediate_size = 4 * config.model.hidden_size  # OpenAIGPT's fixed feed-forward width
    config.train.gradient_accumulation_steps = 4
    config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = dropout
    config.runtime.threads = 1  # two processes share the CI machine's two cores
    config.runtime.device = "cpu"
    return config


def rank_main(rank, port, corpus, valid, tokenizer_dir, cache_dir, out):
    """One rank, as torchrun would start it: the environment, then ordinary library calls."""
    import os

    import torch.distributed as dist

    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD_SIZE),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    options = {"tokenizer_dir": tokenizer_dir, "cache_dir": cache_dir, "show_progress": False}
    # Without dropout the two-process run must follow the one-process curve.
    pretrain(run_config(corpus, valid, 0.0), out / "ddp", **options)
    # With dropout, a DDP run resumed from its step-3 checkpoint must reproduce itself.
    full, cut = out / "ddp_dropout", out / "ddp_dropout_cut"
    pretrain(run_config(corpus, valid, 0.1), full, **options)
    if rank == 0:
        shutil.copytree(full, cut)
        shutil.rmtree(cut / "checkpoints" / "step_000006")
        shutil.rmtree(cut / "final")
    dist.barrier()
    pretrain(read_config(cut), cut, resume=True, cache_dir=cache_dir, show_progress=False)
    pretrain(run_config(corpus, valid, 0.0, "clm"), out / "ddp_clm", **options)  # GPT-1 through the same loop


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory, wiki_slice, wiki_valid_slice, small_tokenizer_dir):
    out = tmp_path_factory.mktemp("ddp")
    cache_dir = tmp_path_factory.getbasetemp() / "cache"  # the tests' private cache, filled here
    config = run_config(wiki_slice, wiki_valid_slice, 0.0)
    options = {"tokenizer_dir": small_tokenizer_dir, "cache_dir": cache_dir, "show_progress": False}
    pretrain(config, out / "single", **options)
    pretrain(run_config(wiki_slice, wiki_valid_slice, 0.0, "clm"), out / "single_clm", **options)
    args = (free_port(), wiki_slice, wiki_valid_slice, small_tokenizer_dir, cache_dir, out)
    mp.spawn(rank_main, args=args, nprocs=WORLD_SIZE, join=True)
    return out


@pytest.mark.slow
def test_two_processes_follow_the_one_process_loss_curve(ddp_runs):
    single, ddp = metrics_lines(ddp_runs / "single", "train"), metrics_lines(ddp_runs / "ddp", "train")
    assert [x["step"] for x in ddp] == [x["step"] for x in single] == list(range(1, 7))  # rank 0 logs, once
    for a, b in zip(single, ddp, strict=True):
        for key in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
    single_valid, ddp_valid = (
        metrics_lines(ddp_runs / "single", "valid"),
        metrics_lines(ddp_runs / "ddp", "valid"),
    )
    assert [x["step"] for x in ddp_valid] == [0, 3, 6]
    assert ddp_valid[-1]["mlm_loss"] == pytest.approx(single_valid[-1]["mlm_loss"], rel=1e-4)


@pytest.mark.slow
def test_two_processes_follow_the_one_process_gpt_curve(ddp_runs):
    single, ddp = (
        metrics_lines(ddp_runs / "single_clm", "train"),
        metrics_lines(ddp_runs / "ddp_clm", "train"),
    )
    assert [x["step"] for x in ddp] == [x["step"] for x in single] == list(range(1, 7))
    for a, b in zip(single, ddp, strict=True):
        for key in ("loss", "clm_loss", "clm_accuracy"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
    single_valid = metrics_lines(ddp_runs / "single_clm", "valid")[-1]
    assert metrics_lines(ddp_runs / "ddp_clm", "valid")[-1]["clm_loss"] == pytest.approx(
        single_valid["clm_loss"], rel=1e-4
    )


def test_only_rank_zero_writes_the_run_folder(ddp_runs):
    run = ddp_runs / "ddp"
    assert [p.name for p in list_checkpoints(run)] == ["step_000003", "step_000006"]
    assert (run / "final" / "model.safetensors").is_file() and (run / "loss.png").is_file()
    state = json.loads((run / "checkpoints" / "step_000006" / "state.json").read_text())
    assert state["world_size"] == WORLD_SIZE and state["micro_batch"] == 2
    assert len(state["rank_rng"]) == WORLD_SIZE
    assert (
        state["tokens"]
        == json.loads((ddp_runs / "single" / "checkpoints" / "step_000006" / "state.json").read_text())[
            "tokens"
        ]
    )  # token counts summed over ranks


def test_resume_under_ddp_reproduces_the_uninterrupted_run(ddp_runs):
    full, cut = ddp_runs / "ddp_dropout", ddp_runs / "ddp_dropout_cut"
    full_train, cut_train = metrics_lines(full, "train"), metrics_lines(cut, "train")
    assert [x["step"] for x in cut_train] == list(range(1, 7))
    for a, b in zip(full_train, cut_train, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6), a["step"]
    full_valid, cut_valid = metrics_lines(full, "valid")[-1], metrics_lines(cut, "valid")[-1]
    assert full_valid["mlm_loss"] == pytest.approx(cut_valid["mlm_loss"], rel=1e-6)


def test_batch_plan_keeps_the_global_batch():
    plan = batch_plan(TrainConfig(batch_size=32), 1)
    assert (plan.micro_batch, plan.accumulation) == (32, 1)
    plan = batch_plan(TrainConfig(batch_size=32, gradient_accumulation_steps=4), 2)
    assert (plan.micro_batch, plan.accumulation) == (8, 2)  # the one-process micro-batch, half the steps
    plan = batch_plan(TrainConfig(batch_size=32), 4)
    assert (plan.micro_batch, plan.accumulation) == (8, 1)  # smaller micro-batches when accumulation is 1
    with pytest.raises(BertforgeError, match="multiple of 4"):
        batch_plan(TrainConfig(batch_size=30), 4)


def test_the_loop_without_torchrun_is_one_process(monkeypatch):
    from bertforge.distributed import launched

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert launched().world_size == 1 and launched().is_main
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(BertforgeError, match="torchrun"):
        launched()
    assert torch.distributed.is_available()


def test_ddp_keeps_the_gradients_in_its_buckets(monkeypatch):
    built = {}

    class Recorder:
        def __init__(self, module, **options):
            built.update(options)

    monkeypatch.setattr(distributed, "DistributedDataParallel", Recorder)
    distributed.wrap(torch.nn.Linear(2, 2), torch.device("cpu"), distributed.World(0, 2, 0))
    assert built == {"device_ids": None, "gradient_as_bucket_view": True}


class CountingStore:
    """The part of torch's `Store` the heartbeat uses: `add` returns the new count."""

    def __init__(self):
        self.counts: dict[str, int] = {}

    def add(self, key: str, amount: int) -> int:
        self.counts[key] = self.counts.get(key, 0) + amount
        return self.counts[key]


def test_the_heartbeat_names_a_process_that_fell_silent():
    store, now = CountingStore(), [0.0]
    watch = Heartbeat(store, rank=0, world_size=3, on_lost=print, clock=lambda: now[0])
    others = [Heartbeat(store, rank, 3, on_lost=print, clock=lambda: now[0]) for rank in (1, 2)]
    for second in range(0, 400, 5):
        now[0] = float(second)
        others[0].beat()  # rank 1 beats throughout; rank 2 falls silent after 60 s
        if second <= 60:
            others[1].beat()
        silent = watch.beat()
        if second <= 60 + SILENCE_LIMIT_S:
            assert silent == [], second
        else:
            assert silent == [2], second
    others[1].stop(finished=True)  # a process that did its work is silent without being lost
    assert watch.beat() == []


def heartbeat_rank(rank: int, port: int, finish_early: bool, host_ends: bool = False) -> subprocess.Popen:
    """A process of a two-process group (gloo) with a fast heartbeat. Rank 1 then either stops
    answering (SIGSTOP: alive, its connections open) while rank 0 waits in a barrier, or finishes
    its part and leaves while rank 0 works on alone for longer than the silence limit; with
    `host_ends`, rank 0 (the store's host) is killed while rank 1 works outside any collective."""
    script = f"""
import bertforge.cli  # first, as in the program: it sets torch's C++ log level before torch loads
import os, signal, time, torch
from bertforge import distributed, heartbeat
heartbeat.HEARTBEAT_S, heartbeat.SILENCE_LIMIT_S = 0.2, 2.0
rank = distributed.launched().rank
with distributed.lost_processes_reported("continue with: bertforge pretrain --out run --resume"):
    distributed.setup(torch.device("cpu"))
    distributed.barrier()
    if {host_ends}:
        os.kill(os.getpid(), signal.SIGKILL) if rank == 0 else time.sleep(30)
    elif {finish_early} and rank == 0:
        time.sleep(6)
    elif not {finish_early}:
        if rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        distributed.barrier()
distributed.leave()
"""
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return subprocess.Popen(
        [sys.executable, "-c", script], env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def outcome(ranks: list[subprocess.Popen], watched: int, timeout: float) -> tuple[int, str]:
    """The exit status and stderr of rank `watched`; then every rank is ended."""
    try:
        return ranks[watched].wait(timeout=timeout), ranks[watched].stderr.read()
    finally:
        for process in ranks:
            process.kill()
            process.wait()


def test_a_whole_run_suspended_longer_than_the_silence_limit_is_no_loss():
    """Every process stopped for 130 s (a scheduler's suspend, SIGSTOP to all): the first to wake
    must not take the others for lost before they beat; one that then stays silent still is."""
    store, now = CountingStore(), [0.0]
    watch, other = (Heartbeat(store, rank, 2, on_lost=print, clock=lambda: now[0]) for rank in (0, 1))
    for second in (5, 10, 15):
        now[0] = float(second)
        other.beat()
        assert watch.beat() == []
    now[0] += 130.0  # all stopped, then continued: rank 0's thread runs first
    assert watch.beat() == []
    for _ in range(int(SILENCE_LIMIT_S // 5)):  # rank 1 never beats again
        now[0] += 5.0
        assert watch.beat() == []
    now[0] += 5.0
    assert watch.beat() == [1]


@pytest.mark.parametrize("finish_early", [False, True])
@pytest.mark.slow
def test_a_silent_process_stops_the_others_with_one_line(finish_early):
    port = free_port()
    status, err = outcome([heartbeat_rank(rank, port, finish_early) for rank in (0, 1)], 0, timeout=120)
    if finish_early:  # rank 1 left as finished: its silence is no loss
        assert status == 0 and "error" not in err, err
    else:
        assert status == 2, err
        assert err.strip().splitlines() == [
            "bertforge: error: rank 1 of 2 gave no sign of life for 2 s; this process (rank 0) stops too; "
            "continue with: bertforge pretrain --out run --resume"
        ]


@pytest.mark.slow
def test_the_heartbeat_names_the_store_host_whose_process_ended():
    """Only the heartbeat can notice here (rank 1 is in no collective): it loses the store with
    rank 0 and names that rank, as a failed collective would."""
    port = free_port()
    ranks = [heartbeat_rank(rank, port, finish_early=False, host_ends=True) for rank in (0, 1)]
    status, err = outcome(ranks, 1, timeout=60)
    assert status == 2, err
    assert err.strip().splitlines() == [  # and no C++ warning of torch's about the lost store
        f"bertforge: error: lost rank 0 (process {ranks[0].pid}) of 2: it ended mid-run, so this process "
        "(rank 1) stops too; continue with: bertforge pretrain --out run --resume"
    ]


@pytest.mark.parametrize("failure", ["lost", "bug"])
def test_a_run_that_loses_a_process_before_its_first_checkpoint_keeps_its_folder_for_resume(
    tmp_path, monkeypatch, wiki_slice, small_tokenizer_dir, failure
):
    """The lost-process line says `--resume`, which restarts a run without checkpoints in its folder;
    any other failure before the first checkpoint leaves no half-made run."""
    lost = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")

    def fails(*args, **kwargs):
        raise lost if failure == "lost" else RuntimeError("a bug")

    monkeypatch.setattr("bertforge.pretrain.train_and_save", fails)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError):
        pretrain(tiny_config(wiki_slice, max_steps=2), run, small_tokenizer_dir, show_progress=False)
    assert run.is_dir() == (failure == "lost")
