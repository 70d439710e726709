"""(2) End-to-end pretraining throughput on WikiText-2, as a fraction of the step throughput.

`bertforge.pretrain.pretrain` runs for real (pairs, dynamic masking, collation, DataLoader workers as
the run sets them, the loop, its logging) with evaluation off; its own log windows give real
(non-padding) tokens per second over their time (an epoch's start included), and on CUDA its MFU.
The step throughput of the same model, precision and batch (full 128-token rows) is measured in the
same process just before and just after, and the padding fraction and the epochs the run went
through are counted on its batches.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from benchmarks import step
from benchmarks.common import Bench
from benchmarks.data import prepared, wikitext
from bertforge.batches import real_tokens
from bertforge.config import RunConfig, apply_preset
from bertforge.pretrain import epoch_batches, pretrain
from bertforge.runtime import data_workers, size_embeddings
from bertforge.shards import TokenShards

LOG_EVERY = 5


def run_config(
    corpus: Path, preset: str, precision: str, batch_size: int, steps: int, workers: int, device: torch.device
) -> RunConfig:
    config = RunConfig()
    apply_preset(config, preset)
    config.data.corpus = str(corpus)
    config.data.max_seq_length = step.SEQ_LEN
    config.train.batch_size = batch_size
    config.train.max_steps = steps
    config.train.eval_every = steps  # no validation text: "evaluation" is empty, one checkpoint at the end
    config.train.log_every = LOG_EVERY
    config.runtime.precision = precision
    config.runtime.device = str(device)
    config.runtime.num_workers = workers
    return config


def padding_and_epochs(
    shards: TokenShards, tokenizer, config: RunConfig, micro_batches: int
) -> tuple[float, float]:
    """Share of the token slots in the run's first `micro_batches` batches that are padding, and the
    epochs that many batches make."""
    batches = epoch_batches(shards, tokenizer, config, config.data.max_seq_length)(0)
    real = slots = 0
    for index in range(min(micro_batches, len(batches))):
        batch = batches[index]  # a batch without padding has no attention_mask
        real += real_tokens(batch)
        slots += batch["input_ids"].numel()
    return 1.0 - real / slots, micro_batches / len(batches)


def measure(preset: str, precision: str, batch_size: int, steps: int, workers: int, bench: Bench) -> dict:
    tokenizer, shards, _ = prepared(bench.quick, bench.workdir, bench.cache_dir)  # what pretrain() reads
    corpus = wikitext("train", bench.quick, bench.workdir)
    config = run_config(corpus, preset, precision, batch_size, steps, workers, bench.device)
    config.runtime.compile = bench.compile  # the step it is divided by is compiled as well
    sized = RunConfig()
    size_embeddings(sized, tokenizer.vocab_size, bench.device)  # on CUDA, rows padded as pretrain() pads them

    def step_reference(when: str) -> float:
        bench.log(f"e2e: {preset} {precision}, step reference {when}")
        vocab = sized.model.vocab_size  # as the model pretrain() builds
        row = step.measure(
            preset, precision, batch_size, bench, (1, 2, 2), False, vocab_size=vocab, kernels=False
        )
        return row["bertforge_tokens_per_s"]

    before = step_reference("before")
    bench.log(f"e2e: {preset} {precision}, pretraining {steps} steps on WikiText-2 train")
    out = bench.workdir / f"e2e-{preset}-{precision}-{workers}"
    pretrain(config, out, cache_dir=bench.cache_dir, show_progress=False)
    after = step_reference("after")
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # The first window holds the warm-up (first steps, allocator, DataLoader start).
    train_lines = [line for line in lines if line["split"] == "train"][1:]
    windows = [line["tokens_per_s"] for line in train_lines]
    # Windows of equal steps: the harmonic mean of their rates is tokens over time, stalls included.
    e2e, step_rate = statistics.harmonic_mean(windows), (before + after) / 2
    padding, epochs = padding_and_epochs(shards, tokenizer, config, steps)
    row = {
        "preset": preset,
        "precision": precision,
        "batch": batch_size,
        "steps": steps,
        "num_workers": data_workers(config.runtime, bench.device),
        "e2e_real_tokens_per_s": e2e,
        "step_tokens_per_s": step_rate,
        "fraction_of_step": e2e / step_rate,
        "padding_fraction": padding,
        "epochs": epochs,
        "windows_tokens_per_s": windows,
    }
    if train_lines and all("mfu" in line for line in train_lines):  # CUDA, a GPU of known peak
        row["mfu"] = statistics.mean(line["mfu"] for line in train_lines)
    return row
