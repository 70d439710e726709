"""Command groups of the `bertforge` CLI; each module has `register(subparsers)`. The arguments that
several groups take are added here, written once."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from bertforge.config import PRECISIONS
from bertforge.config_rules import SEED, number_problem
from bertforge.errors import BertforgeError
from bertforge.reporting import FOLDER, INSTALL, TARGETS


def add_model_text_column_argument(p) -> None:
    """`--text-column` of a command that reads a corpus with a model: by default the field its run read."""
    p.add_argument(
        "--text-column",
        help="the JSON-lines field or table column of the text (default: the one the model trained on)",
    )


def add_device_argument(p, default: str | None = "auto") -> None:
    """`--device` (`runtime.device`); a training command's default None keeps its config's."""
    p.add_argument("--device", default=default, help="auto, cpu, cuda, cuda:N or mps")


def add_precision_argument(p) -> None:
    """`--precision` of a training run (`runtime.precision`; auto is measured by `bertforge.precision`)."""
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="arithmetic (default auto: the faster of fp32 and bf16 here, measured once and cached)",
    )


def add_jobs_argument(p, runs: str) -> None:
    """`--jobs`: how many of a command's fine-tuning runs (`runs`) train at once (`bertforge.worker_pool`)."""
    p.add_argument(
        "--jobs",
        type=job_count,
        help=f"{runs} at once, each in its own process with a share of the threads (default: 2 on a CPU "
        "with 2 or more threads, where one small model's step leaves them half idle; else 1)",
    )


def job_count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of runs, 1 or more")
    return int(text)


def add_report_to_argument(p) -> None:
    """`--report-to` of a training command (`bertforge.reporting`)."""
    p.add_argument(
        "--report-to",
        choices=TARGETS,
        default="none",
        help=f"also write the metrics as TensorBoard event files in OUT/{FOLDER}/ (needs {INSTALL})",
    )


def seed_list(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers separated by commas, e.g. 1,2,3") from None
    if len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct non-negative integers, e.g. 1,2,3")
    if problem := number_problem("a seed", max(seeds), SEED):
        raise argparse.ArgumentTypeError(f"{text!r}: {problem}")
    return seeds


def refuse_with_resume(args, names: Sequence[str], what: str) -> None:
    """Refuse the flags among `names` that were given with `--resume`, which continues with `what`."""
    given = [name for name in names if getattr(args, name) not in (None, False, [])]
    if given:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in given)
        raise BertforgeError(f"--resume continues with {what}; drop {flags}")
