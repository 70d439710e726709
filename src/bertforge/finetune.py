"""Fine-tuning for text classification, regression and token classification: from a pretrained model
folder and labelled files to a classifier (or a regressor: a head of one output; or a tagger: a
head on every token, for named entities).

Owns the fine-tuning objective (cross-entropy on the pooled [CLS] output, Devlin et al. 2019,
section 4.1; for a GPT on the last real token's state, Radford et al. 2018, section 3.2; for
real-valued labels, such as STS-B's similarity scores, the mean squared error of one output, as
Hugging Face's `problem_type = "regression"`, starting from the mean training score), its data
(tokenized once, shuffled per epoch from (seed, epoch); pairs also swapped with `both_orders`), the
per-epoch evaluation (accuracy, macro F1 and the confusion matrix; for a regression Pearson's and
Spearman's correlations and the MSE), keeping the best epoch (by accuracy, for a regression by
Pearson's r), several seeds with their median and spread (one after another, or some at once in
worker processes: `run_seeds`), and the run folder.
A tagged task (CoNLL or JSON lines of tokens and tags; `task_type = "ner"`, or detected from the
training file) runs through the same job, loop and evaluation with `bertforge.tagging`'s data, loss
and scores: entity precision, recall and F1 per type and overall after every epoch, the best epoch
by entity F1 (the head and its folder: `bertforge.tagger`).
The optimisation itself is `bertforge.train`'s loop, the same as pretraining's: one evaluation and
one checkpoint at the end of every epoch, and one more when SIGINT or SIGTERM stops the run (it then
names the `--resume` command). The comparison of a pretrained and a from-scratch arm
(`--compare-scratch`) is `bertforge.comparison`'s; it runs its seeds through the `Job` set up here.

Run folder (`--out DIR`; with `--seeds`, one per seed in `DIR/seed_N/` and `DIR/summary.json`):

    finetune.json   the task, the base config and the data's hashes (what `--resume` reads; in DIR)
    config.json     the run's effective config
    metrics.jsonl   "train" lines; per epoch a "valid" line and (classification) a "confusion" line
                    or (tagging) an "entities" line, the scores per entity type (epoch 0: before
                    fine-tuning)
    checkpoints/    the end of the last epoch, for `--resume` (removed when the run completes)
    best/, best.json  the best epoch so far (while training)
    final/          the classifier of the best epoch (see `bertforge.classifier`)
    result.json     best and last epoch's metrics, the time it took; its presence marks a finished run
    valid_predictions.json  the best epoch's prediction for every validation example, in file order
                    (label ids, a regression's scores, or per sentence its words' tag ids)
    curves.png      loss and the task's metrics per epoch

Nothing is written until the model folder and both data files have been read and checked.
"""

from __future__ import annotations

import contextlib
import io
import math
import shlex
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bertforge import distributed, reporting
from bertforge.batches import Batches, in_input_order, length_order, pad_batch, shape_batch
from bertforge.cache import default_cache_dir, refuse_changed_data
from bertforge.checkpoint import CONFIG, check_and_load_state, list_checkpoints, tensors_sha256
from bertforge.classifier import ENCODER, save_classifier, sequence_classifier
from bertforge.config import RunConfig, TrainConfig, save_json, validate
from bertforge.errors import BertforgeError, Interrupted
from bertforge.folders import encoder_trained_length, open_encoder, refuse_other_kind
from bertforge.glue_recipes import DEFAULT_RECIPES
from bertforge.io import (
    RunFolderLock,
    check_run_folder,
    file_sha256,
    read_json,
    remove_folder,
    replace_folder,
    write_json,
)
from bertforge.labeled import (
    FORMATS,
    TASK_TYPES,
    LabeledExamples,
    LabeledFormat,
    TaskType,
    check_regression_targets,
    in_both_orders,
    label_ids,
    label_names,
    label_values,
    read_labeled,
    task_type,
)
from bertforge.losses import NO_LABEL, Summary
from bertforge.metrics import confusion_accuracy, confusion_macro_f1, confusion_matthews, pearson, spearman
from bertforge.metrics_log import MetricsLog
from bertforge.plots import plot_finetuning
from bertforge.precision import resolve_precision
from bertforge.progress import RunsProgress
from bertforge.runtime import apply_threads, autocast, eval_mode, resolve_device, to_device
from bertforge.signals import StoppedEarly, signal_of
from bertforge.stats import spread
from bertforge.tagged import TAGGING, is_tagged_file
from bertforge.tagger import TOKEN_TASK, check_taggable, token_classifier
from bertforge.tagging import (
    encode_tagged,
    read_tagged_task,
    score_tagging,
    summarize_tagging,
    tagging_loss,
)
from bertforge.tokenizer import BertTokenizer
from bertforge.train import Objective, train
from bertforge.worker_pool import WorkerPool, auto_jobs, jobs_flag, share_threads, worker_runtime

TASK = "finetune.json"
ENCODER_KEY = "pretrained encoder"  # beside the data files' hashes in finetune.json
SUMMARY = "summary.json"
RESULT = "result.json"
BEST = "best.json"
EVAL_BATCH_SIZE = 64
# What a run writes into its folder; cleared before a run that has no checkpoint starts afresh.
PREDICTIONS = "valid_predictions.json"
RUN_FILES = ("metrics.jsonl", "checkpoints", "best", BEST, "final", RESULT, PREDICTIONS, "curves.png")
# Run folders this process holds, from `start` to the end of `removed_unless_progress`.
_owned: dict[Path, RunFolderLock] = {}
# The metrics a result reports, by task type: the first chooses the best epoch (ties: the lower loss,
# last), the first two are summarised over seeds.
METRICS = {
    "classification": ("accuracy", "macro_f1", "classification_loss"),
    "regression": ("pearson", "spearman", "mse"),
    "ner": ("f1", "precision", "recall", "accuracy", "tagging_loss"),
}
TASK_KINDS = (*TASK_TYPES, TAGGING)  # what `FinetuneTask.task_type` may name
# What a task keeps beside its metrics each epoch -> its metrics.jsonl line: (split, field).
LOGGED = {"confusion": ("confusion", "matrix"), "per_type": ("entities", "per_type")}
# What `FinetuneTask.best_by` may name, by task type.
BEST_BY = {
    "classification": ("accuracy", "macro_f1", "matthews"),
    "regression": ("pearson", "spearman"),
    "ner": ("f1", "accuracy"),
}


