"""The one training loop, shared by pretraining and fine-tuning.

An `Objective` says what is trained (model, batches per epoch, loss, evaluation); this module owns
how: AdamW without decay on biases and LayerNorm, linear warmup then linear decay over steps or a
time budget, gradient accumulation and clipping, autocast (fp32 / bf16 / fp16 with a scaler),
optional `torch.compile`, periodic evaluation, `metrics.jsonl`, atomic checkpoints and exact resume.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from bertforge.checkpoint import list_checkpoints, load_checkpoint, prune_checkpoints, save_checkpoint
from bertforge.config import RunConfig, TrainConfig
from bertforge.errors import BertforgeError
from bertforge.io import atomic_write_text
from bertforge.runtime import autocast, resolve_device, to_device


@dataclass
class Objective:
    """What a run trains. `loss` returns the loss to minimise and detached named sums for logging."""

    model: torch.nn.Module
    batches: Callable[[int], Dataset]  # epoch -> dataset whose item b is micro-batch b (dict of tensors)
    loss: Callable[[torch.nn.Module, dict], tuple[torch.Tensor, dict[str, torch.Tensor]]]
    evaluate: Callable[[torch.nn.Module], dict[str, float]]
    summarize: Callable[[dict[str, float]], dict[str, float]]  # summed train stats -> reported metrics


def build_optimizer(model: torch.nn.Module, train: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; biases and LayerNorm weights get no weight decay (as in Google's BERT optimizer)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": train.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups,
        lr=train.learning_rate,
        betas=(train.adam_beta1, train.adam_beta2),
        eps=train.adam_epsilon,
        fused=device.type in ("cuda", "cpu"),
    )


class Schedule:
    """Progress in [0, 1] from steps or the time budget, whichever is further; LR follows progress."""

    def __init__(self, train: TrainConfig) -> None:
        self.train = train
        self.budget_s = train.max_minutes * 60.0
        if train.warmup_steps:
            self.warmup = min(train.warmup_steps / train.max_steps, 0.999)
        else:
            self.warmup = train.warmup_ratio

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
        return peak * max(0.0, 1.0 - progress) / (1.0 - self.warmup)


def micro_batches(
    objective: Objective, epoch: int, index: int, num_workers: int, pin_memory: bool
) -> Iterator[tuple[int, int, dict]]:
    """Yield (epoch, index, batch) forever from position (epoch, index), epoch after epoch."""
    while True:
        dataset = objective.batches(epoch)
        if len(dataset) == 0:
            raise BertforgeError("the training data gives no full batch; lower train.batch_size or add text")
        if index < len(dataset):
            loader = DataLoader(
                dataset,
                batch_size=None,
                sampler=range(index, len(dataset)),
                num_workers=num_workers,
                pin_memory=pin_memory,
                # A private generator keeps the DataLoader from drawing on torch's global RNG,
                # which dropout uses: resume must see the same global RNG stream.
                generator=torch.Generator(),
                prefetch_factor=4 if num_workers else None,
            )
            for batch in loader:
                yield epoch, index, batch
                index += 1
        epoch, index = epoch + 1, 0


class MetricsLog:
    """`metrics.jsonl`: one JSON object per line, each with `step` and `split`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def truncate_after(self, step: int) -> None:
        """On resume, drop lines the interrupted run wrote after its last checkpoint."""
        if self.path.exists():
            kept = [line for line in self.read() if line["step"] <= step]
            atomic_write_text(self.path, "".join(json.dumps(line) + "\n" for line in kept))

    def append(self, record: dict) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line]


def compile_model(model: torch.nn.Module, enabled: bool) -> torch.nn.Module:
    if not enabled:
        return model
    try:
        return torch.compile(model)
    except Exception as error:  # torch.compile is optional; eager mode is always correct
        warnings.warn(f"torch.compile failed ({error}); training in eager mode", stacklevel=2)
        return model


def train(
    objective: Objective,
    config: RunConfig,
    run_dir: Path,
    resume: bool = False,
    show_progress: bool = True,
) -> dict:
    """Run the loop until the step or time budget is spent; return the last validation metrics."""
    return Trainer(objective, config, run_dir, resume).run(show_progress)


