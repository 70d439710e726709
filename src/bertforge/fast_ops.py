"""Cheaper versions of three training-time operations, computing what torch's would, for the CPU step.

Profiling the bf16 training step on CPU (benchmarks/RESULTS.md) showed costs out of proportion to
their arithmetic:
- dropout masks: torch draws one random number per element (`bernoulli_`), about 4 ns each, which
  made the masks 17% of the step. `Dropout` here draws 64-bit words and reads four 16-bit uniform
  draws from each, so p is applied at a resolution of 1/65,536 (0.1 becomes 0.100006, and the
  kept values are scaled by the exact inverse of the keep rate, so the output stays unbiased).
  Other devices, and torch.compile (which cannot trace the in-place draw), keep torch's dropout.
- cross-entropy over the vocabulary: `F.cross_entropy(logits.float())` makes (M, V) float32
  tensors of 70 MB and more (M masked positions, V = 30,522) for the cast, the log-softmax and its
  gradient. glibc maps each such block afresh from the kernel and unmaps it when freed, so every
  step pays page faults over all of it: the cast and softmax cost several times their arithmetic.
  `cross_entropy_sum` does the same float32 softmax over a few rows at a time. On a GPU it runs
  in larger chunks, so the float32 copies stay bounded however large masked tokens x vocabulary grow.
- attention on CPU: torch's fused kernels take no dropout, so `scaled_dot_product_attention`
  falls back to its unfused path; `attention` runs that path itself with the cheaper mask. In bf16
  it runs it without dropout too: there the fused kernel was slower than the unfused one (batch
  64 x 128, 4 heads of 64: 8.9 against 5.1 ms forward, 45 against 15 ms forward and backward; in
  fp32 the fused one was faster, 27 against 32 ms, and fp32 keeps it; benchmarks/RESULTS.md).
  Causal attention (GPT) measured the same way: 25 against 48 ms in bf16, 36 against 28 in fp32.
The dropout masks come from torch's default generator, so seeded runs and exact resume still hold.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_DRAWS = 65536  # 16-bit uniform draws
# Elements per float32 chunk of the softmax: 4 MiB, well under glibc's 32 MiB mmap threshold, so
# the chunk's buffer is reused instead of being mapped and page-faulted afresh every step.
_CHUNK_ELEMENTS = 1 << 20
_GPU_CHUNK_ELEMENTS = 1 << 24  # 64 MiB of float32 per chunk: a few chunks at most, few kernel launches


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """`F.dropout(x, p, training)`, with masks from 16-bit draws on CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    dropped = round(p * _DRAWS)
    if dropped >= _DRAWS:  # p within 2**-17 of 1: the 16-bit draws would keep nothing
        return F.dropout(x, p, training)
    keep = _uniform_int16(x.shape) >= dropped - _DRAWS // 2  # P(keep) = 1 - dropped / 65536
    return x.mul(keep).mul_(_DRAWS / (_DRAWS - dropped))


def _uniform_int16(shape: torch.Size) -> Tensor:
    """Uniform int16 values of `shape`: four from each full-range 64-bit draw of the default generator."""
    count = shape.numel()
    words = torch.empty((count + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    return words.view(torch.int16)[:count].view(shape)


def fused_attention_pays(q: Tensor, p: float) -> bool:
    """Whether torch's `scaled_dot_product_attention` is the faster path for queries `q` with
    dropout `p` (0 outside training): always off the CPU; on it, only in fp32 without dropout."""
    return q.device.type != "cpu" or (p == 0.0 and q.dtype == torch.float32)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float, training: bool) -> Tensor:
    """`F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p if training else 0)`.

    q, k, v: (B, nh, T, hd); mask: None or boolean, broadcastable to (B, nh, T, S), True for keys
    to attend to.
    """
    p = p if training else 0.0
    if fused_attention_pays(q, p):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, nh, T, T)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return dropout(scores.softmax(-1), p) @ v  # (B, nh, T, hd)


class Dropout(nn.Module):
    """`nn.Dropout` with the CPU mask of `dropout` above."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def cross_entropy_sum(logits: Tensor, labels: Tensor) -> Tensor:
    """`F.cross_entropy(logits.float(), labels, ignore_index=-1, reduction="sum")` for (N, C)
    logits and (N,) class ids, where a negative label counts nothing.

    The float32 softmax runs over a few rows at a time (see the module docstring), and only the
    logits and one float per row are kept for the backward; the result and the gradient are the same
    up to float32 rounding, the gradient then rounded once to the logits' dtype.
    """
    return _RowChunkedCrossEntropySum.apply(logits, labels)


def _row_slices(logits: Tensor) -> list[slice]:
    """Slices of (N, C) `logits` rows, each of at most a chunk's elements (at least one row)."""
    chunk = _CHUNK_ELEMENTS if logits.device.type == "cpu" else _GPU_CHUNK_ELEMENTS
    rows = max(1, chunk // logits.shape[-1])
    return [slice(start, start + rows) for start in range(0, logits.shape[0], rows)]


class _RowChunkedCrossEntropySum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor) -> Tensor:
        log_z = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)  # (N,) logsumexp
        for rows in _row_slices(logits):
            log_z[rows] = logits[rows].float().logsumexp(-1)
        valid = labels >= 0  # (N,)
        labels = labels.clamp(min=0)
        target = logits.gather(-1, labels[:, None]).squeeze(-1).float()  # (N,)
        ctx.save_for_backward(logits, log_z, labels, valid)
        return torch.where(valid, log_z - target, 0.0).sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor) -> tuple[Tensor, None]:
        logits, log_z, labels, valid = ctx.saved_tensors
        weight = grad_loss * valid  # (N,) float32: no gradient for unlabelled rows
        grad = torch.empty_like(logits)  # (N, C): weight * (softmax - one_hot(label))
        for rows in _row_slices(logits):
            probs = (logits[rows] - log_z[rows, None]).exp_()  # float32; fp32 logits stay untouched
            # the one-hot comes off in float32: p - 1 rounded once, not p and then the difference
            probs[torch.arange(probs.shape[0], device=probs.device), labels[rows]] -= 1.0
            grad[rows] = probs.mul_(weight[rows, None])
        return grad, None
