"""The GPU's fast path, as far as a CPU can check it: variable-length attention without a mask
(`bertforge.varlen`), warmup batches at the warmup's length, one graph under torch.compile, and
evaluation in the GPU's autocast. The GPU's own kernels are checked where one is visible."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import HF_TINY_SIZES, tiny_config

from bertforge import compiling, evaluate
from bertforge import model as model_module
from bertforge.cache import cached_shards, default_cache_dir
from bertforge.config import ModelConfig, max_predictions
from bertforge.evaluate import pretraining_batch_sums
from bertforge.losses import NO_LABEL, pretraining_loss
from bertforge.model import BertForPreTraining, set_activation_checkpointing
from bertforge.pretrain import epoch_batches
from bertforge.tokenizer import load_tokenizer
from bertforge.varlen import Segments, segments

TOL = 1e-5
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")


@pytest.fixture(autouse=True)
def quiet_nested_tensors():
    """torch's nested tensors warn that they are a prototype, and on CPU run a strided fallback."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")
        yield


def no_dropout_config(**overrides) -> ModelConfig:
    return ModelConfig(
        **{**HF_TINY_SIZES, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, **overrides}
    )


def pretraining_batch(lengths: list[int], width: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded pairs of `lengths` real tokens, a third of them masked, with NSP labels."""
    g = torch.Generator().manual_seed(seed)
    lengths_t = torch.tensor(lengths)
    mask = (torch.arange(width) < lengths_t[:, None]).long()  # (B, T)
    input_ids = torch.randint(5, HF_TINY_SIZES["vocab_size"], (len(lengths), width), generator=g) * mask
    token_type_ids = ((torch.arange(width) >= lengths_t[:, None] // 2) & mask.bool()).long()
    chosen = (torch.rand(len(lengths), width, generator=g) < 0.3) & mask.bool()
    positions = chosen.flatten().nonzero().squeeze(1)  # (M,)
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": mask,
        "masked_positions": positions,
        "masked_labels": input_ids.flatten()[positions],
        "nsp_labels": torch.randint(0, 2, (len(lengths),), generator=g),
    }


def loss_and_gradients(model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    loss = pretraining_loss(pretraining_batch_sums(model, batch, HF_TINY_SIZES["vocab_size"]))
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_segments_cut_each_row_into_padding_real_tokens_padding():
    mask = torch.tensor(
        [
            [1, 1, 1, 1],  # full: both padding segments empty
            [1, 1, 0, 0],  # right padding
            [0, 1, 1, 0],  # padding on both sides
        ]
    )
    cut = segments(mask)
    assert cut.width == 4
    assert cut.offsets.tolist() == [0, 0, 4, 4, 4, 6, 8, 9, 11, 12]


def test_a_batch_with_short_rows_reaches_attention_without_a_mask(monkeypatch):
    """As on a GPU (`varlen` on): every layer's attention gets jagged sequences and no mask, so SDPA
    may choose its flash kernel; the masked path never runs."""
    model = BertForPreTraining(no_dropout_config())
    model.bert.varlen = True
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        calls.append((q.is_nested, attn_mask))
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    def refuse(*args, **kwargs):
        raise AssertionError("the masked attention ran")

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(model_module, "attention", refuse)
    batch = pretraining_batch([12, 7, 4], width=12)
    loss_and_gradients(model, batch)
    assert calls == [(True, None)] * HF_TINY_SIZES["num_hidden_layers"]


def test_the_attention_path_for_padding():
    """The key-padding mask by default (the faster on CPU, and on an H200 in eager and compiled
    mode: benchmarks/padding.py), the segments when `varlen` is on; no mask at all without padding."""
    bert = BertForPreTraining(no_dropout_config()).bert
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    masked = bert.attention_padding(mask)
    assert masked.dtype == torch.bool and masked.shape == (2, 1, 1, 3)
    assert masked[:, 0, 0].tolist() == [[True, True, False], [True, True, True]]
    assert bert.attention_padding(None) is None
    bert.varlen = True
    cut = bert.attention_padding(mask)
    assert isinstance(cut, Segments) and cut.offsets.tolist() == [0, 0, 2, 3, 3, 6, 6]
    assert bert.attention_padding(None) is None


@pytest.mark.parametrize("lengths", [[12, 7, 4], [12, 12, 12], [3, 1, 9]])
def test_variable_length_attention_equals_the_masked_one_in_loss_and_gradients(lengths):
    torch.manual_seed(0)
    masked = BertForPreTraining(no_dropout_config())
    varlen = BertForPreTraining(no_dropout_config())
    varlen.load_state_dict(masked.state_dict())
    varlen.bert.varlen = True
    batch = pretraining_batch(lengths, width=12)
    loss, gradients = loss_and_gradients(masked, batch)
    varlen_loss, varlen_gradients = loss_and_gradients(varlen, batch)
    torch.testing.assert_close(varlen_loss, loss, rtol=0, atol=TOL)
    assert varlen_gradients.keys() == gradients.keys()
    for name, gradient in gradients.items():
        torch.testing.assert_close(varlen_gradients[name], gradient, rtol=0, atol=TOL, msg=name)
    assert max(float(g.abs().max()) for g in gradients.values()) > 1e-3  # gradients that can differ


@torch.no_grad()
def test_left_padding_gives_the_same_real_tokens():
    torch.manual_seed(0)
    model = BertForPreTraining(no_dropout_config()).eval()
    ids = torch.randint(5, HF_TINY_SIZES["vocab_size"], (2, 8))
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0, 0]])
    expected, _ = model.bert(ids, attention_mask=mask)
    model.bert.varlen = True
    got, _ = model.bert(ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=TOL)


def test_dropout_in_variable_length_attention_keeps_its_rate():
    """Training mode draws attention dropout in the jagged kernel: outputs differ from eval's."""
    model = BertForPreTraining(no_dropout_config(attention_probs_dropout_prob=0.5))
    model.bert.varlen = True
    batch = pretraining_batch([10, 6], width=10)
    trained = model.bert(batch["input_ids"], attention_mask=batch["attention_mask"])[0]
    evaluated = model.eval().bert(batch["input_ids"], attention_mask=batch["attention_mask"])[0]
    assert torch.isfinite(trained).all() and not torch.allclose(trained, evaluated)


def test_warmup_batches_have_the_warmup_length_under_compile(wiki_slice, small_tokenizer_dir):
    """With fixed shapes (torch.compile) an epoch's batches are padded to its own length, not to
    data.max_seq_length, and its masked positions to what that length can hold."""
    tokenizer = load_tokenizer(small_tokenizer_dir)
    shards = cached_shards(wiki_slice, tokenizer, "auto", default_cache_dir(), False)
    config = tiny_config(wiki_slice, batch_size=8)
    config.data.max_seq_length, config.runtime.compile = 64, True
    for length in (16, 64):
        batches = epoch_batches(shards, tokenizer, config, length)(0)
        for batch in (batches[0], batches[1]):
            assert batch["input_ids"].shape == batch["attention_mask"].shape == (8, length)
            room = max_predictions(replace(config.data, max_seq_length=length))  # per sequence
            assert batch["masked_positions"].shape == batch["masked_labels"].shape == (8 * room,)
            assert int(batch["masked_positions"].max()) < 8 * length
            assert (batch["masked_labels"] != NO_LABEL).any()


def test_torch_compile_builds_one_graph_and_a_short_batch_runs_eagerly(monkeypatch):
    options = {}
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: options.update(kwargs) or "compiled")
    assert compiling.compile_model(torch.nn.Linear(2, 2), True) == "compiled"
    assert options == {"dynamic": False}  # a new shape compiles a graph for it, not one for any
    monkeypatch.undo()

    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(model)  # compiles at its first call, which never comes here
    full, short = {"input_ids": torch.zeros(8, 16)}, {"input_ids": torch.zeros(3, 16)}
    assert compiling.for_batch(compiled, full, rows=8) is compiled
    assert compiling.for_batch(compiled, short, rows=8) is model  # the epoch's short last batch
    assert compiling.for_batch(model, short, rows=8) is model


