"""(1) Training-step throughput: bertforge vs `transformers.BertForPreTraining`, same batch and step.

A step is what both training loops do: forward under autocast, backward, gradient clipping at 1.0
and a fused AdamW update (Hugging Face's Trainer default optimizer for torch >= 2.8). Both models
start from the same weights and see the same full-length batch of 128-token pairs with 15% of the
tokens masked and NSP labels; each computes its own loss the way its library does (bertforge: the
MLM head on the masked positions; Hugging Face: on every position with -100 labels elsewhere).

Attention follows the same rule for both: the batch has no padding, so neither is given an attention
mask (Hugging Face would drop an all-ones one itself in eager mode, not under torch.compile), and
Hugging Face's attention is pinned to torch's SDPA. Each row names the SDPA kernel each one ran.
On CUDA each is also given as MFU: the FLOPs the step must do (`bertforge.flops`, the MLM head on
the masked positions) per second over the GPU's dense bf16 peak; Hugging Face's executed MFU counts
the work its dense head really does, on every position. Peak memory is each one's weights and
optimizer state plus the most its steps allocated on top.
"""

from __future__ import annotations

import statistics

import numpy as np
import torch

from benchmarks.common import (
    MASK_RATE,
    SEQ_LEN,
    Bench,
    attention_kernels,
    hf_labels,
    hf_loss,
    hf_model,
    interleaved,
    median_ratio,
    model_config,
    resident_bytes,
)
from bertforge import flops
from bertforge.config import ModelConfig, TrainConfig
from bertforge.masking import MaskingCollator
from bertforge.model import BertForPreTraining
from bertforge.optimizer import build_optimizer
from bertforge.pretrain import masked_lm_and_nsp_loss
from bertforge.runtime import autocast

SPECIAL_IDS = (0, 1, 2, 3, 4)  # [PAD] [UNK] [CLS] [SEP] [MASK], as bertforge's tokenizers
CLS, SEP, MASK = 2, 3, 4


def full_length_batch(
    vocab_size: int, batch_size: int, seq_len: int = SEQ_LEN, seed: int = 0, padding: float = 0.0
) -> dict:
    """`[CLS] A [SEP] B [SEP]` of random ordinary tokens filling `seq_len`, masked by bertforge's collator.

    `padding` > 0 shortens the rows (all but the first) by a uniform draw of up to twice that share
    of `seq_len`, so that about that share of the batch's positions is padding.
    """
    rng = np.random.default_rng(seed)
    examples = []
    for row in range(batch_size):
        cut = 0 if row == 0 else int(rng.integers(0, int(2 * padding * seq_len) + 1))
        length = max(seq_len - cut, 8)
        half = (length - 3) // 2
        words = rng.integers(len(SPECIAL_IDS), vocab_size, length - 3)
        ids = [CLS, *words[:half], SEP, *words[half:], SEP]
        types = [0] * (half + 2) + [1] * (length - half - 2)
        examples.append({"input_ids": ids, "token_type_ids": types, "nsp_label": row % 2})
    collate = MaskingCollator(
        vocab_size, pad_id=0, mask_id=MASK, special_ids=SPECIAL_IDS, mlm_probability=MASK_RATE,
        max_predictions=int(np.ceil(MASK_RATE * seq_len)),
    )  # fmt: skip
    batch = collate(examples, generator=torch.Generator().manual_seed(seed))
    batch["hf_labels"], _ = hf_labels(batch)
    if batch["attention_mask"].all():  # no padding: no mask for either model
        del batch["attention_mask"]
    return batch


