"""The paired statistics: the exact sign test against binomial values, the paired bootstrap against
scipy's bootstrap and the analytic standard error of a mean, summaries."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from bertforge.stats import bootstrap_gains, paired_bootstrap, sign_test, summary


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


def known_pairs(n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Outcomes whose per-example differences are known: 60 examples only arm a gets right, 44 only
    b, 200 both and 96 neither, shuffled. Gain 16 / 400 = 0.04; the differences' variance (dividing
    by n) is 104 / 400 - 0.04**2 = 0.2584, so the bootstrap's standard error is sqrt(0.2584 / 400)."""
    a, b = np.zeros(n, bool), np.zeros(n, bool)
    a[:60], b[60:104] = True, True
    a[104:304] = b[104:304] = True
    order = np.random.default_rng(0).permutation(n)
    return a[order], b[order]


KNOWN_GAIN, KNOWN_SE, KNOWN_STEP = 0.04, math.sqrt(0.2584 / 400), 1 / 400  # STEP: the gains' lattice


def test_bootstrap_standard_error_is_the_analytic_one():
    """Resampling n examples with replacement gives a mean whose variance is exactly the plug-in
    variance / n; with B resamples the standard deviation of the resampled gains estimates it with a
    relative error of about 1 / sqrt(2B) (0.5% for B = 20,000): within 3% is six of those."""
    a, b = known_pairs()
    differences = a.astype(float) - b
    assert differences.mean() == pytest.approx(KNOWN_GAIN)
    assert differences.std() / math.sqrt(differences.size) == pytest.approx(KNOWN_SE)
    for seed in (0, 1):
        gains = bootstrap_gains(lambda index: differences[index].mean(axis=1), differences.size, 20_000, seed)
        assert gains.std(ddof=1) == pytest.approx(KNOWN_SE, rel=0.03)
        assert gains.mean() == pytest.approx(KNOWN_GAIN, abs=4 * KNOWN_SE / math.sqrt(20_000))


@pytest.mark.parametrize("confidence", [0.95, 0.8])
def test_bootstrap_interval_and_p_value_follow_the_normal_approximation(confidence):
    """At n = 400 the resampled gain is close to normal around the observed one (central limit):
    the percentile interval is gain +- z * SE to within two steps of the gains' 1/400 lattice, and
    the p-value (resampled gains <= 0, doubled) is 2 * Phi((step / 2 - gain) / SE), the continuity
    corrected normal tail, to within 0.02 (its Monte Carlo error is 0.0034 at B = 20,000)."""
    a, b = known_pairs()
    result = paired_bootstrap(a, b, resamples=20_000, seed=3, confidence=confidence)
    z = scipy.stats.norm.isf((1 - confidence) / 2)
    assert result["gain"] == pytest.approx(KNOWN_GAIN)
    assert result["low"] == pytest.approx(KNOWN_GAIN - z * KNOWN_SE, abs=2 * KNOWN_STEP)
    assert result["high"] == pytest.approx(KNOWN_GAIN + z * KNOWN_SE, abs=2 * KNOWN_STEP)
    tail = scipy.stats.norm.cdf((KNOWN_STEP / 2 - KNOWN_GAIN) / KNOWN_SE)
    assert 0.1 < 2 * tail < 0.15 and result["p_value"] == pytest.approx(2 * tail, abs=0.02)
    swapped = paired_bootstrap(b, a, resamples=20_000, seed=3, confidence=confidence)
    assert swapped["gain"] == pytest.approx(-KNOWN_GAIN)
    assert swapped["p_value"] == pytest.approx(2 * tail, abs=0.02)
    assert (swapped["low"], swapped["high"]) == pytest.approx((-result["high"], -result["low"]), abs=0.005)


def scipy_reference(statistic, data: tuple, resamples: int, seed: int, paired: bool = True):
    """scipy's percentile bootstrap of `statistic` on `data`, with its own random stream."""
    return scipy.stats.bootstrap(
        data,
        statistic,
        paired=paired,
        vectorized=True,
        n_resamples=resamples,
        method="percentile",
        confidence_level=0.95,
        random_state=np.random.default_rng(seed + 1000),
    )


