"""Entities in tag sequences, and their precision, recall and F1: pure functions on lists of tags.

A tag is `O` or `PREFIX-TYPE` with the prefix `B` or `I` (`B-PER`, `I-LOC`). `entity_spans` reads
the entities of one sentence's tags by the rules of CoNLL's `conlleval` script, which seqeval's
default mode follows, and which serve IOB1 and IOB2 alike:
- an entity starts at a `B-` tag, or at an `I-` tag that does not continue one of its type (after
  `O`, or after a tag of another type: IOB1's entity start, and a tagger's slip in IOB2);
- it ends before a tag that is `O`, a `B-`, or of another type.
So `B-PER I-LOC` holds two entities, `PER` and `LOC`, and `O I-ORG I-ORG` one `ORG` of two words.

`entity_scores` counts an entity as found only when its first word, last word and type are all
those of a true entity (exact match), and gives precision, recall and F1 per type and over all
entities (micro-averaged), as `conlleval` and seqeval do; with nothing to divide by (no entity
predicted, or none true) a figure is 0. `sentence_counts` gives each sentence's counts, from which
`f1_from_counts` recomputes F1 over any resample of the sentences.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

OUTSIDE = "O"
PREFIXES = ("B", "I")
Span = tuple[str, int, int]  # (type, first word, one past the last word)


def split_tag(tag: str) -> tuple[str, str]:
    """`B-PER` -> ("B", "PER"); `O` -> ("O", ""). A tag of another form raises ValueError."""
    if tag == OUTSIDE:
        return OUTSIDE, ""
    prefix, _, kind = tag.partition("-")
    if prefix not in PREFIXES or not kind:
        raise ValueError(f"{tag!r} is not a tag of the IOB schemes: O, B-TYPE or I-TYPE")
    return prefix, kind


def is_tag(tag: str) -> bool:
    try:
        split_tag(tag)
    except ValueError:
        return False
    return True


def entity_spans(tags: Sequence[str]) -> list[Span]:
    """The entities of one sentence's tags, in order, as (type, start, end) word spans."""
    spans: list[Span] = []
    start, current = 0, ""  # the open entity's first word and type ("" when none is open)
    for position, tag in enumerate(tags):
        prefix, kind = split_tag(tag)
        continues = prefix == "I" and kind == current
        if current and not continues:
            spans.append((current, start, position))
            current = ""
        if prefix != OUTSIDE and not continues:
            start, current = position, kind
    if current:
        spans.append((current, start, len(tags)))
    return spans


def precision_recall_f1(correct: float, predicted: float, true: float) -> dict[str, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def entity_scores(true: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict:
    """Over all sentences: `precision`, `recall`, `f1` (micro), `accuracy` (of word tags) and
    `per_type`: type -> precision, recall, f1 and `support` (its true entities)."""
    found, guessed, gold = Counter(), Counter(), Counter()
    words = right = 0
    for true_tags, predicted_tags in _paired(true, predicted):
        true_spans, predicted_spans = set(entity_spans(true_tags)), set(entity_spans(predicted_tags))
        found.update(span[0] for span in true_spans & predicted_spans)
        guessed.update(span[0] for span in predicted_spans)
        gold.update(span[0] for span in true_spans)
        words += len(true_tags)
        right += sum(a == b for a, b in zip(true_tags, predicted_tags, strict=True))
    scores = precision_recall_f1(sum(found.values()), sum(guessed.values()), sum(gold.values()))
    per_type = {
        kind: {**precision_recall_f1(found[kind], guessed[kind], gold[kind]), "support": gold[kind]}
        for kind in sorted(gold | guessed)
    }
    return {**scores, "accuracy": right / words if words else 0.0, "per_type": per_type}


def sentence_counts(true: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> np.ndarray:
    """(sentences, 3): each sentence's entities found exactly, predicted and true."""
    rows = []
    for true_tags, predicted_tags in _paired(true, predicted):
        true_spans, predicted_spans = set(entity_spans(true_tags)), set(entity_spans(predicted_tags))
        rows.append((len(true_spans & predicted_spans), len(predicted_spans), len(true_spans)))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def f1_from_counts(counts: np.ndarray) -> np.ndarray:
    """The micro F1 of summed (found, predicted, true) counts (..., 3) -> (...): 2 found / (predicted +
    true), 0 where there is no entity at all."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts[..., 1] + counts[..., 2]
    return np.divide(2 * counts[..., 0], total, out=np.zeros_like(total), where=total > 0)


def _paired(true: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]):
    if len(true) != len(predicted):
        raise ValueError(f"{len(true)} true and {len(predicted)} predicted sentences")
    for index, (a, b) in enumerate(zip(true, predicted, strict=True)):
        if len(a) != len(b):
            raise ValueError(f"sentence {index}: {len(a)} true and {len(b)} predicted tags")
        yield a, b
