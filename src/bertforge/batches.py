"""Batch-level datasets: which examples form micro-batch `b` of epoch `e`, and the seed its masking uses.

Item `b` is a whole collated batch, so a `DataLoader(batch_size=None)` can prefetch in workers
while every batch stays a pure function of (seed, epoch, b). That is what lets `--resume`
continue with exactly the batches the uninterrupted run would have seen, whatever the number of
workers, and lets evaluation use one fixed mask every time.

`shape_batch` then fits a collated batch to the model's kernels, on the host: a batch without
padding carries no attention mask (attention may then use its flash kernel), and for
`torch.compile` every batch has one fixed shape, so the model compiles once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from bertforge.config import DataConfig, max_predictions
from bertforge.losses import NO_LABEL
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


def real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens of a (host) batch that are not padding."""
    if "attention_mask" not in batch:
        return batch["input_ids"].numel()
    return int(batch["attention_mask"].sum())


def shape_batch(
    batch: dict[str, torch.Tensor], pad_id: int, width: int | None = None, masked: int | None = None
) -> dict[str, torch.Tensor]:
    """A collated batch shaped for the model.

    Without `width` (eager mode) a batch without padding loses its `attention_mask`, so attention
    can use its fastest (flash) kernel. With `width` (torch.compile, which compiles anew for every
    new shape) the sequences are padded to `width` tokens and, given `masked`, the masked positions
    to `masked` entries: the extra ones point at position 0 with label NO_LABEL, which the loss
    ignores. The mask then always stays, so one compiled graph serves every batch.
    """
    if width is None:
        if batch["attention_mask"].all():
            return {key: value for key, value in batch.items() if key != "attention_mask"}
        return batch
    length = batch["input_ids"].shape[1]
    shaped = dict(batch)
    for key, fill in (("input_ids", pad_id), ("token_type_ids", 0), ("attention_mask", 0)):
        shaped[key] = F.pad(batch[key], (0, width - length), value=fill)  # (B, width)
    if masked is not None:
        positions = batch["masked_positions"]  # (M,) flat indices into (B, length)
        positions = positions // length * width + positions % length  # the same tokens in (B, width)
        extra = masked - positions.numel()
        shaped["masked_positions"] = F.pad(positions, (0, extra), value=0)
        shaped["masked_labels"] = F.pad(batch["masked_labels"], (0, extra), value=NO_LABEL)
    return shaped


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
    tokenizer, data: DataConfig, mlm_probability: float | None = None, fixed_shapes: bool = False
) -> PretrainingCollator:
    """The collator for a tokenizer and data settings (evaluation passes its fixed rate); with
    `fixed_shapes` (for torch.compile) every batch of a given size has the same shapes."""
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
    )
    if not fixed_shapes:
        return PretrainingCollator(masking)
    return PretrainingCollator(masking, data.max_seq_length, max_predictions(data))
