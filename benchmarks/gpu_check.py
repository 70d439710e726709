"""The device check: what a GPU needs checked, in one command of at most 8 minutes on one H100 or H200.

    make gpu-check                                            # results in $OUT, else runs/gpu-check
    PYTHONPATH=src python3 -m benchmarks.gpu_check --out DIR  # the same without make
    PYTHONPATH=src python3 -m benchmarks.gpu_check --out DIR --smoke   # CPU, tiny shapes: the plumbing

It needs torch, transformers, tokenizers, safetensors, numpy, tqdm and matplotlib (and pytest for the
tests, which are reported as not run where it is missing), no network and no data beside the
repository: it generates its text (`benchmarks.synthetic`). In order, each part within what is left
of the time budget (`--budget-s`; a part that no longer fits is reported as skipped):

1. tests: `tests/test_gpu.py`, `tests/test_gpu_paths.py` (not the slow CPU-compile ones) and
   `tests/test_unpadded.py` (variable-length attention against the masked one) on the
   GPU, on a generated corpus (`BERTFORGE_TEST_CORPUS`);
2. step: BERT-base, bf16, sequence 128 (batch 256) and 512 (batch 64), eager and compiled:
   bertforge's step against `transformers.BertForPreTraining` (SDPA), same weights and batch,
   alternating rounds (`benchmarks.step`): speed-up, MFU of each, peak memory, attention kernel;
3. pretrain: `bertforge pretrain --preset base` (batch 256 x 128, bf16) on 6 MB of generated text
   for a minute, eager and then compiled (its compilation inside its minute): steady tokens/s (the
   first log window left out), MFU, peak memory, end to end against the step of the same shape and
   mode, epochs, padding, and the compilation's time (the difference of the runs' first log lines).

Under `--out` it writes summary.md (one screen: read it first), results.json, tests.log,
pretrain-eager.log, pretrain-compiled.log and each run's metrics.jsonl: 7 files.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 465  # of the 8 minutes, leaving room for starting Python, the summary and the files
TESTS_S = 140  # at most, for the tests (106 s on an H200 host)
STARTUP_S = 40  # a pretraining run's start (imports, data) and end (checkpoint, model, plot)
SMOKE_STEPS_RUN = 6  # --smoke: the pretraining run's steps, 3 log windows
PARTS = ("tests", "step", "pretrain")
GPU_TESTS = ("tests/test_gpu.py", "tests/test_gpu_paths.py", "tests/test_unpadded.py")
# The targets' row first: a budget that runs short leaves out the later ones.
GPU_STEPS = [("compiled", 128, 256), ("eager", 128, 256), ("compiled", 512, 64), ("eager", 512, 64)]
SMOKE_STEPS = [("eager", 32, 4), ("eager", 64, 2)]
SMOKE_VOCAB = 1000
PRETRAIN_BATCH, PRETRAIN_LENGTH = 256, 128


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the results (at most 8 files)")
    parser.add_argument("--smoke", action="store_true", help="on a CPU, tiny shapes: the check's plumbing")
    parser.add_argument("--only", action="append", choices=PARTS, help="run only this part (repeatable)")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help=f"all parts' seconds ({BUDGET_S})")
    parser.add_argument(
        "--minutes", type=float, default=1.0, help="pretrain: each run's minutes, compilation included (1)"
    )
    parser.add_argument(
        "--peak-tflops", type=float, help="the GPU's dense bf16 peak, where bertforge.flops lacks it"
    )
    parser.add_argument("--step-child", type=Path, help=argparse.SUPPRESS)  # the step part's own process
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.step_child:
        return step_child(args)
    if not args.smoke and not torch.cuda.is_available():
        print(
            "error: no CUDA GPU is visible; on a CPU run the check's plumbing with --smoke", file=sys.stderr
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + args.budget_s
    results = {"machine": machine(), "smoke": args.smoke, "budget_s": args.budget_s, "parts": {}}
    with tempfile.TemporaryDirectory(prefix="bertforge-gpu-check-") as work:
        work = Path(work)
        for part in args.only or PARTS:
            try:
                results["parts"][part] = PART_RUNS[part](args, work, deadline, results["parts"])
            except Exception:  # the other parts still run; the summary names the failure
                results["parts"][part] = {"status": "failed", "error": traceback.format_exc(limit=4)}
    results["wall_s"] = time.monotonic() - started
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    summary = render_summary(results)
    (args.out / "summary.md").write_text(summary, encoding="utf-8")
    print(summary)
    return 0 if all(part.get("status") == "ok" for part in results["parts"].values()) else 1


def machine() -> dict:
    import transformers

    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def child_env(**extra: str) -> dict:
    """This process's environment with `src` on the path, as `PYTHONPATH=src python3 -m ...` has it."""
    paths = [str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p), **extra)


