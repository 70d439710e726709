"""The BERT architecture: encoder, pooler, the pretraining heads (masked LM + next sentence) and the
sequence and token classifiers.

Owns the modules, the forward passes and the weight initialisation; nothing here reads files,
builds optimizers or prints. Parameter names, shapes and initialisation equal Hugging Face's
`transformers.BertForPreTraining`, so a state dict moves between the two unchanged (Devlin et al.
2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding").

Departures from Hugging Face, all for speed and none visible in the state dict:
- attention runs through `torch.nn.functional.scaled_dot_product_attention`, and dropout (also
  attention's, on CPU) through `fast_ops`, whose CPU masks are cheaper to draw;
- the MLM head can run on the masked positions only (`masked_positions`), as Google's original
  code, NVIDIA, Cramming and MosaicBERT do: for small models the dense vocabulary projection over
  every token costs more than the whole encoder;
- a batch with padding can run attention per sequence without a mask (`BertModel.varlen`, off by
  default); padded positions then attend to padding, not to the real tokens as Hugging Face's do
  (values that nothing reads; every real token's are the same);
- the encoder can recompute each layer's activations in the backward instead of keeping them
  (`set_activation_checkpointing`, Hugging Face's `gradient_checkpointing`);
- the last layer runs only where a head reads, its keys and values still from every position, so
  those outputs are the same for a fraction of the layer's work (MosaicBERT's cut): a sequence
  classifier's for [CLS] alone (`BertModel`'s `cls_only`), pretraining's past attention for the
  masked positions and [CLS] (`positions`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from bertforge.config import Activation, ModelConfig
from bertforge.errors import BertforgeError
from bertforge.fast_ops import Dropout, attention
from bertforge.varlen import Segments, segments, varlen_attention

# What attention is told of the padding: a key mask (B, 1, 1, T), None (no padding), or the
# segments of real tokens and padding for variable-length attention.
Mask = Tensor | Segments | None

# Alias -> owner for the tied parameters, as Hugging Face's `_tied_weights_keys`. `state_dict()`
# reports both names for one tensor; safetensors refuses shared tensors, so savers drop the aliases.
TIED_KEYS: dict[str, str] = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}


def _gelu_tanh(x: Tensor) -> Tensor:
    # Hugging Face's "gelu_new": the tanh approximation used by the original TF BERT / GPT-2.
    return F.gelu(x, approximate="tanh")


# Each of `config.HIDDEN_ACTS`; Hugging Face's "gelu" is the exact erf form, also torch's default.
ACTIVATIONS: dict[Activation, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": _gelu_tanh,
    "relu": F.relu,
    "silu": F.silu,
    "tanh": torch.tanh,
}


def get_activation(name: str) -> Callable[[Tensor], Tensor]:
    """The activation function called `name` in a Hugging Face `BertConfig` (one of `config.HIDDEN_ACTS`:
    `config.validate_model` refuses the others)."""
    assert name in ACTIVATIONS, f"unknown activation {name!r}"
    return ACTIVATIONS[name]


def check_positions(end: int, position_embeddings: nn.Embedding) -> None:
    """Refuse a sequence that runs to position `end` (exclusive) past the learned positions."""
    max_positions = position_embeddings.num_embeddings
    if end > max_positions:
        raise BertforgeError(
            f"a sequence of {end} tokens is longer than model.max_position_embeddings "
            f"({max_positions}); truncate the input or use a bigger model"
        )


def reading_length(model: nn.Module) -> int:
    """The longest input a model reads: the length it was trained (or fine-tuned) at, where the folder
    it was opened from recorded it (`model.max_length`), else its positions."""
    return getattr(model, "max_length", None) or model.config.max_position_embeddings


def check_num_labels(num_labels: int) -> None:
    """One output is a regression head (Hugging Face's `num_labels = 1`); more, one per class."""
    if num_labels < 1:
        raise BertforgeError(
            f"a sequence head needs one output (regression) or two or more labels, got {num_labels}"
        )


class BertEmbeddings(nn.Module):
    """LayerNorm(word + position + token type) then dropout."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        # padding_idx: as Hugging Face, the pad row starts at zero and gets no gradient from the input side.
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, *, token_type_ids: Tensor | None = None) -> Tensor:
        T = input_ids.shape[1]
        check_positions(T, self.position_embeddings)
        x = self.word_embeddings(input_ids)  # (B, T, H)
        # In-place adds: the embedding lookup's backward needs only the ids, not its output.
        # Positions are 0..T-1 for every row, so a slice of the table broadcasts without a lookup.
        x += self.position_embeddings.weight[:T]  # (T, H)
        if token_type_ids is None:
            x += self.token_type_embeddings.weight[0]  # (H,): every token in segment 0
        else:
            x += self.token_type_embeddings(token_type_ids)  # (B, T, H)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention (projections only; the output is in BertSelfOutput)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        assert config.hidden_size % config.num_attention_heads == 0, "validate_model checks the heads"
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: Tensor, mask: Mask, queries: Tensor | None = None) -> Tensor:
        """x: (B, T, H); `queries`: x at the Q positions whose outputs are wanted (None: all of x)."""
        if isinstance(mask, Segments):
            assert queries is None, "variable-length attention runs every position"
            return self.varlen(x, mask)
        queries = x if queries is None else queries
        q = self.heads(self.query(queries))  # (B, nh, Q, hd)
        k, v = self.heads(self.key(x)), self.heads(self.value(x))  # (B, nh, T, hd)
        # mask: (B, 1, 1, T) boolean, True where the key is a real token; None lets SDPA pick its
        # fastest kernel. Scale is the default 1/sqrt(hd), as BERT.
        y = attention(q, k, v, mask, self.dropout_p, self.training)  # (B, nh, Q, hd)
        return y.transpose(1, 2).flatten(2)  # (B, Q, H)

    def heads(self, projected: Tensor) -> Tensor:
        """(B, T, H) -> (B, nh, T, hd)"""
        return projected.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def varlen(self, x: Tensor, segments: Segments) -> Tensor:
        """Attention within each of `segments` (a row's real tokens, or its padding) of x (B, T, H)."""
        B, T, H = x.shape
        q = self.query(x).view(B, T, self.num_heads, self.head_dim)  # (B, T, nh, hd)
        k = self.key(x).view(B, T, self.num_heads, self.head_dim)  # (B, T, nh, hd)
        v = self.value(x).view(B, T, self.num_heads, self.head_dim)  # (B, T, nh, hd)
        p = self.dropout_p if self.training else 0.0
        return varlen_attention(q, k, v, segments, p).reshape(B, T, H)  # (B, T, H)


class ResidualOutput(nn.Module):
    """How both sublayers end: project `in_features` to the hidden size, dropout, add the residual,
    then LayerNorm (post-LN)."""

    def __init__(self, config: ModelConfig, in_features: int):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, y: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(y)) + residual)  # (B, T, H)


