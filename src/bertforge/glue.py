"""`bertforge glue`: a pretrained model fine-tuned on every GLUE task found, per seed, scored as GLUE
scores it, beside Google's small BERTs.

Owns the benchmark's settings (with each task's recipe from `bertforge.glue_recipes`), its folder
and how a rerun continues it, each task's runs through `bertforge.finetune` (with
`compare_scratch` both arms per seed, laid out as `bertforge.comparison` lays them out), scoring
each run's best epoch on the task's dev and labelled test files (`bertforge.glue_scores`), the
`--sweep` over each task's recipe and a small grid, and the progress over all runs. With `jobs` above
1 the unfinished runs of a task train at once in `bertforge.worker_pool`'s processes; this process
keeps each folder.
glue.json's content, the table, glue.md and glue.png are `bertforge.glue_report`'s.

Benchmark folder (`out`):

    glue_task.json      the settings (model, data, tasks, seeds, arms, recipes): what a rerun continues
    data/<task>/        train.jsonl (its recipe's `max_train_examples`: a fixed random subset) and
                        dev.jsonl (the first dev file), what fine-tuning reads (with `both_orders`,
                        finetune's, each training pair in both orders)
    sweep/<task>/lr<LR>-bs<B>/   one fine-tuning folder per point of the sweep, first seed only
    <task>/             the task's fine-tuning folder: seed_N/, or pretrained/seed_N/ and scratch/seed_N/
                        (each run's glue_scores.json: its figures on every dev and test file)
    glue.json, glue.md, glue.png

A run whose result.json exists is not run again; an interrupted run continues from its checkpoint.
A rerun may grow the benchmark: more tasks, more seeds, the scratch arm (`grown`; its pretrained runs
move from <task>/seed_N/ to <task>/pretrained/seed_N/). A continued benchmark may keep only some of
its tasks (`only_tasks`): the report then covers those.
Each run's best epoch is chosen on the first dev file, which also scores it (as `finetune`'s).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shlex
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch

from bertforge.checkpoint import list_checkpoints
from bertforge.classifier import classify
from bertforge.comparison import ARMS, SEEDS_FOR_A_CLAIM, few_seeds_note, run_folder
from bertforge.config import RunConfig
from bertforge.errors import BertforgeError, Interrupted
from bertforge.finetune import (
    EVAL_BATCH_SIZE,
    RESULT,
    TASK,
    FinetuneTask,
    Job,
    check_paired_seeds,
    finetuning_config,
    removed_unless_progress,
    start,
    worker_job,
)
from bertforge.folders import (
    find_model_folder,
    fine_tuned_kind,
    model_positions,
    open_classifier,
    refuse_other_kind,
)
from bertforge.glue_data import TASKS, TaskData, find_tasks, read_task, refuse_untrainable, task_spec
from bertforge.glue_recipes import Recipe, full_recipe, load_recipes, recipe_text, recipe_values
from bertforge.glue_report import build_report, command_line, markdown_report, plot_report
from bertforge.glue_scores import BEST_EPOCH_BY, majority_label, split_figures, task_score
from bertforge.io import (
    LOCK_FILE,
    RunFolderLock,
    atomic_write_text,
    is_occupied,
    read_json,
    remove_folder,
    write_json,
)
from bertforge.labeled import LabeledExamples
from bertforge.model import reading_length
from bertforge.progress import RunsProgress
from bertforge.runtime import resolve_device
from bertforge.worker_pool import (
    WorkerPool,
    auto_jobs,
    check_jobs,
    jobs_flag,
    share_threads,
    worker_pool,
    worker_runtime,
)

SETTINGS = "glue_task.json"
REPORT = "glue.json"
SCORES = "glue_scores.json"
DEFAULT_SEEDS = [1, 2, 3, 4, 5]
SUBSET_SEED = 0  # draws a recipe's `max_train_examples`: the same subset for every seed and arm
GROWING = ("tasks", "seeds", "compare_scratch")  # what a rerun may add to (`grown`)


@dataclass
class GlueBenchmark:
    """What `bertforge glue` runs; saved as glue_task.json so that a rerun or `--resume` continues it."""

    model: str
    data: list[str]
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    seeds: list[int] = field(default_factory=lambda: list(DEFAULT_SEEDS))
    compare_scratch: bool = False
    sweep: bool = False
    recipes: dict[str, dict] = field(default_factory=dict)  # task -> Recipe's fields
    sweep_grid: dict[str, list] = field(default_factory=dict)  # learning_rate, batch_size
    recipes_file: str | None = None
    precision: str | None = None
    device: str | None = None


def benchmark(
    model: str | Path,
    data: list[str | Path],
    tasks: list[str] | None = None,
    seeds: list[int] | None = None,
    compare_scratch: bool = False,
    sweep: bool = False,
    recipes_file: str | Path | None = None,
    precision: str | None = None,
    device: str | None = None,
) -> GlueBenchmark:
    """A `GlueBenchmark` with its tasks checked and each task's recipe and the sweep's grid resolved."""
    names = [task_spec(name).name for name in tasks] if tasks else list(TASKS)
    if len(set(names)) < len(names):
        raise BertforgeError(f"--tasks names a task twice: {', '.join(names)}")
    seeds = list(DEFAULT_SEEDS if seeds is None else seeds)
    if not seeds or len(set(seeds)) < len(seeds):
        raise BertforgeError(f"--seeds must list distinct seeds, e.g. 1,2,3; got {seeds}")
    check_paired_seeds(compare_scratch, seeds)  # before any task is read
    recipes, grid = load_recipes(recipes_file)
    return GlueBenchmark(  # paths absolute, so that a rerun or --resume works from any folder
        model=str(Path(model).resolve()),
        data=[str(Path(path).resolve()) for path in data],
        tasks=names,
        seeds=seeds,
        compare_scratch=compare_scratch,
        sweep=sweep,
        recipes={name: asdict(recipes[name]) for name in names},
        sweep_grid=grid,
        recipes_file=None if recipes_file is None else str(Path(recipes_file).resolve()),
        precision=precision,
        device=device,
    )


# ------------------------------------------------------------------------------------------ the run


def run_glue(
    bench: GlueBenchmark | None,
    out: Path,
    resume: bool = False,
    show_progress: bool = True,
    say=print,
    only_tasks: list[str] | None = None,
    jobs: int | None = 1,
) -> dict:
    """Run (or continue) the benchmark in `out` and return its report (what glue.json holds).

    `bench` None with `resume`: the saved settings; `only_tasks` then narrows them to some of the
    saved tasks, so that a benchmark stopped in a task can be reported without it. `say` receives the
    lines for the user: a task skipped, a test file without labels, each task's recipe, the sweep's
    choice. `jobs`: the fine-tuning runs at once, each in a worker process with a share of the
    threads (None: `worker_pool.auto_jobs`).
    """
    if jobs is not None:
        check_jobs(jobs)  # before anything is written
    out = Path(out)
    lock = RunFolderLock(out).acquire()
    began = time.time()
    try:
        whole, saved = settled(bench, out, resume)
        bench = reported_part(whole, only_tasks, out, say)
        datas, skipped = read_tasks(bench, say)
        if whole.compare_scratch:
            move_to_pretrained_arm(whole, out)
        if saved != whole:
            write_json(out / SETTINGS, asdict(whole))  # new, or grown
        files = {
            name: write_task_files(out / "data" / name, data, recipe_of(bench, name))
            for name, data in datas.items()
        }
        tasks, runs_at_once = run_tasks(bench, datas, files, out, say, jobs, bool(only_tasks), show_progress)
        # the settings and command of the whole benchmark, even where the report covers part of it
        report = build_report(asdict(whole), out, tasks, skipped, time.time() - began, runs_at_once)
        write_json(out / REPORT, report)
        atomic_write_text(out / "glue.md", markdown_report(report))
        plot_report(report, out / "glue.png")
        return report
    except BaseException as error:
        saved_runs = any(list_checkpoints(folder.parent) for folder in out.rglob("checkpoints"))
        if lock.created and not any(out.rglob(RESULT)) and not saved_runs:
            clear_folder(out)  # nothing finished or saved: no half-made benchmark is left behind
            if isinstance(error, Interrupted):
                error.resume_command = ""  # there is nothing to continue: run the command again
        raise
    finally:
        lock.release()


def reported_part(whole: GlueBenchmark, only_tasks: list[str] | None, out: Path, say) -> GlueBenchmark:
    """The benchmark narrowed to `only_tasks` (all of it without them), saying when the report will
    lack some of its tasks."""
    if not only_tasks:
        return whole
    bench = narrowed(whole, only_tasks, out)
    if len(bench.tasks) < len(whole.tasks):
        say(
            f"the report will cover {', '.join(bench.tasks)} only, of the benchmark's "
            f"{', '.join(whole.tasks)}; continue it without --tasks to report them all"
        )
    return bench


def read_tasks(bench: GlueBenchmark, say) -> tuple[dict[str, TaskData], list[str]]:
    """The data of each of the benchmark's tasks found in its folders, and the lines naming those
    skipped, after the checks that refuse a benchmark before anything is written (no task found, a
    wrong model, a recipe longer than the model). `say` gets the notes and each task's recipe."""
    found, skipped = find_tasks([Path(p) for p in bench.data], bench.tasks)
    for line in skipped:
        say(line)
    if not found:
        raise BertforgeError(
            f"none of the tasks {', '.join(bench.tasks)} is in {', '.join(bench.data)}; give --data the "
            "folder that holds GLUE's task folders (SST-2/, MRPC/, ...)"
        )
    model = find_model_folder(bench.model)
    refuse_longer_than_the_model(bench, model_positions(model.path))
    if model.has_labels:
        say(
            f"note: {model.path} is {fine_tuned_kind(model.path)[0]}; glue fine-tunes its encoder again "
            "without its head, so the figures are not a pretrained encoder's"
        )
    datas = {name: read_task(TASKS[name], folder) for name, folder in found.items()}
    for name, data in datas.items():
        for line in data.notes:
            say(line)
        say(f"{name}'s recipe: {recipe_text(recipe_of(bench, name))}")
    if len(bench.seeds) < SEEDS_FOR_A_CLAIM and bench.compare_scratch:
        say(f"note: {few_seeds_note(len(bench.seeds))}")
    return datas, skipped