@dataclass
class FinetuneTask:
    """What is fine-tuned on which data; saved in `finetune.json` so that `--resume` needs only `--out`."""

    model: str  # a pretrained bertforge model folder (run folder, final/, checkpoint) or an exported one
    train: str
    valid: str
    # a tagged task's may be None: a CoNLL file's token in column 0 and tag in the last, or JSON
    # lines' "tokens" and "tags"
    text_column: str | None
    label_column: str | None
    text_pair_column: str | None = None
    format: LabeledFormat = "auto"
    epochs: int = 3
    seeds: list[int] | None = None  # None: one run in --out itself, seeded by runtime.seed
    from_scratch: bool = False  # same architecture and tokenizer, random initialisation
    compare_scratch: bool = False  # both arms per seed (`bertforge.comparison`)
    # the pretrained pooler left out: it starts as the from-scratch arm's (Zhang et al. 2021); NSP
    # trains it for NSP, which measured worse on SST-2 than a fresh one
    reinit_pooler: bool = False
    # hidden and attention dropout while fine-tuning; None: the pretrained model's, or for a model
    # pretrained without it BERT's 0.1 (Cramming), sentence pairs `PAIR_DROPOUT`
    dropout: float | None = None
    # "regression": one output and the squared error on real-valued labels; "ner": a tag per word of
    # a tagged file; "auto": tagging for a file `tagged.is_tagged_file` recognises, else a regression
    # when the training labels are numbers and some is not a whole number (see `labeled.task_type`)
    task_type: TaskType | str = "auto"  # or TAGGING
    # the dev metric that chooses the best epoch; None: the task type's first in METRICS (CoLA: matthews)
    best_by: str | None = None
    # each training pair also with its texts swapped, after all the pairs: for pairs that mean the same
    # in either order (glue's STS-B recipe)
    both_orders: bool = False


# Peak fine-tuning learning rate by the encoder's hidden size: (largest width, rate). Small BERTs
# want larger rates (Turc et al. 2019 search 3e-5 to 3e-4): BERT-Mini on SST-2 measured 3e-4 above
# 1e-4 at every training-set size (docs/records/downstream.md); 5e-5 is Devlin et al.'s for base.
LEARNING_RATE_BY_WIDTH = ((256, 3e-4), (512, 1e-4))
BASE_LEARNING_RATE = 5e-5
# Sentence pairs get GLUE's pair recipe (the built-in [default]: at most 1e-4, batch 16, 4 epochs, no
# dropout). BERT-Mini on STS-B: Pearson 53.5 against 42.4 at 3e-4 and 48-51 at batch 32 for 3 epochs;
# without dropout the same figures in a fifth less time (docs/records/glue.md).
PAIR_LEARNING_RATE = DEFAULT_RECIPES["default"]["learning_rate"]
PAIR_BATCH_SIZE = DEFAULT_RECIPES["default"]["batch_size"]
PAIR_EPOCHS = DEFAULT_RECIPES["default"]["epochs"]
PAIR_DROPOUT = DEFAULT_RECIPES["default"]["dropout"]
# A regression on pairs gets STS-B's rate: BERT-Mini from the mean score, Pearson 59.7 against 58.1 at
# 1e-4 (one order, 5 of 5 seeds). Pairs in both orders train half the epochs: the same steps.
PAIR_REGRESSION_LEARNING_RATE = DEFAULT_RECIPES["STS-B"]["learning_rate"]
BOTH_ORDERS_EPOCHS = DEFAULT_RECIPES["STS-B"]["epochs"]
FINETUNING_DROPOUT = 0.1  # BERT's, for a model pretrained without dropout (Cramming)


def default_learning_rate(hidden_size: int | None, pairs: bool = False, regression: bool = False) -> float:
    """`LEARNING_RATE_BY_WIDTH`'s rate for an encoder this wide (None: Devlin et al.'s 5e-5), for
    sentence pairs at most `PAIR_LEARNING_RATE` (a regression: `PAIR_REGRESSION_LEARNING_RATE`)."""
    rate = next(
        (rate for width, rate in LEARNING_RATE_BY_WIDTH if hidden_size is not None and hidden_size <= width),
        BASE_LEARNING_RATE,
    )
    if not pairs:
        return rate
    return min(rate, PAIR_REGRESSION_LEARNING_RATE if regression else PAIR_LEARNING_RATE)


def finetuning_config(
    hidden_size: int | None = None, pairs: bool = False, regression: bool = False
) -> RunConfig:
    """Defaults after Devlin et al. 2019 (appendix A.3): batch 32 (sentence pairs: `PAIR_BATCH_SIZE`),
    warmup 10%, linear decay, the peak learning rate by the encoder's width, whether it reads
    sentence pairs and whether they are scored (`default_learning_rate`); batches grouped by length.

    The model and tokenizer sections are replaced by the pretrained model's.
    """
    config = RunConfig()
    config.train = TrainConfig(
        batch_size=PAIR_BATCH_SIZE if pairs else 32,
        learning_rate=default_learning_rate(hidden_size, pairs, regression),
        warmup_ratio=0.1,
        log_every=50,
        keep_checkpoints=1,
        group_by_length=True,
    )
    config.data.max_seq_length = 128
    config.data.nsp = False  # a classifier's or tagger's sequences are its texts, not NSP pairs
    return config


def finetune(
    task: FinetuneTask,
    config: RunConfig,
    out: Path,
    resume: bool = False,
    show_progress: bool = True,
    jobs: int | None = 1,
) -> dict:
    """Fine-tune once per seed; return each run's result and the median and spread over seeds. `jobs`:
    the seeds trained at once (`run_seeds`; None: `worker_pool.auto_jobs`)."""
    if task.compare_scratch:
        raise BertforgeError(
            "this task compares with a from-scratch arm; run it with comparison.compare_with_scratch"
        )
    out, began = Path(out), time.time()
    job, created = start(task, config, out, resume, show_progress)
    runs = [
        SeedRun(seed, run_dir, task.from_scratch, f"seed {seed}")
        for seed, run_dir in seed_runs(task, job.config, out)
    ]
    with removed_unless_progress(out, created, [run.run_dir for run in runs], jobs):
        results, at_once = run_seeds(job, runs, config, out, jobs)
    summary = {**summarize_seeds(results), "this_invocation": {**at_once, "wall_s": time.time() - began}}
    if task.seeds:
        write_json(out / SUMMARY, summary)
    return summary


