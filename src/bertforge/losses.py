"""The pretraining objective (Devlin et al. 2019, section 3.1): MLM over masked positions plus NSP.

The MLM head already ran only on the masked positions, so its logits are (M, V) and the labels
(M,); a position labelled NO_LABEL (-1: padding that gives compiled batches fixed shapes) counts
nothing. NSP uses Hugging Face's labels (0: B follows A, 1: B is random); pairs without an NSP
label (-1, the MLM-only setting) are ignored. Sums are returned alongside counts so that evaluation
can weight every token and pair equally across batches of different sizes. Everything stays on the
device: no value is built on the host in the step, which would make a GPU wait for the CPU.

Also owns `Summary`, the loss and metrics that every objective (this one, GPT's next token in
`gpt`, classification in `finetune`) makes of its accumulated sums, `token_prediction_metrics`,
the loss, perplexity and accuracy that MLM and next-token prediction share, and `real_token_logits`,
which leaves a padded vocabulary's unused output rows out of every softmax.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from bertforge.fast_ops import cross_entropy_sum

NO_LABEL = -1


def real_token_logits(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`logits` (..., rows) without the rows past the tokenizer's `vocab_size` tokens.

    A padded vocabulary (an embedding matrix rounded up to a multiple of 8 or 64) has rows that no
    token uses: left in, they would take probability from the real tokens and could win the argmax.
    """
    assert logits.shape[-1] >= vocab_size, "the model has fewer output rows than the tokenizer has tokens"
    return logits if logits.shape[-1] == vocab_size else logits[..., :vocab_size]


def top1_hits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(N,) float: 1 where the label's logit is the largest of its row, 1/k where k logits tie for the
    largest (the chance that argmax's tie-break picks the label; bf16 logits tie often), else 0.
    logits (N, V); labels (N,), negative ones read as 0. Max reductions are far cheaper than argmax
    over bf16 logits on CPU."""
    top = logits.amax(-1, keepdim=True)  # (N, 1)
    label_logits = logits.gather(-1, labels.clamp(min=0)[:, None])  # (N, 1)
    ties = (logits == top).sum(-1)  # (N,), at least 1
    return (label_logits >= top).squeeze(-1).float() / ties


def pretraining_sums(
    mlm_logits: torch.Tensor,
    masked_labels: torch.Tensor,
    nsp_logits: torch.Tensor,
    nsp_labels: torch.Tensor,
    vocab_size: int,
) -> dict[str, torch.Tensor]:
    """Summed losses and correct counts, all as 0-d tensors (no host synchronisation); the MLM
    softmax runs over the tokenizer's `vocab_size` tokens only (`real_token_logits`)."""
    mlm_logits = real_token_logits(mlm_logits, vocab_size)  # (M, V)
    nsp_logits = nsp_logits.float()  # (B, 2)
    has_mlm = masked_labels != NO_LABEL  # (M,)
    has_nsp = nsp_labels != NO_LABEL  # (B,)
    return {
        "mlm_loss_sum": cross_entropy_sum(mlm_logits, masked_labels),
        "mlm_correct": (top1_hits(mlm_logits, masked_labels) * has_mlm).sum(),
        "mlm_count": has_mlm.sum(),
        "nsp_loss_sum": F.cross_entropy(nsp_logits, nsp_labels, ignore_index=NO_LABEL, reduction="sum"),
        "nsp_correct": ((nsp_logits.argmax(-1) == nsp_labels) & has_nsp).sum(),
        "nsp_count": has_nsp.sum(),
    }


def pretraining_loss(sums: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean MLM loss over masked tokens plus mean NSP loss over labelled pairs (0 when NSP is off)."""
    mlm = sums["mlm_loss_sum"] / sums["mlm_count"].clamp(min=1)
    nsp = sums["nsp_loss_sum"] / sums["nsp_count"].clamp(min=1)
    return mlm + nsp


class Summary(NamedTuple):
    """Sums accumulated over batches, summarized: the loss over every token and pair of the window (a
    log line's `loss`; a step minimises its micro-batches' mean losses, each weighing the same, as
    Google's BERT does across TPU cores) and the metrics reported beside it."""

    loss: float
    metrics: dict[str, float]


def token_prediction_metrics(totals: dict[str, float], prefix: str) -> dict[str, float]:
    """Accumulated `{prefix}_loss_sum`, `{prefix}_correct` and `{prefix}_count` of a token-predicting
    objective ("mlm" or "clm") -> its mean loss `{prefix}_loss`, perplexity and `{prefix}_accuracy`."""
    count = max(totals[f"{prefix}_count"], 1.0)
    loss = totals[f"{prefix}_loss_sum"] / count
    return {
        f"{prefix}_loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        f"{prefix}_accuracy": totals[f"{prefix}_correct"] / count,
    }


def summarize_pretraining(totals: dict[str, float]) -> Summary:
    """Accumulated `pretraining_sums` -> the MLM loss plus the NSP loss (as `pretraining_loss`), and the
    metrics (NSP ones only when pairs had NSP labels)."""
    metrics = token_prediction_metrics(totals, "mlm")
    mlm_loss = metrics["mlm_loss"]
    if totals["nsp_count"] == 0:
        return Summary(mlm_loss, metrics)
    metrics["nsp_loss"] = totals["nsp_loss_sum"] / totals["nsp_count"]
    metrics["nsp_accuracy"] = totals["nsp_correct"] / totals["nsp_count"]
    return Summary(mlm_loss + metrics["nsp_loss"], metrics)
