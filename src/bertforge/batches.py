"""Batches: padding, the epoch's batches as datasets, and shaping for the model's kernels.

`pad_batch` right-pads examples to the longest one, with the attention mask. `Batches` and
`SeededBatches` are datasets whose item `b` is a whole collated batch (consecutive examples of an
epoch already in its order), so a `DataLoader(batch_size=None)` can prefetch in workers while every
batch stays a pure function of its position. `SeededBatches` gives its collator a generator seeded
from (seed, epoch, b), for collators that draw (masking): that is what lets `--resume` continue
with exactly the batches the uninterrupted run would have seen, whatever the number of workers,
and lets evaluation use one fixed mask every time.

`shape_batch` then fits a collated batch to the model's kernels, on the host: a batch without
padding carries no attention mask (attention may then use its flash kernel), and for
`torch.compile` every batch has one fixed shape, so the model compiles once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from bertforge.errors import BertforgeError
from bertforge.losses import NO_LABEL


def batch_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed 63-bit seed for one batch (SeedSequence avoids correlated nearby seeds)."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(2, np.uint64)[0] >> np.uint64(1))


def pad_batch(examples: Sequence[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad examples to the longest one.

    Each example has `input_ids` and optionally `token_type_ids` (default 0). Returns `input_ids`,
    `token_type_ids` and `attention_mask` (1 real, 0 padding), all (B, T) long.
    """
    if not examples:
        raise ValueError("pad_batch needs at least one example")
    lengths = [len(example["input_ids"]) for example in examples]
    batch_size, width = len(examples), max(lengths)
    input_ids = np.full((batch_size, width), pad_id, dtype=np.int64)  # (B, T)
    token_type_ids = np.zeros((batch_size, width), dtype=np.int64)  # (B, T)
    attention_mask = np.zeros((batch_size, width), dtype=np.int64)  # (B, T)
    for row, (example, length) in enumerate(zip(examples, lengths, strict=True)):
        input_ids[row, :length] = example["input_ids"]
        if example.get("token_type_ids") is not None:
            token_type_ids[row, :length] = example["token_type_ids"]
        attention_mask[row, :length] = 1
    return {
        "input_ids": torch.from_numpy(input_ids),
        "token_type_ids": torch.from_numpy(token_type_ids),
        "attention_mask": torch.from_numpy(attention_mask),
    }


def length_order(examples: Sequence[dict]) -> list[int]:
    """The indices of `examples` from the fewest tokens to the most (ties in input order): batches
    cut from this order pad as little as they can."""
    return sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]))


def in_input_order(values: Sequence, order: Sequence[int]) -> list:
    """`values` given for the examples `order` lists (`length_order`), put back in input order."""
    if len(values) != len(order):
        raise ValueError(f"{len(values)} values for {len(order)} examples")
    restored: list = [None] * len(order)
    for value, index in zip(values, order, strict=True):
        restored[index] = value
    return restored


def length_sorted_batches(
    examples: Sequence[dict], batch_size: int, pad_id: int
) -> Iterator[tuple[list[int], dict[str, torch.Tensor]]]:
    """For inference: (row indices, `pad_batch` of those rows) over `examples` in `length_order`, so
    that each batch pads as little as it can; callers put each batch's outputs back in input order
    by its row indices."""
    if batch_size < 1:
        raise BertforgeError(f"batch_size must be at least 1, got {batch_size}")
    order = length_order(examples)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        yield rows, pad_batch([examples[r] for r in rows], pad_id)


class Batches(Dataset):
    """Item b: `collate` of the b-th consecutive slice of `batch_size` examples (a last, smaller
    slice only without `drop_last`)."""

    def __init__(
        self,
        examples: Sequence[dict],
        batch_size: int,
        collate: Callable[[list[dict]], dict[str, torch.Tensor]],
        drop_last: bool = True,
    ) -> None:
        self.examples = examples
        self.batch_size = batch_size
        self.collate = collate
        full, rest = divmod(len(examples), batch_size)
        self.num_batches = full if drop_last or not rest else full + 1

    def __len__(self) -> int:
        return self.num_batches

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.collate(self.slice(index))

    def slice(self, index: int) -> list[dict]:
        if not 0 <= index < self.num_batches:
            raise IndexError(index)
        start = index * self.batch_size
        stop = min(start + self.batch_size, len(self.examples))
        return [self.examples[i] for i in range(start, stop)]


class SeededBatches(Batches):
    """`Batches` whose collator draws from a generator seeded from (seed, epoch, b): called as
    `collate(examples, generator=...)`."""

    def __init__(
        self,
        examples: Sequence[dict],
        batch_size: int,
        collate: Callable[..., dict[str, torch.Tensor]],
        seed: int,
        epoch: int,
        drop_last: bool = True,
    ) -> None:
        super().__init__(examples, batch_size, collate, drop_last)
        self.seed = seed
        self.epoch = epoch

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        examples = self.slice(index)
        generator = torch.Generator().manual_seed(batch_seed(self.seed, self.epoch, index))
        return self.collate(examples, generator=generator)


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
