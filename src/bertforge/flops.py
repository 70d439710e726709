"""FLOPs of a training step and model FLOPs utilisation (MFU): the matmul work of a BERT or GPT step
counted from its sizes, and the dense bf16 peak of known GPUs to divide it by.

A training step does three times its forward matmuls (the backward pass computes the gradients of
both operands), at 2 FLOPs per multiply-add. Per token and layer the forward pass multiplies by
the Q, K, V and output projections (4 H^2) and the two feed-forward ones (2 H I), and attention
adds 2 T H for the scores and 2 T H for the mixing, T the sequence length. A BERT's last layer
runs its output projection and feed-forward only where a head reads (bertforge: the masked
positions and [CLS]; a dense head: every position). The heads count where they run: the pooler
and NSP classifier on one token per sequence, the MLM transform and vocabulary projection
(H^2 + H V) on the positions the head is given (bertforge: the masked ones; Hugging Face: every
position), a GPT's vocabulary projection (H V) on every position. Embedding lookups,
normalisation, activations, the loss and the optimizer are not matmuls and are not counted.

The sizes are read from any object with Hugging Face `BertConfig`'s field names (`hidden_size`,
`intermediate_size`, `num_hidden_layers`, `vocab_size`), such as `bertforge.config.ModelConfig`.
"""

from __future__ import annotations

import re

# Dense (not sparse) bf16 tensor-core peak, TFLOP/s, from the vendor's data sheets; the first
# pattern that matches `torch.cuda.get_device_name()` wins, so the more specific ones come first.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"H100.*PCIe|H800.*PCIe", 756.0),
    (r"H100.*NVL|H200.*NVL", 835.0),
    (r"GH200|H200|H100|H800", 989.0),  # SXM
    (r"B200", 2250.0),
    (r"\bA100\b|\bA800\b", 312.0),
    (r"L40S", 362.0),
    (r"L40\b", 181.0),
    (r"\bL4\b", 121.0),
    (r"\bA10\b", 125.0),
    (r"RTX 4090", 165.0),
    (r"RTX A6000", 155.0),
)


def peak_bf16_flops(device_name: str) -> float | None:
    """The GPU's dense bf16 peak in FLOP/s, None for a device not in `PEAK_BF16_TFLOPS`."""
    for pattern, tflops in PEAK_BF16_TFLOPS:
        if re.search(pattern, device_name):
            return tflops * 1e12
    return None


def encoder_flops(config, tokens: float, seq_len: int, last_layer_rows: float | None = None) -> float:
    """Training FLOPs of the transformer layers for `tokens` tokens in sequences of `seq_len`, the last
    layer's output projection and feed-forward on `last_layer_rows` of them (None: all)."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    past_attention = 2 * (h * h + 2 * h * i)  # output projection and feed-forward, per token and layer
    projections = 2 * 3 * h * h + past_attention  # Q, K, V, then those
    attention = 4 * seq_len * h  # scores and mixing, per token and layer
    skipped = 0.0 if last_layer_rows is None else max(0.0, tokens - last_layer_rows)
    return 3.0 * (layers * tokens * (projections + attention) - skipped * past_attention)


def mlm_head_flops(config, positions: float) -> float:
    """Training FLOPs of BERT's MLM head (transform and vocabulary projection) on `positions`."""
    h = config.hidden_size
    return 3.0 * positions * 2 * (h * h + h * config.vocab_size)


def nsp_head_flops(config, sequences: float) -> float:
    """Training FLOPs of BERT's pooler and NSP classifier, on one token per sequence."""
    h = config.hidden_size
    return 3.0 * sequences * 2 * (h * h + 2 * h)


def lm_head_flops(config, positions: float) -> float:
    """Training FLOPs of a GPT's vocabulary projection on `positions`."""
    return 3.0 * positions * 2 * config.hidden_size * config.vocab_size


def bert_step_flops(config, batch: int, seq_len: int, predicted: float) -> float:
    """Training FLOPs of one BERT pretraining step on `batch` full rows of `seq_len` tokens whose MLM
    head runs on `predicted` positions (the masked ones, or batch x seq_len for a dense head)."""
    return training_flops(config, batch * seq_len, seq_len, predicted, batch)


def training_flops(config, tokens: float, seq_len: int, predicted: float, sequences: float = 0) -> float:
    """Training FLOPs of `tokens` tokens in sequences of `seq_len`: a GPT's (`config.objective` "clm")
    with its vocabulary projection on `predicted` positions, else a BERT's with its MLM head on
    `predicted` positions and its pooler and NSP classifier on `sequences`."""
    if getattr(config, "objective", "mlm") == "clm":
        return encoder_flops(config, tokens, seq_len) + lm_head_flops(config, predicted)
    encoder = encoder_flops(config, tokens, seq_len, last_layer_rows=predicted + sequences)
    return encoder + mlm_head_flops(config, predicted) + nsp_head_flops(config, sequences)


def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: the FLOPs done per second as a share of the peak."""
    return flops / seconds / peak_flops
