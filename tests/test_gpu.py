"""The GPU paths on a real GPU when one is visible (bf16, fp16 with its scaler, compile, resume,
fine-tuning, inference, no host syncs in the step, nccl with two GPUs).

The logic behind them is also tested on CPU, with CUDA mocked, in `test_gpu_paths.py`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import warnings

import pytest
import torch
from conftest import metrics_lines, tiny_config

from bertforge import train
from bertforge.checkpoint import read_config
from bertforge.pretrain import pretrain

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA GPU visible: bf16, fp16 and --compile on GPU are tested only on a machine with one",
)
needs_two_gpus = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="fewer than two CUDA GPUs visible: nccl is tested with two"
)


def no_dropout(config):
    config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = 0.0
    return config


@needs_gpu
@pytest.mark.parametrize(("precision", "compile"), [("bf16", False), ("fp16", False), ("bf16", True)])
def test_pretraining_on_gpu(tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir, precision, compile):
    config = tiny_config(wiki_slice, wiki_valid_slice, max_steps=60, eval_every=30, batch_size=16)
    config.train.learning_rate = 3e-3
    config.train.mlm_bias_init = "zero"  # from ln(V): the frequencies are there to learn in 60 steps
    config.runtime.device, config.runtime.precision, config.runtime.compile = "cuda", precision, compile
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="torch.compile failed")  # on GPU it must really compile
        pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    valid = metrics_lines(tmp_path / "run", "valid")
    assert valid[-1]["mlm_loss"] < valid[0]["mlm_loss"] - 0.5
    assert all(math.isfinite(x["loss"]) for x in metrics_lines(tmp_path / "run", "train"))
    if precision == "fp16":  # the grad scaler's state is saved for resume, and it was at work
        scaler = torch.load(
            tmp_path / "run" / "checkpoints" / "step_000060" / "optimizer.pt", weights_only=True
        )["scaler"]
        assert scaler["_growth_tracker"] > 0 or scaler["scale"] < 2.0**16  # updated by the 60 steps


@needs_gpu
def test_gpu_bf16_follows_fp32(tmp_path, wiki_slice, small_tokenizer_dir):
    losses = {}
    for precision in ("fp32", "bf16"):
        config = no_dropout(tiny_config(wiki_slice, max_steps=4, eval_every=4))
        config.runtime.device, config.runtime.precision = "cuda", precision
        pretrain(config, tmp_path / precision, tokenizer_dir=small_tokenizer_dir, show_progress=False)
        losses[precision] = [x["loss"] for x in metrics_lines(tmp_path / precision, "train")]
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=2e-2)


class BrokenCompiled(torch.nn.Module):
    """What torch.compile returns when compilation fails at the first call (e.g. no C++ compiler)."""

    def __init__(self, model, **options):
        super().__init__()
        self._orig_mod = model

    def forward(self, *args, **kwargs):
        raise torch._dynamo.exc.BackendCompilerFailed(
            lambda: None, RuntimeError("no working C++ compiler"), first_useful_frame=None
        )


def test_failed_compile_falls_back_to_eager(tmp_path, wiki_slice, small_tokenizer_dir, monkeypatch):
    eager = no_dropout(tiny_config(wiki_slice, max_steps=3, eval_every=3))
    eager.runtime.compile = True  # the compiled run's fixed-shape batches, on a model never compiled
    monkeypatch.setattr(torch, "compile", lambda model, **options: model)
    pretrain(eager, tmp_path / "eager", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    monkeypatch.setattr(torch, "compile", BrokenCompiled)
    compiled = no_dropout(tiny_config(wiki_slice, max_steps=3, eval_every=3))
    compiled.runtime.compile = True
    with pytest.warns(UserWarning, match="torch.compile failed .*training in eager mode"):
        pretrain(compiled, tmp_path / "compiled", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    eager_losses = [x["loss"] for x in metrics_lines(tmp_path / "eager", "train")]
    compiled_losses = [x["loss"] for x in metrics_lines(tmp_path / "compiled", "train")]
    assert compiled_losses == eager_losses  # nothing of the failed attempt leaked into the run


def cut_and_resume(run, step: int):
    """A copy of `run` as if interrupted after its checkpoint at `step`, then resumed to its end."""
    cut = run.parent / f"{run.name}_cut"
    shutil.copytree(run, cut)
    for later in (cut / "checkpoints").iterdir():
        if int(later.name.split("_")[1]) > step:
            shutil.rmtree(later)
    shutil.rmtree(cut / "final")
    pretrain(read_config(cut), cut, resume=True, show_progress=False)
    return cut


@needs_gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_resume_on_gpu_reproduces_the_run(tmp_path, wiki_slice, small_tokenizer_dir, precision):
    """With dropout: the GPU's RNG state, the data position and (fp16) the grad scaler resume exactly."""
    config = tiny_config(wiki_slice, max_steps=8, eval_every=4)
    config.runtime.device, config.runtime.precision = "cuda", precision
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    cut = cut_and_resume(tmp_path / "run", 4)
    full, resumed = metrics_lines(tmp_path / "run", "train"), metrics_lines(cut, "train")
    assert [x["step"] for x in resumed] == list(range(1, 9))
    for a, b in zip(full, resumed, strict=True):  # float atomics may differ in the last bits
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), a["step"]
    if precision == "fp16":
        saved = [
            torch.load(run / "checkpoints" / "step_000008" / "optimizer.pt", weights_only=True)["scaler"]
            for run in (tmp_path / "run", cut)
        ]
        assert saved[1]["scale"] == saved[0]["scale"]
        assert saved[1]["_growth_tracker"] == saved[0]["_growth_tracker"]  # 4 fewer if not restored


