"""The validation of a run's settings: the range of every numeric setting (`RANGES`) and a table of
rules per config section, each rule a requirement and the message that tells the user which setting
to change and how. The same ranges check the numbers of a command's flags that no run config holds
(`check_flags`): every number a user gives is refused, out of range, with one line that names it.

The rules read a `bertforge.config.RunConfig` (passed in; this module is below it and imports no
settings), so `bertforge.config.validate` checks them all. Also here: the facts about a config that
the rules and the workflows share (`trains_nsp`), GPT-1's activation, and what a GPT
(`model.objective = "clm"`) needs so that it exports to Hugging Face's OpenAIGPT.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from bertforge.errors import BertforgeError

# Every check of the user's settings lives here, as a table of rules per section; code inside the
# library trusts a validated config and states what it relies on with `assert` (`bertforge.errors`).

MAX_POSITIONS = 1 << 16  # BERT uses 512; attention's cost grows with the square of the length
MAX_PARAMETERS = 10**10  # BERT-large has 3.4e8; beyond this a typo is likelier than a plan
MAX_COUNT = 2**31 - 1  # the largest C int: torch, NumPy and the tokenizers take counts and sizes as such
MAX_SEED = 2**32 - 1  # NumPy's seeds are 32-bit
MAX_THREADS = 1024  # threads and data workers: more than any machine's cores
MAX_MINUTES = 525_600.0  # a year
MAX_GRAD_NORM = 1e6  # gradient norms are in the units to hundreds; a larger bound clips nothing


@dataclass(frozen=True)
class Rule:
    """A requirement on the settings: when `holds(config)` is false, `problem(config)` tells the user."""

    holds: Callable[[Any], bool]  # of a RunConfig
    problem: Callable[[Any], str]


def setting_value(config, name: str):
    """The value of the setting `section.key`."""
    section, key = name.split(".")
    return getattr(getattr(config, section), key)


@dataclass(frozen=True)
class Range:
    """The values a number may take: finite, from `low` to `high`, each bound included unless
    `low_open` / `high_open`. `says`, when given, is the whole requirement ("must be ...") that a
    value out of range is told, for ranges whose ends mean something (-1: auto)."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    says: str = ""

    def holds(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def requirement(self, value) -> str:
        """What a `value` out of range breaks: "must be ..."."""
        if self.says:
            return self.says
        if not (isinstance(self.low, int) and isinstance(self.high, int)):
            opening, closing = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"must be in {opening}{self.low:g}, {self.high:g}{closing}"
        if isinstance(value, int | float) and value > self.high:  # a count or size from here
            return f"must be at most {self.high:,}"
        below = {1: "must be positive", 0: "must not be negative"}
        return below.get(self.low, f"must be at least {self.low}")


def count(low: int = 1, high: int = MAX_COUNT) -> Range:
    """A count or size: an integer from `low` (1: positive, 0: not negative) to `high`."""
    return Range(low, high)


FRACTION = Range(0.0, 1.0, high_open=True)  # [0, 1): probabilities of dropout, a share of the run
SEED = Range(0, MAX_SEED, says=f"must be from 0 to {MAX_SEED:,} (2**32 - 1, NumPy's largest seed)")
# Sampling's temperature: above 100 the next token is drawn nearly uniformly, whatever the model says
TEMPERATURE = Range(0.0, 100.0, low_open=True)


def number_problem(name: str, value, allowed: Range) -> str | None:
    """The one line that tells the user `value` of `name` (a setting or a flag) is out of range; None
    when it is not."""
    return None if allowed.holds(value) else f"{name} {allowed.requirement(value)}, got {value}"


def in_ranges(ranges: dict[str, Range]) -> list[Rule]:
    """A rule per setting of `ranges`: its value lies in its range."""
    return [
        Rule(
            lambda c, name=name, allowed=allowed: allowed.holds(setting_value(c, name)),
            lambda c, name=name, allowed=allowed: number_problem(name, setting_value(c, name), allowed),
        )
        for name, allowed in ranges.items()
    ]


def check_numbers(values: dict[str, Any], ranges: dict[str, Range]) -> None:
    """Refuse, with one line naming it, the first number of `values` (by name, `None` for one not
    given, a list for several) outside its range in `ranges`."""
    for name, allowed in ranges.items():
        given = values.get(name)
        for value in given if isinstance(given, list) else [given]:
            if value is not None and (problem := number_problem(name, value, allowed)):
                raise BertforgeError(problem)


def check_flags(args, ranges: dict[str, Range]) -> None:
    """Refuse the first of a command's number flags (`ranges` by flag: "--batch-size", read from
    `args.batch_size`) outside its range, with one line naming the flag: for the numbers that reach
    the library without a run config's validation."""
    check_numbers({flag: getattr(args, flag.lstrip("-").replace("-", "_"), None) for flag in ranges}, ranges)


def choices(section) -> dict[str, tuple[str, ...]]:
    """The settings of a config section (a dataclass) that take one of a list of values (a `Literal`
    type), each with its list."""
    hints = typing.get_type_hints(type(section))
    return {key: get_args(hint) for key, hint in hints.items() if typing.get_origin(hint) is Literal}


def one_of_choices(section: str) -> list[Rule]:
    """Every setting of `section` with a list of values has one of them (the first that has not is named)."""

    def wrong(c) -> list[tuple[str, Any, tuple[str, ...]]]:
        values = getattr(c, section)
        return [
            (f"{section}.{key}", getattr(values, key), allowed)
            for key, allowed in choices(values).items()
            if getattr(values, key) not in allowed
        ]

    def problem(c) -> str:
        name, value, allowed = wrong(c)[0]
        return f"{name} = {value!r} is not one of: {', '.join(allowed)}"

    return [Rule(lambda c: not wrong(c), problem)]


def parameter_count(m) -> int:
    """Weights of the encoder and heads, roughly: embeddings, then per layer attention and feed-forward."""
    hidden, inner = m.hidden_size, m.intermediate_size
    embeddings = (m.vocab_size + m.max_position_embeddings + m.type_vocab_size) * hidden
    return embeddings + m.num_hidden_layers * (4 * hidden * hidden + 2 * hidden * inner)


def trains_nsp(config) -> bool:
    """Whether the run trains on sentence pairs with NSP (all along, or in its sequence-length warmup):
    a GPT trains on packed text, never on pairs."""
    return (config.data.nsp or config.data.warmup_nsp) and config.model.objective == "mlm"


def sequence_layout(config) -> str:
    """The shortest sequence a run trains on, spelled out."""
    if config.model.objective == "clm":
        return "a window of text whose tokens predict the next ones"
    return "[CLS] A [SEP] B [SEP]" if trains_nsp(config) else "[CLS] A [SEP]"


def shortest_sequence(config) -> int:
    """[CLS] a [SEP] b [SEP] (with NSP) or [CLS] a [SEP], with room for one token in each part."""
    return 5 if trains_nsp(config) else 3


# The range of every numeric setting, per section (tests/test_config.py checks that none is left out);
# the rules below add what ties settings together.
MODEL_RANGES: dict[str, Range] = {
    "model.vocab_size": count(),
    "model.hidden_size": count(),
    "model.num_hidden_layers": count(),
    "model.num_attention_heads": count(),
    "model.intermediate_size": count(),
    "model.max_position_embeddings": count(),
    "model.type_vocab_size": count(),
    "model.hidden_dropout_prob": FRACTION,
    "model.attention_probs_dropout_prob": FRACTION,
    "model.layer_norm_eps": Range(0.0, 1.0, low_open=True),
    "model.initializer_range": Range(0.0, 1.0, low_open=True),
    "model.pad_token_id": count(0),
}

TOKENIZER_RANGES: dict[str, Range] = {
    "tokenizer.vocab_size": count(),
    "tokenizer.min_frequency": count(),
}

DATA_RANGES: dict[str, Range] = {
    "data.max_seq_length": count(),
    "data.warmup_seq_length": count(0),
    "data.warmup_seq_fraction": Range(0.0, 1.0, low_open=True, high_open=True),
    "data.short_seq_prob": FRACTION,
    "data.mlm_probability": Range(0.0, 1.0, low_open=True, high_open=True),
    "data.final_mlm_probability": Range(
        0.0, 1.0, high_open=True, says="must be 0 (the rate stays data.mlm_probability) or in (0, 1)"
    ),
    "data.max_predictions_per_seq": count(0),
    "data.mask_subsampling": Range(
        0.0,
        1.0,
        high_open=True,
        says="must be 0 (every token equally likely to be masked) or in (0, 1), a token frequency such as "
        "1e-4",
    ),
    "data.eval_max_pairs": count(0),
}

TRAIN_RANGES: dict[str, Range] = {
    "train.batch_size": count(),
    "train.gradient_accumulation_steps": count(),
    "train.learning_rate": Range(0.0, 1.0, low_open=True),
    "train.layer_decay": Range(0.0, 1.0, low_open=True),
    "train.weight_decay": Range(0.0, 1.0),
    "train.adam_beta1": FRACTION,
    "train.adam_beta2": FRACTION,
    "train.adam_epsilon": Range(0.0, 1.0, low_open=True),
    "train.warmup_steps": count(0),
    "train.warmup_ratio": FRACTION,
    "train.decay_ratio": Range(0.0, 1.0, low_open=True),
    "train.max_grad_norm": Range(
        0.0, MAX_GRAD_NORM, says=f"must be 0 (no clipping) or a positive number up to {MAX_GRAD_NORM:g}"
    ),
    "train.max_steps": count(),
    "train.max_minutes": Range(
        0.0, MAX_MINUTES, says=f"must be 0 (no time budget) or minutes up to {MAX_MINUTES:,.0f} (a year)"
    ),
    "train.log_every": count(),
    "train.eval_every": count(),
    "train.checkpoint_every": count(0),
    "train.keep_checkpoints": count(),
}

RUNTIME_RANGES: dict[str, Range] = {
    "runtime.seed": SEED,
    "runtime.num_workers": Range(-1, MAX_THREADS, says=f"must be -1 (auto) or from 0 to {MAX_THREADS:,}"),
    "runtime.threads": count(0, MAX_THREADS),
    "runtime.dist_timeout_minutes": Range(
        0.0, MAX_MINUTES, low_open=True, says=f"must be a positive number of minutes up to {MAX_MINUTES:,.0f}"
    ),
}

RANGES: dict[str, Range] = MODEL_RANGES | TOKENIZER_RANGES | DATA_RANGES | TRAIN_RANGES | RUNTIME_RANGES


MODEL_RULES: list[Rule] = [
    *in_ranges(MODEL_RANGES),
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
    Rule(
        lambda c: c.model.pad_token_id < c.model.vocab_size,
        lambda c: f"model.pad_token_id ({c.model.pad_token_id}) must be a token id below vocab_size",
    ),
    *one_of_choices("model"),
]

GPT_HIDDEN_ACT = "gelu_new"  # GPT-1's GELU (the tanh approximation), which model.objective = "clm" takes
GPT_LAYER_NORM_EPS = 1e-5  # GPT-1's (OpenAIGPTConfig's layer_norm_epsilon); BERT's is 1e-12
# The activations Hugging Face's OpenAIGPT has (its "gelu" is the tanh form, bertforge's "gelu_new")
OPENAI_GPT_ACTS: tuple[str, ...] = (GPT_HIDDEN_ACT, "relu", "silu")

# What OpenAIGPT fixes that the model settings leave free: a GPT that differs could not be exported.
OPENAI_GPT_RULES: list[Rule] = [
    Rule(
        lambda c: c.model.hidden_act in OPENAI_GPT_ACTS,
        lambda c: (
            f"model.hidden_act = {c.model.hidden_act!r} has no OpenAIGPT equivalent; GPT-1 uses "
            f"{GPT_HIDDEN_ACT!r} (the tanh GELU), and OpenAIGPT also takes: {', '.join(OPENAI_GPT_ACTS)}"
        ),
    ),
    Rule(
        lambda c: c.model.intermediate_size == 4 * c.model.hidden_size,
        lambda c: (
            f"model.intermediate_size ({c.model.intermediate_size}) must be 4 x hidden_size "
            f"({4 * c.model.hidden_size}) for OpenAIGPT, whose feed-forward width is fixed: set "
            f"model.intermediate_size={4 * c.model.hidden_size}"
        ),
    ),
]


def only_when(applies: Callable[[Any], bool], rules: list[Rule]) -> list[Rule]:
    """The rules, holding of every config for which `applies` is false."""
    return [Rule(lambda c, rule=rule: not applies(c) or rule.holds(c), rule.problem) for rule in rules]


# A GPT's shapes are checked with its settings, so that the trained model exports.
GPT_RULES: list[Rule] = only_when(lambda c: c.model.objective == "clm", OPENAI_GPT_RULES)


TOKENIZER_RULES: list[Rule] = [
    *one_of_choices("tokenizer"),
    *in_ranges(TOKENIZER_RANGES),
    Rule(
        lambda c: c.tokenizer.vocab_size > 5,
        lambda c: f"tokenizer.vocab_size ({c.tokenizer.vocab_size}) must exceed the 5 special tokens",
    ),
]

DATA_RULES: list[Rule] = [
    *one_of_choices("data"),
    *in_ranges(DATA_RANGES),
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
            f"({sequence_layout(c)}), got {c.data.max_seq_length}"
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
    Rule(
        lambda c: not c.data.mask_subsampling or c.model.objective == "mlm",
        lambda c: (
            'data.mask_subsampling weighs what BERT masks; GPT-1 (model.objective = "clm") masks nothing: '
            "set it to 0"
        ),
    ),
]


def window_model_rules() -> list[Rule]:
    """What `train.embedding_init = "window_model"` needs of the model (`bertforge.window_init`)."""

    def applies(c) -> bool:
        return c.train.embedding_init == "window_model" and c.model.objective == "mlm"

    def head_dim(c) -> int:
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
    *in_ranges(TRAIN_RANGES),
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
    Rule(
        lambda c: not c.train.activation_checkpointing or c.model.objective == "mlm",
        lambda c: (
            'train.activation_checkpointing recomputes BERT\'s layers; GPT-1 (model.objective = "clm") '
            "keeps its activations: set it to false"
        ),
    ),
    Rule(
        lambda c: not c.train.warmup_steps or not c.train.max_minutes,
        lambda c: (
            f"train.warmup_steps ({c.train.warmup_steps}) counts steps, but train.max_minutes ends the run "
            "at a step no one knows ahead; give the warmup as train.warmup_ratio, a share of the run"
        ),
    ),
    Rule(
        lambda c: c.train.warmup_steps < c.train.max_steps,
        lambda c: (
            f"train.warmup_steps ({c.train.warmup_steps}) must be below train.max_steps "
            f"({c.train.max_steps}), or the rate never comes down from its warmup"
        ),
    ),
    Rule(
        lambda c: c.train.schedule != "wsd" or warmup_share(c.train) + c.train.decay_ratio <= 1,
        lambda c: (
            f"the wsd schedule's warmup ({warmup_share(c.train):g} of the run) and decay "
            f"(train.decay_ratio = {c.train.decay_ratio:g}) overlap: together at most 1"
        ),
    ),
    *window_model_rules(),
]


def warmup_share(train) -> float:
    """The share of the run's progress spent warming up (`optimizer.Schedule`)."""
    return train.warmup_steps / train.max_steps if train.warmup_steps else train.warmup_ratio


RUNTIME_RULES: list[Rule] = [
    *one_of_choices("runtime"),
    *in_ranges(RUNTIME_RANGES),
]


def check_rules(config, rules: list[Rule]) -> None:
    """Raise `BertforgeError` with the problem of the first rule that does not hold."""
    for rule in rules:
        if not rule.holds(config):
            raise BertforgeError(rule.problem(config))
