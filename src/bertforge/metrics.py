"""Evaluation metrics of classifiers and regressors: pure functions on sequences and numpy arrays.

- classification, from the true and predicted label ids or from their confusion matrix (rows: true,
  columns: predicted): `accuracy`, `binary_f1` (the F1 of class 1, GLUE's for MRPC and QQP),
  `macro_f1` (the mean F1 of the classes that occur in the truth or the predictions),
  `matthews_corrcoef` (binary and multi-class, Gorodkin 2004; GLUE's for CoLA);
- regression, from the true and predicted scores: `pearson` and `spearman` (Pearson's r of the
  ranks, tied values given their average rank; GLUE's for STS-B).

Where a metric is undefined (no examples, no positive class, a constant sequence) it is 0, as
scikit-learn returns for the F1 scores and the Matthews correlation; scipy's correlations give NaN
there instead, which a comparison of epochs or a JSON file cannot use.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ArrayLike = Sequence[float] | np.ndarray


def confusion_matrix(true: ArrayLike, predicted: ArrayLike, num_labels: int | None = None) -> np.ndarray:
    """(K, K) counts, rows the true label id and columns the predicted one; K is `num_labels`, or
    one more than the largest id given."""
    true, predicted = _paired(true, predicted, int)
    if num_labels is None:
        num_labels = int(max(true.max(initial=-1), predicted.max(initial=-1))) + 1
    if true.size and (min(true.min(), predicted.min()) < 0 or max(true.max(), predicted.max()) >= num_labels):
        raise ValueError(f"label ids must be in [0, {num_labels})")
    matrix = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(matrix, (true, predicted), 1)
    return matrix


def accuracy(true: ArrayLike, predicted: ArrayLike) -> float:
    return confusion_accuracy(confusion_matrix(true, predicted))


def binary_f1(true: ArrayLike, predicted: ArrayLike) -> float:
    """F1 of the positive class 1 (labels 0 and 1)."""
    return confusion_binary_f1(confusion_matrix(true, predicted, 2))


def macro_f1(true: ArrayLike, predicted: ArrayLike) -> float:
    return confusion_macro_f1(confusion_matrix(true, predicted))


def matthews_corrcoef(true: ArrayLike, predicted: ArrayLike) -> float:
    return confusion_matthews(confusion_matrix(true, predicted))


def confusion_accuracy(matrix: np.ndarray) -> float:
    matrix = np.asarray(matrix, dtype=np.float64)
    return float(np.trace(matrix) / max(matrix.sum(), 1.0))


def confusion_binary_f1(matrix: np.ndarray) -> float:
    """F1 of class 1 of a 2 x 2 confusion matrix: 2 TP / (2 TP + FP + FN)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.shape != (2, 2):
        raise ValueError(f"binary F1 needs a 2 x 2 confusion matrix, got {matrix.shape}")
    true_positives = matrix[1, 1]
    denominator = matrix[1].sum() + matrix[:, 1].sum()
    return float(2 * true_positives / denominator) if denominator > 0 else 0.0


def confusion_macro_f1(matrix: np.ndarray) -> float:
    """The F1 averaged over the classes present in the truth or the predictions (scikit-learn's)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    actual, predicted = matrix.sum(1), matrix.sum(0)
    present = (actual + predicted) > 0
    if not present.any():
        return 0.0
    return float((2 * matrix.diagonal()[present] / (actual + predicted)[present]).mean())


def confusion_matthews(matrix: np.ndarray) -> float:
    """The Matthews correlation of a K x K confusion matrix (K = 2 gives the binary formula):
    (c s - t.p) / sqrt((s^2 - p.p)(s^2 - t.t)), c the correct, s all, t and p the true and predicted
    counts per class; 0 when a denominator factor is 0."""
    matrix = np.asarray(matrix, dtype=np.float64)
    correct, total = np.trace(matrix), matrix.sum()
    actual, predicted = matrix.sum(1), matrix.sum(0)
    denominator = (total**2 - predicted @ predicted) * (total**2 - actual @ actual)
    if denominator <= 0:
        return 0.0
    return float((correct * total - actual @ predicted) / np.sqrt(denominator))


def pearson(x: ArrayLike, y: ArrayLike) -> float:
    """Pearson's correlation coefficient; 0 when either sequence is constant or has under 2 values."""
    x, y = _paired(x, y, np.float64)
    return float(pearson_rows(x, y)) if x.size >= 2 else 0.0


def pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r along the last axis of `x` and `y` (broadcast against each other, e.g. (seeds,
    resamples, examples) against (resamples, examples)); 0 where a row is constant."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    dx, dy = x - x.mean(-1, keepdims=True), y - y.mean(-1, keepdims=True)
    norm = np.sqrt((dx * dx).sum(-1) * (dy * dy).sum(-1))
    r = (dx * dy).sum(-1) / np.where(norm > 0, norm, 1.0)
    return np.clip(np.where(norm > 0, r, 0.0), -1.0, 1.0)


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman's rank correlation: Pearson's of the ranks, tied values sharing their average rank."""
    x, y = _paired(x, y, np.float64)
    return pearson(average_ranks(x), average_ranks(y))


def average_ranks(values: ArrayLike) -> np.ndarray:
    """Ranks 1..n of `values`, each group of equal values given the mean of the ranks it spans."""
    values = np.asarray(values, dtype=np.float64)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # ranks before each distinct value
    return (first + (counts + 1) / 2)[inverse.reshape(-1)]


def _paired(a: ArrayLike, b: ArrayLike, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=dtype).reshape(-1), np.asarray(b, dtype=dtype).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"both sequences need one value per example, got {a.size} and {b.size}")
    return a, b
