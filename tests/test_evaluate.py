"""The unigram-entropy reference line: the MLM loss of a model that knows only token frequencies."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from bertforge.evaluate import unigram_entropy


def test_unigram_entropy_of_known_counts_ignores_special_tokens():
    # ids 0-4 are special; 5 occurs twice, 6 and 7 once each: p = (1/2, 1/4, 1/4).
    tokens = np.array([2, 5, 6, 3, 5, 7, 3, 0, 0], dtype=np.uint16)
    shards = SimpleNamespace(tokens=tokens, num_tokens=len(tokens), vocab_size=10)
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert unigram_entropy(shards, (0, 1, 2, 3, 4)) == pytest.approx(expected)
