"""The bridge to Hugging Face, both ways: `bertforge export` and `bertforge import-hf`.

Owns:
- `export_model`: a bertforge model (run folder, `final/`, checkpoint, or a fine-tuned classifier
  folder with `labels.json`) -> a folder that `transformers` loads with no custom code:
  `config.json` (a `BertConfig` with `architectures`), `model.safetensors` (Hugging Face key
  names: ours already are), `tokenizer.json`, `vocab.txt`, `tokenizer_config.json`,
  `special_tokens_map.json`, plus `bertforge_config.json` (our full run config, so that an import
  restores it). A tagger (`bertforge.tagger`) becomes a `BertForTokenClassification` with its tags
  in `id2label`, for `pipeline("token-classification")`. A GPT (`model.objective = "clm"`) becomes
  an `OpenAIGPTLMHeadModel` folder that `pipeline("text-generation")` loads, or for a classifier an
  `OpenAIGPTForSequenceClassification` (`export_gpt`, through `bertforge.gpt_convert`). A
  regression model (one label) is written as Hugging Face writes one: `num_labels = 1`,
  `problem_type = "regression"`, its label naming the score;
- `import_hf`: a local Hugging Face BERT or OpenAIGPT folder -> a bertforge model folder (the layout
  of a run's `final/`), so pretraining can continue from it (`bertforge pretrain --init`).

`bertforge.folders` finds and opens the source; `bertforge.bert_convert` and
`bertforge.gpt_convert` convert configs and weight names.

Special tokens may sit at any ids (Google's original BERT vocabularies put them at 0 and 100-103);
a vocabulary without all five of `[PAD] [UNK] [CLS] [SEP] [MASK]` is refused on import. A padded
vocabulary (more embedding rows than tokens, e.g. 30,522 tokens in 30,528 rows; on import, fewer than 128
more) is kept, both ways: `model.vocab_size` counts the rows, the tokenizer section the tokens. An
export gives the extra rows' MLM bias `model.PADDED_ROW_BIAS`, so that Hugging Face's softmax over all
rows never picks one.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bertforge.bert_convert import hf_config
from bertforge.checkpoint import (
    CONFIG,
    LABELS,
    WEIGHTS,
    load_weights,
    pretraining_model,
    save_model_folder,
    save_weights,
)
from bertforge.classifier import label_file, read_labels, read_pairs, sequence_classifier
from bertforge.config import RunConfig, save_json
from bertforge.errors import BertforgeError
from bertforge.folders import (
    BERTFORGE_CONFIG,
    UNTRAINED_HEADS,
    ModelFolder,
    find_model_folder,
    open_hf_folder,
    pretraining_heads_untrained,
    read_config_and_tokenizer,
    trained_length,
)
from bertforge.gpt_convert import ARCHITECTURE as GPT_ARCHITECTURE
from bertforge.gpt_convert import CLASSIFIER_ARCHITECTURE as GPT_CLASSIFIER_ARCHITECTURE
from bertforge.gpt_convert import write_hf_folder
from bertforge.io import atomic_directory, building_new_folder, write_json
from bertforge.model import BertForTokenClassification
from bertforge.tagger import ARCHITECTURE as TAGGER_ARCHITECTURE
from bertforge.tagger import TOKEN_TASK, is_tagger_folder, token_classifier
from bertforge.tokenizer import SPECIAL_TOKENS_MAP, BertTokenizer

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
    with building_new_folder(out):
        return write_export(source, out)


def write_export(source: ModelFolder, out: Path) -> dict:
    """`export_model`'s writing, for the holder of `out`'s lock."""
    config, tokenizer = read_config_and_tokenizer(source)
    labels = read_labels(source.path) if source.has_labels else None
    model, pairs = checked_model(source.path, config, labels), read_pairs(source.path)
    length = trained_length(config, source)  # where transformers cuts
    if config.model.objective == "clm":
        return export_gpt(model, config, tokenizer, labels, pairs, out, length)
    if labels is None:
        model.silence_padded_rows(tokenizer.vocab_size)  # whatever a run or an import left there
    tagger = isinstance(model, BertForTokenClassification)
    architecture = "BertForPreTraining" if labels is None else "BertForSequenceClassification"
    architecture = TAGGER_ARCHITECTURE if tagger else architecture
    with atomic_directory(out) as tmp:
        save_weights(model, tmp / WEIGHTS)  # tied aliases dropped, as `save_pretrained` does
        write_json(tmp / CONFIG, hf_config(config.model, architecture, labels))
        tokenizer.save(tmp, length)
        write_json(tmp / "special_tokens_map.json", SPECIAL_TOKENS_MAP)
        save_json(as_trained(config, length), tmp / BERTFORGE_CONFIG)
        if labels is not None:
            write_json(tmp / LABELS, label_file(labels, TOKEN_TASK if tagger else None, pairs))
        untrained = pretraining_heads_untrained(source.path, config) if labels is None else []
        if untrained:
            write_json(tmp / UNTRAINED_HEADS, {"heads": untrained})  # for whoever reads it, import-hf too
    return {"architecture": architecture, "out": out, "untrained": untrained}


def as_trained(config: RunConfig, length: int) -> RunConfig:
    """`config` as the exported model trained: a checkpoint of the sequence-length warmup (`length`
    below the run's) at the warmup's length and pairs, so that a reader of the export reads no further."""
    if length >= config.trained_length:
        return config
    trained = RunConfig.from_dict(config.to_dict())
    data = trained.data
    data.max_seq_length, data.warmup_seq_length = length, 0
    data.nsp, data.warmup_nsp = data.nsp or data.warmup_nsp, False
    return trained


def checked_model(folder: Path, config: RunConfig, labels: list[str] | None) -> torch.nn.Module:
    """The pretraining model in `folder`, or with `labels` its classifier, refusing weights that do not
    fit its config and labels (missing, unexpected or misshapen tensors)."""
    if labels is None:
        model = pretraining_model(config.model)
    elif is_tagger_folder(folder):
        model = token_classifier(config.model, len(labels))  # a GPT's is refused
    else:
        model = sequence_classifier(config.model, len(labels))
    load_weights(model, folder / WEIGHTS)
    return model


def export_gpt(
    model: torch.nn.Module,
    config: RunConfig,
    tokenizer: BertTokenizer,
    labels: list[str] | None,
    pairs: bool | None,
    out: Path,
    length: int,
) -> dict:
    """A GPT as an `OpenAIGPTLMHeadModel` folder for `pipeline("text-generation")`, or a GPT classifier as
    an `OpenAIGPTForSequenceClassification` (see `gpt_convert.save_hf_folder`), with our vocab.txt,
    tokenizer settings and run config beside them for `import-hf`; `length`: where `transformers`
    truncates (the length it trained at)."""
    with atomic_directory(out) as tmp:
        tokenizer.save(tmp)  # vocab.txt and bertforge_tokenizer.json; tokenizer.json is replaced next
        write_hf_folder(tmp, model, tokenizer, labels=labels, max_length=length)
        save_json(as_trained(config, length), tmp / BERTFORGE_CONFIG)
        if labels is not None:
            write_json(tmp / LABELS, label_file(labels, pairs=pairs))
    architecture = GPT_ARCHITECTURE if labels is None else GPT_CLASSIFIER_ARCHITECTURE
    return {"architecture": architecture, "out": out}


# ---------------------------------------------------------------------------------------------- import


def import_hf(src_dir: str | Path, out_dir: str | Path) -> dict:
    """Turn the Hugging Face BERT or OpenAIGPT folder `src_dir` into a bertforge model folder `out_dir`.

    Returns `{"out", "initialised", "dropped", "untrained"}`: head weights the source lacked (drawn
    fresh, as Hugging Face does), task heads it had that pretraining does not use, and the
    pretraining heads ("mlm", "nsp") left untrained, which the folder's untrained_heads.json names.
    """
    out = Path(out_dir)
    with building_new_folder(out):
        model, tokenizer, config, report = open_hf_folder(src_dir)
        notes = {UNTRAINED_HEADS: {"heads": report["untrained"]}} if report["untrained"] else None
        save_model_folder(out, model, tokenizer, config, notes)
    return {"out": out, **report}
