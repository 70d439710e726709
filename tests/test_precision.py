"""`runtime.precision = "auto"`: the choice from stubbed timings, its cache, overrides, what a run records."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_config

from bertforge import precision
from bertforge.config import ModelConfig, RunConfig
from bertforge.precision import choose_precision, cpu_choice, resolve_precision

CPU = torch.device("cpu")


@pytest.fixture
def stub_speedup(monkeypatch):
    """Replace the timing probe by a fixed speedup; count how often it is asked."""
    calls = []

    def install(speedup: float):
        monkeypatch.setattr(precision, "measure_bf16_speedup", lambda model: calls.append(model) or speedup)
        return calls

    return install


@pytest.mark.parametrize(
    ("speedup", "expected"), [(2.4, "bf16"), (1.15, "bf16"), (1.1, "fp32"), (1.0, "fp32"), (0.6, "fp32")]
)
def test_bf16_only_when_clearly_faster(speedup, expected):
    choice = cpu_choice(speedup)
    assert choice.precision == expected
    assert f"{speedup:.2f}x" in choice.describe()


def test_choice_is_measured_once_then_cached(tmp_path, stub_speedup):
    calls = stub_speedup(0.55)  # an Intel Xeon without AMX: bf16 matmuls at about half the fp32 rate
    first = choose_precision(ModelConfig(), CPU, tmp_path)
    second = choose_precision(ModelConfig(), CPU, tmp_path)
    assert (first.precision, first.cached) == ("fp32", False)
    assert (second.precision, second.cached) == ("fp32", True)
    assert len(calls) == 1
    cached = json.loads((tmp_path / precision.CACHE_FILE).read_text())
    assert [entry["speedup"] for entry in cached.values()] == [0.55]


def test_other_shapes_are_measured_again(tmp_path, stub_speedup):
    calls = stub_speedup(2.0)
    choose_precision(ModelConfig(hidden_size=256, intermediate_size=1024), CPU, tmp_path)
    choose_precision(ModelConfig(hidden_size=768, intermediate_size=3072), CPU, tmp_path)
    assert len(calls) == 2


def test_damaged_cache_is_measured_again(tmp_path, stub_speedup):
    calls = stub_speedup(2.0)
    (tmp_path / precision.CACHE_FILE).write_text("{not json")
    assert choose_precision(ModelConfig(), CPU, tmp_path).precision == "bf16"
    assert len(calls) == 1
    assert json.loads((tmp_path / precision.CACHE_FILE).read_text())  # rewritten whole


def test_explicit_precision_wins(tmp_path, stub_speedup):
    calls = stub_speedup(3.0)
    config = RunConfig()
    config.runtime.precision = "fp32"
    assert resolve_precision(config, CPU, tmp_path) is None
    assert config.runtime.precision == "fp32" and not calls


def test_auto_is_replaced_by_the_choice(tmp_path, stub_speedup):
    stub_speedup(3.0)
    config = RunConfig()
    assert config.runtime.precision == "auto"  # the default
    choice = resolve_precision(config, CPU, tmp_path)
    assert choice.precision == config.runtime.precision == "bf16"


def test_cuda_without_native_bf16_gets_fp16(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    choice = choose_precision(ModelConfig(), torch.device("cuda"), tmp_path)
    assert choice.precision == "fp16" and "T4" in choice.reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert choose_precision(ModelConfig(), torch.device("cuda"), tmp_path).precision == "bf16"


def test_real_probe_gives_a_finite_ratio():
    speedup = precision.measure_bf16_speedup(ModelConfig(hidden_size=64, intermediate_size=256))
    assert 0.0 < speedup < float("inf")


def test_the_probe_takes_each_precisions_fastest_pass_on_one_thread(monkeypatch):
    """On a busy machine most passes are slowed; the least disturbed pass of each precision gives the
    ratio (the median of the per-round ratios here would be 1.0), and the caller's threads come back."""
    passes = iter([30.0, 30.0] + [10.0, 2.0] + [30.0, 30.0] * (precision.PROBE_ROUNDS - 1))
    threads = []

    def time_pass(operands):
        threads.append(torch.get_num_threads())
        return next(passes)

    monkeypatch.setattr(precision, "time_pass", time_pass)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert precision.measure_bf16_speedup(ModelConfig(hidden_size=64, intermediate_size=256)) == 5.0
        assert set(threads) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def counted_passes(monkeypatch, times: list[float]) -> list[float]:
    """`time_pass` stubbed to return `times` in turn; the passes it gave, warm-ups included."""
    given = []

    def time_pass(operands):
        given.append(times[len(given)])
        return given[-1]

    monkeypatch.setattr(precision, "time_pass", time_pass)
    return given


def test_a_first_round_with_bf16_far_slower_ends_the_probe(monkeypatch):
    """A CPU without bf16 units: more rounds could not lift 0.1x past the threshold of 1.15x."""
    given = counted_passes(monkeypatch, [1.0, 10.0] + [1.0, 10.0] * precision.PROBE_ROUNDS)
    assert precision.measure_bf16_speedup(ModelConfig(hidden_size=64, intermediate_size=256)) == 0.1
    assert len(given) == 4  # the warm-up pass of each, then one round


def test_long_passes_end_the_probe_after_three_rounds(monkeypatch):
    given = counted_passes(monkeypatch, [1.0, 1.0] * (precision.PROBE_ROUNDS + 1))
    clock = iter(range(0, 1000, 10))  # 10 s between readings: the budget is spent at once
    monkeypatch.setattr(precision.time, "perf_counter", lambda: float(next(clock)))
    precision.measure_bf16_speedup(ModelConfig(hidden_size=64, intermediate_size=256))
    assert len(given) == 2 + 2 * 3


def test_run_records_the_precision_it_used(tmp_path, wiki_slice, small_tokenizer_dir, stub_speedup, capsys):
    from bertforge.pretrain import pretrain

    stub_speedup(0.5)
    config = tiny_config(wiki_slice, max_steps=2, eval_every=2)
    config.runtime.precision = "auto"
    cache = tmp_path / "cache"  # not the session's cache, where an earlier test may have left a measurement
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, cache_dir=cache, show_progress=True)
    assert "precision: fp32 (auto: bf16 matmuls 0.50x" in capsys.readouterr().out
    for saved in ("config.json", "final/config.json"):
        assert json.loads((tmp_path / "run" / saved).read_text())["runtime"]["precision"] == "fp32"
