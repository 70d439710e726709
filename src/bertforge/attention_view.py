"""Attention maps: how much each head of each layer attends from every token to every other one.

Works for any bertforge model built of `model.BertSelfAttention` sublayers: BERT (bidirectional,
`bert.encoder.layer[i].attention.self`), its classifier, and GPT-1 (causal, `gpt.layer[i]`, whose
`CausalSelfAttention` is a subclass). Attention runs through `scaled_dot_product_attention`, which
never materialises its weights, so they are recomputed: forward pre-hooks capture what each
sublayer receives (its input and mask) during one forward pass in eval mode, and the weights are
softmax(q k^T / sqrt(head_dim)) from the sublayer's own query and key projections, with the mask
the sublayer applies (BERT's key-padding mask; for GPT the causal mask and any padding it is given).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from bertforge.errors import BertforgeError
from bertforge.gpt import CausalSelfAttention, GPTForSequenceClassification
from bertforge.model import BertSelfAttention, reading_length
from bertforge.runtime import eval_mode
from bertforge.tokenizer import BertTokenizer


@dataclass
class AttentionMaps:
    """One text's attention: `weights[l, h, i, j]` is how much query token i attends to key token j
    in head h of layer l (0-based; each row sums to 1)."""

    tokens: list[str]
    weights: Tensor  # (layers, heads, T, T) float32 on the CPU
    causal: bool  # GPT: token i attends to tokens 0..i only


def attention_maps(
    model: nn.Module, tokenizer: BertTokenizer, text: str, pair: str | None = None
) -> AttentionMaps:
    """The attention maps of every layer and head of `model` for one text (or a BERT sentence pair).

    BERT and a GPT classifier read `[CLS] text [SEP]` (`[CLS] text [SEP] pair [SEP]`, segments 0 then
    1), as they were trained to; a pretrained GPT reads the text's tokens as they are, as a prompt.
    A text longer than the model's maximum
    (`bertforge.model.reading_length`) is refused.
    """
    causal = is_causal(model)
    prompt = causal and not isinstance(model, GPTForSequenceClassification)
    if prompt and pair is not None:
        raise BertforgeError("a GPT model reads one text, not a pair; give the text alone")
    for what, part in (("text", text), ("second text", pair)):
        if part is not None and not tokenizer.encode_batch([part])[0]:
            raise BertforgeError(f"the {what} is empty (no tokens); give some text")
    if prompt:
        ids, token_types = tokenizer.encode_batch([text])[0], None
    else:
        ids, token_types = tokenizer.encode_pair(text, pair)
    limit = reading_length(model)  # positions past the length it was trained at never trained
    if len(ids) > limit:
        with_specials = "pair with [CLS] and two [SEP]" if pair is not None else "text with [CLS] and [SEP]"
        raise BertforgeError(
            f"the {'text' if prompt else with_specials} is {len(ids)} tokens long, more than the model's "
            f"maximum of {limit}; shorten it"
        )
    device = next(model.parameters()).device
    inputs = {} if token_types is None else {"token_type_ids": torch.tensor([token_types], device=device)}
    weights = attention_weights(model, torch.tensor([ids], device=device), **inputs)[0]
    return AttentionMaps(tokenizer.convert_ids_to_tokens(ids), weights.cpu(), causal)


def is_causal(model: nn.Module) -> bool:
    return any(isinstance(module, CausalSelfAttention) for module in model.modules())


def attention_weights(model: nn.Module, input_ids: Tensor, **inputs) -> Tensor:
    """(B, layers, heads, T, T) float32 attention weights of one forward pass of `model(input_ids,
    **inputs)` in eval mode (the model's mode is restored after), in the order the layers run."""
    captured: list[Tensor] = []

    def capture(module: BertSelfAttention, args: tuple) -> None:
        x, mask = args[0], args[1]  # BERT: (x, mask); GPT: (x, mask, cache, index)
        captured.append(recompute(module, x, mask))

    sublayers = [m for m in model.modules() if isinstance(m, BertSelfAttention)]
    hooks = [module.register_forward_pre_hook(capture) for module in sublayers]
    try:
        with eval_mode(model), torch.no_grad():
            model(input_ids, **inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(captured, dim=1)  # (B, L, nh, T, T)


def recompute(module: BertSelfAttention, x: Tensor, mask: Tensor | None) -> Tensor:
    """The softmax weights (B, nh, T, T) that `module` applies to its input x (B, T, H)."""
    T = x.shape[1]

    def heads(projection: nn.Linear) -> Tensor:
        return module.heads(projection(x).float())  # (B, nh, T, hd)

    scores = heads(module.query) @ heads(module.key).transpose(-1, -2) / math.sqrt(module.head_dim)
    if isinstance(module, CausalSelfAttention):
        # A GPT classifier's last block gets the mask row of its read-out token alone (B, 1, 1, T):
        # every query of the map needs the causal rows as well.
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # (T, T)
        mask = causal if mask is None else mask & causal
    if mask is not None:  # True where a query may attend to a key; broadcasts to (B, nh, T, T)
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1)  # (B, nh, T, T)
