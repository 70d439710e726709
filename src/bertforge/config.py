"""Typed run configuration: model, tokenizer, data, training and runtime sections.

Owns the dataclasses, the list of values each choice setting accepts (its `Literal` type), the size
presets (Turc et al. 2019, "Well-Read Students Learn Better"), reading TOML files, `--set
section.key=value` overrides, the validation of every setting (tables of rules with messages that
name the setting), and (de)serialisation to the JSON written beside every run, checkpoint and export.
Model fields use Hugging Face `BertConfig` names so export is a rename-free copy.
"""

from __future__ import annotations

import math
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

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
    text_column: str = "text"  # the jsonl field or Parquet column that holds the text
    max_seq_length: int = 128
    # a sequence-length warmup: pairs of this many tokens (0: off) for the first `warmup_seq_fraction`
    # of the run (of its steps, or of its time budget), where attention, spread over fewer tokens,
    # learns to use the neighbours sooner
    warmup_seq_length: int = 0
    warmup_seq_fraction: float = 0.5
    short_seq_prob: float = 0.1
    nsp: bool = True
    # with nsp = false: the sequence-length warmup trains on NSP pairs all the same (both heads), MLM
    # alone on contiguous text after it. NSP leads out of the MLM plateau reliably; MLM alone transfers better
    warmup_nsp: bool = False
    mlm_probability: float = 0.15
    # 0: the rate stays mlm_probability. Otherwise it moves linearly from mlm_probability at the start
    # to this at the end of the run (Ankner et al. 2023 decay 30% to 15%); each epoch is masked at
    # the rate of the progress where it starts
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
        """A saved config (a run's `config.json`); settings of earlier versions (`RETIRED`) are dropped."""
        config = cls()
        current = {
            section: {key: value for key, value in values.items() if f"{section}.{key}" not in RETIRED}
            if isinstance(values, dict)
            else values
            for section, values in raw.items()
        }
        apply_mapping(config, current, origin="config")
        return config


