"""The training input pipeline: micro-batches epoch after epoch from DataLoader workers that live for
the whole run, and per-epoch work (the NSP pair table) done one epoch ahead.

The training loop names each epoch's batches by a small key, `(factory name, epoch, ...)`, decided in
the main process when the epoch starts (the sequence-length warmup's batches or the full ones, the
masking rate). Every process builds the epoch's dataset from its key with the factories it holds
(`EpochBatches`), so workers forked once serve every later epoch: only keys and positions are sent
to them, never a dataset. Micro-batch b of an epoch is a pure function of its key and b, whatever
the workers, which keeps `--resume` exact. Where workers are not forked (another start method), each
epoch gets its own DataLoader over its dataset instead.

`Ahead` computes a function of the epoch one epoch ahead in a background thread of the process
that uses it (the pair table of epoch e + 1 while e trains), so an epoch's start does not wait.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import torch
from torch.utils.data import DataLoader, Dataset

from bertforge.errors import BertforgeError
from bertforge.signals import ignore_stop_signals

PREFETCH = 4  # micro-batches each worker keeps ready
_LIVE: weakref.WeakSet[Ahead] = weakref.WeakSet()


class Ahead:
    """`build(epoch)`, one epoch ahead: asking for epoch e returns its value (built now unless it is
    ready or under way) and starts building e + 1 in a background thread. The values are `build`'s
    own, whenever they are built; an error in the background is raised when its epoch is asked for."""

    def __init__(self, build: Callable[[int], object]) -> None:
        self.build = build
        self.lock = threading.Lock()
        self.pending: dict[int, Future] = {}
        self.last: tuple[int, object] | None = None
        _LIVE.add(self)

    def __call__(self, epoch: int) -> object:
        with self.lock:
            if self.last is not None and self.last[0] == epoch:
                return self.last[1]
            future = self.pending.pop(epoch, None)
            self.pending = {e: f for e, f in self.pending.items() if e > epoch}
            if epoch + 1 not in self.pending:
                self.pending[epoch + 1] = self.start(epoch + 1)
        value = future.result() if future is not None else self.build(epoch)
        self.last = (epoch, value)
        return value

    def start(self, epoch: int) -> Future:
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(self.build(epoch))
            except BaseException as error:  # handed to whoever asks for the epoch
                future.set_exception(error)

        threading.Thread(target=run, name=f"bertforge-epoch-{epoch}", daemon=True).start()
        return future

    def settle(self) -> None:
        """Wait for the builds under way (before a fork: a child gets no threads, only their state)."""
        for future in list(self.pending.values()):
            future.exception()

    def forget(self) -> None:
        """In a forked child: builds under way belong to the parent's threads."""
        self.lock = threading.Lock()
        self.pending = {}


def settle_all() -> None:
    for ahead in list(_LIVE):
        ahead.settle()


os.register_at_fork(after_in_child=lambda: [ahead.forget() for ahead in list(_LIVE)])


class EpochBatches(Dataset):
    """Item `(key, b)`: micro-batch b of the epoch that `key = (name, *args)` names, whose dataset is
    `factories[name](*args)`, built once in each process that asks (the last two kept)."""

    def __init__(self, factories: dict[str, Callable[..., Dataset] | None]) -> None:
        self.factories = factories
        self.built: dict[tuple, Dataset] = {}

    def epoch(self, key: tuple) -> Dataset:
        if key not in self.built:
            name, *args = key
            dataset = self.factories[name](*args)
            self.built = {**dict(list(self.built.items())[-1:]), key: dataset}
        return self.built[key]

    def __getitem__(self, item: tuple[tuple, int]) -> dict:
        key, index = item
        return self.epoch(key)[index]


class Positions:
    """The persistent DataLoader's sampler: the `(key, b)` items of the epoch under way."""

    def __init__(self) -> None:
        self.items: list[tuple[tuple, int]] = []

    def __iter__(self) -> Iterator[tuple[tuple, int]]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def micro_batches(
    source: EpochBatches,
    plan: Callable[[int], tuple],
    epoch: int,
    index: int,
    num_workers: int,
    pin_memory: bool,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[tuple[int, int, dict]]:
    """Yield (epoch, next position, batch) forever from position (epoch, index), epoch after epoch;
    `plan(epoch)` is called as each epoch starts and gives the key of its batches in `source`.

    The position counts the micro-batches the whole world has taken in the epoch: rank r takes
    index + r, index + r + W, ...; an epoch ends at the last multiple of W so all ranks step together.
    """
    positions = Positions()
    persistent = num_workers > 0 and start_method() == "fork"
    loader = loader_of(source, positions, num_workers, pin_memory, persistent=True) if persistent else None
    if loader is not None:
        settle_all()
        iter(loader)  # the workers start now, before this process starts any thread of its own
    while True:
        key = plan(epoch)
        dataset = source.epoch(key)
        usable = len(dataset) - len(dataset) % world_size
        if usable == 0:
            raise BertforgeError("the training data gives no full batch; lower train.batch_size or add text")
        if index < usable:
            order = range(index + rank, usable, world_size)
            if loader is not None:
                positions.items = [(key, b) for b in order]
                epoch_loader = loader
            else:
                epoch_loader = loader_of(dataset, order, num_workers, pin_memory, persistent=False)
            for batch in epoch_loader:
                index += world_size
                yield epoch, index, batch
        epoch, index = epoch + 1, 0


def loader_of(dataset: Dataset, sampler, num_workers: int, pin_memory: bool, persistent: bool) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=None,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        # A private generator keeps the DataLoader from drawing on torch's global RNG, which
        # dropout uses: resume must see the same global RNG stream.
        generator=torch.Generator(),
        prefetch_factor=PREFETCH if num_workers else None,
        persistent_workers=persistent,
        worker_init_fn=ignore_stop_signals,  # the loop, not a signal, stops the workers
    )


def start_method() -> str:
    """How DataLoader workers start here: "fork" shares the factories with them at no cost."""
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
