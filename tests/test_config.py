"""Config: presets, TOML files, --set overrides, validation messages, JSON round trip."""

from __future__ import annotations

import re
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from bertforge.config import (
    PRESETS,
    RunConfig,
    apply_mapping,
    apply_objective,
    apply_overrides,
    apply_preset,
    load_json,
    load_toml,
    save_json,
    validate,
)
from bertforge.config_rules import RANGES, SEED, check_numbers, count
from bertforge.errors import BertforgeError


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_follow_turc_et_al(name):
    config = RunConfig()
    apply_preset(config, name)
    layers, hidden, heads = PRESETS[name]
    assert (config.model.num_hidden_layers, config.model.hidden_size, config.model.num_attention_heads) == (
        layers,
        hidden,
        heads,
    )
    assert config.model.intermediate_size == 4 * hidden
    validate(config)


def test_presets_set_their_learning_rate_and_a_config_file_still_wins(tmp_path):
    config = RunConfig()
    apply_preset(config, "tiny")
    assert config.train.learning_rate == 2e-3
    apply_preset(config, "base")
    assert config.train.learning_rate == 1e-4  # Devlin et al. 2019
    (tmp_path / "run.toml").write_text('preset = "mini"\n[train]\nlearning_rate = 3e-4\n')
    config = RunConfig()
    apply_mapping(config, load_toml(tmp_path / "run.toml"), origin="run.toml")
    assert config.model.hidden_size == 256 and config.train.learning_rate == 3e-4


def test_preset_table():
    assert (
        PRESETS["mini"] == (4, 256, 4) and PRESETS["base"] == (12, 768, 12) and PRESETS["tiny"] == (2, 128, 2)
    )


def test_toml_file_and_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('preset = "small"\n[train]\nlearning_rate = 3e-4\n[data]\nnsp = false\n')
    config = RunConfig()
    apply_mapping(config, load_toml(path), origin=str(path))
    apply_overrides(config, ["train.max_steps=77", "runtime.precision=bf16", "model.hidden_act=relu"])
    assert config.model.hidden_size == 512 and config.train.learning_rate == 3e-4
    assert config.data.nsp is False and config.train.max_steps == 77
    assert config.runtime.precision == "bf16" and config.model.hidden_act == "relu"


def test_json_round_trip(tmp_path):
    config = RunConfig()
    apply_overrides(config, ["train.batch_size=64", "tokenizer.kind=wordlevel"])
    save_json(config, tmp_path / "config.json")
    assert load_json(tmp_path / "config.json") == config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.hidden_size=100", "model.num_attention_heads=3"], "divisible"),
        (["data.max_seq_length=1024"], "max_position_embeddings"),
        (["data.mlm_probability=1.5"], "mlm_probability"),
        (["data.mlm_probability=0"], "mlm_probability"),
        (["train.learning_rate=-1"], "learning_rate"),
        (["train.batch_size=0"], "batch_size"),
        (["train.batch_size=10", "train.gradient_accumulation_steps=3"], "divisible"),
        (["runtime.precision=fp8"], "runtime.precision"),
        (["data.format=xml"], "data.format"),
        (["tokenizer.vocab_size=3"], "special tokens"),
        (["train.embedding_init=glove"], "train.embedding_init"),
        (
            ["model.objective=clm", "model.hidden_act=gelu_new", "train.embedding_init=cooccurrence"],
            "starts BERT's tied MLM decoder",
        ),
        (
            ["train.embedding_init=window_model", "model.hidden_size=256", "model.num_attention_heads=4"],
            r"data.max_seq_length \(128\) must be at most that",  # sinusoids of period 64
        ),
        (
            ["train.embedding_init=window_model", "model.num_attention_heads=1", "data.max_seq_length=64"],
            "at least 2 heads",
        ),
        (
            ["train.embedding_init=window_model", "model.hidden_act=tanh", "data.max_seq_length=64"],
            "which tanh has not",
        ),
        (["train.warmup_steps=20", "train.max_minutes=5"], r"give the warmup as train.warmup_ratio"),
        (["train.warmup_steps=1000", "train.max_steps=1000"], r"warmup_steps \(1000\) must be below"),
        (
            ["train.schedule=wsd", "train.warmup_ratio=0.9", "train.decay_ratio=0.2"],
            "overlap: together at most 1",
        ),
    ],
)
def test_impossible_values_are_named(overrides, message):
    config = RunConfig()
    apply_overrides(config, overrides)
    with pytest.raises(BertforgeError, match=message):
        validate(config)


