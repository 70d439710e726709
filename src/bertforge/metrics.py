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
    return confusion_rows(true, predicted, num_labels)


def confusion_rows(true: np.ndarray, predicted: np.ndarray, num_labels: int) -> np.ndarray:
    """(..., K, K) confusion matrices of the label ids along the last axis of `true` and `predicted`,
    broadcast against each other (e.g. (resamples, examples) against (seeds, resamples, examples))."""
    true, predicted = np.broadcast_arrays(np.asarray(true, np.int64), np.asarray(predicted, np.int64))
    leading = true.shape[:-1]
    row = np.arange(int(np.prod(leading)), dtype=np.int64).reshape(*leading, 1)
    cells = (row * num_labels + true) * num_labels + predicted
    counts = np.bincount(cells.reshape(-1), minlength=row.size * num_labels * num_labels)
    return counts.reshape(*leading, num_labels, num_labels)


def accuracy(true: ArrayLike, predicted: ArrayLike) -> float:
    return confusion_accuracy(confusion_matrix(true, predicted))


def binary_f1(true: ArrayLike, predicted: ArrayLike) -> float:
    """F1 of the positive class 1 (labels 0 and 1)."""
    return confusion_binary_f1(confusion_matrix(true, predicted, 2))


def macro_f1(true: ArrayLike, predicted: ArrayLike) -> float:
    return confusion_macro_f1(confusion_matrix(true, predicted))


def matthews_corrcoef(true: ArrayLike, predicted: ArrayLike) -> float:
    return confusion_matthews(confusion_matrix(true, predicted))


def confusion_accuracy(matrix: np.ndarray) -> float | np.ndarray:
    """The accuracy of a (K, K) confusion matrix, or of each matrix of a (..., K, K) stack."""
    matrix = np.asarray(matrix, dtype=np.float64)
    return _one_or_rows(np.trace(matrix, axis1=-2, axis2=-1) / np.maximum(matrix.sum((-2, -1)), 1.0))


def confusion_binary_f1(matrix: np.ndarray) -> float | np.ndarray:
    """F1 of class 1 of a 2 x 2 confusion matrix (or of each of a (..., 2, 2) stack):
    2 TP / (2 TP + FP + FN)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.shape[-2:] != (2, 2):
        raise ValueError(f"binary F1 needs a 2 x 2 confusion matrix, got {matrix.shape}")
    denominator = matrix[..., 1, :].sum(-1) + matrix[..., :, 1].sum(-1)
    return _one_or_rows(_ratio(2 * matrix[..., 1, 1], denominator))


def confusion_macro_f1(matrix: np.ndarray) -> float:
    """The F1 averaged over the classes present in the truth or the predictions (scikit-learn's)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    actual, predicted = matrix.sum(1), matrix.sum(0)
    present = (actual + predicted) > 0
    if not present.any():
        return 0.0
    return float((2 * matrix.diagonal()[present] / (actual + predicted)[present]).mean())


def confusion_matthews(matrix: np.ndarray) -> float | np.ndarray:
    """The Matthews correlation of a K x K confusion matrix (or of each of a (..., K, K) stack; K = 2
    gives the binary formula): (c s - t.p) / sqrt((s^2 - p.p)(s^2 - t.t)), c the correct, s all, t
    and p the true and predicted counts per class; 0 when a denominator factor is 0."""
    matrix = np.asarray(matrix, dtype=np.float64)
    correct, total = np.trace(matrix, axis1=-2, axis2=-1), matrix.sum((-2, -1))
    actual, predicted = matrix.sum(-1), matrix.sum(-2)
    denominator = (total**2 - (predicted * predicted).sum(-1)) * (total**2 - (actual * actual).sum(-1))
    covariance = correct * total - (actual * predicted).sum(-1)
    return _one_or_rows(_ratio(covariance, np.sqrt(np.maximum(denominator, 0.0))))


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


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rank correlation along the last axis of `x` and `y`, broadcast as `pearson_rows`'."""
    return pearson_rows(average_ranks(x), average_ranks(y))


def average_ranks(values: ArrayLike) -> np.ndarray:
    """Ranks 1..n along the last axis of `values`, each group of equal values given the mean of the
    ranks it spans."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, axis=-1, kind="stable")
    ordered = np.take_along_axis(values, order, -1)
    size = values.shape[-1]
    position = np.arange(size)
    differs = ordered[..., 1:] != ordered[..., :-1]  # a new group starts after each True
    starts = np.concatenate([np.ones_like(ordered[..., :1], bool), differs], -1)
    ends = np.concatenate([differs, np.ones_like(ordered[..., :1], bool)], -1)
    first = np.maximum.accumulate(np.where(starts, position, 0), -1)
    last = np.flip(np.minimum.accumulate(np.flip(np.where(ends, position, size), -1), -1), -1)
    ranks = np.empty_like(values)
    np.put_along_axis(ranks, order, (first + last) / 2 + 1, -1)
    return ranks


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is not positive."""
    positive = denominator > 0
    return np.where(positive, numerator / np.where(positive, denominator, 1.0), 0.0)


def _one_or_rows(values: np.ndarray) -> float | np.ndarray:
    """A float for one matrix's figure, the array for a stack's."""
    return float(values) if np.ndim(values) == 0 else values


def _paired(a: ArrayLike, b: ArrayLike, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=dtype).reshape(-1), np.asarray(b, dtype=dtype).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"both sequences need one value per example, got {a.size} and {b.size}")
    return a, b
