"""Word embeddings started from the corpus's co-occurrence statistics (`train.embedding_init =
"cooccurrence"`), instead of BERT's N(0, 0.02).

Owns `cooccurrence_embeddings`: positive pointwise mutual information (PPMI) between each token and
the most frequent tokens within a few positions of it, reduced to the model's width by a truncated SVD
(Levy, Goldberg & Dagan 2015, "Improving Distributional Similarity with Lessons Learned from Word
Embeddings": context distribution smoothing 0.75, the singular values split evenly between words
and contexts). Tokens that appear in similar contexts then start with similar vectors, and since
BERT ties its MLM decoder to these embeddings, a gradient that raises one word's score at a masked
position raises its neighbours' too: rare words learn from their frequent relatives from step 0.
The vectors are scaled to BERT's initialiser range, so the rest of the network sees the magnitudes
it is initialised for. A few seconds of numpy and a randomised SVD on WikiText-2.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from bertforge.shards import ShardSet, TokenShards, shard_parts, token_counts

# Levy et al. 2015: a window of a few tokens both sides, a pair at distance d counted 1/d (as GloVe),
# and context probabilities raised to 0.75 (as word2vec's negative sampling).
WINDOW = 5
CONTEXT_SMOOTHING = 0.75
# Contexts are the most frequent tokens: they carry nearly all of the co-occurrence mass. Their number
# keeps the (vocabulary x contexts) count matrix under 2^25 cells (256 MiB in float64): 4,096
# contexts for 8,192 pieces, 1,099 for 30,522.
MAX_CONTEXTS = 4096
MAX_CELLS = 2**25
# The statistics settle long before a large corpus ends: past this many tokens, windows of `BLOCK`
# tokens spread evenly over the corpus are counted instead (WikiText-2's 2.4 M are all counted).
MAX_TOKENS = 20_000_000
BLOCK = 1_000_000
OVERSAMPLE = 16
POWER_ITERATIONS = 4


def cooccurrence_embeddings(
    shards: TokenShards | ShardSet,
    dim: int,
    std: float,
    special_ids: Sequence[int],
    seed: int,
) -> torch.Tensor:
    """(vocab_size, dim) float32 vectors: the PPMI-SVD vectors of the tokens seen in `shards`, scaled
    to standard deviation `std`. N(0, std) draws fill the rest: the rows of `special_ids` and of
    tokens with no context counted, and the columns past the PPMI matrix's rank."""
    vocab_size = shards.vocab_size
    generator = torch.Generator().manual_seed(seed)
    vectors = torch.randn(vocab_size, dim, generator=generator) * std  # what the PPMI does not fill
    frequency = token_counts(shards, exclude=special_ids)
    contexts = context_ids(frequency, min(MAX_CONTEXTS, MAX_CELLS // vocab_size))
    ppmi = ppmi_matrix(shards, contexts)  # (V, C)
    seen = ppmi.sum(1) > 0
    seen[list(special_ids)] = False
    if not seen.any():
        return vectors
    found = svd_vectors(ppmi[seen], dim, generator)  # (seen, rank), rank <= dim
    vectors[seen, : found.shape[1]] = found * (std / found.std())
    return vectors


def ppmi_matrix(shards: TokenShards | ShardSet, contexts: np.ndarray) -> torch.Tensor:
    """(vocab_size, len(contexts)): the PPMI of each token with each context token within `WINDOW`."""
    return _ppmi(_window_counts(shards, shards.vocab_size, contexts))


def context_ids(frequency: np.ndarray, limit: int) -> np.ndarray:
    """The ids of the `limit` most frequent tokens (those that occur), most frequent first."""
    order = np.argsort(-frequency, kind="stable")
    return order[: min(limit, int((frequency > 0).sum()))]


def _window_counts(shards: TokenShards | ShardSet, vocab_size: int, contexts: np.ndarray) -> torch.Tensor:
    """(vocab_size, len(contexts)) float32: how often each context token occurs within `WINDOW`
    positions of each token, a pair at distance d counted 1/d. Pairs across a document boundary
    are counted (a handful against millions); pairs across two sampled windows are not."""
    column = np.full(vocab_size, -1, dtype=np.int64)
    column[contexts] = np.arange(len(contexts))
    counts = np.zeros(vocab_size * len(contexts), dtype=np.float64)
    for tokens in token_windows(shards):
        # One distance at a time: the cell indices of one distance, not of all `WINDOW`, are held at once.
        for distance in range(1, WINDOW + 1):
            left, right = tokens[:-distance], tokens[distance:]
            cells = []
            for word, context in ((left, right), (right, left)):
                keep = column[context] >= 0
                cells.append(word[keep] * len(contexts) + column[context[keep]])
            counts += np.bincount(np.concatenate(cells), minlength=counts.size) / distance
    return torch.from_numpy(counts.reshape(vocab_size, len(contexts))).float()


def token_windows(shards: TokenShards | ShardSet) -> Iterator[np.ndarray]:
    """Every part of the corpus whole (int64) when it has at most `MAX_TOKENS` tokens; else
    `MAX_TOKENS / BLOCK` windows of up to `BLOCK` tokens at evenly spaced positions (a window ends
    early at the end of its part)."""
    parts = shard_parts(shards)
    sizes = np.array([part.num_tokens for part in parts])
    if sizes.sum() <= MAX_TOKENS:
        for part in parts:
            yield np.asarray(part.tokens[:], dtype=np.int64)
        return
    ends = np.cumsum(sizes)
    for position in np.linspace(0, ends[-1], MAX_TOKENS // BLOCK, endpoint=False).astype(np.int64):
        index = int(np.searchsorted(ends, position, side="right"))
        start = position - (ends[index] - sizes[index])
        yield np.asarray(parts[index].tokens[start : start + BLOCK], dtype=np.int64)


def _ppmi(counts: torch.Tensor) -> torch.Tensor:
    """max(0, log P(w, c) / (P(w) P_0.75(c))) of a (V, C) count matrix; 0 where a count is 0."""
    total = counts.sum()
    word = counts.sum(1, keepdim=True) / total  # (V, 1)
    context = counts.sum(0, keepdim=True) ** CONTEXT_SMOOTHING  # (1, C)
    context = context / context.sum()
    pmi = torch.log(counts / total) - torch.log(word) - torch.log(context)  # -inf or nan where 0
    return torch.nan_to_num(pmi, nan=0.0, neginf=0.0).clamp_(min=0.0)


def svd_vectors(matrix: torch.Tensor, dim: int, generator: torch.Generator) -> torch.Tensor:
    """U * sqrt(S) of the rank-`dim` SVD of `matrix` (rows, C) (fewer columns when its rank is lower).

    A randomised SVD (Halko, Martinsson & Tropp 2011: a Gaussian sketch with `OVERSAMPLE` extra
    columns, `POWER_ITERATIONS` re-orthonormalised passes) from `generator`, so the global random
    state is left alone: about a second at 8,192 x 4,096, where the exact SVD takes 20.
    """
    rows, columns = matrix.shape
    width = min(dim + OVERSAMPLE, rows, columns)
    sketch = matrix @ torch.randn(columns, width, generator=generator)  # (rows, width)
    basis = torch.linalg.qr(sketch).Q
    for _ in range(POWER_ITERATIONS):
        basis = torch.linalg.qr(matrix.T @ basis).Q  # (C, width)
        basis = torch.linalg.qr(matrix @ basis).Q  # (rows, width)
    u, s, _ = torch.linalg.svd(basis.T @ matrix, full_matrices=False)  # (width, C): small
    rank = min(dim, int((s > s[0] * 1e-6).sum()))
    return (basis @ u[:, :rank]) * s[:rank].sqrt()
