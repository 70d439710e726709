"""Asking a pretrained model things: fill masks, judge sentence pairs, embed texts, and the demo's showcase.

Owns `fill_mask`, `next_sentence`, `embed` and `showcase`. Each takes a model and its tokenizer
(from `bertforge.load`), accepts one text or a list, batches its inputs (sorted by length, so a
batch carries little padding), runs in inference mode on the model's device (CPU or GPU) and
returns plain Python values or NumPy arrays that the CLI prints or saves.

Inputs longer than the model's maximum (special tokens included; `bertforge.model.reading_length`: the
length it was trained at, where its folder says, else its positions): `fill_mask`
and `next_sentence` refuse them (cutting a text could drop the mask or change the question),
`embed` truncates them with a warning (a long document still gets a vector from its beginning).

Each refuses a GPT (`bertforge.generate` continues its texts), and `fill_mask`, `next_sentence` and
`showcase` a head that never trained (`model.untrained_heads`, as `bertforge.load` marks it): the
showcase leaves an untrained NSP head out.
"""

from __future__ import annotations

import contextlib
import random
import re
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from bertforge.batches import length_sorted_batches
from bertforge.errors import BertforgeError
from bertforge.folders import HEADS
from bertforge.model import reading_length
from bertforge.progress import progress_bar
from bertforge.runtime import eval_mode, to_device
from bertforge.tokenizer import IDEOGRAPHS, BertTokenizer

DEFAULT_BATCH_SIZE = 32
POOLINGS = ("cls", "mean")
_PREVIEW = 40  # characters of a text quoted in an error message


