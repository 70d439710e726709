"""Packed windows for next-token pretraining (`model.objective = "clm"`, GPT-1).

The corpus is read as one stream: every document followed by `[SEP]`, the end-of-text token, so
the model learns where a document ends and that the next one starts afresh. Each sequence is a
window of exactly `max_seq_length` consecutive tokens of that stream: no pairs, no padding, no
masking. An epoch cuts the stream at a random offset (below one window), drawn with the order of
the windows from `(seed, epoch)`, so window boundaries move between epochs and every epoch is a
pure function of the seed: exact resume needs nothing else.

The stream is never built: a window is one slice of the shards' tokens with the `[SEP]`s that fall
inside it inserted, so memory stays flat as the corpus grows. The shards are any object with
`tokens` (sliceable), `sentence_offsets` and `document_offsets`, as `bertforge.pairs` reads them;
prepared shards hold no empty documents, and their documents lie back to back in `tokens`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from bertforge.batches import Batches
from bertforge.errors import BertforgeError


def end_positions(shards: Any) -> np.ndarray:
    """Where each document's `[SEP]` sits in the stream: (D,) int64, increasing."""
    sentence_offsets = np.asarray(shards.sentence_offsets, dtype=np.int64)
    document_offsets = np.asarray(shards.document_offsets, dtype=np.int64)
    document_ends = sentence_offsets[document_offsets[1:]]  # (D,) token index after each document
    return document_ends + np.arange(document_ends.size)  # (D,): one [SEP] more before each later one


def stream_length(shards: Any, length: int) -> int:
    """The stream's tokens (the text's and one [SEP] per document), refused below one window."""
    ends = end_positions(shards)
    total = int(ends[-1]) + 1 if ends.size else 0
    if total < length:
        raise BertforgeError(
            f"the corpus has {total} tokens (with one [SEP] per document), fewer than one sequence of "
            f"data.max_seq_length = {length}; add text or lower data.max_seq_length"
        )
    return total


def offsets_below(total: int, length: int) -> int:
    """An epoch's random offset is below this: under one window, and leaving at least one."""
    return min(length, total - length + 1)


def fewest_windows(shards: Any, length: int) -> int:
    """The windows of the epoch whose offset leaves fewest: what every epoch has at least."""
    total = stream_length(shards, length)
    return (total - offsets_below(total, length) + 1) // length


def window_starts(shards: Any, length: int, seed: int, epoch: int) -> np.ndarray:
    """The stream positions where the windows of one epoch start, in the epoch's order: (N,) int64."""
    total = stream_length(shards, length)
    rng = np.random.default_rng([seed, epoch])
    offset = int(rng.integers(0, offsets_below(total, length)))
    starts = offset + length * np.arange((total - offset) // length)  # (N,)
    return starts[rng.permutation(starts.size)]


class PackedWindows(Dataset):
    """Item i: `{"input_ids": (length,) int64}`, the stream's tokens from `starts[i]`."""

    def __init__(self, shards: Any, starts: np.ndarray, length: int, sep_id: int):
        self.tokens = shards.tokens
        self.ends = end_positions(shards)  # (D,)
        self.starts = np.asarray(starts, dtype=np.int64)
        self.length = length
        self.sep_id = int(sep_id)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> dict:
        start = int(self.starts[index])
        stop = start + self.length
        first, last = np.searchsorted(self.ends, [start, stop])  # the [SEP]s in [start, stop)
        chunk = np.asarray(self.tokens[start - first : stop - last], dtype=np.int64)  # the text tokens
        inside = self.ends[first:last] - start  # (S,) their positions in the window
        # np.insert takes positions in `chunk`: each [SEP] has the earlier ones of the window before it.
        ids = np.insert(chunk, inside - np.arange(inside.size), self.sep_id)  # (length,)
        return {"input_ids": ids}


def collate_windows(examples: list[dict]) -> dict:
    """Windows of one length -> `{"input_ids": (B, T)}`; no padding, so no attention mask."""
    return {"input_ids": torch.from_numpy(np.stack([example["input_ids"] for example in examples]))}


def packed_batches(
    shards: Any,
    length: int,
    sep_id: int,
    batch_size: int,
    seed: int,
    epoch: int,
    max_windows: int = 0,
    drop_last: bool = True,
) -> Batches:
    """The batches of one epoch: consecutive slices of its shuffled windows (the first `max_windows`
    of them, 0: all; a last, smaller batch only without `drop_last`). Packing draws nothing per
    batch: the order of the windows is the epoch's only randomness."""
    starts = window_starts(shards, length, seed, epoch)
    if max_windows:
        starts = starts[:max_windows]
    windows = PackedWindows(shards, starts, length, sep_id)
    return Batches(windows, batch_size, collate_windows, drop_last)
