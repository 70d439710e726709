"""Typed run configuration: model, tokenizer, data, training and runtime sections.

Owns the dataclasses, the list of values each choice setting accepts (its `Literal` type), the size
presets (Turc et al. 2019, "Well-Read Students Learn Better"), what each objective sets, reading TOML
files, `--set section.key=value` overrides, `validate` (it checks the tables of rules of
`bertforge.config_rules`, whose messages name the setting), and (de)serialisation to the JSON written
beside every run, checkpoint and export. Model fields use Hugging Face `BertConfig` names so export is
a rename-free copy.
"""

from __future__ import annotations

import functools
import math
import sys
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal, get_args

from bertforge.config_rules import (
    DATA_RULES,
    GPT_HIDDEN_ACT,
    GPT_LAYER_NORM_EPS,
    GPT_RULES,
    MODEL_RULES,
    OPENAI_GPT_RULES,
    RUNTIME_RULES,
    TOKENIZER_RULES,
    TRAIN_RULES,
    check_rules,
)
from bertforge.corpus import CorpusFormat
from bertforge.errors import BertforgeError
from bertforge.io import read_json, write_json

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

# The values a setting accepts, each list written once: its field below has the `Literal` type, so
# `validate`, `--set` and the command line's `choices` all read it from here.
Objective = Literal["mlm", "clm"]  # mlm: BERT (`bertforge.model`), clm: GPT-1 (`bertforge.gpt`)
Activation = Literal["gelu", "relu", "gelu_new", "silu", "tanh"]  # Hugging Face's names
TokenizerKind = Literal["wordpiece", "wordlevel"]
# The learning rate after warmup: linear decay to 0; flat; or warmup-stable-decay, flat and then linear
# to 0 over the last `train.decay_ratio` of the run (Hägele et al. 2024, "Scaling Laws and
# Compute-Optimal Training Beyond Fixed Training Durations")
Schedule = Literal["linear", "constant", "wsd"]
MlmBiasInit = Literal["unigram", "zero"]  # the MLM bias: log token frequencies of the corpus, or HF's 0
# The word embeddings (tied to the MLM decoder): BERT's N(0, initializer_range); the corpus's
# co-occurrence statistics at that scale (`bertforge.embedding_init`); or those, with the positions,
# layer 1 and the MLM transform set to a count-based window model (`bertforge.window_init`)
EmbeddingInit = Literal["normal", "cooccurrence", "window_model"]
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
    # or shard folders written by `bertforge prepare`, trained on instead (with the tokenizer that made them)
    shards: list[str] = field(default_factory=list)
    valid: str = ""  # held-out text for evaluation ("" : no evaluation)
    format: CorpusFormat = "auto"
    text_column: str = "text"  # the jsonl field or Parquet, TSV or CSV column that holds the text
    max_seq_length: int = 128
    # a sequence-length warmup: pairs of this many tokens (0: off) for the first `warmup_seq_fraction`
    # of the run (of its steps, or of its time budget), where attention, spread over fewer tokens,
    # learns to use the neighbours sooner
    warmup_seq_length: int = 0
    warmup_seq_fraction: float = 0.5
    short_seq_prob: float = 0.1
    nsp: bool = True
    # with nsp = false: windows run on into the next document after a [SEP] (as RoBERTa's FULL-SENTENCES,
    # cut at any token), so short documents fill whole sequences; false: each window within one document
    cross_documents: bool = True
    # with nsp = false: the sequence-length warmup trains on NSP pairs all the same (both heads), MLM
    # alone on contiguous text after it. NSP leads out of the MLM plateau reliably; MLM alone transfers better
    warmup_nsp: bool = False
    mlm_probability: float = 0.15
    # 0: the rate stays mlm_probability. Otherwise it moves linearly from mlm_probability at the start
    # to this at the end of the run (Ankner et al. 2023 decay 30% to 15%); each epoch is masked at
    # the rate of the progress where it starts, so a run within one epoch keeps mlm_probability
    final_mlm_probability: float = 0.0
    max_predictions_per_seq: int = 0  # 0: ceil(mlm_probability * max_seq_length)
    whole_word_masking: bool = False
    # 0: every token equally likely to be masked (BERT). t > 0: a token of corpus frequency p > t is
    # chosen with relative weight sqrt(t / p) (word2vec's subsampling of frequent words, Mikolov et
    # al. 2013), so more of the masked targets are the rarer content words; the rate stays the same
    mask_subsampling: float = 0.0
    eval_max_pairs: int = 2000  # cap on validation pairs per evaluation (0: all)


