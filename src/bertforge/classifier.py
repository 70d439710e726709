"""The fine-tuned classifier's model folder, reading model folders of either kind, and predictions.

A classifier folder (what `bertforge finetune` writes as `final/`, and `bertforge export` reads)
holds exactly:

    model.safetensors   bert.embeddings.*, bert.encoder.*, bert.pooler.*, classifier.weight,
                        classifier.bias (Hugging Face's `BertForSequenceClassification` names)
    config.json         the run config (bertforge's RunConfig JSON)
    labels.json         {"labels": [label names in id order]}
    tokenizer.json, vocab.txt, bertforge_tokenizer.json

A classifier fine-tuned from a GPT (`model.objective = "clm"`) is a
`bertforge.gpt.GPTForSequenceClassification`: `gpt.*` and `score.weight` (no bias), read at the last
real token, as GPT-1 and Hugging Face's `OpenAIGPTForSequenceClassification` do.

Model folders are read in bertforge's form (RunConfig `config.json`) or in the Hugging Face form
that `bertforge export` writes (`config.json` with `"model_type": "bert"` or `"openai-gpt"`, labels
in `id2label`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bertforge.batches import pad_batch
from bertforge.checkpoint import (
    CONFIG,
    LABELS,
    WEIGHTS,
    check_and_load_state,
    check_tokenizer_fits,
    find_model_folder,
    read_config,
    read_json,
    read_labels,
    read_weights,
    save_weights,
)
from bertforge.config import ModelConfig, RunConfig, save_json
from bertforge.errors import BertforgeError
from bertforge.export import (
    BUFFERS,
    is_hf_folder,
    model_config_from_hf,
    read_hf_config,
    read_hf_folder,
    read_hf_tokenizer,
    read_hf_weights,
)
from bertforge.gpt import GPTForSequenceClassification
from bertforge.gpt_convert import MODEL_TYPE as GPT_MODEL_TYPE
from bertforge.gpt_convert import bert_tokenizer, from_hf_state_dict
from bertforge.gpt_convert import model_config_from_hf as gpt_config_from_hf
from bertforge.io import atomic_directory, atomic_write_text
from bertforge.model import BertForSequenceClassification
from bertforge.tokenizer import BertTokenizer, load_tokenizer

Classifier = BertForSequenceClassification | GPTForSequenceClassification
ENCODER = {"mlm": "bert", "clm": "gpt"}  # objective -> the encoder's attribute and weight prefix


def sequence_classifier(model: ModelConfig, num_labels: int) -> Classifier:
    """The classifier for a pretrained architecture: on BERT's pooled [CLS], or on GPT's last real token."""
    if model.objective == "clm":
        return GPTForSequenceClassification(model, num_labels)
    return BertForSequenceClassification(model, num_labels)


def save_classifier(
    folder: Path, model: Classifier, tokenizer: BertTokenizer, config: RunConfig, labels
) -> None:
    """Write a classifier folder atomically: it appears complete or not at all."""
    assert len(labels) == model.num_labels
    with atomic_directory(Path(folder)) as tmp:
        save_weights(model, tmp / WEIGHTS)
        save_json(config, tmp / CONFIG)
        atomic_write_text(tmp / LABELS, json.dumps({"labels": list(labels)}, indent=2) + "\n")
        tokenizer.save(tmp)


def load_encoder(path: Path) -> tuple[RunConfig, BertTokenizer, dict[str, torch.Tensor]]:
    """Config, tokenizer and encoder weights (`BertModel`'s, or a GPT's `GPTModel`'s) of a pretrained
    (or fine-tuned, or exported) model folder.

    Pretraining heads (`cls.*`, `lm_head`) and classifier heads are left out: fine-tuning starts from
    the encoder (and BERT's pooler) only.
    """
    if is_hf_folder(path):
        model, tokenizer, config, _ = read_hf_folder(Path(path))
        return config, tokenizer, getattr(model, ENCODER[config.model.objective]).state_dict()
    folder, tokenizer_dir = find_model_folder(path)
    config = read_config(folder)
    tokenizer = load_tokenizer(tokenizer_dir)
    check_tokenizer_fits(tokenizer, config, folder)
    weights = read_weights(folder / WEIGHTS)
    prefix = ENCODER[config.model.objective] + "."
    encoder = {name[len(prefix) :]: t for name, t in weights.items() if name.startswith(prefix)}
    return config, tokenizer, encoder


def find_classifier_folder(path: Path) -> Path:
    """A classifier folder (ours or exported), or a fine-tuning run folder's `final/`."""
    path = Path(path)
    if (path / "final" / CONFIG).is_file():
        path = path / "final"
    if not path.is_dir():
        raise BertforgeError(f"model folder {path} does not exist; give a fine-tuned classifier folder")
    seeds = sorted(p.name for p in path.glob("seed_*") if p.is_dir())
    if seeds and not (path / WEIGHTS).is_file():
        raise BertforgeError(
            f"{path} holds one fine-tuning run per seed; give one of them, e.g. {path / seeds[0]}"
        )
    if not (path / WEIGHTS).is_file() or not (path / CONFIG).is_file():
        raise BertforgeError(
            f"{path} is not a bertforge or exported model folder (it needs {WEIGHTS} and {CONFIG}); "
            "give the folder written by `bertforge finetune` or `bertforge export`"
        )
    if not (path / LABELS).is_file() and not read_json(path / CONFIG).get("id2label"):
        raise BertforgeError(
            f"{path} holds a pretrained model, not a classifier (it names no labels); "
            "fine-tune it first with `bertforge finetune`"
        )
    return path


def load_classifier(path: Path) -> tuple[Classifier, BertTokenizer, list[str], RunConfig]:
    """Model (CPU, eval mode), tokenizer, label names and config of a classifier folder (ours or exported)."""
    folder = find_classifier_folder(path)
    if is_hf_folder(folder):
        config, tokenizer, weights = read_hf_classifier(folder)
    else:
        config, tokenizer, weights = (
            read_config(folder),
            load_tokenizer(folder),
            read_weights(folder / WEIGHTS),
        )
    check_tokenizer_fits(tokenizer, config, folder)
    labels = read_labels(folder)
    model = sequence_classifier(config.model, len(labels))
    check_and_load_state(model, weights, source=str(folder / WEIGHTS))
    return model.eval(), tokenizer, labels, config


def read_hf_classifier(folder: Path) -> tuple[RunConfig, BertTokenizer, dict[str, torch.Tensor]]:
    """Config, tokenizer and weights (in our names) of an exported BERT or OpenAIGPT classifier folder."""
    raw = read_hf_config(folder)
    weights = read_hf_weights(folder)
    if raw["model_type"] == GPT_MODEL_TYPE:
        config = RunConfig(model=gpt_config_from_hf(raw, str(folder / CONFIG)))
        tokenizer = bert_tokenizer(read_hf_tokenizer(folder))
        weights = from_hf_state_dict(weights)
    else:
        config = RunConfig(model=model_config_from_hf(raw, folder))
        tokenizer = read_hf_tokenizer(folder)
        weights = {name: t for name, t in weights.items() if not name.endswith(BUFFERS)}
    config.tokenizer.vocab_size = tokenizer.vocab_size  # a padded vocabulary keeps its extra rows
    return config, tokenizer, weights


@torch.inference_mode()
def classify(
    model: Classifier,
    tokenizer: BertTokenizer,
    labels: list[str],
    texts: list[str],
    pairs: list[str | None] | None = None,
    max_length: int | None = None,
    batch_size: int = 64,
) -> list[dict]:
    """Label and class probabilities of each text (or text pair), in input order.

    Returns one dict per text: `label`, `score` (its probability) and `probabilities` (every label).
    Texts longer than `max_length` tokens (default: the model's positions) are truncated.
    """
    model.eval()
    device = next(model.parameters()).device
    max_length = max_length or model.config.max_position_embeddings
    pairs = pairs or [None] * len(texts)
    results = []
    for start in range(0, len(texts), batch_size):
        examples = []
        for text, pair in zip(
            texts[start : start + batch_size], pairs[start : start + batch_size], strict=True
        ):
            input_ids, token_type_ids = tokenizer.encode_pair(text, pair, max_length)
            examples.append({"input_ids": input_ids, "token_type_ids": token_type_ids})
        batch = pad_batch(examples, tokenizer.pad_id)
        logits = model(
            batch["input_ids"].to(device),
            batch["token_type_ids"].to(device),
            batch["attention_mask"].to(device),
        )  # (B, K)
        for row in torch.softmax(logits.float(), dim=-1).cpu().tolist():
            best = max(range(len(row)), key=row.__getitem__)
            results.append(
                {
                    "label": labels[best],
                    "score": row[best],
                    "probabilities": dict(zip(labels, row, strict=True)),
                }
            )
    return results