def run_tasks(
    bench: GlueBenchmark,
    datas: dict,
    files: dict,
    out: Path,
    say,
    jobs: int | None,
    some_tasks: bool,
    show_progress: bool,
) -> tuple[dict[str, dict], dict]:
    """Every run of every task, some at once in worker processes, under one progress bar: each task's
    summary, and how many ran at once with how many threads each. `some_tasks`: the report covers
    some of the benchmark's tasks, which a resume command must name."""
    planned = plan(bench, datas, out)
    work, done = {str(run.folder): run.work for run in planned}, [run.done for run in planned]
    given = jobs_flag(jobs)
    jobs = auto_jobs(bench.device) if jobs is None else jobs
    share = share_threads(jobs, torch.get_num_threads(), len(planned), done.count(False))
    progress = RunsProgress("glue", work, done, show_progress, unit="token", at_once=share.workers)
    tasks = {}
    try:
        with worker_pool(share) as pool:
            for name, data in datas.items():
                tasks[name] = run_task(bench, data, files[name], out, progress, say, pool)
    except Interrupted as stop:
        kept = f" --tasks {','.join(bench.tasks)}" if some_tasks else ""
        stop.resume_command = f"bertforge glue --out {shlex.quote(str(out))} --resume{kept}{given}"
        raise
    finally:
        progress.close()
    return tasks, {"jobs": share.workers, "threads_per_run": share.threads}  # this invocation's


