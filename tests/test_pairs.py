"""Pair building (Google's NSP chunking, MLM-only windows) and PairDataset layout."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from bertforge.config import RunConfig, validate
from bertforge.errors import BertforgeError
from bertforge.pairs import (
    IS_NEXT,
    NO_NSP,
    RANDOM_NEXT,
    PairDataset,
    _nsp_chunks,
    _truncation_cuts,
    build_pairs,
)

MAX_LEN = 64
SHORT = 0.1
CLS, SEP = 2, 3


@dataclass
class FakeShards:
    tokens: np.ndarray
    sentence_offsets: np.ndarray
    document_offsets: np.ndarray


def make_shards(num_docs=2000, max_sentences=30, min_len=3, max_len=40, seed=0) -> FakeShards:
    rng = np.random.default_rng(seed)
    return shards_of(rng.integers(1, max_sentences + 1, num_docs), min_len, max_len, rng)


def shards_of(sentences_per_doc, min_len, max_len, rng) -> FakeShards:
    sentences_per_doc = np.asarray(sentences_per_doc)
    sentence_lengths = rng.integers(min_len, max_len + 1, sentences_per_doc.sum())
    sentence_offsets = np.concatenate([[0], np.cumsum(sentence_lengths)]).astype(np.int64)
    document_offsets = np.concatenate([[0], np.cumsum(sentences_per_doc)]).astype(np.int64)
    tokens = rng.integers(5, 30000, sentence_offsets[-1]).astype(np.uint16)
    return FakeShards(tokens, sentence_offsets, document_offsets)


@pytest.fixture(scope="module")
def shards() -> FakeShards:
    return make_shards()


@pytest.fixture(scope="module")
def table(shards) -> np.ndarray:
    """A whole NSP epoch: the pairs, and MLM-only windows for the one-sentence documents."""
    return build_pairs(shards, MAX_LEN, SHORT, nsp=True, seed=7, epoch=0)


@pytest.fixture(scope="module")
def pairs(table) -> np.ndarray:
    return table[table[:, 4] != NO_NSP]


def document_of(shards: FakeShards, positions: np.ndarray) -> np.ndarray:
    doc_token_starts = shards.sentence_offsets[shards.document_offsets]
    return np.searchsorted(doc_token_starts, positions, side="right") - 1


def chunk_columns(chunks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_nsp_chunks`' table as its pair rows (N, 5), target lengths (N,) and sentences per chunk (N,)."""
    return chunks[:, :5], chunks[:, 5], chunks[:, 6]


def test_nsp_pairs_are_many_and_in_bounds(pairs):
    assert pairs.dtype == np.int64 and pairs.shape[1] == 5
    assert len(pairs) >= 10_000
    len_a, len_b = pairs[:, 1] - pairs[:, 0], pairs[:, 3] - pairs[:, 2]
    assert (len_a >= 1).all() and (len_b >= 1).all()
    assert (len_a + len_b + 3 <= MAX_LEN).all()
    assert set(np.unique(pairs[:, 4])) == {IS_NEXT, RANDOM_NEXT}
    # Most pairs fill the sequence: the target is usually the full length.
    assert np.median(len_a + len_b) >= 0.9 * (MAX_LEN - 3)


def test_nsp_label_balance(shards, pairs):
    # A fair coin for every chunk; only one-sentence documents can offer no continuation.
    assert abs((pairs[:, 4] == IS_NEXT).mean() - 0.5) <= 0.02
    rows, _, sizes = chunk_columns(_nsp_chunks(shards, MAX_LEN - 3, SHORT, np.random.default_rng([7, 0])))
    assert len(rows) == len(pairs)
    one_sentence_docs = np.diff(shards.document_offsets) == 1
    lone_rows = rows[sizes == 1]
    assert (lone_rows[:, 4] == RANDOM_NEXT).all()
    # Every chunk that drew IsNext got its continuation: one-sentence documents start no chunk.
    assert not one_sentence_docs[document_of(shards, rows[:, 0])].any()
    assert len(lone_rows) <= len(rows) // 2 + 3 * np.sqrt(len(rows))
    # The same (seed, epoch) stream: truncation and shuffling keep each row's label.
    assert (np.sort(rows[:, 4]) == np.sort(pairs[:, 4])).all()


