"""The bridge to Hugging Face, both ways, and opening any model folder.

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
  of a run's `final/`), so pretraining can continue from it (`bertforge pretrain --init`);
- `load_model`: model, tokenizer and config from either kind of folder (behind `bertforge.load`).

Special tokens may sit at any ids (Google's original BERT vocabularies put them at 0 and 100-103);
a vocabulary without all five of `[PAD] [UNK] [CLS] [SEP] [MASK]` is refused on import. A padded
vocabulary (more embedding rows than tokens, e.g. 30,522 tokens in 30,528 rows) is kept as it is,
both ways: `model.vocab_size` counts the rows, the tokenizer section the tokens.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from bertforge.checkpoint import (
    CONFIG,
    LABELS,
    WEIGHTS,
    check_tokenizer_fits,
    find_model_folder,
    hf_label_fields,
    load_pretrained,
    load_weights,
    read_config,
    read_labels,
    read_weights,
    save_model_folder,
    weights_to_save,
    write_json,
)
from bertforge.config import ModelConfig, RunConfig, load_json, save_json, validate, validate_model
from bertforge.errors import BertforgeError
from bertforge.gpt import GPTForSequenceClassification, GPTLMHeadModel
from bertforge.gpt_convert import ARCHITECTURE as GPT_ARCHITECTURE
from bertforge.gpt_convert import CLASSIFIER_ARCHITECTURE as GPT_CLASSIFIER_ARCHITECTURE
from bertforge.gpt_convert import MODEL_TYPE as GPT_MODEL_TYPE
from bertforge.gpt_convert import bert_tokenizer, load_hf_language_model, write_hf_folder
from bertforge.io import atomic_directory, check_new_folder
from bertforge.model import TIED_KEYS, BertForPreTraining, BertModel
from bertforge.tokenizer import SETTINGS_FILE, SPECIAL_TOKENS, TOKENIZER_FILE, VOCAB_FILE, BertTokenizer
from bertforge.tokenizer import load_tokenizer as load_tokenizer_folder

BERTFORGE_CONFIG = "bertforge_config.json"
HF_BIN = "pytorch_model.bin"
SPECIAL_TOKENS_MAP = dict(
    zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), SPECIAL_TOKENS, strict=True)
)
# `BertConfig`'s defaults, for fields a Hugging Face config.json leaves out.
HF_DEFAULTS = dict(
    vocab_size=30522,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_act="gelu",
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    max_position_embeddings=512,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
    initializer_range=0.02,
    pad_token_id=0,
)
ENCODER_PREFIXES = ("bert.embeddings.", "bert.encoder.")  # must be in an imported checkpoint
TASK_HEADS = ("classifier.", "qa_outputs.")  # fine-tuning heads, dropped on import
BUFFERS = ("position_ids", "token_type_ids")  # saved by old transformers versions; not weights


# ---------------------------------------------------------------------------------------------- export


def export_model(model_dir: str | Path, out_dir: str | Path) -> dict:
    """Write `model_dir` as a Hugging Face folder `out_dir` (new or empty), atomically.

    Returns `{"architecture": ..., "out": out_dir}`.
    """
    folder, tokenizer_dir = find_model_folder(Path(model_dir))
    out = Path(out_dir)
    check_new_folder(out)
    config = read_config(folder)
    tokenizer = load_tokenizer_folder(tokenizer_dir)
    check_tokenizer_fits(tokenizer, config, folder)
    labels = read_labels(folder) if (folder / LABELS).is_file() else None
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


def check_keys_and_shapes(
    weights: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], source: Path, described_by: str
) -> None:
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise BertforgeError(
            f"{source} does not fit the model {described_by} describe: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise BertforgeError(
                f"{source}: {name} has shape {tuple(weights[name].shape)} but {described_by} say {shape}"
            )


def hf_config(model_config: ModelConfig, architecture: str, labels: list[str] | None) -> dict:
    """A `BertConfig` as JSON: our model fields already carry its names."""
    fields = {key: value for key, value in asdict(model_config).items() if key != "objective"}
    config = {
        "architectures": [architecture],
        "model_type": "bert",
        **fields,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        "dtype": "float32",
    }
    return config if labels is None else {**config, **hf_label_fields(labels)}


def tokenizer_config(tokenizer: BertTokenizer, model_config: ModelConfig) -> dict:
    # strip_accents and do_lower_case repeat what tokenizer.json's normalizer does, so that a
    # transformers version that rebuilds the normalizer from them builds the same one.
    return {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": tokenizer.lowercase,
        "strip_accents": tokenizer.lowercase,
        "tokenize_chinese_chars": True,
        "model_max_length": model_config.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        **SPECIAL_TOKENS_MAP,
    }


# ---------------------------------------------------------------------------------------------- import


def import_hf(src_dir: str | Path, out_dir: str | Path) -> dict:
    """Turn the Hugging Face BERT or OpenAIGPT folder `src_dir` into a bertforge model folder `out_dir`.

    Returns `{"out", "initialised", "dropped"}`: head weights the source lacked (drawn fresh, as
    Hugging Face does) and task heads it had that pretraining does not use.
    """
    out = Path(out_dir)
    check_new_folder(out)
    model, tokenizer, config, report = read_hf_folder(Path(src_dir))
    save_model_folder(out, model, tokenizer, config)
    return {"out": out, **report}


def read_hf_folder(src: Path) -> tuple[BertForPreTraining | GPTLMHeadModel, BertTokenizer, RunConfig, dict]:
    """Model (CPU, eval mode), tokenizer, run config and an import report from a Hugging Face folder
    (BERT, or OpenAIGPT: `read_gpt_folder`)."""
    if not src.is_dir():
        raise BertforgeError(f"{src} is not a folder; give a Hugging Face model folder")
    raw = read_hf_config(src)
    if raw["model_type"] == GPT_MODEL_TYPE:
        return read_gpt_folder(src)
    model_config = model_config_from_hf(raw, src)
    tokenizer = read_hf_tokenizer(src)
    config = run_config_for(src, model_config, tokenizer)
    check_tokenizer_fits(tokenizer, config, src)
    model, report = model_from_hf_weights(config.model, read_hf_weights(src), src)
    return model.eval(), tokenizer, config, report


def read_gpt_folder(src: Path) -> tuple[GPTLMHeadModel, BertTokenizer, RunConfig, dict]:
    """`read_hf_folder` for an OpenAIGPT folder: the language model (a classifier's `score` is left out
    and reported) and the tokenizer in bertforge's form (`gpt_convert.bert_tokenizer`)."""
    tokenizer = bert_tokenizer(read_hf_tokenizer(src))
    model, dropped = load_hf_language_model(src)
    config = run_config_for(src, model.config, tokenizer)
    check_tokenizer_fits(tokenizer, config, src)
    return model, tokenizer, config, {"initialised": [], "dropped": dropped}


