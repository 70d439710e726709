"""Typed run configuration: model, tokenizer, data, training and runtime sections.

Owns the dataclasses, the size presets (Turc et al. 2019, "Well-Read Students Learn Better"),
reading TOML files, `--set section.key=value` overrides, validation with messages that name the
field, and (de)serialisation to the JSON written beside every run, checkpoint and export.
Model fields use Hugging Face `BertConfig` names so export is a rename-free copy.
"""

from __future__ import annotations

import json
import math
import sys
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal, get_args

from bertforge.corpus import CorpusFormat
from bertforge.errors import BertforgeError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

# The values a setting accepts, each list written once: its field below has the `Literal` type, so
# `validate`, `--set` and the command line's `choices` all read it from here.
Objective = Literal["mlm", "clm"]  # mlm: BERT (`bertforge.model`), clm: GPT-1 (`bertforge.gpt`)
Activation = Literal["gelu", "relu", "gelu_new", "silu", "tanh"]  # Hugging Face's names
TokenizerKind = Literal["wordpiece", "wordlevel"]
Schedule = Literal["linear", "constant"]  # the learning rate after warmup: linear decay to 0, or flat
MlmBiasInit = Literal["unigram", "zero"]  # the MLM bias: log token frequencies of the corpus, or HF's 0
ExplicitPrecision = Literal["fp32", "bf16", "fp16"]
Precision = Literal["auto", ExplicitPrecision]  # auto: measured (`bertforge.precision`)

OBJECTIVES: tuple[Objective, ...] = get_args(Objective)
HIDDEN_ACTS: tuple[Activation, ...] = get_args(Activation)
TOKENIZER_KINDS: tuple[TokenizerKind, ...] = get_args(TokenizerKind)
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
EXPLICIT_PRECISIONS: tuple[ExplicitPrecision, ...] = get_args(ExplicitPrecision)


@dataclass
class ModelConfig:
    """The architecture, with Hugging Face `BertConfig` field names, and which model it is.

    `objective` "mlm" is BERT (`bertforge.model`, masked LM + NSP), "clm" GPT-1 (`bertforge.gpt`,
    next-token prediction with causal attention; `type_vocab_size` is unused there).
    """

    vocab_size: int = 30522
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    hidden_act: Activation = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    objective: Objective = "mlm"  # not a BertConfig field (export leaves it out)


@dataclass
class TokenizerConfig:
    """How the vocabulary is learned when the run trains its own tokenizer."""

    kind: TokenizerKind = "wordpiece"
    vocab_size: int = 30522
    min_frequency: int = 2
    lowercase: bool = True


@dataclass
class DataConfig:
    """How text becomes training pairs and masked batches."""

    # training text: files, folders or glob patterns (recorded so that --resume needs no paths)
    corpus: list[str] = field(default_factory=list)
    valid: str = ""  # held-out text for evaluation ("" : no evaluation)
    format: CorpusFormat = "auto"
    text_column: str = "text"  # the jsonl field or Parquet column that holds the text
    max_seq_length: int = 128
    # a sequence-length warmup: pairs of this many tokens (0: off) in the first `warmup_seq_epochs`
    # epochs, where attention, spread over fewer tokens, learns to use the neighbours sooner
    warmup_seq_length: int = 0
    warmup_seq_epochs: int = 1
    short_seq_prob: float = 0.1
    nsp: bool = True
    mlm_probability: float = 0.15
    max_predictions_per_seq: int = 0  # 0: ceil(mlm_probability * max_seq_length)
    whole_word_masking: bool = False
    eval_max_pairs: int = 2000  # cap on validation pairs per evaluation (0: all)


@dataclass
class TrainConfig:
    """The optimisation: batch, optimizer, schedule, budget, evaluation and checkpoint cadence."""

    batch_size: int = 32  # global sequences per optimizer step
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-4
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-6
    warmup_steps: int = 0  # 0: warmup_ratio * max_steps
    warmup_ratio: float = 0.06
    schedule: Schedule = "linear"
    mlm_bias_init: MlmBiasInit = "unigram"
    max_grad_norm: float = 1.0
    max_steps: int = 1000
    max_minutes: float = 0.0  # 0: no time budget; otherwise the schedule ends when time runs out
    log_every: int = 10  # steps between train-metric lines (each costs one host synchronisation)
    eval_every: int = 200
    checkpoint_every: int = 0  # 0: same as eval_every
    keep_checkpoints: int = 2


