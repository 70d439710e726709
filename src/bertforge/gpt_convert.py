"""The bridge between bertforge's GPT-1 (`bertforge.gpt`) and Hugging Face's OpenAIGPT, both ways.

Owns:
- the state-dict mapping (`to_hf_state_dict`, `from_hf_state_dict`). Our names are BERT's
  (`gpt.layer.0.attention.self.query`), Hugging Face's are OpenAI's (`transformer.h.0.attn.c_attn`).
  Hugging Face keeps GPT's `Conv1D` layers, whose weight is (in, out): the transpose of an
  `nn.Linear` weight; and it fuses query, key and value into one `c_attn` of width 3 x hidden,
  in that order;
- the `OpenAIGPTConfig` dict (`hf_config`) and its inverse (`model_config_from_hf`);
- writing a folder that `transformers.OpenAIGPTLMHeadModel.from_pretrained` loads as it is
  (`write_hf_folder`, which `bertforge export` calls; `save_hf_folder` writes such a folder whole:
  config.json + model.safetensors, and with a tokenizer the files that `pipeline("text-generation")`
  needs), and our language model from such a folder's weights
  (`language_model_from_hf`; `bertforge.folders` reads the folder); a classifier
  (`bertforge.gpt.GPTForSequenceClassification`, whose `score` keeps its name) is written as an
  `OpenAIGPTForSequenceClassification` with its labels (one label: a regression, whose config says
  `problem_type = "regression"`, as transformers' own);
- the tokenizer's two forms: the generation form written for `transformers`
  (`write_gpt_tokenizer`) and bertforge's own, restored on import (`tokenizer.bert_form`).

OpenAIGPT fixes two things that `ModelConfig` leaves free, so a model that differs is refused, before
training and on export, rather than exported wrong (`bertforge.config_rules.OPENAI_GPT_RULES`): the
feed-forward width is 4 x hidden, and its activations are "gelu" (the tanh approximation: bertforge's
"gelu_new"), "relu" and "silu" (no exact-erf GELU).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders
from torch import nn

from bertforge.checkpoint import CONFIG, WEIGHTS, check_and_load_state
from bertforge.classifier import hf_label_fields
from bertforge.config import ModelConfig, check_openai_gpt, validate_model
from bertforge.config_rules import GPT_HIDDEN_ACT, OPENAI_GPT_ACTS
from bertforge.errors import BertforgeError
from bertforge.gpt import GPT_TIED_KEYS, GPTLMHeadModel
from bertforge.io import atomic_directory, atomic_write_bytes, check_new_folder, write_json
from bertforge.tokenizer import TOKENIZER_FILE, BertTokenizer

ARCHITECTURE = "OpenAIGPTLMHeadModel"
CLASSIFIER_ARCHITECTURE = "OpenAIGPTForSequenceClassification"
CLASSIFIER_HEAD = ("score.weight",)  # a classifier's own tensors, left out when a language model is read
MULTIPLE_CHOICE_HEAD = "multiple_choice_head."  # `OpenAIGPTDoubleHeadsModel`'s second head, left out too
MODEL_TYPE = "openai-gpt"
WORD_EMBEDDINGS = GPT_TIED_KEYS["lm_head.weight"]

# bertforge `hidden_act` -> OpenAIGPT `afn` (Hugging Face's OpenAIGPT "gelu" is the tanh form).
AFN = dict(zip(OPENAI_GPT_ACTS, ("gelu", "relu", "silu"), strict=True))
HIDDEN_ACT = {"gelu": GPT_HIDDEN_ACT, "relu": "relu", "silu": "silu", "swish": "silu"}

# `OpenAIGPTConfig`'s defaults, for fields a config.json leaves out.
HF_DEFAULTS = dict(
    vocab_size=40478,
    n_positions=512,
    n_embd=768,
    n_layer=12,
    n_head=12,
    afn="gelu",
    resid_pdrop=0.1,
    embd_pdrop=0.1,
    attn_pdrop=0.1,
    layer_norm_epsilon=1e-5,
    initializer_range=0.02,
)

# Whole-model tensors: ours -> Hugging Face's.
GLOBAL_KEYS = {
    WORD_EMBEDDINGS: "transformer.tokens_embed.weight",
    "gpt.embeddings.position_embeddings.weight": "transformer.positions_embed.weight",
    "lm_head.weight": "lm_head.weight",  # the tied alias: present in state_dict(), dropped on save
    "score.weight": "score.weight",  # a classifier's head: the same name in both
}
# Per-layer modules: ours -> (Hugging Face's, is a Conv1D whose weight is transposed).
LAYER_MODULES = {
    "attention.output.dense": ("attn.c_proj", True),
    "attention.output.LayerNorm": ("ln_1", False),
    "intermediate.dense": ("mlp.c_fc", True),
    "output.dense": ("mlp.c_proj", True),
    "output.LayerNorm": ("ln_2", False),
}
QKV = ("attention.self.query", "attention.self.key", "attention.self.value")  # fused into attn.c_attn
FUSED = "attn.c_attn"
# Buffers that some Hugging Face versions save beside the weights: the causal mask and positions.
HF_BUFFERS = re.compile(r"^transformer\.(h\.\d+\.attn\.(bias|masked_bias)|position_ids)$")
OUR_LAYER = re.compile(r"^gpt\.layer\.(\d+)\.(.+)\.(weight|bias)$")
HF_LAYER = re.compile(r"^transformer\.h\.(\d+)\.(.+)\.(weight|bias)$")


# " word" for a word-initial token, "piece" for a "##piece" continuation, then joined.
GENERATION_DECODER = decoders.Sequence(
    [decoders.Replace(Regex("^(?!##)"), " "), decoders.Replace(Regex("^##"), ""), decoders.Fuse()]
)


# ------------------------------------------------------------------------------------ state dicts


def to_hf_state_dict(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our GPT state dict -> `OpenAIGPTLMHeadModel`'s (contiguous tensors, ready for safetensors)."""
    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}  # (layer, weight|bias) -> q/k/v parts
    for name, tensor in weights.items():
        if name in GLOBAL_KEYS:
            out[GLOBAL_KEYS[name]] = tensor.contiguous()
            continue
        layer, module, kind = _parse(OUR_LAYER, name, "a bertforge GPT")
        if module in QKV:
            qkv.setdefault((layer, kind), {})[module] = tensor
        elif module in LAYER_MODULES:
            hf_module, conv = LAYER_MODULES[module]
            out[f"transformer.h.{layer}.{hf_module}.{kind}"] = _conv(tensor, conv and kind == "weight")
        else:
            raise BertforgeError(f"{name} is not a tensor of a bertforge GPT model")
    for (layer, kind), parts in qkv.items():
        out[f"transformer.h.{layer}.{FUSED}.{kind}"] = _fuse(parts, kind, f"gpt.layer.{layer}")
    return out