def refuse_longer_than_the_model(bench: GlueBenchmark, positions: int | None) -> None:
    """A recipe's max_length that the model cannot read, named with the file that set it."""
    for name in bench.tasks:
        length = recipe_of(bench, name).max_length
        if positions is not None and length > positions:
            origin = bench.recipes_file or "the built-in recipes"
            raise BertforgeError(
                f"{origin}: {name}'s max_length {length} is more than the {positions} positions of the "
                f"model {bench.model}; set it to {positions} or less"
            )


def clear_folder(out: Path) -> None:
    """Remove everything in `out` but its lock (which `RunFolderLock.release` removes, and the folder)."""
    for entry in out.iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            remove_folder(entry)
        else:
            entry.unlink(missing_ok=True)


def settled(
    bench: GlueBenchmark | None, out: Path, resume: bool
) -> tuple[GlueBenchmark, GlueBenchmark | None]:
    """The settings to run, and those saved in `out` (None where it holds no benchmark): the saved
    ones with `resume`; else `bench`, which must equal the saved ones when `out` already holds a
    benchmark (a rerun of the same command continues it) or may grow them."""
    if resume:
        refuse_other_kind(out, "GLUE benchmark", f"; to benchmark it, give it as --model {out}")
        saved_bench = saved_settings(out)
        if saved_bench is None:
            raise BertforgeError(f"{out} holds no glue benchmark to resume; start one without `resume=True`")
        return saved_bench, saved_bench
    if bench is None:
        raise BertforgeError("give the benchmark's settings, or `resume=True` to continue one")
    saved_bench = saved_settings(out)
    if saved_bench is None:
        if is_occupied(out):
            raise BertforgeError(
                f"{out} is not an empty folder and holds no glue benchmark; choose a new `out`"
            )
        return bench, None
    saved = asdict(saved_bench)
    different = [key for key, value in asdict(bench).items() if not same_setting(key, value, saved.get(key))]
    larger = grown(bench, saved, out) if set(different) <= set(GROWING) else None
    if different and larger is None:
        raise BertforgeError(
            f"{out} holds a glue benchmark with other settings ({', '.join(different)}); a rerun may add "
            "tasks, seeds or the scratch arm to it, not change or drop any: continue it with `resume=True` "
            "(its own settings), or choose a new `out`"
        )
    return larger or bench, saved_bench


