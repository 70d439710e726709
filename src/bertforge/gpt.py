"""GPT-1, the decoder-only transformer of Radford et al. 2018 ("Improving Language Understanding by
Generative Pre-Training"), and its next-token objective.

The same network as Hugging Face `transformers.OpenAIGPTLMHeadModel`: token embeddings plus learned
position embeddings (no token types, no LayerNorm after the sum), embedding dropout, post-LayerNorm
blocks (x = LN(x + attn(x)); x = LN(x + mlp(x))), causal self-attention and a language-model head
(no bias) tied to the token embeddings. It is configured by bertforge's `ModelConfig`, so the same
presets apply (`type_vocab_size` and `pad_token_id` are unused by the network).

The blocks are BERT's (`bertforge.model`): the attention output, feed-forward and LayerNorm modules
are reused as they are, so the parameter names follow BERT's (`gpt.layer.0.attention.self.query`);
`bertforge.gpt_convert` maps them to Hugging Face's (`transformer.h.0.attn.c_attn`). Only the
attention itself differs: `CausalSelfAttention` masks the later positions (SDPA's `is_causal=True`
where that kernel is the faster path, `causal_attention`), and can extend a `KVCache` for generation.

GPT-1's activation is the tanh approximation of GELU, bertforge's `hidden_act = "gelu_new"`
(`bertforge.config_rules.GPT_HIDDEN_ACT`; Hugging Face's OpenAIGPT calls it "gelu"); `hidden_act =
"gelu"` here means the exact erf form, as everywhere in bertforge, which OpenAIGPT cannot express.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertforge.config import ModelConfig
from bertforge.fast_ops import Dropout, attention, cross_entropy_sum, fused_attention_pays
from bertforge.losses import Summary, token_prediction_metrics, top1_hits
from bertforge.model import (
    BertIntermediate,
    BertOutput,
    BertSelfAttention,
    BertSelfOutput,
    check_num_labels,
    check_positions,
    init_weights,
)

# Alias -> owner for the tied LM head, as `model.TIED_KEYS` for BERT: savers drop the alias.
GPT_TIED_KEYS: dict[str, str] = {"lm_head.weight": "gpt.embeddings.word_embeddings.weight"}


class KVCache:
    """Keys and values of the tokens seen so far, one (k, v) pair per layer, for generation.

    Each k and v is (B, nh, P, hd), P = `length`, the number of cached positions.
    """

    def __init__(self, num_layers: int):
        self.layers: list[tuple[Tensor, Tensor] | None] = [None] * num_layers

    @property
    def length(self) -> int:
        first = self.layers[0]
        return 0 if first is None else first[0].shape[2]

    def extend(self, index: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new positions' k, v (B, nh, T, hd) to layer `index`; return all (B, nh, P+T, hd)."""
        past = self.layers[index]
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        self.layers[index] = (k, v)
        return k, v


def causal_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float, training: bool
) -> Tensor:
    """Attention of q (B, nh, T, hd) over k, v (B, nh, S, hd) -> (B, nh, T, hd).

    mask None: plain causal attention (S == T), through SDPA's `is_causal=True` kernels where those
    are the faster path (`fast_ops.fused_attention_pays`). Otherwise a boolean mask broadcastable to
    (B, nh, T, S), True where a query may attend to a key; it must already hold the causal part.
    Dropout on CPU uses bertforge's cheaper masks (`fast_ops`).
    """
    p = p if training else 0.0
    if mask is None:
        if fused_attention_pays(q, p):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()  # (T, S)
    return attention(q, k, v, mask, p, training)


def build_attention_mask(attention_mask: Tensor | None, length: int, past: int, device) -> Tensor | None:
    """The boolean mask `causal_attention` takes for `length` new queries after `past` cached keys.

    attention_mask: None or (B, past + length), 1/True for real tokens. None is returned for plain
    causal attention (no padding, no cache). A query with no real key at or before it (a left pad)
    may attend to itself, so that its softmax is defined; real positions never see a pad.
    """
    if attention_mask is None and past == 0:
        return None
    keys = past + length
    causal = torch.ones(length, keys, dtype=torch.bool, device=device).tril(past)  # (T, S)
    if attention_mask is None:
        return causal
    mask = causal & attention_mask.bool()[:, None, None, :]  # (B, 1, T, S)
    itself = torch.eye(length, keys, dtype=torch.bool, device=device).roll(past, dims=1)  # (T, S)
    return mask | (itself & ~mask.any(-1, keepdim=True))  # (B, 1, T, S)


