"""`train.embedding_init = "cooccurrence"`: word embeddings started from the corpus's PPMI-SVD vectors."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import HF_TINY_SIZES, tiny_config

from bertforge import embedding_init
from bertforge.cache import cached_shards, default_cache_dir
from bertforge.checkpoint import read_weights
from bertforge.config import ModelConfig, RunConfig
from bertforge.embedding_init import cooccurrence_embeddings
from bertforge.model import BertForPreTraining
from bertforge.pretrain import init_word_embeddings, pretrain
from bertforge.tokenizer import load_tokenizer

SPECIALS = (0, 1, 2, 3, 4)


def two_topic_corpus(length: int = 20_000) -> SimpleNamespace:
    """Tokens 10-19 and 20-29 as two topics: each position draws a topic and then a word of it, in
    runs of 8. Token 30 (and every id above) never occurs."""
    rng = np.random.default_rng(0)
    runs = rng.integers(0, 2, size=length // 8).repeat(8)  # topic of each position
    tokens = (10 + 10 * runs + rng.integers(0, 10, size=len(runs))).astype(np.uint16)
    return SimpleNamespace(tokens=tokens, num_tokens=len(tokens), vocab_size=40)


def cosine(vectors: torch.Tensor, a: int, b: int) -> float:
    return torch.nn.functional.cosine_similarity(vectors[a], vectors[b], dim=0).item()


def test_words_of_one_topic_start_close_and_of_two_topics_apart():
    vectors = cooccurrence_embeddings(two_topic_corpus(), dim=8, std=0.02, special_ids=SPECIALS, seed=1)
    same = [cosine(vectors, a, b) for a, b in [(10, 11), (12, 19), (20, 25), (21, 29)]]
    apart = [cosine(vectors, a, b) for a, b in [(10, 20), (15, 25), (19, 21)]]
    assert min(same) > 0.8, same
    assert max(apart) < 0.2, apart


def test_scale_is_the_initialiser_range_and_unseen_or_special_rows_are_random_draws():
    vectors = cooccurrence_embeddings(two_topic_corpus(), dim=8, std=0.05, special_ids=SPECIALS, seed=1)
    assert vectors.shape == (40, 8)
    assert vectors[10:30].std().item() == pytest.approx(0.05, rel=1e-4)
    drawn = vectors[list(SPECIALS) + list(range(30, 40))]
    assert drawn.std().item() == pytest.approx(0.05, rel=0.3)  # N(0, std): 120 draws
    assert torch.linalg.matrix_rank(drawn) == 8  # not zeros, not copies of one vector
    again = cooccurrence_embeddings(two_topic_corpus(), dim=8, std=0.05, special_ids=SPECIALS, seed=1)
    assert torch.equal(vectors, again)  # the seed fixes the random rows and the SVD's projection


def test_the_tied_decoder_starts_from_the_vectors():
    model = BertForPreTraining(ModelConfig(**HF_TINY_SIZES))  # 99 tokens, hidden 32
    corpus = two_topic_corpus()
    corpus.vocab_size = 99
    config = RunConfig(model=ModelConfig(**HF_TINY_SIZES))
    init_word_embeddings(model, corpus, SPECIALS, config)
    expected = cooccurrence_embeddings(corpus, 32, 0.02, SPECIALS, config.runtime.seed)
    assert torch.equal(model.bert.embeddings.word_embeddings.weight.detach(), expected)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_pretrain_starts_from_the_vectors_of_its_own_corpus(tmp_path, wiki_slice, small_tokenizer_dir):
    """A run with the setting starts from the vectors of its training text (a 1-step run at a
    negligible LR ends where it started), and records the setting in its config."""
    config = tiny_config(wiki_slice, max_steps=1, learning_rate=1e-9)
    config.train.embedding_init = "cooccurrence"
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    tokenizer = load_tokenizer(tmp_path / "run" / "tokenizer")
    shards = cached_shards(wiki_slice, tokenizer, "auto", default_cache_dir(), show_progress=False)
    expected = cooccurrence_embeddings(shards, 32, 0.02, tokenizer.special_ids, config.runtime.seed)
    weights = read_weights(tmp_path / "run" / "final" / "model.safetensors")
    embeddings = weights["bert.embeddings.word_embeddings.weight"][: len(expected)]
    torch.testing.assert_close(embeddings, expected, rtol=0, atol=1e-6)
    saved = json.loads((tmp_path / "run" / "config.json").read_text(encoding="utf-8"))
    assert saved["train"]["embedding_init"] == "cooccurrence"


def test_a_large_corpus_is_sampled_in_blocks_spread_over_it(monkeypatch):
    monkeypatch.setattr(embedding_init, "BLOCK", 1000)
    monkeypatch.setattr(embedding_init, "MAX_TOKENS", 3000)
    tokens = np.arange(10_000, dtype=np.uint16)  # each token its own position
    corpus = SimpleNamespace(tokens=tokens, num_tokens=len(tokens), vocab_size=10_000)
    blocks = list(embedding_init._sampled_blocks(corpus))
    assert [len(block) for block in blocks] == [1000, 1000, 1000]
    assert blocks[0][0] == 0 and blocks[-1][-1] == 9_999  # the first block, the last, one between
    assert 1000 <= blocks[1][0] <= 8000


def test_the_context_count_keeps_the_count_matrix_small(monkeypatch):
    shapes = []
    ppmi_svd = embedding_init._ppmi_svd
    monkeypatch.setattr(
        embedding_init,
        "_ppmi_svd",
        lambda counts, *rest: shapes.append(counts.shape) or ppmi_svd(counts, *rest),
    )
    corpus = two_topic_corpus()
    corpus.vocab_size = 2**20  # ids up to a million: at most 2^25 / 2^20 = 32 contexts
    vectors = cooccurrence_embeddings(corpus, dim=8, std=0.02, special_ids=SPECIALS, seed=1)
    assert shapes == [(2**20, 20)]  # the 20 tokens that occur: under the cap of 32
    corpus.vocab_size = 2**21  # at most 16 contexts: the 16 most frequent of the 20
    cooccurrence_embeddings(corpus, dim=8, std=0.02, special_ids=SPECIALS, seed=1)
    assert shapes[-1] == (2**21, 16)
    assert vectors.shape == (2**20, 8)
