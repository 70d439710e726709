"""Run the benchmark suite: print a table and write JSON (`make bench`, or `python -m benchmarks.run`).

    python -m benchmarks.run                  # all but glue, ner and infer (about 20 minutes on 2 CPU cores)
    python -m benchmarks.run --quick          # CI-sized: seconds per measurement, tiny model
    python -m benchmarks.run --only step --only e2e
    python -m benchmarks.run --only quality --minutes 10
    python -m benchmarks.run --only glue --glue-model runs/mini-30min   # target: at most 60 min on 2 cores
    python -m benchmarks.run --only ner    # CoNLL-2003, BERT-Mini, 3 epochs: target at most 10 min on 2 cores
    python -m benchmarks.run --only infer  # classify against transformers' pipeline, SST-2 and RTE dev

Every ratio is measured in this one run, on this machine, with one thread count.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import e2e, glue, infer, ner, prep, quality, step
from benchmarks.common import Bench, keep_freed_memory, machine, matmul_rate
from bertforge import flops
from bertforge.cache import default_cache_dir
from bertforge.glue_report import comparison_cells
from bertforge.runtime import resolve_device

MEASUREMENTS = ("prep", "step", "e2e", "quality", "glue", "ner", "infer")
ON_REQUEST = ("ner", "infer")  # run only when --only names them
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized: tiny model, slices of WikiText-2")
    parser.add_argument("--only", action="append", choices=MEASUREMENTS, help="run only this (repeatable)")
    parser.add_argument("--minutes", type=float, help="training minutes per model for quality (default 5)")
    parser.add_argument("--presets", nargs="+", help="step presets (default: tiny mini small)")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=PRECISIONS)
    parser.add_argument("--batch-size", type=int, help="sequences per step (default 32; quick 8)")
    parser.add_argument("--seq-len", type=int, nargs="+", default=[128], help="step sequence lengths")
    parser.add_argument("--dropout", type=float, help="step: both models' dropout (default 0.1)")
    parser.add_argument("--compile", action="store_true", help="torch.compile both models in the step test")
    parser.add_argument("--rounds", type=int, help="timed rounds per step measurement (default 6)")
    parser.add_argument("--e2e-steps", type=int, help="pretraining steps for e2e (default 60)")
    parser.add_argument(
        "--workers",
        type=int,
        default=-1,
        help="e2e: runtime.num_workers (default -1: 2 on CUDA, none on CPU)",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        help="the GPU's dense bf16 peak in TFLOP/s, for MFU (default: bertforge.flops' table of known GPUs)",
    )
    parser.add_argument(
        "--glue-model",
        type=Path,
        help="glue: the pretrained model to fine-tune (its target is about configs/mini-30min.toml's); "
        "giving it adds glue to the default measurements",
    )
    parser.add_argument(
        "--glue-data",
        type=Path,
        default=Path(glue.GLUE_DATA),
        help="glue, infer: the folder above GLUE's task folders (default $BERTFORGE_GLUE or ../shared/data)",
    )
    parser.add_argument(
        "--ner-model", type=Path, help="ner: a pretrained model (default: BERT-Mini from random weights)"
    )
    parser.add_argument(
        "--ner-data",
        type=Path,
        default=Path(ner.CONLL_DATA),
        help="ner: the folder of CoNLL-2003's train.txt and dev.txt (default $BERTFORGE_CONLL)",
    )
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="glibc: serve large blocks from the heap and keep freed memory (both contenders; see README)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda")
    parser.add_argument("--cache-dir", type=Path, help="tokenizer and shard cache (default $BERTFORGE_CACHE)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON file (default {RESULTS})")
    return parser.parse_args(argv)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.keep_freed_memory:
        keep_freed_memory()
    only = args.only or [
        name for name in MEASUREMENTS if (name != "glue" or args.glue_model) and name not in ON_REQUEST
    ]
    if "glue" in only and (why := glue.refusal(args.glue_model, args.glue_data, args.quick)):
        print(f"error: {why}", file=sys.stderr)
        return 2
    if "ner" in only and (why := ner.refusal(args.ner_model, args.ner_data)):
        print(f"error: {why}", file=sys.stderr)
        return 2
    if "infer" in only and (why := infer.refusal(args.glue_data)):
        print(f"error: {why}", file=sys.stderr)
        return 2
    device = resolve_device(args.device)
    precisions = [p for p in args.precisions if p != "fp16" or device.type == "cuda"]
    with tempfile.TemporaryDirectory(prefix="bertforge-bench-") as workdir:
        log("matmul rate")
        size = 512 if args.quick else 1024  # a CPU without bf16 units takes seconds per bf16 1024^3 product
        rates = {p: matmul_rate(dtype(p), device, n=size) for p in precisions}
        cache_dir = args.cache_dir or default_cache_dir()
        peak = gpu_peak(device, args.peak_tflops)
        bench = Bench(device, rates, args.quick, Path(workdir), cache_dir, log, args.compile, peak)
        about = machine() | {"keep_freed_memory": args.keep_freed_memory}
        results = {"machine": about, "quick": args.quick, "matmul_flops": rates, "peak_flops": peak}
        run_all(args, only, precisions, bench, results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(report(results))
    print(f"\nJSON: {args.out}")
    return 0


def run_all(args, only: list[str], precisions: list[str], bench: Bench, results: dict) -> None:
    quick = args.quick
    batch = args.batch_size or (8 if quick else 32)
    if "prep" in only:
        results["prep"] = prep.run(bench)
    if "step" in only:
        presets = args.presets or (["tiny"] if quick else ["tiny", "mini", "small"])
        rounds = args.rounds or (2 if quick else 6)  # even: each contender goes first as often
        warmup = (3 if args.compile else 1) if quick else (4 if args.compile else 2)
        timing = (warmup, rounds, 1 if quick else 2)
        results["step"] = step.run(presets, precisions, args.seq_len, batch, bench, timing, args.dropout)
    if "e2e" in only:
        preset, steps = ("tiny", 15) if quick else ("mini", 60)
        results["e2e"] = [
            e2e.measure(preset, p, batch, args.e2e_steps or steps, args.workers, bench) for p in precisions
        ]
    if "quality" in only:
        minutes = args.minutes or (0.05 if quick else 5.0)
        results["quality"] = quality.run(minutes, bench, results.get("step", []))
    if "glue" in only:
        results["glue"] = glue.run(args.glue_model, args.glue_data, bench)
    if "ner" in only:
        results["ner"] = ner.run(args.ner_model, args.ner_data, bench)
    if "infer" in only:
        results["infer"] = infer.run(args.glue_data, bench)


def dtype(precision: str) -> torch.dtype:
    return PRECISIONS[precision]


def gpu_peak(device: torch.device, tflops: float | None) -> float | None:
    """The GPU's dense bf16 peak in FLOP/s: given, or from `bertforge.flops`' table; None on a CPU."""
    if device.type != "cuda":
        return None
    return tflops * 1e12 if tflops else flops.peak_bf16_flops(torch.cuda.get_device_name(device))


def table(columns: dict[str, callable], rows: list[dict]) -> str:
    """A plain-text table: `columns` maps each header to a function of the row giving its cell."""
    cells = [list(columns)] + [[str(cell(row)) for cell in columns.values()] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]

    def render(line: list[str]) -> str:
        padded = [
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        return "  ".join(padded)

    return "\n".join([render(cells[0]), "  ".join("-" * w for w in widths), *map(render, cells[1:])])


def percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def step_table(rows: list[dict]) -> str:
    """The step's table: on a GPU with a known peak MFU, peak memory and attention kernel; elsewhere
    each one's fraction of the matmul probe's rate."""
    columns = {
        "preset": lambda r: r["preset"],
        "precision": lambda r: r["precision"],
        "batch": lambda r: (
            f"{r['batch']} x {r['seq_len']}"
            + (" compiled" if r.get("compiled") else "")
            + (f" dropout {r['dropout']:g}" if r.get("dropout", 0.1) != 0.1 else "")
        ),
        "bertforge tok/s": lambda r: f"{r['bertforge_tokens_per_s']:,.0f}",
        "HF tok/s": lambda r: f"{r['hf_tokens_per_s']:,.0f}",
        "speed-up": lambda r: f"{r['speedup']:.2f}x",
    }
    if all("bertforge_mfu" in row for row in rows):
        columns |= {
            "bertforge MFU": lambda r: percent(r["bertforge_mfu"]),
            "HF MFU (executed)": lambda r: f"{percent(r['hf_mfu'])} ({percent(r['hf_executed_mfu'])})",
        }
    else:
        columns |= {
            "bertforge of limit": lambda r: percent(r["bertforge_fraction_of_limit"]),
            "HF of limit": lambda r: percent(r["hf_fraction_of_limit"]),
        }
    if all("bertforge_peak_memory_gib" in row for row in rows):
        columns["peak GiB"] = lambda r: (
            f"{r['bertforge_peak_memory_gib']:.1f} / {r['hf_peak_memory_gib']:.1f}"
        )
    columns["attention"] = lambda r: f"{r['bertforge_attention']} / {r['hf_attention']}"
    return table(columns, rows)


def e2e_table(rows: list[dict]) -> str:
    columns = {
        "preset": lambda r: r["preset"],
        "precision": lambda r: r["precision"],
        "batch": lambda r: r["batch"],
        "workers": lambda r: r["num_workers"],
        "epochs": lambda r: f"{r['epochs']:.1f}",
        "e2e real tok/s": lambda r: f"{r['e2e_real_tokens_per_s']:,.0f}",
        "step tok/s": lambda r: f"{r['step_tokens_per_s']:,.0f}",
        "e2e / step": lambda r: percent(r["fraction_of_step"]),
        "padding": lambda r: percent(r["padding_fraction"]),
    }
    if all("mfu" in row for row in rows):
        columns["MFU"] = lambda r: percent(r["mfu"])
    return table(columns, rows)


def prep_table(result: dict) -> str:
    rows = [{"name": name, **r} for name, r in result.items() if isinstance(r, dict)]
    return table(
        {
            "corpus": lambda r: r["name"],
            "MB": lambda r: f"{r['input_mb']:.1f}",
            "tokenizer s": lambda r: f"{r['tokenizer_s']:.1f}",
            "shards s": lambda r: f"{r['shards_s']:.1f}",
            "total s": lambda r: f"{r['seconds']:.1f}",
            "MB/s": lambda r: f"{r['mb_per_s']:.2f}",
            "peak RSS MB": lambda r: f"{r['peak_rss_mb']:.0f}",
            "of which at start": lambda r: f"{r['baseline_rss_mb']:.0f}",
        },
        rows,
    )


def quality_table(result: dict) -> str:
    rows = [{"name": name, **result[name]} for name in ("bertforge", "hf")]
    return table(
        {
            "model": lambda r: r["name"],
            "precision": lambda r: r["precision"],
            "steps": lambda r: r["steps"],
            "tokens": lambda r: f"{r['tokens']:,}",
            "MLM accuracy": lambda r: f"{r['mlm_accuracy']:.4f}",
            "MLM loss": lambda r: f"{r['mlm_loss']:.3f}",
            "NSP accuracy": lambda r: f"{r.get('nsp_accuracy', float('nan')):.4f}",
        },
        rows,
    )


def glue_table(rows: list[dict]) -> str:
    return table(
        {
            "task": lambda r: r["task"],
            "arm": lambda r: r["arm"],
            "runs": lambda r: r["runs"],
            "train examples": lambda r: f"{r['train_examples']:,}",
            "fine-tuning min": lambda r: f"{r['minutes']:.2f}",
            "median dev score": lambda r: f"{r['score']:.1f}",
            "median dev figures": lambda r: ", ".join(f"{k} {v:.1f}" for k, v in r["figures"].items()),
            "gain, p sign, p boot": gain_cells,
            "majority class": lambda r: {True: "at chance", False: "beaten"}.get(r.get("at_chance"), ""),
        },
        rows,
    )


def gain_cells(row: dict) -> str:
    """The pretrained arm's paired gain over scratch, as `glue`'s table gives it; blank for scratch."""
    return ", ".join(comparison_cells(row["comparison"])) if row["comparison"] else ""


def glue_lines(g: dict) -> list[str]:
    verdict = {True: "met", False: "NOT met", None: "not judged (--quick is not its workload)"}
    average = ", ".join(f"{arm} {score:.1f}" for arm, score in g["average"].items())
    return [
        "",
        f"(5) glue: {', '.join(g['tasks'])}, seeds {','.join(map(str, g['seeds']))}, both arms; "
        f"model {g['model']}, recipes {g['recipes']}",
        glue_table(g["per_task"]),
        f"wall: {g['wall_minutes']:.1f} min ({g.get('jobs', 1)} runs at a time; their own clocks add up to "
        f"{g['fine_tuning_minutes']:.1f} min of fine-tuning); target <= {g['target_minutes']:g} min on 2 CPU "
        f"cores: {verdict[g['target_met']]}",
        f"GLUE average (dev, median over seeds): {average}",
    ]


def report(results: dict) -> str:
    m = results["machine"]
    rates = ", ".join(f"{p} {r / 1e9:,.0f} GFLOP/s" for p, r in results["matmul_flops"].items())
    out = [
        f"\nmachine: {m['gpu'] or m['cpu']}, {m['threads']} threads, torch {m['torch']}, "
        f"transformers {m['transformers']}, {m['date']}" + (" (--quick)" if results["quick"] else ""),
        f"matmul rate: {rates}",
    ]
    if "prep" in results:
        p = results["prep"]
        out += ["", f"(3) data preparation (tokenizer training + shards) of {p['corpus']}", prep_table(p)]
        note = " (--quick: below ~2 MB the batches are smaller than their cap, so memory grows)"
        out.append(
            f"peak memory x10 / x1: {p['memory_ratio']:.2f} (target <= 1.5)"
            + (note if results["quick"] else "")
        )
    if "step" in results:
        out += ["", "(1) training step: forward, backward, clip, AdamW; full-length rows, 15% masked, NSP"]
        out.append(step_table(results["step"]))
        if results["machine"]["gpu"] and not results.get("peak_flops"):
            gpu = results["machine"]["gpu"]
            out.append(f"MFU: no dense bf16 peak known for {gpu}; give it with --peak-tflops")
    if "e2e" in results:
        out += ["", "(2) end to end: bertforge pretrain on WikiText-2 train, real tokens (padding excluded)"]
        out.append(e2e_table(results["e2e"]))
    if "quality" in results:
        q = results["quality"]
        out += ["", f"(4) quality at equal time: {q['preset']}, {q['minutes']:g} min each, WikiText-2 valid"]
        out.append(quality_table(q))
    if "glue" in results:
        out += glue_lines(results["glue"])
    if "ner" in results:
        out += ner.lines(results["ner"])
    if "infer" in results:
        out += infer.lines(results["infer"], table)
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