def saved_settings(out: Path) -> GlueBenchmark | None:
    """The settings of the benchmark in `out`, None where it holds none; a damaged file is one error."""
    path = out / SETTINGS
    if not path.is_file():
        return None
    values = read_json(path, damaged="start the benchmark again in a new folder")
    unknown = sorted(set(values) - {setting.name for setting in fields(GlueBenchmark)})
    try:
        saved = GlueBenchmark(**values) if not unknown else None
        problem = f"an unknown setting {unknown[0]!r}" if unknown else settings_problem(saved)
    except TypeError:
        problem = "it lacks settings every benchmark has"
    if problem:
        raise BertforgeError(f"{path} is damaged ({problem}); start the benchmark again in a new folder")
    return saved


def settings_problem(saved: GlueBenchmark) -> str | None:
    """What in saved settings cannot be run, None where nothing is."""
    if not isinstance(saved.model, str) or not all_of(saved.data, str) or not saved.data:
        return "its model or data is not a path"
    if not all_of(saved.seeds, int) or not saved.seeds or not all_of(saved.tasks, str):
        return "its seeds or tasks are not lists of numbers and names"
    for name in saved.tasks:
        if name not in TASKS:
            return f"{name!r} is not a GLUE task"
        try:
            Recipe(**recipe_values(saved.recipes[name], {}, f"{name}'s recipe"))
        except (KeyError, TypeError):
            return f"it has no whole recipe for {name}"
        except BertforgeError as error:
            return str(error)
    return None


def all_of(values, kind: type) -> bool:
    """Whether `values` is a list of `kind` (booleans are no numbers here)."""
    return isinstance(values, list) and all(isinstance(v, kind) and not isinstance(v, bool) for v in values)


def grown(bench: GlueBenchmark, saved: dict, out: Path) -> GlueBenchmark | None:
    """The saved benchmark with what `bench` adds: tasks, seeds (after the saved ones, so that the sweep
    keeps its first seed), the scratch arm; None where `bench` drops any of it. A saved task that never
    started (no folder in `out`: all nine are saved when --tasks is not given, found or not) is no loss.
    (A changed recipe of a saved task is refused before: `same_setting`.)"""
    saved_tasks = [name for name in saved.get("tasks", []) if name in bench.tasks or (out / name).is_dir()]
    saved_seeds = saved.get("seeds", [])
    kept = (
        set(saved_tasks) <= set(bench.tasks)
        and set(saved_seeds) <= set(bench.seeds)
        and bench.compare_scratch >= saved.get("compare_scratch", False)
    )
    if not kept:
        return None
    tasks = saved_tasks + [name for name in bench.tasks if name not in saved_tasks]
    seeds = saved_seeds + [seed for seed in bench.seeds if seed not in saved_seeds]
    return replace(bench, tasks=tasks, seeds=seeds, recipes={name: bench.recipes[name] for name in tasks})


def move_to_pretrained_arm(bench: GlueBenchmark, out: Path) -> None:
    """A benchmark that gains the scratch arm: its runs so far become the pretrained arm's."""
    for name in bench.tasks:
        for seed in bench.seeds:
            alone = arm_folder(out / name, ARMS[0], seed, compare=False)
            if alone.is_dir():
                paired = arm_folder(out / name, ARMS[0], seed, compare=True)
                paired.parent.mkdir(parents=True, exist_ok=True)
                alone.rename(paired)


def narrowed(bench: GlueBenchmark, tasks: list[str], out: Path) -> GlueBenchmark:
    """The benchmark with only those of its tasks that `tasks` names (the saved settings keep all)."""
    names = {task_spec(name).name for name in tasks}
    outside = sorted(names - set(bench.tasks))
    if outside:
        raise BertforgeError(
            f"the benchmark in {out} has no {', '.join(outside)} (its tasks: {', '.join(bench.tasks)}); with "
            "--resume, --tasks keeps some of them; to add tasks, run its command again with them: "
            + command_line(asdict(replace(bench, tasks=[*bench.tasks, *outside])), out)
        )
    kept = [name for name in bench.tasks if name in names]
    return replace(bench, tasks=kept, recipes={name: bench.recipes[name] for name in kept})


def same_setting(key: str, given, saved) -> bool:
    """Equal settings; paths compared as the files they name."""
    if key == "model":
        return Path(given).resolve() == Path(saved).resolve()
    if key == "data":
        return [Path(p).resolve() for p in given] == [Path(p).resolve() for p in saved or []]
    if key == "recipes_file":
        return True  # the recipes themselves are compared
    if key in ("tasks", "seeds"):
        return set(given) == set(saved or [])  # a rerun keeps the saved order (`grown`)
    if key == "recipes":  # of the tasks both name (other tasks are "tasks")
        return all(same_recipe(recipe, (saved or {}).get(name, recipe)) for name, recipe in given.items())
    return given == saved


