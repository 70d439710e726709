"""Batches for pretraining: dynamic masked-language-model masking.

Owns `MaskingCollator`, which pads a batch (`batches.pad_batch`) with its NSP labels and masks it
afresh (dynamic masking, as RoBERTa does, instead of Google's masking once at data preparation and
copying the data `dupe_factor` times), and `PretrainingCollator`, which then shapes it for the
model (`batches.shape_batch`).

The masking rule is BERT's (Devlin et al. 2019, section 3.1 and appendix A.1; Google's
`create_masked_lm_predictions` in `create_pretraining_data.py`): per sequence, k =
min(max_predictions, max(1, round(mlm_probability * n))) of its n candidate tokens (neither special
tokens, [UNK] among them since predicting it teaches nothing, nor padding; Google masks [UNK] too and
counts [CLS] and [SEP] in n) are chosen uniformly; of those, 80% become [MASK], 10% a random
non-special token (Google's may be any of the vocabulary) and 10% stay unchanged. Google's whole-word variant
takes words (a head token and its `##` continuations) in random order and skips any word that
would take the count past k; here a `##` piece with no head before it in its segment (after
`[SEP]`, `[UNK]` or a truncation) is a word of its own, where Google's joins it to the word before
the `[SEP]`. With token weights (`subsampling_weights`), the words are drawn
without replacement in proportion to their head token's weight instead of uniformly (weighted
sampling by exponential keys, Efraimidis & Spirakis 2006); k does not change.

The masked positions are returned as flat indices into the (B, T) batch so the model projects
only those through the vocabulary (sparse MLM head). Every random draw comes from the
`torch.Generator` passed in, so a batch is reproducible from the generator's seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from bertforge.batches import pad_batch, shape_batch
from bertforge.config import DataConfig, max_predictions
from bertforge.errors import BertforgeError
from bertforge.losses import NO_LABEL


class MaskingCollator:
    """Pads a list of examples and masks them for MLM; use as a DataLoader `collate_fn`.

    Returns `pad_batch`'s tensors, with masked ids in `input_ids`, plus `nsp_labels` (B,): each
    example's `nsp_label` (default -1, none), `masked_positions` (M,): sorted flat indices into the
    (B, T) batch, and `masked_labels` (M,): the original ids there.
    """

    def __init__(
        self,
        vocab_size: int,
        pad_id: int,
        mask_id: int,
        special_ids: Sequence[int],
        mlm_probability: float = 0.15,
        max_predictions: int = 20,
        whole_word_mask: bool = False,
        continuation_mask: np.ndarray | None = None,
        token_weights: np.ndarray | None = None,
    ):
        assert 0.0 < mlm_probability < 1.0, f"mlm_probability {mlm_probability} (config.validate checks it)"
        assert max_predictions >= 1, f"max_predictions {max_predictions}"
        special = np.zeros(vocab_size, dtype=bool)  # (V,)
        special[np.asarray(list(special_ids), dtype=np.int64)] = True
        special[[pad_id, mask_id]] = True
        if special.all():
            raise BertforgeError("the vocabulary has no ordinary tokens to mask; train a larger vocabulary")
        self.pad_id = pad_id
        self.mask_id = mask_id
        self.mlm_probability = mlm_probability
        self.max_predictions = max_predictions
        self._special = torch.from_numpy(special)  # (V,)
        self._replacements = torch.from_numpy(np.flatnonzero(~special))  # (V',) random-token pool
        self._weights = None
        if token_weights is not None:
            weights = np.asarray(token_weights, dtype=np.float64)
            if weights.shape != (vocab_size,) or not (weights > 0).all():
                raise BertforgeError(
                    f"token_weights has shape {weights.shape}, expected ({vocab_size},) positive "
                    "weights: one per vocabulary id, from the same tokenizer"
                )
            self._weights = torch.from_numpy(weights)  # (V,)
        self._continuation = None
        if whole_word_mask:
            if continuation_mask is None:
                raise BertforgeError(
                    "whole-word masking needs the tokenizer's continuation mask (True for '##' pieces); "
                    "pass continuation_mask or set data.whole_word_masking = false"
                )
            continuation = np.asarray(continuation_mask, dtype=bool)
            if continuation.shape != (vocab_size,):
                raise BertforgeError(
                    f"continuation_mask has shape {continuation.shape}, expected ({vocab_size},): one flag "
                    "per vocabulary id; it must come from the same tokenizer"
                )
            self._continuation = torch.from_numpy(continuation & ~special)  # (V,)

    def __call__(
        self, examples: list[dict], generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        batch = pad_batch(examples, self.pad_id)
        batch["nsp_labels"] = torch.tensor([int(example.get("nsp_label", NO_LABEL)) for example in examples])
        input_ids = batch["input_ids"]  # (B, T)
        candidates = batch["attention_mask"].bool() & ~self._special[input_ids]  # (B, T)
        count = candidates.sum(1)  # (B,)
        # k = min(max_predictions, max(1, round(p * n))), and never more than there are candidates.
        k = torch.round(count.double() * self.mlm_probability).long().clamp(min=1, max=self.max_predictions)
        k = torch.minimum(k, count)  # (B,)

        if self._continuation is not None:
            # A word starts at a candidate that is not a '##' piece, or that follows a non-candidate
            # (a '##' piece right after [SEP] or a truncation has no head to join).
            previous = torch.zeros_like(candidates)
            previous[:, 1:] = candidates[:, :-1]
            heads = candidates & (~self._continuation[input_ids] | ~previous)  # (B, T)
        else:
            heads = candidates
        token_weights = None if self._weights is None else self._weights[input_ids]  # (B, T)
        selected = _choose_words(candidates, heads, k, generator, token_weights)  # (B, T)

        flat = input_ids.view(-1)  # (B*T,)
        masked_positions = selected.view(-1).nonzero().squeeze(1)  # (M,) sorted
        masked_labels = flat[masked_positions]  # (M,)
        action = torch.rand(masked_positions.numel(), generator=generator)  # (M,)
        pick = torch.randint(self._replacements.numel(), (masked_positions.numel(),), generator=generator)
        random_ids = self._replacements[pick]  # (M,)
        replaced = torch.where(action < 0.8, torch.full_like(masked_labels, self.mask_id), masked_labels)
        replaced = torch.where((action >= 0.8) & (action < 0.9), random_ids, replaced)  # (M,)
        flat[masked_positions] = replaced

        batch["masked_positions"] = masked_positions
        batch["masked_labels"] = masked_labels
        return batch


class PretrainingCollator:
    """Masks a batch (`MaskingCollator`), then shapes it (`shape_batch`); fixed shapes when `width`
    is given, with room for `masked_per_row` masked positions per sequence."""

    def __init__(self, masking: MaskingCollator, width: int | None = None, masked_per_row: int = 0) -> None:
        self.masking = masking
        self.width = width
        self.masked_per_row = masked_per_row

    def __call__(
        self, examples: list[dict], generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        batch = self.masking(examples, generator=generator)
        masked = len(examples) * self.masked_per_row if self.width else None
        return shape_batch(batch, self.masking.pad_id, self.width, masked)


def pretraining_collator(
    tokenizer,
    data: DataConfig,
    mlm_probability: float | None = None,
    fixed_shapes: bool = False,
    masked_room: int = 0,
    token_weights: np.ndarray | None = None,
) -> PretrainingCollator:
    """The collator for a tokenizer and data settings (evaluation passes its fixed rate, and no
    `token_weights`: it masks every token alike); with `fixed_shapes` (for torch.compile) every
    batch of a given size has the same shapes, with room for `masked_room` masked positions per
    sequence (0: the most this rate masks)."""
    if mlm_probability is not None:
        data = replace(data, mlm_probability=mlm_probability, max_predictions_per_seq=0)
    masking = MaskingCollator(
        vocab_size=tokenizer.vocab_size,
        pad_id=tokenizer.pad_id,
        mask_id=tokenizer.mask_id,
        special_ids=tokenizer.special_ids,
        mlm_probability=data.mlm_probability,
        max_predictions=max_predictions(data),
        whole_word_mask=data.whole_word_masking,
        continuation_mask=tokenizer.continuation_mask() if data.whole_word_masking else None,
        token_weights=token_weights,
    )
    if not fixed_shapes:
        return PretrainingCollator(masking)
    return PretrainingCollator(masking, data.max_seq_length, masked_room or max_predictions(data))


def subsampling_weights(counts: np.ndarray, threshold: float) -> np.ndarray:
    """(V,) masking weights from token counts: min(1, sqrt(threshold / p)) for a token of frequency p,
    so tokens more frequent than `threshold` are masked less (word2vec's subsampling of frequent
    words) and rarer ones all alike; a token never seen weighs 1."""
    frequency = counts / max(counts.sum(), 1)
    with np.errstate(divide="ignore"):
        return np.minimum(1.0, np.sqrt(threshold / frequency))


def _choose_words(
    candidates: torch.Tensor,
    heads: torch.Tensor,
    k: torch.Tensor,
    generator: torch.Generator | None,
    token_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Token positions of words chosen in random order, skipping any that would pass k per row.

    A word is a head and the candidates after it up to the next head. Google walks a shuffled word
    list and skips words that no longer fit; here each round takes, in every row, the longest
    prefix of the remaining shuffled words that fits, then drops the words larger than what is
    left. The first remaining word always fits, so the rounds are at most k (one when every word
    is a single token) and the result is exactly Google's walk. With `token_weights` (B, T), a word
    weighs what its head token does, and the order sorts exponential keys -log(u) / weight:
    weighted sampling without replacement.
    Returns a (B, T) bool mask.
    """
    batch_size, width = candidates.shape
    word = (heads.cumsum(1) - 1).clamp(min=0)  # (B, T) word slot of each token
    num_words = heads.sum(1)  # (B,)
    sizes = torch.zeros(batch_size, width, dtype=torch.long)  # (B, T) tokens in each word slot
    sizes.scatter_add_(1, word, candidates.long())
    scores = torch.rand(batch_size, width, generator=generator, dtype=torch.float64)  # (B, T)
    if token_weights is not None:
        weights = torch.zeros(batch_size, width, dtype=torch.float64)  # (B, T) by word slot
        weights.scatter_add_(1, word, torch.where(heads, token_weights, 0.0))
        scores = -torch.log1p(-scores) / weights.clamp(min=1e-300)  # Exp(weight) keys, u in [0, 1)
    scores.masked_fill_(torch.arange(width) >= num_words[:, None], float("inf"))  # unused slots sort last
    order = scores.argsort(1)  # (B, T) a random order of each row's words
    sorted_sizes = sizes.gather(1, order)  # (B, T)
    budget = k.clone()  # (B,)
    eligible = (sorted_sizes > 0) & (sorted_sizes <= budget[:, None])  # (B, T)
    taken = torch.zeros_like(eligible)
    while eligible.any():
        total = (sorted_sizes * eligible).cumsum(1)  # (B, T)
        take = eligible & (total <= budget[:, None])  # (B, T) the prefix that fits
        taken |= take
        budget -= (sorted_sizes * take).sum(1)
        eligible &= ~take & (sorted_sizes <= budget[:, None])
    chosen = torch.zeros_like(taken).scatter_(1, order, taken)  # (B, T) by word slot
    return candidates & chosen.gather(1, word)