def read_hf_config(src: Path) -> dict:
    path = src / CONFIG
    if not path.is_file():
        raise BertforgeError(f"{src} has no {CONFIG}; it is not a Hugging Face model folder")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BertforgeError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise BertforgeError(f"{path} has no model_type; it is not a Hugging Face model config")
    return raw


def model_config_from_hf(raw: dict, src: Path) -> ModelConfig:
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
    config = RunConfig.from_dict({"model": values})  # checks every type, naming the field
    try:
        validate_model(config.model)
    except BertforgeError as error:
        raise BertforgeError(f"{src / CONFIG}: {error}") from None
    return config.model


def read_hf_tokenizer(src: Path) -> BertTokenizer:
    """The source's tokenizer (tokenizer.json, or vocab.txt with tokenizer_config.json's casing).

    Staged in a temporary folder so that a tokenizer.json saved with truncation or padding turned
    on loads without them, and a bare vocab.txt gets its casing.
    """
    backend = None
    if (src / TOKENIZER_FILE).is_file():
        try:
            backend = Tokenizer.from_file(str(src / TOKENIZER_FILE))
        except Exception as error:  # the Rust side raises a bare Exception for any parse problem
            raise BertforgeError(f"{src / TOKENIZER_FILE} is not a valid tokenizer file ({error})") from None
    elif not (src / VOCAB_FILE).is_file():
        raise BertforgeError(
            f"{src} has neither {TOKENIZER_FILE} nor {VOCAB_FILE}; it holds no BERT tokenizer"
        )
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp)
        if backend is not None:
            backend.no_truncation()
            backend.no_padding()
            backend.save(str(staged / TOKENIZER_FILE))
        else:
            shutil.copyfile(src / VOCAB_FILE, staged / VOCAB_FILE)
            casing = {"kind": "wordpiece", "lowercase": hf_lowercase(src)}
            write_json(staged / SETTINGS_FILE, casing)
        if (src / SETTINGS_FILE).is_file():  # a bertforge export: kind, casing, min_frequency
            shutil.copyfile(src / SETTINGS_FILE, staged / SETTINGS_FILE)
        try:
            return load_tokenizer_folder(staged)
        except BertforgeError as error:
            raise BertforgeError(str(error).replace(str(staged), str(src))) from None


