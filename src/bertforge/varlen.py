"""Attention over each sequence's real tokens, without a mask: variable-length attention.

Scaled dot-product attention takes its flash kernel only without a mask, and a padded batch needs
one. Here each row of a (B, T) batch is cut into segments that hold a row's real tokens or its
padding, and attention runs segment by segment on a jagged nested tensor (`torch.nested`, jagged
layout): SDPA sends it to its variable-length flash kernel on a GPU in bf16 and fp16 (to the
memory-efficient one in fp32), as MosaicBERT's and ModernBERT's unpadded attention does. The
tokens stay where they are, so every shape is fixed by the batch's (B, T): nothing waits for the
device to count the real tokens, and torch.compile builds one graph.

It is opt-in (`BertModel.varlen`): on an H200 with torch 2.11, SDPA runs the key-padding mask with
its cuDNN kernel, and that trained BERT-base faster, eager (2.68x: the nested tensors' per-call
cost) and compiled (1.07x) alike (`benchmarks/padding.py`, benchmarks/RESULTS.md).

Real tokens attend to the real tokens of their row, exactly as under the key mask: the result at
every real token equals the padded computation (tests/test_unpadded.py). Padding attends to the
padding of its row, where Hugging Face lets it attend to the real tokens: values that nothing
reads. A row's real tokens must be contiguous (right or left padding, as tokenizers pad).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

# Recent torch versions log a notice about fx tracing when a process builds its first jagged
# tensor; it concerns `torch.fx.symbolic_trace`, which nothing here uses.
logging.getLogger("torch.fx._symbolic_trace").addFilter(lambda record: "is_fx_tracing" not in str(record.msg))


@dataclass(frozen=True)
class Segments:
    """The segments of a (B, T) batch's B*T token positions: each row's leading padding, its real
    tokens and its trailing padding (segments of padding are often empty)."""

    offsets: Tensor  # (3B+1,) where each segment starts among the B*T positions, then B*T
    width: int  # T, the longest a segment can be


def segments(attention_mask: Tensor) -> Segments:
    """The segments of a (B, T) mask, 1/True at real tokens; computed on the mask's device without
    waiting for it."""
    mask = attention_mask.bool()
    batch_size, width = mask.shape
    real = mask.sum(1)  # (B,)
    leading = (mask.cumsum(1) == 0).sum(1)  # (B,) padding before the first real token
    starts = torch.arange(batch_size, device=mask.device) * width  # (B,)
    bounds = torch.stack([starts, starts + leading, starts + leading + real], 1).flatten()  # (3B,)
    return Segments(F.pad(bounds, (0, 1), value=batch_size * width), width)


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, segments: Segments, p: float) -> Tensor:
    """Attention of every token to the tokens of its own segment, with dropout `p`.

    q, k, v: (B, T, nh, hd), the heads by token (each tensor contiguous); returns (B, T, nh, hd).
    """
    batch_size, width, heads, head_dim = q.shape

    def jagged(x: Tensor) -> Tensor:  # (3B, nh, j, hd), j the ragged segment length
        # min_seqlen = 1 although padding segments can be empty: the fused kernels skip an empty
        # segment, but torch's dispatcher counts the lengths itself when not told (waiting for
        # the device) and sends a batch with an empty one to its slowest kernel.
        nested = torch.nested.nested_tensor_from_jagged(
            x.view(batch_size * width, heads, head_dim), segments.offsets, min_seqlen=1, max_seqlen=width
        )
        return nested.transpose(1, 2)

    y = F.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v), dropout_p=p)  # (3B, nh, j, hd)
    return y.transpose(1, 2).values().view(batch_size, width, heads, head_dim)