def from_hf_state_dict(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`OpenAIGPTLMHeadModel`'s (or `OpenAIGPTModel`'s, unprefixed) state dict -> ours.

    Saved buffers (the causal mask, position ids) are dropped; `lm_head.weight` and a double-heads
    model's multiple-choice head are kept when present.
    """
    bare = not any(name.startswith("transformer.") for name in weights)  # a bare OpenAIGPTModel's
    ours = {hf: our for our, hf in GLOBAL_KEYS.items()}
    layer_modules = {hf: (our, conv) for our, (hf, conv) in LAYER_MODULES.items()}
    out: dict[str, torch.Tensor] = {}
    for given, tensor in weights.items():
        name = _prefixed(given) if bare else given
        if HF_BUFFERS.match(name):
            continue
        if name.startswith(MULTIPLE_CHOICE_HEAD):
            out[name] = tensor
            continue
        if name in ours:
            out[ours[name]] = tensor.contiguous()
            continue
        match = HF_LAYER.match(name)
        layer, module, kind = match.groups() if match else (None, None, None)
        prefix = f"gpt.layer.{layer}"
        if module == FUSED:
            out.update(_split(tensor, kind, prefix))
        elif module in layer_modules:
            our_module, conv = layer_modules[module]
            out[f"{prefix}.{our_module}.{kind}"] = _conv(tensor, conv and kind == "weight")
        else:
            raise BertforgeError(
                f"the weights hold {given}, not a tensor of an OpenAIGPT model, though config.json says "
                "openai-gpt: give the weights and config.json of one model"
            )
    return out


def _prefixed(name: str) -> str:
    return name if name == "lm_head.weight" else f"transformer.{name}"


def _parse(pattern: re.Pattern, name: str, what: str) -> tuple[str, str, str]:
    match = pattern.match(name)
    if match is None:
        raise BertforgeError(f"{name} is not a tensor of {what} model")
    return match.group(1), match.group(2), match.group(3)


def _conv(tensor: torch.Tensor, transpose: bool) -> torch.Tensor:
    """Linear (out, in) <-> Conv1D (in, out) for a weight; anything else unchanged."""
    return (tensor.t() if transpose else tensor).contiguous()


def _fuse(parts: dict[str, torch.Tensor], kind: str, where: str) -> torch.Tensor:
    """query, key, value -> c_attn: weight (H, 3H) as Conv1D, bias (3H,)."""
    missing = [module for module in QKV if module not in parts]
    if missing:
        raise BertforgeError(f"{where} lacks {', '.join(f'{m}.{kind}' for m in missing)}")
    fused = torch.cat([parts[module] for module in QKV], dim=0)  # (3H, H) or (3H,)
    return _conv(fused, kind == "weight")


def _split(tensor: torch.Tensor, kind: str, prefix: str) -> dict[str, torch.Tensor]:
    """c_attn -> query, key, value: each weight (H, H) as nn.Linear, each bias (H,)."""
    fused = tensor.t() if kind == "weight" else tensor  # (3H, H) or (3H,)
    if fused.shape[0] % 3:
        raise BertforgeError(f"{prefix}: c_attn.{kind} has {fused.shape[0]} rows, not 3 x hidden")
    parts = fused.chunk(3, dim=0)
    return {f"{prefix}.{module}.{kind}": part.contiguous() for module, part in zip(QKV, parts, strict=True)}


# ---------------------------------------------------------------------------------------- configs


def hf_config(
    model: ModelConfig,
    *,
    eos_token_id: int | None = None,
    bos_token_id: int | None = None,
    labels: list[str] | None = None,
) -> dict:
    """The `OpenAIGPTConfig` dict (config.json) of a bertforge GPT, or with `labels` of its classifier;
    refuses what OpenAIGPT cannot hold."""
    check_openai_gpt(model)
    config = {
        "architectures": [ARCHITECTURE if labels is None else CLASSIFIER_ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": model.vocab_size,
        "n_positions": model.max_position_embeddings,
        "n_embd": model.hidden_size,
        "n_layer": model.num_hidden_layers,
        "n_head": model.num_attention_heads,
        "afn": AFN[model.hidden_act],
        "resid_pdrop": model.hidden_dropout_prob,
        "embd_pdrop": model.hidden_dropout_prob,
        "attn_pdrop": model.attention_probs_dropout_prob,
        "layer_norm_epsilon": model.layer_norm_eps,
        "initializer_range": model.initializer_range,
        "tie_word_embeddings": True,
        "pad_token_id": model.pad_token_id,
    }
    if eos_token_id is not None:
        config["eos_token_id"] = eos_token_id
    if bos_token_id is not None:
        config["bos_token_id"] = bos_token_id
    return config if labels is None else {**config, **hf_label_fields(labels)}


def model_config_from_hf(raw: dict, source: str = "config.json") -> ModelConfig:
    """The `ModelConfig` of an OpenAIGPT config.json (missing fields take `OpenAIGPTConfig`'s defaults)."""
    if raw.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise BertforgeError(f"{source} describes a {raw.get('model_type')!r} model, not OpenAIGPT")
    if raw.get("tie_word_embeddings", True) is False:
        raise BertforgeError(f"{source}: an LM head untied from the embeddings is not GPT-1's")
    hf = {**HF_DEFAULTS, **{key: raw[key] for key in HF_DEFAULTS if key in raw}}
    if hf["afn"] not in HIDDEN_ACT:
        raise BertforgeError(f"{source}: afn = {hf['afn']!r} is not one of: {', '.join(HIDDEN_ACT)}")
    pad = raw.get("pad_token_id")
    config = ModelConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["n_embd"],
        num_hidden_layers=hf["n_layer"],
        num_attention_heads=hf["n_head"],
        intermediate_size=4 * hf["n_embd"],
        hidden_act=HIDDEN_ACT[hf["afn"]],
        hidden_dropout_prob=hf["resid_pdrop"],
        attention_probs_dropout_prob=hf["attn_pdrop"],
        max_position_embeddings=hf["n_positions"],
        layer_norm_eps=hf["layer_norm_epsilon"],
        initializer_range=hf["initializer_range"],
        pad_token_id=0 if pad is None else pad,
        objective="clm",
    )
    if hf["embd_pdrop"] != hf["resid_pdrop"]:
        warnings.warn(
            f"{source}: embd_pdrop ({hf['embd_pdrop']}) differs from resid_pdrop ({hf['resid_pdrop']}); "
            "bertforge's one rate for both (model.hidden_dropout_prob) takes resid_pdrop's, which only "
            "training reads",
            stacklevel=2,
        )
    validate_model(config, source)
    return config