def run_child(command: list[str], log: Path, timeout: float, env: dict | None = None) -> tuple[int, float]:
    """Run `command` from the repository root, its output into `log`; (exit status, seconds).
    A child past `timeout` is stopped, with status -9."""
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        try:
            done = subprocess.run(
                command,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env or child_env(),
                timeout=timeout,
            )
            status = done.returncode
        except subprocess.TimeoutExpired:
            status = -9
    return status, time.monotonic() - started


# 1. The tests.


def run_tests(args, work: Path, deadline: float, done: dict) -> dict:
    if importlib.util.find_spec("pytest") is None:
        return {"status": "not run", "why": "pytest is not installed here (pip install pytest)"}
    left = deadline - time.monotonic()
    if left < 30:
        return {"status": "skipped", "why": "no time left"}
    corpus = work / "test-corpus"
    corpus.mkdir()
    from benchmarks.synthetic import write_corpus

    write_corpus(corpus / "train.txt", 0.6, seed=1)
    write_corpus(corpus / "valid.txt", 0.1, seed=2)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow"]
    command += list(GPU_TESTS) + (["--collect-only"] if args.smoke else [])
    status, seconds = run_child(
        command, args.out / "tests.log", min(left, TESTS_S), child_env(BERTFORGE_TEST_CORPUS=str(corpus))
    )
    tail = (args.out / "tests.log").read_text(encoding="utf-8", errors="replace").strip().splitlines()
    counts = dict(
        (kind, int(n))
        for n, kind in re.findall(
            r"(\d+) (passed|failed|skipped|errors?|deselected)", tail[-1] if tail else ""
        )
    )
    if args.smoke:
        collected = re.search(r"(\d+) tests? collected", "\n".join(tail[-3:]))
        counts = {"collected": int(collected.group(1))} if collected else {}
    ok = status == 0 and bool(counts)
    return {
        "status": "ok" if ok else "failed",
        "exit": status,
        "seconds": seconds,
        "counts": counts,
        "last_line": tail[-1] if tail else "",
    }


# 2. The step against Hugging Face.


def run_step(args, work: Path, deadline: float, done: dict) -> dict:
    reserved = pretrain_seconds(args) if "pretrain" in (args.only or PARTS) else 0.0
    budget = min(deadline - time.monotonic() - reserved, 220)
    if budget < 40:
        return {"status": "skipped", "why": f"{budget:.0f} s left before pretraining's {reserved:.0f}"}
    rows_file = work / "step.json"
    command = [
        sys.executable,
        "-m",
        "benchmarks.gpu_check",
        "--out",
        str(args.out),
        "--step-child",
        str(rows_file),
    ]
    command += (["--smoke"] if args.smoke else []) + (
        ["--peak-tflops", str(args.peak_tflops)] if args.peak_tflops else []
    )
    # The child plans within its budget; stopped at the end of it, it leaves the shapes it finished.
    status, seconds = run_child(command + ["--budget-s", str(budget - 15)], work / "step.log", budget)
    rows = json.loads(rows_file.read_text(encoding="utf-8")) if rows_file.exists() else []
    failed = not rows or any("error" in row for row in rows)
    result = {
        "status": "failed" if failed else ("ok" if status == 0 else "partial"),
        "exit": status,
        "seconds": seconds,
        "rows": rows,
    }
    if status == -9:
        result["why"] = f"stopped after {seconds:.0f} s, its budget"
    if result["status"] != "ok":
        result["log_tail"] = (work / "step.log").read_text(encoding="utf-8", errors="replace")[-3000:]
    return result


