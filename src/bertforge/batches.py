"""Batch-level datasets: which examples form micro-batch `b` of epoch `e`, and the seed its masking uses.

Item `b` is a whole collated batch, so a `DataLoader(batch_size=None)` can prefetch in workers
while every batch stays a pure function of (seed, epoch, b). That is what lets `--resume`
continue with exactly the batches the uninterrupted run would have seen, whatever the number of
workers, and lets evaluation use one fixed mask every time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch
from torch.utils.data import Dataset

from bertforge.config import DataConfig, max_predictions
from bertforge.masking import MaskingCollator


def batch_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed 63-bit seed for one batch (SeedSequence avoids correlated nearby seeds)."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(2, np.uint64)[0] >> np.uint64(1))


class MaskedBatches(Dataset):
    """Consecutive slices of `examples` (already shuffled for the epoch), collated with a per-batch seed."""

    def __init__(
        self,
        examples: Sequence[dict],
        batch_size: int,
        collate: Callable[..., dict[str, torch.Tensor]],
        seed: int,
        epoch: int,
        drop_last: bool = True,
    ) -> None:
        self.examples = examples
        self.batch_size = batch_size
        self.collate = collate
        self.seed = seed
        self.epoch = epoch
        full, rest = divmod(len(examples), batch_size)
        self.num_batches = full if drop_last or not rest else full + 1

    def __len__(self) -> int:
        return self.num_batches

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.num_batches:
            raise IndexError(index)
        start = index * self.batch_size
        stop = min(start + self.batch_size, len(self.examples))
        generator = torch.Generator().manual_seed(batch_seed(self.seed, self.epoch, index))
        return self.collate([self.examples[i] for i in range(start, stop)], generator=generator)


def pretraining_collator(
    tokenizer, data: DataConfig, mlm_probability: float | None = None
) -> MaskingCollator:
    """The masking collator for a tokenizer and data settings (evaluation passes its fixed rate)."""
    if mlm_probability is not None:
        data = replace(data, mlm_probability=mlm_probability, max_predictions_per_seq=0)
    return MaskingCollator(
        vocab_size=tokenizer.vocab_size,
        pad_id=tokenizer.pad_id,
        mask_id=tokenizer.mask_id,
        special_ids=tokenizer.special_ids,
        mlm_probability=data.mlm_probability,
        max_predictions=max_predictions(data),
        whole_word_mask=data.whole_word_masking,
        continuation_mask=tokenizer.continuation_mask() if data.whole_word_masking else None,
    )