# ---------------------------------------------------------------------------------------- folders


def write_hf_files(
    model: nn.Module, folder: Path, *, eos_token_id: int | None = None, labels: list[str] | None = None
) -> None:
    """Write config.json and model.safetensors (tied head dropped, as `save_pretrained`) into `folder`.

    `model`: a `GPTLMHeadModel`, or with `labels` a `GPTForSequenceClassification`.
    """
    weights = {name: t.detach().cpu() for name, t in model.state_dict().items() if name not in GPT_TIED_KEYS}
    config = hf_config(model.config, eos_token_id=eos_token_id, labels=labels)  # refuses a bad model first
    save_file(to_hf_state_dict(weights), str(folder / WEIGHTS), metadata={"format": "pt"})
    write_json(folder / CONFIG, config)


def write_hf_folder(
    folder: Path,
    model: nn.Module,
    tokenizer: BertTokenizer | None = None,
    eos_token: str = "[SEP]",
    labels: list[str] | None = None,
    max_length: int | None = None,
) -> None:
    """`save_hf_folder`'s files, written into the existing `folder` (one being assembled); `max_length`:
    the length the model trained at (default: its positions), where `transformers` truncates."""
    eos_token_id = None if tokenizer is None else _token_id(tokenizer, eos_token)
    write_hf_files(model, folder, eos_token_id=eos_token_id, labels=labels)
    if tokenizer is not None:
        max_length = max_length or model.config.max_position_embeddings
        write_gpt_tokenizer(tokenizer, folder, max_length, eos_token, for_generation=labels is None)


