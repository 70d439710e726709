"""The bridge to Hugging Face, both ways: `bertforge export` and `bertforge import-hf`.

Owns:
- `export_model`: a bertforge model (run folder, `final/`, checkpoint, or a fine-tuned classifier
  folder with `labels.json`) -> a folder that `transformers` loads with no custom code:
  `config.json` (a `BertConfig` with `architectures`), `model.safetensors` (Hugging Face key
  names: ours already are), `tokenizer.json`, `vocab.txt`, `tokenizer_config.json`,
  `special_tokens_map.json`, plus `bertforge_config.json` (our full run config, so that an import
  restores it). A GPT (`model.objective = "clm"`) becomes an `OpenAIGPTLMHeadModel` folder that
  `pipeline("text-generation")` loads, or for a classifier an `OpenAIGPTForSequenceClassification`
  (`export_gpt`, through `bertforge.gpt_convert`);
- `import_hf`: a local Hugging Face BERT or OpenAIGPT folder -> a bertforge model folder (the layout
  of a run's `final/`), so pretraining can continue from it (`bertforge pretrain --init`).

`bertforge.folders` finds and opens the source; `bertforge.bert_convert` and
`bertforge.gpt_convert` convert configs and weight names.

Special tokens may sit at any ids (Google's original BERT vocabularies put them at 0 and 100-103);
a vocabulary without all five of `[PAD] [UNK] [CLS] [SEP] [MASK]` is refused on import. A padded
vocabulary (more embedding rows than tokens, e.g. 30,522 tokens in 30,528 rows) is kept as it is,
both ways: `model.vocab_size` counts the rows, the tokenizer section the tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from bertforge.bert_convert import SPECIAL_TOKENS_MAP, check_keys_and_shapes, hf_config, tokenizer_config
from bertforge.checkpoint import (
    CONFIG,
    LABELS,
    WEIGHTS,
    load_weights,
    read_labels,
    read_weights,
    save_model_folder,
    weights_to_save,
)
from bertforge.config import ModelConfig, RunConfig, save_json
from bertforge.errors import BertforgeError
from bertforge.folders import BERTFORGE_CONFIG, find_model_folder, open_hf_folder, read_config_and_tokenizer
from bertforge.gpt import GPTForSequenceClassification, GPTLMHeadModel
from bertforge.gpt_convert import ARCHITECTURE as GPT_ARCHITECTURE
from bertforge.gpt_convert import CLASSIFIER_ARCHITECTURE as GPT_CLASSIFIER_ARCHITECTURE
from bertforge.gpt_convert import write_hf_folder
from bertforge.io import atomic_directory, check_new_folder, write_json
from bertforge.model import BertForPreTraining, BertModel
from bertforge.tokenizer import BertTokenizer

# ---------------------------------------------------------------------------------------------- export


def export_model(model_dir: str | Path, out_dir: str | Path) -> dict:
    """Write `model_dir` as a Hugging Face folder `out_dir` (new or empty), atomically.

    Returns `{"architecture": ..., "out": out_dir}`.
    """
    source = find_model_folder(model_dir)
    if source.hugging_face:
        raise BertforgeError(
            f"{source.path} is a Hugging Face folder, not a bertforge model folder; it needs no export "
            "(`bertforge import-hf` turns it into one)"
        )
    out = Path(out_dir)
    check_new_folder(out)
    folder = source.path
    config, tokenizer = read_config_and_tokenizer(source)
    labels = read_labels(folder) if source.has_labels else None
    if config.model.objective == "clm":
        return export_gpt(folder, config, tokenizer, labels, out)
    if labels is None:
        architecture, weights = "BertForPreTraining", pretraining_weights(folder, config)
    else:
        architecture, weights = "BertForSequenceClassification", classifier_weights(folder, config, labels)
    with atomic_directory(out) as tmp:
        save_file(weights, str(tmp / WEIGHTS), metadata={"format": "pt"})
        write_json(tmp / CONFIG, hf_config(config.model, architecture, labels))
        tokenizer.save(tmp)
        write_json(tmp / "tokenizer_config.json", tokenizer_config(tokenizer, config.model))
        write_json(tmp / "special_tokens_map.json", SPECIAL_TOKENS_MAP)
        save_json(config, tmp / BERTFORGE_CONFIG)
        if labels is not None:
            write_json(tmp / LABELS, {"labels": labels})
    return {"architecture": architecture, "out": out}


def export_gpt(
    folder: Path, config: RunConfig, tokenizer: BertTokenizer, labels: list[str] | None, out: Path
) -> dict:
    """A GPT as an `OpenAIGPTLMHeadModel` folder for `pipeline("text-generation")`, or a GPT classifier as
    an `OpenAIGPTForSequenceClassification` (see `gpt_convert.save_hf_folder`), with our vocab.txt,
    tokenizer settings and run config beside them for `import-hf`."""
    if labels is None:
        model = GPTLMHeadModel(config.model)
    else:
        model = GPTForSequenceClassification(config.model, len(labels))
    load_weights(model, folder / WEIGHTS)  # refuses missing, unexpected or misshapen tensors
    with atomic_directory(out) as tmp:
        tokenizer.save(tmp)  # vocab.txt and bertforge_tokenizer.json; tokenizer.json is replaced next
        write_hf_folder(tmp, model, tokenizer, labels=labels)
        save_json(config, tmp / BERTFORGE_CONFIG)
        if labels is not None:
            write_json(tmp / LABELS, {"labels": labels})
    architecture = GPT_ARCHITECTURE if labels is None else GPT_CLASSIFIER_ARCHITECTURE
    return {"architecture": architecture, "out": out}


def pretraining_weights(folder: Path, config: RunConfig) -> dict[str, torch.Tensor]:
    """The checked weights of a pretraining model, tied aliases dropped (as `save_pretrained` does)."""
    model = BertForPreTraining(config.model)
    load_weights(model, folder / WEIGHTS)  # refuses missing, unexpected or misshapen tensors
    return weights_to_save(model)


def classifier_weights(folder: Path, config: RunConfig, labels: list[str]) -> dict[str, torch.Tensor]:
    """A classifier's weights (`bert.*` + `classifier.*`), checked against its config and labels."""
    weights = read_weights(folder / WEIGHTS)
    expected = encoder_shapes(config.model)
    hidden = config.model.hidden_size
    expected["classifier.weight"] = (len(labels), hidden)
    expected["classifier.bias"] = (len(labels),)
    check_keys_and_shapes(weights, expected, folder / WEIGHTS, "its config.json and labels.json")
    return {name: tensor.contiguous() for name, tensor in weights.items()}


def encoder_shapes(model_config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """`bert.*` parameter names and shapes of an encoder (built on the meta device: no memory, no init)."""
    with torch.device("meta"):
        encoder = BertModel(model_config)
    return {f"bert.{name}": tuple(t.shape) for name, t in encoder.state_dict().items()}


# ---------------------------------------------------------------------------------------------- import


def import_hf(src_dir: str | Path, out_dir: str | Path) -> dict:
    """Turn the Hugging Face BERT or OpenAIGPT folder `src_dir` into a bertforge model folder `out_dir`.

    Returns `{"out", "initialised", "dropped"}`: head weights the source lacked (drawn fresh, as
    Hugging Face does) and task heads it had that pretraining does not use.
    """
    out = Path(out_dir)
    check_new_folder(out)
    model, tokenizer, config, report = open_hf_folder(src_dir)
    save_model_folder(out, model, tokenizer, config)
    return {"out": out, **report}