def hf_lowercase(src: Path) -> bool:
    path = src / "tokenizer_config.json"
    if not path.is_file():
        return True  # BertTokenizer's default
    try:
        return bool(json.loads(path.read_text(encoding="utf-8")).get("do_lower_case", True))
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        raise BertforgeError(f"{path} is damaged; fix it or remove it") from None


def run_config_for(src: Path, model_config: ModelConfig, tokenizer: BertTokenizer) -> RunConfig:
    """Our run config for an imported model: the one a bertforge export carries, or defaults; the
    model section always comes from config.json and the tokenizer section from the tokenizer."""
    config = load_json(src / BERTFORGE_CONFIG) if (src / BERTFORGE_CONFIG).is_file() else RunConfig()
    config.model = model_config
    config.tokenizer.kind = tokenizer.kind
    config.tokenizer.lowercase = tokenizer.lowercase
    config.tokenizer.vocab_size = tokenizer.vocab_size
    config.data.max_seq_length = min(config.data.max_seq_length, model_config.max_position_embeddings)
    validate(config)
    return config


def read_hf_weights(src: Path) -> dict[str, torch.Tensor]:
    """All tensors of `model.safetensors` or `pytorch_model.bin`, sharded or not (`.index.json`).

    Only files inside `src` are read: an index naming `../x` or `/x`, or a symlink that leads out
    of the folder, is refused (a downloaded folder must not make bertforge read other files).
    """
    for name in (WEIGHTS, HF_BIN):
        index = src / f"{name}.index.json"
        if index.is_file():
            shards = [inside(src, shard) for shard in shard_files(inside(src, index))]
            return {k: v for shard in shards for k, v in read_weight_file(shard).items()}
        if (src / name).is_file():
            return read_weight_file(inside(src, src / name))
    raise BertforgeError(
        f"{src} has no weights: expected {WEIGHTS} or {HF_BIN} (TensorFlow and Flax weights are not read)"
    )


def shard_files(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, AttributeError, TypeError) as error:
        raise BertforgeError(f"{index} is damaged ({error})") from None
    for name in names:
        if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
            raise BertforgeError(
                f"{index} names the weight file {name!r}, outside its folder; "
                "an index may name only files beside it"
            )
    return [index.parent / name for name in names]


def inside(src: Path, path: Path) -> Path:
    """`path`, refused when it resolves (through symlinks) outside `src`. A Hugging Face cache
    snapshot (`.../snapshots/REV/`) links its files into the repository's `blobs/`: allowed."""
    root, target = src.resolve(), path.resolve()
    allowed = [root]
    if root.parent.name == "snapshots":
        allowed.append(root.parent.parent / "blobs")
    if not any(folder in target.parents for folder in allowed):
        raise BertforgeError(
            f"{path} leads to {target}, outside {src}; bertforge reads weights only from inside "
            "the model folder (copy the file in instead of linking it)"
        )
    return path