class BertSelfOutput(ResidualOutput):
    """Attention output projection, dropout, residual and post-LayerNorm."""

    def __init__(self, config: ModelConfig):
        super().__init__(config, config.hidden_size)


class BertAttention(nn.Module):
    """Self-attention sublayer: `self` (query/key/value) then `output` (dense/LayerNorm)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(
        self, x: Tensor, mask: Mask, queries: Tensor | None = None, rows: Tensor | None = None
    ) -> Tensor:
        context, residual = self.self(x, mask, queries), x if queries is None else queries  # (B, Q, H)
        if rows is not None:  # flat indices into the B*Q positions: only those go on, as (R, H)
            context, residual = (t.flatten(0, 1).index_select(0, rows) for t in (context, residual))
        return self.output(context, residual)  # (B, Q, H) or (R, H)


class BertIntermediate(nn.Module):
    """First feed-forward projection and activation."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = get_activation(config.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.dense(x))  # (B, T, I)


class BertOutput(ResidualOutput):
    """Second feed-forward projection (intermediate to hidden), dropout, residual and post-LayerNorm."""

    def __init__(self, config: ModelConfig):
        super().__init__(config, config.intermediate_size)


class BertLayer(nn.Module):
    """One post-LN transformer block: attention sublayer then feed-forward sublayer."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(
        self, x: Tensor, mask: Mask, queries: Tensor | None = None, rows: Tensor | None = None
    ) -> Tensor:
        """The layer's output at every position of x (B, T, H); at those of `queries` (B, Q, H), x
        there, attending to all of x; or at the flat positions `rows` (R,) after attention, as (R, H)."""
        x = self.attention(x, mask, queries, rows)  # (B, Q, H) or (R, H)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    """The stack of `num_hidden_layers` transformer blocks, as `encoder.layer[i]`.

    With `gradient_checkpointing` each layer keeps only its input for the backward and runs again
    there: the activations of one layer at a time instead of all, for about a third more compute.
    The recomputation replays the same dropout masks, so the gradients are the same.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False

    def forward(self, x: Tensor, mask: Mask, cls_only: bool = False, rows: Tensor | None = None) -> Tensor:
        """(B, T, H); with `cls_only` (B, 1, H), the last layer run for the first position only; with
        `rows` (R,) flat indices into B*T, (R, H), the last layer run past attention for those only."""
        recompute = self.gradient_checkpointing and torch.is_grad_enabled()
        last = len(self.layer) - 1
        for i, layer in enumerate(self.layer):
            at_last = i == last
            inputs = (x, mask, x[:, :1] if cls_only and at_last else None, rows if at_last else None)
            x = checkpoint(layer, *inputs, use_reentrant=False) if recompute else layer(*inputs)
        return x


