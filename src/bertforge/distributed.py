"""Multi-process training with torchrun: who this process is, the process group, and collectives.

`torchrun --nproc_per_node=N -m bertforge pretrain ...` starts N copies of the program with `RANK`,
`WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT` set; `setup` reads them and joins the
process group (nccl on GPUs, gloo on CPUs). Without them every helper here acts for a world of one
process, so single-process code never branches on whether it is distributed.

The global batch (`train.batch_size`, sequences per optimizer step) is kept whatever the number
of processes: micro-batch x accumulation steps x processes = batch_size (`batch_plan`).

Collectives wait `runtime.dist_timeout_minutes` for the other ranks (nccl's own default, 10
minutes, is shorter than rank 0's evaluation or checkpoint on a large model). Work that can take
longer, such as training the tokenizer and filling the shard cache, runs before the process group
exists (`joined_after`): the cache's entry locks, not a collective, make the other ranks wait.

A process that dies (killed, out of memory) closes its connections, so the others' next collective
fails at once rather than at the timeout; `lost_processes_reported` turns that failure into one line
naming the lost rank (found among the processes of this machine, whose PIDs `setup` gathers). One
that falls silent without closing them (a hung or vanished machine) is noticed by the others'
`heartbeat` within a few minutes, whatever the timeout: each stops with one line naming it
(exit status 2), where under nccl it would wait in the collective until the timeout.
`torchrun --max-restarts N` then restarts the group, and `restart_count` tells the restarted
processes to continue the run from its last checkpoint.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from bertforge.config import TrainConfig
from bertforge.errors import BertforgeError
from bertforge.heartbeat import Heartbeat


@dataclass(frozen=True)
class World:
    """This process's place among the processes torchrun started (one process: rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def launched() -> World:
    """The world torchrun describes in the environment (no process group is needed to read it)."""
    try:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise BertforgeError("RANK, WORLD_SIZE and LOCAL_RANK must be integers; use torchrun") from None
    if world_size > 1 and "RANK" not in os.environ:
        raise BertforgeError("WORLD_SIZE is set but RANK is not; launch multi-process runs with torchrun")
    if not 0 <= rank < world_size:
        raise BertforgeError(f"RANK {rank} is outside WORLD_SIZE {world_size}; launch with torchrun")
    return World(rank, world_size, local_rank)


_processes: list[tuple[str, int]] = []  # (host, PID) of every rank, in rank order, once the group exists
_heartbeat: Heartbeat | None = None  # this process's, while it is in the group
_continue_with = "start the run again"  # how to continue the run, as `lost_processes_reported` was told


def setup(device: torch.device, timeout_minutes: float = 60.0) -> World:
    """Join the process group torchrun prepared (once per process) and start this process's heartbeat;
    return this process's world."""
    global _heartbeat
    world = launched()
    if world.distributed and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(local_device(device, world))
        timeout = timedelta(minutes=timeout_minutes)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timeout, **_restart_rendezvous(timeout))
        atexit.register(leave)  # Python API users; the CLI leaves earlier
        _processes[:] = gather_objects((socket.gethostname(), os.getpid()))
        if dist.is_initialized():  # (tests replace the process group)
            store = dist.distributed_c10d._get_default_store()
            _heartbeat = Heartbeat(store, world.rank, world.world_size, stop_for_lost).start()
    return world


def stop_for_lost(problem: str) -> None:
    """End this process at once with one line, when the heartbeat found a process of the run lost:
    its main thread may be waiting in a collective that nothing else interrupts."""
    rank, lost = launched().rank, lost_ranks()  # the store's host may have ended: name it as below
    line = ended_line(lost, rank) if lost else f"{problem}; {stops_too(rank)}"
    sys.stderr.write(f"bertforge: error: {line}\n")
    sys.stderr.flush()
    os._exit(2)


