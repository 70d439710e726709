"""GLUE's scoring: each task's figures, its score, the average, a paired bootstrap of a task's score,
the majority label (a constant at chance), and the published figures of Google's small BERTs.

A task's figures, in percent as GLUE reports them (correlations x 100): accuracy for SST-2, QNLI,
RTE and WNLI, and for MNLI on the matched and mismatched dev sets (`acc_m`, `acc_mm`); F1 of the
positive class and accuracy for MRPC and QQP; Pearson and Spearman for STS-B; Matthews
correlation for CoLA. A task's score is the mean of its figures; the GLUE average is the mean of
the tasks' scores (so MNLI counts once, as the mean of matched and mismatched, as on GLUE's
leaderboard: the model card's "Score" column is that mean over the nine tasks).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence

import numpy as np

from bertforge import metrics
from bertforge.stats import bootstrap_gains, bootstrap_verdict

# task -> (figure, which of the task's dev or test files: 0 the first, 1 MNLI's mismatched, metric)
FIGURES: dict[str, tuple[tuple[str, int, str], ...]] = {
    "CoLA": (("mcc", 0, "matthews"),),
    "SST-2": (("acc", 0, "accuracy"),),
    "MRPC": (("f1", 0, "f1"), ("acc", 0, "accuracy")),
    "STS-B": (("pearson", 0, "pearson"), ("spearman", 0, "spearman")),
    "QQP": (("f1", 0, "f1"), ("acc", 0, "accuracy")),
    "MNLI": (("acc_m", 0, "accuracy"), ("acc_mm", 1, "accuracy")),
    "QNLI": (("acc", 0, "accuracy"),),
    "RTE": (("acc", 0, "accuracy"),),
    "WNLI": (("acc", 0, "accuracy"),),
}
# The dev metric that picks a run's best epoch where finetune's default (accuracy; Pearson for a
# regression) is not the task's: a majority-class epoch has CoLA's best accuracy and a Matthews of 0.
BEST_EPOCH_BY = {"CoLA": "matthews"}
POSITIVE = "1"  # the class whose F1 MRPC and QQP report (paraphrase, duplicate)
BOOTSTRAP_CELLS = 2_000_000  # predictions resampled at once (bounds the memory of QQP's 40,000 examples)

PUBLISHED_SOURCE = (
    'Turc et al. 2019, "Well-Read Students Learn Better: On the Importance of Pre-training Compact '
    "Models\" (arXiv:1908.08962), and the BERT miniatures' model card (github.com/google-research/bert): "
    "GLUE test sets; 4 epochs, the best of batch sizes 8-128 and learning rates 3e-4, 1e-4, 5e-5, 3e-5"
)
PUBLISHED: dict[str, dict] = {
    "BERT-Tiny (2/128)": {
        "score": 64.2,
        "tasks": {
            "CoLA": {"mcc": 0.0},
            "SST-2": {"acc": 83.2},
            "MRPC": {"f1": 81.1, "acc": 71.1},
            "STS-B": {"pearson": 74.3, "spearman": 73.6},
            "QQP": {"f1": 62.2, "acc": 83.4},
            "MNLI": {"acc_m": 70.2, "acc_mm": 70.3},
            "QNLI": {"acc": 81.5},
            "RTE": {"acc": 57.2},
            "WNLI": {"acc": 62.3},
        },
    },
    "BERT-Mini (4/256)": {
        "score": 65.8,
        "tasks": {
            "CoLA": {"mcc": 0.0},
            "SST-2": {"acc": 85.9},
            "MRPC": {"f1": 81.1, "acc": 71.8},
            "STS-B": {"pearson": 75.4, "spearman": 73.3},
            "QQP": {"f1": 66.4, "acc": 86.2},
            "MNLI": {"acc_m": 74.8, "acc_mm": 74.3},
            "QNLI": {"acc": 84.1},
            "RTE": {"acc": 57.9},
            "WNLI": {"acc": 62.3},
        },
    },
    "BERT-Small (4/512)": {
        "score": 71.2,
        "tasks": {
            "CoLA": {"mcc": 27.8},
            "SST-2": {"acc": 89.7},
            "MRPC": {"f1": 83.4, "acc": 76.2},
            "STS-B": {"pearson": 78.8, "spearman": 77.0},
            "QQP": {"f1": 68.1, "acc": 87.0},
            "MNLI": {"acc_m": 77.6, "acc_mm": 77.0},
            "QNLI": {"acc": 86.4},
            "RTE": {"acc": 61.8},
            "WNLI": {"acc": 62.3},
        },
    },
}


def split_figures(task: str, which: int, true: Sequence, predicted: Sequence, labels: Sequence[str]) -> dict:
    """The figures of `task` measured on its dev or test file number `which`, in percent: `true` and
    `predicted` are label names (`labels`, the task's classes) or, for STS-B, scores."""
    figures = figures_of(task, which, *as_arrays(true, predicted, labels), labels)
    return {name: float(value) for name, value in figures.items()}


def as_arrays(true: Sequence, predicted: Sequence, labels: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Label names as ids in `labels` (scores, for a regression's empty `labels`, as numbers)."""
    if not labels:
        return np.asarray(true, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
    ids = {label: i for i, label in enumerate(labels)}
    return np.array([ids[t] for t in true]), np.array([ids[p] for p in predicted])


def figures_of(
    task: str, which: int, true: np.ndarray, predicted: np.ndarray, labels: Sequence[str]
) -> dict[str, np.ndarray]:
    """The figures along the last axis of label ids (or scores) `true` and `predicted`, broadcast
    against each other: (examples,) gives one value each, (resamples, examples) against (seeds,
    resamples, examples) a (seeds, resamples) array each."""
    wanted = [(name, metric) for name, index, metric in FIGURES[task] if index == which]
    if not labels:
        values = {"pearson": metrics.pearson_rows, "spearman": metrics.spearman_rows}
        return {name: 100 * values[metric](true, predicted) for name, metric in wanted}
    confusion = metrics.confusion_rows(true, predicted, len(labels))
    return {name: 100 * np.asarray(confusion_metric(metric, confusion, labels)) for name, metric in wanted}


def confusion_metric(metric: str, confusion: np.ndarray, labels: Sequence[str]) -> float | np.ndarray:
    if metric == "accuracy":
        return metrics.confusion_accuracy(confusion)
    if metric == "matthews":
        return metrics.confusion_matthews(confusion)
    positive = list(labels).index(POSITIVE)
    return metrics.confusion_binary_f1(confusion if positive == 1 else confusion[..., ::-1, ::-1])


def task_score(task: str, figures: dict[str, float]) -> float | None:
    """The mean of the task's figures present in `figures` (MNLI without its mismatched file: matched
    alone); None when none is."""
    present = [figures[name] for name, _, _ in FIGURES[task] if name in figures]
    return statistics.fmean(present) if present else None


def majority_label(labels: Sequence[str]) -> str:
    """The most frequent label (of equals, the first in sorted order): the constant that a model at
    chance matches."""
    counts = Counter(labels)
    return min(counts, key=lambda label: (-counts[label], label))


def glue_average(scores: dict[str, float]) -> float:
    """The GLUE average: the mean of the tasks' scores."""
    return statistics.fmean(scores.values())


def paired_bootstrap_score(
    task: str,
    true: Sequence,
    arm_a: Sequence[Sequence],
    arm_b: Sequence[Sequence],
    labels: Sequence[str],
    resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict:
    """The gain of arm a over arm b in the task's score on its first dev file, resampling its examples.

    `arm_a` and `arm_b` hold each seed's predictions (label names, or STS-B's scores), the same seeds
    in the same order; an arm's score on a resample is the mean over its seeds. As
    `bertforge.stats.paired_bootstrap` (which does this for accuracy alone): the p-value is twice
    the share of resamples whose gain has the other sign, capped at 1, and the interval the central
    `confidence` of the resampled gains.
    """
    truth = as_arrays(true, true, labels)[0]
    # each arm's predictions: (seeds, examples)
    runs = [np.stack([as_arrays(true, predicted, labels)[1] for predicted in arm]) for arm in (arm_a, arm_b)]

    def gains(block: np.ndarray) -> np.ndarray:
        """(R, examples) resampled indices -> (R,) gains of a's mean score over its seeds, a few
        resamples at a time (each holds seeds x examples values)."""
        rows = max(1, BOOTSTRAP_CELLS // (max(len(arm) for arm in runs) * truth.size))
        starts = range(0, len(block), rows)
        return np.concatenate([rows_gains(block[first : first + rows]) for first in starts])

    def rows_gains(block: np.ndarray) -> np.ndarray:
        a, b = (first_file_score(task, truth[block], arm[:, block], labels).mean(0) for arm in runs)
        return a - b

    observed = float(gains(np.arange(truth.size)[None])[0])
    resampled = bootstrap_gains(gains, truth.size, resamples, seed)
    return bootstrap_verdict(observed, resampled, int(truth.size), seed, confidence)


def first_file_score(task: str, true: np.ndarray, predicted: np.ndarray, labels: Sequence[str]) -> np.ndarray:
    """The task score on its first dev file, along the last axis as `figures_of`'s."""
    return np.mean(list(figures_of(task, 0, true, predicted, labels).values()), axis=0)