def make_step(
    model: torch.nn.Module, loss_fn, batch: dict, precision: str, device: torch.device, compile: bool
):
    """One optimizer step of `model` on `batch`, as a closure (the model compiled first if asked),
    and its optimizer."""
    optimizer = build_optimizer(model, TrainConfig(), device)
    model.train()
    if compile:
        model = torch.compile(model)

    def step() -> None:
        with autocast(device, precision):
            loss = loss_fn(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, optimizer


def ours_loss(model, batch):
    return masked_lm_and_nsp_loss(model, batch, model.config.vocab_size)[0]


def contenders(config: ModelConfig, with_reference: bool) -> dict[str, tuple[torch.nn.Module, object]]:
    """name -> (model, loss): bertforge's and, if asked, Hugging Face's with the same weights."""
    torch.manual_seed(0)
    ours = BertForPreTraining(config)
    found = {"bertforge": (ours, ours_loss)}
    if with_reference:
        found["hf"] = (hf_model(config, ours.state_dict()), hf_loss)
    return found


def measure(
    preset: str,
    precision: str,
    batch_size: int,
    bench: Bench,
    timing: tuple[int, int, int],
    with_reference: bool = True,
    vocab_size: int = 30522,
    seq_len: int = SEQ_LEN,
    dropout: float | None = None,
    kernels: bool = True,
) -> dict:
    """Tokens/s of both (or only bertforge), the speed-up, each as a fraction of the machine's limit
    and on CUDA as MFU, each one's peak memory and attention kernel.

    `timing` is (warm-up steps, rounds, steps per round) for each contender; `dropout`, if given,
    replaces the preset's hidden and attention dropout (0.1) in both models; `kernels`: name the
    attention kernel each ran (one more step each, under the profiler).
    """
    config, device = model_config(preset, vocab_size), bench.device
    if dropout is not None:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = dropout
    batch = {k: v.to(device) for k, v in full_length_batch(config.vocab_size, batch_size, seq_len).items()}
    made = {
        name: (model, *make_step(model.to(device), loss, batch, precision, device, bench.compile))
        for name, (model, loss) in contenders(config, with_reference).items()
    }
    steps = {name: step for name, (_, step, _) in made.items()}
    timing_of = interleaved(steps, *timing, device)
    useful = flops.bert_step_flops(config, batch_size, seq_len, int(batch["masked_positions"].numel()))
    row = {"preset": preset, "precision": precision, "batch": batch_size, "seq_len": seq_len,
           "compiled": bench.compile, "vocab_size": config.vocab_size, "flops_per_step": useful,
           "dropout": config.hidden_dropout_prob, "device": str(device)}  # fmt: skip
    for name, seconds in timing_of.seconds.items():
        model, step, optimizer = made[name]
        median = statistics.median(seconds)
        row[f"{name}_tokens_per_s"] = batch_size * seq_len / median
        row[f"{name}_fraction_of_limit"] = useful / median / bench.rates[precision]
        row[f"{name}_seconds_per_step"] = seconds
        row[f"{name}_first_step_s"] = timing_of.first_step_s[name]
        if kernels:
            row[f"{name}_attention"] = attention_kernels(step, device)
        if bench.peak_flops:
            row[f"{name}_mfu"] = flops.mfu(useful, median, bench.peak_flops)
        if device.type == "cuda":
            held = resident_bytes(model, optimizer) + timing_of.peak_memory[name]
            row[f"{name}_peak_memory_gib"] = held / 2**30
    if with_reference:
        row["speedup"] = median_ratio(timing_of.seconds["hf"], timing_of.seconds["bertforge"])
        if bench.peak_flops:  # Hugging Face's dense head runs on every position
            executed = flops.bert_step_flops(config, batch_size, seq_len, batch_size * seq_len)
            row["hf_executed_mfu"] = flops.mfu(
                executed, statistics.median(timing_of.seconds["hf"]), bench.peak_flops
            )
    return row


def run(
    presets, precisions, seq_lens, batch_size: int, bench: Bench, timing: tuple[int, int, int], dropout=None
) -> list:
    rows = []
    for preset in presets:
        for seq_len in seq_lens:
            for precision in precisions:
                bench.log(f"step: {preset} {precision}, batch {batch_size} x {seq_len}")
                rows.append(
                    measure(preset, precision, batch_size, bench, timing, seq_len=seq_len, dropout=dropout)
                )
    return rows