class CausalSelfAttention(BertSelfAttention):
    """BERT's query/key/value projections with causal attention, and an optional `KVCache`."""

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        cache: KVCache | None = None,
        index: int = 0,
        queries: Tensor | None = None,
    ) -> Tensor:
        """x: (B, T, H); `queries`: x at the Q positions whose outputs are wanted (None: all of x),
        whose `mask` rows (B, 1, Q, S) must then be given."""
        q = self.heads(self.query(x if queries is None else queries))  # (B, nh, Q, hd)
        k, v = self.heads(self.key(x)), self.heads(self.value(x))  # (B, nh, T, hd)
        if cache is not None:
            k, v = cache.extend(index, k, v)  # (B, nh, P+T, hd)
        y = causal_attention(q, k, v, mask, self.dropout_p, self.training)  # (B, nh, Q, hd)
        return y.transpose(1, 2).flatten(2)  # (B, Q, H)


class GPTAttention(nn.Module):
    """Causal self-attention sublayer: `self` (query/key/value) then BERT's `output` (dense/LayerNorm)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self = CausalSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        cache: KVCache | None = None,
        index: int = 0,
        queries: Tensor | None = None,
    ) -> Tensor:
        residual = x if queries is None else queries
        return self.output(self.self(x, mask, cache, index, queries), residual)  # (B, Q, H)


class GPTBlock(nn.Module):
    """One post-LN decoder block: x = LN(x + attn(x)); x = LN(x + mlp(x)), BERT's layer made causal."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attention = GPTAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        cache: KVCache | None = None,
        index: int = 0,
        queries: Tensor | None = None,
    ) -> Tensor:
        """The block's output at every position of x (B, T, H), or at those of `queries` (B, Q, H)."""
        x = self.attention(x, mask, cache, index, queries)  # (B, Q, H)
        return self.output(self.intermediate(x), x)  # (B, Q, H)


class GPTEmbeddings(nn.Module):
    """Token + learned position embeddings, then dropout (no LayerNorm, no token types)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, *, past: int = 0) -> Tensor:
        end = past + input_ids.shape[1]
        check_positions(end, self.position_embeddings)
        x = self.word_embeddings(input_ids)  # (B, T, H)
        x += self.position_embeddings.weight[past:end]  # (T, H): positions past..end-1 for every row
        return self.dropout(x)


class GPTModel(nn.Module):
    """The GPT-1 decoder without a head: embeddings then `num_hidden_layers` causal blocks.

    `forward(input_ids, *, attention_mask=None, cache=None)` returns the last hidden states (B, T, H).
    attention_mask: None or (B, P + T), 1/True for real tokens (P: positions already in `cache`).
    Positions count from the start of the row, pads included, as Hugging Face's OpenAIGPT does.
    With `read_at` (B,), one position of input_ids per row that a head reads, the last block runs its queries,
    attention output and feed-forward for that position alone and (B, 1, H) is returned.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embeddings = GPTEmbeddings(config)
        self.layer = nn.ModuleList(GPTBlock(config) for _ in range(config.num_hidden_layers))

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        cache: KVCache | None = None,
        read_at: Tensor | None = None,
    ) -> Tensor:
        past = 0 if cache is None else cache.length
        mask = build_attention_mask(attention_mask, input_ids.shape[1], past, input_ids.device)
        x = self.embeddings(input_ids, past=past)  # (B, T, H)
        *layers, last = self.layer
        for index, layer in enumerate(layers):
            x = layer(x, mask, cache, index)  # (B, T, H)
        if read_at is None:
            return last(x, mask, cache, len(layers))  # (B, T, H)
        queries = x[torch.arange(x.shape[0], device=x.device), read_at][:, None]  # (B, 1, H)
        return last(x, mask_rows(mask, read_at, x.shape[1]), cache, len(layers), queries)  # (B, 1, H)


def mask_rows(mask: Tensor | None, read_at: Tensor, length: int) -> Tensor:
    """The rows (B, 1, 1, S) of a `build_attention_mask` mask for the queries at `read_at` (B,),
    positions among the `length` new tokens."""
    if mask is None:  # plain causal attention: every key up to the query
        return (torch.arange(length, device=read_at.device) <= read_at[:, None])[:, None, None]
    rows = torch.arange(read_at.shape[0], device=read_at.device)
    return mask.expand(read_at.shape[0], 1, -1, -1)[rows, :, read_at][:, :, None]