def _restart_rendezvous(timeout: timedelta) -> dict:
    """After torchrun restarted the group, the store under a prefix of this attempt's own: torchrun
    keeps its store across restarts, where the new processes would read the addresses the dead ones
    left. The first attempt joins as usual (nothing to add)."""
    if not restart_count():
        return {}
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    store = dist.PrefixStore(f"bertforge/restart_{restart_count()}", store)
    return {"store": store, "rank": rank, "world_size": world_size}


def restart_count() -> int:
    """How many times torchrun restarted this process's group after a failure (`--max-restarts`)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)


def launch_command(arguments: str) -> str:
    """The command line that runs `bertforge ARGUMENTS` with this process's number of processes."""
    world = launched()
    if not world.distributed:
        return f"bertforge {arguments}"
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world.world_size))
    if per_node == world.world_size:
        return f"torchrun --nproc_per_node={per_node} -m bertforge {arguments}"
    nodes = world.world_size // per_node
    return (
        f"torchrun --nnodes={nodes} --nproc_per_node={per_node} (with the launch's own rendezvous options, "
        f"on every machine) -m bertforge {arguments}"
    )


@contextlib.contextmanager
def lost_processes_reported(then: str) -> Iterator[None]:
    """Turn a collective that failed because another rank's process ended into one `BertforgeError`
    naming that rank; `then` says how to continue the run (also in the heartbeat's line). When the
    block ends normally, this process's part of the run is done: its heartbeat stops, and the
    other processes stop watching it (on an error it goes on until the process leaves, so that
    the others notice its silence then)."""
    global _continue_with
    _continue_with = then
    try:
        yield
        stop_heartbeat(finished=True)
    except RuntimeError as error:  # `dist.DistError` is one
        if not (dist.is_initialized() and communication_failed(error)):
            raise
        if threading.current_thread() is threading.main_thread():
            # This process is stopping: the SIGTERM torchrun sends the survivors must not cut it short.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        lost = lost_ranks()
        if not lost:  # on another machine, or alive but unreachable
            first_line = str(error).strip().splitlines()[0]
            raise BertforgeError(
                f"lost contact with another process of the run ({first_line}); {stops_too(dist.get_rank())}"
            ) from None
        raise BertforgeError(ended_line(lost, dist.get_rank())) from None


def ended_line(lost: list[int], rank: int) -> str:
    """The line naming the `lost` ranks, whose processes ended, for the process of `rank`."""
    names = " and ".join(f"rank {lost_rank} (process {_processes[lost_rank][1]})" for lost_rank in lost)
    return f"lost {names} of {len(_processes)}: it ended mid-run, so {stops_too(rank)}"


def stops_too(rank: int) -> str:
    """How every lost-process line ends: this process stops, and how to continue the run."""
    return f"this process (rank {rank}) stops too; {_continue_with}"


def communication_failed(error: RuntimeError) -> bool:
    """Whether `error` is a failed collective (gloo names its transport; nccl's are `DistError`s)."""
    return isinstance(error, dist.DistError) or "gloo" in str(error).lower()


def lost_ranks(wait_s: float = 5.0) -> list[int]:
    """The ranks on this machine whose process has ended, waiting up to `wait_s` for one to be seen
    ended (a killed process closes its connections a moment before it exits)."""
    host, deadline = socket.gethostname(), time.monotonic() + wait_s
    while True:
        lost = [rank for rank, (where, pid) in enumerate(_processes) if where == host and not alive(pid)]
        if lost or time.monotonic() > deadline:
            return lost
        time.sleep(0.1)


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)  # signal 0 only checks that the PID exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:  # reaped meanwhile, or no /proc to tell a zombie by (not Linux)
        return not os.path.isdir("/proc")


@contextlib.contextmanager
def joined_after(device: torch.device, timeout_minutes: float) -> Iterator[World]:
    """Run the block in every process, then join the process group and wait for all ranks.

    For work that may outlast any collective timeout (training a tokenizer, filling the cache):
    no rank waits in a collective meanwhile. The device is checked first, before any such work.
    """
    world = launched()
    local_device(device, world)  # refuses `cuda:N` under torchrun
    yield world
    setup(device, timeout_minutes)
    barrier()


