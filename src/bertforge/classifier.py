"""The fine-tuned classifier: building it, its folder (labels.json included), and predictions.

A classifier folder (what `bertforge finetune` writes as `final/`, and `bertforge export` reads)
holds exactly:

    model.safetensors   bert.embeddings.*, bert.encoder.*, bert.pooler.*, classifier.weight,
                        classifier.bias (Hugging Face's `BertForSequenceClassification` names)
    config.json         the run config (bertforge's RunConfig JSON)
    labels.json         {"labels": [label names in id order], "pairs": fine-tuned on text pairs}
    tokenizer.json, vocab.txt, bertforge_tokenizer.json

A regression model (fine-tuned on real-valued labels) is the same with a head of one output and one
label, the name of its score (Hugging Face's `num_labels = 1`, `problem_type = "regression"`).

A classifier fine-tuned from a GPT (`model.objective = "clm"`) is a
`bertforge.gpt.GPTForSequenceClassification`: `gpt.*` and `score.weight` (no bias), read at the last
real token, as GPT-1 and Hugging Face's `OpenAIGPTForSequenceClassification` do.

Owns building the classifier for a pretrained architecture (`sequence_classifier`), writing its
folder (`save_classifier`), labels.json and the label fields of an exported config.json
(`label_file`, `read_labels`, `read_pairs`, `hf_label_fields`, a tagger's too) and labelling texts with
it (`classify`); `bertforge.folders.open_classifier`
opens a classifier folder, ours or the Hugging Face form that `bertforge export` writes.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from bertforge.batches import length_sorted_batches
from bertforge.checkpoint import CONFIG, LABELS, WEIGHTS, save_weights
from bertforge.config import ModelConfig, RunConfig, save_json
from bertforge.errors import BertforgeError
from bertforge.gpt import GPTForSequenceClassification
from bertforge.io import atomic_directory, read_json, write_json
from bertforge.model import BertForSequenceClassification, reading_length
from bertforge.tokenizer import BertTokenizer

Classifier = BertForSequenceClassification | GPTForSequenceClassification
ENCODER = {"mlm": "bert", "clm": "gpt"}  # objective -> the encoder's attribute and weight prefix
# batches' worth of texts encoded and sorted by length at once: a long input's tokens are never all
# held, and batches of like lengths pad little (SST-2's dev set: 2.5x faster, docs/records/downstream.md)
SORTED_BATCHES = 64


def sequence_classifier(model: ModelConfig, num_labels: int) -> Classifier:
    """The classifier for a pretrained architecture: on BERT's pooled [CLS], or on GPT's last real token
    (`num_labels = 1`: a regression's one output)."""
    if model.objective == "clm":
        return GPTForSequenceClassification(model, num_labels)
    return BertForSequenceClassification(model, num_labels)


def save_classifier(
    folder: Path,
    model: torch.nn.Module,
    tokenizer: BertTokenizer,
    config: RunConfig,
    labels,
    task: str | None = None,
    pairs: bool | None = None,
) -> None:
    """Write a classifier folder atomically: it appears complete or not at all. A `task` other than
    sequence classification (a tagger's, `bertforge.tagger.TOKEN_TASK`) is named in labels.json, and
    so is whether the model was fine-tuned on text `pairs` (which `bertforge classify` checks)."""
    assert len(labels) == model.num_labels
    with atomic_directory(Path(folder)) as tmp:
        save_weights(model, tmp / WEIGHTS, tokenizer)
        save_json(config, tmp / CONFIG)
        write_json(tmp / LABELS, label_file(labels, task, pairs))
        tokenizer.save(tmp, config.trained_length)


def warn_unlike_training(trained_on_pairs: bool | None, pairs: list[str | None]) -> None:
    """Warn when the inputs are not the kind the classifier was fine-tuned on: single texts for a model of
    text pairs, or pairs (a tab in the line) for a model of single texts."""
    given, count = sum(pair is not None for pair in pairs), len(pairs)
    if trained_on_pairs and given < count:
        warnings.warn(
            f"the model was fine-tuned on text pairs, and {count - given:,} of {count:,} texts have no "
            "tab; give each pair as its two texts with a tab between them (A<TAB>B)",
            stacklevel=2,
        )
    elif trained_on_pairs is False and given:
        warnings.warn(
            f"the model was fine-tuned on single texts, and {given:,} of {count:,} texts have a tab, "
            "read as a pair's two texts; remove the tabs, or fine-tune on pairs (--text-pair-column)",
            stacklevel=2,
        )


def classify(
    model: Classifier,
    tokenizer: BertTokenizer,
    labels: list[str],
    texts: list[str],
    pairs: list[str | None] | None = None,
    max_length: int | None = None,
    batch_size: int = 64,
    warn_truncated: bool = True,
) -> list[dict]:
    """Label and class probabilities of each text (or text pair), in input order.

    Returns one dict per text: `label`, `score` (its probability) and `probabilities` (every label);
    for a regression model (one label) `{"score": its output}`. Texts longer than `max_length` tokens
    (default: the length it was fine-tuned at, `model.max_length` where `folders.open_classifier` opened
    it, else the model's positions) are truncated, with a warning unless `warn_truncated` is False.
    """
    max_length = max_length or reading_length(model)
    pairs = pairs or [None] * len(texts)
    results, truncated = _classified(model, tokenizer, labels, texts, pairs, max_length, batch_size)
    if truncated and warn_truncated:  # here, not under inference_mode's wrapper: the warning names our caller
        warnings.warn(
            f"{truncated:,} of {len(texts):,} texts are longer than the {max_length} tokens the model reads; "
            "only their first tokens were used",
            stacklevel=2,
        )
    return results


@torch.inference_mode()
def _classified(model, tokenizer, labels, texts, pairs, max_length, batch_size) -> tuple[list[dict], int]:
    """`classify`'s results, and how many texts were cut to `max_length`."""
    model.eval()
    device = next(model.parameters()).device
    results, truncated = [], 0
    window = max(batch_size, 1) * SORTED_BATCHES  # a batch_size under 1: refused by length_sorted_batches
    for start in range(0, len(texts), window):
        chunk = texts[start : start + window], pairs[start : start + window]
        encoded, cuts = tokenizer.encode_pairs_and_cuts(*chunk, max_length)
        _refuse_tokenless(encoded, chunk[1], start, len(texts))
        truncated += cuts
        examples = [{"input_ids": ids, "token_type_ids": types} for ids, types in encoded]
        labelled: list[dict] = [{}] * len(examples)
        for rows, batch in length_sorted_batches(examples, batch_size, tokenizer.pad_id):
            logits = model(
                batch["input_ids"].to(device),
                token_type_ids=batch["token_type_ids"].to(device),
                attention_mask=batch["attention_mask"].to(device),
            )  # (B, K)
            for row, result in zip(rows, _label_rows(logits.float(), labels), strict=True):
                labelled[row] = result
        results += labelled
    return results, truncated


def _refuse_tokenless(encoded: list[tuple[list[int], list[int]]], pairs, start: int, total: int) -> None:
    """Refuse a text, or either text of a pair, that gives no tokens (blank, or only characters the
    tokenizer drops, such as a zero-width space): its model input would hold [SEP]s alone. Segment 0
    holds [CLS] text [SEP], segment 1 the pair's second text and [SEP]."""
    for i, ((_, types), pair) in enumerate(zip(encoded, pairs, strict=True)):
        empty = ["its text"] if types.count(0) == 2 else []
        empty += ["its second text"] if pair is not None and types.count(1) == 1 else []
        if empty:
            raise BertforgeError(
                f"text {start + i + 1} of {total}: {' and '.join(empty)} give{'s' * (len(empty) == 1)} no "
                "tokens; give texts with words in them"
            )


def _label_rows(logits: torch.Tensor, labels: list[str]) -> list[dict]:
    """Each row of (B, K) logits as `classify` returns it."""
    if len(labels) == 1:
        return [{"score": score} for score in logits[:, 0].cpu().tolist()]
    rows = []
    for row in torch.softmax(logits, dim=-1).cpu().tolist():
        best = max(range(len(row)), key=row.__getitem__)
        rows.append(
            {"label": labels[best], "score": row[best], "probabilities": dict(zip(labels, row, strict=True))}
        )
    return rows


def hf_label_fields(labels: list[str]) -> dict:
    """The label fields of a Hugging Face classifier's config.json (one label: a regression, whose
    label names the score)."""
    return {
        "num_labels": len(labels),
        "id2label": {str(i): label for i, label in enumerate(labels)},
        "label2id": {label: i for i, label in enumerate(labels)},
        "problem_type": "regression" if len(labels) == 1 else "single_label_classification",
    }


def label_file(labels: list[str], task: str | None = None, pairs: bool | None = None) -> dict:
    """labels.json's contents: the label names in id order, a `task` other than sequence classification
    (a tagger's) and whether the classifier was fine-tuned on text pairs."""
    fields = {"labels": list(labels)} | ({"task": task} if task else {})
    return fields | ({} if pairs is None else {"pairs": pairs})


def read_pairs(folder: Path) -> bool | None:
    """Whether a classifier was fine-tuned on text pairs, as its labels.json says (None where it does not)."""
    pairs = read_json(folder / LABELS).get("pairs") if (folder / LABELS).is_file() else None
    return pairs if isinstance(pairs, bool) else None


def read_labels(folder: Path) -> list[str]:
    """A classifier's label names in id order, from `labels.json` or an exported config's `id2label`;
    a regression model's one name (of its score)."""
    if (folder / LABELS).is_file():
        labels = read_json(folder / LABELS).get("labels")
    else:
        id2label = read_json(folder / CONFIG).get("id2label") or {}
        labels = [id2label.get(str(i)) for i in range(len(id2label))]
    if (
        not isinstance(labels, list)
        or not labels
        or not all(isinstance(x, str) and x for x in labels)
        or len(set(labels)) != len(labels)
    ):
        raise BertforgeError(
            f"{folder} must name one label (a regression's score) or two or more distinct labels in {LABELS} "
            '({"labels": [...]}) or in id2label, in id order'
        )
    return labels