class GPTLMHeadModel(nn.Module):
    """GPT-1 with its language-model head tied to the token embeddings (as `OpenAIGPTLMHeadModel`).

    `forward(input_ids, *, attention_mask=None, cache=None)` returns next-token logits (B, T, V):
    row t scores the token at t + 1. Pass a `KVCache` (`new_cache()`) to feed a sequence piece by
    piece; each call then appends its positions to the cache.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.gpt = GPTModel(config)
        # On the meta device: tie_weights() replaces it by the token embeddings.
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, device="meta")
        self.tie_weights()
        init_weights(self, config)  # Hugging Face's init; the shared tensor is drawn once

    def tie_weights(self) -> None:
        """Make the LM head share the token embeddings; call again after `load_state_dict(assign=True)`."""
        self.lm_head.weight = self.gpt.embeddings.word_embeddings.weight

    def new_cache(self) -> KVCache:
        return KVCache(self.config.num_hidden_layers)

    def forward(
        self, input_ids: Tensor, *, attention_mask: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        return self.lm_head(self.gpt(input_ids, attention_mask=attention_mask, cache=cache))  # (B, T, V)


class GPTForSequenceClassification(nn.Module):
    """GPT-1 with a classification head on the last real token's state (`OpenAIGPTForSequenceClassification`).

    `forward(input_ids, *, token_type_ids=None, attention_mask=None)` returns logits (B, num_labels),
    the signature of `BertForSequenceClassification` (`token_type_ids` is ignored). The head is
    `score`, Linear(hidden, num_labels) without bias and without dropout, read at the last real token
    (the rightmost position whose attention_mask is 1; with no mask, the last position): for
    `[CLS] text [SEP]` that is GPT-1's extract token, whose causal state has seen the whole text.
    The last block runs past its keys and values for that token alone (`GPTModel`'s `read_at`).
    """

    def __init__(self, config: ModelConfig, num_labels: int):
        super().__init__()
        check_num_labels(num_labels)
        self.config = config
        self.num_labels = num_labels
        self.gpt = GPTModel(config)
        self.score = nn.Linear(config.hidden_size, num_labels, bias=False)
        init_weights(self, config)

    def forward(
        self, input_ids: Tensor, *, token_type_ids: Tensor | None = None, attention_mask: Tensor | None = None
    ) -> Tensor:
        B, T = input_ids.shape
        positions = torch.arange(T, device=input_ids.device)  # (T,)
        if attention_mask is None:
            read_at = positions[-1:].expand(B)  # (B,)
        else:
            read_at = (positions * attention_mask).argmax(-1)  # (B,): the rightmost real token
        last = self.gpt(input_ids, attention_mask=attention_mask, read_at=read_at)  # (B, 1, H)
        return self.score(last[:, 0])  # (B, num_labels)


# --------------------------------------------------------------------------------- the objective


def next_token_targets(
    input_ids: Tensor, attention_mask: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    """Targets (B, T-1) = input_ids shifted left by one, and which of them count (None: all).

    A target counts when it and the token before it are real: a pad is never predicted, and the
    first real token after left padding is not predicted from pads.
    """
    targets = input_ids[:, 1:]  # (B, T-1)
    if attention_mask is None:
        return targets, None
    real = attention_mask.bool()  # (B, T)
    return targets, real[:, 1:] & real[:, :-1]  # (B, T-1)


def next_token_sums(
    logits: Tensor, input_ids: Tensor, attention_mask: Tensor | None = None
) -> dict[str, Tensor]:
    """Summed next-token cross-entropy, correct top-1 predictions and target count (0-d tensors).

    logits: (B, T, V) from `GPTLMHeadModel`; the last position has no target and is dropped.
    Without a mask there is no host synchronisation. A tie for the top logit counts its share
    (`losses.top1_hits`), as for MLM.
    """
    targets, counted = next_token_targets(input_ids, attention_mask)  # (B, T-1)
    scores = logits[:, :-1].flatten(0, 1)  # (N, V)
    targets = targets.flatten()  # (N,)
    if counted is not None:
        keep = counted.flatten()  # (N,)
        scores, targets = scores[keep], targets[keep]  # (M, V), (M,)
    return {
        "clm_loss_sum": cross_entropy_sum(scores, targets),
        "clm_correct": top1_hits(scores, targets).sum(),
        "clm_count": torch.full((), targets.numel(), device=logits.device),  # filled there: no host copy
    }


def next_token_loss(
    logits: Tensor, input_ids: Tensor, attention_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(mean next-token cross-entropy, top-1 accuracy) over the counted targets, as 0-d tensors."""
    sums = next_token_sums(logits, input_ids, attention_mask)
    count = sums["clm_count"].clamp(min=1)
    return sums["clm_loss_sum"] / count, sums["clm_correct"] / count


def summarize_clm(totals: dict[str, float]) -> Summary:
    """Accumulated `next_token_sums` -> the next-token loss, and the metrics: that loss, perplexity
    and top-1 accuracy."""
    metrics = token_prediction_metrics(totals, "clm")
    return Summary(metrics["clm_loss"], metrics)
