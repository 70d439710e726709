"""`runtime.precision = "auto"`: pick the faster arithmetic for this machine, by measurement.

The 2-core CPUs this project runs on differ: an AMD EPYC with native bf16 trains about 2.4x faster
in bf16 than in fp32, an Intel Xeon with AVX-512 bf16 but no AMX about 1.6x slower. So on CPU a
probe times the model's own matmul shapes in fp32 and in bf16 on one core (a fraction of a second)
and picks bf16 only when it is clearly faster. The choice is cached per machine (CPU model and flags, torch
version) and per shape in the bertforge cache, so later runs decide at once.
On CUDA: bf16 where the GPU computes it natively (compute capability 8.0, Ampere, and later), else
fp16 with a loss scaler; an explicit bf16 on an older GPU (V100, T4) is refused with that advice.
Elsewhere: fp32.

The resolved value replaces "auto" in the run's config before it is saved, so a resumed run keeps
the arithmetic it started with wherever it resumes.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bertforge import distributed
from bertforge.cache import cache_key
from bertforge.config import EXPLICIT_PRECISIONS, ModelConfig, RunConfig
from bertforge.errors import BertforgeError
from bertforge.io import read_json, write_json

CACHE_FILE = "precision.json"
BF16_MIN_SPEEDUP = 1.15  # bf16 must beat fp32 by this factor: autocast adds casts the probe does not time
PROBE_TOKENS = 1024  # rows of the probe's matmuls: enough to reach the steady GEMM rate
PROBE_ROUNDS = 15  # alternating fp32 and bf16 passes; the fastest of each is taken
# bf16 below this share of fp32's speed in the opening round ends the probe: no later round lifts it
# to BF16_MIN_SPEEDUP (a CPU without bf16 units runs a GPT's vocabulary matmul at 0.02x, 4 s a pass).
CLEARLY_SLOWER = 0.3
PROBE_BUDGET_S = 5.0  # rounds after the third stop once the probe has run this long
PROBE_VERSION = 3  # in the cache key: measurements of another probe version are taken again


@dataclass
class Choice:
    """The precision picked, why, and whether it came from the cache."""

    precision: str
    reason: str
    speedup: float | None = None  # fp32 time / bf16 time, on CPU
    cached: bool = False

    def describe(self) -> str:
        source = " (cached)" if self.cached else ""
        return f"precision: {self.precision} (auto: {self.reason}{source}; --precision overrides)"


def resolve_precision(config: RunConfig, device: torch.device, cache_dir: Path) -> Choice | None:
    """Replace `config.runtime.precision = "auto"` by the choice for `device`; None when explicit."""
    if config.runtime.precision != "auto":
        return None
    choice = choose_precision(config.model, device, cache_dir)
    config.runtime.precision = choice.precision
    return choice


def agree_on_precision(config: RunConfig) -> None:
    """Under torchrun, every rank takes rank 0's precision (nodes may differ); a collective call."""
    if distributed.launched().distributed:
        mine = config.runtime.precision  # still "auto" on the ranks that left the choice to rank 0
        known = EXPLICIT_PRECISIONS
        code = distributed.broadcast_float(known.index(mine) if mine in known else -1.0)
        config.runtime.precision = known[int(code)]


def choose_precision(model: ModelConfig, device: torch.device, cache_dir: Path) -> Choice:
    if device.type == "cuda":
        return cuda_choice(device)
    if device.type != "cpu":
        return Choice("fp32", f"no mixed precision chosen for {device.type}")
    key = machine_key(model)
    cache = read_cache(cache_dir)
    if key in cache:
        return cpu_choice(cache[key]["speedup"], cached=True)
    speedup = measure_bf16_speedup(model)
    cache[key] = {"speedup": speedup, "cpu": cpu_name(), "torch": torch.__version__}
    write_cache(cache_dir, cache)
    return cpu_choice(speedup)


def cuda_choice(device: torch.device) -> Choice:
    name = torch.cuda.get_device_name(device)
    if native_bf16(device):
        return Choice("bf16", f"{name} computes bf16 natively")
    return Choice("fp16", f"{name} has no native bf16; fp16 with a loss scaler")


def native_bf16(device: torch.device) -> bool:
    """Whether this GPU computes bf16 natively: NVIDIA from Ampere (compute capability 8.0) on, or ROCm."""
    return bool(torch.version.hip) or torch.cuda.get_device_capability(device) >= (8, 0)