def test_one_sentence_chunks_still_get_true_continuations(shards, pairs):
    is_next = pairs[pairs[:, 4] == IS_NEXT]
    # Some IsNext pairs come from a chunk that held one sentence that alone met the target.
    len_a = is_next[:, 1] - is_next[:, 0]
    assert (len_a > 0).all()
    doc = document_of(shards, is_next[:, 0])
    assert (doc == document_of(shards, is_next[:, 3] - 1)).all()


def test_random_next_comes_from_another_document(shards, pairs):
    doc_a_start, doc_a_last = document_of(shards, pairs[:, 0]), document_of(shards, pairs[:, 1] - 1)
    doc_b_start, doc_b_last = document_of(shards, pairs[:, 2]), document_of(shards, pairs[:, 3] - 1)
    assert (doc_a_start == doc_a_last).all() and (doc_b_start == doc_b_last).all()
    random_next = pairs[:, 4] == RANDOM_NEXT
    assert (doc_b_start[random_next] != doc_a_start[random_next]).all()


def test_is_next_continues_a_in_the_same_document(shards, pairs):
    is_next = pairs[pairs[:, 4] == IS_NEXT]
    assert (document_of(shards, is_next[:, 2]) == document_of(shards, is_next[:, 0])).all()
    gap = is_next[:, 2] - is_next[:, 1]
    assert (gap >= 0).all()
    # Tokens between A and B can only be the ones truncation trimmed, and a truncated pair is
    # exactly max_num_tokens long.
    total = (is_next[:, 1] - is_next[:, 0]) + (is_next[:, 3] - is_next[:, 2])
    assert (gap[total < MAX_LEN - 3] == 0).all()
    assert (gap > 0).any()


def test_chunks_follow_googles_rules(shards):
    """Before truncation: whole sentences, chunks that just reach their target, B where it belongs."""
    rows, targets, sizes = chunk_columns(
        _nsp_chunks(shards, MAX_LEN - 3, SHORT, np.random.default_rng([3, 1]))
    )
    offsets = shards.sentence_offsets
    for column in range(4):
        assert np.isin(rows[:, column], offsets).all()  # every boundary is a sentence boundary
    doc_end_tokens = offsets[shards.document_offsets[1:]][document_of(shards, rows[:, 0])]
    is_next = rows[:, 4] == IS_NEXT
    assert (rows[is_next, 2] == rows[is_next, 1]).all()
    # A chunk (A and B when B is the continuation) stops at the first sentence that reaches the
    # target, or at the document's end; without its last sentence it is below the target.
    chunk_end = rows[is_next, 3]
    chunk_len = chunk_end - rows[is_next, 0]
    last_sentence_start = offsets[np.searchsorted(offsets, chunk_end) - 1]
    assert ((chunk_len >= targets[is_next]) | (chunk_end == doc_end_tokens[is_next])).all()
    # ... except a lone sentence that met the target by itself and took its neighbour as B.
    lone = (sizes[is_next] == 2) & (rows[is_next, 1] - rows[is_next, 0] >= targets[is_next])
    assert lone.any()
    assert (last_sentence_start - rows[is_next, 0] < targets[is_next])[~lone].all()
    # A random B takes sentences until it reaches what A left of the target, or its document ends.
    rand = ~is_next
    b_doc = document_of(shards, rows[rand, 2])
    b_end_limit = offsets[shards.document_offsets[1:]][b_doc]
    remaining = targets[rand] - (rows[rand, 1] - rows[rand, 0])
    b_len = rows[rand, 3] - rows[rand, 2]
    assert ((b_len >= remaining) | (rows[rand, 3] == b_end_limit)).all()
    b_last_start = offsets[np.searchsorted(offsets, rows[rand, 3]) - 1]
    assert ((b_last_start == rows[rand, 2]) | (b_last_start - rows[rand, 2] < remaining)).all()
    assert (sizes >= 1).all()