def same_recipe(given: dict, saved: dict) -> bool:
    """Equal recipes, a setting that a saved benchmark lacks taking its default."""
    return full_recipe(given) == full_recipe(saved)


def recipe_of(bench: GlueBenchmark, task: str) -> Recipe:
    return Recipe(**bench.recipes[task])


@dataclass
class TaskFiles:
    """The JSON-lines files fine-tuning reads, and how many training examples the task has."""

    train: Path
    dev: Path
    train_examples: int
    train_examples_in_file: int
    majority: str | None = None  # the most frequent label of the examples trained on; None: regression


def write_task_files(folder: Path, data: TaskData, recipe: Recipe) -> TaskFiles:
    """The training examples (a fixed random subset of `max_train_examples`) and the first dev file as
    JSON lines; a file whose content is unchanged is left as it is (fine-tuning swaps the pairs of a
    `both_orders` recipe itself)."""
    total = len(data.train)
    keep = np.arange(total)
    if 0 < recipe.max_train_examples < total:
        rng = np.random.default_rng(SUBSET_SEED)
        keep = np.sort(rng.choice(total, recipe.max_train_examples, replace=False))
    train, dev = folder / "train.jsonl", folder / "dev.jsonl"
    write_if_changed(train, jsonl(data.train, keep))
    first_dev = data.dev[data.spec.dev[0]]
    write_if_changed(dev, jsonl(first_dev, np.arange(len(first_dev))))
    kept_labels = [data.train.labels[i] for i in keep]
    subset = f" (the recipe's {len(keep):,} of {total:,} examples)" if len(keep) < total else ""
    refuse_untrainable(data, kept_labels, subset)
    majority = None if data.spec.kind == "regression" else majority_label(kept_labels)
    return TaskFiles(train, dev, len(keep), total, majority)


def jsonl(examples: LabeledExamples, keep: np.ndarray) -> str:
    rows = []
    for i in keep:
        row = {"text": examples.texts[i], "label": examples.labels[i]}
        if examples.pairs is not None:
            row["pair"] = examples.pairs[i]
        rows.append(json.dumps(row, ensure_ascii=False))
    return "\n".join(rows) + "\n"


def write_if_changed(path: Path, text: str) -> None:
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)


def finetune_task(
    bench: GlueBenchmark, data: TaskData, files: TaskFiles, recipe: Recipe, seeds, compare
) -> FinetuneTask:
    return FinetuneTask(
        model=bench.model,
        train=str(files.train),
        valid=str(files.dev),
        text_column="text",
        label_column="label",
        text_pair_column="pair" if data.train.pairs is not None else None,
        format="jsonl",
        epochs=recipe.epochs,
        seeds=list(seeds),
        compare_scratch=compare,
        dropout=recipe.dropout,
        task_type=data.spec.kind,
        best_by=BEST_EPOCH_BY.get(data.spec.name),
        both_orders=recipe.both_orders,
    )


def finetune_config(bench: GlueBenchmark, recipe: Recipe) -> RunConfig:
    config = finetuning_config()
    config.train.learning_rate = recipe.learning_rate
    config.train.batch_size = recipe.batch_size
    config.train.warmup_ratio = recipe.warmup
    config.train.layer_decay = recipe.layer_decay
    config.data.max_seq_length = recipe.max_length
    if bench.precision is not None:
        config.runtime.precision = bench.precision
    if bench.device is not None:
        config.runtime.device = bench.device
    return config


def run_task(
    bench: GlueBenchmark,
    data: TaskData,
    files: TaskFiles,
    out: Path,
    progress: RunsProgress,
    say,
    pool: WorkerPool | None,
) -> dict:
    """A task's sweep (when asked), then its runs: each seed, and with `compare_scratch` each seed of
    both arms; returns the task's part of the report."""
    name, recipe, grid = data.spec.name, recipe_of(bench, data.spec.name), []
    if bench.sweep:
        recipe, grid = sweep_task(bench, data, files, recipe, out / "sweep" / name, progress, pool)
        say(
            f"{name}: --sweep chose learning rate {recipe.learning_rate:g}, batch size {recipe.batch_size} "
            f"on dev (seed {bench.seeds[0]}); its dev figures are optimistic"
        )
    arms = ARMS if bench.compare_scratch else ARMS[:1]
    folder = out / name
    task = finetune_task(bench, data, files, recipe, bench.seeds, bench.compare_scratch)
    runs = [
        (seed, arm, arm_folder(folder, arm, seed, bench.compare_scratch))
        for seed in bench.seeds
        for arm in arms
    ]
    group = FolderRuns(task, finetune_config(bench, recipe), folder, runs)
    scored = run_task_seeds([group], data, progress, pool)[0]
    return {
        "folder": str(data.folder),
        "kind": data.spec.kind,
        "train_examples": files.train_examples,
        "train_examples_in_file": files.train_examples_in_file,
        "dev_examples": {stem: len(examples) for stem, examples in data.dev.items()},
        "test_examples": {stem: len(examples) for stem, examples in data.test.items()},
        "recipe": asdict(recipe),
        "recipe_chosen_on_dev": bench.sweep,
        "sweep": grid,
        "runs": scored,
        "true": dev_truth(data),
        "train_majority": files.majority,
    }


def arm_folder(folder: Path, arm: str, seed: int, compare: bool) -> Path:
    return run_folder(folder, arm, seed) if compare else folder / f"seed_{seed}"


@dataclass
class RunOrder:
    """One fine-tuning run of a task, as a worker process receives it: what `finetune.prepare` needs to
    open the task's folder, the run, and the task's files to score it with."""

    task: FinetuneTask
    config: RunConfig
    folder: Path  # the task's fine-tuning folder (its finetune.json)
    seed: int
    arm: str
    run_dir: Path
    task_name: str
    task_folder: Path  # the task's GLUE folder
    point: str = ""  # a sweep's grid point (lr3e-4-bs16), which the progress lines name


@dataclass
class FolderRuns:
    """One fine-tuning folder's runs: its task and config, and each (seed, arm, run folder)."""

    task: FinetuneTask
    config: RunConfig
    folder: Path
    runs: list[tuple[int, str, Path]]
    point: str = ""  # a sweep's grid point


def run_task_seeds(
    groups: list[FolderRuns], data: TaskData, progress: RunsProgress, pool: WorkerPool | None
) -> list[list[dict]]:
    """Fine-tune and score every run of one task's fine-tuning folders (the benchmark's, or the sweep's
    one per grid point), all at once: in this process, or the unfinished ones in `pool`'s workers.
    Per folder, its runs' records."""
    with contextlib.ExitStack() as stack:
        orders, jobs = [], []
        for group in groups:
            job = stack.enter_context(opened(group, data))
            share = pool.threads if pool is not None else 0
            runtime = worker_runtime(group.config.runtime, job.config.runtime.precision, share)
            config = replace(group.config, runtime=runtime)
            for seed, arm, run_dir in group.runs:
                orders.append(
                    RunOrder(
                        group.task,
                        config,
                        group.folder,
                        seed,
                        arm,
                        run_dir,
                        data.spec.name,
                        data.folder,
                        group.point,
                    )
                )
                jobs.append(job)
        scored = run_orders(orders, jobs, data, progress, pool)
    ends = np.cumsum([len(group.runs) for group in groups]).tolist()
    return [scored[end - len(group.runs) : end] for group, end in zip(groups, ends, strict=True)]


@contextlib.contextmanager
def opened(group: FolderRuns, data: TaskData) -> Iterator[Job]:
    """The folder's `Job`, the folder made (or continued) and owned by this process while in the block.
    Its errors and warnings name the task."""
    name, caught = data.spec.name, []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exists = (group.folder / TASK).is_file()
            job, created = start(group.task, group.config, group.folder, exists, show_progress=False)
    except BertforgeError as error:
        warn_naming(name, caught)
        raise BertforgeError(f"{name}: {error}") from None
    with removed_unless_progress(group.folder, created, [run_dir for _, _, run_dir in group.runs]):
        warn_naming(name, caught)
        yield job


_SHOWN: dict = {}  # the warnings `warn_naming` has shown: each text once, as the default filter does


def warn_naming(task: str, caught: list[warnings.WarningMessage]) -> None:
    """Warn again of what was caught, each named with the task, from where it was first raised."""
    for warning in caught:
        message = f"{task}: {warning.message}"
        warnings.warn_explicit(message, warning.category, warning.filename, warning.lineno, registry=_SHOWN)


def run_orders(
    orders: list[RunOrder], jobs: list[Job], data: TaskData, progress: RunsProgress, pool: WorkerPool | None
) -> list[dict]:
    """Each order's record; a scored run is read here, the rest run here or in `pool`."""
    finished = [(order.run_dir / RESULT).is_file() for order in orders]

    def started(index: int) -> None:  # keyed by folder: a sweep's grid points share a label
        if not finished[index]:  # a finished run, only scored, was counted from the start
            progress.start(str(orders[index].run_dir))

    def done(index: int, record: dict) -> None:
        order, score = orders[index], record["score"]
        figure = "" if score is None else f"dev score {score:.1f}"
        label = f"{data.spec.name} {order.arm} seed {order.seed}" + (
            f" (sweep {order.point})" if order.point else ""
        )
        progress.advance(str(order.run_dir), label, finished[index], figure)

    scored: dict[int, dict] = {}
    for index in range(len(orders)):
        # A run stopped between its end and its scoring is scored in a worker, with a worker's share
        # of the threads, as it would have been: more threads change the figures' last bits.
        if pool is None or (orders[index].run_dir / SCORES).is_file():
            scored[index] = fine_tune_and_score(orders[index], jobs[index], data)
            done(index, scored[index])
    elsewhere = [index for index in range(len(orders)) if index not in scored]
    if elsewhere:
        arguments = [(orders[index],) for index in elsewhere]
        values = pool.map(
            run_and_score_in_worker,
            arguments,
            lambda k, record: done(elsewhere[k], record),
            lambda k: started(elsewhere[k]),
            progress.tick,
        )
        scored.update(zip(elsewhere, values, strict=True))
    return [scored[index] for index in range(len(orders))]


