"""Statistics for comparing two training recipes: pure functions on lists and numpy arrays.

- `sign_test`: the exact two-sided sign test (a binomial test with p = 1/2) over paired seeds.
  It asks whether one arm beats the other more often across training randomness (initialisation,
  data order, dropout) than chance would have it; it uses only the signs of the per-seed
  differences, so it assumes nothing about their distribution. Ties are dropped. With n seeds the
  smallest p-value it can give is 2 / 2**n: six seeds that all agree are needed for p < 0.05.
- `paired_bootstrap`: a paired bootstrap over evaluation examples (Efron & Tibshirani 1993;
  Berg-Kirkpatrick et al. 2012 for NLP). It resamples the examples with replacement, keeping each
  example's outcomes under both arms together, and asks whether the accuracy gain of these trained
  models is larger than the sampling noise of a finite evaluation set. It does not cover the
  variation between seeds; the sign test does.
- `summary`: median, range, mean and standard deviation of a list of numbers; `spread` adds max - min.

No scipy: the binomial tail is summed exactly with `math.comb`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import numpy as np

SAME_SCORE = 1e-9  # gains no larger are rounding errors of an exact 0 (scores are fractions or percent)
BOOTSTRAP_CHUNK = 200  # resamples drawn at once (bounds the arrays' memory; the draws do not depend on it)


def summary(values: Sequence[float]) -> dict[str, float]:
    """Count, median, min, max, mean and sample standard deviation (0 for a single value)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("summary of an empty list")
    return {
        "n": len(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def spread(values: Sequence[float]) -> dict[str, float]:
    """`summary` and the spread (max - min) over seeds, as the fine-tuning and GLUE reports give them."""
    described = summary(values)
    return described | {"spread": described["max"] - described["min"]}


def sign_test(differences: Sequence[float]) -> dict[str, float]:
    """Exact two-sided sign test of paired differences (a - b); zero differences (ties) are dropped.

    p = min(1, 2 * P(X <= min(wins, losses))) for X ~ Binomial(wins + losses, 1/2); 1 when all tie.
    """
    wins = sum(1 for d in differences if d > 0)
    losses = sum(1 for d in differences if d < 0)
    n = wins + losses
    tail = sum(math.comb(n, k) for k in range(min(wins, losses) + 1)) / 2**n
    return {
        "wins": wins,
        "losses": losses,
        "ties": len(differences) - n,
        "p_value": min(1.0, 2 * tail),
    }


def paired_bootstrap(
    correct_a: np.ndarray,
    correct_b: np.ndarray,
    resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, float]:
    """The gain in accuracy of arm a over arm b, its bootstrap interval and a two-sided p-value.

    `correct_a` and `correct_b` hold whether each example was classified correctly, shaped
    (examples,) or (seeds, examples) with the same seeds in the same order; with several seeds the
    accuracy is averaged over them. Examples are resampled with replacement `resamples` times
    from `seed`. The p-value is twice the fraction of resamples whose gain has the opposite sign
    to the observed one (zero counting as opposite), capped at 1; 1 when the observed gain is 0.
    The interval holds the central `confidence` of the resampled gains (percentile method).
    """
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    a, b = np.atleast_2d(np.asarray(correct_a, float)), np.atleast_2d(np.asarray(correct_b, float))
    if a.shape != b.shape or a.shape[1] == 0:
        raise ValueError(f"both arms need outcomes on the same examples, got {a.shape} and {b.shape}")
    # Sums of 0s and 1s are exact; their mean over seeds (k/3, k/5) is not, and a resample whose
    # gain is exactly 0 would come out as +-1e-17 on either side of the p-value's count.
    per_example = (a - b).sum(axis=0)  # (examples,): the gain on each example, summed over seeds
    scale = a.shape[0] * per_example.size
    observed = float(per_example.sum()) / scale
    gains = bootstrap_gains(lambda index: per_example[index].sum(axis=1), per_example.size, resamples, seed)
    return bootstrap_verdict(observed, gains / scale, int(per_example.size), seed, confidence)


def bootstrap_verdict(
    observed: float, gains: np.ndarray, examples: int, seed: int, confidence: float = 0.95
) -> dict[str, float]:
    """A paired bootstrap's result from the observed gain and the gains of its resamples.

    The p-value is twice the fraction of resamples whose gain has the opposite sign to the observed
    one (zero counting as opposite), capped at 1; 1 when the observed gain is 0. The interval holds
    the central `confidence` of the resampled gains (percentile method).
    """
    resamples = int(gains.size)
    # A score averaged over seeds in floating point leaves a gain that is exactly 0 at +-1e-14:
    # zero it, so that it counts as the opposite sign on either side.
    observed = 0.0 if abs(observed) <= SAME_SCORE else observed
    gains = np.where(np.abs(gains) <= SAME_SCORE, 0.0, gains)
    if observed == 0:
        p_value = 1.0
    else:
        flipped = np.count_nonzero(gains <= 0) if observed > 0 else np.count_nonzero(gains >= 0)
        p_value = min(1.0, 2 * flipped / resamples)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(gains, [tail, 100 - tail])
    return {
        "gain": observed,
        "low": float(low),
        "high": float(high),
        "confidence": confidence,
        "p_value": p_value,
        "examples": examples,
        "resamples": resamples,
        "seed": seed,
    }


def bootstrap_gains(
    gain: Callable[[np.ndarray], np.ndarray], size: int, resamples: int, seed: int
) -> np.ndarray:
    """A statistic's gain on `resamples` resamples of `size` examples drawn with replacement from `seed`:
    (resamples,). `gain(index)` takes an (R, size) block of resamples' example indices, R at a time, and
    returns their R gains; every paired bootstrap here (accuracy, Pearson's r, entity F1, GLUE scores)
    resamples through it."""
    rng = np.random.default_rng(seed)
    gains = []
    for first in range(0, resamples, BOOTSTRAP_CHUNK):
        gains.append(gain(rng.integers(0, size, size=(min(BOOTSTRAP_CHUNK, resamples - first), size))))
    return np.concatenate(gains)