def test_short_targets_drawn_per_document_at_short_seq_prob(shards):
    rows, targets, _ = chunk_columns(_nsp_chunks(shards, MAX_LEN - 3, 0.1, np.random.default_rng([5, 0])))
    docs = document_of(shards, rows[:, 0])
    short_docs = np.unique(docs[targets < MAX_LEN - 3])
    # Google draws the target once per document (shorter with probability short_seq_prob).
    assert abs(short_docs.size / np.unique(docs).size - 0.1) <= 0.03
    assert (targets >= 2).all() and (targets <= MAX_LEN - 3).all()
    assert 0.05 <= (targets < MAX_LEN - 3).mean() <= 0.4  # short documents yield more, shorter pairs
    _, no_short, _ = chunk_columns(_nsp_chunks(shards, MAX_LEN - 3, 0.0, np.random.default_rng([5, 0])))
    assert (no_short == MAX_LEN - 3).all()


def test_truncation_matches_googles_loop():
    rng = np.random.default_rng(0)
    len_a, len_b = rng.integers(1, 120, 3000), rng.integers(1, 120, 3000)
    budgets = rng.integers(2, 130, 3000)
    for a0, b0, budget in zip(len_a, len_b, budgets, strict=True):
        a, b = int(a0), int(b0)
        while a + b > budget:  # Google: tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
            if a > b:
                a -= 1
            else:
                b -= 1
        cut_a, cut_b = _truncation_cuts(np.array([a0]), np.array([b0]), int(budget))
        assert (a0 - cut_a[0], b0 - cut_b[0]) == (a, b)


def test_truncation_trims_both_ends(shards, pairs):
    offsets = shards.sentence_offsets
    trimmed = (pairs[:, 1] - pairs[:, 0]) + (pairs[:, 3] - pairs[:, 2]) == MAX_LEN - 3
    starts_mid_sentence = ~np.isin(pairs[trimmed, 0], offsets) | ~np.isin(pairs[trimmed, 2], offsets)
    ends_mid_sentence = ~np.isin(pairs[trimmed, 1], offsets) | ~np.isin(pairs[trimmed, 3], offsets)
    front, back = starts_mid_sentence.mean(), ends_mid_sentence.mean()
    assert front > 0.2 and back > 0.2 and abs(front - back) < 0.1


def test_pair_dataset_layout(shards, pairs):
    dataset = PairDataset(shards, pairs, cls_id=CLS, sep_id=SEP)
    assert len(dataset) == len(pairs)
    for index in range(0, len(pairs), 997):
        a_start, a_end, b_start, b_end, label = pairs[index]
        item = dataset[index]
        ids, types = item["input_ids"], item["token_type_ids"]
        len_a, len_b = a_end - a_start, b_end - b_start
        assert ids.dtype == np.int64 and types.dtype == np.int64
        assert len(ids) == len(types) == len_a + len_b + 3 <= MAX_LEN
        assert ids[0] == CLS and ids[len_a + 1] == SEP and ids[-1] == SEP
        assert (ids[1 : len_a + 1] == shards.tokens[a_start:a_end]).all()
        assert (ids[len_a + 2 : -1] == shards.tokens[b_start:b_end]).all()
        assert (types[: len_a + 2] == 0).all() and (types[len_a + 2 :] == 1).all()
        assert item["nsp_label"] == label and isinstance(item["nsp_label"], int)


