"""A BERT that starts as a count-based window model (`train.embedding_init = "window_model"`).

Owns `init_window_model`. Before the first step, the network is set so that its MLM head computes a
naive-Bayes estimate from the corpus's counts: the score of word w at a masked position is
log P(w) + sum over the neighbours c at offsets d = -1, +1, -2, +2, ... of PMI_d(w, c), the pointwise
mutual information of seeing c at offset d from w. It is BERT's own network with other starting
weights (nothing is added; the export is unchanged):

- word vectors a_w: the rank-(H - P) SVD of each token's PPMI row (the co-occurrence init's:
  topic) beside its offsets' PMI rows (syntax: the directions the heads' maps need), in the first
  H - P dims, every word's vector of one length (so that LayerNorm leaves each token the same
  position part: with these SVD vectors' own lengths, a long vector's position part shrank until
  the heads at a masked position put only half their attention on the neighbour); zero in the last
  P = head_dim dims. The special tokens' vectors are zero: a masked position carries only its
  position;
- position vectors: sinusoids in the last P dims (P/2 frequencies pi m / (P/2), the period P
  positions), so that rotating one position by d gives position i + d;
- layer 1, head k: query and key read only the position dims, the query rotated by the head's offset
  d, sharply enough that position i attends to i + d alone; value and output map the neighbour's
  word vector through M_d, a rank-head_dim matrix fitted so that a_w . M_d u_c ~ PMI_d(w, c) (a
  ridge least-squares fit weighted by the tokens' root frequencies, u_c the vector LayerNorm makes
  of a_c); layer 1's feed-forward output starts at zero, so the layer passes that sum on;
- the MLM transform: identity weights and a bias that puts GELU in its linear range, its LayerNorm
  scaled so the logits are the fitted scores at a temperature below 1 (the log-likelihood is best
  there: the rank-limited sums are overconfident), and the heads' sum larger than the token's own
  vector (which the identity transform passes on: an unmasked token's logits favour itself).

The other layers keep BERT's initialisation. The mechanism is that of Elhage et al. 2021 ("A
Mathematical Framework for Transformer Circuits": attention heads that copy a neighbour's token
through an OV circuit), with counts put where training would have to find them. Measured on
WikiText-2 (docs/records/pretraining.md), at step 0: 15.7% of the [MASK] positions of held-out text
filled right, against 5.6% for BERT's init with the unigram bias (it fills in "the") and 9.7% with
PPMI vectors alone as the word vectors (which the maps fit worse: 10.5% even computed outside the
network; and a temperature set on all positions' loss). A count-based naive Bayes over
the same four neighbours fills 26% with full-rank tables and 17% with each table cut to rank
head_dim: the heads' rank is the limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from bertforge.config import RunConfig
from bertforge.embedding_init import (
    MAX_CELLS,
    MAX_CONTEXTS,
    context_ids,
    ppmi_matrix,
    svd_vectors,
    token_windows,
)
from bertforge.model import BertForPreTraining
from bertforge.shards import ShardSet, TokenShards, token_counts

# P(c | w at offset d) is smoothed towards P(c) with this many pseudo-counts: a rare word's PMI stays near 0.
SMOOTHING = 300.0
RIDGE = 0.1  # of the Gram matrices' mean diagonal, added to it: keeps the fitted maps small
ATTENTION_PEAK = 12.0  # the logit of position i + d over the others', at a typical token
NEIGHBOUR_NORM = 32.0  # |sum of the heads' outputs| at a masked position, twice LayerNorm's 16
TEMPERATURE = 0.6  # the logits' scale against the fitted scores (loss at [MASK] best near 0.6-0.8)
GELU_SHIFT = 6.0  # the MLM transform's bias: GELU(x + 6) = x + 6 within 0.2% for x > -2.8


def head_offsets(num_heads: int) -> list[int]:
    """The neighbour each head of layer 1 reads: -1, +1, -2, +2, ..."""
    return [(k // 2 + 1) * (-1 if k % 2 == 0 else 1) for k in range(num_heads)]


def sinusoid_positions(rows: int, width: int, amplitude: float) -> torch.Tensor:
    """(rows, width): cos then sin of width/2 frequencies pi m / (width/2), m = 1..width/2, each row
    centred (so that LayerNorm subtracts no mean from the word dims). Their dot products peak where
    two positions are equal (mod width) and stay near 0 elsewhere."""
    frequencies = position_frequencies(width)
    angle = torch.arange(rows, dtype=torch.float32)[:, None] * frequencies
    vectors = torch.cat([torch.cos(angle), torch.sin(angle)], 1) * amplitude
    return vectors - vectors.mean(1, keepdim=True)


def position_frequencies(width: int) -> torch.Tensor:
    half = width // 2
    return math.pi * torch.arange(1, half + 1, dtype=torch.float32) / half


def rotation(width: int, offset: int) -> torch.Tensor:
    """(width, width): maps the sinusoid of position i to that of position i + offset."""
    frequencies = position_frequencies(width)
    cos, sin = torch.cos(frequencies * offset), torch.sin(frequencies * offset)
    half = torch.arange(width // 2)
    matrix = torch.zeros(width, width)
    matrix[half, half] = cos
    matrix[half, half + width // 2] = -sin
    matrix[half + width // 2, half] = sin
    matrix[half + width // 2, half + width // 2] = cos
    return matrix


def offset_pmi(
    windows: Sequence[np.ndarray], counts: np.ndarray, contexts: np.ndarray, offset: int
) -> torch.Tensor:
    """(vocab, len(contexts)): log P(c at offset d | w) - log P(c), P(c | w) smoothed towards P(c)
    with `SMOOTHING` pseudo-counts. Context tokens outside `contexts` are not counted."""
    vocab = len(counts)
    column = np.full(vocab, -1, dtype=np.int64)
    column[contexts] = np.arange(len(contexts))
    pairs = np.zeros(vocab * len(contexts), dtype=np.float64)
    for tokens in windows:
        # words[i] has neighbours[i] at `offset` positions from it
        if offset > 0:
            words, neighbours = tokens[:-offset], tokens[offset:]
        else:
            words, neighbours = tokens[-offset:], tokens[:offset]
        keep = column[neighbours] >= 0
        pairs += np.bincount(words[keep] * len(contexts) + column[neighbours[keep]], minlength=pairs.size)
    pairs = torch.from_numpy(pairs.reshape(vocab, len(contexts))).float()
    frequency = torch.from_numpy(counts).float()
    prior = (frequency + 0.5) / (frequency + 0.5).sum()  # add-half: every log finite
    context_prior = prior[torch.from_numpy(contexts)]
    conditional = (pairs + SMOOTHING * context_prior) / (frequency[:, None] + SMOOTHING)
    return torch.log(conditional) - torch.log(context_prior)


class OffsetMapFit:
    """Fits M (K, K) of rank `rank` so that a_w . M u_c ~ Y(w, c), weighted by the root frequencies
    of w and c: ridge least squares, truncated in the whitened coordinates of both sides."""

    def __init__(self, words: torch.Tensor, inputs: torch.Tensor, weights: torch.Tensor, rank: int):
        self.word_weights, self.input_weights, self.rank = weights[0], weights[1], rank
        self.words = words * self.word_weights[:, None]  # (V, K)
        self.inputs = inputs * self.input_weights[:, None]  # (C, K)
        self.word_root, self.word_inverse_root = _ridge_roots(self.words)
        self.input_root, self.input_inverse_root = _ridge_roots(self.inputs)

    def __call__(self, targets: torch.Tensor) -> torch.Tensor:
        weighted = self.word_weights[:, None] * targets * self.input_weights[None, :]  # (V, C)
        whitened = self.word_inverse_root @ (self.words.T @ weighted @ self.inputs) @ self.input_inverse_root
        left, values, right = torch.linalg.svd(whitened)
        kept = (left[:, : self.rank] * values[: self.rank]) @ right[: self.rank]
        return self.word_inverse_root @ kept @ self.input_inverse_root


def _ridge_roots(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """G^(1/2) and G^(-1/2) of G = X^T X + RIDGE * mean(diag) * I."""
    gram = matrix.T @ matrix
    gram += RIDGE * gram.diagonal().mean() * torch.eye(gram.shape[0])
    values, vectors = torch.linalg.eigh(gram)
    return (vectors * values.sqrt()) @ vectors.T, (vectors / values.sqrt()) @ vectors.T


@torch.no_grad()
def init_window_model(
    model: BertForPreTraining,
    shards: TokenShards | ShardSet,
    special_ids: Sequence[int],
    config: RunConfig,
) -> None:
    """Set the word and position embeddings, layer 1 and the MLM transform as the module docstring
    says. The config rules guarantee at least two heads, an even head size, max_seq_length at most
    the head size, and an activation that is linear for large inputs."""
    m = config.model
    hidden, heads = m.hidden_size, m.num_attention_heads
    head_dim = hidden // heads
    word_dims = hidden - head_dim
    vocab = shards.vocab_size

    offsets = head_offsets(heads)
    statistics = OffsetStatistics(shards, special_ids, offsets)
    word_norm = m.initializer_range * math.sqrt(word_dims)  # the norm of an N(0, std) vector
    words = statistics.word_vectors(word_dims, word_norm, config.runtime.seed)
    amplitude = word_norm / math.sqrt(head_dim / 2)  # |p| = |a_w|
    positions = sinusoid_positions(config.data.max_seq_length, head_dim, amplitude)
    position_sq = float((positions**2).sum(1).mean())
    # What the embeddings' LayerNorm makes of [a_w; p]: the word part divided by the vector's std.
    input_words = words * math.sqrt(hidden / (word_norm**2 + position_sq))
    maps = statistics.maps(words, input_words, head_dim)
    frequent = torch.from_numpy(statistics.contexts[:2000].copy())
    summed = sum(input_words[frequent] @ matrix.T for matrix in maps)  # at frequent neighbours
    scale = NEIGHBOUR_NORM / float(summed.norm(dim=1).median())  # the heads map scale * M_d

    embeddings = model.bert.embeddings
    embeddings.word_embeddings.weight[:vocab] = torch.cat([words, torch.zeros(vocab, head_dim)], 1)
    embeddings.position_embeddings.weight[: len(positions)] = torch.cat(
        [torch.zeros(len(positions), word_dims), positions], 1
    )
    embeddings.token_type_embeddings.weight.zero_()
    _set_first_layer(model, maps, offsets, scale, word_dims, word_norm**2 + position_sq, position_sq)
    transform = model.cls.predictions.transform
    transform.dense.weight.copy_(torch.eye(hidden))
    transform.dense.bias.fill_(GELU_SHIFT)
    # After layer 1's LayerNorm the word part is (sum of the heads) / std, std ~ sqrt(1 + |o|^2 / H).
    transform.LayerNorm.weight.fill_(TEMPERATURE * math.sqrt(1 + NEIGHBOUR_NORM**2 / hidden) / scale)
    transform.LayerNorm.bias.zero_()


class OffsetStatistics:
    """The corpus's PMI_d(w, c) for each head's offset d, over the most frequent context tokens c,
    and what the init makes of them: the word vectors and each head's map."""

    def __init__(self, shards: TokenShards | ShardSet, special_ids: Sequence[int], offsets: list[int]):
        self.counts = token_counts(shards, exclude=special_ids)
        self.contexts = context_ids(self.counts, min(MAX_CONTEXTS, MAX_CELLS // len(self.counts)))
        windows = [np.asarray(tokens, dtype=np.int64) for tokens in token_windows(shards)]
        # (V, len(offsets) * C): one block of columns per offset; special tokens' rows 0.
        self.scores = torch.cat([offset_pmi(windows, self.counts, self.contexts, d) for d in offsets], 1)
        self.scores[list(special_ids)] = 0.0
        self.shards, self.special_ids = shards, special_ids

    def word_vectors(self, dim: int, norm: float, seed: int) -> torch.Tensor:
        """(V, dim): the rank-`dim` SVD of each token's PPMI row (`bertforge.embedding_init`: topic,
        what the quiz's content words need) beside its offsets' PMI rows (syntax, what the heads' maps
        need), each block scaled to one Frobenius norm; centred, and every vector set to one `norm`, so
        that LayerNorm leaves each token the same position part and attention finds the neighbour of
        a frequent word as of a rare one. Zero for the special tokens and tokens never seen."""
        ppmi = ppmi_matrix(self.shards, self.contexts)
        ppmi[list(self.special_ids)] = 0.0
        blocks = [block / max(float(block.norm()), 1e-12) for block in (ppmi, self.scores)]
        found = svd_vectors(torch.cat(blocks, 1), dim, torch.Generator().manual_seed(seed))  # (V, <= dim)
        vectors = torch.zeros(len(self.scores), dim)
        vectors[:, : found.shape[1]] = found
        vectors -= vectors.mean(1, keepdim=True)  # LayerNorm's mean is then the position's alone
        lengths = vectors.norm(dim=1, keepdim=True)
        seen = lengths[:, 0] > 1e-6 * float(lengths.max())
        vectors[seen] *= norm / lengths[seen]
        vectors[~seen] = 0.0
        return vectors

    def maps(self, words: torch.Tensor, input_words: torch.Tensor, rank: int) -> list[torch.Tensor]:
        """For each offset d, M_d (K, K) of rank `rank` with words[w] . M_d input_words[c] ~ PMI_d(w, c)."""
        root_frequency = torch.from_numpy(self.counts).float().add(1.0).sqrt()
        contexts = self.contexts
        fit = OffsetMapFit(words, input_words[contexts], (root_frequency, root_frequency[contexts]), rank)
        return [fit(block) for block in self.scores.split(len(contexts), dim=1)]


def _set_first_layer(
    model: BertForPreTraining,
    maps: list[torch.Tensor],
    offsets: list[int],
    scale: float,
    word_dims: int,
    typical_sq: float,
    position_sq: float,
) -> None:
    """Head k of layer 1 attends from i to i + offsets[k] and adds scale * M_k of that token's word
    vector; its feed-forward output starts at zero. `typical_sq` is |[a_w; p]|^2 of a typical token."""
    layer = model.bert.encoder.layer[0]
    attention, output = layer.attention.self, layer.attention.output.dense
    for linear in (attention.query, attention.key, attention.value, output, layer.output.dense):
        linear.weight.zero_()
        linear.bias.zero_()
    head_dim = attention.head_dim
    hidden = word_dims + head_dim
    # LayerNorm divides a typical token by sqrt(typical_sq / H): its position part's squared norm is
    # then position_sq * H / typical_sq. The query's scale makes the logit at i + d exceed the
    # others' (near 0) by about ATTENTION_PEAK; SDPA divides by sqrt(head_dim).
    sharpness = ATTENTION_PEAK * math.sqrt(head_dim) * typical_sq / (position_sq * hidden)
    for head, (offset, matrix) in enumerate(zip(offsets, maps, strict=True)):
        rows = slice(head * head_dim, (head + 1) * head_dim)
        attention.key.weight[rows, word_dims:] = torch.eye(head_dim)
        attention.query.weight[rows, word_dims:] = sharpness * rotation(head_dim, offset)
        left, values, right = torch.linalg.svd(matrix)
        root = values[:head_dim].sqrt()
        attention.value.weight[rows, :word_dims] = scale * root[:, None] * right[:head_dim]
        output.weight[:word_dims, rows] = left[:, :head_dim] * root