def reference_p_value(distribution: np.ndarray, gain: float) -> float:
    """The p-value `paired_bootstrap` documents, read off another bootstrap's resampled gains."""
    flipped = np.count_nonzero(distribution <= 0) if gain > 0 else np.count_nonzero(distribution >= 0)
    return min(1.0, 2 * flipped / distribution.size)


def test_bootstrap_matches_scipy_on_one_seed():
    """scipy.stats.bootstrap (paired, percentile) on the same outcomes, from another random stream:
    the intervals agree within two lattice steps (each endpoint's Monte Carlo error is about 0.0005)
    and the p-values within 0.02 (each has a Monte Carlo error of 0.0034 at B = 20,000)."""
    a, b = known_pairs()
    ours = paired_bootstrap(a, b, resamples=20_000, seed=5)

    def gain(x, y, axis=-1):
        return x.mean(axis=axis) - y.mean(axis=axis)

    theirs = scipy_reference(gain, (a.astype(float), b.astype(float)), 20_000, seed=5)
    assert ours["low"] == pytest.approx(theirs.confidence_interval.low, abs=2 * KNOWN_STEP)
    assert ours["high"] == pytest.approx(theirs.confidence_interval.high, abs=2 * KNOWN_STEP)
    assert theirs.standard_error == pytest.approx(KNOWN_SE, rel=0.03)
    assert ours["p_value"] == pytest.approx(reference_p_value(theirs.bootstrap_distribution, 0.04), abs=0.02)


def test_bootstrap_over_several_seeds_matches_scipy_resampling_examples_across_seeds():
    """With outcomes (seeds, examples), an example is resampled with all its seeds: scipy resamples
    the example indices and the statistic averages both arms over seeds and the resampled examples.
    The gains' lattice step is 1 / 900; intervals within 0.005, p-values within 0.025 (Monte Carlo
    error 0.005 each at B = 10,000)."""
    rng = np.random.default_rng(9)
    a, b = rng.random((3, 300)) < 0.72, rng.random((3, 300)) < 0.66
    ours = paired_bootstrap(a, b, resamples=10_000, seed=3)

    def gain(indices, axis=-1):
        return (a[:, indices].astype(float) - b[:, indices]).mean(axis=(0, -1))

    theirs = scipy_reference(gain, (np.arange(300),), 10_000, seed=3, paired=False)
    assert ours["gain"] == pytest.approx(a.mean() - b.mean())
    assert ours["low"] == pytest.approx(theirs.confidence_interval.low, abs=0.005)
    assert ours["high"] == pytest.approx(theirs.confidence_interval.high, abs=0.005)
    expected = reference_p_value(theirs.bootstrap_distribution, ours["gain"])
    assert 0.02 < expected < 0.2 and ours["p_value"] == pytest.approx(expected, abs=0.025)


def five_seeds_with_many_tied_resamples() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Outcomes (5 seeds, 60 examples) and each example's gain summed over the seeds, exactly."""
    rng = np.random.default_rng(3)
    a, b = rng.random((5, 60)) < 0.55, rng.random((5, 60)) < 0.50
    return a, b, a.astype(int).sum(axis=0) - b.astype(int).sum(axis=0)


def exact_p_value(summed: np.ndarray, resamples: int, seed: int) -> float:
    """The documented p-value from integer gains on the same draws: a resample with no gain at all
    counts against either sign."""
    sums = bootstrap_gains(lambda index: summed[index].sum(axis=1), summed.size, resamples, seed)
    assert np.count_nonzero(sums == 0) > resamples / 50  # ties are common enough for a miscount to show
    flipped = np.count_nonzero(sums >= 0) if summed.sum() < 0 else np.count_nonzero(sums <= 0)
    return min(1.0, 2 * flipped / resamples)


def test_a_resample_with_no_gain_counts_against_either_sign_with_five_seeds():
    """Averaged over 5 seeds an example's gain is k/5, which floating point does not add back to an
    exact 0: a resample with no gain must not land on one side of the count by rounding."""
    a, b, summed = five_seeds_with_many_tied_resamples()
    assert paired_bootstrap(a, b, resamples=10_000, seed=0)["p_value"] == exact_p_value(summed, 10_000, 0)
