"""(4) Quality at equal time: bertforge and Hugging Face trained for the same minutes on the same batches.

Both models start from the same weights and take the same WikiText-2 train batches in the same
order (bertforge's pairs and dynamic masking), with the same AdamW, clipping and a learning-rate
schedule driven by each one's own time budget (warmup 10%, then linear decay to zero when the
minutes run out). Their steps alternate, each on its own clock (batch collation included), so
machine drift hits both alike. Then `bertforge.evaluate.pretraining_metrics` scores both (Hugging
Face's through `HFAdapter`) on WikiText-2 validation in fp32.
"""

from __future__ import annotations

import functools
import time

import torch

from benchmarks.common import Bench, HFAdapter, hf_labels, hf_loss, hf_model, model_config, synchronize
from benchmarks.data import prepared
from bertforge.batches import real_tokens
from bertforge.config import DataConfig, RunConfig, TrainConfig
from bertforge.evaluate import evaluation_batches, pretraining_metrics
from bertforge.model import BertForPreTraining
from bertforge.optimizer import Schedule, build_optimizer
from bertforge.pretrain import epoch_batches, masked_lm_and_nsp_loss
from bertforge.runtime import autocast, to_device

BATCH_SIZE = 32
LEARNING_RATE = 1e-3  # the demo recipe's


class Contender:
    """One model in the race: its loss, optimizer, schedule, own clock and position in the batches."""

    def __init__(self, name, model, loss_fn, precision, batches, train: TrainConfig, device):
        self.name, self.model, self.loss_fn, self.precision = name, model.to(device), loss_fn, precision
        self.batches, self.device = batches, device
        self.optimizer = build_optimizer(self.model, train, device)
        self.schedule = Schedule(train)
        self.spent = 0.0
        self.steps = self.tokens = self.epoch = self.index = 0

    def done(self) -> bool:
        return self.schedule.progress(self.steps, self.spent) >= 1.0

    def next_batch(self) -> dict:
        dataset = self.batches(self.epoch)
        if self.index == len(dataset):
            self.epoch, self.index = self.epoch + 1, 0
            dataset = self.batches(self.epoch)
        batch = dataset[self.index]
        self.index += 1
        return batch

    def step(self) -> None:
        start = time.perf_counter()
        batch = self.next_batch()
        self.tokens += real_tokens(batch)  # a batch without padding has no attention_mask
        if self.loss_fn is hf_loss:
            batch["hf_labels"], _ = hf_labels(batch)
        batch = to_device(batch, self.device)
        for group in self.optimizer.param_groups:
            group["lr"] = self.schedule.learning_rate(self.schedule.progress(self.steps + 1, self.spent))
        self.model.train()
        with autocast(self.device, self.precision):
            loss = self.loss_fn(self.model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        synchronize(self.device)
        self.spent += time.perf_counter() - start
        self.steps += 1


def ours_loss(model, batch):
    return masked_lm_and_nsp_loss(model, batch, model.config.vocab_size)[0]  # as many rows as tokens


TRAINED_PRECISIONS = ("fp32", "bf16")  # fp16 would need loss scaling, which neither contender here has


def default_precision(device: torch.device) -> str:
    """bf16 where the hardware has it (what the step benchmark finds fastest there), else fp32."""
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32"


def fastest(step_rows: list[dict], preset: str, name: str, device: torch.device) -> str:
    """The precision (fp32 or bf16) in which `name` ran fastest in this run's step benchmark, else
    the default."""
    rows = [
        row
        for row in step_rows
        if row["preset"] == preset
        and f"{name}_tokens_per_s" in row
        and row["precision"] in TRAINED_PRECISIONS
    ]
    if not rows:
        return default_precision(device)
    return max(rows, key=lambda row: row[f"{name}_tokens_per_s"])["precision"]


def run(minutes: float, bench: Bench, step_rows: list[dict]) -> dict:
    preset = "tiny" if bench.quick else "mini"
    tokenizer, train_shards, valid_shards = prepared(bench.quick, bench.workdir, bench.cache_dir)
    config = RunConfig()
    config.model = model_config(preset, tokenizer.vocab_size)
    config.train = TrainConfig(
        batch_size=BATCH_SIZE, learning_rate=LEARNING_RATE, warmup_ratio=0.1, max_minutes=minutes,
        max_steps=10**9,
    )  # fmt: skip
    batches = functools.lru_cache(maxsize=2)(
        epoch_batches(train_shards, tokenizer, config, config.data.max_seq_length)
    )
    torch.manual_seed(0)
    ours = BertForPreTraining(config.model)
    reference = hf_model(config.model, ours.state_dict())
    precisions = {name: fastest(step_rows, preset, name, bench.device) for name in ("bertforge", "hf")}
    contenders = [
        Contender("bertforge", ours, ours_loss, precisions["bertforge"], batches, config.train, bench.device),
        Contender("hf", reference, hf_loss, precisions["hf"], batches, config.train, bench.device),
    ]
    bench.log(f"quality: {preset}, {minutes:g} min each ({precisions})")
    while not all(contender.done() for contender in contenders):
        for contender in contenders:
            if not contender.done():
                contender.step()
    valid = DataConfig(max_seq_length=config.data.max_seq_length, eval_max_pairs=128 if bench.quick else 2000)
    valid_batches = evaluation_batches(valid_shards, tokenizer, valid)
    result = {"preset": preset, "minutes": minutes, "batch": BATCH_SIZE, "valid_pairs": valid.eval_max_pairs}
    for contender, model in zip(contenders, (ours, HFAdapter(reference)), strict=True):
        bench.log(f"quality: evaluating {contender.name}")
        result[contender.name] = {
            "precision": contender.precision,
            "steps": contender.steps,
            "tokens": contender.tokens,
            "train_seconds": contender.spent,
            **pretraining_metrics(model, valid_batches, tokenizer.vocab_size, "fp32"),
        }
    result["accuracy_gain"] = result["bertforge"]["mlm_accuracy"] - result["hf"]["mlm_accuracy"]
    return result