TOY_TOPICS = {"music": ("album", "song", "single", "music"), "war": ("army", "battle", "war", "fought")}


def toy_file(path, count: int, seed: int):
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(count):
        label = sorted(TOY_TOPICS)[i % 2]
        words = rng.choices(TOY_TOPICS[label], k=3) + rng.choices(("the", "of", "in", "a"), k=2)
        rows.append(json.dumps({"text": " ".join(rng.sample(words, len(words))), "label": label}) + "\n")
    path.write_text("".join(rows), encoding="utf-8")
    return path


@needs_gpu
def test_fine_tuning_and_inference_on_gpu(tmp_path, tiny_pretrained_run):
    from bertforge.classifier import classify
    from bertforge.finetune import FinetuneTask, finetune, finetuning_config
    from bertforge.folders import open_classifier, open_pretrained
    from bertforge.infer import embed, fill_mask, next_sentence

    task = FinetuneTask(
        model=str(tiny_pretrained_run),
        train=str(toy_file(tmp_path / "train.jsonl", 64, 0)),
        valid=str(toy_file(tmp_path / "valid.jsonl", 30, 1)),
        text_column="text",
        label_column="label",
        epochs=8,  # 4 reached 0.87-0.97 on generated text: too near the bar
    )
    config = finetuning_config()
    config.data.max_seq_length, config.train.batch_size, config.train.learning_rate = 32, 8, 3e-3
    config.runtime.device = "cuda"
    summary = finetune(task, config, tmp_path / "run", show_progress=False)
    assert summary["runs"][0]["best"]["accuracy"] >= 0.9
    model, tokenizer, labels, _ = open_classifier(tmp_path / "run")
    predicted = classify(model.cuda(), tokenizer, labels, ["the army fought a battle", "a song of the album"])
    assert [p["label"] for p in predicted] == ["war", "music"]

    model, tokenizer, _ = open_pretrained(tiny_pretrained_run)
    model = model.cuda()
    top = fill_mask(model, tokenizer, "the [MASK] of the city", top_k=3)
    assert len(top) == 1 and len(top[0]) == 3
    assert 0.0 <= next_sentence(model, tokenizer, "the album was released .", "it sold well .") <= 1.0
    cpu_vectors = embed(model.cpu(), tokenizer, ["the album", "a long battle of the war"])
    gpu_vectors = embed(model.cuda(), tokenizer, ["the album", "a long battle of the war"])
    assert gpu_vectors == pytest.approx(cpu_vectors, abs=2e-2)  # TF32 on the GPU


@needs_gpu
def test_steady_state_steps_never_wait_for_the_gpu(tmp_path, wiki_slice, small_tokenizer_dir, monkeypatch):
    """`set_sync_debug_mode("error")` raises at any host-device synchronisation inside a step."""
    step = train.Trainer.optimizer_step
    synced_steps = []

    def watched(self, stream, lr):
        if self.state.step < 3:  # warm-up: allocator, kernels, the first data from the workers
            return step(self, stream, lr)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return step(self, stream, lr)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            synced_steps.append(self.state.step)

    monkeypatch.setattr(train.Trainer, "optimizer_step", watched)
    config = tiny_config(wiki_slice, max_steps=10, eval_every=10, log_every=10)
    config.train.gradient_accumulation_steps = 2
    config.runtime.device, config.runtime.precision = (
        "cuda",
        "bf16" if torch.cuda.is_bf16_supported() else "fp16",
    )
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    assert synced_steps == list(range(4, 11))


def nccl_rank(rank, port, corpus, tokenizer_dir, out):
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    pretrain(nccl_config(corpus), out / "ddp", tokenizer_dir=tokenizer_dir, show_progress=False)


def nccl_config(corpus):
    config = no_dropout(tiny_config(corpus, max_steps=6, eval_every=3))
    config.train.gradient_accumulation_steps = 4
    config.runtime.device, config.runtime.precision, config.runtime.tf32 = "cuda", "fp32", False
    return config


@needs_two_gpus
def test_two_gpus_with_nccl_follow_one_gpu(tmp_path, wiki_slice, small_tokenizer_dir):
    import torch.multiprocessing as mp

    pretrain(
        nccl_config(wiki_slice), tmp_path / "single", tokenizer_dir=small_tokenizer_dir, show_progress=False
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(nccl_rank, args=(port, wiki_slice, small_tokenizer_dir, tmp_path), nprocs=2, join=True)
    single, ddp = metrics_lines(tmp_path / "single", "train"), metrics_lines(tmp_path / "ddp", "train")
    assert [x["step"] for x in ddp] == list(range(1, 7))
    for a, b in zip(single, ddp, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3), a["step"]
    state = json.loads((tmp_path / "ddp" / "checkpoints" / "step_000006" / "state.json").read_text())
    assert all(isinstance(rank["torch_cuda"], str) for rank in state["rank_rng"])  # each rank's own GPU
