"""The attention paths for a padded batch: which one a training step on a GPU should take.

    PYTHONPATH=src python3 -m benchmarks.padding --out DIR              # a GPU: BERT-base, bf16
    PYTHONPATH=src python3 -m benchmarks.padding --out DIR --smoke      # a CPU: tiny shapes, the plumbing

bertforge's step (`benchmarks.step`: forward under autocast, backward, clipping, fused AdamW) on
one batch with about `--padding` of its positions padding (a pretraining run's batches have about
a quarter), eager and compiled, by each path attention can take for it:

- `varlen`: each sequence's real tokens attend among themselves through torch's jagged nested
  tensors (`bertforge.varlen`), which send SDPA to its variable-length flash kernel;
- `key mask`: a (B, 1, 1, T) key-padding mask, which SDPA runs with one of its kernels that take a mask
  (each row names the one it ran);
- `no padding`: the same model on a full-length batch of the same shape, the ceiling;
- `hf`: `transformers.BertForPreTraining` (SDPA) on the padded batch with its attention mask.

Steps alternate round by round (`benchmarks.common.interleaved`). Tokens/s count every position of
the batch, padding too, so the rows compare time per step. Writes padding.json and padding.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from benchmarks.common import attention_kernels, hf_loss, hf_model, interleaved, model_config
from benchmarks.step import full_length_batch, make_step, ours_loss
from bertforge.model import BertForPreTraining

PATHS = ("varlen", "key mask", "no padding", "hf")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.padding", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for padding.json and padding.md")
    parser.add_argument("--smoke", action="store_true", help="on a CPU, tiny shapes: the plumbing")
    parser.add_argument("--padding", type=float, default=0.25, help="share of the positions that is padding")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    return parser.parse_args(argv)


def contenders(config, device: torch.device, batches: dict, precision: str, compiled: bool) -> dict:
    """path -> its step closure, every path from the same initial weights."""
    torch.manual_seed(0)
    weights = BertForPreTraining(config).state_dict()
    steps = {}
    for path in PATHS:
        model = hf_model(config, weights) if path == "hf" else BertForPreTraining(config)
        if path != "hf":
            model.load_state_dict(weights)
            model.bert.varlen = path == "varlen"
        loss = hf_loss if path == "hf" else ours_loss
        batch = batches["full" if path == "no padding" else "padded"]
        step, _ = make_step(model.to(device), loss, batch, precision, device, compiled)
        steps[path] = step
    return steps


def measure(args: argparse.Namespace, device: torch.device) -> list[dict]:
    preset, precision = ("tiny", "fp32") if args.smoke else ("base", "bf16")
    config = model_config(preset, 30522 if device.type == "cuda" else 1000)
    shape = (config.vocab_size, args.batch_size, args.seq_len, 0)
    batches = {
        name: {k: v.to(device) for k, v in full_length_batch(*shape, share).items()}
        for name, share in (("padded", args.padding), ("full", 0.0))
    }
    padded = 1 - batches["padded"]["attention_mask"].float().mean().item()
    timing = (2, 2, 2) if args.smoke else (3, 5, 5)
    rows = []
    for mode in args.modes:
        steps = contenders(config, device, batches, precision, mode == "compiled")
        seconds = interleaved(steps, *timing, device).seconds
        for path, step in steps.items():
            median = statistics.median(seconds[path])
            rows.append({
                "mode": mode, "path": path, "preset": preset, "precision": precision,
                "batch": args.batch_size, "seq_len": args.seq_len,
                "padding": 0.0 if path == "no padding" else padded,
                "seconds_per_step": seconds[path], "tokens_per_s": args.batch_size * args.seq_len / median,
                "attention": attention_kernels(step, device),
            })  # fmt: skip
        del steps
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def table(rows: list[dict], device_name: str) -> str:
    lines = [
        f"# Attention for a padded batch: {device_name}, {rows[0]['preset']} {rows[0]['precision']}, "
        f"{rows[0]['batch']} x {rows[0]['seq_len']}, {rows[0]['padding']:.0%} padding",
        "",
        "| mode | path | tokens/s | against varlen | attention |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for row in rows:
        base = next(r for r in rows if r["mode"] == row["mode"] and r["path"] == "varlen")
        ratio = row["tokens_per_s"] / base["tokens_per_s"]
        figures = f"{row['tokens_per_s']:,.0f} | {ratio:.2f}x | {row['attention']}"
        lines.append(f"| {row['mode']} | {row['path']} | {figures} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.smoke:
        args.batch_size, args.seq_len, args.modes = 4, 32, ["eager"]
    rows = measure(args, device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "padding.json").write_text(json.dumps({"device": device_name, "rows": rows}, indent=1))
    text = table(rows, device_name)
    (args.out / "padding.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