def set_activation_checkpointing(model: nn.Module, enabled: bool) -> None:
    """Turn activation checkpointing on or off in every BERT encoder inside `model`."""
    for module in model.modules():
        if isinstance(module, BertEncoder):
            module.gradient_checkpointing = enabled


class BertPooler(nn.Module):
    """tanh(dense(h[:, 0])): the [CLS] summary that feeds next sentence prediction."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, h: Tensor) -> Tensor:
        return torch.tanh(self.dense(h[:, 0]))  # (B, H)


class BertModel(nn.Module):
    """The BERT encoder: embeddings, transformer layers and pooler.

    `forward(input_ids, *, token_type_ids=None, attention_mask=None)` returns
    `(sequence_output (B, T, H), pooled_output (B, H))`. `attention_mask` is (B, T), 1/True for
    real tokens and 0/False for padding (None: all real); `token_type_ids` None means all zeros.
    Every argument after `input_ids` is keyword-only, as in every model here: Hugging Face puts
    attention_mask second, so a positional call could not mean the same in both.

    `cls_only` True computes the last layer for [CLS] alone, for a head that reads only the pooled
    output: sequence_output is then (B, 1, H). `positions` (M,), flat indices into the B*T
    positions, computes the last layer's output projection and feed-forward for those and [CLS]
    alone: sequence_output is then (M, H), in their order.

    `varlen` True runs a batch with padding through attention per sequence without a mask
    (`bertforge.varlen`; then padded positions attend to padding, and the real tokens of a row must
    be contiguous). It is off by default on every device: on an H200 the key-padding mask, which
    SDPA runs with its cuDNN kernel, trained BERT-base 2.7x faster in eager mode and 1.07x faster
    compiled (`benchmarks/padding.py`), and on CPU the masked attention of `fast_ops` is the faster.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config)
        self.varlen = False
        init_weights(self, config)

    def forward(
        self,
        input_ids: Tensor,
        *,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        cls_only: bool = False,
        positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        x = self.embeddings(input_ids, token_type_ids=token_type_ids)  # (B, T, H)
        mask = self.attention_padding(attention_mask)
        cls_only = cls_only and not isinstance(mask, Segments)  # variable-length attention runs all
        if positions is None:
            h = self.encoder(x, mask, cls_only)  # (B, T, H), or (B, 1, H)
            return h, self.pooler(h)
        B, T = input_ids.shape
        first = torch.arange(B, device=input_ids.device) * T  # (B,) each row's [CLS], for the pooler
        h = self.encoder(x, mask, rows=torch.cat([first, positions]))  # (B + M, H)
        return h[B:], self.pooler(h[:B, None])

    def attention_padding(self, attention_mask: Tensor | None) -> Mask:
        """What attention is told of the padding, built once for all layers."""
        if attention_mask is None:
            return None
        if self.varlen:
            return segments(attention_mask)
        # Key-padding mask; padded queries still attend to the real keys (as Hugging Face), so no
        # row of the softmax is empty.
        return attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)


class BertPredictionHeadTransform(nn.Module):
    """LayerNorm(act(dense(h))) before the vocabulary projection."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = get_activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, h: Tensor) -> Tensor:
        return self.LayerNorm(self.act(self.dense(h)))


PADDED_ROW_BIAS = -1e4  # a logit that no softmax picks, finite in fp16 and bf16


class BertLMPredictionHead(nn.Module):
    """Masked-LM head: transform, then a decoder tied to the word embeddings with its own bias."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        # Created on the meta device because both its tensors are replaced by tie_weights(): the
        # weight by the word embeddings, the bias by `self.bias` (the name Hugging Face saves).
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, device="meta")
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: Tensor) -> Tensor:
        return self.decoder(self.transform(h))  # (..., V)