def start(
    task: FinetuneTask, config: RunConfig, out: Path, resume: bool, show_progress: bool
) -> tuple[Job, bool]:
    """Read and check the model, the data and the settings, then (unless resuming) create `out` with
    its `finetune.json`: the `Job` that trains the seeds, and whether `out` was created.

    From here until `removed_unless_progress` ends, this process owns `out` (see `RunFolderLock`).
    """
    out = Path(out)
    lock = RunFolderLock(out).acquire()
    try:
        job = prepare(task, config, out, resume, show_progress)
    except BaseException:
        lock.release()
        raise
    _owned[out.resolve()] = lock
    return job, lock.created


def prepare(task: FinetuneTask, config: RunConfig, out: Path, resume: bool, show_progress: bool) -> Job:
    """`start` in a folder this process owns."""
    check_finetuning_folder(out, resume)
    check_task(task)
    # saved absolute, so that `--resume` continues the run from any working directory
    task = replace(
        task, **{name: str(Path(getattr(task, name)).absolute()) for name in ("model", "train", "valid")}
    )
    config = RunConfig.from_dict(config.to_dict())  # a copy: the caller's stays as it was
    pretrained, tokenizer, encoder = open_encoder(task.model)
    config.model, config.tokenizer = pretrained.model, pretrained.tokenizer
    dropout = task.dropout
    if dropout is None and config.model.hidden_dropout_prob == config.model.attention_probs_dropout_prob == 0:
        dropout = FINETUNING_DROPOUT if task.text_pair_column is None else PAIR_DROPOUT
    if dropout is not None:
        config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = dropout
    config.data.corpus, config.data.valid = [task.train], task.valid
    if task.reinit_pooler and config.model.objective == "clm":
        raise BertforgeError(f"{task.model} is a GPT, which has no pooler; drop task.reinit_pooler")
    if is_tagging(task):
        check_tagging_task(task, config)
    check_max_length(config, task)
    if not (resume or task.from_scratch):  # a run from scratch trains every position from its draw
        trained = encoder_trained_length(task.model, pretrained)
        warn_untrained_positions(task.model, trained, config.data.max_seq_length)
    validate(config)  # before set_epochs divides by the batch size
    data = task_data(task, tokenizer, config.data.max_seq_length)
    check_best_by(task, data.kind)
    hashes = {
        "train": file_sha256(task.train),
        "valid": file_sha256(task.valid),
        ENCODER_KEY: tensors_sha256(encoder),
    }
    saved = read_json(out / TASK) if resume else None  # what the run was started (or grown) with
    if saved is not None:
        refuse_changed_task_data(out, saved, hashes)
    set_epochs(config, task.epochs, len(data.train_set))
    apply_threads(config.runtime)
    choice = resolve_precision(config, resolve_device(config.runtime.device), default_cache_dir())
    if choice is not None and show_progress:
        print(choice.describe(), flush=True)

    if saved is None or saved.get("task") != asdict(task):  # grown: `with_more_seeds`, `glue.grown`
        payload = {"task": asdict(task), "config": config.to_dict(), "data_sha256": hashes}
        write_json(out / TASK, payload)
    return Job(task, config, tokenizer, data, encoder, show_progress)


@contextlib.contextmanager
def removed_unless_progress(
    out: Path, created: bool, run_dirs: list[Path], jobs: int | None = None
) -> Iterator[None]:
    """On failure, remove `out` if this call created it and no run in it finished or reached a
    checkpoint: leave no half-made run behind, but everything `--resume` can continue. A run that a
    signal stopped learns the command that continues it, with the `jobs` given (`jobs_flag`); a
    second signal, or one outside the loop, is told it too."""
    try:
        yield
    except BaseException as error:
        if created and not any(list_checkpoints(d) or (d / RESULT).is_file() for d in run_dirs):
            remove_folder(out)  # a stop before any checkpoint: run the command again
            raise
        command = (
            f"bertforge finetune --out {shlex.quote(str(out))} --resume{jobs_flag(jobs)}"
            f"{reporting.continue_flag()}"
        )
        if isinstance(error, Interrupted):
            error.resume_command = command
        elif isinstance(error, KeyboardInterrupt):
            raise StoppedEarly(signal_of(error), "", f"continue with: {command}") from None
        raise
    finally:
        lock = _owned.pop(Path(out).resolve(), None)
        if lock is not None:
            lock.release()


def warn_untrained_positions(model: str, trained: int, length: int) -> None:
    """Say so when fine-tuning reads positions that pretraining never reached (their weights are as drawn)."""
    if length > trained:
        warnings.warn(
            f"{model} was pretrained on sequences of up to {trained} tokens: fine-tuning at {length} "
            f"starts positions {trained}-{length - 1} from untrained weights (a max length of {trained} "
            "keeps to the trained ones)",
            stacklevel=2,
        )


def read_saved_task(out: Path) -> tuple[FinetuneTask, RunConfig]:
    """The task and base config saved by the run in `out` (for `--resume`)."""
    check_finetuning_folder(Path(out), resume=True)
    raw = read_json(Path(out) / TASK)
    try:
        return FinetuneTask(**raw["task"]), RunConfig.from_dict(raw["config"])
    except (KeyError, TypeError) as error:
        raise BertforgeError(f"{Path(out) / TASK} is damaged ({error}); start the run again") from None


def with_more_seeds(task: FinetuneTask, seeds: list[int]) -> FinetuneTask:
    """`task` (a saved run's) with `seeds`, which must keep all of its seeds: `--resume --seeds` adds
    seeds to a finished or interrupted run, and its finished seeds are not run again."""
    if task.seeds is None:
        raise BertforgeError("this run was started without --seeds; start a new run with --seeds")
    missing = [seed for seed in task.seeds if seed not in seeds]
    if missing:
        saved = ",".join(map(str, task.seeds))
        raise BertforgeError(
            f"--seeds with --resume adds seeds to the run, which has {saved}; give them all and the new "
            f"ones, e.g. --seeds {saved},{max(task.seeds) + 1}"
        )
    return replace(task, seeds=list(seeds))


def check_finetuning_folder(out: Path, resume: bool) -> None:
    """Refuse `out` for this run: resuming needs the run's finetune.json there, a new run an empty folder."""
    refuse_other_kind(out, "fine-tuning run", f"; to fine-tune it, give it as --model {out}", resume)
    check_run_folder(out, resume, TASK, "fine-tuning run")


