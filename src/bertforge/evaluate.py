"""Held-out pretraining metrics: for BERT MLM loss, perplexity, MLM accuracy, NSP loss and NSP
accuracy; for GPT (`model.objective = "clm"`) next-token loss, perplexity and top-1 accuracy; and
the text's unigram entropy as the reference a loss must get below.

Evaluation always masks 15% of the tokens, one token at a time, and draws its pairs (Google's
short-pair rate, or windows across documents) or a GPT's packed windows with fixed seeds, whatever
the training settings, so two evaluations of one model on one text agree exactly and the numbers of
different runs compare. What it takes from the run is what shapes the model's input: the sequence
length, pairs or windows (NSP or not), and the cap on pairs. On a GPU it runs in the GPU's mixed
precision unless told otherwise (`evaluation_precision`); on a CPU in fp32.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from bertforge.batches import SeededBatches
from bertforge.cache import cached_shards, default_cache_dir
from bertforge.config import DataConfig
from bertforge.config_rules import trains_nsp
from bertforge.errors import BertforgeError
from bertforge.folders import open_pretrained
from bertforge.gpt import GPTLMHeadModel, next_token_sums, summarize_clm
from bertforge.losses import pretraining_sums, real_token_logits, summarize_pretraining
from bertforge.masking import pretraining_collator
from bertforge.packing import end_positions, packed_batches
from bertforge.pairs import FEW_PAIRS, PairDataset, build_pairs, nsp_share
from bertforge.precision import native_bf16
from bertforge.progress import passing_bar, progress_bar
from bertforge.runtime import autocast, eval_mode, resolve_device, to_device, to_host
from bertforge.shards import TokenShards, holds_token_outside, token_counts
from bertforge.tokenizer import BertTokenizer

EVAL_SEED = 20181011  # the date of the BERT paper, for a seed nobody tunes
EVAL_MASK_RATE = 0.15
EVAL_BATCH_SIZE = 64
EVAL_SHORT_SEQ_PROB = DataConfig.short_seq_prob  # Google's 0.1, whatever the run trained with


def evaluation_batches(
    shards: TokenShards,
    tokenizer: BertTokenizer,
    data: DataConfig,
    objective: str = "mlm",
    text: str = "the evaluation text",
    otherwise: str = "",
) -> list[dict]:
    """The fixed pairs and masks every evaluation of this text uses (at most `data.eval_max_pairs`);
    for "clm", the fixed packed windows (as many at most). `text` names the text in the errors, and
    `otherwise` what else the caller can do about one too small."""
    check_evaluation_text(shards, tokenizer, data, objective, text, otherwise)
    if objective == "clm":
        length, limit = data.max_seq_length, data.eval_max_pairs
        windows = packed_batches(
            shards, length, tokenizer.sep_id, EVAL_BATCH_SIZE, EVAL_SEED, 0, limit, drop_last=False
        )
        return [windows[i] for i in range(len(windows))]
    length, nsp = data.max_seq_length, data.nsp
    pairs = build_pairs(shards, length, EVAL_SHORT_SEQ_PROB, nsp, EVAL_SEED, 0, cross_documents=True)
    if data.eval_max_pairs:
        pairs = pairs[: data.eval_max_pairs]
    if nsp and (share := nsp_share(pairs)) < FEW_PAIRS:
        warnings.warn(
            f"{share:.0%} of the sequences of {text} are next-sentence pairs: nearly every document of it "
            "has one sentence (each line or row of a table is one), which is scored on MLM alone, so its "
            "NSP figures rest on few pairs, or none; evaluate NSP on text of longer documents",
            stacklevel=3,
        )
    examples = PairDataset(shards, pairs, tokenizer.cls_id, tokenizer.sep_id)
    token_masking = replace(data, whole_word_masking=False)
    collate = pretraining_collator(tokenizer, token_masking, mlm_probability=EVAL_MASK_RATE)
    batches = SeededBatches(examples, EVAL_BATCH_SIZE, collate, EVAL_SEED, epoch=0, drop_last=False)
    return [batches[i] for i in range(len(batches))]


def check_evaluation_text(
    shards: TokenShards,
    tokenizer: BertTokenizer,
    data: DataConfig,
    objective: str,
    text: str,
    otherwise: str = "",
) -> None:
    """Refuse a text too small to evaluate on, or one the tokenizer reads as nothing but `[UNK]`
    (no token could be masked, and a GPT would score by predicting `[UNK]` after `[UNK]`), naming it
    (the training text's messages would speak of the corpus and its settings)."""
    if not holds_token_outside(shards, tokenizer.special_ids):
        raise BertforgeError(
            f"the tokenizer reads {text} as nothing but [UNK]: its characters are not in the vocabulary; "
            "evaluate on text in the language and script the tokenizer was trained on"
        )
    documents = int(np.count_nonzero(np.diff(np.asarray(shards.document_offsets)) > 0))
    if objective == "clm" and shards.num_tokens + documents < data.max_seq_length:
        raise BertforgeError(
            f"{text} has {shards.num_tokens} tokens, fewer than one sequence of {data.max_seq_length}; "
            "give more text to evaluate on"
        )
    if objective == "mlm" and data.nsp and documents < 2:
        raise BertforgeError(
            f"{text} has one document, and next sentence prediction takes its random sentences from "
            "others: give text of several documents (blank lines between them, one JSON object or table "
            "row each, or a -DOCSTART- line before each in CoNLL)" + otherwise
        )


def unigram_entropy(shards: TokenShards, tokenizer: BertTokenizer, objective: str = "mlm") -> float:
    """Entropy (nats) of the frequencies of the tokens the objective predicts: for MLM the text's
    tokens but the special ones (masking never picks them); for a GPT ("clm") the stream its windows
    are cut from, `[UNK]` and one `[SEP]` after each document included.

    The held-out loss of a model that knows only how often each token occurs: a loss below it means
    the model uses the context.
    """
    if objective == "clm":
        counts = token_counts(shards).astype(np.float64)
        counts[tokenizer.sep_id] += end_positions(shards).size
    else:
        counts = token_counts(shards, exclude=tokenizer.special_ids).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def pretraining_batch_sums(model: torch.nn.Module, batch: dict, vocab_size: int) -> dict[str, torch.Tensor]:
    """BERT's MLM and NSP sums over one batch, predicting the tokenizer's `vocab_size` tokens (`model`
    may be wrapped: DDP, torch.compile)."""
    mlm_logits, nsp_logits = model(
        batch["input_ids"],
        token_type_ids=batch["token_type_ids"],
        attention_mask=batch.get("attention_mask"),  # absent when the batch has no padding
        masked_positions=batch["masked_positions"],
    )  # (M, V), (B, 2)
    return pretraining_sums(mlm_logits, batch["masked_labels"], nsp_logits, batch["nsp_labels"], vocab_size)


def next_token_batch_sums(model: torch.nn.Module, batch: dict, vocab_size: int) -> dict[str, torch.Tensor]:
    """GPT's next-token sums over one batch of packed windows (no padding: every position but the
    last has a target), predicting the tokenizer's `vocab_size` tokens."""
    logits = real_token_logits(model(batch["input_ids"]), vocab_size)  # (B, T, V)
    return next_token_sums(logits, batch["input_ids"])


@torch.inference_mode()
def pretraining_metrics(
    model: torch.nn.Module,
    batches: list[dict],
    vocab_size: int,
    precision: str = "fp32",
    show_progress: bool = False,
    passing: bool = False,
) -> dict[str, float]:
    """Token- and pair-weighted metrics over all batches, on the model's device (a GPT's: next-token),
    over the tokenizer's `vocab_size` tokens; `show_progress`: a bar over the batches (`passing`: on a
    terminal only, gone when done, as inside a pretraining run)."""
    if isinstance(model, GPTLMHeadModel):
        batch_sums, summarize_totals = next_token_batch_sums, summarize_clm
    else:
        batch_sums, summarize_totals = pretraining_batch_sums, summarize_pretraining
    device = next(model.parameters()).device
    totals: dict[str, torch.Tensor] = {}
    with eval_mode(model):
        if passing and show_progress:
            shown = passing_bar(batches, total=len(batches), unit="batch", desc="evaluating")
        else:
            shown = progress_bar(
                batches, total=len(batches), unit="batch", desc="evaluating", disable=not show_progress
            )
        for batch in shown:
            batch = to_device(batch, device)
            with autocast(device, precision):
                sums = batch_sums(model, batch, vocab_size)
            for key, value in sums.items():
                totals[key] = totals.get(key, 0) + value
    keys = sorted(totals)
    return summarize_totals(dict(zip(keys, to_host([totals[key] for key in keys]), strict=True))).metrics


def evaluation_precision(precision: str, device: torch.device) -> str:
    """`precision`, where "auto" means on CUDA the GPU's autocast precision (bf16 where it computes it
    natively, else fp16: without a backward no loss scaler is needed), elsewhere fp32."""
    if precision != "auto":
        return precision
    if device.type != "cuda":
        return "fp32"
    return "bf16" if native_bf16(device) else "fp16"


def evaluate_model(
    model_path: Path,
    corpus: Path,
    format: str = "auto",
    device: str = "auto",
    precision: str = "auto",
    max_pairs: int | None = None,
    max_length: int | None = None,
    cache_dir: Path | None = None,
    show_progress: bool = True,
    text_column: str | None = None,
    nsp: bool | None = None,
) -> dict[str, float]:
    """Evaluate a saved model (run folder, `final/`, checkpoint, imported or exported folder) on a
    corpus with its own tokenizer, at its training sequence length unless `max_length` is given, on
    the kind of sequences it trained on unless `nsp` says: sentence pairs (True) or contiguous
    windows (False), to compare a model trained with NSP and one without on the same text.

    Returns the metrics (NSP's only from a model that trained its NSP head) and, as a reference for
    `mlm_loss`, the text's `unigram_entropy`. `precision`: see `evaluation_precision`. `text_column`: a
    JSON-lines or Parquet corpus's text field, by default the one the model's run read."""
    model, tokenizer, config = open_pretrained(model_path, needs=("mlm",))
    data = config.data
    trained_nsp = trains_nsp(config)  # all along, or in the sequence-length warmup
    if nsp is not None:
        if config.model.objective == "clm":
            raise BertforgeError(
                "a GPT is evaluated on packed windows, not BERT's pairs; drop --nsp/--no-nsp"
            )
        data.nsp = nsp
    if max_length is not None:
        if not 8 <= max_length <= config.model.max_position_embeddings:
            raise BertforgeError(
                f"`max_length` must be between 8 and the model's {config.model.max_position_embeddings} "
                f"positions, got {max_length}"
            )
        data.max_seq_length = max_length
    if max_pairs is not None:
        data.eval_max_pairs = max_pairs
    shards = cached_shards(
        Path(corpus),
        tokenizer,
        format,
        cache_dir or default_cache_dir(),
        show_progress,
        text_column or data.text_column,
    )
    without_nsp = ", or evaluate MLM alone on windows of the text (nsp=False, the command's --no-nsp)"
    batches = evaluation_batches(shards, tokenizer, data, config.model.objective, str(corpus), without_nsp)
    where = resolve_device(device)
    model.to(where)
    precision = evaluation_precision(precision, where)
    metrics = pretraining_metrics(model, batches, tokenizer.vocab_size, precision, show_progress)
    if not trained_nsp:  # its NSP head kept its random weights
        metrics = {key: value for key, value in metrics.items() if not key.startswith("nsp_")}
        if nsp:
            warnings.warn(
                f"{model_path} was pretrained without NSP (data.nsp = false), so its NSP head is untrained "
                "and has no figures; --nsp gives its MLM figures on sentence pairs",
                stacklevel=2,
            )
    return {**metrics, "unigram_entropy": unigram_entropy(shards, tokenizer, config.model.objective)}