def test_the_first_of_several_wrong_choices_is_named():
    config = RunConfig()
    apply_overrides(config, ["model.hidden_act=swish", "model.objective=gpt"])
    with pytest.raises(BertforgeError, match=r"^model.hidden_act = 'swish' is not one of: gelu, relu"):
        validate(config)


def test_what_openai_gpt_cannot_hold_is_refused_for_a_gpt_only():
    config = RunConfig()
    apply_overrides(config, ["model.intermediate_size=300", "model.hidden_act=gelu"])
    validate(config)  # BERT has any feed-forward width and the exact GELU
    apply_objective(config, "clm")
    assert config.model.hidden_act == "gelu_new"  # GPT-1's
    with pytest.raises(BertforgeError, match=r"model.intermediate_size \(300\) must be 4 x hidden_size"):
        validate(config)
    config.model.intermediate_size = 4 * config.model.hidden_size
    config.model.hidden_act = "tanh"
    with pytest.raises(BertforgeError, match="'tanh' has no OpenAIGPT equivalent"):
        validate(config)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.nope=1", "unknown setting train.nope"),
        ("bogus.key=1", "unknown section"),
        ("train.max_steps=many", "must be int"),
        ("data.nsp=1", r"must be true or false \(unquoted and lower case, as TOML writes them\), got 1"),
        (
            "data.nsp=False",
            r"must be true or false \(unquoted and lower case, as TOML writes them\), got 'False'",
        ),
        ("no_dot=1", "section.key=value"),
        ("data.warmup_seq_epochs=3", "data.warmup_seq_epochs is not a setting; use data.warmup_seq_fraction"),
    ],
)
def test_bad_overrides(override, message):
    with pytest.raises(BertforgeError, match=message):
        apply_overrides(RunConfig(), [override])


def test_a_saved_config_of_an_earlier_version_loads_without_its_retired_settings():
    saved = RunConfig().to_dict()
    saved["data"]["warmup_seq_epochs"] = 3  # what runs saved before data.warmup_seq_fraction
    saved["data"]["warmup_seq_length"] = 32
    config = RunConfig.from_dict(saved)
    assert config.data.warmup_seq_length == 32
    assert config.data.warmup_seq_fraction == RunConfig().data.warmup_seq_fraction


def test_a_saved_config_without_a_setting_reads_as_its_run_trained():
    saved = RunConfig().to_dict()
    assert saved["data"].pop("cross_documents") is True  # a new run's windows cross documents
    assert RunConfig.from_dict(saved).data.cross_documents is False  # an older run's did not
    assert RunConfig.from_dict({"model": {"hidden_size": 256}}).data.cross_documents is True  # no data saved