def check_task(task: FinetuneTask) -> None:
    if distributed.launched().distributed:
        raise BertforgeError("bertforge finetune runs in one process; start it without torchrun")
    if task.epochs < 1:
        raise BertforgeError(f"task.epochs must be at least 1, got {task.epochs}")
    if task.format not in FORMATS:
        raise BertforgeError(f"task.format {task.format!r} is not one of: {', '.join(FORMATS)}")
    if task.task_type not in TASK_KINDS:
        raise BertforgeError(f"task.task_type {task.task_type!r} is not one of: {', '.join(TASK_KINDS)}")
    if task.seeds is not None and (not task.seeds or len(set(task.seeds)) < len(task.seeds)):
        raise BertforgeError(f"task.seeds must list distinct seeds, e.g. [1, 2, 3]; got {task.seeds}")
    if task.compare_scratch and task.from_scratch:
        raise BertforgeError(
            "task.compare_scratch trains the from-scratch arm itself; drop task.from_scratch"
        )
    if task.reinit_pooler and task.from_scratch:
        raise BertforgeError(
            "task.from_scratch has no pretrained pooler to leave out; drop task.reinit_pooler"
        )
    if task.dropout is not None and not 0.0 <= task.dropout < 1.0:
        raise BertforgeError(f"task.dropout must be in [0, 1), got {task.dropout}")
    if task.both_orders and task.text_pair_column is None:
        raise BertforgeError(
            "task.both_orders swaps the two texts of each pair; name the second one's column with "
            "task.text_pair_column, or drop task.both_orders"
        )
    check_paired_seeds(task.compare_scratch, task.seeds)


def check_paired_seeds(compare_scratch: bool, seeds: list[int] | None) -> None:
    """A comparison with random weights pairs the arms seed by seed: it needs two seeds at least."""
    if compare_scratch and len(seeds or []) < 2:
        raise BertforgeError(
            "task.compare_scratch pairs the arms seed by seed and needs task.seeds with at least 2 seeds "
            "(5 or more for any claim)"
        )


def check_best_by(task: FinetuneTask, kind: str) -> None:
    if task.best_by is not None and task.best_by not in BEST_BY[kind]:
        raise BertforgeError(
            f"task.best_by {task.best_by!r} does not score a {kind}; use one of: " + ", ".join(BEST_BY[kind])
        )


def check_max_length(config: RunConfig, task: FinetuneTask) -> None:
    length, positions = config.data.max_seq_length, config.model.max_position_embeddings
    least = 3 if task.text_pair_column else 2  # [CLS] a [SEP] (b [SEP]) with room for the texts
    if not least < length <= positions:
        raise BertforgeError(
            f"data.max_seq_length must be between {least + 1} and the model's max_position_embeddings "
            f"({positions}), got {length}"
        )


def refuse_changed_task_data(out: Path, saved: dict, hashes: dict[str, str]) -> None:
    """Refuse to resume the run in `out` (its finetune.json is `saved`) on other data, or another
    pretrained encoder, than it started on (runs saved without the encoder's hash: the data alone)."""
    saved_hashes = saved.get("data_sha256", {})
    if ENCODER_KEY not in saved_hashes:
        hashes = {name: value for name, value in hashes.items() if name != ENCODER_KEY}
    refuse_changed_data(
        saved_hashes, hashes, out, "resume only with the same model and data, or start a new run"
    )


def is_tagging(task: FinetuneTask) -> bool:
    """Whether `task` tags words (`task_type = "ner"`, or "auto" and a training file that looks tagged)."""
    detected = task.task_type == "auto" and is_tagged_file(task.train, task.text_column, task.label_column)
    return task.task_type == TAGGING or detected


def check_tagging_task(task: FinetuneTask, config: RunConfig) -> None:
    """Refuse what a tagged task cannot have: a GPT, a pooler to leave out, a second text, a format."""
    check_taggable(config.model)
    for given, setting, why in (
        (task.reinit_pooler, "task.reinit_pooler", "a tagger has no pooler"),
        (task.text_pair_column, "task.text_pair_column", "a tagger reads one sentence at a time"),
        (task.format != "auto", "task.format", "its format (CoNLL or JSON lines) is read from the file"),
    ):
        if given:
            raise BertforgeError(f"{task.train} is a tagged file (a tag per word): {why}; drop {setting}")


@dataclass
class EncodedTask:
    """A task's labels and both files encoded for the model: what the runs of every seed share."""

    kind: str  # "classification", "regression" or "ner"
    labels: list[str]  # names in id order (a regression: its score's one name; tagging: the tags)
    train_set: list[dict]
    valid_set: list[dict]
    # each validation example's label id or score; tagging: each sentence's tag ids, word by word
    valid_truth: list


def task_data(task: FinetuneTask, tokenizer: BertTokenizer, length: int) -> EncodedTask:
    """Both files read, checked and encoded in sequences of at most `length` tokens."""
    if is_tagging(task):
        columns = (task.text_column, task.label_column)
        train_data, valid_data, tags = read_tagged_task(task.train, task.valid, *columns)
        train_set = encode_tagged(tokenizer, train_data, tags, length)
        valid_set = encode_tagged(tokenizer, valid_data, tags, length)
        return EncodedTask(TAGGING, tags, train_set.examples, valid_set.examples, valid_set.tags)
    train_data, valid_data, labels, regression = read_task_data(task)
    if task.both_orders:
        train_data = in_both_orders(train_data)
    train_set = encode(tokenizer, train_data, targets(train_data, labels, regression), length)
    valid_set = encode(tokenizer, valid_data, targets(valid_data, labels, regression), length)
    kind = "regression" if regression else "classification"
    return EncodedTask(kind, labels, train_set, valid_set, [example["label"] for example in valid_set])


def read_task_data(task: FinetuneTask) -> tuple[LabeledExamples, LabeledExamples, list[str], bool]:
    """Both files, read and checked, the label mapping learned from the training file (for a
    regression the one name of its score: the label column's, or "score" for a column given by
    number) and whether it is a regression."""
    if task.text_column is None or task.label_column is None:
        raise BertforgeError(
            "task.text_column and task.label_column must name the text and label columns of the files "
            "(only a tagged file's have defaults)"
        )
    columns = dict(
        text_column=task.text_column,
        label_column=task.label_column,
        text_pair_column=task.text_pair_column,
        format=task.format,
    )
    train_data = read_labeled(task.train, **columns)
    valid_data = read_labeled(task.valid, **columns)
    if task_type(train_data, task.task_type) == "regression":
        check_regression_targets(train_data, label_values(train_data))
        name = "score" if task.label_column.isdigit() else task.label_column
        return train_data, valid_data, [name], True
    return train_data, valid_data, label_names(train_data), False