@dataclass
class TrainConfig:
    """The optimisation: batch, optimizer, schedule, budget, evaluation and checkpoint cadence."""

    batch_size: int = 32  # global sequences per optimizer step
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-4
    # each layer learns at this times the rate of the one above it, the heads at the full rate
    # (ELECTRA's layer-wise decay, Clark et al. 2020: 0.8); 1: one rate for every weight
    layer_decay: float = 1.0
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-6
    warmup_steps: int = 0  # 0: warmup_ratio * max_steps
    warmup_ratio: float = 0.06
    schedule: Schedule = "linear"
    decay_ratio: float = 0.2  # the wsd schedule's decay: the last share of the run's progress
    mlm_bias_init: MlmBiasInit = "unigram"
    embedding_init: EmbeddingInit = "normal"
    max_grad_norm: float = 1.0
    max_steps: int = 1000
    max_minutes: float = 0.0  # 0: no time budget; otherwise the schedule ends when time runs out
    log_every: int = 10  # steps between train-metric lines (each costs one host synchronisation)
    eval_every: int = 200
    checkpoint_every: int = 0  # 0: same as eval_every
    keep_checkpoints: int = 2
    # fine-tuning: batches of examples of similar length, so less of each batch is padding (Hugging
    # Face's `group_by_length`); pretraining packs its sequences to full length, so it has none
    group_by_length: bool = False
    # BERT recomputes each layer's activations in the backward instead of keeping them: memory for
    # a larger model or batch on a small GPU, for about a third more compute; the same gradients
    activation_checkpointing: bool = False


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

    @property
    def trained_length(self) -> int:
        """The longest sequence the model trains at: its positions past it never train."""
        return min(self.data.max_seq_length, self.model.max_position_embeddings)

    @classmethod
    def from_dict(cls, raw: dict, origin: str = "config") -> RunConfig:
        """A saved config (a run's `config.json`, named by `origin` in errors); retired settings
        (`RETIRED`) are dropped, and a setting it lacks takes the value its run trained with
        (`WHEN_ABSENT`)."""
        config = cls()
        current = {
            section: {key: value for key, value in values.items() if f"{section}.{key}" not in RETIRED}
            if isinstance(values, dict)
            else values
            for section, values in raw.items()
        }
        for name, value in WHEN_ABSENT.items():
            section, key = name.split(".")
            if isinstance(current.get(section), dict) and key not in current[section]:
                current[section][key] = value
        apply_mapping(config, current, origin=origin)
        return config


# Retired settings, with what takes their place: a saved run's config drops them, and a user's config or
# `--set` that names one is told the replacement.
RETIRED: dict[str, str] = {
    "data.warmup_seq_epochs": "data.warmup_seq_fraction (the share of the run's steps or time budget)",
}


# Settings that a saved config may lack, with the value its run trained with: a resume, an evaluation
# or an export of it reads it as it trained.
WHEN_ABSENT: dict[str, object] = {
    "data.cross_documents": False,
}


# Turc et al. 2019 sizes: (layers, hidden, heads); intermediate is 4 x hidden.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
}

# Peak learning rate per size: post-LN BERT collapses into predicting the most frequent token
# above about 3e-3 (tiny) and 2e-3 (mini) on WikiText-2 (docs/findings.md); tiny and mini
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


def preset_model(name: str) -> ModelConfig:
    """The model section of the named size preset (every other field at its default)."""
    config = RunConfig()
    apply_preset(config, name)
    return config.model


def apply_objective(config: RunConfig, objective: str) -> None:
    """Set the model's objective; "clm" (GPT-1) also takes GPT-1's activation and LayerNorm epsilon,
    and no sentence pairs."""
    config.model.objective = objective
    if objective == "clm":
        config.model.hidden_act = GPT_HIDDEN_ACT
        config.model.layer_norm_eps = GPT_LAYER_NORM_EPS
        config.data.nsp = False


def drop_pairs_for_a_gpt(config: RunConfig) -> None:
    """A GPT reads no sentence pairs: clear `data.nsp` and `data.warmup_nsp`, which a config file
    written for BERT may set, so that the run's config.json says what it trains."""
    if config.model.objective == "clm":
        config.data.nsp = config.data.warmup_nsp = False


def objective_named(raw: dict, overrides: list[str]) -> str | None:
    """The objective that a config file's settings `raw` or a `--set model.objective=...` (the last
    wins) names, else None: `apply_objective` takes it first, as for `--objective`, so that a GPT set
    there also starts from GPT-1's activation and LayerNorm epsilon."""
    model = raw.get("model")
    named = model.get("objective") if isinstance(model, dict) else None
    for item in overrides:
        name, sep, text = item.partition("=")
        if sep and name.strip() == "model.objective":
            named = override_value(text)
    return named if isinstance(named, str) else None


