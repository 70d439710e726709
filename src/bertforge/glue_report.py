"""The GLUE benchmark's report: glue.json's content from the runs, and from it the table
`bertforge glue` prints, glue.md and glue.png.

glue.json: the settings and the command, the machine, the time; per task its recipe, each run's
figures, each arm's median and spread, and the paired comparison of the arms in the task score
(the per-seed differences, the sign test over seeds, a paired bootstrap over the first dev file's
examples); per classification task the majority class (the training set's most frequent label for
every dev example: what a model at chance scores) and each arm's paired bootstrap over it; each
arm's GLUE average; the published figures with their source.

The table: a row per task figure and, for a task of two figures, its score; per arm the median over
seeds and the range; the majority class's figure; the pretrained arm's gain over scratch in the task
score with the sign test's and the paired bootstrap's p; the published BERT-Tiny, Mini and Small
figures (GLUE test sets, so not the same examples); and the GLUE average. The figure: each task's
score and the average, this model's (the seeds' range as a bar) beside the scratch arm's, the
majority class's and the published models'.
"""

from __future__ import annotations

import os
import platform
import shlex
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from bertforge.comparison import ARMS
from bertforge.glue_data import TASKS
from bertforge.glue_scores import (
    FIGURES,
    PUBLISHED,
    PUBLISHED_SOURCE,
    glue_average,
    paired_bootstrap_score,
    split_figures,
    task_score,
)
from bertforge.plots import pyplot, save_png
from bertforge.precision import cpu_name
from bertforge.runtime import resolve_device
from bertforge.stats import sign_test, spread, summary

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SHORT = {"BERT-Tiny (2/128)": "Tiny", "BERT-Mini (4/256)": "Mini", "BERT-Small (4/512)": "Small"}
OPTIMISTIC = "†"
BOOTSTRAP_RESAMPLES = 1000  # finetune's 10,000 would take minutes: each one rescores every run
AT_CHANCE_P = 0.05  # an arm not above the majority class at this paired bootstrap p is at chance


def build_report(
    settings: dict,
    out: Path,
    tasks: dict[str, dict],
    skipped: list[str],
    wall_s: float,
    runs_at_once: dict,
) -> dict:
    """glue.json: the settings, the machine, every run's figures, each arm's median and spread per
    task, the paired comparison per task, the GLUE averages and the published figures. `tasks`: per
    task its record with "runs" (each run's figures and first-dev-file predictions) and "true" (that
    file's labels), as `bertforge.glue` gathers them. `runs_at_once`: "jobs", the runs that trained at
    once, and "threads_per_run"."""
    arms = list(ARMS if settings["compare_scratch"] else ARMS[:1])
    report_tasks = {}
    for name, task in tasks.items():
        entry = {key: value for key, value in task.items() if key not in ("runs", "true", "train_majority")}
        entry["arms"] = {arm: arm_summary([r for r in task["runs"] if r["arm"] == arm]) for arm in arms}
        if settings["compare_scratch"]:
            entry["comparison"] = compare_arms(name, task)
        if task.get("train_majority") is not None:
            entry["majority"] = majority_class(name, task, arms)
        report_tasks[name] = entry
    every_run = [run for task in tasks.values() for run in task["runs"]]
    sweep_runs = [point for task in tasks.values() for point in task["sweep"]]
    return {
        "benchmark": "GLUE",
        "split": "dev",
        "units": "percent (accuracy, F1; Matthews, Pearson and Spearman correlations x 100)",
        "command": command_line(settings, out),
        "settings": settings,
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_s": wall_s,
        "runs_elapsed_s": sum(run["elapsed_s"] for run in every_run),
        "sweep_runs": len(sweep_runs),
        "machine": {**machine(settings["device"]), **runs_at_once},
        "skipped": skipped,
        "tasks": report_tasks,
        "average": {arm: average(report_tasks, arm) for arm in arms},
        "published": published(
            {name: set(entry["arms"][arms[0]]["dev"]) for name, entry in report_tasks.items()}
        ),
    }