@dataclass
class RuntimeConfig:
    """Where and how the run executes; none of this changes the maths of a step."""

    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    precision: Precision = "auto"
    compile: bool = False
    seed: int = 1234
    num_workers: int = -1  # data workers masking batches in the background; -1: 2 on CUDA, 0 elsewhere
    threads: int = 0  # 0: leave torch's default
    tf32: bool = True  # on CUDA, fp32 matmuls use TensorFloat-32 (Ampere and later); false: full fp32
    dist_timeout_minutes: float = 60.0  # under torchrun, how long a collective waits for the other ranks


@dataclass
class RunConfig:
    """Everything a run needs; saved as `config.json` beside every run, checkpoint and export."""

    model: ModelConfig = field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> RunConfig:
        config = cls()
        apply_mapping(config, raw, origin="config")
        return config


# Turc et al. 2019 sizes: (layers, hidden, heads); intermediate is 4 x hidden.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
}

# Peak learning rate per size: post-LN BERT collapses into predicting the most frequent token
# above about 3e-3 (tiny) and 2e-3 (mini) on WikiText-2 (docs/time-to-quality.md); tiny and mini
# are the fastest measured rates that stay clear of it, base is Devlin et al.'s 1e-4.
PRESET_LEARNING_RATES: dict[str, float] = {
    "tiny": 2e-3,
    "mini": 1e-3,
    "small": 5e-4,
    "medium": 2e-4,
    "base": 1e-4,
}


def apply_preset(config: RunConfig, name: str) -> None:
    """Set the model's size fields and the size's peak learning rate from a named preset."""
    if name not in PRESETS:
        raise BertforgeError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    layers, hidden, heads = PRESETS[name]
    config.model.num_hidden_layers = layers
    config.model.hidden_size = hidden
    config.model.num_attention_heads = heads
    config.model.intermediate_size = 4 * hidden
    config.train.learning_rate = PRESET_LEARNING_RATES[name]


def apply_objective(config: RunConfig, objective: str) -> None:
    """Set the model's objective; "clm" (GPT-1) also takes GPT-1's activation and no sentence pairs."""
    config.model.objective = objective
    if objective == "clm":
        from bertforge.gpt import GPT_HIDDEN_ACT  # here: bertforge.gpt imports this module

        config.model.hidden_act = GPT_HIDDEN_ACT
        config.data.nsp = False


def load_toml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise BertforgeError(f"config file {path} does not exist; check the path given to --config")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise BertforgeError(f"config file {path} is not valid TOML: {error}") from None


def apply_mapping(config: RunConfig, raw: dict, origin: str) -> None:
    """Copy `{section: {key: value}}` into `config`, checking names and types.

    A top-level `preset = "mini"` key applies that preset before the model section.
    """
    raw = dict(raw)
    preset = raw.pop("preset", None)
    if preset is not None:
        apply_preset(config, str(preset))
    for section_name, values in raw.items():
        section = _section(config, section_name, origin)
        if not isinstance(values, dict):
            raise BertforgeError(f"{origin}: [{section_name}] must be a table of settings")
        for key, value in values.items():
            _set_field(section, section_name, key, value, origin)


def apply_overrides(config: RunConfig, overrides: list[str]) -> None:
    """Apply `--set section.key=value` strings; values are parsed as TOML scalars, else strings."""
    for item in overrides:
        name, sep, text = item.partition("=")
        section_name, dot, key = name.strip().partition(".")
        if not sep or not dot or not key:
            raise BertforgeError(f"--set {item!r}: expected section.key=value, e.g. train.learning_rate=1e-3")
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()
        _set_field(_section(config, section_name, "--set"), section_name, key, value, "--set")


def _section(config: RunConfig, name: str, origin: str):
    names = [f.name for f in fields(config)]
    if name not in names:
        raise BertforgeError(f"{origin}: unknown section {name!r}; sections are {', '.join(names)}")
    return getattr(config, name)


def _set_field(section, section_name: str, key: str, value, origin: str) -> None:
    known = {f.name: f for f in fields(section)}
    if key not in known:
        raise BertforgeError(
            f"{origin}: unknown setting {section_name}.{key}; {section_name} settings are {', '.join(known)}"
        )
    expected = typing.get_type_hints(type(section))[key]
    setattr(section, key, _coerce(value, expected, f"{section_name}.{key}", origin))


