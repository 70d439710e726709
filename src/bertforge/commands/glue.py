"""The `glue` commands: a pretrained model benchmarked on the GLUE tasks found in --data, and two
finished benchmarks compared (`glue-compare`).

`glue`'s handler builds the benchmark's settings from the arguments (or, with --resume, reads the
saved ones) and calls `bertforge.glue.run_glue`; it prints the skipped tasks as they are found and,
at the end, the table of `bertforge.glue_report`. `glue-compare` prints `bertforge.glue_versus`'s.
"""

from __future__ import annotations

from pathlib import Path

from bertforge.commands import (
    add_device_argument,
    add_jobs_argument,
    add_precision_argument,
    refuse_with_resume,
    seed_list,
)
from bertforge.errors import BertforgeError

# How library errors name what the flags and the recipes set (`bertforge.cli.in_flags`).
SETTING_FLAGS = {
    "`resume=True`": "--resume",
    "task.seeds": "--seeds",
    "task.compare_scratch": "--compare-scratch",
    "data.max_seq_length": "the recipe's max_length",
    "train.batch_size": "the recipe's batch_size",
    "train.learning_rate": "the recipe's learning_rate",
    "train.warmup_ratio": "the recipe's warmup",
    "task.epochs": "the recipe's epochs",
    "task.dropout": "the recipe's dropout",
}
RESUME_IGNORES = (  # --tasks with --resume keeps some of the benchmark's tasks
    "model",
    "data",
    "seeds",
    "compare_scratch",
    "sweep",
    "recipes",
    "precision",
    "device",
)


def register(commands) -> None:
    p = commands.add_parser(
        "glue",
        help="benchmark a pretrained model on GLUE beside Google's small BERTs",
        description="Fine-tune --model on each GLUE task found in --data (GLUE's download layout: SST-2/, "
        "MRPC/, STS-B/, RTE/, CoLA/, QNLI/, MNLI/, QQP/, WNLI/, each with train.tsv and dev.tsv), once per "
        "seed, with each task's recipe (configs/glue.toml; --recipes FILE for an edited copy). Prints per "
        "task its GLUE figures (median and range over seeds), the GLUE average, and the published "
        "BERT-Tiny, Mini and Small figures; writes OUT/glue.json, glue.md and glue.png. Rerunning the "
        "same command continues an interrupted benchmark without running finished seeds again; rerunning it "
        "with more --tasks, --seeds or --compare-scratch adds them.",
    )
    p.add_argument(
        "--model", type=Path, help="a pretrained model: run folder, its final/, a checkpoint, or export"
    )
    p.add_argument(
        "--data",
        type=Path,
        action="append",
        help="a folder of GLUE task folders, a folder above such folders, or one task's folder (repeatable)",
    )
    p.add_argument("--out", type=Path, required=True, help="benchmark folder (new, or one to continue)")
    p.add_argument(
        "--tasks",
        help="tasks to run, comma-separated, e.g. sst-2,mrpc,sts-b,rte (default: all found); with --resume, "
        "finish and report only these of the benchmark's tasks",
    )
    p.add_argument("--seeds", type=seed_list, help="fine-tuning seeds (default 1,2,3,4,5)")
    p.add_argument(
        "--compare-scratch",
        action="store_true",
        help="also fine-tune the same architecture and tokenizer from random weights, per seed; paired tests",
    )
    p.add_argument(
        "--recipes",
        type=Path,
        help="per-task recipes, a TOML file as configs/glue.toml: what it sets replaces the built-in "
        "recipes' settings ([default] for every task), the rest stay",
    )
    p.add_argument(
        "--sweep",
        action="store_true",
        help="per task, try its recipe and the recipes' [sweep] grid (learning rate x batch size, first "
        "seed) and keep the best on dev (its dev figures are then optimistic)",
    )
    add_precision_argument(p)
    add_device_argument(p, default=None)
    add_jobs_argument(p, "fine-tuning runs")
    p.add_argument(
        "--resume", action="store_true", help="continue the benchmark in --out with its saved settings"
    )
    p.add_argument("--quiet", action="store_true", help="no progress")
    p.set_defaults(handler=run_glue_command, setting_flags=SETTING_FLAGS)
    register_compare(commands)


def register_compare(commands) -> None:
    p = commands.add_parser(
        "glue-compare",
        help="compare two finished glue benchmarks, model against model, with paired tests",
        description="Compare the models of two finished `bertforge glue` benchmarks (two pretraining "
        "recipes, say) on the tasks and seeds both ran: per task each one's median score, the per-seed "
        "difference, the sign test over seeds and a paired bootstrap over the dev examples, and each one's "
        "GLUE average. Writes OUT/compare.json, compare.md and compare.png.",
    )
    p.add_argument("first", type=Path, help="a benchmark folder (a finished `bertforge glue --out`)")
    p.add_argument("second", type=Path, help="the benchmark folder to compare it with")
    p.add_argument(
        "--arm",
        choices=("pretrained", "scratch"),
        default="pretrained",
        help="the arms to compare: the models (default), or their random-weights arms (the tokenizers alone)",
    )
    p.add_argument(
        "--out", type=Path, required=True, help="folder for compare.json, compare.md and compare.png"
    )
    p.set_defaults(handler=run_compare_command)


def glue_settings(args):
    """The benchmark's settings from the arguments; None with --resume (the saved ones are used)."""
    from bertforge.glue import benchmark

    if args.resume:
        refuse_with_resume(args, RESUME_IGNORES, "the benchmark's saved settings")
        return None
    missing = [flag for flag, value in (("--model", args.model), ("--data", args.data)) if value is None]
    if missing:
        raise BertforgeError(f"glue needs {' and '.join(missing)} (or --resume to continue a benchmark)")
    return benchmark(
        args.model,
        args.data,
        tasks=task_names(args),
        seeds=args.seeds,
        compare_scratch=args.compare_scratch,
        sweep=args.sweep,
        recipes_file=args.recipes,
        precision=args.precision,
        device=args.device,
    )


def task_names(args) -> list[str] | None:
    """The tasks --tasks names, None without it."""
    if args.tasks is None:
        return None
    names = [name.strip() for name in args.tasks.split(",") if name.strip()]
    if not names:
        raise BertforgeError(f"--tasks names no task ({args.tasks!r}); name some, e.g. --tasks sst-2,rte")
    return names


def run_glue_command(args) -> int:
    from bertforge.glue import run_glue
    from bertforge.glue_report import text_report

    only = task_names(args) if args.resume else None
    report = run_glue(
        glue_settings(args),
        args.out,
        resume=args.resume,
        show_progress=not args.quiet,
        only_tasks=only,
        jobs=args.jobs,
    )
    print()
    print(text_report(report))
    print(f"\nreport: {args.out / 'glue.json'}, {args.out / 'glue.md'}, {args.out / 'glue.png'}")
    return 0


def run_compare_command(args) -> int:
    from bertforge.glue_versus import compare_benchmarks, text_comparison

    comparison = compare_benchmarks(args.first, args.second, args.out, args.arm)
    print(text_comparison(comparison))
    print(f"\nreport: {args.out / 'compare.json'}, {args.out / 'compare.md'}, {args.out / 'compare.png'}")
    return 0
