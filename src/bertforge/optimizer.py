"""The optimizer and its schedule: AdamW without weight decay on biases and LayerNorm weights, and
the learning rate over the run's progress (linear warmup, then linear decay, flat, or
warmup-stable-decay), where progress counts steps or the time budget, whichever is further.
"""

from __future__ import annotations

import torch

from bertforge.config import TrainConfig
from bertforge.config_rules import warmup_share


def build_optimizer(model: torch.nn.Module, train: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; biases and LayerNorm weights get no weight decay (as in Google's BERT optimizer). Each
    group's `lr_scale` multiplies the schedule's rate (`train.layer_decay`, by depth)."""
    groups: dict[tuple[bool, int], list] = {}
    by_depth = train.layer_decay != 1.0  # else two groups of one rate, as a checkpoint may hold them
    layers = model.config.num_hidden_layers if by_depth else 0
    for name, param in model.named_parameters():
        if param.requires_grad:
            decays = not (name.endswith("bias") or "LayerNorm" in name)
            depth = layer_depth(name, layers) if by_depth else layers + 1
            groups.setdefault((decays, depth), []).append(param)
    param_groups = [
        {
            "params": params,
            "weight_decay": train.weight_decay if decays else 0.0,
            "lr_scale": train.layer_decay ** (layers + 1 - depth),
        }
        for (decays, depth), params in sorted(groups.items(), key=lambda item: (not item[0][0], item[0][1]))
    ]
    return torch.optim.AdamW(
        param_groups,
        lr=train.learning_rate,
        betas=(train.adam_beta1, train.adam_beta2),
        eps=train.adam_epsilon,
        fused=device.type in ("cuda", "cpu"),
    )


def layer_depth(name: str, layers: int) -> int:
    """0 for the embeddings, i + 1 for encoder layer i, `layers` + 1 for the pooler and the heads."""
    parts = name.split(".")
    if "embeddings" in parts:
        return 0
    if "layer" in parts:
        return int(parts[parts.index("layer") + 1]) + 1
    return layers + 1


class Schedule:
    """Progress in [0, 1] from steps or the time budget, whichever is further; LR follows progress.
    A step takes the rate at its start, as Google's `optimization.py` and Hugging Face's schedules do:
    with a warmup the first step's rate is 0, and the last step's is above 0."""

    def __init__(self, train: TrainConfig) -> None:
        self.train = train
        self.budget_s = train.max_minutes * 60.0
        self.warmup = warmup_share(train)

    def progress(self, step: int, elapsed_s: float) -> float:
        by_steps = step / self.train.max_steps
        by_time = elapsed_s / self.budget_s if self.budget_s else 0.0
        return min(max(by_steps, by_time), 1.0)

    def learning_rate(self, progress: float) -> float:
        peak = self.train.learning_rate
        if self.warmup and progress < self.warmup:
            return peak * progress / self.warmup
        if self.train.schedule == "constant":
            return peak
        if self.train.schedule == "wsd":
            return peak * min(1.0, (1.0 - progress) / self.train.decay_ratio)
        return peak * max(0.0, 1.0 - progress) / (1.0 - self.warmup)

    def share_after(self, progress: float, points: int = 2000) -> float:
        """The share of the run's learning-rate area (the sum of its step sizes) left after `progress`."""
        rates = [self.learning_rate((i + 0.5) / points) for i in range(points)]
        total = sum(rates)
        return sum(rates[int(progress * points) :]) / total if total else 0.0
