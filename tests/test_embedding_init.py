"""`train.embedding_init = "cooccurrence"`: word embeddings started from the corpus's PPMI-SVD vectors."""

from __future__ import annotations

import itertools
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import HF_TINY_SIZES, corpus_of, tiny_config

from bertforge import embedding_init, pretrain
from bertforge.cache import cached_shards, default_cache_dir
from bertforge.checkpoint import read_weights
from bertforge.config import ModelConfig, RunConfig
from bertforge.embedding_init import cooccurrence_embeddings
from bertforge.model import BertForPreTraining
from bertforge.shards import ShardSet
from bertforge.tokenizer import load_tokenizer

SPECIALS = (0, 1, 2, 3, 4)


def two_topic_corpus(length: int = 20_000) -> SimpleNamespace:
    """Tokens 10-19 and 20-29 as two topics: each position draws a topic and then a word of it, in
    runs of 8; word 10 is ten times as frequent as the others of its topic, and the special token 1
    ([UNK]) appears among them. Token 30 (and every id above) never occurs."""
    rng = np.random.default_rng(0)
    topics = rng.integers(0, 2, size=length // 8).repeat(8)
    words = rng.choice(10, size=len(topics), p=np.array([10] + [1] * 9) / 19)
    tokens = 10 + 10 * topics + words
    tokens[::50] = 1
    return corpus_of(tokens)


def cosine(vectors: torch.Tensor, a: int, b: int) -> float:
    return torch.nn.functional.cosine_similarity(vectors[a], vectors[b], dim=0).item()


def test_words_of_one_topic_start_close_and_of_two_topics_apart():
    vectors = cooccurrence_embeddings(two_topic_corpus(), dim=8, std=0.02, special_ids=SPECIALS, seed=1)
    topics = [range(10, 20), range(20, 30)]
    same = [cosine(vectors, a, b) for topic in topics for a, b in itertools.combinations(topic, 2)]
    apart = [cosine(vectors, a, b) for a in topics[0] for b in topics[1]]
    assert min(same) > max(apart) + 0.3, (min(same), max(apart))  # every pair of a topic is nearer
    assert np.mean(same) > 0.6 and abs(np.mean(apart)) < 0.1


def test_window_counts_weigh_each_pair_by_its_distance(monkeypatch):
    monkeypatch.setattr(embedding_init, "WINDOW", 3)
    tokens = np.random.default_rng(1).integers(5, 12, size=300)
    contexts = np.array([7, 5, 11])  # only these are counted as contexts, in this column order
    counts = embedding_init._window_counts(corpus_of(tokens, vocab_size=12), 12, contexts)
    expected = np.zeros((12, 3))
    for i, word in enumerate(tokens):  # every pair within 3 positions, both ways, weighted 1/d
        for j in range(max(0, i - 3), min(len(tokens), i + 4)):
            if j != i and tokens[j] in contexts:
                expected[word, list(contexts).index(tokens[j])] += 1 / abs(i - j)
    np.testing.assert_allclose(counts.numpy(), expected, rtol=1e-6)


def test_ppmi_smooths_the_context_distribution_and_clips_at_zero():
    counts = torch.tensor([[4.0, 0.0, 1.0], [1.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    total = 8.0
    context = np.array([5.0, 2.0, 1.0]) ** 0.75
    context /= context.sum()
    ppmi = embedding_init._ppmi(counts)
    for w in range(3):
        for c in range(3):
            n = counts[w, c].item()
            p_word = counts[w].sum().item() / total
            expected = max(0.0, math.log(n / total / (p_word * context[c]))) if n else 0.0
            assert ppmi[w, c].item() == pytest.approx(expected, abs=1e-6)


def test_scale_and_random_rows_and_columns():
    """Seen tokens are scaled to `std`; special tokens (though they occur), tokens never seen, and
    columns past the PPMI's rank are N(0, std) draws, the same for the same seed."""
    corpus = two_topic_corpus()
    vectors = cooccurrence_embeddings(corpus, dim=32, std=0.05, special_ids=SPECIALS, seed=1)
    drawn = torch.randn(40, 32, generator=torch.Generator().manual_seed(1)) * 0.05
    assert vectors.shape == (40, 32)
    unseen = list(SPECIALS) + list(range(5, 10)) + list(range(30, 40))
    assert torch.equal(vectors[unseen], drawn[unseen])
    rank = 20  # 20 words seen against 20 contexts: at most 20 PPMI directions
    assert vectors[10:30, :rank].std().item() == pytest.approx(0.05, rel=1e-4)
    assert torch.equal(vectors[10:30, rank:], drawn[10:30, rank:])
    again = cooccurrence_embeddings(corpus, dim=32, std=0.05, special_ids=SPECIALS, seed=1)
    assert torch.equal(vectors, again)


def test_the_global_random_state_is_left_alone():
    before = torch.get_rng_state()
    cooccurrence_embeddings(two_topic_corpus(), dim=8, std=0.02, special_ids=SPECIALS, seed=1)
    assert torch.equal(torch.get_rng_state(), before)


def test_a_corpus_with_no_context_gets_random_draws():
    vectors = cooccurrence_embeddings(corpus_of([1, 2, 3, 1]), dim=8, std=0.02, special_ids=SPECIALS, seed=3)
    assert torch.equal(vectors, torch.randn(40, 8, generator=torch.Generator().manual_seed(3)) * 0.02)


def test_the_context_count_keeps_the_count_matrix_small(monkeypatch):
    monkeypatch.setattr(embedding_init, "MAX_CELLS", 40 * 16)  # a 40-token vocabulary: 16 contexts
    shapes = []
    window_counts = embedding_init._window_counts
    monkeypatch.setattr(
        embedding_init,
        "_window_counts",
        lambda *args: shapes.append(args[2]) or window_counts(*args),
    )
    corpus = two_topic_corpus()
    cooccurrence_embeddings(corpus, dim=8, std=0.02, special_ids=SPECIALS, seed=1)
    frequency = np.bincount(corpus.tokens, minlength=40)
    frequency[list(SPECIALS)] = 0
    assert len(shapes[0]) == 16 and set(shapes[0]) <= set(range(10, 30))
    assert frequency[shapes[0]].min() >= np.sort(frequency)[-16]  # the 16 most frequent


def test_a_large_corpus_is_sampled_in_windows_spread_over_its_parts(monkeypatch):
    monkeypatch.setattr(embedding_init, "BLOCK", 1000)
    monkeypatch.setattr(embedding_init, "MAX_TOKENS", 3000)
    parts = []
    for first in (0, 6000):  # two parts, 6,000 and 4,000 tokens, each token its own position
        tokens = np.arange(first, first + (6000 if first == 0 else 4000), dtype=np.uint16)
        parts.append(
            SimpleNamespace(
                tokens=tokens,
                num_tokens=len(tokens),
                num_sentences=1,
                sentence_offsets=np.array([0, len(tokens)]),
                document_offsets=np.array([0, 1]),
                vocab_size=10_000,
                tokenizer_fingerprint="same",
                path="part",
            )
        )
    windows = list(embedding_init.token_windows(ShardSet(parts)))
    assert [(w[0], len(w)) for w in windows] == [(0, 1000), (3333, 1000), (6666, 1000)]
    monkeypatch.setattr(embedding_init, "MAX_TOKENS", 10_000)  # small enough: every part, whole
    assert [len(w) for w in embedding_init.token_windows(ShardSet(parts))] == [6000, 4000]


def test_the_tied_decoder_starts_from_the_vectors():
    model = BertForPreTraining(ModelConfig(**HF_TINY_SIZES))  # 99 tokens, hidden 32
    corpus = two_topic_corpus()
    corpus.vocab_size = 96  # a tokenizer of 96 tokens under a vocabulary padded to 99
    config = RunConfig(model=ModelConfig(**HF_TINY_SIZES))
    untouched = model.bert.embeddings.word_embeddings.weight[96:].detach().clone()
    pretrain.init_word_embeddings(model, corpus, SPECIALS, config)
    expected = cooccurrence_embeddings(corpus, 32, 0.02, SPECIALS, config.runtime.seed)
    assert torch.equal(model.bert.embeddings.word_embeddings.weight[:96].detach(), expected)
    assert torch.equal(model.bert.embeddings.word_embeddings.weight[96:].detach(), untouched)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_pretrain_starts_from_the_vectors_of_its_own_corpus(tmp_path, wiki_slice, small_tokenizer_dir):
    """A run with the setting starts from the vectors of its training text (a 1-step run at a
    negligible LR ends where it started), and records the setting in its config."""
    config = tiny_config(wiki_slice, max_steps=1, learning_rate=1e-9)
    config.train.embedding_init = "cooccurrence"
    pretrain.pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    tokenizer = load_tokenizer(tmp_path / "run" / "tokenizer")
    shards = cached_shards(wiki_slice, tokenizer, "auto", default_cache_dir(), show_progress=False)
    expected = cooccurrence_embeddings(shards, 32, 0.02, tokenizer.special_ids, config.runtime.seed)
    weights = read_weights(tmp_path / "run" / "final" / "model.safetensors")
    embeddings = weights["bert.embeddings.word_embeddings.weight"][: len(expected)]
    torch.testing.assert_close(embeddings, expected, rtol=0, atol=1e-6)
    saved = json.loads((tmp_path / "run" / "config.json").read_text(encoding="utf-8"))
    assert saved["train"]["embedding_init"] == "cooccurrence"


def test_resume_and_init_do_not_start_the_embeddings_again(
    tmp_path, monkeypatch, wiki_slice, small_tokenizer_dir, tiny_pretrained_run
):
    config = tiny_config(wiki_slice, max_steps=4, eval_every=2)
    config.train.embedding_init = "cooccurrence"
    pretrain.pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)

    def refuse(*args, **kwargs):
        raise AssertionError("the word embeddings were started again")

    monkeypatch.setattr(pretrain, "init_word_embeddings", refuse)
    config.train.max_steps = 6
    pretrain.pretrain(config, tmp_path / "run", resume=True, show_progress=False)
    with pytest.warns(UserWarning, match="not applied"):
        pretrain.pretrain(config, tmp_path / "init", init=tiny_pretrained_run / "final", show_progress=False)