def fine_tune_and_score(order: RunOrder, job: Job, data: TaskData) -> dict:
    # The loop writes a line per epoch to stdout even without a bar: the benchmark shows its own.
    with contextlib.redirect_stdout(io.StringIO()):
        result = job.run(order.seed, order.run_dir, from_scratch=order.arm == "scratch")
    figures = score_run(order.run_dir, data, order.config)
    return {
        "seed": order.seed,
        "arm": order.arm,
        "folder": str(order.run_dir),
        **run_record(result),
        **figures,
    }


_worker_data: dict[Path, TaskData] = {}  # a worker's tasks, read once


def run_and_score_in_worker(order: RunOrder) -> dict:
    """`fine_tune_and_score` in a worker process."""
    if order.task_folder not in _worker_data:
        _worker_data[order.task_folder] = read_task(TASKS[order.task_name], order.task_folder)
    job = worker_job(order.task, order.config, order.folder)
    return fine_tune_and_score(order, job, _worker_data[order.task_folder])


class DamagedScores(BertforgeError):
    """A run's glue_scores.json that cannot be read (`score_run` scores the run again)."""


def run_record(result: dict) -> dict:
    return {key: result[key] for key in ("best_epoch", "epochs", "steps", "elapsed_s")}


def score_run(run_dir: Path, data: TaskData, config: RunConfig) -> dict:
    """The run's best epoch (final/) scored on every dev and labelled test file: its figures, task
    scores and the first dev file's predictions (for the paired bootstrap); kept in glue_scores.json,
    and scored again where the task's files are not those it was scored on (a dev or test file added
    or taken away since)."""
    path = run_dir / SCORES
    files = sorted([*data.dev, *data.test])
    if path.is_file():
        with contextlib.suppress(DamagedScores):  # a damaged file is scored again from final/
            saved = read_json(path, error=DamagedScores)
            # a file without "files" counts as scored on the files there are
            if {"dev", "test", "score", "predicted"} <= saved.keys() and saved.get("files", files) == files:
                return saved
    model, tokenizer, labels, _ = open_classifier(run_dir / "final")
    model.to(resolve_device(config.runtime.device))
    max_length = reading_length(model)  # the recipe's max_length, at which the run fine-tuned
    regression = data.spec.kind == "regression"
    record: dict = {"files": files, "dev": {}, "test": {}}
    for split, stems, sets in (("dev", data.spec.dev, data.dev), ("test", data.spec.test, data.test)):
        for which, stem in enumerate(stems):
            if stem not in sets:
                continue
            examples = sets[stem]
            outputs = classify(  # cut at the recipe's max_length, as in fine-tuning: no warning
                model,
                tokenizer,
                labels,
                examples.texts,
                examples.pairs,
                max_length,
                EVAL_BATCH_SIZE,
                warn_truncated=False,
            )
            predicted = [o["score"] for o in outputs] if regression else [o["label"] for o in outputs]
            true = truth(examples, regression)
            record[split].update(split_figures(data.spec.name, which, true, predicted, task_labels(data)))
            if split == "dev" and which == 0:
                record["predicted"] = predicted
    record["score"] = task_score(data.spec.name, record["dev"])
    record["test_score"] = task_score(data.spec.name, record["test"])
    write_json(path, record, indent=None)
    return record


def truth(examples: LabeledExamples, regression: bool) -> list:
    return [float(label) for label in examples.labels] if regression else list(examples.labels)


def task_labels(data: TaskData) -> list[str]:
    """The label names figures are counted over (sorted as fine-tuning orders them); none for STS-B."""
    return sorted(data.spec.labels)


def dev_truth(data: TaskData) -> list:
    return truth(data.dev[data.spec.dev[0]], data.spec.kind == "regression")