class BertPreTrainingHeads(nn.Module):
    """The two pretraining heads: `predictions` (masked LM) and `seq_relationship` (NSP)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class BertForPreTraining(nn.Module):
    """BERT with its masked-LM and next-sentence heads; state dict identical to Hugging Face's.

    `forward(input_ids, *, token_type_ids=None, attention_mask=None, masked_positions=None)` returns
    `(mlm_logits, nsp_logits)`. With `masked_positions` (LongTensor (M,) of flat indices into the
    B*T positions) the MLM head runs only on those rows, and the last layer past attention on those
    and [CLS] only; mlm_logits is then (M, V); without it, (B, T, V). nsp_logits is (B, 2) with
    Hugging Face's labels: 0 = B follows A, 1 = B is random.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)  # initialises itself
        self.cls = BertPreTrainingHeads(config)
        init_weights(self.cls, config)  # before tying, so the embeddings are not drawn twice
        self.tie_weights()

    @torch.no_grad()
    def silence_padded_rows(self, tokens: int) -> None:
        """Start the MLM bias of the embedding rows past the tokenizer's `tokens` (a padded vocabulary's,
        which stand for no token) at PADDED_ROW_BIAS. bertforge leaves them out of every softmax, so they
        get no gradient; a softmax over all rows, as in Hugging Face's models, then gives them nothing
        (from a bias of 0 they would win it: the real tokens' biases are log frequencies, all negative)."""
        self.cls.predictions.bias[tokens:] = PADDED_ROW_BIAS

    def tie_weights(self) -> None:
        """Make the MLM decoder share the word embeddings and `cls.predictions.bias`.

        `load_state_dict` (copying in place) and `.to()` keep the ties; call this again after
        anything that replaces parameters, such as `load_state_dict(..., assign=True)`.
        """
        predictions = self.cls.predictions
        predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight
        predictions.decoder.bias = predictions.bias

    def forward(
        self,
        input_ids: Tensor,
        *,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        masked_positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        # h: (B, T, H), or (M, H) at the masked positions; pooled: (B, H)
        h, pooled = self.bert(
            input_ids,
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            positions=masked_positions,
        )
        mlm_logits = self.cls.predictions(h)  # (M, V) or (B, T, V)
        nsp_logits = self.cls.seq_relationship(pooled)  # (B, 2)
        return mlm_logits, nsp_logits


@torch.no_grad()
def init_weights(model: nn.Module, config: ModelConfig) -> None:
    """Hugging Face's BERT initialisation, applied to every submodule of `model`.

    Linear and Embedding weights ~ N(0, initializer_range); Linear biases 0; the `pad_token_id`
    row of embeddings that have one 0; LayerNorm weight 1, bias 0; the MLM output bias 0.
    A tensor shared by two modules (the tied decoder) is initialised once, by its first owner.
    """
    std = config.initializer_range
    done: set[int] = set()

    def first_time(tensor: Tensor | None) -> bool:
        if tensor is None or id(tensor) in done:
            return False
        done.add(id(tensor))
        return True

    for module in model.modules():
        if isinstance(module, nn.Linear):
            if first_time(module.weight):
                module.weight.normal_(0.0, std)
            if first_time(module.bias):
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            if first_time(module.weight):
                module.weight.normal_(0.0, std)
                if module.padding_idx is not None:
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            if first_time(module.weight):
                module.weight.fill_(1.0)
            if first_time(module.bias):
                module.bias.zero_()
        elif isinstance(module, BertLMPredictionHead) and first_time(module.bias):
            module.bias.zero_()


class BertForSequenceClassification(nn.Module):
    """BERT with a classification head on the pooled [CLS] output; state dict identical to Hugging Face's.

    `forward(input_ids, *, token_type_ids=None, attention_mask=None)` returns logits (B, num_labels).
    The head is dropout then `classifier` (Linear(hidden, num_labels)), as Hugging Face's
    `BertForSequenceClassification` with `classifier_dropout = None` (it then uses
    `hidden_dropout_prob`). There is no pretraining head: fine-tuning loads only `bert.*`.
    """

    def __init__(self, config: ModelConfig, num_labels: int):
        super().__init__()
        check_num_labels(num_labels)
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config)  # initialises itself
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_weights(self.classifier, config)

    def forward(
        self, input_ids: Tensor, *, token_type_ids: Tensor | None = None, attention_mask: Tensor | None = None
    ) -> Tensor:
        # pooled: (B, H)
        _, pooled = self.bert(
            input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, cls_only=True
        )
        return self.classifier(self.dropout(pooled))  # (B, num_labels)


class NoPooler(nn.Module):
    """In place of BERT's pooler, which a token classifier does not have (Hugging Face's
    `add_pooling_layer=False`): no weights, no output."""

    def forward(self, h: Tensor) -> None:
        return None


class BertForTokenClassification(BertForSequenceClassification):
    """BERT with a classification head on every token's state; state dict identical to Hugging Face's.

    `forward(input_ids, *, token_type_ids=None, attention_mask=None)` returns logits (B, T, num_labels):
    dropout then `classifier` (Linear(hidden, num_labels)), as Hugging Face's with
    `classifier_dropout = None` (it then uses `hidden_dropout_prob`). The sequence classifier's
    modules and initialisation, without the pooler.
    """

    def __init__(self, config: ModelConfig, num_labels: int):
        super().__init__(config, num_labels)
        self.bert.pooler = NoPooler()

    def forward(
        self, input_ids: Tensor, *, token_type_ids: Tensor | None = None, attention_mask: Tensor | None = None
    ) -> Tensor:
        h, _ = self.bert(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)  # (B, T, H)
        return self.classifier(self.dropout(h))  # (B, T, num_labels)
