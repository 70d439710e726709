"""Words to WordPieces and back, for token classification.

Owns the alignment that Hugging Face's `run_ner.py` uses: each word is split into pieces, its tag
goes to its first piece, and the other pieces (and `[CLS]`, `[SEP]`) carry `NO_LABEL`, which the loss
ignores; a word's prediction is read at its first piece. A sentence longer than `max_length`
pieces (with `[CLS]` and `[SEP]`) is split into windows of whole words, each a sequence of its own,
and the windows' predictions are put back together word by word (`regroup`): nothing is cut. A single
word of more pieces than a window holds keeps its first ones (only the first is read).

A word that the tokenizer turns into no piece at all (a zero-width space) becomes `[UNK]`, so
that every word has a first piece. Raw text is split into words as CoNLL-2003 and the Penn Treebank
write them, the words taggers are trained on: at white space, with punctuation at a word's edges
apart, except a period that ends an abbreviation ("U.S.", "J.", "Mr."), and a possessive "'s" apart;
inside a word punctuation stays ("O'Neil", "York-based"); each CJK ideograph is a word, as BERT
splits them. Each word keeps its character offsets in the text.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from bertforge.corpus import takes_its_period
from bertforge.losses import NO_LABEL
from bertforge.tokenizer import IDEOGRAPHS, BertTokenizer

WordPieces = list[list[int]]  # one sentence: each word's piece ids

_CHUNKS = re.compile(f"[{IDEOGRAPHS}]|[^\\s{IDEOGRAPHS}]+")
_POSSESSIVES = ("'s", "\u2019s")


def sentence_pieces(tokenizer: BertTokenizer, sentences: Sequence[Sequence[str]]) -> list[WordPieces]:
    """Each sentence's words as piece ids (encoded in parallel in Rust)."""
    encodings = tokenizer.backend.encode_batch(
        [list(words) for words in sentences], is_pretokenized=True, add_special_tokens=False
    )
    return [
        _grouped(encoding.ids, encoding.word_ids, len(words), tokenizer.unk_id)
        for encoding, words in zip(encodings, sentences, strict=True)
    ]


def text_words(tokenizer: BertTokenizer, text: str) -> tuple[WordPieces, list[tuple[int, int]]]:
    """A raw text's words as piece ids, and each word's (start, end) character offsets in `text`."""
    spans = [span for match in _CHUNKS.finditer(text) for span in _word_spans(text, *match.span())]
    if not spans:
        return [], []
    return sentence_pieces(tokenizer, [[text[start:end] for start, end in spans]])[0], spans


def _word_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The words of the white-space-free `text[start:end]`: punctuation at its edges apart."""
    if text[start:end].lower() in _POSSESSIVES:
        return [(start, end)]
    leading, trailing = [], []
    while end - start > 1 and _is_punctuation(text[start]):
        run = _run_length(text[start:end])  # "..." or "--" is one word
        leading.append((start, start + run))
        start += run
    while end - start > 1:
        run = _run_length(text[start:end][::-1])
        if text[end - 2 : end].lower() in _POSSESSIVES and end - start > 2:
            run = 2
        elif not _is_punctuation(text[end - 1]) or _ends_abbreviation(text[start:end]):
            break
        trailing.append((end - run, end))
        end -= run
    return [*leading, *([(start, end)] if end > start else []), *reversed(trailing)]


def _run_length(word: str) -> int:
    """How many times `word`'s first character repeats at its start."""
    return len(word) - len(word.lstrip(word[0]))


def _is_punctuation(char: str) -> bool:
    return unicodedata.category(char).startswith("P")


def _ends_abbreviation(word: str) -> bool:
    """A period that belongs to its word ("J.", "U.S.", "e.g.", "Mr.", "Corp."), as the sentence
    splitter decides."""
    return word.endswith(".") and takes_its_period(word[:-1])


def _grouped(ids: list[int], word_ids: list[int | None], count: int, unk_id: int) -> WordPieces:
    words: WordPieces = [[] for _ in range(count)]
    for piece, word in zip(ids, word_ids, strict=True):
        if word is not None:
            words[word].append(piece)
    return [pieces or [unk_id] for pieces in words]


def word_windows(lengths: Sequence[int], budget: int) -> list[range]:
    """Consecutive ranges of words whose pieces fit `budget`, each as long as it can be (a word
    longer than `budget` alone)."""
    if budget < 1:
        raise ValueError(f"a window needs room for at least one piece, got {budget}")
    windows, start, used = [], 0, 0
    for index, length in enumerate(lengths):
        if used and used + length > budget:
            windows.append(range(start, index))
            start, used = index, 0
        used += min(length, budget)
    if start < len(lengths):
        windows.append(range(start, len(lengths)))
    return windows


def encode_words(
    tokenizer: BertTokenizer, words: WordPieces, max_length: int, tags: Sequence[int] | None = None
) -> list[dict]:
    """One sentence as `[CLS] pieces [SEP]` windows of at most `max_length` tokens: each with
    `input_ids`, `token_type_ids`, `firsts` (the position of each of its words' first piece) and,
    given the words' `tags`, `label` (the tag at each first piece, NO_LABEL elsewhere)."""
    budget = max_length - 2
    examples = []
    for window in word_windows([len(pieces) for pieces in words], budget):
        input_ids, firsts = [tokenizer.cls_id], []
        for word in window:
            firsts.append(len(input_ids))
            input_ids += words[word][:budget]
        input_ids.append(tokenizer.sep_id)
        example = {"input_ids": input_ids, "token_type_ids": [0] * len(input_ids), "firsts": firsts}
        if tags is not None:
            label = [NO_LABEL] * len(input_ids)
            for word, position in zip(window, firsts, strict=True):
                label[position] = tags[word]
            example["label"] = label
        examples.append(example)
    return examples


def regroup(values: Sequence, lengths: Sequence[int]) -> list[list]:
    """A flat sequence of per-word values (the windows' predictions, in order) cut into sentences of
    `lengths` words."""
    if sum(lengths) != len(values):
        raise ValueError(f"{len(values)} values for sentences of {sum(lengths)} words")
    sentences, start = [], 0
    for length in lengths:
        sentences.append(list(values[start : start + length]))
        start += length
    return sentences