def test_deterministic_per_epoch_and_different_across_epochs(shards, table):
    again = build_pairs(shards, MAX_LEN, SHORT, nsp=True, seed=7, epoch=0)
    assert np.array_equal(table, again)
    next_epoch = build_pairs(shards, MAX_LEN, SHORT, nsp=True, seed=7, epoch=1)
    other_seed = build_pairs(shards, MAX_LEN, SHORT, nsp=True, seed=8, epoch=0)
    for other in (next_epoch, other_seed):
        assert other.shape != table.shape or not np.array_equal(np.sort(other, 0), np.sort(table, 0))
    # Rows are shuffled, not in corpus order, windows among the pairs.
    assert not (np.diff(table[:, 0]) >= 0).all()
    windows = np.flatnonzero(table[:, 4] == NO_NSP)
    assert windows.size > 0 and windows[0] < len(table) - windows.size


@pytest.mark.parametrize("epoch", [0, 1])
def test_mlm_only_windows_cover_each_document_once(shards, epoch):
    rows = build_pairs(shards, MAX_LEN, SHORT, nsp=False, seed=7, epoch=epoch, cross_documents=False)
    assert (rows[:, 2] == 0).all() and (rows[:, 3] == 0).all() and (rows[:, 4] == NO_NSP).all()
    lengths = rows[:, 1] - rows[:, 0]
    assert (lengths >= 1).all() and (lengths <= MAX_LEN - 2).all()
    assert (document_of(shards, rows[:, 0]) == document_of(shards, rows[:, 1] - 1)).all()
    ordered = rows[np.argsort(rows[:, 0])]
    # Windows tile the corpus: each starts where the previous ended, from the first token to the last
    # (documents are adjacent in the fake shards), so every token is covered exactly once.
    assert ordered[0, 0] == 0 and ordered[-1, 1] == len(shards.tokens)
    assert (ordered[1:, 0] == ordered[:-1, 1]).all()
    # Document boundaries are always window boundaries.
    doc_token_starts = shards.sentence_offsets[shards.document_offsets[:-1]]
    assert np.isin(doc_token_starts, ordered[:, 0]).all()
    dataset = PairDataset(shards, rows, cls_id=CLS, sep_id=SEP)
    item = dataset[0]
    assert item["input_ids"][0] == CLS and item["input_ids"][-1] == SEP
    assert len(item["input_ids"]) == lengths[0] + 2 and (item["token_type_ids"] == 0).all()
    assert item["nsp_label"] == NO_NSP


@pytest.mark.parametrize("cross_documents", [True, False])
def test_mlm_only_boundaries_move_between_epochs(shards, cross_documents):
    first = build_pairs(shards, MAX_LEN, SHORT, nsp=False, seed=7, epoch=0, cross_documents=cross_documents)
    second = build_pairs(shards, MAX_LEN, SHORT, nsp=False, seed=7, epoch=1, cross_documents=cross_documents)
    assert not np.array_equal(np.sort(first[:, 0]), np.sort(second[:, 0]))


def stream_of(shards: FakeShards) -> list[int]:
    """The corpus as RoBERTa packs it, written out: each document's tokens, a [SEP] between documents."""
    starts = shards.sentence_offsets[shards.document_offsets]
    documents = [shards.tokens[a:b].tolist() for a, b in zip(starts[:-1], starts[1:], strict=True)]
    return [token for i, document in enumerate(documents) for token in ([SEP] * (i > 0) + document)]