def test_missing_and_invalid_toml(tmp_path):
    with pytest.raises(BertforgeError, match="does not exist"):
        load_toml(tmp_path / "none.toml")
    with pytest.raises(BertforgeError, match="is a folder; give a TOML file"):
        load_toml(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nx=")
    with pytest.raises(BertforgeError, match="not valid TOML"):
        load_toml(bad)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(BertforgeError, match=r"binary.toml is not UTF-8 text; give a TOML file$"):
        load_toml(binary)
    with pytest.raises(BertforgeError, match="unknown preset"):
        apply_preset(RunConfig(), "huge")
    huge = tmp_path / "huge.toml"
    huge.write_text('preset = "huge"\n')
    with pytest.raises(BertforgeError, match=r"huge.toml: unknown preset 'huge'"):
        apply_mapping(RunConfig(), load_toml(huge), origin=str(huge))
    marked = tmp_path / "marked.toml"  # a byte-order mark, as some Windows editors write
    marked.write_text("[train]\nbatch_size = 8\n", encoding="utf-8-sig")
    assert load_toml(marked) == {"train": {"batch_size": 8}}


def test_a_gpt_set_in_a_file_or_with_set_takes_gpt_1s_defaults_as_the_flag_gives_them(tmp_path):
    from bertforge.cli import build_parser
    from bertforge.commands.pretraining import pretrain_config

    def config_of(*flags: str) -> RunConfig:
        return pretrain_config(build_parser().parse_args(["pretrain", "--out", str(tmp_path / "r"), *flags]))

    gpt_file = tmp_path / "gpt.toml"
    gpt_file.write_text('[model]\nobjective = "clm"\n')
    flag = config_of("--objective", "clm")
    assert (flag.model.hidden_act, flag.model.layer_norm_eps) == ("gelu_new", 1e-5)
    assert config_of("--set", "model.objective=clm") == flag
    assert config_of("--set", 'model.objective="clm"') == flag
    assert config_of("--config", str(gpt_file)) == flag
    chosen = config_of("--config", str(gpt_file), "--set", "model.layer_norm_eps=1e-6")
    assert chosen.model.layer_norm_eps == 1e-6 and chosen.model.hidden_act == "gelu_new"
    with pytest.raises(BertforgeError, match="gelu_new"):  # an activation given is kept, and refused
        config_of("--set", "model.objective=clm", "--set", "model.hidden_act=gelu")


def test_a_saved_config_names_its_file_in_errors(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"train": {"batch_size": "x"}}')
    with pytest.raises(BertforgeError, match=re.escape(f"{path}: train.batch_size must be int")):
        load_json(path)


# configs/glue.toml holds `bertforge glue`'s fine-tuning recipes, not a run's settings (test_glue reads it).
RUN_CONFIGS = sorted(p for p in Path(__file__).parent.parent.glob("configs/*.toml") if p.name != "glue.toml")


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_is_valid(path):
    config = RunConfig()
    apply_mapping(config, load_toml(path), origin=str(path))
    validate(config)


def numeric_settings() -> list[str]:
    """`section.key` of every int or float setting of every config section."""
    config = RunConfig()
    return [
        f"{section.name}.{key}"
        for section in fields(config)
        for key, hint in typing.get_type_hints(type(getattr(config, section.name))).items()
        if hint in (int, float)
    ]


def test_every_numeric_setting_has_a_range():
    assert sorted(RANGES) == sorted(numeric_settings())


# -2: -1 means "auto" for runtime.num_workers; TOML reads 1e400 as infinity
ABSURD = ["-2", "-1e30", "nan", "inf", "-inf", "1e30", "99999999999999999999", "-99999999999999999999"]


@pytest.mark.parametrize("name", numeric_settings())
def test_an_absurd_number_for_any_setting_is_one_error_naming_it(name):
    for text in ABSURD:
        config = RunConfig()
        with pytest.raises(BertforgeError, match=re.escape(name)):
            apply_overrides(config, [f"{name}={text}"])
            validate(config)


@pytest.mark.parametrize(
    "name, allowed, refused",
    [
        ("runtime.seed", ["0", "4294967295"], ["-1", "4294967296"]),  # NumPy's seeds are 32-bit
        ("train.adam_beta1", ["0.0", "0.999"], ["1.0", "-0.5"]),
        ("train.adam_beta2", ["0.0", "0.999"], ["1.0", "-0.5"]),
        ("train.adam_epsilon", ["1e-12"], ["0.0"]),
        ("runtime.num_workers", ["-1", "0", "8"], ["-2", "100000"]),
        ("train.max_grad_norm", ["0.0", "5.0"], ["-1.0", "inf"]),
    ],
)
def test_the_ends_of_a_range(name, allowed, refused):
    for text in allowed:
        config = RunConfig()
        apply_overrides(config, [f"{name}={text}"])
        validate(config)
    for text in refused:
        config = RunConfig()
        apply_overrides(config, [f"{name}={text}"])
        with pytest.raises(BertforgeError, match=rf"^{re.escape(name)} must be .*, got"):
            validate(config)


def test_check_numbers_names_the_first_number_out_of_range():
    ranges = {"--batch-size": count(), "--seeds": SEED}
    check_numbers({"--batch-size": 8, "--seeds": [1, 2], "--other": -5}, ranges)
    check_numbers({"--batch-size": None}, ranges)  # a flag not given
    with pytest.raises(BertforgeError, match=r"^--batch-size must be positive, got 0$"):
        check_numbers({"--batch-size": 0}, ranges)
    with pytest.raises(BertforgeError, match=r"^--seeds must be from 0 to 4,294,967,295 .*, got 4294967296$"):
        check_numbers({"--seeds": [1, 2**32]}, ranges)
    with pytest.raises(BertforgeError, match=r"^--batch-size must be at most 2,147,483,647"):
        check_numbers({"--batch-size": 10**20}, ranges)
