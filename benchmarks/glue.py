"""(5) The GLUE workflow's wall time: `bertforge.glue.run_glue` over SST-2, MRPC, STS-B and RTE, 5 seeds,
both arms (`compare_scratch`), with the built-in recipes (configs/glue.toml), against its target of 60
minutes on 2 CPU cores for BERT-Mini pretrained with configs/mini-30min.toml.

The model is given (`--glue-model RUN`); a 30-minute pretraining has no place inside the suite.
`--quick` instead pretrains a tiny model for a few steps on a slice of WikiText-2 and runs 2 tasks,
2 seeds, one epoch on a fixed random 128 of the first 1,000 training examples each (a recipes file
with `max_train_examples`), scored on the first 100 dev examples. The benchmark folder is temporary.

Reported: the whole run's wall minutes (the target's measure), each task and arm's minutes of
fine-tuning on its runs' own clocks (the rest is reading the data, scoring each run's best epoch and
writing the report), each task and arm's median dev score and figures (Pearson, F1, accuracy), the
pretrained arm's paired gain over scratch per task (sign test and bootstrap, as `glue` reports it),
whether each arm of a classification task beats its majority class, and both arms' GLUE average.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from benchmarks.common import Bench
from benchmarks.data import wikitext
from bertforge.comparison import ARMS
from bertforge.config import RunConfig, apply_preset
from bertforge.errors import BertforgeError
from bertforge.folders import find_model_folder
from bertforge.glue import benchmark, run_glue
from bertforge.glue_data import find_tasks
from bertforge.glue_report import at_chance
from bertforge.pretrain import pretrain

GLUE_DATA = os.environ.get(
    "BERTFORGE_GLUE", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
)
TASKS = ["SST-2", "MRPC", "STS-B", "RTE"]
SEEDS = [1, 2, 3, 4, 5]
TARGET_MINUTES = 60.0
QUICK_TASKS = ["SST-2", "STS-B"]  # one classification, one regression
QUICK_SEEDS = [1, 2]
QUICK_ROWS = {"train.tsv": 1000, "dev.tsv": 100}  # the first rows of each quick task's files
QUICK_PRETRAIN_STEPS = 10
QUICK_VOCAB = 2000  # WordPiece pieces of the quick model: a small embedding to train
QUICK_RECIPES = """\
[default]
learning_rate = 1e-3
epochs = 1
batch_size = 32
max_length = 32
max_train_examples = 128
"""
QUICK_RECIPES_SAID = "--quick: 1 epoch on 128 training examples a task, batch 32, 32 tokens, lr 1e-3"


def folder_refusal(data: Path) -> str | None:
    """Why `--glue-data` cannot be read as GLUE's folder (it is not a folder), or None."""
    if not Path(data).is_dir():
        where = "give the folder above GLUE's task folders, or set BERTFORGE_GLUE"
        return f"--glue-data {data} is not a folder; {where}"
    return None


def refusal(model: Path | None, data: Path, quick: bool) -> str | None:
    """Why the glue entry cannot run with these arguments (checked before the suite starts), or None."""
    if model is None and not quick:
        return (
            "--only glue needs --glue-model RUN, a pretrained model folder (the target is about BERT-Mini "
            "pretrained with configs/mini-30min.toml); --quick pretrains a tiny one instead"
        )
    if why := folder_refusal(data):
        return why
    try:
        if model is not None:
            find_model_folder(model)
        found, _ = find_tasks([data], QUICK_TASKS if quick else TASKS)
    except BertforgeError as error:
        return str(error)
    return missing_refusal(data, [name for name in (QUICK_TASKS if quick else TASKS) if name not in found])


def missing_refusal(data: Path, missing: list[str], files: str = "a train.tsv") -> str | None:
    """Why `--glue-data` cannot serve: it holds no folder (with `files`) of the `missing` tasks; or None."""
    if not missing:
        return None
    return (
        f"{data} holds no {', '.join(missing)} task folder with {files}; give --glue-data or set "
        "BERTFORGE_GLUE to the folder above GLUE's task folders"
    )