def test_evaluation_runs_in_the_gpus_autocast(monkeypatch):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(evaluate, "native_bf16", lambda device: True)
    assert evaluate.evaluation_precision("auto", cuda) == "bf16"
    monkeypatch.setattr(evaluate, "native_bf16", lambda device: False)  # before Ampere: fp16
    assert evaluate.evaluation_precision("auto", cuda) == "fp16"
    assert evaluate.evaluation_precision("auto", cpu) == "fp32"  # the CPU path stays as it was
    assert evaluate.evaluation_precision("fp32", cuda) == "fp32"  # asked for, it is kept


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_the_gpu_variable_length_attention_equals_the_masked_one(dtype):
    torch.manual_seed(0)
    config = no_dropout_config(hidden_size=128, num_attention_heads=2, intermediate_size=256)
    masked = BertForPreTraining(config).cuda()
    varlen = BertForPreTraining(config).cuda()
    varlen.load_state_dict(masked.state_dict())
    masked.bert.varlen, varlen.bert.varlen = False, True
    batch = {k: v.cuda() for k, v in pretraining_batch([64, 40, 64, 9], width=64).items()}
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        loss, gradients = loss_and_gradients(masked, batch)
        torch.cuda.set_sync_debug_mode("error")  # nothing in it waits for the GPU
        try:
            varlen_loss, varlen_gradients = loss_and_gradients(varlen, batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    tol = TOL if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(varlen_loss, loss, rtol=0, atol=tol)
    for name, gradient in gradients.items():
        torch.testing.assert_close(varlen_gradients[name], gradient, rtol=tol, atol=tol, msg=name)


@needs_gpu
def test_on_the_gpu_bf16_variable_length_attention_runs_the_flash_kernel():
    config = no_dropout_config(hidden_size=128, num_attention_heads=2, intermediate_size=256)
    config.attention_probs_dropout_prob = 0.1
    model = BertForPreTraining(config).cuda()
    model.bert.varlen = True
    batch = {k: v.cuda() for k, v in pretraining_batch([64, 40, 64, 9], width=64).items()}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss_and_gradients(model, batch)
        torch.cuda.synchronize()
    kernels = " ".join(event.name.lower() for event in profile.events())
    assert "flash" in kernels and "fmha" not in kernels  # fmha: the memory-efficient kernel


@needs_gpu
def test_on_the_gpu_activation_checkpointing_keeps_the_gradients_of_variable_length_attention():
    config = no_dropout_config(hidden_size=128, num_attention_heads=2, intermediate_size=256)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.1
    torch.manual_seed(0)
    model = BertForPreTraining(config).cuda()
    batch = {k: v.cuda() for k, v in pretraining_batch([64, 40, 64, 9], width=64).items()}
    results = []
    for enabled in (False, True):
        set_activation_checkpointing(model, enabled)
        torch.manual_seed(1)  # the same dropout masks
        with torch.autocast("cuda", dtype=torch.bfloat16):
            results.append(loss_and_gradients(model, batch))
    (loss, gradients), (checkpointed_loss, checkpointed) = results
    torch.testing.assert_close(checkpointed_loss, loss, rtol=0, atol=1e-4)
    for name, gradient in gradients.items():
        torch.testing.assert_close(checkpointed[name], gradient, rtol=1e-3, atol=1e-4, msg=name)