def stop_heartbeat(finished: bool) -> None:
    """Stop this process's heartbeat; `finished`: its work in the run is done, so that the others do
    not take its silence for a loss."""
    global _heartbeat
    if _heartbeat is not None:
        _heartbeat.stop(finished)
        _heartbeat = None


def leave() -> None:
    """Leave the process group at the end of a command, while the interpreter is still whole.

    Objects that hold the group (DDP's reducer, pending work) are freed first; left to the end of
    the interpreter, their native threads could be torn down in any order, and a process that had
    finished its work could abort on exit ("terminate called without an active exception").
    Registered at exit too, for library users; leaving twice is a no-op.
    """
    stop_heartbeat(finished=False)  # a run that ended well stopped it already
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def local_device(device: torch.device, world: World) -> torch.device:
    """Each process on a node takes its own GPU (`cuda` means `cuda:LOCAL_RANK` under torchrun)."""
    if device.type != "cuda" or not world.distributed:
        return device
    if device.index is not None:
        raise BertforgeError(
            f"runtime.device={device} would put every torchrun process on the same GPU; "
            "use runtime.device=cuda (each process takes cuda:LOCAL_RANK) and choose the GPUs with "
            "CUDA_VISIBLE_DEVICES"
        )
    return torch.device("cuda", world.local_rank)


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step of `train.batch_size` sequences is split over micro-batches and ranks."""

    micro_batch: int  # sequences per forward/backward on one rank
    accumulation: int  # micro-batches per rank per optimizer step


def batch_plan(train: TrainConfig, world_size: int | None = None) -> BatchPlan:
    """Keep the global batch when the number of processes changes.

    The configured micro-batch is `batch_size / gradient_accumulation_steps`; with W processes each
    rank accumulates ceil(steps / W) micro-batches, so when W divides the accumulation steps the
    micro-batches (and the maths of a step) are exactly those of one process.
    """
    world_size = launched().world_size if world_size is None else world_size
    accumulation = math.ceil(train.gradient_accumulation_steps / world_size)
    micro_batch, rest = divmod(train.batch_size, accumulation * world_size)
    if rest or micro_batch == 0:
        raise BertforgeError(
            f"train.batch_size ({train.batch_size}) cannot be split over {world_size} processes x "
            f"{accumulation} accumulation steps; make it a multiple of {accumulation * world_size} "
            "(batch_size = micro-batch x gradient_accumulation_steps x processes)"
        )
    return BatchPlan(micro_batch, accumulation)


def wrap(model: torch.nn.Module, device: torch.device, world: World) -> torch.nn.Module:
    """The model under DistributedDataParallel when there are several processes, else unchanged.

    The gradients are views into DDP's all-reduce buckets (`gradient_as_bucket_view`): no second
    copy of them in memory, and no copy between the two after each backward.
    """
    if not world.distributed:
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True)


def no_sync(model: torch.nn.Module, skip: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce for this backward (all micro-batches of a step but the last)."""
    ddp = getattr(model, "_orig_mod", model)  # under torch.compile, the wrapped DDP module
    if skip and isinstance(ddp, DistributedDataParallel):
        return ddp.no_sync()
    return contextlib.nullcontext()


def _collective_device() -> torch.device:
    # nccl only moves CUDA tensors; gloo only CPU ones.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(values: list[float]) -> list[float]:
    """Element-wise sums over all ranks (float64, so counts stay exact); identity for one process."""
    if not dist.is_initialized():
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(tensor)
    return tensor.tolist()


def broadcast_float(value: float) -> float:
    """Rank 0's value on every rank."""
    if not dist.is_initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=_collective_device())
    dist.broadcast(tensor, src=0)
    return float(tensor)


def all_reduce_max(value: int) -> int:
    """The largest of the ranks' values; identity for one process."""
    if not dist.is_initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=_collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor)


def gather_objects(obj: object) -> list:
    """Every rank's `obj`, in rank order, on every rank (picklable objects only)."""
    if not dist.is_initialized():
        return [obj]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier() -> None:
    if dist.is_initialized():
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()