def _coerce(value, expected, name: str, origin: str):
    if isinstance(expected, types.UnionType):  # e.g. `int | None`
        expected = next(t for t in get_args(expected) if t is not type(None))
    if typing.get_origin(expected) is Literal:  # a string here; `validate` checks it is one of the choices
        expected = str
    if expected == list[str]:  # one string is a list of one (config.json files of older versions)
        items = ([value] if value else []) if isinstance(value, str) else value
        if isinstance(items, list) and all(isinstance(item, str) for item in items):
            return list(items)
        raise BertforgeError(f"{origin}: {name} must be a string or a list of strings, got {value!r}")
    accepted = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}[expected]
    # bool is a subclass of int in Python; `true` must not pass as a number.
    if isinstance(value, accepted) and (expected is bool or not isinstance(value, bool)):
        return float(value) if expected is float else value
    raise BertforgeError(f"{origin}: {name} must be {expected.__name__}, got {value!r}")


def choices(section) -> dict[str, tuple[str, ...]]:
    """The settings of a config section that take one of a list of values, and each one's list."""
    hints = typing.get_type_hints(type(section))
    return {key: get_args(hint) for key, hint in hints.items() if typing.get_origin(hint) is Literal}


MAX_POSITIONS = 1 << 16  # BERT uses 512; attention's cost grows with the square of the length
MAX_PARAMETERS = 10**10  # BERT-large has 3.4e8; beyond this a typo is likelier than a plan


def validate_model(m: ModelConfig) -> None:
    """Raise `BertforgeError` naming the first impossible model setting (also for a loaded folder)."""
    require_positive(
        {
            "model.vocab_size": m.vocab_size,
            "model.hidden_size": m.hidden_size,
            "model.num_hidden_layers": m.num_hidden_layers,
            "model.num_attention_heads": m.num_attention_heads,
            "model.intermediate_size": m.intermediate_size,
            "model.max_position_embeddings": m.max_position_embeddings,
            "model.type_vocab_size": m.type_vocab_size,
        }
    )
    if m.max_position_embeddings > MAX_POSITIONS:
        raise BertforgeError(
            f"model.max_position_embeddings = {m.max_position_embeddings} is above {MAX_POSITIONS:,}; "
            "BERT uses 512 (attention's cost grows with the square of the length)"
        )
    if (count := parameter_count(m)) > MAX_PARAMETERS:
        raise BertforgeError(
            f"the model sizes give about {count:.2g} parameters ({count * 4 / 2**30:,.0f} GiB in fp32), "
            f"above bertforge's limit of {MAX_PARAMETERS / 1e9:.0f} billion; check the model.* settings"
        )
    if m.hidden_size % m.num_attention_heads:
        raise BertforgeError(
            f"model.hidden_size ({m.hidden_size}) must be divisible by model.num_attention_heads "
            f"({m.num_attention_heads})"
        )
    require_fraction(
        {
            "model.hidden_dropout_prob": m.hidden_dropout_prob,
            "model.attention_probs_dropout_prob": m.attention_probs_dropout_prob,
        }
    )
    require_positive_number(
        {"model.layer_norm_eps": m.layer_norm_eps, "model.initializer_range": m.initializer_range}
    )
    if not 0 <= m.pad_token_id < m.vocab_size:
        raise BertforgeError(f"model.pad_token_id ({m.pad_token_id}) must be a token id below vocab_size")


def require_positive(values: dict[str, float]) -> None:
    for name, value in values.items():
        if value <= 0:
            raise BertforgeError(f"{name} must be positive, got {value}")


def require_fraction(values: dict[str, float]) -> None:
    """Each value in [0, 1)."""
    for name, value in values.items():
        if not 0.0 <= value < 1.0:
            raise BertforgeError(f"{name} must be in [0, 1), got {value}")


def require_positive_number(values: dict[str, float]) -> None:
    """Each value positive and finite (NaN and infinity refused)."""
    for name, value in values.items():
        if not value > 0.0 or not math.isfinite(value):
            raise BertforgeError(f"{name} must be a positive number, got {value}")


def parameter_count(m: ModelConfig) -> int:
    """Weights of the encoder and heads, roughly: embeddings, then per layer attention and feed-forward."""
    hidden, inner = m.hidden_size, m.intermediate_size
    embeddings = (m.vocab_size + m.max_position_embeddings + m.type_vocab_size) * hidden
    return embeddings + m.num_hidden_layers * (4 * hidden * hidden + 2 * hidden * inner)