@pytest.mark.parametrize(("docs", "sentences", "epoch"), [(2000, 30, 0), (3000, 1, 1), (1, 30, 0)])
def test_mlm_only_windows_across_documents_are_the_stream_cut_in_pieces(docs, sentences, epoch):
    shards = make_shards(num_docs=docs, max_sentences=sentences, seed=epoch)
    rows = build_pairs(shards, MAX_LEN, SHORT, nsp=False, seed=7, epoch=epoch)
    assert (rows[:, 2] == 0).all() and (rows[:, 3] == 0).all() and (rows[:, 4] == NO_NSP).all()
    rows = rows[np.argsort(rows[:, 0])]
    dataset = PairDataset(shards, rows, cls_id=CLS, sep_id=SEP)
    items = [dataset[i] for i in range(len(dataset))]
    stream = stream_of(shards)
    for (start, *_), item in zip(rows, items, strict=True):
        ids = item["input_ids"]
        assert ids[0] == CLS and ids[-1] == SEP and len(ids) <= MAX_LEN
        assert (item["token_type_ids"] == 0).all()
        # A window's text is a slice of the stream: its [SEP]s sit exactly at document ends.
        at = start + document_of(shards, start)  # one [SEP] before each earlier document
        assert ids[1:-1].tolist() == stream[at : at + len(ids) - 2]
    # Each token is in one window, in order; every window but the first and last is full, however
    # short the documents (less a [SEP] on its edge, which the window's own stands for).
    assert [t for item in items for t in item["input_ids"][1:-1] if t != SEP] == shards.tokens.tolist()
    assert min((len(item["input_ids"]) for item in items[1:-1]), default=MAX_LEN) >= MAX_LEN - 2
    if sentences == 1:  # one sentence a document: within documents, windows hold a sentence each
        within = build_pairs(shards, MAX_LEN, SHORT, nsp=False, seed=7, epoch=epoch, cross_documents=False)
        assert (within[:, 1] - within[:, 0]).mean() < 0.5 * (rows[:, 1] - rows[:, 0]).mean()


def mixed_corpus() -> FakeShards:
    """Articles, then a table's rows (one sentence each), then more articles, then a lone row."""
    rng = np.random.default_rng(4)
    articles = rng.integers(2, 30, 200)
    return shards_of([*articles[:100], *[1] * 600, *articles[100:], 1], 3, 25, rng)


def lone_token_mask(shards: FakeShards) -> np.ndarray:
    """(T,) True for each token of a one-sentence document."""
    doc_starts = shards.sentence_offsets[shards.document_offsets]  # (D+1,)
    return np.repeat(np.diff(shards.document_offsets) == 1, np.diff(doc_starts))


@pytest.mark.parametrize("cross_documents", [True, False])
def test_one_sentence_documents_train_mlm_alone_beside_the_pairs(cross_documents):
    shards = mixed_corpus()
    table = build_pairs(shards, MAX_LEN, SHORT, nsp=True, seed=7, epoch=0, cross_documents=cross_documents)
    windows, pairs = table[table[:, 4] == NO_NSP], table[table[:, 4] != NO_NSP]
    # The windows hold each token of the one-sentence documents once, and no other token.
    covered = np.zeros(len(shards.tokens), dtype=np.int64)
    for start, end in windows[:, :2]:
        covered[start:end] += 1
    assert (covered == lone_token_mask(shards)).all()
    # The pairs are the articles' only, A and a random B alike (drawn from every document, B would
    # nearly always be a row, which NSP tells from an article's sentence), with Google's fair coin
    # (the rows as pairs would have given two thirds of all pairs a random B).
    assert not lone_token_mask(shards)[pairs[:, 0]].any()
    assert not lone_token_mask(shards)[pairs[:, 2]].any()
    assert abs((pairs[:, 4] == IS_NEXT).mean() - 0.5) <= 0.03
    dataset = PairDataset(shards, table, cls_id=CLS, sep_id=SEP)
    doc_ends = shards.sentence_offsets[shards.document_offsets[1:]]
    lengths = []
    for index in np.flatnonzero(table[:, 4] == NO_NSP):
        start, end = table[index, :2]
        ids = dataset[index]["input_ids"]
        assert ids[0] == CLS and ids[-1] == SEP and len(ids) <= MAX_LEN
        text = ids[1:-1]
        assert (text[text != SEP] == shards.tokens[start:end]).all()  # fake tokens are never SEP
        inner_ends = doc_ends[(doc_ends > start) & (doc_ends < end)]
        assert np.count_nonzero(text == SEP) == inner_ends.size  # a [SEP] at each document end inside
        if not cross_documents:
            assert inner_ends.size == 0
        lengths.append(len(ids))
    if cross_documents:  # the table's rows packed: all but the run's first and last windows are full
        assert sorted(lengths)[3] >= MAX_LEN - 2
    else:  # a row a window
        assert len(lengths) == 601


