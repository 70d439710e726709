"""The fine-tuned token classifier (a named-entity tagger): building it, its folder, its predictions.

A tagger folder (what `bertforge finetune` writes as `final/` for a tagged task) is a classifier
folder (see `bertforge.classifier`) whose `labels.json` names the task:
`{"labels": [tags in id order], "task": "token-classification"}`, and whose weights are Hugging
Face's `BertForTokenClassification`'s: `bert.embeddings.*`, `bert.encoder.*` (no pooler),
`classifier.weight` and `classifier.bias`. `bertforge export` writes it as that class, which
`pipeline("token-classification")` loads.

A GPT is refused: Hugging Face's OpenAIGPT has no token-classification head to export it to, and a
left-to-right model would tag each word without the words after it.

Owns building the model (`token_classifier`; the network is `bertforge.model`'s
`BertForTokenClassification`), telling a tagger folder from a
sequence classifier's (`is_tagger_folder`) and tagging raw texts (`tag`): the entities of each text
with their type, character offsets and score (the mean probability of their words' tags), read
from the first piece of every word as the tagger was trained (`bertforge.alignment`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from bertforge.alignment import encode_words, regroup, text_words
from bertforge.batches import length_sorted_batches
from bertforge.checkpoint import CONFIG, LABELS
from bertforge.config import ModelConfig
from bertforge.entities import entity_spans, is_tag
from bertforge.errors import BertforgeError
from bertforge.io import read_json
from bertforge.model import BertForTokenClassification, reading_length
from bertforge.tokenizer import BertTokenizer

TOKEN_TASK = "token-classification"  # labels.json's "task" in a tagger folder
ARCHITECTURE = "BertForTokenClassification"


def token_classifier(model: ModelConfig, num_labels: int) -> BertForTokenClassification:
    """The token classifier for a pretrained architecture: BERT's; a GPT is refused."""
    check_taggable(model)
    return BertForTokenClassification(model, num_labels)


def check_taggable(model: ModelConfig) -> None:
    if model.objective == "clm":
        raise BertforgeError(
            "token classification needs a BERT (pretrained with --objective mlm): this model is a GPT, "
            "which reads each word without the words after it and has no token-classification head in "
            "Hugging Face's OpenAIGPT to export to"
        )


def is_tagger_folder(folder: Path) -> bool:
    """A tagger of ours (labels.json names the task) or an exported or Hugging Face one (config.json's
    architectures name `BertForTokenClassification`)."""
    folder = Path(folder)
    if (folder / LABELS).is_file() and read_json(folder / LABELS).get("task") == TOKEN_TASK:
        return True
    if not (folder / CONFIG).is_file():
        return False
    return ARCHITECTURE in (read_json(folder / CONFIG).get("architectures") or [])


@torch.inference_mode()
def tag(
    model: BertForTokenClassification,
    tokenizer: BertTokenizer,
    labels: list[str],
    texts: list[str],
    max_length: int | None = None,
    batch_size: int = 64,
) -> list[dict]:
    """The words and entities of each text, in input order.

    Returns one dict per text: `words`, each `{"word", "start", "end", "tag", "score"}`, and
    `entities`, each `{"entity": type, "start", "end", "text", "score"}` with `start` and `end`
    character offsets into the text (`text[start:end]`) and the mean of its words' scores. Texts
    longer than `max_length` pieces (default: the length it was fine-tuned at, `model.max_length` where
    `folders.open_tagger` opened it, else the model's positions) are tagged in windows.
    """
    other = next((label for label in labels if not is_tag(label)), None)
    if other is not None:
        raise BertforgeError(
            f"the tagger tags words with {other!r}, which is not a tag of the IOB schemes (O, B-TYPE, "
            "I-TYPE) that entities are read from; use a tagger trained on IOB tags, such as CoNLL-2003's"
        )
    model.eval()
    device = next(model.parameters()).device
    max_length = max_length or reading_length(model)
    parsed = [text_words(tokenizer, text) for text in texts]
    examples = [example for pieces, _ in parsed for example in encode_words(tokenizer, pieces, max_length)]
    per_window: list[list[tuple[int, float]]] = [[] for _ in examples]  # (tag id, probability) per word
    for rows, batch in length_sorted_batches(examples, batch_size, tokenizer.pad_id):
        logits = model(
            batch["input_ids"].to(device),
            token_type_ids=batch["token_type_ids"].to(device),
            attention_mask=batch["attention_mask"].to(device),
        )  # (B, T, K)
        best = torch.softmax(logits.float(), dim=-1).max(-1)  # (B, T)
        for at, row in enumerate(rows):
            firsts = examples[row]["firsts"]
            per_window[row] = list(
                zip(best.indices[at, firsts].tolist(), best.values[at, firsts].tolist(), strict=True)
            )
    predicted = [word for window in per_window for word in window]
    by_text = regroup(predicted, [len(pieces) for pieces, _ in parsed])
    return [
        tagged_text(text, spans, [(labels[i], score) for i, score in words])
        for text, (_, spans), words in zip(texts, parsed, by_text, strict=True)
    ]


def tagged_text(text: str, spans: list[tuple[int, int]], words: list[tuple[str, float]]) -> dict:
    """One text's words (their character spans and predicted tags with scores) and its entities."""
    tags = [tag_name for tag_name, _ in words]
    entities = []
    for kind, first, end in entity_spans(tags):
        start, stop = spans[first][0], spans[end - 1][1]
        score = sum(score for _, score in words[first:end]) / (end - first)
        entities.append(
            {"entity": kind, "start": start, "end": stop, "text": text[start:stop], "score": score}
        )
    return {
        "words": [
            {"word": text[s:e], "start": s, "end": e, "tag": name, "score": score}
            for (s, e), (name, score) in zip(spans, words, strict=True)
        ],
        "entities": entities,
    }