def arm_summary(runs: list[dict]) -> dict:
    """One arm of a task: each run's figures, and per figure and for the score the median and spread."""
    dev = {name: spread([r["dev"][name] for r in runs]) for name in runs[0]["dev"]}
    test = {name: spread([r["test"][name] for r in runs]) for name in runs[0]["test"]}
    out = {"dev": dev, "score": spread([r["score"] for r in runs]), "test": test}
    if runs[0]["test_score"] is not None:
        out["test_score"] = spread([r["test_score"] for r in runs])
    out["runs"] = [{k: v for k, v in r.items() if k != "predicted"} for r in runs]
    return out


def compare_arms(name: str, task: dict) -> dict:
    """The task score's paired statistics of the pretrained arm against the scratch arm."""
    by_arm = [arm_runs_by_seed(task, arm) for arm in ARMS]
    return paired_comparison(name, task["kind"], task["true"], *by_arm, names=ARMS)


def arm_runs_by_seed(task: dict, arm: str) -> list[dict]:
    """The task's runs of `arm`, in seed order."""
    return sorted((r for r in task["runs"] if r["arm"] == arm), key=lambda r: r["seed"])


def majority_class(name: str, task: dict, arms: list[str]) -> dict:
    """The training set's most frequent label given to every example of the first dev file: its
    figures and task score, and per arm the paired bootstrap of the arm's score over it."""
    label, true, labels = task["train_majority"], task["true"], sorted(TASKS[name].labels)
    constant = [label] * len(true)
    dev = split_figures(name, 0, true, constant, labels)
    above = {}
    for arm in arms:
        predicted = [r["predicted"] for r in arm_runs_by_seed(task, arm)]
        above[arm] = paired_bootstrap_score(name, true, predicted, [constant], labels, BOOTSTRAP_RESAMPLES)
    # a score only where the first dev file holds every figure of the task (not MNLI's): a matched-only
    # score beside the arms' mean of matched and mismatched would compare two different things
    whole = len(dev) == len(FIGURES[name])
    return {"label": label, "dev": dev, "score": task_score(name, dev) if whole else None, "above": above}


def at_chance(majority: dict, arm: str) -> bool:
    """Whether the arm's task score fails to beat the majority class's (paired bootstrap)."""
    test = majority["above"][arm]
    return not (test["gain"] > 0 and test["p_value"] < AT_CHANCE_P)


def paired_comparison(
    name: str, kind: str, true: list, runs_a: list[dict], runs_b: list[dict], names: tuple[str, str]
) -> dict:
    """Runs a against runs b (the same seeds in the same order) in the task score: per-seed
    differences and the sign test over seeds in the whole score (MNLI: matched and mismatched), and
    a paired bootstrap over the first dev file's examples (`true`: its labels; each run's
    "predicted" holds its predictions)."""
    a_scores, b_scores = [r["score"] for r in runs_a], [r["score"] for r in runs_b]
    differences = [a - b for a, b in zip(a_scores, b_scores, strict=True)]
    labels = [] if kind == "regression" else sorted(TASKS[name].labels)
    bootstrap = paired_bootstrap_score(
        name,
        true,
        [r["predicted"] for r in runs_a],
        [r["predicted"] for r in runs_b],
        labels,
        resamples=BOOTSTRAP_RESAMPLES,
    )
    return {
        "metric": "task score (the bootstrap: on the first dev file)",
        "pairs": [
            {"seed": r["seed"], names[0]: a, names[1]: b, "difference": a - b}
            for r, a, b in zip(runs_a, a_scores, b_scores, strict=True)
        ],
        "difference": summary(differences),
        "sign_test": sign_test(differences),
        "bootstrap": bootstrap,
    }


def average(tasks: dict[str, dict], arm: str) -> dict:
    """The GLUE average of an arm: the mean over tasks of each task's median score."""
    scores = {name: task["arms"][arm]["score"]["median"] for name, task in tasks.items()}
    return {"score": glue_average(scores), "tasks": list(scores)}


