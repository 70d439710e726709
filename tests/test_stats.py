"""The paired statistics: the exact sign test against binomial values, the paired bootstrap, summaries."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bertforge.stats import paired_bootstrap, sign_test, summary


@pytest.mark.parametrize(
    "differences, p_value",
    [
        ([0.1] * 5, 0.0625),  # 2 * 0.5**5
        ([0.1] * 10, 0.001953125),  # 2 * 0.5**10
        ([-0.1] * 5, 0.0625),  # two-sided: losses count as wins do
        ([1, 1, 1, 1, -1], 0.375),  # 2 * (1 + 5) / 32
        ([1] * 8 + [-1] * 2, 2 * (1 + 10 + 45) / 1024),
        ([1, -1], 1.0),  # capped at 1
        ([0, 0, 0], 1.0),  # nothing but ties
    ],
)
def test_sign_test_matches_the_binomial_tail(differences, p_value):
    assert sign_test(differences)["p_value"] == pytest.approx(p_value, rel=1e-12)


def test_sign_test_drops_ties():
    result = sign_test([0.1, 0.2, 0.0, 0.3, 0.0, 0.1, 0.4])
    assert (result["wins"], result["losses"], result["ties"]) == (5, 0, 2)
    assert result["p_value"] == pytest.approx(0.0625)


def test_sign_test_agrees_with_a_direct_sum_for_every_split():
    for n in range(1, 13):
        for wins in range(n + 1):
            k = min(wins, n - wins)
            expected = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)
            got = sign_test([1] * wins + [-1] * (n - wins))["p_value"]
            assert got == pytest.approx(expected) and 0 < got <= 1


def test_bootstrap_of_identical_arms_finds_nothing():
    correct = np.random.default_rng(0).random((3, 200)) < 0.7
    result = paired_bootstrap(correct, correct.copy(), resamples=2000)
    assert result["gain"] == 0 and result["p_value"] == 1.0
    assert result["low"] <= 0 <= result["high"]


def test_bootstrap_finds_a_clearly_better_arm():
    rng = np.random.default_rng(1)
    better, worse = np.arange(400) < 380, np.arange(400) < 240  # 95% against 60% correct
    better, worse = rng.permutation(better), rng.permutation(worse)
    result = paired_bootstrap(better, worse)
    assert result["gain"] == pytest.approx(0.35)
    assert result["p_value"] < 0.01 and 0 < result["low"] < 0.35 < result["high"]
    reverse = paired_bootstrap(worse, better)
    assert reverse["gain"] == pytest.approx(-0.35) and reverse["p_value"] < 0.01 and reverse["high"] < 0
    assert result["examples"] == 400 and result["resamples"] == 10_000


def test_bootstrap_is_deterministic_with_its_seed_and_averages_seeds():
    rng = np.random.default_rng(2)
    a, b = rng.random((4, 300)) < 0.62, rng.random((4, 300)) < 0.58
    first, again = (
        paired_bootstrap(a, b, resamples=3000, seed=7),
        paired_bootstrap(a, b, resamples=3000, seed=7),
    )
    assert first == again
    assert paired_bootstrap(a, b, resamples=3000, seed=8) != first
    assert first["gain"] == pytest.approx(a.mean() - b.mean())
    assert 0 < first["p_value"] <= 1 and first["low"] < first["gain"] < first["high"]


def test_bootstrap_refuses_unpaired_outcomes():
    with pytest.raises(ValueError, match="same examples"):
        paired_bootstrap(np.ones((2, 10)), np.ones((2, 11)))
    with pytest.raises(ValueError, match="resamples"):
        paired_bootstrap(np.ones(10), np.ones(10), resamples=0)


def test_summary_of_a_list():
    result = summary([0.8, 0.9, 0.7, 1.0])
    assert result["n"] == 4 and result["median"] == pytest.approx(0.85)
    assert (result["min"], result["max"]) == (0.7, 1.0)
    assert result["mean"] == pytest.approx(0.85) and result["std"] == pytest.approx(
        np.std([0.8, 0.9, 0.7, 1.0], ddof=1)
    )
    assert summary([0.5])["std"] == 0.0
    with pytest.raises(ValueError):
        summary([])