def targets(data: LabeledExamples, labels: list[str], regression: bool) -> list[int] | list[float]:
    """Each example's label id under `labels`, or for a regression its score."""
    return label_values(data) if regression else label_ids(data, labels)


def encode(
    tokenizer: BertTokenizer, data: LabeledExamples, ids: list[int] | list[float], max_length: int
) -> list[dict]:
    """`[CLS] text [SEP]` or `[CLS] text [SEP] pair [SEP]` (segment ids 0, then 1), at most `max_length`,
    with its label id (a regression: its score)."""
    encoded = tokenizer.encode_pairs(data.texts, data.pairs, max_length)
    return [
        {"input_ids": input_ids, "token_type_ids": token_type_ids, "label": label}
        for (input_ids, token_type_ids), label in zip(encoded, ids, strict=True)
    ]


EPOCH_SETTINGS = ("train.max_steps", "train.max_minutes", "train.eval_every", "train.checkpoint_every")


def set_epochs(config: RunConfig, epochs: int, num_examples: int) -> None:
    """Express epochs in the loop's terms (the `EPOCH_SETTINGS`): evaluate and checkpoint every
    `steps_per_epoch` steps, stop after the last epoch."""
    train_cfg = config.train
    steps = steps_per_epoch(num_examples, train_cfg)
    if steps == 0:
        raise BertforgeError(
            f"the training file has {num_examples} examples, fewer than one batch of {train_cfg.batch_size}; "
            "lower train.batch_size"
        )
    train_cfg.eval_every = steps
    train_cfg.checkpoint_every = 0  # every evaluation
    train_cfg.max_steps = epochs * steps
    train_cfg.max_minutes = 0.0  # whole epochs, not a time budget


def steps_per_epoch(num_examples: int, train_cfg: TrainConfig) -> int:
    """A last, smaller batch is kept; with gradient accumulation a partial last step is dropped instead,
    so that every epoch ends exactly on an optimizer step."""
    if train_cfg.gradient_accumulation_steps == 1:
        return math.ceil(num_examples / train_cfg.batch_size)
    return num_examples // train_cfg.batch_size


class ClassificationCollator:
    """Pads examples into a batch with their `labels` (B,) (label ids, or a regression's float scores;
    a tagger's examples: (B, T), a tag id per token, padded with NO_LABEL), shaped by `shape_batch`
    (to `width` tokens when compiling)."""

    def __init__(self, pad_id: int, width: int | None = None) -> None:
        self.pad_id = pad_id
        self.width = width

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        batch = pad_batch(examples, self.pad_id)
        labels = [example["label"] for example in examples]
        if not isinstance(labels[0], list):
            batch["labels"] = torch.tensor(labels)  # (B,)
            return shape_batch(batch, self.pad_id, self.width)
        width = batch["input_ids"].shape[1]
        batch["labels"] = torch.tensor([row + [NO_LABEL] * (width - len(row)) for row in labels])  # (B, T)
        shaped = shape_batch(batch, self.pad_id, self.width)
        shaped["labels"] = F.pad(batch["labels"], (0, shaped["input_ids"].shape[1] - width), value=NO_LABEL)
        return shaped


class ShuffledEpochs:
    """epoch -> micro-batches of the training examples in an order drawn from (seed, epoch), with
    `train.group_by_length` grouped into batches of similar length (`length_grouped`)."""

    def __init__(self, examples: list[dict], config: RunConfig, pad_id: int) -> None:
        train_cfg = config.train
        self.examples = examples
        self.seed = config.runtime.seed
        self.batch_size = train_cfg.batch_size
        self.micro_batch = distributed.batch_plan(train_cfg).micro_batch
        self.per_epoch = steps_per_epoch(len(examples), train_cfg) * train_cfg.batch_size
        self.lengths = (
            np.array([len(example["input_ids"]) for example in examples])
            if train_cfg.group_by_length
            else None
        )
        # Compiled: one sequence length (the epoch's short last batch runs eagerly: `compiling.for_batch`).
        width = config.data.max_seq_length if config.runtime.compile else None
        self.collate = ClassificationCollator(pad_id, width)

    def __call__(self, epoch: int) -> Batches:
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.examples))[: self.per_epoch]
        if self.lengths is not None:
            order = length_grouped(order, self.lengths, self.batch_size, rng)
        shuffled = [self.examples[i] for i in order]
        return Batches(shuffled, self.micro_batch, self.collate, drop_last=False)


def length_grouped(
    order: np.ndarray, lengths: np.ndarray, batch_size: int, rng: np.random.Generator, window: int = 50
) -> np.ndarray:
    """`order` rearranged so that each run of `batch_size` examples has similar lengths.

    As Hugging Face's `group_by_length`: the shuffled order is cut into windows of `window` batches,
    each window sorted by length and cut into batches, and the batches shuffled, so a batch is still
    a random draw of the epoch, only of one length. A short last batch stays last (where a step
    counts on it). On SST-2 this cuts the padded tokens per batch from 3.0x the real ones to 1.04x.
    """
    batches = []
    for start in range(0, len(order), window * batch_size):
        chunk = order[start : start + window * batch_size]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    short = [batch for batch in batches if len(batch) < batch_size]
    full = [batch for batch in batches if len(batch) == batch_size]
    return np.concatenate([full[i] for i in rng.permutation(len(full))] + short)