def published(figures: dict[str, set[str]]) -> dict:
    """The published models' figures on the benchmark's tasks, those the benchmark has (`figures`:
    per task; MNLI without its mismatched file has matched alone), and their average over them."""
    models = {}
    for model, row in PUBLISHED.items():
        kept = {
            task: {k: v for k, v in row["tasks"][task].items() if k in names}
            for task, names in figures.items()
        }
        models[model] = {
            "tasks": kept,
            "average_of_these_tasks": glue_average({task: task_score(task, kept[task]) for task in kept}),
            "glue_score": row["score"],
        }
    return {"source": PUBLISHED_SOURCE, "split": "test", "models": models}


def machine(device_name: str | None) -> dict:
    """The CPU (and GPU) the runs used, and the software."""
    device = resolve_device(device_name or "auto")
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def command_line(settings: dict, out: Path) -> str:
    """The `bertforge glue` command that runs these settings."""
    parts = ["bertforge", "glue", "--model", settings["model"]]
    for path in settings["data"]:
        parts += ["--data", path]
    parts += ["--out", str(out), "--tasks", ",".join(settings["tasks"])]
    parts += ["--seeds", ",".join(map(str, settings["seeds"]))]
    if settings["recipes_file"]:
        parts += ["--recipes", settings["recipes_file"]]
    parts += ["--compare-scratch"] * settings["compare_scratch"] + ["--sweep"] * settings["sweep"]
    if settings["precision"]:
        parts += ["--precision", settings["precision"]]
    if settings["device"]:
        parts += ["--device", settings["device"]]
    return " ".join(shlex.quote(part) for part in parts)


def table_rows(report: dict, split: str = "dev") -> list[list[str]]:
    """The table's rows (a header first): task, figure, each arm's median (range), the majority
    class's figure, the gain over scratch with its two p-values, and the published figures."""
    arms = list(report["average"])
    compare = "scratch" in arms and split == "dev"  # the arms are compared on the dev file
    majority = split == "dev" and has_majority(report)
    published = report["published"]["models"]
    header = ["task", "figure", *arms] + ["majority"] * majority
    header += ["gain", "p sign", "p boot"] if compare else []
    rows = [header + [f"{SHORT[m]}*" for m in published]]
    for name, task in report["tasks"].items():
        figures = [f for f, _, _ in FIGURES[name] if f in task["arms"][arms[0]][split]]
        if not figures:
            continue
        shown = figures + (["score"] if len(figures) > 1 else [])
        label = name + (OPTIMISTIC if task["recipe_chosen_on_dev"] and split == "dev" else "")
        for i, figure in enumerate(shown):
            row = [label if i == 0 else "", figure]
            for arm in arms:
                row.append(median_range(arm_figure(task["arms"][arm], split, figure)))
            if majority:
                row.append(majority_cell(task.get("majority"), figure))
            last = i == len(shown) - 1
            if compare:
                row += comparison_cells(task["comparison"]) if last else ["", "", ""]
            for model in published.values():
                values = model["tasks"].get(name, {})
                value = values.get(figure) if figure != "score" else task_score(name, values)
                row.append("" if value is None else f"{value:.1f}")
            rows.append(row)
    if split == "dev":
        rows.append(average_row(report, arms, compare, majority))
    return rows


def majority_cell(majority: dict | None, figure: str) -> str:
    """The majority class's figure; none for a regression, or for a figure of another dev file and the
    score it enters (MNLI's: the majority class is scored on the first dev file, as the paired tests)."""
    if majority is None:
        return ""
    value = majority["score"] if figure == "score" else majority["dev"].get(figure)
    return "" if value is None else f"{value:.1f}"


def arm_figure(arm: dict, split: str, figure: str) -> dict:
    """An arm's spread over seeds of one figure on `split`, or of the task's score."""
    if figure == "score":
        return arm["score" if split == "dev" else "test_score"]
    return arm[split][figure]


def signed(difference: float) -> str:
    """A difference to one decimal with its sign; one that rounds to zero reads +0.0, never -0.0."""
    return f"{round(difference, 1) + 0.0:+.1f}"


def median_range(stats: dict) -> str:
    return f"{stats['median']:.1f} [{stats['min']:.1f}, {stats['max']:.1f}]"