def fill_mask(
    model: torch.nn.Module,
    tokenizer: BertTokenizer,
    text: str | Sequence[str],
    top_k: int = 5,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> list:
    """The `top_k` most likely tokens for every `[MASK]` in `text`.

    Returns, for one text, a list with one entry per `[MASK]` (left to right); for a list of
    texts, a list of those. An entry is a list of (at most) `top_k` dicts, most likely first:
    `token` (the vocabulary entry, e.g. `##s`), `token_id`, `score` (softmax probability),
    `word` (the whole word the token forms with its neighbours, `##` pieces merged) and
    `sequence` (the text with this token in place). A mask that starts a word (after a space or a
    punctuation mark) is offered no `##` piece, which could only continue a word; a mask right after a
    letter or digit may be. No mask is offered a special token ([PAD], [UNK], [CLS], [SEP], [MASK]).
    Every mask is predicted from the same input, independently of the others (as Hugging Face's
    fill-mask pipeline does). A model with a padded vocabulary (more embedding rows than tokens)
    predicts only its tokenizer's tokens.
    """
    _check_reads(model, "fill_mask", "mlm")
    texts, single = _as_list(text)
    if top_k < 1:
        raise BertforgeError(f"top_k must be at least 1, got {top_k}")
    top_k = min(top_k, tokenizer.vocab_size)
    encoded = _encode_single(tokenizer, texts, reading_length(model), truncate=False)
    for i, ids in enumerate(encoded):
        if tokenizer.mask_id not in ids:
            raise BertforgeError(
                f"{_describe(texts, i)} has no [MASK]; write [MASK] (upper case) where the word to "
                'predict goes, e.g. "the [MASK] sat on the mat"'
            )
    results: list = [None] * len(texts)
    examples = [{"input_ids": ids} for ids in encoded]
    mask_counts = [ids.count(tokenizer.mask_id) for ids in encoded]
    word_starts = [_masks_starting_words(text, n) for text, n in zip(texts, mask_counts, strict=True)]
    with _inference(model) as device:
        continuation = torch.from_numpy(tokenizer.continuation_mask()).to(device)  # (V,)
        for rows, batch in _batches(examples, batch_size, tokenizer.pad_id, device):
            is_mask = batch["input_ids"] == tokenizer.mask_id  # (B, T)
            positions = is_mask.flatten().nonzero().squeeze(1)  # (M,) flat indices, row-major
            mlm_logits, _ = model(
                batch["input_ids"], attention_mask=batch["attention_mask"], masked_positions=positions
            )
            mlm_logits = mlm_logits[:, : tokenizer.vocab_size]  # (M, V): a padded vocabulary's extra rows
            probabilities = mlm_logits.float().softmax(-1)  # (M, V)
            starts = [start for row in rows for start in word_starts[row]]
            starts = torch.tensor(starts, device=device)  # (M,) bool
            # A `##` piece cannot stand where a word starts, nor a special token anywhere: ranked last,
            # and left out below.
            probabilities[starts[:, None] & continuation[None, :]] = -1.0
            probabilities[:, list(tokenizer.special_ids)] = -1.0
            scores, ids = probabilities.topk(top_k, dim=-1)  # (M, k), (M, k)
            masks_per_row = is_mask.sum(1).tolist()
            scores, ids = scores.cpu().split(masks_per_row), ids.cpu().split(masks_per_row)
            for row, row_scores, row_ids in zip(rows, scores, ids, strict=True):
                results[row] = _describe_predictions(tokenizer, encoded[row], row_scores, row_ids)
    return results[0] if single else results


def next_sentence(
    model: torch.nn.Module,
    tokenizer: BertTokenizer,
    a: str | Sequence[str],
    b: str | Sequence[str],
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> float | list[float]:
    """The probability that `b` follows `a` (the NSP head's "IsNext"); lists give one per pair."""
    _check_reads(model, "next_sentence", "nsp")
    firsts, single = _as_list(a, "sentence a")
    seconds, _ = _as_list(b, "sentence b")
    if len(firsts) != len(seconds):
        raise BertforgeError(f"got {len(firsts)} first sentences but {len(seconds)} second ones")
    examples = _encode_pairs(tokenizer, firsts, seconds, reading_length(model))
    probabilities = [0.0] * len(examples)
    with _inference(model) as device:
        for rows, batch in _batches(examples, batch_size, tokenizer.pad_id, device):
            _, nsp_logits = model(
                batch["input_ids"],
                token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"],
                masked_positions=_no_positions(device),
            )
            is_next = nsp_logits.float().softmax(-1)[:, 0]  # (B,): label 0 = IsNext, as Hugging Face
            for row, p in zip(rows, is_next.tolist(), strict=True):
                probabilities[row] = p
    return probabilities[0] if single else probabilities


def embed(
    model: torch.nn.Module,
    tokenizer: BertTokenizer,
    texts: str | Sequence[str],
    pooling: str = "cls",
    batch_size: int = DEFAULT_BATCH_SIZE,
    show_progress: bool = False,
) -> np.ndarray:
    """One float32 vector per text: (N, hidden) for a list, (hidden,) for one text.

    `pooling="cls"` takes the final hidden state of `[CLS]` (before the pooler); `"mean"`
    averages the final hidden states of the real tokens, `[CLS]` and `[SEP]` included, padding
    excluded. Texts over the model's maximum length are truncated, with one warning.
    """
    _check_reads(model, "embed")
    if pooling not in POOLINGS:
        raise BertforgeError(f"pooling must be one of: {', '.join(POOLINGS)}; got {pooling!r}")
    if batch_size < 1:
        raise BertforgeError(f"batch_size must be at least 1, got {batch_size}")
    texts, single = _as_list(texts)
    encoded = _encode_single(tokenizer, texts, reading_length(model), truncate=True)
    encoder = getattr(model, "bert", model)  # the pretraining model's encoder, or a bare BertModel
    vectors = np.zeros((len(texts), encoder.config.hidden_size), dtype=np.float32)
    with _inference(model) as device:
        batches = _batches([{"input_ids": ids} for ids in encoded], batch_size, tokenizer.pad_id, device)
        total = -(-len(encoded) // batch_size)
        shown = progress_bar(batches, total=total, unit="batch", desc="embed", disable=not show_progress)
        for rows, batch in shown:
            attention_mask = batch["attention_mask"]  # (B, T)
            hidden, _ = encoder(batch["input_ids"], attention_mask=attention_mask)  # (B, T, H)
            if pooling == "cls":
                pooled = hidden[:, 0]  # (B, H)
            else:
                weights = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
                pooled = (hidden * weights).sum(1) / weights.sum(1)  # (B, H)
            vectors[rows] = pooled.float().cpu().numpy()
    return vectors[0] if single else vectors


# Function words never masked by the showcase: predicting "the" says little about a model.
_FUNCTION_WORDS = """
about above after again against also although among another because been before being below
between both could does doing down during each either every from further have having here
however into itself just many more most much must neither other over same several should since
some such than that their them themselves then there these they this those though through under
until upon very were what when where whether which while whom whose will with within without
would your"""
_STOPWORDS = frozenset(_FUNCTION_WORDS.split())


def showcase(
    model: torch.nn.Module,
    tokenizer: BertTokenizer,
    documents: Sequence[Sequence[str]],
    count: int = 5,
    seed: int = 0,
    top_k: int = 5,
    nsp: bool = True,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> list[dict]:
    """What the demo prints: for `count` sentences (a seeded choice among those that have a next
    sentence in their document), one content word masked and the `top_k` predictions, and the
    probability that the true next sentence, and a random one from another document, follow it
    (with `nsp`, where the model's NSP head trained and there are two documents or more).

    Returns one dict per sentence: `masked` (the sentence with `[MASK]`), `answer`, `predictions`
    (as `fill_mask`), `hit` (the answer is among them), and with `nsp`: `next`, `random`,
    `p_next`, `p_random`.
    """
    _check_reads(model, "showcase", "mlm")
    nsp = nsp and "nsp" not in getattr(model, "untrained_heads", ())
    if count < 1:
        raise BertforgeError(f"the showcase needs at least one sentence, got {count}")
    examples = _choose_sentences(tokenizer, documents, count, random.Random(seed), reading_length(model), nsp)
    predictions = fill_mask(model, tokenizer, [e["masked"] for e in examples], top_k, batch_size)
    for example, found in zip(examples, predictions, strict=True):
        example["predictions"] = found[0]
        answer_id = tokenizer.encode_batch([example["answer"]])[0][0]
        example["hit"] = any(p["token_id"] == answer_id for p in found[0])
    if "random" in examples[0]:
        firsts = [e["sentence"] for e in examples]
        p_next = next_sentence(model, tokenizer, firsts, [e["next"] for e in examples], batch_size)
        p_random = next_sentence(model, tokenizer, firsts, [e["random"] for e in examples], batch_size)
        for example, p, q in zip(examples, p_next, p_random, strict=True):
            example["p_next"], example["p_random"] = p, q
    return examples


def _choose_sentences(
    tokenizer: BertTokenizer,
    documents: Sequence[Sequence[str]],
    count: int,
    rng: random.Random,
    max_length: int,
    nsp: bool,
) -> list[dict]:
    """Up to `count` sentences with a successor, one content word masked, and a random other sentence."""
    candidates = [(d, s) for d, doc in enumerate(documents) for s in range(len(doc) - 1)]
    rng.shuffle(candidates)
    examples = []
    for d, s in candidates:
        if len(examples) == count:
            break
        sentence, following = documents[d][s], documents[d][s + 1]
        masked = _mask_content_word(tokenizer, sentence, rng)
        if masked is None or not _fits(tokenizer, [sentence, following], max_length):
            continue
        example = {"masked": masked[0], "answer": masked[1], "sentence": sentence, "next": following}
        if nsp and len(documents) > 1:
            other = rng.choice([i for i in range(len(documents)) if i != d])
            example["random"] = rng.choice(documents[other])
            if not _fits(tokenizer, [sentence, example["random"]], max_length):
                continue
        examples.append(example)
    if not examples:
        raise BertforgeError(
            "the corpus has no sentence with a following one that fits the model and has a content word "
            "to mask; give a corpus of several-sentence documents"
        )
    return examples


def _mask_content_word(tokenizer: BertTokenizer, sentence: str, rng: random.Random) -> tuple[str, str] | None:
    """(sentence with one content word replaced by [MASK], that word), or None when none qualifies.

    A content word is alphabetic, at least 4 letters, not a function word, and one token of the
    vocabulary (so a single [MASK] stands for all of it).
    """
    words = sentence.split()
    if len(words) < 5 or "[UNK]" in sentence:  # unknown words make a poor quiz
        return None
    choices = [i for i, w in enumerate(words) if w.isalpha() and len(w) >= 4 and w.lower() not in _STOPWORDS]
    if not choices:
        return None
    pieces = tokenizer.encode_batch([words[i] for i in choices])
    single = [
        i for i, ids in zip(choices, pieces, strict=True) if len(ids) == 1 and ids[0] != tokenizer.unk_id
    ]
    if not single:
        return None
    chosen = rng.choice(single)
    return " ".join(words[:chosen] + ["[MASK]"] + words[chosen + 1 :]), words[chosen]


def _fits(tokenizer: BertTokenizer, sentences: list[str], max_length: int) -> bool:
    return sum(len(ids) for ids in tokenizer.encode_batch(sentences)) + 3 <= max_length


def _describe_predictions(
    tokenizer: BertTokenizer, ids: list[int], scores: torch.Tensor, candidates: torch.Tensor
) -> list[list[dict]]:
    """For each mask of one text (scores and candidate ids (k,) per mask), the dicts `fill_mask` returns."""
    positions = [p for p, token in enumerate(ids) if token == tokenizer.mask_id]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    found = []
    for position, mask_scores, mask_ids in zip(positions, scores, candidates, strict=True):
        options = []
        for score, candidate in zip(mask_scores.tolist(), mask_ids.tolist(), strict=True):
            if score < 0:  # a `##` piece where a word starts, or a special token
                continue
            filled, filled_tokens = list(ids), list(tokens)
            filled[position] = candidate
            filled_tokens[position] = tokenizer.convert_ids_to_tokens([candidate])[0]
            options.append(
                {
                    "token": filled_tokens[position],
                    "token_id": candidate,
                    "score": score,
                    "word": _whole_word(tokenizer, filled, filled_tokens, position),
                    "sequence": tokenizer.decode(filled[1:-1]),  # without [CLS] and [SEP]
                }
            )
        found.append(options)
    return found


_JOINS_A_PIECE = re.compile(f"[^\\W_{IDEOGRAPHS}]")  # a letter or digit that is not an ideograph


def _masks_starting_words(text: str, count: int) -> list[bool]:
    """For each of the `count` masks of `text`, left to right: whether it starts a word (nothing, a
    space, a punctuation mark or a CJK ideograph, a word of its own, before it), where only a whole
    word or a word's first piece can go. A mask right after a letter or digit ("play[MASK]") may be a
    `##` piece."""
    found = [match.start() for match in re.finditer(re.escape("[MASK]"), text)]
    starts = [index == 0 or not _JOINS_A_PIECE.match(text[index - 1]) for index in found]
    return starts if len(starts) == count else [False] * count  # the tokenizer read them otherwise


def _whole_word(tokenizer: BertTokenizer, ids: list[int], tokens: list[str], position: int) -> str:
    """The word around `position`: the `##` pieces before and after it, joined."""
    start, end = position, position + 1
    while start > 1 and tokens[start].startswith("##"):
        start -= 1
    while end < len(tokens) - 1 and tokens[end].startswith("##"):
        end += 1
    return tokenizer.decode(ids[start:end])


def _check_reads(model: torch.nn.Module, function: str, head: str | None = None) -> None:
    """Refuse a GPT, and a BERT whose `head` ("mlm", "nsp") never trained (`model.untrained_heads`, as
    `bertforge.load` marks it): its answers would be noise."""
    if getattr(getattr(model, "config", None), "objective", "mlm") != "mlm":
        raise BertforgeError(
            f"`{function}` needs a BERT, and this model is a GPT (pretrained with --objective clm), which "
            "predicts the next token: continue a text with bertforge.generate.generate"
        )
    if head in getattr(model, "untrained_heads", ()):
        raise BertforgeError(
            f"this model's {HEADS[head][1]} head never trained (it was pretrained without it, or imported "
            f"from weights without it), so `{function}` would return noise; use a model pretrained with it"
        )


def _as_list(text: str | Sequence[str], what: str = "text") -> tuple[list[str], bool]:
    """(texts, whether a single string was given); refuses an empty list and non-strings."""
    if isinstance(text, str):
        return [text], True
    texts = list(text)
    if not texts:
        raise BertforgeError(f"no {what} given; pass a string or a non-empty list of strings")
    if not all(isinstance(t, str) for t in texts):
        raise BertforgeError(f"every {what} must be a string")
    return texts, False


def _describe(texts: list[str], i: int) -> str:
    preview = texts[i] if len(texts[i]) <= _PREVIEW else texts[i][:_PREVIEW] + "..."
    return f"the text {preview!r}" if len(texts) == 1 else f"text {i + 1} ({preview!r})"


def _encode_pairs(
    tokenizer: BertTokenizer, firsts: list[str], seconds: list[str], max_length: int
) -> list[dict]:
    """`[CLS] a [SEP] b [SEP]` ids and segment ids for each pair; an empty sentence, or a pair longer
    than `max_length`, refused."""
    examples = []
    for i, (first, second) in enumerate(zip(firsts, seconds, strict=True)):
        input_ids, token_type_ids = tokenizer.encode_pair(first, second)
        first_length = token_type_ids.count(0) - 2  # segment 0 is [CLS] a [SEP]
        for texts, length in ((firsts, first_length), (seconds, len(input_ids) - first_length - 3)):
            if not length:
                raise BertforgeError(f"{_describe(texts, i)} is empty; give two non-empty sentences")
        if len(input_ids) > max_length:
            raise BertforgeError(
                f"pair {i + 1} is {len(input_ids)} tokens long with [CLS] and two [SEP], more than the "
                f"model's maximum of {max_length}; shorten the sentences"
            )
        examples.append({"input_ids": input_ids, "token_type_ids": token_type_ids})
    return examples


def _encode_single(
    tokenizer: BertTokenizer, texts: list[str], max_length: int, truncate: bool
) -> list[list[int]]:
    """`[CLS] text [SEP]` ids for each text; empty texts refused, long ones refused or truncated."""
    encoded, truncated = [], 0
    for i, ids in enumerate(tokenizer.encode_batch(texts)):
        if not ids:
            raise BertforgeError(f"{_describe(texts, i)} is empty (no tokens); give some text")
        if len(ids) + 2 > max_length:
            if not truncate:
                raise BertforgeError(
                    f"{_describe(texts, i)} is {len(ids) + 2} tokens long with [CLS] and [SEP], more than "
                    f"the model's maximum of {max_length}; shorten it"
                )
            ids, truncated = ids[: max_length - 2], truncated + 1
        encoded.append([tokenizer.cls_id, *ids, tokenizer.sep_id])
    if truncated:
        warnings.warn(
            f"{truncated} of {len(texts)} texts are longer than the model's maximum of {max_length} tokens; "
            "only their first tokens were used",
            stacklevel=3,
        )
    return encoded


@contextlib.contextmanager
def _inference(model: torch.nn.Module) -> Iterator[torch.device]:
    """Eval mode and `torch.inference_mode` for the block (train mode restored after); yields the device."""
    with eval_mode(model), torch.inference_mode():
        yield next(model.parameters()).device


def _batches(
    examples: list[dict], batch_size: int, pad_id: int, device: torch.device
) -> Iterator[tuple[list[int], dict[str, torch.Tensor]]]:
    """`length_sorted_batches` on `device`: (row indices, input_ids, token_type_ids and
    attention_mask, each (B, T))."""
    for rows, batch in length_sorted_batches(examples, batch_size, pad_id):
        yield rows, to_device(batch, device)


def _no_positions(device: torch.device) -> torch.Tensor:
    """An empty `masked_positions`: the MLM head runs on no token when only NSP is wanted."""
    return torch.zeros(0, dtype=torch.long, device=device)