def check_precision(device: torch.device, precision: str) -> None:
    """Refuse bf16 on a GPU that only emulates it (several times slower than fp16 there)."""
    if device.type == "cuda" and precision == "bf16" and not native_bf16(device):
        major, minor = torch.cuda.get_device_capability(device)
        raise BertforgeError(
            f"runtime.precision = bf16, but {torch.cuda.get_device_name(device)} (compute capability "
            f"{major}.{minor}) has no native bf16 (it needs 8.0, Ampere or later); "
            "use runtime.precision=fp16 (with a loss scaler) or auto"
        )


def cpu_choice(speedup: float, cached: bool = False) -> Choice:
    """bf16 when its matmuls are at least BF16_MIN_SPEEDUP times faster than fp32's."""
    precision = "bf16" if speedup >= BF16_MIN_SPEEDUP else "fp32"
    reason = f"bf16 matmuls {speedup:.2f}x the speed of fp32 on {cpu_name()}"
    return Choice(precision, reason, speedup, cached)


def probe_shapes(model: ModelConfig) -> list[tuple[int, int, int]]:
    """(rows, inner, columns) of the model's matmuls: QKV/output and FFN in and out; a GPT ("clm") also
    projects every position onto the vocabulary (BERT's MLM head runs on the masked 15% only)."""
    n, h, i = PROBE_TOKENS, model.hidden_size, model.intermediate_size
    shapes = [(n, h, h), (n, h, i), (n, i, h)]
    if model.objective == "clm":
        shapes.append((n, h, model.vocab_size))
    return shapes


def measure_bf16_speedup(model: ModelConfig) -> float:
    """fp32 time / bf16 time for one pass over the model's matmul shapes (`probe_shapes`), on one
    thread, the fastest of up to `PROBE_ROUNDS` alternating passes of each (fewer where bf16 is clearly
    slower, or the passes are long: `CLEARLY_SLOWER`, `PROBE_BUDGET_S`).

    On a machine busy with other work, the threads of a multi-threaded matmul wait for each other at
    every barrier, both precisions alike, and the ratio drifts towards 1: on two threads a 2-core Xeon
    with AMX reads 1.0-1.1 under load (in five runs of six) against 2.9-3.7 idle, below the threshold,
    and the cache would keep fp32. On one thread the fastest passes read 4.3-4.7, loaded or idle.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        shapes = probe_shapes(model)
        fp32, bf16 = matmul_operands(shapes, torch.float32), matmul_operands(shapes, torch.bfloat16)
        time_pass(fp32), time_pass(bf16)  # warm the kernels and caches
        began = time.perf_counter()
        rounds = [(time_pass(fp32), time_pass(bf16))]
        clearly_slower = rounds[0][0] < CLEARLY_SLOWER * rounds[0][1]
        while not clearly_slower and len(rounds) < PROBE_ROUNDS:
            if len(rounds) >= 3 and time.perf_counter() - began > PROBE_BUDGET_S:
                break
            rounds.append((time_pass(fp32), time_pass(bf16)))
    finally:
        torch.set_num_threads(threads)
    return min(fp32 for fp32, _ in rounds) / min(bf16 for _, bf16 in rounds)


def matmul_operands(shapes: list[tuple[int, int, int]], dtype: torch.dtype) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(0)
    return [
        (torch.randn(m, k, generator=generator).to(dtype), torch.randn(k, n, generator=generator).to(dtype))
        for m, k, n in shapes
    ]


def time_pass(operands: list[tuple[torch.Tensor, ...]]) -> float:
    """Seconds for one product of each pair of operands."""
    start = time.perf_counter()
    for a, b in operands:
        torch.mm(a, b)
    return time.perf_counter() - start


def cpu_name() -> str:
    for line in _cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_key(model: ModelConfig) -> str:
    """What decides the probe's result: CPU model and flags, torch, the matmul shapes (it runs on one
    thread whatever the run's threads)."""
    flags = next((line for line in _cpuinfo().splitlines() if line.startswith("flags")), "")
    parts = [
        cpu_name(),
        flags,
        torch.__version__,
        model.hidden_size,
        model.intermediate_size,
        PROBE_VERSION,
    ]
    if model.objective == "clm":
        parts.append(model.vocab_size)
    return cache_key(*parts)


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def read_cache(cache_dir: Path) -> dict:
    """The cached measurements; a missing or damaged file is an empty cache (it is re-measured)."""
    try:
        return read_json(cache_dir / CACHE_FILE)
    except (BertforgeError, OSError):
        return {}


def write_cache(cache_dir: Path, cache: dict) -> None:
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        write_json(cache_dir / CACHE_FILE, cache)
    except OSError:
        pass  # a read-only cache only costs a re-measurement next time