def validate(config: RunConfig) -> None:
    """Raise `BertforgeError` naming the first impossible setting."""
    m, t, d, tr, rt = config.model, config.tokenizer, config.data, config.train, config.runtime
    validate_model(m)
    for section in fields(config):
        for key, allowed in choices(getattr(config, section.name)).items():
            value = getattr(getattr(config, section.name), key)
            if value not in allowed:
                raise BertforgeError(f"{section.name}.{key} = {value!r} is not one of: {', '.join(allowed)}")
    require_positive(
        {
            "tokenizer.vocab_size": t.vocab_size,
            "tokenizer.min_frequency": t.min_frequency,
            "train.batch_size": tr.batch_size,
            "train.gradient_accumulation_steps": tr.gradient_accumulation_steps,
            "train.max_steps": tr.max_steps,
            "train.log_every": tr.log_every,
            "train.eval_every": tr.eval_every,
            "train.keep_checkpoints": tr.keep_checkpoints,
        }
    )
    if t.vocab_size <= 5:
        raise BertforgeError(f"tokenizer.vocab_size ({t.vocab_size}) must exceed the 5 special tokens")
    if d.max_seq_length > m.max_position_embeddings:
        raise BertforgeError(
            f"data.max_seq_length ({d.max_seq_length}) is above model.max_position_embeddings "
            f"({m.max_position_embeddings}); lower the sequence length or raise the positions"
        )
    if m.objective == "clm":
        from bertforge.gpt_convert import check_openai_gpt  # here: it imports this module

        check_openai_gpt(m)  # GPT-1's shapes, so that the model exports to OpenAIGPT
    nsp = d.nsp and m.objective == "mlm"  # a GPT trains on packed text, never on pairs
    minimum_length = 5 if nsp else 3  # [CLS] a [SEP] b [SEP] needs room for one token each side
    if d.max_seq_length < minimum_length:
        raise BertforgeError(f"data.max_seq_length must be at least {minimum_length}, got {d.max_seq_length}")
    if d.warmup_seq_length and not minimum_length <= d.warmup_seq_length < d.max_seq_length:
        raise BertforgeError(
            f"data.warmup_seq_length must be 0 (off) or from {minimum_length} to below "
            f"data.max_seq_length ({d.max_seq_length}), got {d.warmup_seq_length}"
        )
    if nsp and m.type_vocab_size < 2:
        raise BertforgeError("data.nsp = true needs model.type_vocab_size >= 2 (segment ids 0 and 1)")
    for name, value in {
        "data.mlm_probability": d.mlm_probability,
        "data.short_seq_prob": d.short_seq_prob,
    }.items():
        if not 0.0 <= value < 1.0 or (name == "data.mlm_probability" and value == 0.0):
            raise BertforgeError(f"{name} must be in (0, 1), got {value}")
    require_fraction({"train.warmup_ratio": tr.warmup_ratio})
    require_positive_number({"train.learning_rate": tr.learning_rate, "train.adam_epsilon": tr.adam_epsilon})
    for name, value in {
        "train.weight_decay": tr.weight_decay,
        "train.max_grad_norm": tr.max_grad_norm,
        "train.max_minutes": tr.max_minutes,
        "train.warmup_steps": tr.warmup_steps,
        "train.checkpoint_every": tr.checkpoint_every,
        "data.max_predictions_per_seq": d.max_predictions_per_seq,
        "data.eval_max_pairs": d.eval_max_pairs,
        "data.warmup_seq_epochs": d.warmup_seq_epochs,
        "runtime.threads": rt.threads,
    }.items():
        if value < 0:
            raise BertforgeError(f"{name} must not be negative, got {value}")
    if rt.num_workers < -1:
        raise BertforgeError(f"runtime.num_workers must be -1 (auto) or more, got {rt.num_workers}")
    require_positive_number({"runtime.dist_timeout_minutes": rt.dist_timeout_minutes})
    if tr.batch_size % tr.gradient_accumulation_steps:
        raise BertforgeError(
            f"train.batch_size ({tr.batch_size}) must be divisible by train.gradient_accumulation_steps "
            f"({tr.gradient_accumulation_steps})"
        )


def max_predictions(data: DataConfig) -> int:
    """Cap on masked positions per sequence (Google uses 20 for 128 tokens at 15%)."""
    if data.max_predictions_per_seq:
        return data.max_predictions_per_seq
    return math.ceil(data.mlm_probability * data.max_seq_length)


def save_json(config: RunConfig, path: str | Path) -> None:
    from bertforge.io import atomic_write_text

    atomic_write_text(Path(path), json.dumps(config.to_dict(), indent=2) + "\n")


def load_json(path: str | Path) -> RunConfig:
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BertforgeError(
            f"{path} is missing; is this a bertforge run, checkpoint or model folder?"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BertforgeError(f"{path} is not valid JSON ({error}); the folder may be damaged") from None
    if not isinstance(raw, dict):
        raise BertforgeError(f"{path} does not hold a bertforge config")
    return RunConfig.from_dict(raw)
