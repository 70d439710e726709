"""Multi-process training (DDP, gloo on CPU): the same curve as one process, and resume under DDP."""

from __future__ import annotations

import json
import shutil
import socket

import pytest
import torch
import torch.multiprocessing as mp
from conftest import metrics_lines, tiny_config

from bertforge.checkpoint import list_checkpoints, read_config
from bertforge.config import TrainConfig, apply_objective
from bertforge.distributed import batch_plan
from bertforge.errors import BertforgeError
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


@pytest.mark.slow
def test_torchrun_command_line(tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir):
    """`torchrun --nproc_per_node=2 -m bertforge pretrain` end to end: one report, one run folder."""
    import sys

    from test_interrupts import started  # kills the workers too, should the run fail

    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"),
        *("-m", "bertforge", "pretrain", "--preset", "tiny", "--batch-size", "8", "--max-steps", "4"),
        *("--corpus", wiki_slice, "--valid", wiki_valid_slice, "--tokenizer", small_tokenizer_dir),
        *("--device", "cpu", "--quiet", "--out", tmp_path / "run"),
        *("--set", "data.eval_max_pairs=64", "--set", "runtime.threads=1", "--set", "train.log_every=1"),
    ]
    log = tmp_path / "torchrun.log"
    with started(command, log) as process:
        assert process.wait(timeout=300) == 0, log.read_text()[-3000:]
    assert log.read_text().count("trained 4 steps") == 1  # rank 0 reports, the other rank is silent
    assert [x["step"] for x in metrics_lines(tmp_path / "run", "train")] == [1, 2, 3, 4]
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
