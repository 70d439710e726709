"""Word embeddings started from the corpus's co-occurrence statistics (`train.embedding_init =
"cooccurrence"`), instead of BERT's N(0, 0.02).

Owns `cooccurrence_embeddings`: positive pointwise mutual information (PPMI) between each token and
the most frequent tokens within a few positions of it, reduced to the model's width by a truncated
SVD (Levy, Goldberg & Dagan 2015, "Improving Distributional Similarity with Lessons Learned from
Word Embeddings": context distribution smoothing 0.75, the singular values split evenly between
words and contexts). Tokens that appear in similar contexts then start with similar vectors, and
since BERT ties its MLM decoder to these embeddings, a gradient that raises one word's score at a
masked position raises its neighbours' too: rare words learn from their frequent relatives from
step 0. The vectors are scaled to BERT's initialiser range, so the rest of the network sees the
magnitudes it is initialised for. A few seconds of numpy and one low-rank SVD on WikiText-2.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from bertforge.shards import ShardSet, TokenShards, token_counts

# Levy et al. 2015: a window of a few words both sides, distance-weighted counts (as word2vec's
# dynamic window and GloVe), and context probabilities raised to 0.75 (as word2vec's negative sampling).
WINDOW = 5
CONTEXT_SMOOTHING = 0.75
# Contexts are the most frequent tokens: they carry nearly all of the co-occurrence mass. Their number
# keeps the (vocabulary x contexts) count matrix under 2^25 cells (256 MiB in float64): 4,096
# contexts for 8,192 pieces, 1,099 for 30,522.
MAX_CONTEXTS = 4096
MAX_CELLS = 2**25
# The statistics settle long before a large corpus ends: at most this many tokens are counted, in
# blocks spread evenly over the corpus (WikiText-2's 2.4 M tokens are all counted).
MAX_TOKENS = 20_000_000
BLOCK = 1_000_000


def cooccurrence_embeddings(
    shards: TokenShards | ShardSet,
    dim: int,
    std: float,
    special_ids: Sequence[int],
    seed: int,
) -> torch.Tensor:
    """(vocab_size, dim) float32 vectors: the PPMI-SVD vectors of the tokens seen in `shards`, scaled
    to standard deviation `std`; tokens never seen and `special_ids` get N(0, std) draws."""
    vocab_size = shards.vocab_size
    generator = torch.Generator().manual_seed(seed)
    frequency = token_counts(shards, exclude=special_ids)
    contexts = _context_ids(frequency, min(MAX_CONTEXTS, MAX_CELLS // vocab_size))
    counts = _window_counts(shards, vocab_size, contexts)  # (V, C)
    vectors = _ppmi_svd(counts, dim, generator)  # (V, dim)
    seen = counts.sum(1) > 0
    vectors *= std / vectors[seen].std()
    drawn = torch.randn(vocab_size, dim, generator=generator) * std
    vectors[~seen] = drawn[~seen]
    vectors[list(special_ids)] = drawn[list(special_ids)]
    return vectors


def _context_ids(frequency: np.ndarray, limit: int) -> np.ndarray:
    """The ids of the `limit` most frequent tokens (those that occur), most frequent first."""
    order = np.argsort(-frequency, kind="stable")
    return order[: min(limit, int((frequency > 0).sum()))]


def _window_counts(shards: TokenShards | ShardSet, vocab_size: int, contexts: np.ndarray) -> torch.Tensor:
    """(vocab_size, len(contexts)) float32: how often each context token occurs within `WINDOW`
    positions of each token, a pair at distance d counted 1/d. Pairs that cross a document or block
    boundary are counted too, or lost: a handful against millions."""
    column = np.full(vocab_size, -1, dtype=np.int64)
    column[contexts] = np.arange(len(contexts))
    counts = np.zeros(vocab_size * len(contexts), dtype=np.float64)
    for tokens in _sampled_blocks(shards):
        cells, weights = [], []
        for distance in range(1, WINDOW + 1):
            left, right = tokens[:-distance], tokens[distance:]
            for word, context in ((left, right), (right, left)):
                keep = column[context] >= 0
                cells.append(word[keep] * len(contexts) + column[context[keep]])
                weights.append(np.full(len(cells[-1]), 1.0 / distance))
        counts += np.bincount(np.concatenate(cells), np.concatenate(weights), minlength=counts.size)
    return torch.from_numpy(counts.reshape(vocab_size, len(contexts))).float()


def _sampled_blocks(shards: TokenShards | ShardSet) -> Iterator[np.ndarray]:
    """The corpus in blocks of `BLOCK` tokens (int64), at most `MAX_TOKENS` of them in all, spread
    evenly over every part when the corpus is larger."""
    parts = shards.parts if isinstance(shards, ShardSet) else [shards]
    starts = [(part, start) for part in parts for start in range(0, part.num_tokens, BLOCK)]
    keep = min(len(starts), max(1, MAX_TOKENS // BLOCK))
    for index in np.linspace(0, len(starts) - 1, keep).round().astype(int):
        part, start = starts[index]
        yield np.asarray(part.tokens[start : start + BLOCK], dtype=np.int64)


def _ppmi_svd(counts: torch.Tensor, dim: int, generator: torch.Generator) -> torch.Tensor:
    """U * sqrt(S) of the rank-`dim` SVD of the PPMI matrix of `counts` (V, C)."""
    total = counts.sum()
    word = counts.sum(1, keepdim=True) / total  # (V, 1)
    context = counts.sum(0, keepdim=True) ** CONTEXT_SMOOTHING  # (1, C)
    context = context / context.sum()
    pmi = torch.log(counts / total) - torch.log(word) - torch.log(context)  # -inf or nan where unseen
    ppmi = torch.nan_to_num(pmi, nan=0.0, neginf=0.0).clamp_(min=0.0)
    rank = min(dim, *ppmi.shape)
    with torch.random.fork_rng(devices=[]):  # svd_lowrank draws from the global generator
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
        u, s, _ = torch.svd_lowrank(ppmi, q=rank, niter=4)
    vectors = torch.zeros(counts.shape[0], dim)
    vectors[:, :rank] = u * s.sqrt()
    return vectors
