"""Training pairs: which token ranges of the shards make up each sequence of an epoch.

Owns the per-epoch pair table, an (N, 5) int64 array of `(a_start, a_end, b_start, b_end,
nsp_label)` token ranges into `shards.tokens`, and `PairDataset`, which turns one row into
`[CLS] A [SEP] B [SEP]` ids with segment ids. Masking is not done here (see `masking`): pairs hold
no token copies, so a new epoch is a new table of ranges, built in well under a second.

With next sentence prediction (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional
Transformers for Language Understanding", section 3.1) the table follows
`create_instances_from_document` in Google's `create_pretraining_data.py`
(github.com/google-research/bert) in distribution: whole sentences fill a chunk up to a target
length (usually `max_seq_length - 3`, with probability `short_seq_prob` a shorter random one,
drawn once per document as Google does); A is a random prefix of the chunk's sentences; half the
time B is a span from a *different* document and the unused sentences are put back, otherwise B
is the rest of the chunk; then the longer side is trimmed one token at a time from a random end.
Three departures, all deliberate: the random document is always another document (Google gives up
after ten tries); a one-sentence chunk that draws "IsNext" takes a neighbouring sentence so that B
really is the continuation half the time (Google makes such chunks always random, which skews the
labels); and a document of one sentence, which has no continuation to offer, trains MLM alone, in
windows as below (runs of such documents, a table's rows for instance, packed together), where Google
pairs it with a random B every time. The labels are Google's and Hugging Face's: 0 = B is the true
continuation, 1 = B is random.

Without NSP (RoBERTa-style MLM only) the label is -1 and A is a window of `max_seq_length - 2`
tokens whose boundaries shift every epoch. By default the windows are cut from the corpus read as
one stream, a `[SEP]` between documents, so a window runs on into the next document as RoBERTa's
FULL-SENTENCES inputs do (Liu et al. 2019, section 4.2) and short documents fill whole sequences
(unlike those, a window starts and ends at any token, not at a sentence's edge);
such a row's token range spans documents, and `PairDataset` puts the `[SEP]` back at each document
end inside it. With `cross_documents` off, each document is cut on its own.

The shards are any object with `tokens`, `sentence_offsets` and `document_offsets` arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bertforge.errors import BertforgeError

IS_NEXT = 0  # Hugging Face `next_sentence_label`: 0 = B continues A
RANDOM_NEXT = 1  # 1 = B was drawn from another document
NO_NSP = -1  # MLM-only sequence: no next-sentence label
FEW_PAIRS = 0.1  # an `nsp_share` below which nearly every document of a text is one sentence

_EMPTY_CORPUS = (
    "the corpus is empty: no document has any tokens; check the input files (and data.format) "
    "and that the tokenizer produces tokens for them"
)
_ONE_DOCUMENT = (
    "the corpus has only one document; next sentence prediction needs documents to draw random "
    "sentences from: separate documents by blank lines (text), use one JSON object per document "
    "(jsonl) or a -DOCSTART- line before each (conll), or set data.nsp = false"
)


def build_pairs(
    shards: Any,
    max_seq_length: int,
    short_seq_prob: float,
    nsp: bool,
    seed: int,
    epoch: int,
    cross_documents: bool = True,
) -> np.ndarray:
    """The shuffled pair table of one epoch: (N, 5) int64 rows `(a_start, a_end, b_start, b_end, label)`.

    Deterministic in `(seed, epoch)`; a different epoch gives different targets, splits, random
    partners, truncations and window boundaries. `cross_documents` only concerns MLM-only windows
    (with NSP, those of the one-sentence documents).
    """
    rng = np.random.default_rng([seed, epoch])
    assert max_seq_length >= (5 if nsp else 3), "config.validate checks data.max_seq_length"
    if nsp:
        rows = np.ascontiguousarray(_nsp_chunks(shards, max_seq_length - 3, short_seq_prob, rng)[:, :5])
        _truncate_pairs(rows, max_seq_length - 3, rng)
        rows = np.concatenate(
            [rows, _lone_sentence_windows(shards, max_seq_length - 2, rng, cross_documents)]
        )
    elif cross_documents:
        rows = _stream_windows(shards, max_seq_length - 2, rng)
    else:
        rows = _mlm_windows(shards, max_seq_length - 2, rng)
    return rows[rng.permutation(len(rows))]


def nsp_share(pairs: np.ndarray) -> float:
    """The share of a pair table's rows that carry a next-sentence label (the rest are MLM windows)."""
    return float((pairs[:, 4] != NO_NSP).mean()) if len(pairs) else 0.0


