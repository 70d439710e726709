"""Each process of a torchrun run shows the others it is alive, and notices one that falls silent.

A process that dies usually closes its connections, and the others' next collective fails at once.
One that does not (a machine that hangs or drops off the network, a process stopped, a GPU that
stops answering) leaves them waiting in a collective until its timeout, and under nccl that wait
is a CUDA one that nothing else interrupts. So every process counts up its own key in the run's
rendezvous store every `HEARTBEAT_S` seconds, from a thread of its own, and reads the others'
keys: a process whose count has not moved for `SILENCE_LIMIT_S` is taken as lost, and `on_lost`
is called (`bertforge.distributed` then stops this process with one line naming it), as it is when
the store itself stops answering. A process that finished its work marks its key as done when it
leaves, so that the others do not take its silence for a loss.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

HEARTBEAT_S = 5.0  # how often a process counts up its key and reads the others'
SILENCE_LIMIT_S = 120.0  # a process whose key has not moved for this long is taken as lost
# A gap this long between this process's own beats means it was stopped too (a whole job suspended,
# SIGSTOP then SIGCONT): the others' silence is counted from then, not taken for a loss.
OWN_GAP_S = 6 * HEARTBEAT_S
DONE = 1 << 40  # added to a key by a process that left the run on its own


class Heartbeat:
    """The counting and watching of one process, `rank` of `world_size`, in `store` (torch's
    `Store`: `add(key, amount)` returns the new value, creating the key at 0)."""

    def __init__(
        self,
        store,
        rank: int,
        world_size: int,
        on_lost: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.on_lost, self.clock = on_lost, clock
        now = clock()
        self.counts = [0] * world_size  # each process's count when it last moved
        self.moved = [now] * world_size  # when each count last moved
        self.last_beat = now
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, name="bertforge-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.thread.start()
        return self

    def run(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            try:
                silent = self.beat()
            except Exception as error:  # the store's host is gone (torch raises its own error types)
                if not self.stopped.is_set():
                    first_line = (str(error).strip() or type(error).__name__).splitlines()[0]
                    self.on_lost(f"lost contact with the run's rendezvous store ({first_line})")
                return
            if silent:
                names = " and ".join(f"rank {rank}" for rank in silent)
                self.on_lost(f"{names} of {self.world_size} gave no sign of life for {SILENCE_LIMIT_S:.0f} s")
                return

    def beat(self) -> list[int]:
        """Count up this process's key and read the others'; return the ranks silent too long."""
        self.store.add(key(self.rank), 1)
        now, silent = self.clock(), []
        if now - self.last_beat > OWN_GAP_S:  # this process did not run either: nobody's silence counts
            self.moved = [max(moved, now) for moved in self.moved]
        self.last_beat = now
        for rank in range(self.world_size):
            if rank == self.rank:
                continue
            count = self.store.add(key(rank), 0)
            if count >= DONE:
                continue
            if count != self.counts[rank]:
                self.counts[rank], self.moved[rank] = count, now
            elif now - self.moved[rank] > SILENCE_LIMIT_S:
                silent.append(rank)
        return silent

    def stop(self, finished: bool) -> None:
        """Stop counting; `finished`: this process's work is done, and the others stop watching it."""
        self.stopped.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join()
        if finished:
            with contextlib.suppress(RuntimeError):  # the store is gone already: nobody is left to tell
                self.store.add(key(self.rank), DONE)


def key(rank: int) -> str:
    return f"bertforge/heartbeat/{rank}"