def test_one_article_among_rows_takes_its_random_sentences_from_the_rows():
    rng = np.random.default_rng(5)
    shards = shards_of([40, *[1] * 300], 3, 25, rng)
    pairs = build_pairs(shards, MAX_LEN, SHORT, nsp=True, seed=7, epoch=0)
    pairs = pairs[pairs[:, 4] != NO_NSP]
    random_b = pairs[pairs[:, 4] == RANDOM_NEXT, 2]
    assert random_b.size and lone_token_mask(shards)[random_b].all()
    assert not lone_token_mask(shards)[pairs[:, 0]].any()


def test_a_corpus_of_one_sentence_documents_gives_no_pairs_and_full_windows():
    shards = make_shards(num_docs=3000, max_sentences=1, seed=1)
    table = build_pairs(shards, MAX_LEN, SHORT, nsp=True, seed=7, epoch=0)
    assert (table[:, 4] == NO_NSP).all()
    ordered = table[np.argsort(table[:, 0])]
    assert ordered[0, 0] == 0 and ordered[-1, 1] == len(shards.tokens)
    assert (ordered[1:, 0] == ordered[:-1, 1]).all()  # the windows tile the corpus
    dataset = PairDataset(shards, table, cls_id=CLS, sep_id=SEP)
    # Full but for the first and last window, less a [SEP] on an edge (as the stream's windows).
    full = [len(dataset[i]["input_ids"]) >= MAX_LEN - 2 for i in range(len(dataset))]
    assert sum(full) >= len(full) - 2


def test_empty_sentences_and_documents_are_skipped():
    base = make_shards(num_docs=50, seed=1)
    # Insert empty sentences (repeated offsets) and an empty document.
    offsets = np.insert(base.sentence_offsets, [3, 3, 40], base.sentence_offsets[[3, 3, 40]])
    documents = base.document_offsets.copy()
    documents[documents >= 3] += 2
    documents[documents >= 42] += 1
    documents = np.insert(documents, 5, documents[5])  # an empty document
    shards = FakeShards(base.tokens, offsets, documents)
    for nsp in (True, False):
        rows = build_pairs(shards, 32, SHORT, nsp=nsp, seed=0, epoch=0)
        assert (rows[:, 1] > rows[:, 0]).all()
        if nsp:
            pairs = rows[rows[:, 4] != NO_NSP]
            assert len(pairs) and (pairs[:, 3] > pairs[:, 2]).all()


def test_single_document_and_empty_corpus_raise():
    one = make_shards(num_docs=1, max_sentences=30, seed=2)
    with pytest.raises(BertforgeError, match="only one document.*data.nsp = false"):
        build_pairs(one, MAX_LEN, SHORT, nsp=True, seed=0, epoch=0)
    assert len(build_pairs(one, MAX_LEN, SHORT, nsp=False, seed=0, epoch=0)) >= 1
    empty = FakeShards(np.zeros(0, np.uint16), np.zeros(1, np.int64), np.zeros(1, np.int64))
    all_blank = FakeShards(np.zeros(0, np.uint16), np.zeros(4, np.int64), np.array([0, 3], np.int64))
    for corpus in (empty, all_blank):
        for nsp in (True, False):
            with pytest.raises(BertforgeError, match="empty"):
                build_pairs(corpus, MAX_LEN, SHORT, nsp=nsp, seed=0, epoch=0)


def test_too_short_max_seq_length_is_refused_by_the_config(shards):
    config = RunConfig()
    config.data.max_seq_length = 4
    with pytest.raises(BertforgeError, match="data.max_seq_length must be at least 5"):
        validate(config)
    config.data.nsp, config.data.max_seq_length = False, 2
    with pytest.raises(BertforgeError, match="data.max_seq_length must be at least 3"):
        validate(config)
    with pytest.raises(AssertionError):  # the pair builder trusts a validated config
        build_pairs(shards, 4, SHORT, nsp=True, seed=0, epoch=0)