def step_child(args) -> int:
    """In its own process (a hung compilation cannot stop the check): each shape and mode in turn,
    the rows written after each, the last ones left out when the budget runs short."""
    from benchmarks import step
    from benchmarks.common import Bench, matmul_rate
    from bertforge.flops import peak_bf16_flops

    device = torch.device("cpu" if args.smoke else "cuda")
    peak = (
        args.peak_tflops * 1e12
        if args.peak_tflops
        else (None if args.smoke else peak_bf16_flops(torch.cuda.get_device_name()))
    )
    size = 256 if args.smoke else 1024  # a CPU without bf16 units takes seconds per bf16 1024^3 product
    rates = {"bf16": matmul_rate(torch.bfloat16, device, seconds=0.2, n=size)}
    preset, timing = ("tiny", (1, 2, 1)) if args.smoke else ("base", (3, 6, 5))
    deadline, rows = time.monotonic() + args.budget_s, []
    for mode, seq_len, batch in SMOKE_STEPS if args.smoke else GPU_STEPS:
        if rows and time.monotonic() > deadline - (90 if mode == "compiled" else 20):
            break
        bench = Bench(
            device,
            rates,
            args.smoke,
            Path(tempfile.gettempdir()),
            Path(tempfile.gettempdir()),
            print,
            mode == "compiled",
            peak,
        )
        started = time.monotonic()
        vocab = SMOKE_VOCAB if args.smoke else 30522
        try:
            row = step.measure(preset, "bf16", batch, bench, timing, vocab_size=vocab, seq_len=seq_len)
        except Exception as error:  # a failed compilation, say: the next shape still runs
            row = {"seq_len": seq_len, "batch": batch, "compiled": mode == "compiled", "error": repr(error)}
        row["wall_s"] = time.monotonic() - started
        rows.append(row)
        args.step_child.write_text(json.dumps(rows), encoding="utf-8")
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


# 3. Pretraining for a minute, eager and compiled.


def run_pretrain(args, work: Path, deadline: float, done: dict) -> dict:
    from benchmarks.synthetic import write_corpus

    corpus = write_corpus(work / "pretrain.txt", 0.3 if args.smoke else 6.0, seed=3)
    cache = work / "cache"
    tokenizer, shards = warm_cache(corpus, cache)
    modes = ["eager"] if args.smoke else ["eager", "compiled"]
    runs = {}
    for mode in modes:
        runs[mode] = pretrain_run(args, work, corpus, cache, mode, deadline - time.monotonic())
    step_rows = done.get("step", {}).get("rows", [])
    for mode, run in runs.items():
        if run.get("status") == "ok":
            describe_run(run, mode, step_rows, tokenizer, shards, args.smoke)
        run.pop("metrics", None)  # in metrics-<mode>.jsonl
    eager, compiled = runs.get("eager", {}), runs.get("compiled", {})
    if "first_line_s" in eager and "first_line_s" in compiled:
        compiled["compile_s"] = compiled["first_line_s"] - eager["first_line_s"]
    ok = all(run.get("status") == "ok" for run in runs.values())
    return {"status": "ok" if ok else "failed", "runs": runs}


def pretrain_seconds(args) -> float:
    """What the pretraining part needs: its runs' minutes (a compiled run's compilation is in its
    budget, the rest of the minute steady), their start and their end."""
    runs = 1 if args.smoke else 2
    return runs * ((5 if args.smoke else args.minutes * 60) + STARTUP_S)


def warm_cache(corpus: Path, cache: Path):
    """The tokenizer and shards both runs read, made once before them, so neither run's start includes
    them (and compile time is the difference of their starts)."""
    from bertforge.cache import cached_shards, cached_tokenizer
    from bertforge.config import TokenizerConfig

    tokenizer = cached_tokenizer([corpus], TokenizerConfig(), "auto", cache)
    return tokenizer, cached_shards(corpus, tokenizer, "auto", cache, show_progress=False)