class Trainer:
    """State of one run of the loop: model, optimizer, position in the data, clock and logs."""

    def __init__(self, objective: Objective, config: RunConfig, run_dir: Path, resume: bool) -> None:
        self.objective, self.config, self.run_dir = objective, config, run_dir
        self.train_cfg, self.runtime = config.train, config.runtime
        self.device = resolve_device(self.runtime.device)
        self.model = objective.model.to(self.device)
        self.optimizer = build_optimizer(self.model, self.train_cfg, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type) if self.runtime.precision == "fp16" else None
        self.schedule = Schedule(self.train_cfg)
        self.log = MetricsLog(run_dir / "metrics.jsonl")
        self.checkpoint_every = self.train_cfg.checkpoint_every or self.train_cfg.eval_every
        self.state = {"step": 0, "epoch": 0, "batch": 0, "elapsed_s": 0.0, "tokens": 0, "last_valid": {}}
        if resume:
            self.restore()
        else:
            torch.manual_seed(self.runtime.seed)  # dropout stream; the model was seeded by its builder
            self.log.append({"step": 0, "split": "valid", **objective.evaluate(self.model)})
        self.clock = time.perf_counter() - self.state["elapsed_s"]
        self.window = Window()

    def restore(self) -> None:
        checkpoints = list_checkpoints(self.run_dir)
        if not checkpoints:
            raise BertforgeError(
                f"{self.run_dir} has no checkpoint to resume from; start again without --resume"
            )
        self.state = load_checkpoint(checkpoints[-1], self.model, self.optimizer, self.scaler)
        self.log.truncate_after(self.state["step"])

    def progress(self, step: int) -> float:
        return self.schedule.progress(step, time.perf_counter() - self.clock)

    def run(self, show_progress: bool) -> dict:
        step_model = compile_model(self.model, self.runtime.compile)
        stream = micro_batches(
            self.objective,
            self.state["epoch"],
            self.state["batch"],
            self.runtime.num_workers,
            self.device.type == "cuda",
        )
        bar = tqdm(
            total=self.train_cfg.max_steps,
            initial=self.state["step"],
            unit="step",
            disable=not show_progress,
            dynamic_ncols=True,
        )
        while self.progress(self.state["step"]) < 1.0:
            lr = self.schedule.learning_rate(self.progress(self.state["step"] + 1))
            self.optimizer_step(step_model, stream, lr)
            bar.update(1)
            self.after_step(lr, bar)
        bar.close()
        return {
            "step": self.state["step"],
            "elapsed_s": time.perf_counter() - self.clock,
            "tokens": self.state["tokens"],
            **self.state["last_valid"],
        }

    def optimizer_step(self, step_model: torch.nn.Module, stream: Iterator, lr: float) -> None:
        """Accumulate gradients over the micro-batches of one step, then clip and update."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        accumulation = self.train_cfg.gradient_accumulation_steps
        for _ in range(accumulation):
            epoch, index, batch = next(stream)
            tokens = int(batch["attention_mask"].sum())  # real tokens; padding excluded
            with autocast(self.device, self.runtime.precision):
                loss, sums = self.objective.loss(step_model, to_device(batch, self.device))
            scaled = loss / accumulation
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            self.window.add(sums, tokens)
            self.state.update(epoch=epoch, batch=index + 1, tokens=self.state["tokens"] + tokens)
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.train_cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train_cfg.max_grad_norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state["step"] += 1

    def after_step(self, lr: float, bar: tqdm) -> None:
        """Log, evaluate and checkpoint on their cadences, and always after the last step."""
        step = self.state["step"]
        done = self.progress(step) >= 1.0
        checkpoint = step % self.checkpoint_every == 0 or done
        # The window also closes at checkpoints so a resumed run logs the same windows.
        if step % self.train_cfg.log_every == 0 or checkpoint:
            record = self.window.flush(self.objective.summarize, lr)
            self.log.append({"step": step, "split": "train", **record})
            bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
        if step % self.train_cfg.eval_every == 0 or done:
            self.state["last_valid"] = self.objective.evaluate(self.model)
            self.log.append({"step": step, "split": "valid", **self.state["last_valid"]})
            bar.write(
                f"step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in self.state["last_valid"].items())
            )
        if checkpoint:
            self.state["elapsed_s"] = time.perf_counter() - self.clock
            save_checkpoint(
                self.run_dir, step, self.model, self.optimizer, self.scaler, self.state, self.config
            )
            prune_checkpoints(self.run_dir, self.train_cfg.keep_checkpoints)
        if checkpoint or step % self.train_cfg.eval_every == 0:
            self.window.restart()  # evaluation and checkpoint time are not training throughput


class Window:
    """Training statistics since the last log line, kept on the device until flushed."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.restart()

    def restart(self) -> None:
        self.tokens = 0
        self.start = time.perf_counter()

    def add(self, sums: dict[str, torch.Tensor], tokens: int) -> None:
        for key, value in sums.items():
            self.sums[key] = self.sums.get(key, 0) + value.detach()
        self.tokens += tokens

    def flush(self, summarize: Callable[[dict[str, float]], dict[str, float]], lr: float) -> dict:
        """Synchronise once and turn the window's sums into metrics."""
        seconds = max(time.perf_counter() - self.start, 1e-9)
        metrics = summarize({key: float(value) for key, value in self.sums.items()})
        loss = sum(value for key, value in metrics.items() if key.endswith("_loss"))
        record = {"loss": loss, **metrics, "lr": lr, "tokens_per_s": self.tokens / seconds}
        self.sums = {}
        self.restart()
        if not math.isfinite(loss):
            raise BertforgeError(
                f"the training loss became {loss}; lower train.learning_rate or use fp32/bf16 precision"
            )
        return record
