"""What every benchmark shares: the machine, its matmul rate, the FLOPs of a step, timing, and the
Hugging Face reference model built from the same config (in code, nothing downloaded).
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

from bertforge.config import PRESETS, ModelConfig, RunConfig, apply_preset

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


def step_flops(config: ModelConfig, batch: int, seq_len: int, masked: int) -> float:
    """FLOPs one training step must do (forward + backward = 6 per weight per token, as Kaplan et al.).

    Weights of the encoder, pooler and MLM transform count for every token; the vocabulary
    projection only for the `masked` positions; attention scores and mixing add 12 L H T per token.
    Embedding lookups, LayerNorms, activations and the optimizer are not matmuls and not counted.
    """
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    layers = config.num_hidden_layers
    tokens = batch * seq_len
    encoder = layers * (4 * h * h + 2 * h * i)  # Q, K, V, output; two FFN projections
    pooler_and_transform = 2 * h * h
    dense = 6 * (encoder + pooler_and_transform) * tokens
    vocabulary = 6 * h * v * masked
    attention = 12 * layers * h * seq_len * tokens
    return float(dense + vocabulary + attention)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(
    steps: dict[str, Callable[[], None]], warmup: int, rounds: int, per_round: int, device: torch.device
) -> dict[str, list[float]]:
    """Seconds per step of each contender, round by round, alternating so drift hits all alike.

    Each round runs `per_round` steps of every contender in turn (the order flips every round).
    """
    names = list(steps)
    for name in names:
        for _ in range(warmup):
            steps[name]()
    synchronize(device)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else reversed(names):
            start = time.perf_counter()
            for _ in range(per_round):
                steps[name]()
            synchronize(device)
            times[name].append((time.perf_counter() - start) / per_round)
    return times


def median_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median over rounds of numerator / denominator (rounds pair up neighbours in time)."""
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))


def hf_config(config: ModelConfig):
    import transformers

    return transformers.BertConfig(**asdict(config))  # ModelConfig uses BertConfig's field names


def hf_model(config: ModelConfig, weights: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """`transformers.BertForPreTraining` of the same size (its default attention), optionally our weights."""
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
        attention_mask=batch["attention_mask"],
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


def preset_names() -> list[str]:
    return list(PRESETS)