def quick_model(bench: Bench) -> tuple[Path, float]:
    """A tiny model pretrained for a few steps on a slice of WikiText-2 (seconds), and its minutes."""
    config = RunConfig()
    apply_preset(config, "tiny")
    config.data.corpus = str(wikitext("train", True, bench.workdir))
    config.tokenizer.vocab_size = QUICK_VOCAB
    config.data.max_seq_length = 64
    config.train.batch_size = 8
    config.train.max_steps = config.train.eval_every = QUICK_PRETRAIN_STEPS  # one checkpoint, at the end
    config.runtime.device = str(bench.device)
    out = bench.workdir / "glue-model"
    bench.log(f"glue: pretraining a tiny model for {QUICK_PRETRAIN_STEPS} steps (--quick)")
    start = time.perf_counter()
    pretrain(config, out, cache_dir=bench.cache_dir, show_progress=False)
    return out, (time.perf_counter() - start) / 60


def quick_data(data: Path, out: Path) -> Path:
    """A folder of the quick tasks' folders, each holding the first rows of its train and dev files."""
    found, _ = find_tasks([data], QUICK_TASKS)
    for folder in found.values():
        for name, rows in QUICK_ROWS.items():
            lines = (folder / name).read_text(encoding="utf-8").splitlines(keepends=True)
            (out / folder.name).mkdir(parents=True, exist_ok=True)
            (out / folder.name / name).write_text("".join(lines[: rows + 1]), encoding="utf-8")  # + header
    return out


def run(model: Path | None, data: Path, bench: Bench) -> dict:
    pretrain_minutes = None
    if model is None:
        model, pretrain_minutes = quick_model(bench)
    recipes = None
    if bench.quick:
        data = quick_data(data, bench.workdir / "glue-data")
        recipes = bench.workdir / "glue-quick-recipes.toml"
        recipes.write_text(QUICK_RECIPES, encoding="utf-8")
    settings = benchmark(
        model,
        [data],
        tasks=QUICK_TASKS if bench.quick else TASKS,
        seeds=QUICK_SEEDS if bench.quick else SEEDS,
        compare_scratch=True,
        recipes_file=recipes,
        precision="fp32" if bench.quick else None,  # None: glue's own choice, as the target's command
        device=str(bench.device),
    )
    bench.log(f"glue: {', '.join(settings.tasks)}, seeds {settings.seeds}, both arms, model {model}")
    start = time.perf_counter()
    # jobs None: the command's default (two runs at a time on a CPU)
    report = run_glue(settings, bench.workdir / "glue", show_progress=True, say=bench.log, jobs=None)
    minutes = (time.perf_counter() - start) / 60
    return {
        "model": str(model),
        "pretrain_minutes": pretrain_minutes,
        "data": str(data),
        "tasks": settings.tasks,
        "seeds": settings.seeds,
        "recipes": QUICK_RECIPES_SAID if bench.quick else "built in (configs/glue.toml)",
        "wall_minutes": minutes,
        "target_minutes": TARGET_MINUTES,
        "target_met": None if bench.quick else minutes <= TARGET_MINUTES,  # quick is not its workload
        "fine_tuning_minutes": report["runs_elapsed_s"] / 60,
        "jobs": report["machine"]["jobs"],
        "per_task": task_rows(report),
        "average": {arm: report["average"][arm]["score"] for arm in ARMS},
        "skipped": report["skipped"],
    }


def task_rows(report: dict) -> list[dict]:
    """Per task and arm: its runs, their minutes of fine-tuning (own clocks), the median dev score and
    figures, whether it is at chance (None for a regression); the pretrained arm's row adds its paired
    gain over scratch."""
    rows = []
    for name, task in report["tasks"].items():
        for arm in ARMS:
            summary = task["arms"][arm]
            rows.append(
                {
                    "task": name,
                    "arm": arm,
                    "runs": len(summary["runs"]),
                    "train_examples": task["train_examples"],
                    "minutes": sum(run["elapsed_s"] for run in summary["runs"]) / 60,
                    "score": summary["score"]["median"],
                    "figures": {figure: values["median"] for figure, values in summary["dev"].items()},
                    "comparison": task["comparison"] if arm == ARMS[0] else None,
                    "at_chance": at_chance(task["majority"], arm) if "majority" in task else None,
                }
            )
    return rows
