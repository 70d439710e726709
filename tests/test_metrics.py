"""The evaluation metrics against hand-computed values and scipy's correlations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from bertforge.metrics import (
    accuracy,
    average_ranks,
    binary_f1,
    confusion_accuracy,
    confusion_binary_f1,
    confusion_matrix,
    confusion_matthews,
    confusion_rows,
    macro_f1,
    matthews_corrcoef,
    pearson,
    pearson_rows,
    spearman,
    spearman_rows,
)

# TN 5, FP 1, FN 2, TP 4 as label lists
BINARY_TRUE = [0] * 6 + [1] * 6
BINARY_PREDICTED = [0] * 5 + [1] + [0] * 2 + [1] * 4


def test_confusion_matrix_counts_rows_true_columns_predicted():
    matrix = confusion_matrix(BINARY_TRUE, BINARY_PREDICTED)
    assert matrix.tolist() == [[5, 1], [2, 4]]
    assert confusion_matrix([0, 1], [1, 1], num_labels=3).tolist() == [[0, 1, 0], [0, 1, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match="label ids"):
        confusion_matrix([0, 3], [0, 1], num_labels=3)
    with pytest.raises(ValueError, match="one value per example"):
        confusion_matrix([0, 1], [0])


def test_binary_scores_by_hand():
    assert accuracy(BINARY_TRUE, BINARY_PREDICTED) == pytest.approx(9 / 12)
    assert binary_f1(BINARY_TRUE, BINARY_PREDICTED) == pytest.approx(2 * 4 / (2 * 4 + 1 + 2))
    # (TP TN - FP FN) / sqrt((TP + FP)(TP + FN)(TN + FP)(TN + FN))
    assert matthews_corrcoef(BINARY_TRUE, BINARY_PREDICTED) == pytest.approx(
        (4 * 5 - 1 * 2) / math.sqrt(5 * 6 * 6 * 7)
    )
    assert matthews_corrcoef([1, 1, 1, 0], [1, 0, 1, 1]) == pytest.approx(-1 / 3)


def test_multiclass_matthews_and_macro_f1_by_hand():
    matrix = np.array([[3, 1, 0], [0, 2, 1], [1, 0, 2]])
    true = [t for t in range(3) for p in range(3) for _ in range(matrix[t, p])]
    predicted = [p for t in range(3) for p in range(3) for _ in range(matrix[t, p])]
    # c = 7, s = 10, t = p = (4, 3, 3): (70 - 34) / sqrt((100 - 34)(100 - 34))
    assert matthews_corrcoef(true, predicted) == pytest.approx(36 / 66)
    assert confusion_matthews(matrix) == pytest.approx(36 / 66)
    f1s = [2 * 3 / (4 + 4), 2 * 2 / (3 + 3), 2 * 2 / (3 + 3)]
    assert macro_f1(true, predicted) == pytest.approx(sum(f1s) / 3)


def test_undefined_scores_are_zero():
    assert matthews_corrcoef([1, 1, 0, 0], [1, 1, 1, 1]) == 0.0  # one predicted class
    assert matthews_corrcoef([], []) == 0.0
    assert binary_f1([0, 0], [0, 0]) == 0.0  # no positives anywhere
    assert accuracy([], []) == 0.0
    assert macro_f1([], []) == 0.0
    assert pearson([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == 0.0
    assert pearson([1.0], [2.0]) == 0.0
    with pytest.raises(ValueError, match="2 x 2"):
        confusion_binary_f1(np.eye(3))


def test_perfect_and_inverted_predictions():
    labels = [0, 1, 2, 1, 0]
    assert matthews_corrcoef(labels, labels) == pytest.approx(1.0)
    assert matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert pearson([1, 2, 3], [6, 4, 2]) == pytest.approx(-1.0)


def test_spearman_gives_ties_their_average_rank():
    assert average_ranks([10, 20, 20, 30]).tolist() == [1.0, 2.5, 2.5, 4.0]
    assert average_ranks([3, 1, 3, 3]).tolist() == [3.0, 1.0, 3.0, 3.0]
    # ranks (1, 2.5, 2.5, 4) against (1, 3, 2, 4): 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / math.sqrt(10))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correlations_match_scipy(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=200)
    y = 0.5 * x + rng.normal(size=200)
    assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
    # STS-B-like scores on a coarse grid: many ties
    gold = rng.integers(0, 11, size=300) / 2
    guess = np.round(gold + rng.normal(scale=1.0, size=300))
    assert spearman(gold, guess) == pytest.approx(stats.spearmanr(gold, guess)[0], abs=1e-12)
    assert spearman(list(gold), list(guess)) == pytest.approx(stats.spearmanr(gold, guess)[0], abs=1e-12)


def test_pearson_rows_is_pearson_per_row_with_broadcasting():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(2, 4, 30)), rng.normal(size=(4, 30))
    rows = pearson_rows(x, y)
    assert rows.shape == (2, 4)
    for s in range(2):
        for r in range(4):
            assert rows[s, r] == pytest.approx(stats.pearsonr(x[s, r], y[r])[0], abs=1e-12)
    assert pearson_rows(np.ones((2, 5)), y[:2, :5]).tolist() == [0.0, 0.0]


def test_stacked_confusion_matrices_and_their_metrics_are_each_rows():
    """(seeds, resamples, examples) against (resamples, examples): every matrix and figure is the
    one of its own row, counted and computed one at a time."""
    rng = np.random.default_rng(4)
    true, predicted = rng.integers(0, 3, size=(4, 40)), rng.integers(0, 3, size=(2, 4, 40))
    stack = confusion_rows(true, predicted, 3)
    assert stack.shape == (2, 4, 3, 3)
    binary = confusion_rows(true % 2, predicted % 2, 2)
    accuracies, f1s, mccs = confusion_accuracy(stack), confusion_binary_f1(binary), confusion_matthews(stack)
    for s in range(2):
        for r in range(4):
            assert stack[s, r].tolist() == confusion_matrix(true[r], predicted[s, r], 3).tolist()
            assert accuracies[s, r] == pytest.approx(accuracy(true[r], predicted[s, r]), abs=1e-12)
            assert f1s[s, r] == pytest.approx(binary_f1(true[r] % 2, predicted[s, r] % 2), abs=1e-12)
            assert mccs[s, r] == pytest.approx(matthews_corrcoef(true[r], predicted[s, r]), abs=1e-12)
    constant = confusion_rows(true, np.zeros_like(true), 3)
    assert confusion_matthews(constant).tolist() == [0.0] * 4
    assert confusion_binary_f1(np.zeros((3, 2, 2))).tolist() == [0.0] * 3


def test_ranks_and_spearman_along_rows_match_scipy_with_ties():
    rng = np.random.default_rng(5)
    gold = rng.integers(0, 11, size=(6, 50)) / 2  # STS-B-like: many ties
    guess = np.round(gold[None] + rng.normal(size=(3, 6, 50)))
    assert np.array_equal(average_ranks(guess), stats.rankdata(guess, axis=-1))
    rows = spearman_rows(guess, gold)
    assert rows.shape == (3, 6)
    for s in range(3):
        for r in range(6):
            assert rows[s, r] == pytest.approx(stats.spearmanr(guess[s, r], gold[r])[0], abs=1e-12)