# Settings that earlier versions had, with what replaced them: a saved run's config drops them, and a
# user's config or `--set` that names one is told the replacement.
RETIRED: dict[str, str] = {
    "data.warmup_seq_epochs": "data.warmup_seq_fraction (the share of the run's steps or time budget)",
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
    """Set the model's objective; "clm" (GPT-1) also takes GPT-1's activation and no sentence pairs."""
    config.model.objective = objective
    if objective == "clm":
        from bertforge.gpt import GPT_HIDDEN_ACT  # here: bertforge.gpt imports this module

        config.model.hidden_act = GPT_HIDDEN_ACT
        config.data.nsp = False


def load_toml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise BertforgeError(f"config file {path} does not exist; check the path")
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
    replacement = RETIRED.get(f"{section_name}.{key}")
    if replacement:
        raise BertforgeError(f"{origin}: {section_name}.{key} was replaced by {replacement}")
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


# ---------------------------------------------------------------------------------------- validation
# Every check of the user's settings lives here, as a table of rules per section; code inside the
# library trusts a validated config and states what it relies on with `assert` (`bertforge.errors`).

MAX_POSITIONS = 1 << 16  # BERT uses 512; attention's cost grows with the square of the length
MAX_PARAMETERS = 10**10  # BERT-large has 3.4e8; beyond this a typo is likelier than a plan


@dataclass(frozen=True)
class Rule:
    """A requirement on the settings: when `holds(config)` is false, `problem(config)` tells the user."""

    holds: Callable[[RunConfig], bool]
    problem: Callable[[RunConfig], str]


def setting_value(config: RunConfig, name: str):
    """The value of the setting `section.key`."""
    section, key = name.split(".")
    return getattr(getattr(config, section), key)


def each(test: Callable[[Any], bool], requirement: str, *names: str) -> list[Rule]:
    """A rule per setting: its value passes `test`, else "{name} {requirement}, got {value}"."""
    return [
        Rule(
            lambda c, name=name: test(setting_value(c, name)),
            lambda c, name=name: f"{name} {requirement}, got {setting_value(c, name)}",
        )
        for name in names
    ]


def positive(*names: str) -> list[Rule]:
    return each(lambda value: value > 0, "must be positive", *names)


def fraction(*names: str) -> list[Rule]:
    return each(lambda value: 0.0 <= value < 1.0, "must be in [0, 1)", *names)


def positive_number(*names: str) -> list[Rule]:
    """Positive and finite: NaN and infinity refused."""
    return each(lambda value: value > 0.0 and math.isfinite(value), "must be a positive number", *names)


def not_negative(*names: str) -> list[Rule]:
    return each(lambda value: value >= 0, "must not be negative", *names)


def choices(section: str) -> dict[str, tuple[str, ...]]:
    """The settings of a config section that take one of a list of values (a `Literal` type), each with
    its list."""
    hints = typing.get_type_hints(typing.get_type_hints(RunConfig)[section])
    return {key: get_args(hint) for key, hint in hints.items() if typing.get_origin(hint) is Literal}


def one_of_choices(section: str) -> list[Rule]:
    """A rule per setting of `section` with a list of values: its value is one of them."""
    return [
        Rule(
            lambda c, name=f"{section}.{key}", allowed=allowed: setting_value(c, name) in allowed,
            lambda c, name=f"{section}.{key}", allowed=allowed: (
                f"{name} = {setting_value(c, name)!r} is not one of: {', '.join(allowed)}"
            ),
        )
        for key, allowed in choices(section).items()
    ]


def parameter_count(m: ModelConfig) -> int:
    """Weights of the encoder and heads, roughly: embeddings, then per layer attention and feed-forward."""
    hidden, inner = m.hidden_size, m.intermediate_size
    embeddings = (m.vocab_size + m.max_position_embeddings + m.type_vocab_size) * hidden
    return embeddings + m.num_hidden_layers * (4 * hidden * hidden + 2 * hidden * inner)


def trains_nsp(config: RunConfig) -> bool:
    """Whether the run trains on sentence pairs with NSP (all along, or in its sequence-length warmup):
    a GPT trains on packed text, never on pairs."""
    return (config.data.nsp or config.data.warmup_nsp) and config.model.objective == "mlm"


def shortest_sequence(config: RunConfig) -> int:
    """[CLS] a [SEP] b [SEP] (with NSP) or [CLS] a [SEP], with room for one token in each part."""
    return 5 if trains_nsp(config) else 3


MODEL_RULES: list[Rule] = [
    *positive(
        "model.vocab_size",
        "model.hidden_size",
        "model.num_hidden_layers",
        "model.num_attention_heads",
        "model.intermediate_size",
        "model.max_position_embeddings",
        "model.type_vocab_size",
    ),
    Rule(
        lambda c: c.model.max_position_embeddings <= MAX_POSITIONS,
        lambda c: (
            f"model.max_position_embeddings = {c.model.max_position_embeddings} is above "
            f"{MAX_POSITIONS:,}; BERT uses 512 (attention's cost grows with the square of the length)"
        ),
    ),
    Rule(
        lambda c: parameter_count(c.model) <= MAX_PARAMETERS,
        lambda c: (
            f"the model sizes give about {parameter_count(c.model):.2g} parameters "
            f"({parameter_count(c.model) * 4 / 2**30:,.0f} GiB in fp32), above bertforge's limit of "
            f"{MAX_PARAMETERS / 1e9:.0f} billion; check the model.* settings"
        ),
    ),
    Rule(
        lambda c: c.model.hidden_size % c.model.num_attention_heads == 0,
        lambda c: (
            f"model.hidden_size ({c.model.hidden_size}) must be divisible by "
            f"model.num_attention_heads ({c.model.num_attention_heads})"
        ),
    ),
    *fraction("model.hidden_dropout_prob", "model.attention_probs_dropout_prob"),
    *positive_number("model.layer_norm_eps", "model.initializer_range"),
    Rule(
        lambda c: 0 <= c.model.pad_token_id < c.model.vocab_size,
        lambda c: f"model.pad_token_id ({c.model.pad_token_id}) must be a token id below vocab_size",
    ),
    *one_of_choices("model"),
]

TOKENIZER_RULES: list[Rule] = [
    *one_of_choices("tokenizer"),
    *positive("tokenizer.vocab_size", "tokenizer.min_frequency"),
    Rule(
        lambda c: c.tokenizer.vocab_size > 5,
        lambda c: f"tokenizer.vocab_size ({c.tokenizer.vocab_size}) must exceed the 5 special tokens",
    ),
]

DATA_RULES: list[Rule] = [
    *one_of_choices("data"),
    Rule(
        lambda c: c.data.max_seq_length <= c.model.max_position_embeddings,
        lambda c: (
            f"data.max_seq_length ({c.data.max_seq_length}) is above model.max_position_embeddings "
            f"({c.model.max_position_embeddings}); lower the sequence length or raise the positions"
        ),
    ),
    Rule(
        lambda c: c.data.max_seq_length >= shortest_sequence(c),
        lambda c: (
            f"data.max_seq_length must be at least {shortest_sequence(c)} "
            f"({'[CLS] A [SEP] B [SEP]' if trains_nsp(c) else '[CLS] A [SEP]'}), got {c.data.max_seq_length}"
        ),
    ),
    Rule(
        lambda c: (
            not c.data.warmup_seq_length
            or shortest_sequence(c) <= c.data.warmup_seq_length < c.data.max_seq_length
        ),
        lambda c: (
            f"data.warmup_seq_length must be 0 (off) or from {shortest_sequence(c)} to below "
            f"data.max_seq_length ({c.data.max_seq_length}), got {c.data.warmup_seq_length}"
        ),
    ),
    Rule(
        lambda c: (
            not c.data.warmup_nsp
            or (c.model.objective == "mlm" and not c.data.nsp and c.data.warmup_seq_length > 0)
        ),
        lambda c: (
            "data.warmup_nsp = true is for a BERT run without NSP (data.nsp = false) with a sequence-length "
            "warmup (data.warmup_seq_length); set those, or drop data.warmup_nsp"
        ),
    ),
    Rule(
        lambda c: not trains_nsp(c) or c.model.type_vocab_size >= 2,
        lambda c: "NSP (data.nsp or data.warmup_nsp) needs model.type_vocab_size >= 2 (segment ids 0 and 1)",
    ),
    *each(
        lambda value: 0.0 < value < 1.0,
        "must be in (0, 1)",
        "data.mlm_probability",
        "data.warmup_seq_fraction",
    ),
    *each(
        lambda value: 0.0 <= value < 1.0,
        "must be 0 (the rate stays data.mlm_probability) or in (0, 1)",
        "data.final_mlm_probability",
    ),
    *each(
        lambda value: 0.0 <= value < 1.0,
        "must be 0 (every token equally likely to be masked) or in (0, 1), a token frequency such as 1e-4",
        "data.mask_subsampling",
    ),
    Rule(
        lambda c: not c.data.mask_subsampling or c.model.objective == "mlm",
        lambda c: (
            'data.mask_subsampling weighs what BERT masks; GPT-1 (model.objective = "clm") masks nothing: '
            "set it to 0"
        ),
    ),
    *fraction("data.short_seq_prob"),
    *not_negative("data.max_predictions_per_seq", "data.eval_max_pairs"),
]


def window_model_rules() -> list[Rule]:
    """What `train.embedding_init = "window_model"` needs of the model (`bertforge.window_init`)."""

    def applies(c: RunConfig) -> bool:
        return c.train.embedding_init == "window_model" and c.model.objective == "mlm"

    def head_dim(c: RunConfig) -> int:
        return c.model.hidden_size // c.model.num_attention_heads

    why = 'train.embedding_init = "window_model"'
    return [
        Rule(
            lambda c: not applies(c) or (c.model.num_attention_heads >= 2 and head_dim(c) % 2 == 0),
            lambda c: (
                f"{why} gives layer 1's heads one neighbour each and keeps the positions in one head's "
                f"dims: it needs at least 2 heads of an even size (model.num_attention_heads = "
                f'{c.model.num_attention_heads}, head size {head_dim(c)}); or set it to "cooccurrence"'
            ),
        ),
        Rule(
            lambda c: not applies(c) or c.data.max_seq_length <= head_dim(c),
            lambda c: (
                f"{why} starts the positions as sinusoids that repeat every head size ({head_dim(c)}) "
                f"positions: data.max_seq_length ({c.data.max_seq_length}) must be at most that; or "
                'set it to "cooccurrence"'
            ),
        ),
        Rule(
            lambda c: not applies(c) or c.model.hidden_act != "tanh",
            lambda _c: (
                f"{why} runs the MLM transform in its activation's linear range, which tanh has not: "
                'set model.hidden_act to "gelu", or embedding_init to "cooccurrence"'
            ),
        ),
    ]


TRAIN_RULES: list[Rule] = [
    *one_of_choices("train"),
    *positive(
        "train.batch_size",
        "train.gradient_accumulation_steps",
        "train.max_steps",
        "train.log_every",
        "train.eval_every",
        "train.keep_checkpoints",
    ),
    *fraction("train.warmup_ratio"),
    *each(lambda value: 0.0 < value <= 1.0, "must be in (0, 1]", "train.decay_ratio"),
    *positive_number("train.learning_rate", "train.adam_epsilon"),
    *not_negative(
        "train.weight_decay",
        "train.max_grad_norm",
        "train.max_minutes",
        "train.warmup_steps",
        "train.checkpoint_every",
    ),
    Rule(
        lambda c: c.train.batch_size % c.train.gradient_accumulation_steps == 0,
        lambda c: (
            f"train.batch_size ({c.train.batch_size}) must be divisible by "
            f"train.gradient_accumulation_steps ({c.train.gradient_accumulation_steps})"
        ),
    ),
    Rule(
        lambda c: c.train.embedding_init == "normal" or c.model.objective == "mlm",
        lambda c: (
            f'train.embedding_init = "{c.train.embedding_init}" starts BERT\'s tied MLM decoder; with '
            'model.objective = "clm" set it to "normal"'
        ),
    ),
    *window_model_rules(),
]

RUNTIME_RULES: list[Rule] = [
    *one_of_choices("runtime"),
    *not_negative("runtime.threads"),
    *each(lambda value: value >= -1, "must be -1 (auto) or more", "runtime.num_workers"),
    *positive_number("runtime.dist_timeout_minutes"),
]


def check_rules(config: RunConfig, rules: list[Rule]) -> None:
    """Raise `BertforgeError` with the problem of the first rule that does not hold."""
    for rule in rules:
        if not rule.holds(config):
            raise BertforgeError(rule.problem(config))


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
    if config.model.objective == "clm":
        from bertforge.gpt_convert import check_openai_gpt  # here: it imports this module

        check_openai_gpt(config.model)  # GPT-1's shapes, so that the model exports to OpenAIGPT
    check_rules(config, TOKENIZER_RULES + DATA_RULES + TRAIN_RULES + RUNTIME_RULES)


def max_predictions(data: DataConfig) -> int:
    """Cap on masked positions per sequence (Google uses 20 for 128 tokens at 15%)."""
    if data.max_predictions_per_seq:
        return data.max_predictions_per_seq
    return math.ceil(data.mlm_probability * data.max_seq_length)


def save_json(config: RunConfig, path: str | Path) -> None:
    write_json(Path(path), config.to_dict())


def load_json(path: str | Path) -> RunConfig:
    return RunConfig.from_dict(
        read_json(Path(path), missing="is this a bertforge run, checkpoint or model folder?")
    )
