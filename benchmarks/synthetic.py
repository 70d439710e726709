"""Generated text for checks that run where no corpus is (a GPU machine without `../shared`): documents of
sentences in a made-up language of pseudo-words, with Zipf-distributed word frequencies and a
strong word-to-next-word structure, so that a masked word can be told from its neighbours and a
model's held-out loss falls as it learns. Deterministic in its seeds; nothing is downloaded.

Every file written with the same `vocabulary` shares one language (words and their usual
successors); `seed` draws the text, so a training and a validation file differ.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
FUNCTION_WORDS = 10
SUCCESSORS = 20  # the usual next content words of each function word
FOLLOW = 0.8  # the share of content words that are one of the function word's usual successors
CYCLE = 0.9  # the share of function words that follow the previous one in their cycle


def pseudo_words(count: int) -> list[str]:
    """`count` distinct words of one to three consonant-vowel syllables, short ones first."""
    syllables = [c + v for c, v in itertools.product(CONSONANTS, VOWELS)]
    words: list[str] = []
    for length in (1, 2, 3):
        for parts in itertools.product(syllables, repeat=length):
            words.append("".join(parts))
            if len(words) == count:
                return words
    raise ValueError(f"at most {len(words)} pseudo-words")


def write_corpus(path: Path, megabytes: float, seed: int, vocabulary: int = 30000) -> Path:
    """About `megabytes` of plain text at `path`: documents of 4 to 30 sentences, blank lines between.

    A sentence alternates content words and function words. A content word is, four times in five,
    one of the few usual successors of the function word before it, else drawn by frequency; a
    function word is, nine times in ten, the one after the previous function word in a cycle of ten.
    """
    function_words = pseudo_words(FUNCTION_WORDS)
    content_words = pseudo_words(FUNCTION_WORDS + vocabulary)[FUNCTION_WORDS:]
    frequency = 1.0 / (np.arange(vocabulary) + 10.0)  # Zipf, flattened at the head
    frequency /= frequency.sum()
    language = np.random.default_rng(0)
    successors = language.choice(vocabulary, size=(FUNCTION_WORDS, SUCCESSORS), p=frequency).tolist()
    rng = np.random.default_rng(seed)
    count = int(megabytes * 1e6 / 5.2)  # about 5.2 characters a word with its space
    follow, which = (rng.random(count) < FOLLOW).tolist(), rng.integers(0, SUCCESSORS, count).tolist()
    fresh = rng.choice(vocabulary, size=count, p=frequency).tolist()
    cycle, shuffled = (rng.random(count) < CYCLE).tolist(), rng.integers(0, FUNCTION_WORDS, count).tolist()
    sentence_lengths = rng.integers(6, 21, count // 6 + 1).tolist()
    document_lengths = rng.integers(4, 31, count // 24 + 1).tolist()
    documents, sentences, sentence = [], [], []
    function = 0
    for i in range(count):
        if i % 2:
            function = (function + 1) % FUNCTION_WORDS if cycle[i] else shuffled[i]
            sentence.append(function_words[function])
        else:
            content = successors[function][which[i]] if follow[i] else fresh[i]
            sentence.append(content_words[content])
        if len(sentence) >= sentence_lengths[len(sentences) % len(sentence_lengths)] and i % 2 == 0:
            sentences.append(" ".join(sentence).capitalize() + ".")
            sentence = []
            if len(sentences) == document_lengths[len(documents) % len(document_lengths)]:
                documents.append(paragraphs(sentences))
                sentences = []
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return path


def paragraphs(sentences: list[str], per_line: int = 4) -> str:
    return "\n".join(" ".join(sentences[i : i + per_line]) for i in range(0, len(sentences), per_line))
