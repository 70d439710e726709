"""`train.embedding_init = "window_model"`: BERT started as a count-based window model
(`bertforge.window_init`): at step 0 it fills a mask from the corpus's neighbour statistics."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import corpus_of, metrics_lines, tiny_config

from bertforge.config import RunConfig
from bertforge.model import BertForPreTraining
from bertforge.pretrain import init_mlm_bias, pretrain
from bertforge.window_init import (
    SMOOTHING,
    head_offsets,
    init_window_model,
    offset_pmi,
    position_frequencies,
    rotation,
)

SPECIALS = (0, 1, 2, 3, 4)  # pad, unk, cls, sep, mask
CLS, SEP, MASK = 2, 3, 4
VOCAB = 40


def pair_corpus(pairs: int = 6000) -> SimpleNamespace:
    """Word pairs (a, a + 10), a drawn from 10-19: each first word says what follows it, each second
    word what went before it, and nothing else is predictable."""
    first = np.random.default_rng(0).integers(10, 20, size=pairs)
    return corpus_of(np.stack([first, first + 10], 1).reshape(-1), vocab_size=VOCAB)


def small_config(heads: int = 2, layers: int = 2) -> RunConfig:
    config = RunConfig()
    m = config.model
    m.vocab_size, m.hidden_size, m.num_attention_heads = VOCAB, 64, heads
    m.num_hidden_layers, m.intermediate_size, m.max_position_embeddings = layers, 64, 64
    config.data.max_seq_length = 64 // heads
    return config


def window_model(corpus: SimpleNamespace | None = None, heads: int = 2) -> BertForPreTraining:
    """A BERT of `small_config` started as the window model of `corpus` (the pair corpus if none)."""
    corpus = pair_corpus() if corpus is None else corpus
    config = small_config(heads)
    torch.manual_seed(0)
    model = BertForPreTraining(config.model)
    init_mlm_bias(model, corpus, SPECIALS)  # as `pretrain` does: tokens never seen score low
    init_window_model(model, corpus, SPECIALS, config)
    return model.eval()


def test_heads_read_the_nearest_neighbours_first():
    assert head_offsets(2) == [-1, 1]
    assert head_offsets(4) == [-1, 1, -2, 2]
    assert head_offsets(5) == [-1, 1, -2, 2, -3]


@pytest.mark.parametrize("offset", [-2, -1, 1, 3])
def test_rotation_moves_a_position_by_the_offset(offset):
    width = 16
    angle = torch.arange(20, dtype=torch.float32)[:, None] * position_frequencies(width)
    sinusoids = torch.cat([torch.cos(angle), torch.sin(angle)], 1)  # (20, 16)
    moved = sinusoids[5:12] @ rotation(width, offset).T
    torch.testing.assert_close(moved, sinusoids[5 + offset : 12 + offset], atol=1e-5, rtol=0)


def test_offset_pmi_is_the_smoothed_log_ratio_of_counts():
    tokens = np.random.default_rng(1).integers(5, 12, size=400)
    counts = np.bincount(tokens, minlength=12)
    contexts = np.array([7, 5, 11])
    pmi = offset_pmi([tokens.astype(np.int64)], counts, contexts, offset=-2)
    prior = (counts + 0.5) / (counts + 0.5).sum()
    for w in (5, 8, 11):
        for column, c in enumerate(contexts):
            pairs = sum(1 for i in range(2, len(tokens)) if tokens[i] == w and tokens[i - 2] == c)
            expected = math.log((pairs + SMOOTHING * prior[c]) / (counts[w] + SMOOTHING)) - math.log(prior[c])
            assert pmi[w, column].item() == pytest.approx(expected, abs=1e-4)


def skewed_pair_corpus(pairs: int = 6000) -> SimpleNamespace:
    """As `pair_corpus`, with the first word 10 half of the time: its pair 20 is ten times as
    frequent as the others (a corpus's frequent and rare words)."""
    rng = np.random.default_rng(0)
    first = np.where(rng.random(pairs) < 0.5, 10, rng.integers(11, 20, size=pairs))
    return corpus_of(np.stack([first, first + 10], 1).reshape(-1), vocab_size=VOCAB)


def test_word_vectors_share_one_norm_and_special_tokens_have_none():
    """One norm for every word seen, frequent or rare, so that LayerNorm leaves each token the same
    position part (the attention to a neighbour depends on it); [MASK] and the others carry nothing."""
    model = window_model(skewed_pair_corpus())
    norms = model.bert.embeddings.word_embeddings.weight.norm(dim=1)
    seen = list(range(10, 30))
    expected = small_config().model.initializer_range * math.sqrt(32)  # as N(0, std) in the 32 word dims
    torch.testing.assert_close(norms[seen], torch.full((20,), expected), rtol=1e-4, atol=0)
    assert norms[list(SPECIALS) + [5, 30]].max().item() == 0.0  # 5 and 30 never occur


@pytest.mark.parametrize("corpus", [pair_corpus, skewed_pair_corpus])
def test_layer_one_heads_attend_to_their_neighbour(corpus):
    """At every position, masked ones included, and whether the neighbour is a frequent word or not."""
    model = window_model(corpus())
    ids = torch.tensor([[CLS, 12, 22, 10, MASK, 11, 21, MASK, 20, 13, 23, SEP]])
    embeddings = model.bert.embeddings(ids)  # (1, T, H)
    attention = model.bert.encoder.layer[0].attention.self
    head_dim = attention.head_dim
    q = attention.query(embeddings).view(1, -1, 2, head_dim).transpose(1, 2)
    k = attention.key(embeddings).view(1, -1, 2, head_dim).transpose(1, 2)
    weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head_dim), -1)[0]  # (heads, T, T)
    for head, offset in enumerate(head_offsets(2)):
        for i in range(2, 10):
            assert weights[head, i, i + offset].item() > 0.95, (head, i, weights[head, i])