def sweep_task(
    bench: GlueBenchmark,
    data: TaskData,
    files: TaskFiles,
    recipe: Recipe,
    folder: Path,
    progress: RunsProgress,
    pool: WorkerPool | None,
) -> tuple[Recipe, list[dict]]:
    """One run (the first seed, pretrained) per point of `sweep_points`; the recipe of the best dev
    score (the first in their order among equals: the task's own recipe) and every point's result."""
    seed, grid = bench.seeds[0], []
    for lr, batch_size in sweep_points(bench.sweep_grid, recipe):
        point = replace(recipe, learning_rate=lr, batch_size=batch_size)
        name = sweep_folder_name(lr, batch_size)
        task = finetune_task(bench, data, files, point, [seed], compare=False)
        runs = [(seed, "pretrained", folder / name / f"seed_{seed}")]
        grid.append(FolderRuns(task, finetune_config(bench, point), folder / name, runs, name))
    points = [
        {
            "learning_rate": group.config.train.learning_rate,
            "batch_size": group.config.train.batch_size,
            "score": run["score"],
            "dev": run["dev"],
        }
        for group, [run] in zip(grid, run_task_seeds(grid, data, progress, pool), strict=True)
    ]
    best = max(range(len(points)), key=lambda i: (points[i]["score"], -i))
    chosen = replace(
        recipe, learning_rate=points[best]["learning_rate"], batch_size=points[best]["batch_size"]
    )
    return chosen, points


def sweep_points(grid: dict[str, list], recipe: Recipe) -> list[tuple[float, int]]:
    """The (learning rate, batch size) points a task's sweep tries: its own recipe's first, so that the
    sweep cannot lose on dev what the recipe scores, then the grid's other points."""
    own = (recipe.learning_rate, recipe.batch_size)
    points = [(lr, batch_size) for lr in grid["learning_rate"] for batch_size in grid["batch_size"]]
    return [own, *(point for point in points if point != own)]


def sweep_folder_name(learning_rate: float, batch_size: int) -> str:
    return f"lr{learning_rate:g}-bs{batch_size}"


# ------------------------------------------------------------------------------------- progress


CHARS_PER_TOKEN = 4  # English text in WordPiece pieces, near enough for the ETA's weights
# What an optimizer step (AdamW over every weight, clipping) costs, in tokens of training: fitted
# to the four tasks' clocks, about 105 on an EPYC without AVX-512 (fp32) and 433 on one with AVX-512
# bf16. With 250, the ETA from SST-2's pace (batches of 128) for the rest (batches of 16) was 11% high
# and 13% low there; from tokens alone, 7% and 28% low.
STEP_TOKENS = 250


@dataclass
class PlannedRun:
    folder: Path
    work: int  # `run_work`; a sweep's choice of batch size does not change its benchmark's runs'
    done: bool


def run_tokens(train: LabeledExamples, examples: int, epochs: int, max_length: int) -> int:
    """About how many tokens a run of `epochs` over `examples` of `train` trains on: most of the ETA's
    weight for a run (`run_work`). On a 2-core EPYC the four tasks' runs trained on 3,700-4,500 of
    these a second (within 3% of the tokenizer's count), where their optimizer steps ran at 2.2-7.2
    a second."""
    specials = 2 if train.pairs is None else 3
    pairs = train.pairs if train.pairs is not None else [""] * len(train)
    lengths = [
        min(math.ceil((len(text) + len(pair or "")) / CHARS_PER_TOKEN) + specials, max_length)
        for text, pair in zip(train.texts, pairs, strict=True)
    ]
    return round(epochs * examples * sum(lengths) / max(len(lengths), 1))


def run_work(train: LabeledExamples, examples: int, epochs: int, max_length: int, batch_size: int) -> int:
    """A run's weight for the ETA, in tokens: those it trains on, and `STEP_TOKENS` a step."""
    steps = epochs * math.ceil(examples / batch_size)
    return run_tokens(train, examples, epochs, max_length) + STEP_TOKENS * steps


def plan(bench: GlueBenchmark, datas: dict[str, TaskData], out: Path) -> list[PlannedRun]:
    """Every run the benchmark holds, with its work (for the ETA) and whether it is done."""
    runs = []
    arms = ARMS if bench.compare_scratch else ARMS[:1]
    for name, data in datas.items():
        recipe = recipe_of(bench, name)
        examples = min(len(data.train), recipe.max_train_examples or len(data.train))
        examples *= 2 if recipe.both_orders else 1
        shape = (data.train, examples, recipe.epochs, recipe.max_length)  # the sweep's too
        if bench.sweep:
            for lr, batch_size in sweep_points(bench.sweep_grid, recipe):
                folder = out / "sweep" / name / sweep_folder_name(lr, batch_size) / f"seed_{bench.seeds[0]}"
                runs.append(PlannedRun(folder, run_work(*shape, batch_size), (folder / RESULT).is_file()))
        work = run_work(*shape, recipe.batch_size)
        for seed in bench.seeds:
            for arm in arms:
                folder = arm_folder(out / name, arm, seed, bench.compare_scratch)
                runs.append(PlannedRun(folder, work, (folder / RESULT).is_file()))
    return runs
