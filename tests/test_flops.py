"""The FLOPs of a training step (`bertforge.flops`) against the matmuls torch counts in a real
forward and backward pass, and against a count by hand; MFU and the GPU peak table."""

from __future__ import annotations

import pytest
import torch
from conftest import HF_TINY_SIZES
from torch.utils.flop_counter import FlopCounterMode

from bertforge import flops
from bertforge.config import ModelConfig
from bertforge.model import BertForPreTraining

SIZES = dict(HF_TINY_SIZES, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def counted(step) -> int:
    """The matmul FLOPs torch counts in `step()`, a forward and backward pass."""
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def batch(config: ModelConfig, rows: int, length: int) -> torch.Tensor:
    return torch.randint(5, config.vocab_size, (rows, length), generator=torch.Generator().manual_seed(0))


def test_a_hand_count_of_a_small_step():
    config = ModelConfig(hidden_size=4, intermediate_size=8, num_hidden_layers=2, vocab_size=10)
    # Per token and layer: Q, K, V, output 4 x 4*4, FFN 2 x 4*8 multiply-adds = 128; attention over
    # 3 tokens: 3*4 scores + 3*4 mixing = 24; x 2 layers x 6 tokens = 1,824; the last layer's output
    # projection and FFN (4*4 + 2 x 4*8 = 80) skip the 2 tokens that are neither masked nor [CLS]:
    # -160. MLM head on 2 positions: 2 x (4*4 + 4*10) = 112; pooler and NSP on 2 sequences:
    # 2 x (4*4 + 4*2) = 48. Two FLOPs per multiply-add, three passes: 6 x (1,664 + 112 + 48).
    assert flops.bert_step_flops(config, batch=2, seq_len=3, predicted=2) == 6 * (1664 + 112 + 48)
    gpt = ModelConfig(hidden_size=4, intermediate_size=8, num_hidden_layers=2, vocab_size=10, objective="clm")
    assert flops.training_flops(gpt, tokens=6, seq_len=3, predicted=6) == 6 * (1824 + 6 * 4 * 10)


def test_bertforge_s_step_does_the_counted_matmuls():
    config = ModelConfig(**SIZES)
    torch.manual_seed(0)
    model = BertForPreTraining(config)
    rows, length = 3, 16
    ids, masked = batch(config, rows, length), torch.tensor([1, 7, 18, 40, 47])

    def step():
        mlm, nsp = model(ids, token_type_ids=torch.zeros_like(ids), masked_positions=masked)
        (mlm.float().sum() + nsp.float().sum()).backward()

    # Attention runs in a fused kernel that torch's counter leaves out: count its two matmuls apart.
    h, layers = config.hidden_size, config.num_hidden_layers
    q, k, v = (torch.randn(rows, length, h, requires_grad=True) for _ in range(3))
    attention = layers * counted(lambda: ((q @ k.transpose(1, 2)).softmax(-1) @ v).sum().backward())
    expected = flops.bert_step_flops(config, rows, length, predicted=masked.numel())
    assert counted(step) + attention == expected


def test_hugging_face_s_dense_head_is_counted_on_every_position():
    transformers = pytest.importorskip("transformers")
    config = ModelConfig(**SIZES)
    hf = transformers.BertForPreTraining(
        transformers.BertConfig(**{k: v for k, v in SIZES.items()}, attn_implementation="eager")
    )
    rows, length = 2, 12
    ids = batch(config, rows, length)

    def step():
        out = hf(input_ids=ids, token_type_ids=torch.zeros_like(ids))
        (out.prediction_logits.sum() + out.seq_relationship_logits.sum()).backward()

    assert counted(step) == flops.bert_step_flops(config, rows, length, predicted=rows * length)


def test_mfu_against_the_gpu_s_dense_bf16_peak():
    assert flops.peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert flops.peak_bf16_flops("NVIDIA H100 PCIe") == 756e12
    assert flops.peak_bf16_flops("NVIDIA H200") == 989e12
    assert flops.peak_bf16_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert flops.peak_bf16_flops("NVIDIA L4") == 121e12
    assert flops.peak_bf16_flops("NVIDIA L40S") == 362e12
    assert flops.peak_bf16_flops("NVIDIA A10") == 125e12
    assert flops.peak_bf16_flops("NVIDIA A10G") is None  # not the A10's figure
    assert flops.peak_bf16_flops("Tesla V100-SXM2-16GB") is None
    assert flops.peak_bf16_flops("NVIDIA RTX A1000 Laptop GPU") is None  # not an A100
    assert flops.peak_bf16_flops("NVIDIA H800 PCIe") == 756e12
    assert flops.mfu(4.945e14, 1.0, 989e12) == pytest.approx(0.5)
    assert flops.mfu(4.945e14, 2.0, 989e12) == pytest.approx(0.25)
    # BERT-base at 128 tokens: 256 rows, 15% masked.
    base = ModelConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12)
    step = flops.bert_step_flops(base, 256, 128, predicted=256 * 20)
    per_token = 6 * 12 * (4 * 768**2 + 2 * 768 * 3072 + 2 * 128 * 768)
    assert step == pytest.approx(256 * 128 * per_token, rel=0.1)  # the encoder is most of it
    assert step == pytest.approx(17.0e12, rel=0.01)  # so 45% MFU on an H100 is a step of 38 ms