def _sentence_table(shards: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Token starts and ends of the non-empty sentences, and each document's range over them.

    Empty sentences are dropped (they would make empty segments) and so are documents left with
    no sentence; the remaining sentences of a document still form one contiguous token range.
    Returns starts (S,), ends (S,), and each document's first sentence (D,) and stop (D,).
    """
    sentence_offsets = np.asarray(shards.sentence_offsets, dtype=np.int64)
    document_offsets = np.asarray(shards.document_offsets, dtype=np.int64)
    assert sentence_offsets.ndim == 1 and document_offsets.ndim == 1, "offsets must be 1-D"
    if sentence_offsets.size < 2 or document_offsets.size < 2:
        raise BertforgeError(_EMPTY_CORPUS)
    lengths = np.diff(sentence_offsets)  # (S,)
    assert (lengths >= 0).all(), "sentence_offsets must be non-decreasing"
    keep = lengths > 0  # (S,)
    starts = sentence_offsets[:-1][keep]  # (S',)
    ends = sentence_offsets[1:][keep]  # (S',)
    # Non-empty sentences before each document boundary; documents that lost them all are dropped.
    kept_before = np.concatenate([[0], np.cumsum(keep)])[document_offsets]  # (D+1,)
    nonempty = np.diff(kept_before) > 0  # (D,)
    if starts.size == 0 or not nonempty.any():
        raise BertforgeError(_EMPTY_CORPUS)
    return starts, ends, kept_before[:-1][nonempty], kept_before[1:][nonempty]


def _nsp_chunks(
    shards: Any, max_num_tokens: int, short_seq_prob: float, rng: np.random.Generator
) -> np.ndarray:
    """Google's chunking, untruncated: (N, 7) int64 rows `(a_start, a_end, b_start, b_end, nsp_label,
    target, sentences)`, a pair table's five columns and then how the chunk was drawn (`build_pairs`
    keeps the five). All documents of two sentences or more advance in lockstep, one vectorized chunk
    per document a round, and a random B comes from another of them: drawn from every document, as
    Google draws, a corpus of many one-sentence documents (a table's rows beside articles) would give
    nearly every random B from those, and NSP would learn to tell the kinds of text apart."""
    starts, ends, doc_first, doc_stop = _sentence_table(shards)  # (S,) tokens, (D,) sentences
    num_docs = doc_first.size
    if num_docs < 2:
        raise BertforgeError(_ONE_DOCUMENT)
    doc_sentences = doc_stop - doc_first  # (D,)

    # Google draws the target once per document: usually the full length, sometimes shorter.
    short = rng.random(num_docs) < short_seq_prob  # (D,)
    target = np.where(short, rng.integers(2, max_num_tokens + 1, size=num_docs), max_num_tokens)  # (D,)

    cursor = doc_first.copy()  # (D,) next sentence of each document
    active = np.flatnonzero(doc_sentences > 1)  # documents with sentences left
    partners = active if active.size > 1 else np.arange(num_docs)  # (P,) where a random B comes from
    last_sentence = starts.size - 1
    pieces: list[np.ndarray] = []
    while active.size:
        k = active.size
        s, stop, t = cursor[active], doc_stop[active], target[active]  # (k,)
        # The chunk ends at the first sentence that brings it to the target, or the document's end.
        j = np.clip(np.searchsorted(ends, starts[s] + t), s, stop - 1)  # (k,) last sentence
        wants_next = rng.random(k) >= 0.5  # (k,) the fair coin: B is the true continuation
        # Google gives a one-sentence chunk a random B whatever the coin says, which leaves IsNext
        # near 46% on WikiText. Give it its continuation instead: the document's next sentence,
        # or, at the document's end, the sentence before it as A (these documents have two or more).
        lone = wants_next & (j == s)  # (k,)
        forward = lone & (s + 1 < stop)  # (k,)
        backward = lone & ~forward & (s > doc_first[active])  # (k,)
        j = np.where(forward, s + 1, j)
        s = np.where(backward, s - 1, s)
        n = j - s + 1  # (k,) sentences in the chunk
        a = rng.integers(1, np.maximum(n, 2))  # (k,) sentences in A: U[1, n-1], or 1
        a_start, a_end = starts[s], ends[s + a - 1]  # (k,)
        random_next = (n == 1) | ~wants_next  # (k,)

        # A random B: a random document other than this one (shift the draw past it), a random
        # first sentence, whole sentences until the remaining target is reached or the document ends.
        other = rng.integers(0, partners.size - 1, size=k)  # (k,) an index into partners
        other = partners[other + (other >= np.searchsorted(partners, active))]  # skips this document
        r_first = doc_first[other] + rng.integers(0, doc_sentences[other])  # (k,)
        b_target = t - (a_end - a_start)  # (k,) may be <= 0: B still takes one sentence
        r_last = np.clip(np.searchsorted(ends, starts[r_first] + b_target), r_first, doc_stop[other] - 1)

        next_first = np.minimum(s + a, last_sentence)  # (k,) only used where B is the true next
        b_start = np.where(random_next, starts[r_first], starts[next_first])  # (k,)
        b_end = np.where(random_next, ends[r_last], ends[j])  # (k,)
        label = np.where(random_next, RANDOM_NEXT, IS_NEXT)  # (k,)
        pieces.append(np.stack([a_start, a_end, b_start, b_end, label, t, n], axis=1))  # (k, 7)

        # Random B leaves the chunk's unused sentences for the next chunk ("put them back").
        cursor[active] = np.where(random_next, s + a, j + 1)
        active = active[cursor[active] < stop]
    return np.concatenate(pieces or [np.empty((0, 7))]).astype(np.int64)  # (N, 7)


def _truncation_cuts(
    len_a: np.ndarray, len_b: np.ndarray, max_num_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """Tokens Google's `truncate_seq_pair` removes from A and from B, in closed form.

    Google trims A while it is longer and B otherwise, one token at a time (B on ties: `tokens_a if
    len(tokens_a) > len(tokens_b) else tokens_b`). So A alone loses the excess if it stays at least
    as long as B, B alone if it stays at least A's length minus one, and otherwise both end at half
    the budget, A with the odd token.
    """
    excess = np.maximum(len_a + len_b - max_num_tokens, 0)  # (N,)
    half_a = (max_num_tokens + 1) // 2  # A's length when both sides are trimmed
    only_a, only_b = len_a - excess >= len_b, len_b - excess >= len_a - 1
    cut_a = np.where(only_a, excess, np.where(only_b, 0, len_a - half_a))
    cut_b = excess - cut_a
    return cut_a, cut_b


def _truncate_pairs(rows: np.ndarray, max_num_tokens: int, rng: np.random.Generator) -> None:
    """Truncate every pair in place so that len(A) + len(B) <= max_num_tokens.

    Each removed token comes off the front or the back with probability 1/2, so the number taken
    from the front of a side is Binomial(cut, 1/2).
    """
    cut_a, cut_b = _truncation_cuts(rows[:, 1] - rows[:, 0], rows[:, 3] - rows[:, 2], max_num_tokens)
    front_a = rng.binomial(cut_a, 0.5)  # (N,)
    front_b = rng.binomial(cut_b, 0.5)  # (N,)
    rows[:, 0] += front_a
    rows[:, 1] -= cut_a - front_a
    rows[:, 2] += front_b
    rows[:, 3] -= cut_b - front_b


def _mlm_windows(shards: Any, window: int, rng: np.random.Generator) -> np.ndarray:
    """MLM-only rows: each document cut into consecutive windows of `window` tokens.

    A document longer than one window gets a random first piece of 1..window tokens, so the
    boundaries move between epochs; the first and last pieces are shorter than a window.
    """
    starts, ends, doc_first, doc_stop = _sentence_table(shards)
    doc_start = starts[doc_first]  # (D,)
    owner, low, high = _pieces(ends[doc_stop - 1] - doc_start, window, rng)  # (N,) each
    return _window_rows(doc_start[owner] + low, doc_start[owner] + high)


def _pieces(length: np.ndarray, window: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Spans of `length` (L,) cut into consecutive pieces of `window`, a span longer than one window
    with a random first piece of 1..window: each piece's span (N,) and its start and end in it (N,)."""
    first = np.where(length <= window, length, rng.integers(1, window + 1, size=length.size))  # (L,)
    count = 1 + -(-(length - first) // window)  # (L,) 1 + ceil(rest / window)
    owner = np.repeat(np.arange(length.size), count)  # (N,)
    piece = np.arange(owner.size) - np.repeat(np.cumsum(count) - count, count)  # (N,) index in span
    low = np.where(piece == 0, 0, first[owner] + (piece - 1) * window)  # (N,)
    high = np.minimum(first[owner] + piece * window, length[owner])  # (N,)
    return owner, low, high


def _lone_sentence_windows(
    shards: Any, window: int, rng: np.random.Generator, cross_documents: bool
) -> np.ndarray:
    """MLM-only rows for the documents of one sentence, which NSP cannot pair with a continuation.

    Across documents, each run of consecutive one-sentence documents is a stream with a `[SEP]`
    between them, cut into windows of `window` positions as `_stream_windows` cuts the whole corpus;
    otherwise each such document is cut on its own. No draw is made when there is no such document.
    """
    starts, ends, doc_first, doc_stop = _sentence_table(shards)
    lone = np.flatnonzero(doc_stop - doc_first == 1)  # (K,) document indices
    if lone.size == 0:
        return np.empty((0, 5), dtype=np.int64)
    sentence = doc_first[lone]  # (K,) each document's one sentence
    token_start, length = starts[sentence], ends[sentence] - starts[sentence]  # (K,)
    new_run = np.diff(lone, prepend=-2) != 1 if cross_documents else np.ones(lone.size, dtype=bool)  # (K,)
    separator = np.append(~new_run[1:], False)  # (K,) a [SEP] after the document, inside its run
    position = np.concatenate([[0], np.cumsum(length + separator)])  # (K+1,) stream position of each
    run_first = np.flatnonzero(new_run)  # (R,)
    run_stop = np.append(run_first[1:], lone.size)  # (R,)
    owner, low, high = _pieces(position[run_stop] - position[run_first], window, rng)  # (N,)
    low, high = low + position[run_first][owner], high + position[run_first][owner]  # stream positions

    def token_at(stream: np.ndarray, side: str) -> np.ndarray:
        """The token index a window edge stands at; an end at a document's start is the previous one's end."""
        k = np.searchsorted(position[:-1], stream, side=side) - 1  # (N,)
        return token_start[k] + np.minimum(stream - position[k], length[k])

    a_start, a_end = token_at(low, "right"), token_at(high, "left")  # (N,)
    keep = a_end > a_start  # a one-position window on a separator holds no token
    return _window_rows(a_start[keep], a_end[keep])


def document_ends(shards: Any) -> np.ndarray:
    """The token index after each non-empty document: (D,) int64, increasing."""
    _, ends, _, doc_stop = _sentence_table(shards)
    return ends[doc_stop - 1]


def _stream_windows(shards: Any, window: int, rng: np.random.Generator) -> np.ndarray:
    """MLM-only rows across documents: windows of `window` positions of the stream in which each
    document but the last is followed by a `[SEP]`, mapped back to token ranges (a window holding
    k separators covers `window - k` tokens).

    As in `_mlm_windows`, a random first piece of 1..window positions moves the boundaries between
    epochs and every token is in one window; only the first and last windows are shorter.
    """
    ends = document_ends(shards)  # (D,)
    separators = ends[:-1] + np.arange(ends.size - 1)  # (D-1,) stream positions of the inner [SEP]s
    total = int(ends[-1]) + ends.size - 1  # stream length
    first = int(rng.integers(1, window + 1)) if total > window else total
    edges = np.concatenate([[0], np.arange(first, total, window), [total]])  # (N+1,) stream positions
    # A stream position p has p - (separators before it) tokens before it.
    token_edges = edges - np.searchsorted(separators, edges)  # (N+1,)
    a_start, a_end = token_edges[:-1], token_edges[1:]  # (N,)
    keep = a_end > a_start  # a one-position window on a separator holds no token
    return _window_rows(a_start[keep], a_end[keep])


def _window_rows(a_start: np.ndarray, a_end: np.ndarray) -> np.ndarray:
    """MLM-only pair-table rows (N, 5): A's range, no B, the label -1."""
    zeros = np.zeros_like(a_start)
    return np.stack([a_start, a_end, zeros, zeros, np.full_like(a_start, NO_NSP)], axis=1)


class PairDataset(torch.utils.data.Dataset):
    """Rows of a pair table as `[CLS] A [SEP] B [SEP]` (or `[CLS] A [SEP]`) examples.

    Items are dicts of numpy arrays for `masking.MaskingCollator`: `input_ids` and
    `token_type_ids` (int64, 0 up to and including the first [SEP], 1 after), and `nsp_label`.
    An MLM-only A that spans documents gets a `[SEP]` after each document that ends inside it.
    """

    def __init__(
        self, shards: Any, pairs: np.ndarray, cls_id: int, sep_id: int, ends: np.ndarray | None = None
    ):
        """`ends`: `document_ends(shards)`, which a caller that builds a dataset every epoch computes once."""
        pairs = np.asarray(pairs, dtype=np.int64)
        assert pairs.ndim == 2 and pairs.shape[1] == 5, f"pairs must be (N, 5), got {pairs.shape}"
        self.tokens = shards.tokens
        self.pairs = pairs
        self.cls_id = int(cls_id)
        self.sep_id = int(sep_id)
        if ends is None:  # only MLM-only windows read them
            ends = document_ends(shards) if (pairs[:, 4] == NO_NSP).any() else np.empty(0, np.int64)
        self.document_ends = ends

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict:
        a_start, a_end, b_start, b_end, label = (int(v) for v in self.pairs[index])
        if label == NO_NSP:
            return self._window(a_start, a_end)
        first_sep = a_end - a_start + 1
        length = first_sep + 1 + b_end - b_start + 1
        input_ids = np.empty(length, dtype=np.int64)  # (T,)
        input_ids[0] = self.cls_id
        input_ids[1:first_sep] = self.tokens[a_start:a_end]
        input_ids[first_sep] = self.sep_id
        input_ids[first_sep + 1 : length - 1] = self.tokens[b_start:b_end]
        input_ids[length - 1] = self.sep_id
        token_type_ids = np.zeros(length, dtype=np.int64)  # (T,)
        token_type_ids[first_sep + 1 :] = 1
        return {"input_ids": input_ids, "token_type_ids": token_type_ids, "nsp_label": label}

    def _window(self, start: int, end: int) -> dict:
        """`[CLS] tokens [SEP]`, with a `[SEP]` after each document that ends inside the tokens."""
        first, last = np.searchsorted(self.document_ends, [start + 1, end])  # ends in (start, end)
        inside = self.document_ends[first:last] - start  # (K,) positions in the tokens
        text = np.insert(np.asarray(self.tokens[start:end], dtype=np.int64), inside, self.sep_id)  # (n+K,)
        input_ids = np.concatenate([[self.cls_id], text, [self.sep_id]])  # (T,)
        return {"input_ids": input_ids, "token_type_ids": np.zeros_like(input_ids), "nsp_label": NO_NSP}