def load_toml(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        raise BertforgeError(f"config file {path} is a folder; give a TOML file, such as configs/mini.toml")
    if not path.is_file():
        raise BertforgeError(f"config file {path} does not exist; check the path")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError:
        raise BertforgeError(f"config file {path} is not UTF-8 text; give a TOML file") from None
    except tomllib.TOMLDecodeError as error:
        raise BertforgeError(f"config file {path} is not valid TOML: {error}") from None


def apply_mapping(config: RunConfig, raw: dict, origin: str) -> None:
    """Copy `{section: {key: value}}` into `config`, checking names and types.

    A top-level `preset = "mini"` key applies that preset before the model section.
    """
    raw = dict(raw)
    preset = raw.pop("preset", None)
    if preset is not None and str(preset) not in PRESETS:
        raise BertforgeError(f"{origin}: unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
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
        value = override_value(text)
        _set_field(_section(config, section_name, "--set"), section_name, key, value, "--set")


def override_value(text: str):
    """A `--set` value: a TOML scalar (1e-3, true, "quoted"), else the text as it is."""
    try:
        return tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return text.strip()


def _section(config: RunConfig, name: str, origin: str):
    names = [f.name for f in fields(config)]
    if name not in names:
        raise BertforgeError(f"{origin}: unknown section {name!r}; sections are {', '.join(names)}")
    return getattr(config, name)


def _set_field(section, section_name: str, key: str, value, origin: str) -> None:
    known = {f.name: f for f in fields(section)}
    replacement = RETIRED.get(f"{section_name}.{key}")
    if replacement:
        raise BertforgeError(f"{origin}: {section_name}.{key} is not a setting; use {replacement}")
    if key not in known:
        raise BertforgeError(
            f"{origin}: unknown setting {section_name}.{key}; {section_name} settings are {', '.join(known)}"
        )
    expected = _field_types(type(section))[key]
    setattr(section, key, _coerce(value, expected, f"{section_name}.{key}", origin))


@functools.cache
def _field_types(section_class: type) -> dict:
    """A section's field types, its annotations evaluated (they are strings here): evaluating them
    takes most of a millisecond, and a run folder's config sets a hundred fields."""
    return typing.get_type_hints(section_class)


def _coerce(value, expected, name: str, origin: str):
    if isinstance(expected, types.UnionType):  # e.g. `int | None`
        expected = next(t for t in get_args(expected) if t is not type(None))
    if typing.get_origin(expected) is Literal:  # a string here; `validate` checks it is one of the choices
        expected = str
    if expected == list[str]:  # one string is a list of one (a config.json may hold either)
        items = ([value] if value else []) if isinstance(value, str) else value
        if isinstance(items, list) and all(isinstance(item, str) for item in items):
            return list(items)
        raise BertforgeError(f"{origin}: {name} must be a string or a list of strings, got {value!r}")
    accepted = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}[expected]
    # bool is a subclass of int in Python; `true` must not pass as a number.
    if isinstance(value, accepted) and (expected is bool or not isinstance(value, bool)):
        try:
            return float(value) if expected is float else value
        except OverflowError:  # an integer beyond a float's range; `validate` checks the others
            raise BertforgeError(f"{origin}: {name} = {value} is beyond the range of a number") from None
    wanted = (
        "true or false (unquoted and lower case, as TOML writes them)"
        if expected is bool
        else expected.__name__
    )
    raise BertforgeError(f"{origin}: {name} must be {wanted}, got {value!r}")


def validate_model(m: ModelConfig, source: str | Path | None = None, advice: str = "") -> None:
    """Raise `BertforgeError` naming the first impossible model setting (also for a loaded folder);
    for a model config read from the file `source`, the message names the file, then `advice`."""
    try:
        check_rules(RunConfig(model=m), MODEL_RULES)
    except BertforgeError as error:
        if source is None:
            raise
        raise BertforgeError(f"{source}: {error}" + (f"; {advice}" if advice else "")) from None


def validate(config: RunConfig) -> None:
    """Raise `BertforgeError` naming the first impossible setting."""
    validate_model(config.model)
    check_rules(config, GPT_RULES + TOKENIZER_RULES + DATA_RULES + TRAIN_RULES + RUNTIME_RULES)


def validate_saved(config: RunConfig, source: str | Path, advice: str) -> None:
    """Raise `BertforgeError` naming the file `source`, then `advice`, for the first impossible setting
    of what reading a saved model takes: its model, tokenizer and data sections (a resume validates
    the rest)."""
    validate_model(config.model, source, advice)
    try:
        check_rules(config, TOKENIZER_RULES + DATA_RULES)
    except BertforgeError as error:
        raise BertforgeError(f"{source}: {error}; {advice}") from None


def check_openai_gpt(model: ModelConfig) -> None:
    """Refuse a GPT that Hugging Face's OpenAIGPT cannot hold: its activations and a 4 x hidden
    feed-forward only."""
    check_rules(RunConfig(model=model), OPENAI_GPT_RULES)


def max_predictions(data: DataConfig) -> int:
    """Cap on masked positions per sequence (Google uses 20 for 128 tokens at 15%)."""
    if data.max_predictions_per_seq:
        return data.max_predictions_per_seq
    return math.ceil(data.mlm_probability * data.max_seq_length)


def save_json(config: RunConfig, path: str | Path) -> None:
    write_json(Path(path), config.to_dict())


def load_json(path: str | Path) -> RunConfig:
    return RunConfig.from_dict(
        read_json(Path(path), missing="is this a bertforge run, checkpoint or model folder?"),
        origin=str(path),
    )