def save_hf_folder(
    model: nn.Module,
    out: str | Path,
    tokenizer: BertTokenizer | None = None,
    eos_token: str = "[SEP]",
    labels: list[str] | None = None,
) -> Path:
    """Write `model` (and, when given, `tokenizer`) as a Hugging Face folder `out`, new or empty, atomically.

    With a tokenizer the folder also holds what `pipeline("text-generation")` needs (see
    `write_gpt_tokenizer`), and config.json names `eos_token`'s id, at which generation stops.
    With `labels`, `model` is a `GPTForSequenceClassification`, written for
    `pipeline("text-classification")`.
    """
    out = Path(out)
    check_new_folder(out)
    with atomic_directory(out) as tmp:
        write_hf_folder(tmp, model, tokenizer, eos_token, labels)
    return out


def language_model_from_hf(
    config: ModelConfig, weights: dict[str, torch.Tensor], source: Path
) -> tuple[GPTLMHeadModel, list[str]]:
    """Our GPT language model holding an `OpenAIGPTLMHeadModel`'s (or `OpenAIGPTModel`'s) state dict
    read from `source`, in eval mode, and the task heads it left out (`score.weight`, when the
    weights were a classifier's; `multiple_choice_head.*`, a double-heads model's)."""
    weights = from_hf_state_dict(weights)
    dropped = sorted(
        name for name in weights if name in CLASSIFIER_HEAD or name.startswith(MULTIPLE_CHOICE_HEAD)
    )
    for name in dropped:
        del weights[name]
    head = weights.pop("lm_head.weight", None)
    if head is not None:  # a save may keep either of the tied pair
        weights.setdefault(WORD_EMBEDDINGS, head)
    embeddings = weights.get(WORD_EMBEDDINGS)
    if embeddings is not None:
        if head is not None and not torch.equal(head, embeddings):
            raise BertforgeError(f"{source}: lm_head.weight is not the token embeddings; GPT-1 ties them")
        weights["lm_head.weight"] = embeddings  # the alias, which check_and_load_state expects
    model = GPTLMHeadModel(config)
    check_and_load_state(model, weights, source=str(source))
    return model.eval(), dropped