def comparison_cells(comparison: dict) -> list[str]:
    """The gain (the median of the per-seed differences), p sign and p boot. The bootstrap tests the
    seeds' mean gain, which one seed far off can turn against the median: then it is given beside."""
    boot, median = comparison["bootstrap"], comparison["difference"]["median"]
    floor = 2 / boot["resamples"]
    p_boot = f"<{floor:.3f}" if boot["p_value"] == 0 else f"{boot['p_value']:.3f}"
    if direction(boot["gain"]) != direction(median):
        p_boot += f" (mean {signed(boot['gain'])})"
    return [signed(median), f"{comparison['sign_test']['p_value']:.3f}", p_boot]


def direction(difference: float) -> int:
    """-1, 0 or 1: the sign of a difference as the table shows it, to one decimal."""
    shown = round(difference, 1)
    return (shown > 0) - (shown < 0)


def average_row(report: dict, arms: list[str], compare: bool, majority: bool) -> list[str]:
    averages = report["average"]
    row = ["average", "score", *(f"{averages[arm]['score']:.1f}" for arm in arms)] + [""] * majority
    if compare:
        row += [signed(averages["pretrained"]["score"] - averages["scratch"]["score"]), "", ""]
    row += [f"{m['average_of_these_tasks']:.1f}" for m in report["published"]["models"].values()]
    return row


def notes(report: dict) -> list[str]:
    """The lines under the table: what the figures are, subsets, choices on dev, the time."""
    seeds = report["settings"]["seeds"]
    lines = [
        f"median [min, max] over {len(seeds)} seeds ({', '.join(map(str, seeds))}) on the dev sets, in "
        "percent; a task's score is the mean of its figures, the average the mean of the tasks' scores",
        "Tiny*, Mini*, Small*: published (GLUE test sets, not these dev sets): "
        + report["published"]["source"],
    ]
    if "scratch" in report["average"]:
        lines.append(
            "scratch: the same architecture and tokenizer from random weights, seed for seed; gain: the "
            "median of the per-seed differences in the task score (the average's: the difference of the two "
            "averages); p sign: exact sign test over seeds; p boot: paired bootstrap over the dev examples "
            "of the seeds' mean gain, given beside it where its sign is not the median's"
        )
    if has_majority(report):
        lines.append(chance_note(report))
    for name, task in report["tasks"].items():
        if task["train_examples"] < task["train_examples_in_file"]:
            lines.append(
                f"{name}: fine-tuned on {task['train_examples']:,} of its {task['train_examples_in_file']:,} "
                "training examples (its recipe's max_train_examples)"
            )
        if task["recipe"].get("both_orders"):
            lines.append(f"{name}: trained on each pair in both orders (its recipe's both_orders)")
        if task["recipe_chosen_on_dev"]:
            recipe = task["recipe"]
            lines.append(
                f"{OPTIMISTIC} {name}: learning rate {recipe['learning_rate']:g} and batch size "
                f"{recipe['batch_size']} chosen on dev by --sweep: its dev figures are optimistic"
            )
    lines += report["skipped"]
    machine = report["machine"]
    jobs, share = machine.get("jobs", 1), machine.get("threads_per_run", machine["threads"])
    threads = (
        f"{machine['threads']} threads"
        if jobs == 1
        else f"{jobs} runs at a time, {share} thread{'s' * (share > 1)} each"
    )
    where = machine["gpu"] or machine["cpu"]
    lines.append(
        f"{report['runs_elapsed_s'] / 60:.1f} min of fine-tuning by the runs' clocks "
        f"({report['wall_s'] / 60:.1f} min this invocation) on {where}, {threads}, "
        f"torch {machine['torch']}"
    )
    return lines


def chance_note(report: dict) -> str:
    """What the majority column is, and which tasks' arms do not beat it."""
    arms, low = list(report["average"]), []
    for name, task in report["tasks"].items():
        behind = [arm for arm in arms if "majority" in task and at_chance(task["majority"], arm)]
        if behind:
            low.append(f"{name} ({'both arms' if len(behind) == 2 else behind[0]})")
    verdict = f"at chance: {', '.join(low)}" if low else "every arm of every task beats it"
    return (
        "majority: the training set's most frequent label for every dev example (none for a "
        "regression: a constant has no correlation); an arm whose task score does not beat it with "
        f"paired bootstrap p < {AT_CHANCE_P:g} is at chance; {verdict}"
    )