def pretrain_run(args, work: Path, corpus: Path, cache: Path, mode: str, left: float) -> dict:
    needed = pretrain_seconds(args) / (1 if args.smoke else 2)
    if left < needed:
        return {"status": "skipped", "why": f"{left:.0f} s left, {needed:.0f} needed"}
    run = work / f"run-{mode}"
    preset, batch = ("tiny", 8) if args.smoke else ("base", PRETRAIN_BATCH)
    command = [sys.executable, "-m", "bertforge", "pretrain", "--preset", preset, "--corpus", str(corpus)]
    command += ["--out", str(run), "--cache-dir", str(cache), "--batch-size", str(batch), "--quiet"]
    if args.smoke:
        command += ["--max-steps", str(SMOKE_STEPS_RUN)]
    else:
        command += ["--max-minutes", str(args.minutes), "--max-steps", "1000000"]
    settings = {
        "data.max_seq_length": PRETRAIN_LENGTH,
        "runtime.precision": "bf16",
        "runtime.compile": str(mode == "compiled").lower(),
        "runtime.device": "cpu" if args.smoke else "cuda",
        "train.log_every": 2 if args.smoke else 10,
        "train.eval_every": 1000000,
    }
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    log = args.out / f"pretrain-{mode}.log"
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        child = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=child_env())
        first_line = watch_first_line(child, run / "metrics.jsonl", started + left)
        try:
            status = child.wait(timeout=max(started + left - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            child.kill()
            status = -9
    minutes = None if args.smoke else args.minutes
    result = {"status": "ok" if status == 0 else "failed", "exit": status, "minutes": minutes}
    result["wall_s"] = time.monotonic() - started
    if first_line is not None:
        result["first_line_s"] = first_line - started
    if (run / "metrics.jsonl").exists():
        shutil.copy(run / "metrics.jsonl", args.out / f"metrics-{mode}.jsonl")
        result["metrics"] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    result["run"] = str(run)
    return result


def watch_first_line(child: subprocess.Popen, metrics: Path, deadline: float) -> float | None:
    """When the run's first train record appeared (its first log window: start and compilation)."""
    while child.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and '"split": "train"' in metrics.read_text(encoding="utf-8", errors="replace"):
            return time.monotonic()
        time.sleep(0.2)
    return None


def describe_run(run: dict, mode: str, step_rows: list, tokenizer, shards, smoke: bool) -> None:
    """A run's steady figures from its train records (the first window, start-up, left out) and
    the step's throughput at its shape and mode."""
    from benchmarks.e2e import padding_and_epochs
    from bertforge.checkpoint import read_config

    train = [line for line in run.pop("metrics", []) if line["split"] == "train"][1:]
    if not train:
        return
    rates = [line["tokens_per_s"] for line in train]
    run["steps"] = train[-1]["step"]
    run["windows"] = len(train)
    run["steady_tokens_per_s"] = len(rates) / sum(1 / rate for rate in rates)  # equal windows: harmonic
    run["slowest_window_tokens_per_s"] = min(rates)
    if all("mfu" in line for line in train):
        run["mfu"] = sum(line["mfu"] for line in train) / len(train)
    if all("peak_memory_gib" in line for line in train):
        run["peak_memory_gib"] = max(line["peak_memory_gib"] for line in train)
    config = read_config(Path(run["run"]))
    run["padding"], run["epochs"] = padding_and_epochs(shards, tokenizer, config, run["steps"])
    shape = (PRETRAIN_LENGTH, PRETRAIN_BATCH) if not smoke else None
    same = [
        r
        for r in step_rows
        if (r["seq_len"], r["batch"]) == shape and r["compiled"] == (mode == "compiled") and "error" not in r
    ]
    if same:
        run["step_tokens_per_s"] = same[0]["bertforge_tokens_per_s"]
        run["e2e_over_step"] = run["steady_tokens_per_s"] / run["step_tokens_per_s"]
        # The step has no padding: the loop's own cost shows in slots, padding counted, against it.
        run["e2e_slots_over_step"] = run["e2e_over_step"] / (1 - run["padding"])


PART_RUNS = {"tests": run_tests, "step": run_step, "pretrain": run_pretrain}


# The summary: one screen.


def render_summary(results: dict) -> str:
    m, parts = results["machine"], results["parts"]
    what = m["gpu"] or "CPU (--smoke: tiny shapes, the plumbing only)"
    lines = [
        f"# bertforge device check: {what}",
        "",
        f"torch {m['torch']}, transformers {m['transformers']}, Python {m['python']}, {m['cpu_count']} CPUs, "
        f"{m['date']}; {results['wall_s'] / 60:.1f} min (budget {results['budget_s'] / 60:.1f})",
        "",
    ]
    for part, render in (("tests", tests_lines), ("step", step_lines), ("pretrain", pretrain_lines)):
        if part in parts:
            lines += render(parts[part]) + [""]
    lines += target_lines(parts)
    lines += [
        "",
        "Files: summary.md, results.json (every figure), tests.log, pretrain-*.log, metrics-*.jsonl",
    ]
    return "\n".join(lines) + "\n"


def not_ok(part: dict) -> list[str]:
    """Why a part (or run) has no figures: its reason, or the last line of its error or log."""
    if part.get("status") == "ok":
        return ["no figures: too few log windows"]
    last = (part.get("error") or part.get("log_tail") or "").strip().splitlines()[-1:]
    return [f"{part['status'].upper()}: {part.get('why') or ' '.join(last)}"]


def tests_lines(part: dict) -> list[str]:
    head = f"## Tests: {', '.join(GPU_TESTS)} (not slow), on generated text"
    if "counts" not in part:
        return [head, *not_ok(part)]
    counts = ", ".join(f"{n} {kind}" for kind, n in part["counts"].items())
    return [head, f"{part['status']}: {counts} in {part['seconds']:.0f} s (tests.log)"]


def step_lines(part: dict) -> list[str]:
    head = ["## Step: BERT-base bf16, bertforge against transformers BertForPreTraining (sdpa)", ""]
    if not part.get("rows"):
        return head + not_ok(part)
    table = [
        "| shape | mode | bertforge tok/s | HF tok/s | speed-up | MFU bertforge | MFU HF (executed) | "
        "peak GiB bf / HF | attention bf / HF | first step s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in part["rows"]:
        if "error" in r:
            mode = "compiled" if r["compiled"] else "eager"
            table.append(f"| {r['seq_len']} x {r['batch']} | {mode} | FAILED: {r['error'][:150]} |")
            continue
        mfu = f"{pct(r.get('bertforge_mfu'))} | {pct(r.get('hf_mfu'))} ({pct(r.get('hf_executed_mfu'))})"
        memory = f"{number(r.get('bertforge_peak_memory_gib'))} / {number(r.get('hf_peak_memory_gib'))}"
        table.append(
            f"| {r['seq_len']} x {r['batch']} | {'compiled' if r['compiled'] else 'eager'} | "
            f"{r['bertforge_tokens_per_s']:,.0f} | {r['hf_tokens_per_s']:,.0f} | {r['speedup']:.2f}x | "
            f"{mfu} | "
            f"{memory} | {r['bertforge_attention']} / {r['hf_attention']} | "
            f"{r['bertforge_first_step_s']:.1f} / {r['hf_first_step_s']:.1f} |"
        )
    return head + table + ([] if part["status"] == "ok" else not_ok(part))


def pretrain_lines(part: dict) -> list[str]:
    head = ["## Pretrain: bertforge pretrain --preset base, 256 x 128, bf16, generated text", ""]
    table = [
        "| mode | minutes | steps | steady tok/s | slowest window | MFU | peak GiB | e2e / step (slots) | "
        "epochs | padding | compile s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode, r in part.get("runs", {}).items():
        if "steady_tokens_per_s" not in r:
            table.append(f"| {mode} | {' '.join(not_ok(r))} |")
            continue
        table.append(
            f"| {mode} | {number(r['minutes'], '{:g}')} | {r['steps']} | {r['steady_tokens_per_s']:,.0f} | "
            f"{r['slowest_window_tokens_per_s']:,.0f} | {pct(r.get('mfu'))} | "
            f"{number(r.get('peak_memory_gib'))} | "
            f"{pct(r.get('e2e_over_step'))} ({pct(r.get('e2e_slots_over_step'))}) | {r['epochs']:.1f} | "
            f"{pct(r['padding'])} | "
            f"{number(r.get('compile_s'), '{:.0f}')} |"
        )
    return head + table


def target_lines(parts: dict) -> list[str]:
    """The fast path's targets on one H100, each met or not, where measured."""
    rows = {
        (r["seq_len"], r["compiled"]): r for r in parts.get("step", {}).get("rows", []) if "error" not in r
    }
    runs = parts.get("pretrain", {}).get("runs", {})
    checks = []
    if (r := rows.get((128, True))) is not None:
        checks.append(("128 compiled: bertforge MFU >= 40%", r.get("bertforge_mfu"), 0.40, pct))
        checks.append(("128 compiled: speed-up >= 1.5x", r["speedup"], 1.5, lambda v: f"{v:.2f}x"))
    if (r := rows.get((512, True))) is not None:
        checks.append(("512 compiled: speed-up >= 1.3x", r["speedup"], 1.3, lambda v: f"{v:.2f}x"))
    for mode, run in runs.items():
        if "e2e_slots_over_step" in run:
            name = f"end to end ({mode}), slots with padding, >= 90% of the step"
            checks.append((name, run["e2e_slots_over_step"], 0.9, pct))
    lines = ["## Targets (set for one H100; the GPU of this run is named above)", ""]
    for name, value, floor, show in checks:
        verdict = "not measured" if value is None else ("met" if value >= floor else "NOT met")
        lines.append(f"- {name}: {show(value) if value is not None else '-'}, {verdict}")
    return lines if checks else lines + ["- none measured"]


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def number(value: float | None, form: str = "{:.1f}") -> str:
    return "-" if value is None else form.format(value)


if __name__ == "__main__":
    sys.exit(main())