def classification_loss(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    logits = model(
        batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch.get("attention_mask")
    ).float()  # (B, K)
    labels = batch["labels"]  # (B,)
    loss_sum = F.cross_entropy(logits, labels, reduction="sum")
    sums = {
        "loss_sum": loss_sum.detach(),
        "correct": (logits.argmax(-1) == labels).sum(),
        "count": torch.full((), labels.numel(), device=labels.device),  # filled there: no host copy
    }
    return loss_sum / labels.numel(), sums


def regression_loss(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The mean squared error of the one output (Hugging Face's `problem_type = "regression"`)."""
    scores = model(
        batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch.get("attention_mask")
    ).float()[:, 0]  # (B,)
    labels = batch["labels"].float()  # (B,)
    loss_sum = F.mse_loss(scores, labels, reduction="sum")
    sums = {"loss_sum": loss_sum.detach(), "count": torch.full((), labels.numel(), device=labels.device)}
    return loss_sum / labels.numel(), sums


def summarize_regression(totals: dict[str, float]) -> Summary:
    """Accumulated `regression_loss` sums -> the mean squared error."""
    loss = totals["loss_sum"] / max(totals["count"], 1.0)
    return Summary(loss, {"mse": loss})


def summarize_classification(totals: dict[str, float]) -> Summary:
    """Accumulated `classification_loss` sums -> the mean cross-entropy, and it with the accuracy."""
    count = max(totals["count"], 1.0)
    loss = totals["loss_sum"] / count
    return Summary(loss, {"classification_loss": loss, "accuracy": totals["correct"] / count})


# The loss of a micro-batch and the summary of its sums, by task type.
OBJECTIVES = {
    "classification": (classification_loss, summarize_classification),
    "regression": (regression_loss, summarize_regression),
    TAGGING: (tagging_loss, summarize_tagging),
}


@torch.inference_mode()
def evaluate_classifier(
    model: torch.nn.Module, batches: list[dict], num_labels: int, precision: str = "fp32"
) -> tuple[dict[str, float], list[list[int]], list[int]]:
    """Loss, accuracy and macro F1 over all batches, the confusion matrix (rows: true, columns:
    predicted) and the predicted label id of every example, in order."""
    device = next(model.parameters()).device
    confusion = torch.zeros(num_labels * num_labels, dtype=torch.long, device=device)
    loss_sum = torch.zeros((), device=device)
    predictions = []
    for logits, labels in outputs_and_labels(model, batches, precision):  # (B, K), (B,)
        loss_sum += F.cross_entropy(logits, labels, reduction="sum")
        predicted = logits.argmax(-1)  # (B,)
        # index_add_ rather than bincount, which waits for the GPU to size its output.
        confusion.index_add_(0, labels * num_labels + predicted, torch.ones_like(labels))
        predictions.append(predicted)
    matrix = confusion.view(num_labels, num_labels).cpu()
    metrics = {"classification_loss": float(loss_sum) / max(int(matrix.sum()), 1), **scores(matrix)}
    return metrics, matrix.tolist(), torch.cat(predictions).tolist() if predictions else []


def outputs_and_labels(
    model: torch.nn.Module, batches: list[dict], precision: str
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The model's float32 outputs on each batch, in eval mode and under `precision`, with its labels."""
    device = next(model.parameters()).device
    with eval_mode(model):
        for batch in batches:
            batch = to_device(batch, device)
            with autocast(device, precision):
                output = model(
                    batch["input_ids"],
                    token_type_ids=batch["token_type_ids"],
                    attention_mask=batch.get("attention_mask"),
                )
            yield output.float(), batch["labels"]


def scores(confusion: torch.Tensor) -> dict[str, float]:
    """Accuracy, macro F1 and Matthews correlation from a confusion matrix (see `bertforge.metrics`)."""
    matrix = confusion.cpu().numpy()
    return {
        "accuracy": confusion_accuracy(matrix),
        "macro_f1": confusion_macro_f1(matrix),
        "matthews": confusion_matthews(matrix),
    }


@torch.inference_mode()
def evaluate_regressor(
    model: torch.nn.Module, batches: list[dict], precision: str = "fp32"
) -> tuple[dict[str, float], list[float]]:
    """Mean squared error, Pearson's and Spearman's correlation over all batches, and the predicted
    score of every example, in order."""
    predicted, true = [], []
    for output, labels in outputs_and_labels(model, batches, precision):  # (B, 1), (B,)
        predicted.append(output[:, 0])
        true.append(labels.float())
    if not predicted:
        return {"mse": 0.0, "pearson": 0.0, "spearman": 0.0}, []
    outputs, labels = torch.cat(predicted).cpu().double(), torch.cat(true).cpu().double()
    metrics = {
        "mse": float(((outputs - labels) ** 2).mean()),
        "pearson": pearson(outputs.numpy(), labels.numpy()),
        "spearman": spearman(outputs.numpy(), labels.numpy()),
    }
    return metrics, outputs.tolist()


def seed_runs(task: FinetuneTask, config: RunConfig, out: Path) -> list[tuple[int, Path]]:
    if task.seeds is None:
        return [(config.runtime.seed, out)]
    return [(seed, out / f"seed_{seed}") for seed in task.seeds]


# ------------------------------------------------------------------------ several runs at once


@dataclass
class SeedRun:
    """One run of a fine-tuning folder: its seed, its folder, whether it starts from random weights,
    and how the progress names it."""

    seed: int
    run_dir: Path
    from_scratch: bool
    label: str


def run_seeds(
    job: Job, runs: list[SeedRun], config: RunConfig, out: Path, jobs: int | None
) -> tuple[list, dict]:
    """Each run's result, and how many ran at once with how many threads each (`jobs`, `threads_per_run`)
    and how many this call trained (`runs_trained`: 0 when every run had finished before).

    One after another in this process; with `jobs` above 1 (None: `worker_pool.auto_jobs`), the
    unfinished runs `jobs` at a time in `worker_pool`'s processes, each with a share of the threads
    (one small model's step leaves a CPU's threads half idle), while this process shows one progress
    over them all and drops theirs. `config` is the folder's base config, as `start` was given it.
    """
    threads = config.runtime.threads or torch.get_num_threads()
    jobs = auto_jobs(config.runtime.device) if jobs is None else jobs
    pending = [index for index, run in enumerate(runs) if not (run.run_dir / RESULT).is_file()]
    share = share_threads(jobs, threads, len(runs), len(pending))
    if share.jobs == 1:
        results = [job.run(run.seed, run.run_dir, run.from_scratch) for run in runs]
        return results, {"jobs": 1, "threads_per_run": threads, "runs_trained": len(pending)}
    runtime = worker_runtime(config.runtime, job.config.runtime.precision, share.threads)
    order = (job.task, replace(config, runtime=runtime), out, reporting.reported_roots())
    steps = job.steps_per_epoch * job.task.epochs
    done = [index not in pending for index in range(len(runs))]
    work = {run.label: steps for run in runs}
    progress = RunsProgress("finetune", work, done, job.show_progress, at_once=share.workers)

    def began(k: int) -> None:
        progress.start(runs[pending[k]].label)

    def finished(k: int, result: dict) -> None:
        metric = METRICS[result_kind(result)][0]
        label = runs[pending[k]].label
        progress.advance(label, label, False, f"{metric} {result['best'][metric]:.4f}")

    arguments = [
        (*order, runs[index].seed, runs[index].run_dir, runs[index].from_scratch) for index in pending
    ]
    try:
        with WorkerPool(share.workers, share.threads) as pool:
            values = pool.map(run_in_worker, arguments, finished, began, progress.tick) if arguments else []
    finally:
        progress.close()
    results = dict(zip(pending, values, strict=True))
    for index, run in enumerate(runs):
        if index not in results:
            results[index] = job.run(run.seed, run.run_dir, run.from_scratch)  # finished before: read
    ordered = [results[index] for index in range(len(runs))]
    at_once = {"jobs": share.workers, "threads_per_run": share.threads}  # this invocation's
    return ordered, {**at_once, "runs_trained": len(pending)}


_worker_jobs: dict[Path, Job] = {}  # a worker's opened fine-tuning folders


def run_in_worker(
    task: FinetuneTask,
    config: RunConfig,
    out: Path,
    reported: list[Path],
    seed: int,
    run_dir: Path,
    from_scratch: bool,
) -> dict:
    """`Job.run` in a worker process; its metrics go to the parent's TensorBoard folders too, its
    lines nowhere."""
    job = worker_job(task, config, out)
    with contextlib.ExitStack() as stack:
        for root in reported:
            stack.enter_context(reporting.reporting_to(root, "tensorboard"))
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))  # the loop's per-epoch lines
        return job.run(seed, run_dir, from_scratch)


def worker_job(task: FinetuneTask, config: RunConfig, out: Path) -> Job:
    """The `Job` of folder `out` in a worker process, which opens each folder once (the parent made it
    and owns it, and has shown the data's warnings: they are not repeated)."""
    if out not in _worker_jobs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _worker_jobs[out] = prepare(task, config, out, resume=True, show_progress=False)
    return _worker_jobs[out]


# ---------------------------------------------------------------------------------- one run


class Job:
    """Everything the runs of one fine-tuning share; `run` trains one seed in its folder. A regression
    is a job with one label (the name of its score)."""

    def __init__(
        self,
        task: FinetuneTask,
        config: RunConfig,
        tokenizer: BertTokenizer,
        data: EncodedTask,
        encoder: dict[str, torch.Tensor],
        show_progress: bool,
    ) -> None:
        self.task, self.config, self.tokenizer, self.labels = task, config, tokenizer, data.labels
        self.train_set, self.encoder, self.show_progress = data.train_set, encoder, show_progress
        self.kind = data.kind
        self.best_by = task.best_by or METRICS[self.kind][0]
        self.steps_per_epoch = steps_per_epoch(len(data.train_set), config.train)
        self.valid_labels = data.valid_truth
        # Evaluated from the shortest example to the longest (SST-2's dev set: 27,264 positions against
        # 51,136 in file order, at 8,192 pieces); predictions go back to file order (`in_input_order`).
        self.valid_order = length_order(data.valid_set)
        by_length = [data.valid_set[i] for i in self.valid_order]
        collate = ClassificationCollator(tokenizer.pad_id)
        batches = Batches(by_length, EVAL_BATCH_SIZE, collate, drop_last=False)
        self.valid_batches = [batches[i] for i in range(len(batches))]

    def run(self, seed: int, run_dir: Path, from_scratch: bool) -> dict:
        """Train `seed` in `run_dir` (from random weights if `from_scratch`); its result."""
        if (run_dir / RESULT).is_file():
            return read_json(run_dir / RESULT)  # finished before an interruption
        config = replace(self.config, runtime=replace(self.config.runtime, seed=seed))
        checkpoints = list_checkpoints(run_dir)
        if not checkpoints:
            clear_run(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        save_json(config, run_dir / CONFIG)
        pretrained = None if checkpoints or from_scratch else self.encoder
        model = build_classifier(
            config,
            len(self.labels),
            pretrained,
            source=self.task.model,
            reinit_pooler=self.task.reinit_pooler,
            tagger=self.kind == TAGGING,
        )
        if self.kind == "regression":
            start_at_mean_score(model, self.train_set)
        loss, summarize = OBJECTIVES[self.kind]
        evaluator = EpochEvaluator(self, config, run_dir)
        objective = Objective(
            model=model,
            batches=ShuffledEpochs(self.train_set, config, self.tokenizer.pad_id),
            loss=loss,
            evaluate=evaluator,
            summarize=summarize,
            restored=evaluator.restored,
        )
        last = train(objective, config, run_dir, resume=bool(checkpoints), show_progress=self.show_progress)
        return self.finish(seed, run_dir, last)

    def finish(self, seed: int, run_dir: Path, last: dict) -> dict:
        """Make the best epoch the run's model, plot its curves, record the result, drop the
        checkpoints."""
        if (run_dir / "best").is_dir():
            replace_folder(run_dir / "best", run_dir / "final")
        plot_finetuning(run_dir / "metrics.jsonl", run_dir / "curves.png", self.steps_per_epoch, self.kind)
        best = read_json(run_dir / BEST)
        self.save_predictions(run_dir, best)
        keys = list(dict.fromkeys((*METRICS[self.kind], self.best_by)))
        result = {
            "seed": seed,
            "epochs": self.task.epochs,
            "steps": last["step"],
            "elapsed_s": last["elapsed_s"],
            "best_epoch": best.pop("epoch"),
            "best_by": self.best_by,
            "best": {key: best[key] for key in keys},
            "last": {key: last[key] for key in keys},
            "labels": self.labels,
        }
        if self.kind == "classification":
            result["confusion"] = best["confusion"]
        else:
            result["task_type"] = self.kind
        if self.kind == TAGGING:
            result["per_type"] = best["per_type"]
        write_json(run_dir / RESULT, result)
        if (run_dir / "checkpoints").is_dir():
            remove_folder(run_dir / "checkpoints")
        return result

    def save_predictions(self, run_dir: Path, best: dict) -> None:
        """The best epoch's predicted and true label ids (a regression: scores; a tagger: per sentence
        its words' tag ids) for the validation set, as lists in file order, with the label names
        (absent for a run begun before predictions were kept)."""
        if "predictions" not in best:
            return
        record = {
            "epoch": best["epoch"],
            "labels": self.labels,
            "true": self.valid_labels,
            "predicted": best["predictions"],
        }
        write_json(run_dir / PREDICTIONS, record, indent=None)


def build_classifier(
    config: RunConfig,
    num_labels: int,
    encoder: dict[str, torch.Tensor] | None,
    source: str = "the encoder",
    reinit_pooler: bool = False,
    tagger: bool = False,
) -> torch.nn.Module:
    """A classifier drawn from `runtime.seed` (BERT's, or a GPT's for `model.objective = "clm"`; with
    `tagger`, BERT's token classifier), its encoder replaced by `encoder` when given (but for BERT's
    pooler with `reinit_pooler` or where the encoder has none, a tagger's; a token classifier has no
    pooler, and leaves the encoder's out).

    The same seed gives the same head whether or not the encoder is replaced, so a pretrained run
    and its `--from-scratch` baseline differ only in the encoder.
    """
    torch.manual_seed(config.runtime.seed)
    model = (token_classifier if tagger else sequence_classifier)(config.model, num_labels)
    if encoder is not None:
        body = getattr(model, ENCODER[config.model.objective])
        drawn = (
            {name: t.clone() for name, t in body.pooler.state_dict().items()}
            if hasattr(body, "pooler")
            else {}
        )
        if tagger:
            encoder = {name: tensor for name, tensor in encoder.items() if not name.startswith("pooler.")}
        elif drawn and not any(name.startswith("pooler.") for name in encoder):
            encoder = encoder | {f"pooler.{name}": t for name, t in drawn.items()}  # a tagger's encoder: none
        check_and_load_state(body, encoder, source=source)
        if reinit_pooler:
            body.pooler.load_state_dict(drawn)
    return model


def start_at_mean_score(model: torch.nn.Module, train_set: list[dict]) -> None:
    """Set a BERT regressor's output bias to the training scores' mean, so that it starts from the
    mean score instead of 0 (GPT's head has no bias, as Hugging Face's). On STS-B, 3 of 10 runs from a
    bias of 0 stayed near random weights' level; from the mean, none of 10 did (docs/records/glue.md)."""
    head = getattr(model, "classifier", None)
    if head is not None and head.bias is not None:
        with torch.no_grad():
            head.bias.fill_(sum(example["label"] for example in train_set) / len(train_set))


def clear_run(run_dir: Path) -> None:
    """Remove what a run that never reached its first checkpoint wrote (it starts again)."""
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir():
            remove_folder(path)
        elif path.exists():
            path.unlink()


class EpochEvaluator:
    """The objective's `evaluate`: validation metrics at the end of each epoch (epoch 0: before any
    step), a classification's confusion matrix as a "confusion" line of metrics.jsonl (a tagger's
    scores per entity type as an "entities" line), and the best epoch so far saved to `best/`
    (highest accuracy, for a regression highest Pearson's r, for a tagger highest entity F1, then
    lowest loss), so that it survives an interruption; its metrics, confusion matrix (scores per
    type) and per-example predictions go to `best.json` in one write."""

    def __init__(self, job: Job, config: RunConfig, run_dir: Path) -> None:
        self.job, self.config, self.run_dir = job, config, run_dir
        self.epoch = 0  # a resumed run's: `restored`
        self.best = read_json(run_dir / BEST) if (run_dir / BEST).is_file() else None

    def restored(self, step: int) -> None:
        """A resumed run restored `step` (an epoch's end, from the newest intact checkpoint): the next
        evaluation is the next epoch's."""
        self.epoch = step // self.job.steps_per_epoch + 1

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        labels = self.job.labels
        epoch, self.epoch = self.epoch, self.epoch + 1
        metrics, extra, predictions = self.measure(model)
        for key, value in extra.items():  # a confusion matrix, or the scores per entity type
            split, name = LOGGED[key]
            MetricsLog(self.run_dir / "metrics.jsonl").append(
                {
                    "step": epoch * self.job.steps_per_epoch,
                    "split": split,
                    "epoch": epoch,
                    "labels": labels,
                    name: value,
                }
            )
        if epoch >= 1 and self.improves(metrics):
            job = self.job
            task = TOKEN_TASK if job.kind == TAGGING else None
            pairs = None if task else job.task.text_pair_column is not None
            save_classifier(self.run_dir / "best", model, job.tokenizer, self.config, labels, task, pairs)
            self.best = {"epoch": epoch, **metrics, **extra, "predictions": predictions}
            write_json(self.run_dir / BEST, self.best, indent=None)
        return {"epoch": epoch, **metrics}

    def measure(self, model: torch.nn.Module) -> tuple[dict[str, float], dict, list]:
        """The validation metrics, what the task keeps beside them (a classification's confusion
        matrix, a tagger's scores per entity type) and the predictions."""
        job, precision = self.job, self.config.runtime.precision
        if job.kind == "regression":
            metrics, predictions = evaluate_regressor(model, job.valid_batches, precision)
            return metrics, {}, in_input_order(predictions, job.valid_order)
        if job.kind == TAGGING:
            outputs = outputs_and_labels(model, job.valid_batches, precision)
            metrics, per_type, predictions = score_tagging(
                outputs, job.valid_order, job.valid_labels, job.labels
            )
            return metrics, {"per_type": per_type}, predictions
        count = len(job.labels)
        metrics, confusion, predictions = evaluate_classifier(model, job.valid_batches, count, precision)
        return metrics, {"confusion": confusion}, in_input_order(predictions, job.valid_order)

    def improves(self, metrics: dict[str, float]) -> bool:
        if self.best is None:
            return True
        loss = METRICS[self.job.kind][-1]
        primary = self.job.best_by
        return (metrics[primary], -metrics[loss]) > (self.best[primary], -self.best[loss])


def result_kind(result: dict) -> str:
    """What a run's result.json measured: "classification", "regression" or "ner"."""
    return result.get("task_type", "classification")


def summarize_seeds(results: list[dict]) -> dict:
    """Median, range and spread (max - min) over seeds of the best epoch's accuracy and macro F1 (a
    regression: Pearson's and Spearman's correlation; a tagger: entity F1 and precision), and of the
    last epoch's accuracy (Pearson's r, entity F1)."""
    primary, secondary = METRICS[result_kind(results[0])][:2]
    return {
        "seeds": [r["seed"] for r in results],
        primary: spread([r["best"][primary] for r in results]),
        secondary: spread([r["best"][secondary] for r in results]),
        f"last_epoch_{primary}": spread([r["last"][primary] for r in results]),
        "elapsed_s": sum(r["elapsed_s"] for r in results),
        "runs": results,
    }
