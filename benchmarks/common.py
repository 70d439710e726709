"""What every benchmark shares: the machine, its matmul rate and GPU peak, timing (with the GPU's
memory and the attention kernel a step ran), and the Hugging Face reference model built from the
same config (in code, nothing downloaded). A step's FLOPs are `bertforge.flops`'.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from bertforge.config import ModelConfig, RunConfig, apply_preset

SEQ_LEN = 128
MASK_RATE = 0.15
WIKITEXT = os.environ.get(
    "BERTFORGE_WIKITEXT", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "wikitext-2")
)


@dataclass
class Bench:
    """What every measurement of one suite run shares."""

    device: torch.device
    rates: dict[str, float]  # the measured matmul rate (FLOP/s) per precision
    quick: bool
    workdir: Path  # temporary files of this run
    cache_dir: Path  # bertforge's tokenizer and shard cache
    log: Callable[[str], None]
    compile: bool = False  # torch.compile both models in the step benchmark
    peak_flops: float | None = None  # a GPU's dense bf16 peak (FLOP/s), for MFU; None on CPU


def keep_freed_memory() -> None:
    """Make glibc serve every block from the heap and keep what is freed, for this whole process.

    By default glibc maps blocks over 32 MiB afresh from the kernel and unmaps them when freed,
    so a training step that makes such tensors (Hugging Face's dense (B*T, V) logits, say) page-
    faults through all of them on every step. jemalloc or tcmalloc (LD_PRELOAD) avoid the same
    cost; this does it in-process. It applies to both contenders alike.
    """
    m_trim_threshold, m_mmap_max = -1, -4  # mallopt parameters, <malloc.h>
    libc = ctypes.CDLL("libc.so.6")
    if not (libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2**31 - 1)):
        raise RuntimeError("mallopt refused the settings (not glibc?)")


def machine() -> dict:
    """What the figures were measured on."""
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def model_config(preset: str, vocab_size: int = 30522) -> ModelConfig:
    config = RunConfig()
    apply_preset(config, preset)
    config.model.vocab_size = vocab_size
    return config.model


def matmul_rate(dtype: torch.dtype, device: torch.device, seconds: float = 1.0, n: int = 1024) -> float:
    """The machine's measured dense matmul rate in FLOP/s (n x n by n x n, repeated for `seconds`)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    for _ in range(3):
        a @ b
    synchronize(device)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(4):
            a @ b
        synchronize(device)
        count += 4
    return 2 * n**3 * count / (time.perf_counter() - start)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timing:
    """What `interleaved` measured of each contender."""

    seconds: dict[str, list[float]]  # per step, one entry per round
    first_step_s: dict[str, float]  # the first warm-up step (compilation included)
    peak_memory: dict[str, int]  # CUDA: the most bytes a round's steps added to what was allocated


def interleaved(
    steps: dict[str, Callable[[], None]], warmup: int, rounds: int, per_round: int, device: torch.device
) -> Timing:
    """Seconds per step of each contender, round by round, alternating so drift hits all alike.

    Each round runs `per_round` steps of every contender in turn, the order rotated by one every round
    (for two, flipped), so that over a multiple of their number of rounds each goes first as often.
    """
    names = list(steps)
    timing = Timing({name: [] for name in names}, {}, {name: 0 for name in names})
    for name in names:
        start = time.perf_counter()
        steps[name]()
        synchronize(device)
        timing.first_step_s[name] = time.perf_counter() - start
        for _ in range(warmup - 1):
            steps[name]()
    synchronize(device)
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            held = reset_peak_memory(device)
            start = time.perf_counter()
            for _ in range(per_round):
                steps[name]()
            synchronize(device)
            timing.seconds[name].append((time.perf_counter() - start) / per_round)
            if device.type == "cuda":
                added = torch.cuda.max_memory_allocated(device) - held
                timing.peak_memory[name] = max(timing.peak_memory[name], added)
    return timing


def reset_peak_memory(device: torch.device) -> int:
    """On CUDA, start counting the peak afresh; the bytes allocated now (0 elsewhere)."""
    if device.type != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def resident_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The bytes a model's weights and its optimizer's state hold between steps."""
    tensors = list(model.parameters()) + [
        value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)
    ]
    return sum(t.numel() * t.element_size() for t in tensors)


# Which SDPA kernel ran, by the names of the operators and GPU kernels a step launched; a name is
# taken by the first kind whose mark it holds (cuDNN's kernels have "flash" and "fmha" in their names).
ATTENTION_KERNELS = (
    ("cuDNN", ("cudnn",)),
    ("flash", ("flash",)),
    ("memory-efficient", ("efficient_attention", "mem_efficient", "fmha")),
    ("math", ("_scaled_dot_product_attention_math",)),
)
KIND_ORDER = ("flash", "memory-efficient", "cuDNN", "math")  # as the labels read


def kernel_kinds(names: set[str]) -> str:
    """The SDPA kernel kinds among lower-case operator and kernel `names`, joined by " + "; "other"
    for none."""
    found = {
        next((kind for kind, marks in ATTENTION_KERNELS if any(m in name for m in marks)), None)
        for name in names
    }
    return " + ".join(kind for kind in KIND_ORDER if kind in found) or "other"


def attention_kernels(step: Callable[[], None], device: torch.device) -> str:
    """The SDPA kernel(s) one call of `step` ran, from the profiler: flash, memory-efficient, cuDNN,
    math, or "other" when none of them (an attention of the model's own)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        step()
        synchronize(device)
    return kernel_kinds({event.key.lower() for event in profiler.key_averages()})


def median_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median over rounds of numerator / denominator (rounds pair up neighbours in time)."""
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))


def hf_config(config: ModelConfig):
    import transformers

    # ModelConfig uses BertConfig's field names; attention through torch's SDPA, pinned
    return transformers.BertConfig(**asdict(config), attn_implementation="sdpa")


def hf_model(config: ModelConfig, weights: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """`transformers.BertForPreTraining` of the same size (SDPA attention), optionally our weights."""
    import transformers

    model = transformers.BertForPreTraining(hf_config(config))
    if weights is not None:
        model.load_state_dict(weights, strict=False)  # our state dict has HF's names
    return model


def hf_labels(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's dense MLM labels (-100 where nothing is predicted) and NSP labels from our batch."""
    labels = torch.full_like(batch["input_ids"], -100)
    labels.view(-1)[batch["masked_positions"]] = batch["masked_labels"]
    return labels, batch["nsp_labels"]


def hf_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """The loss as Hugging Face computes it: the MLM head over every position, -100 ignored."""
    labels, nsp_labels = batch["hf_labels"], batch["nsp_labels"]
    output = model(
        input_ids=batch["input_ids"],
        attention_mask=batch.get("attention_mask"),  # absent when the batch has no padding
        token_type_ids=batch["token_type_ids"],
        labels=labels,
        next_sentence_label=nsp_labels,
    )
    return output.loss


class HFAdapter(nn.Module):
    """Hugging Face's model behind our forward signature, for `evaluate.pretraining_metrics`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, masked_positions=None):
        output = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        logits = output.prediction_logits  # (B, T, V)
        if masked_positions is not None:
            logits = logits.flatten(0, 1).index_select(0, masked_positions)  # (M, V)
        return logits, output.seq_relationship_logits