# -------------------------------------------------------------------------------------- tokenizer


def write_gpt_tokenizer(
    tokenizer: BertTokenizer,
    folder: Path,
    max_length: int,
    eos_token: str = "[SEP]",
    for_generation: bool = True,
) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json for generation.

    `AutoTokenizer` would pick `OpenAIGPTTokenizer` (a BPE with vocab.json + merges.txt) for an
    openai-gpt config, so tokenizer_config.json names the generic `PreTrainedTokenizerFast`, which
    reads tokenizer.json. Its `model_input_names` leave out token_type_ids, which OpenAIGPT would
    add to the input as token embeddings. Two changes to the tokenizer make it fit generation
    (`for_generation`; a classifier keeps the `[CLS] text [SEP]` it was fine-tuned on):
    - BERT's post-processor (`[CLS] text [SEP]`) is removed: a prompt must end with its last word,
      not with an end token, for a decoder to continue it;
    - the decoder puts a space before every word-initial token, the first one included. The
      text-generation pipeline decodes the new tokens on their own and appends them to the prompt;
      WordPiece's decoder would glue the first new word onto the prompt's last ("released inthe").
      `clean_up_tokenization_spaces` then removes the space before punctuation, as WordPiece's does.
    """
    backend = Tokenizer.from_str(tokenizer.backend.to_str())
    if for_generation:
        backend.post_processor = None
        backend.decoder = GENERATION_DECODER
    specials = {
        "unk_token": "[UNK]",
        "pad_token": "[PAD]",
        "eos_token": eos_token,
        "bos_token": "[CLS]",
        "sep_token": "[SEP]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    atomic_write_bytes(folder / TOKENIZER_FILE, backend.to_str(pretty=True).encode("utf-8"))
    write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": max_length,
            "model_input_names": ["input_ids", "attention_mask"],
            "clean_up_tokenization_spaces": True,
            **specials,
        },
    )
    write_json(folder / "special_tokens_map.json", specials)


def _token_id(tokenizer: BertTokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise BertforgeError(f"the tokenizer has no {token!r} token to end generation with")
    return token_id