def test_at_step_zero_a_mask_is_filled_from_its_neighbours():
    """Before any training: the word after a first word is its pair, the word before a second word
    is its pair, for every pair (the step-0 comparison with the co-occurrence init is the last test)."""
    model = window_model()
    hits = 0
    for a in range(10, 20):
        after = torch.tensor([[CLS, 13, 23, a, MASK, 16, 26, SEP]])
        before = torch.tensor([[CLS, 13, 23, MASK, a + 10, 16, 26, SEP]])
        for ids, position, answer in ((after, 4, a + 10), (before, 3, a)):
            with torch.no_grad():
                logits, _ = model(ids)
            hits += int(logits[0, position].argmax().item() == answer)
    assert hits == 20


def test_other_layers_keep_berts_initialisation_and_the_weights_are_finite():
    model = window_model()
    second = model.bert.encoder.layer[1]
    assert 0.015 < second.attention.output.dense.weight.std().item() < 0.025
    assert 0.015 < second.output.dense.weight.std().item() < 0.025
    assert torch.count_nonzero(model.bert.encoder.layer[0].output.dense.weight) == 0
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("tokens", [[7] * 200, [7, 8] * 100])
def test_a_corpus_with_nothing_to_count_gives_finite_weights(tokens):
    """One word repeated, or two alternating: the PMI is (nearly) all zero, and the init must not
    divide by it."""
    model = window_model(corpus_of(np.array(tokens), vocab_size=VOCAB))
    assert all(torch.isfinite(p).all() for p in model.parameters())


FIRST = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
SECOND = ["apple", "banana", "cherry", "damson", "elder", "fig", "grape", "hazel", "iris", "juniper"]


def pair_text(path, sentences: int, seed: int) -> str:
    """Sentences of six word pairs ("alpha apple", "echo elder", ...), ten sentences a document."""
    rng = np.random.default_rng(seed)
    lines = []
    for n in range(sentences):
        pairs = rng.integers(0, 10, size=6)
        lines.append(" ".join(f"{FIRST[i]} {SECOND[i]}" for i in pairs) + " .\n")
        if n % 10 == 9:
            lines.append("\n")
    path.write_text("".join(lines), encoding="utf-8")
    return str(path)


def test_a_pretraining_run_starts_from_the_counts(tmp_path):
    """Through `pretrain`: the held-out MLM accuracy at step 0, before any update, is that of the
    pairs' counts with the window model, and near chance with the co-occurrence init alone."""
    corpus, valid = pair_text(tmp_path / "train.txt", 3000, 0), pair_text(tmp_path / "valid.txt", 300, 1)
    accuracy = {}
    for init in ("cooccurrence", "window_model"):
        config = tiny_config(corpus, valid, max_steps=1, eval_every=1, embedding_init=init)
        config.model.hidden_size, config.model.num_attention_heads = 128, 2  # heads of 64: 64 positions
        config.tokenizer.vocab_size = 200
        config.data.nsp = False  # one-line sentences: the test is about the MLM head
        pretrain(config, tmp_path / init, show_progress=False)
        accuracy[init] = metrics_lines(tmp_path / init, "valid")[0]["mlm_accuracy"]
    assert accuracy["window_model"] > 0.8 and accuracy["cooccurrence"] < 0.3, accuracy
