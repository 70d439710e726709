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
    confusion_binary_f1,
    confusion_matrix,
    confusion_matthews,
    macro_f1,
    matthews_corrcoef,
    pearson,
    pearson_rows,
    spearman,
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