def read_weight_file(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise BertforgeError(f"{path} is missing; the model folder is incomplete")
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as error:
            raise BertforgeError(f"{path} is damaged and cannot be read ({error})") from None
    try:
        # weights_only: a pickle from the internet must not run code.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several unrelated types for a bad file
        raise BertforgeError(f"{path} cannot be read as PyTorch weights ({type(error).__name__})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise BertforgeError(f"{path} does not hold a state dict of tensors")
    return state


def model_from_hf_weights(
    model_config: ModelConfig, weights: dict[str, torch.Tensor], src: Path
) -> tuple[BertForPreTraining, dict]:
    """Our pretraining model holding `weights`, with missing pooler and heads drawn fresh (seeded)."""
    weights, dropped = rename_hf_keys(weights)
    tie_hf_aliases(weights, src)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = BertForPreTraining(model_config)
    own = {name: t for name, t in model.state_dict().items() if name not in TIED_KEYS}
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    missing_encoder = [name for name in missing if name.startswith(ENCODER_PREFIXES)]
    if missing_encoder or unexpected:
        raise BertforgeError(
            f"{src}: the weights do not form a BERT encoder: missing {missing_encoder[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    check_keys_and_shapes(
        weights, {name: tuple(own[name].shape) for name in weights}, src, "config.json's sizes"
    )
    model.load_state_dict(weights, strict=False)
    model.tie_weights()
    return model, {"initialised": missing, "dropped": dropped}


def rename_hf_keys(weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Our names for a Hugging Face state dict: a `bert.` prefix for a bare `BertModel`, old
    TensorFlow-era LayerNorm `gamma`/`beta`, buffers and task heads left out (the heads reported)."""
    renamed, dropped = {}, []
    for name, tensor in weights.items():
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if name.startswith(("embeddings.", "encoder.", "pooler.")):
            name = f"bert.{name}"
        if name.endswith(BUFFERS):
            continue
        if name.startswith(TASK_HEADS):
            dropped.append(name)
            continue
        renamed[name] = tensor
    return renamed, sorted(dropped)


def tie_hf_aliases(weights: dict[str, torch.Tensor], src: Path) -> None:
    """Drop the tied decoder aliases (older checkpoints save them), refusing an untied decoder."""
    bias = weights.pop("cls.predictions.decoder.bias", None)
    if bias is not None:
        weights.setdefault("cls.predictions.bias", bias)
    decoder = weights.pop("cls.predictions.decoder.weight", None)
    embeddings = weights.get("bert.embeddings.word_embeddings.weight")
    if decoder is not None and embeddings is not None and not torch.equal(decoder, embeddings):
        raise BertforgeError(
            f"{src}: the MLM decoder is not tied to the word embeddings; bertforge's BERT always ties them"
        )


# ---------------------------------------------------------------------------------------------- loading


def is_hf_folder(path: Path) -> bool:
    """A folder whose config.json is a Hugging Face config (it has `model_type`; ours has sections)."""
    try:
        return "model_type" in json.loads((Path(path) / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def load_model(path: str | Path) -> tuple[BertForPreTraining | GPTLMHeadModel, BertTokenizer, RunConfig]:
    """Model (CPU, eval mode), tokenizer and run config from a run folder, its `final/`, a checkpoint,
    an imported model or a Hugging Face (exported) folder: a BERT, or a GPT when the config's
    `model.objective` is "clm"."""
    path = Path(path)
    if is_hf_folder(path):
        model, tokenizer, config, _ = read_hf_folder(path)
        return model, tokenizer, config
    folder = find_model_folder(path)[0]
    if (folder / LABELS).is_file():
        raise BertforgeError(
            f"{folder} holds a fine-tuned classifier (it has {LABELS}), not a pretrained model with MLM and "
            "NSP heads; use `bertforge classify` (or bertforge.classifier.load_classifier) for it"
        )
    return load_pretrained(path)


def init_from(path: str | Path, config: RunConfig) -> tuple[dict[str, torch.Tensor], BertTokenizer]:
    """Weights and tokenizer to start pretraining from; `config` takes the source's model and
    tokenizer sections (its architecture and vocabulary win over any other setting)."""
    model, tokenizer, source = load_model(path)
    config.model = source.model
    config.tokenizer = source.tokenizer
    return model.state_dict(), tokenizer
