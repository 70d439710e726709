"""Text continuation with a GPT model (`bertforge.gpt.GPTLMHeadModel`): greedy decoding and sampling.

One token at a time, left to right. Each step feeds only the new token and reads the keys and
values of the earlier ones from a `KVCache`; once the sequence outgrows the window (by default
the length the model was trained on, or without a record of it `max_position_embeddings`), each
step recomputes the last window of tokens (the positions shift, so a cache no longer applies).
Greedy decoding picks the most likely token, as `transformers`' `generate(do_sample=False)`;
sampling draws from the softmax after, in Hugging Face's order, temperature, top-k and top-p
(nucleus) filtering, from a `torch.Generator` seeded by `seed` so that a seeded call repeats itself
exactly on the same device.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from bertforge.errors import BertforgeError
from bertforge.gpt import GPTLMHeadModel, KVCache
from bertforge.model import reading_length
from bertforge.progress import Progress, progress_bar
from bertforge.runtime import eval_mode


@torch.no_grad()
def generate(
    model: GPTLMHeadModel,
    input_ids: Tensor,
    max_new_tokens: int,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    use_cache: bool = True,
    window: int | None = None,
    vocab_size: int | None = None,
    show_progress: bool = False,
) -> Tensor:
    """The prompts `input_ids` (B, T) or (T,) followed by up to `max_new_tokens` new tokens each.

    Prompts in a batch share one length (no padding). A row that produced `eos_token_id` is
    finished: it is filled with `pad_token_id` (default: the end token) until every row is, and
    generation stops early when all are. `top_k` 0 and `top_p` 1 turn those filters off. The
    model runs in eval mode (no dropout) and is put back in its former mode afterwards. `window`: the
    most tokens a prediction reads (default: the length it was trained at, where its folder recorded
    it, as `bertforge.load` marks it; at most the model's positions). `vocab_size`: the
    tokenizer's tokens, the only ids chosen (default: every output row; an import may have padded rows).
    `show_progress`: a bar over the new tokens on standard error.
    """
    check_settings(input_ids, max_new_tokens, temperature, top_k, top_p)
    positions = model.config.max_position_embeddings
    window = reading_length(model) if window is None else min(window, positions)
    ids = input_ids if input_ids.dim() == 2 else input_ids[None]  # (B, T)
    pick = _Picker(do_sample, temperature, top_k, top_p, seed, ids.device, vocab_size)
    bar = progress_bar(total=max_new_tokens, unit="token", desc="generate", disable=not show_progress)
    with eval_mode(model), bar:
        ids = _decode(model, ids, max_new_tokens, pick, eos_token_id, pad_token_id, use_cache, window, bar)
    return ids if input_ids.dim() == 2 else ids[0]


def check_settings(
    input_ids: Tensor, max_new_tokens: int, temperature: float, top_k: int, top_p: float
) -> None:
    """Raise `BertforgeError` naming the first impossible generation setting."""
    if input_ids.dim() not in (1, 2) or input_ids.shape[-1] == 0:
        raise BertforgeError("the prompt must hold at least one token (ids of shape (T,) or (B, T))")
    if max_new_tokens < 0:
        raise BertforgeError(f"max_new_tokens must be 0 or more, got {max_new_tokens}")
    if not (temperature > 0 and math.isfinite(temperature)):  # NaN fails every comparison
        raise BertforgeError(
            f"temperature must be positive and finite, got {temperature} (for greedy decoding, do not sample)"
        )
    if top_k < 0:
        raise BertforgeError(f"top_k must be 0 (off) or more, got {top_k}")
    if not 0 < top_p <= 1:
        raise BertforgeError(f"top_p must be in (0, 1], got {top_p}")


def _decode(
    model: GPTLMHeadModel,
    ids: Tensor,
    max_new_tokens: int,
    pick: _Picker,
    eos_token_id: int | None,
    pad_token_id: int | None,
    use_cache: bool,
    window: int,
    bar: Progress,
) -> Tensor:
    """The decoding loop: ids (B, T) -> (B, T + n), n <= max_new_tokens."""
    pad = eos_token_id if pad_token_id is None else pad_token_id
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)  # (B,)
    cache = model.new_cache() if use_cache else None
    for _ in range(max_new_tokens):
        logits, cache = next_token_logits(model, ids, cache, window)  # (B, V)
        token = pick(logits)  # (B,)
        if eos_token_id is not None:
            token = token.masked_fill(finished, pad)
            finished |= token == eos_token_id
        ids = torch.cat([ids, token[:, None]], dim=1)  # (B, T + 1)
        bar.update(1)
        if finished.all():
            break
    return ids


def next_token_logits(
    model: GPTLMHeadModel, ids: Tensor, cache: KVCache | None, window: int
) -> tuple[Tensor, KVCache | None]:
    """float32 logits (B, V) for the token after `ids` (B, T), and the cache to use next time.

    With a cache, only the tokens it has not seen run through the model. Past `window` tokens the
    last `window` are recomputed and the cache is dropped.
    """
    if cache is not None and ids.shape[1] <= window:
        return model(ids[:, cache.length :], cache=cache)[:, -1].float(), cache
    return model(ids[:, -window:])[:, -1].float(), None


class _Picker:
    """Chooses the next token from logits (B, V): argmax, or a draw from the filtered softmax."""

    def __init__(
        self,
        do_sample: bool,
        temperature: float,
        top_k: int,
        top_p: float,
        seed: int | None,
        device,
        vocab_size: int | None = None,
    ):
        self.do_sample, self.temperature, self.top_k, self.top_p = do_sample, temperature, top_k, top_p
        self.vocab_size = vocab_size
        self.generator = None
        if do_sample and seed is not None:
            self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, logits: Tensor) -> Tensor:
        logits = logits[:, : self.vocab_size]  # (B, V): padded rows are no tokens
        if not self.do_sample:
            return logits.argmax(-1)  # (B,)
        # Shifted to a maximum of 0 first, and a temperature that the logits' dtype holds as no 0: a tiny
        # one then sends the others to -inf, not all of them to inf.
        temperature = max(self.temperature, torch.finfo(logits.dtype).tiny)
        scaled = (logits - logits.amax(-1, keepdim=True)) / temperature  # (B, V)
        probs = filter_logits(scaled, self.top_k, self.top_p).softmax(-1)  # (B, V)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)  # (B,)


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """logits (B, V) with every token outside the top-k and the top-p nucleus set to -inf.

    Top-k keeps exactly min(k, V) tokens (ties broken by `topk`). Top-p keeps the most likely
    tokens until their probability reaches `top_p`: a token stays when the tokens more likely
    than it hold less than `top_p`, so the most likely one always stays.
    """
    if 0 < top_k < logits.shape[-1]:
        values, indices = logits.topk(top_k, dim=-1)  # (B, k)
        logits = torch.full_like(logits, float("-inf")).scatter(-1, indices, values)  # (B, V)
    if top_p < 1.0:
        ordered, order = logits.sort(dim=-1, descending=True)  # (B, V)
        probs = ordered.softmax(-1)  # (B, V)
        dropped = probs.cumsum(-1) - probs >= top_p  # (B, V): the more likely tokens already hold top_p
        # `order` is a permutation, so the scatter overwrites every entry: back in vocabulary order.
        drop = torch.empty_like(dropped).scatter_(-1, order, dropped)  # (B, V)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits
