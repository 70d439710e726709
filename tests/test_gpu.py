"""Mixed precision and torch.compile: bf16, fp16 and compile on a GPU when one is visible; compile on CPU."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from conftest import tiny_config

from bertforge.pretrain import pretrain

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA GPU visible: bf16, fp16 and --compile on GPU are tested only on a machine with one",
)


def read_lines(run, split):
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x["split"] == split]


def no_dropout(config):
    config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = 0.0
    return config


@needs_gpu
@pytest.mark.parametrize(("precision", "compile"), [("bf16", False), ("fp16", False), ("bf16", True)])
def test_pretraining_on_gpu(tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir, precision, compile):
    config = tiny_config(wiki_slice, wiki_valid_slice, max_steps=60, eval_every=30, batch_size=16)
    config.train.learning_rate = 3e-3
    config.runtime.device, config.runtime.precision, config.runtime.compile = "cuda", precision, compile
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="torch.compile failed")  # on GPU it must really compile
        pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    valid = read_lines(tmp_path / "run", "valid")
    assert valid[-1]["mlm_loss"] < valid[0]["mlm_loss"] - 0.5
    assert all(math.isfinite(x["loss"]) for x in read_lines(tmp_path / "run", "train"))
    if precision == "fp16":  # the grad scaler's state is saved for resume
        saved = tmp_path / "run" / "checkpoints" / "step_000060" / "optimizer.pt"
        assert torch.load(saved, weights_only=True)["scaler"]["scale"] > 0


@needs_gpu
def test_gpu_bf16_follows_fp32(tmp_path, wiki_slice, small_tokenizer_dir):
    losses = {}
    for precision in ("fp32", "bf16"):
        config = no_dropout(tiny_config(wiki_slice, max_steps=4, eval_every=4))
        config.runtime.device, config.runtime.precision = "cuda", precision
        pretrain(config, tmp_path / precision, tokenizer_dir=small_tokenizer_dir, show_progress=False)
        losses[precision] = [x["loss"] for x in read_lines(tmp_path / precision, "train")]
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=2e-2)


class BrokenCompiled(torch.nn.Module):
    """What torch.compile returns when compilation fails at the first call (e.g. no C++ compiler)."""

    def __init__(self, model):
        super().__init__()
        self._orig_mod = model

    def forward(self, *args, **kwargs):
        raise RuntimeError("backend compiler failed: no working C++ compiler")


def test_failed_compile_falls_back_to_eager(tmp_path, wiki_slice, small_tokenizer_dir, monkeypatch):
    eager = no_dropout(tiny_config(wiki_slice, max_steps=3, eval_every=3))
    pretrain(eager, tmp_path / "eager", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    monkeypatch.setattr(torch, "compile", BrokenCompiled)
    compiled = no_dropout(tiny_config(wiki_slice, max_steps=3, eval_every=3))
    compiled.runtime.compile = True
    with pytest.warns(UserWarning, match="torch.compile failed .*training in eager mode"):
        pretrain(compiled, tmp_path / "compiled", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    eager_losses = [x["loss"] for x in read_lines(tmp_path / "eager", "train")]
    compiled_losses = [x["loss"] for x in read_lines(tmp_path / "compiled", "train")]
    assert compiled_losses == eager_losses  # nothing of the failed attempt leaked into the run


@pytest.mark.slow
def test_compile_on_cpu_works_or_falls_back(tmp_path, wiki_slice, small_tokenizer_dir):
    """`runtime.compile = true` on CPU: compiled training follows eager training, or falls back to it."""
    runs = {}
    for compile in (False, True):
        config = no_dropout(tiny_config(wiki_slice, max_steps=3, eval_every=3))
        config.runtime.device, config.runtime.compile = "cpu", compile
        pretrain(config, tmp_path / str(compile), tokenizer_dir=small_tokenizer_dir, show_progress=False)
        runs[compile] = [x["loss"] for x in read_lines(tmp_path / str(compile), "train")]
    assert runs[True] == pytest.approx(runs[False], rel=1e-4)
