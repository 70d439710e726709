"""`bertforge glue-compare`: two finished GLUE benchmarks, model against model.

How two pretraining recipes are told apart by what their encoders are for: on each task both
benchmarks ran, the pretrained arm of one against the other's (or, with `arm="scratch"`, their
random-weights arms: what the tokenizer alone gives), seed for seed (the seeds both ran): each
one's median and range of the task score, the median of the per-seed differences, the exact sign
test over seeds and a paired bootstrap over the dev examples (both must have scored the same dev
file), and each one's GLUE average over these tasks. A task whose recipes differ is compared all
the same, with a line that says so.

Comparison folder (`out`): compare.json (the pairs and tests per task, both benchmarks' settings),
compare.md (the table, its notes and the command) and compare.png (each task's score and the average).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from bertforge.comparison import ARMS
from bertforge.errors import BertforgeError
from bertforge.folders import folder_kind
from bertforge.glue import REPORT, SCORES, SETTINGS, arm_folder, saved_settings, truth
from bertforge.glue_recipes import full_recipe
from bertforge.glue_report import (
    comparison_cells,
    markdown_table,
    median_range,
    paired_comparison,
    score_bars,
    signed,
    spread,
    text_table,
)
from bertforge.glue_scores import glue_average
from bertforge.io import (
    LEFTOVER,
    LOCK_FILE,
    RunFolderLock,
    atomic_write_text,
    check_folder_path,
    read_json,
    write_json,
)
from bertforge.labeled import read_labeled
from bertforge.plots import save_png

OUTPUTS = ("compare.json", "compare.md", "compare.png")


def compare_benchmarks(first: Path, second: Path, out: Path, arm: str = ARMS[0]) -> dict:
    """Compare `arm` of the finished benchmarks in `first` and `second`; write compare.json, .md and
    .png in `out` and return what compare.json holds."""
    first, second, out = Path(first), Path(second), Path(out)
    if first.resolve() == second.resolve():
        raise BertforgeError(f"glue-compare needs two different benchmark folders; both are {first}")
    if arm not in ARMS:
        raise BertforgeError(f"arm must be one of {', '.join(ARMS)}, not {arm!r}")
    check_comparison_folder(out)
    reports = [finished_report(folder) for folder in (first, second)]
    for folder, report in zip((first, second), reports, strict=True):
        if arm == "scratch" and not report["settings"]["compare_scratch"]:
            raise BertforgeError(f"{folder} ran no scratch arm; benchmark it with --compare-scratch")
    names = column_names(first, second)
    shared, seeds = shared_tasks_and_seeds(first, second, reports)
    tasks = {task: compare_task(task, (first, second), reports, seeds, names, arm) for task in shared}
    comparison = {
        "arm": arm,
        "benchmarks": {
            name: {key: report[key] for key in ("command", "machine")}
            | {"folder": str(folder), "model": report["settings"]["model"]}
            | {"unfinished": unfinished(folder, report["settings"])}
            for name, folder, report in zip(names, (first, second), reports, strict=True)
        },
        "names": list(names),
        "seeds": seeds,
        "tasks": tasks,
        "average": {
            name: glue_average({task: entry["arms"][name]["median"] for task, entry in tasks.items()})
            for name in names
        },
        "not_compared": sorted(set(reports[0]["tasks"]) ^ set(reports[1]["tasks"])),
        "command": shlex.join(
            map(str, ("bertforge", "glue-compare", first, second, "--out", out, "--arm", arm))
        ),
    }
    with RunFolderLock(out):  # one writer: the three files come from one comparison
        write_json(out / "compare.json", comparison)
        atomic_write_text(out / "compare.md", markdown_comparison(comparison))
        save_png(lambda: comparison_figure(comparison), out / "compare.png")
    return comparison


def check_comparison_folder(out: Path) -> None:
    """Refuse an `out` that is a file or holds anything but an earlier comparison (which is replaced)."""
    if out.is_file():
        raise BertforgeError(f"{out} is a file; `out` must name a folder for the comparison")
    check_folder_path(out)
    kept = {*OUTPUTS, LOCK_FILE}
    entries = list(out.iterdir()) if out.is_dir() else []
    others = sorted(e.name for e in entries if e.name not in kept and not LEFTOVER.match(e.name))
    if others:
        raise BertforgeError(
            f"{out} holds other things than a comparison ({', '.join(others[:3])}); choose a new `out`"
        )


def shared_tasks_and_seeds(first: Path, second: Path, reports: list[dict]) -> tuple[list[str], list[int]]:
    """The tasks and the seeds both benchmarks ran (in the first's order); none of either is an error."""
    tasks = [task for task in reports[0]["tasks"] if task in reports[1]["tasks"]]
    if not tasks:
        raise BertforgeError(
            f"{first} and {second} share no GLUE task ({', '.join(reports[0]['tasks'])} against "
            f"{', '.join(reports[1]['tasks'])}); benchmark both models on the same tasks"
        )
    seeds = [seed for seed in reports[0]["settings"]["seeds"] if seed in reports[1]["settings"]["seeds"]]
    if not seeds:
        raise BertforgeError(
            f"{first} and {second} share no fine-tuning seed; run both benchmarks with the same --seeds"
        )
    return tasks, seeds


def finished_report(folder: Path) -> dict:
    """glue.json of `folder`, with what a comparison reads of it."""
    kind = folder_kind(folder)
    if kind is not None and kind.name != "GLUE benchmark":
        raise BertforgeError(
            f"{folder} holds {kind.what}, not a GLUE benchmark; compare two folders `bertforge glue` wrote"
        )
    resume = f"bertforge glue --out {folder} --resume"
    rewrite = f"run `{resume}` to write it again"
    started = (folder / SETTINGS).is_file()
    report = read_json(
        folder / REPORT,
        missing=f"{folder} holds no finished GLUE benchmark; "
        + (
            f"finish it with `{resume}`"
            if started
            else f"run `bertforge glue --model M --data D --out {folder}`"
        ),
        damaged=rewrite,
    )
    try:
        settings, tasks = report["settings"], report["tasks"]
        readable = all(key in settings for key in ("model", "seeds", "compare_scratch")) and all(
            {"kind", "recipe", "arms"} <= set(task) for task in tasks.values()
        )
    except (KeyError, TypeError, AttributeError):
        readable = False
    if not readable or not {"command", "machine"} <= set(report):
        raise BertforgeError(f"{folder / REPORT} is damaged (not a GLUE report); {rewrite}")
    return report


def unfinished(folder: Path, reported: dict) -> str | None:
    """What of the benchmark in `folder` its glue.json does not hold yet: seeds or the scratch arm it
    grew by since (a rerun stopped before its report), None where it holds them all. (A report of fewer
    tasks is what `--resume --tasks` writes on purpose.) Its runs so far still compare."""
    planned = saved_settings(folder)
    if planned is None:
        return None
    more_seeds = sorted(set(planned.seeds) - set(reported["seeds"]))
    scratch = planned.compare_scratch and not reported["compare_scratch"]
    if not (more_seeds or scratch):
        return None
    what = f"seeds {', '.join(map(str, more_seeds))}" if more_seeds else "the scratch arm"
    return (
        f"{folder} is unfinished: its report has no {what} yet; finish it with "
        f"`bertforge glue --out {folder} --resume` and compare again"
    )


def column_names(first: Path, second: Path) -> tuple[str, str]:
    """The two benchmarks' names in the table: their folders' names, told apart when equal."""
    if first.name != second.name:
        return first.name, second.name
    return f"A: {first.name}", f"B: {second.name}"


def compare_task(
    task: str,
    folders: tuple[Path, Path],
    reports: list[dict],
    seeds: list[int],
    names: tuple[str, str],
    arm: str,
) -> dict:
    """One task: each benchmark's runs of `arm` on the shared seeds, and the paired tests."""
    dev = [folder / "data" / task / "dev.jsonl" for folder in folders]
    texts = [read_dev(path) for path in dev]
    if texts[0] != texts[1]:
        raise BertforgeError(
            f"{task}: {dev[0]} and {dev[1]} differ, so the two benchmarks scored different dev examples; "
            "compare benchmarks run on the same GLUE data"
        )
    entries = [report["tasks"][task] for report in reports]
    runs = [arm_runs(task, folder, reports[i], seeds, arm) for i, folder in enumerate(folders)]
    kind = entries[0]["kind"]
    true = truth(read_labeled(dev[0], "text", "label", format="jsonl"), kind == "regression")
    for folder, arm_of_one in zip(folders, runs, strict=True):
        if any(len(run["predicted"]) != len(true) for run in arm_of_one):
            raise BertforgeError(
                f"{folder}: a {task} run's predictions do not match its {len(true):,} dev examples; delete "
                f"its {SCORES} and continue with `bertforge glue --out {folder} --resume`"
            )
    result = paired_comparison(task, kind, true, *runs, names=names)
    return {
        "arms": {name: spread([r["score"] for r in arm]) for name, arm in zip(names, runs, strict=True)},
        "recipes": {name: full_recipe(entry["recipe"]) for name, entry in zip(names, entries, strict=True)},
        "comparison": result,
    }


def read_dev(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BertforgeError(f"{path} is missing; rerun that benchmark with --resume to write it") from None


def arm_runs(task: str, folder: Path, report: dict, seeds: list[int], arm: str) -> list[dict]:
    """The runs of `task`'s `arm` on `seeds`, each with its score and its dev predictions."""
    compare = report["settings"]["compare_scratch"]
    runs = {run.get("seed"): run for run in report["tasks"][task]["arms"].get(arm, {}).get("runs", [])}
    again = f"continue {folder} with `bertforge glue --out {folder} --resume`"
    out = []
    for seed in seeds:
        if seed not in runs:
            raise BertforgeError(f"{folder}: {task} has no {arm} run of seed {seed}; {again}")
        path = arm_folder(folder / task, arm, seed, compare) / SCORES
        if not compare and not path.is_file():  # a rerun adding --compare-scratch moved it, then stopped
            path = arm_folder(folder / task, arm, seed, compare=True) / SCORES
        scores = read_json(path, damaged=again, missing=again)
        if "predicted" not in scores or "score" not in runs[seed]:
            raise BertforgeError(f"{path} is damaged (no predictions); delete it and {again}")
        out.append({"seed": seed, "score": runs[seed]["score"], "predicted": scores["predicted"]})
    return out


def rows(comparison: dict) -> list[list[str]]:
    """The table: per task each benchmark's median [range] of the task score, the difference (first
    minus second) with its two p-values; the GLUE averages."""
    names = comparison["names"]
    table = [["task", *names, "difference", "p sign", "p boot"]]
    for task, entry in comparison["tasks"].items():
        medians = [median_range(entry["arms"][name]) for name in names]
        table.append([task, *medians, *comparison_cells(entry["comparison"])])
    averages = [comparison["average"][n] for n in names]
    table.append(["average", *(f"{a:.1f}" for a in averages), signed(averages[0] - averages[1]), "", ""])
    return table


def notes(comparison: dict) -> list[str]:
    names, seeds = comparison["names"], comparison["seeds"]
    lines = [
        f"task score on the dev sets, median [min, max] over seeds {', '.join(map(str, seeds))}, in "
        f"percent; difference: the median of the per-seed differences ({names[0]} minus {names[1]}); "
        "p sign: exact sign test over seeds; p boot: paired bootstrap over the dev examples of the seeds' "
        "mean difference, given beside it where its sign is not the median's",
    ]
    for name, bench in comparison["benchmarks"].items():
        lines.append(f"{name}: the model {bench['model']} ({bench['folder']})")
        if bench.get("unfinished"):
            lines.append(bench["unfinished"])
    for task, entry in comparison["tasks"].items():
        recipes = list(entry["recipes"].values())
        if recipes[0] != recipes[1]:
            differ = sorted(key for key in recipes[0] if recipes[0][key] != recipes[1].get(key))
            lines.append(f"{task}: the benchmarks fine-tuned with different recipes ({', '.join(differ)})")
    if comparison["not_compared"]:
        lines.append(f"not compared (in one benchmark only): {', '.join(comparison['not_compared'])}")
    return lines


def text_comparison(comparison: dict) -> str:
    return text_table(rows(comparison)) + "\n\n" + "\n".join(notes(comparison))


def markdown_comparison(comparison: dict) -> str:
    names = comparison["names"]
    title = f"# GLUE: {names[0]} against {names[1]}, the {comparison['arm']} arms"
    parts = [title, markdown_table(rows(comparison))]
    parts.append("\n".join(f"- {line}" for line in notes(comparison)))
    parts.append(f"```bash\n{comparison['command']}\n```")
    return "\n\n".join(parts) + "\n"


def comparison_figure(comparison: dict):
    tasks = list(comparison["tasks"])
    series = []
    for name in comparison["names"]:
        arms = [comparison["tasks"][t]["arms"][name] for t in tasks]
        medians = [a["median"] for a in arms] + [comparison["average"][name]]
        lows = [a["min"] for a in arms] + [medians[-1]]
        highs = [a["max"] for a in arms] + [medians[-1]]
        series.append((name, medians, lows, highs))
    seeds = len(comparison["seeds"])
    title = f"GLUE dev, {comparison['arm']} arms: median of {seeds} seeds (whiskers: their range)"
    return score_bars([*tasks, "average"], series, "task score (dev)", title)