def text_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    )


def text_report(report: dict) -> str:
    """The table `bertforge glue` prints, with its notes (and the labelled test files' table, if any)."""
    parts = [f"GLUE of {report['settings']['model']}", text_table(table_rows(report))]
    if has_test(report):
        parts += ["labelled test files:", text_table(table_rows(report, "test"))]
    return "\n\n".join(parts) + "\n\n" + "\n".join(notes(report))


def has_majority(report: dict) -> bool:
    return any("majority" in task for task in report["tasks"].values())


def has_test(report: dict) -> bool:
    return any(task["test_examples"] for task in report["tasks"].values())


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "| " + " | ".join("---" for _ in rows[0]) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def markdown_report(report: dict) -> str:
    """glue.md: the table, its notes, the command and the machine."""
    parts = [f"# GLUE: {report['settings']['model']}", markdown_table(table_rows(report))]
    if has_test(report):
        parts += ["Labelled test files:", markdown_table(table_rows(report, "test"))]
    parts.append("\n".join(f"- {line}" for line in notes(report)))
    parts.append(f"```bash\n{report['command']}\n```\n\nFinished {report['finished']}.")
    return "\n\n".join(parts) + "\n"


def plot_report(report: dict, out_png: Path) -> None:
    """glue.png: per task its score and the average, grouped: this model (bar: median, whisker: the
    seeds' range), the scratch arm, the majority class and the published models."""
    settings = report["settings"]
    title = (
        f"GLUE: {Path(settings['model']).name}; bars: median of {len(settings['seeds'])} seeds, "
        "whiskers: their range"
    )
    ylabel = "task score, % (dev; published: test)"
    groups, series = plotted_series(report)
    save_png(lambda: score_bars(groups, series, ylabel, title), Path(out_png))


def plotted_series(report: dict) -> tuple[list[str], list[tuple]]:
    """glue.png's groups (the tasks, then "average") and its series (label, values, lows, highs), as
    `score_bars` draws them."""
    tasks = list(report["tasks"])
    groups = [*tasks, "average"]
    series = []
    for arm in report["average"]:
        medians = [report["tasks"][t]["arms"][arm]["score"]["median"] for t in tasks] + [
            report["average"][arm]["score"]
        ]
        lows = [report["tasks"][t]["arms"][arm]["score"]["min"] for t in tasks] + [np.nan]  # the average:
        highs = [report["tasks"][t]["arms"][arm]["score"]["max"] for t in tasks] + [np.nan]  # no whisker
        series.append((f"{arm} (dev)" if arm == "pretrained" else "from scratch (dev)", medians, lows, highs))
    if has_majority(report):
        values = [report["tasks"][t].get("majority", {}).get("score") for t in tasks]
        values = [np.nan if value is None else value for value in values]
        series.append(("majority class (dev)", [*values, np.nan], None, None))
    for model, row in report["published"]["models"].items():
        values = [task_score(t, row["tasks"][t]) if row["tasks"][t] else np.nan for t in tasks]
        series.append((f"{model}, published (test)", values + [row["average_of_these_tasks"]], None, None))
    return groups, series


def score_bars(groups: list[str], series: list[tuple], ylabel: str, title: str) -> Figure:
    """Grouped bars: per group one bar of each series (label, values, lows, highs; lows and highs
    None for no whisker)."""
    fig, ax = pyplot().subplots(figsize=(max(6.0, 1.6 * len(groups)) + 3, 4.5))
    width = 0.8 / len(series)
    x = np.arange(len(groups))
    for i, (label, values, lows, highs) in enumerate(series):
        positions = x - 0.4 + width * (i + 0.5)
        errors = None
        if lows is not None:
            errors = [np.subtract(values, lows), np.subtract(highs, values)]
        ax.bar(positions, values, width, label=label, yerr=errors, capsize=2)
    ax.set_xticks(x, groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
