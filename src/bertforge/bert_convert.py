"""The bridge between bertforge's BERT (`bertforge.model`) and Hugging Face's, both ways.

Our state dicts already carry Hugging Face's key names, so most of the conversion is of configs.
Owns:
- `hf_config`: a `BertConfig` dict (config.json) naming `BertForPreTraining`, or with labels
  `BertForSequenceClassification` (one label: a regression, `problem_type = "regression"`) or
  `BertForTokenClassification` (its tags in `id2label`, no `problem_type`, which it does not read);
- `model_config_from_hf`: the inverse, refusing what our BERT cannot hold (relative positions, a
  decoder); fields a config.json leaves out take `BertConfig`'s defaults (`HF_DEFAULTS`);
- `model_from_hf_weights`: our `BertForPreTraining` holding a Hugging Face state dict: a bare
  `BertModel`'s keys get their `bert.` prefix, TensorFlow-era LayerNorm `gamma`/`beta` are renamed,
  saved buffers and task heads are left out, tied decoder aliases are checked and dropped, and
  missing heads are drawn fresh (as `from_pretrained` does).

Reading the files of a Hugging Face folder is `bertforge.folders`'s; `bertforge.gpt_convert` is
the same bridge for GPT-1.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from bertforge.checkpoint import CONFIG, check_keys_and_shapes
from bertforge.classifier import hf_label_fields
from bertforge.config import ModelConfig, RunConfig, preset_model, validate_model
from bertforge.errors import BertforgeError
from bertforge.gpt_convert import MODEL_TYPE as GPT_MODEL_TYPE
from bertforge.model import TIED_KEYS, BertForPreTraining

ENCODER_PREFIXES = ("bert.embeddings.", "bert.encoder.")  # must be in an imported checkpoint
TASK_HEADS = ("classifier.", "qa_outputs.")  # fine-tuning heads, dropped on import
BUFFERS = ("position_ids", "token_type_ids")  # saved by old transformers versions; not weights
TOKEN_CLASSIFICATION = "BertForTokenClassification"


def bert_config_fields(model_config: ModelConfig) -> dict:
    """The `BertConfig` fields of a model config: all but `objective`, under the same names."""
    return {key: value for key, value in asdict(model_config).items() if key != "objective"}


# `BertConfig`'s defaults, for fields a Hugging Face config.json leaves out: BERT-base's, our "base" preset.
HF_DEFAULTS = bert_config_fields(preset_model("base"))


# ---------------------------------------------------------------------------------------- configs


def hf_config(model_config: ModelConfig, architecture: str, labels: list[str] | None) -> dict:
    """A `BertConfig` as JSON: our model fields already carry its names."""
    config = {
        "architectures": [architecture],
        "model_type": "bert",
        **bert_config_fields(model_config),
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        "dtype": "float32",
    }
    if labels is None:
        return config
    fields = hf_label_fields(labels)
    if architecture == TOKEN_CLASSIFICATION:
        del fields["problem_type"]
    return {**config, **fields}


# Hugging Face's other names of bertforge's activations: torch's tanh GELU, the tanh GELU's formula
# written another way, and SiLU's older name.
SAME_ACTIVATION = {"gelu_pytorch_tanh": "gelu_new", "gelu_fast": "gelu_new", "swish": "silu"}


def model_config_from_hf(raw: dict, src: Path) -> ModelConfig:
    """The `ModelConfig` of the BERT config.json `raw` (read from folder `src`)."""
    if raw["model_type"] != "bert":
        raise BertforgeError(
            f"{src} holds a {raw['model_type']!r} model (config.json model_type); bertforge imports BERT "
            f'(model_type "bert") and GPT-1 ("{GPT_MODEL_TYPE}") only'
        )
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise BertforgeError(
            f"{src} uses position_embedding_type = {raw['position_embedding_type']!r}; bertforge's BERT has "
            "absolute (learned) positions only"
        )
    if raw.get("is_decoder") or raw.get("add_cross_attention"):
        raise BertforgeError(
            f"{src} is a BERT decoder (is_decoder / add_cross_attention); bertforge imports encoders"
        )
    values = {name: raw.get(name) for name in HF_DEFAULTS}
    values = {name: HF_DEFAULTS[name] if value is None else value for name, value in values.items()}
    values["hidden_act"] = SAME_ACTIVATION.get(values["hidden_act"], values["hidden_act"])
    config = RunConfig.from_dict({"model": values})  # checks every type, naming the field
    validate_model(config.model, src / CONFIG)
    return config.model


# ------------------------------------------------------------------------------------ state dicts


def model_from_hf_weights(
    model_config: ModelConfig, weights: dict[str, torch.Tensor], src: Path
) -> tuple[BertForPreTraining, dict]:
    """Our pretraining model holding `weights`, with missing pooler and heads drawn fresh (seeded),
    and a report: `{"initialised": [names drawn fresh], "dropped": [task heads left out]}`."""
    weights, dropped = rename_hf_keys(weights)
    tie_hf_aliases(weights, src)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = BertForPreTraining(model_config)
    own = {name: tuple(t.shape) for name, t in model.state_dict().items() if name not in TIED_KEYS}
    # The encoder must be whole; a pooler or head the source lacks keeps its fresh draw.
    needed = {
        name: shape for name, shape in own.items() if name in weights or name.startswith(ENCODER_PREFIXES)
    }
    check_keys_and_shapes(weights, needed, src, "config.json's sizes say")
    model.load_state_dict(weights, strict=False)
    model.tie_weights()
    return model, {"initialised": sorted(set(own) - set(weights)), "dropped": dropped}


def rename_hf_keys(weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Our names for a Hugging Face state dict: a `bert.` prefix for a bare `BertModel`, old
    TensorFlow-era LayerNorm `gamma`/`beta`, buffers and task heads left out (the heads reported)."""
    renamed, dropped = {}, []
    for name, tensor in weights.items():
        name = _layer_norm_name(name)
        if name.startswith(("embeddings.", "encoder.", "pooler.")):
            name = f"bert.{name}"
        if name.endswith(BUFFERS):
            continue
        if name.startswith(TASK_HEADS):
            dropped.append(name)
            continue
        renamed[name] = tensor
    return renamed, sorted(dropped)


def classifier_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Hugging Face classifier's or tagger's state dict in our names: TensorFlow-era LayerNorm
    `gamma`/`beta` renamed, the buffers old transformers versions saved beside the weights left out."""
    return {_layer_norm_name(name): tensor for name, tensor in weights.items() if not name.endswith(BUFFERS)}


def _layer_norm_name(name: str) -> str:
    return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def tie_hf_aliases(weights: dict[str, torch.Tensor], src: Path) -> None:
    """Drop the tied decoder aliases (some checkpoints save them), refusing an untied decoder."""
    bias = weights.pop("cls.predictions.decoder.bias", None)
    if bias is not None:
        weights.setdefault("cls.predictions.bias", bias)
    decoder = weights.pop("cls.predictions.decoder.weight", None)
    embeddings = weights.get("bert.embeddings.word_embeddings.weight")
    if decoder is not None and embeddings is not None and not torch.equal(decoder, embeddings):
        raise BertforgeError(
            f"{src}: the MLM decoder is not tied to the word embeddings; bertforge's BERT always ties them"
        )
