"""The benchmark suite runs end to end: `python -m benchmarks.run --quick` (a tiny model on slices of
WikiText-2) measures all four of its parts against `transformers` and writes its JSON. This keeps
`make bench` from drifting behind the code it measures; the figures themselves are not checked."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_quick_benchmark_suite_measures_every_part(tmp_path):
    """The four default parts, then GLUE (both arms of each task), NER (a tagger) and inference, in one
    process: each start costs seconds."""
    out = tmp_path / "latest.json"
    command = [sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(out), "--dropout", "0"]
    command += [f"--only={part}" for part in ("prep", "step", "e2e", "quality", "glue", "ner", "infer")]
    command += ["--cache-dir", str(tmp_path / "cache"), "--threads", "1"]
    command += ["--batch-size", "2", "--seq-len", "64"]
    command += ["--precisions", "fp32"]  # the device check's smoke mode runs the bf16 step and pretraining
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text(encoding="utf-8"))
    assert [row["precision"] for row in results["step"]] == ["fp32"]
    assert {(row["batch"], row["seq_len"]) for row in results["step"]} == {(2, 64)}
    for row in results["step"]:
        assert row["bertforge_tokens_per_s"] > 0 and row["hf_tokens_per_s"] > 0
        assert row["dropout"] == 0.0  # --dropout sets both models'
    assert "dropout 0" in done.stdout
    for row in results["e2e"]:
        assert row["e2e_real_tokens_per_s"] > 0 and 0.0 <= row["padding_fraction"] < 1.0
    assert results["prep"]["x10"]["tokens"] > results["prep"]["single"]["tokens"] > 0
    for model in ("bertforge", "hf"):
        assert results["quality"][model]["steps"] > 0
        assert 0.0 <= results["quality"][model]["mlm_accuracy"] <= 1.0
    glue, ner = results["glue"], results["ner"]
    assert glue["tasks"] == ["SST-2", "STS-B"] and glue["seeds"] == [1, 2]
    assert [(row["task"], row["arm"]) for row in glue["per_task"]] == [
        (task, arm) for task in ("SST-2", "STS-B") for arm in ("pretrained", "scratch")
    ]
    assert all(row["runs"] == 2 and row["minutes"] > 0 for row in glue["per_task"])
    assert glue["wall_minutes"] > glue["fine_tuning_minutes"] > 0
    assert glue["fine_tuning_minutes"] == pytest.approx(sum(row["minutes"] for row in glue["per_task"]))
    assert glue["target_minutes"] == 60 and glue["target_met"] is None  # --quick is not the target's workload
    assert set(glue["average"]) == {"pretrained", "scratch"}
    figures = {row["task"]: set(row["figures"]) for row in glue["per_task"]}
    assert figures == {"SST-2": {"acc"}, "STS-B": {"pearson", "spearman"}}
    chance = {row["task"]: row["at_chance"] for row in glue["per_task"]}
    assert chance["STS-B"] is None and isinstance(chance["SST-2"], bool)  # a regression has no majority
    for pretrained, scratch in zip(glue["per_task"][::2], glue["per_task"][1::2], strict=True):
        assert scratch["comparison"] is None
        pairs = pretrained["comparison"]["pairs"]  # the same seeds' scores as the rows' medians
        assert statistics.median(pair["pretrained"] for pair in pairs) == pytest.approx(pretrained["score"])
        assert statistics.median(pair["scratch"] for pair in pairs) == pytest.approx(scratch["score"])
    assert "(5) glue" in done.stdout and "target <= 60 min" in done.stdout and "p boot" in done.stdout
    assert "majority class" in done.stdout
    assert ner["epochs"] == 1 and ner["steps"] == 16  # 500 sentences in batches of 32
    assert ner["wall_minutes"] > ner["fine_tuning_minutes"] > 0
    assert ner["target_minutes"] == 10 and ner["target_met"] is None  # as GLUE's
    assert 0.0 <= ner["dev_f1"] <= 1.0
    assert "(6) ner" in done.stdout and "target <= 10 min" in done.stdout
    assert [row["workload"] for row in results["infer"]] == ["SST-2 dev sentences", "RTE dev pairs"]
    for row in results["infer"]:
        assert row["texts"] == 64 and row["batch"] == 64 and row["max_length"] == 128
        contenders = ("bertforge", "bertforge_input_order", "hf", "hf_model")
        assert min(row[f"{who}_texts_per_s"] for who in contenders) > 0
        assert min(row[key] for key in ("speedup", "speedup_over_model", "speedup_over_input_order")) > 0
        # one model read alike by all four (about 3e-7 here; a word more or less moves a text's 1e-4)
        assert row["largest_probability_difference"] < 1e-5
    assert "(7) inference" in done.stdout and "HF pipeline texts/s" in done.stdout


@pytest.mark.slow
def test_the_glue_benchmark_without_a_model_is_refused_before_it_starts(tmp_path):
    out = tmp_path / "glue.json"
    command = [sys.executable, "-m", "benchmarks.run", "--only", "glue", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--glue-model" in done.stderr and "mini-30min" in done.stderr
    assert not out.exists()


@pytest.mark.slow
def test_the_device_check_runs_on_cpu_in_its_smoke_mode(tmp_path):
    """`make gpu-check`'s script, as a GPU machine runs it (`PYTHONPATH=src`), on tiny shapes: every
    part runs and the summary comes first among at most 8 files."""
    import torch

    out, env = tmp_path / "out", dict(os.environ, PYTHONPATH="src")
    how = dict(cwd=REPO, capture_output=True, text=True, env=env)
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--out", str(out)]
    done = subprocess.run([*command, "--smoke"], timeout=600, **how)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert summary.startswith("# bertforge device check") and len(summary.splitlines()) <= 40
    assert summary.strip() in done.stdout  # printed too
    files = {path.name for path in out.iterdir()}
    assert {"summary.md", "results.json", "tests.log", "pretrain-eager.log", "metrics-eager.jsonl"} <= files
    assert len(files) <= 8
    parts = json.loads((out / "results.json").read_text(encoding="utf-8"))["parts"]
    assert parts["tests"]["counts"]["collected"] > 20  # both GPU test files, collected
    rows = parts["step"]["rows"]
    assert [(row["seq_len"], row["batch"]) for row in rows] == [(32, 4), (64, 2)]
    assert all(row["speedup"] > 0 and row["bertforge_attention"] and row["hf_attention"] for row in rows)
    run = parts["pretrain"]["runs"]["eager"]
    assert run["steady_tokens_per_s"] > 0 and run["epochs"] > 0 and 0 <= run["padding"] < 1
    if not torch.cuda.is_available():  # without --smoke it needs a GPU
        refused = subprocess.run(command, timeout=120, **how)
        assert refused.returncode == 2 and "--smoke" in refused.stderr


@pytest.mark.slow
def test_the_padding_benchmark_times_every_attention_path_on_the_same_batch(tmp_path):
    """`benchmarks.padding --smoke` on a CPU: one row per path, the padded batch about as padded as
    asked, the full-length batch without padding."""
    from benchmarks.padding import PATHS
    from benchmarks.step import full_length_batch

    batch = full_length_batch(1000, 64, 128, seed=0, padding=0.25)
    share = 1 - batch["attention_mask"].float().mean().item()
    assert 0.2 < share < 0.3 and batch["attention_mask"][0].all()
    assert "attention_mask" not in full_length_batch(1000, 4, 32)
    env = dict(os.environ, PYTHONPATH="src")
    command = [sys.executable, "-m", "benchmarks.padding", "--out", str(tmp_path), "--smoke"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "padding.json").read_text(encoding="utf-8"))["rows"]
    assert [row["path"] for row in rows] == list(PATHS)
    assert all(row["tokens_per_s"] > 0 and len(row["seconds_per_step"]) == 2 for row in rows)
    padded = {row["path"]: row["padding"] for row in rows}
    assert padded["no padding"] == 0 and padded["varlen"] == padded["key mask"] > 0.1
    assert (tmp_path / "padding.md").read_text(encoding="utf-8").startswith("# Attention for a padded batch")


def test_attention_kernels_are_told_apart_by_their_names():
    from benchmarks.common import kernel_kinds

    cudnn = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1"
    assert kernel_kinds({cudnn, "aten::_scaled_dot_product_cudnn_attention"}) == "cuDNN"
    assert kernel_kinds({"aten::_scaled_dot_product_flash_attention", "flash_fwd_kernel"}) == "flash"
    assert kernel_kinds({"fmha_cutlassf_f16_aligned_64x64_rf_sm80"}) == "memory-efficient"
    assert kernel_kinds({"flash_fwd_kernel", cudnn}) == "flash + cuDNN"
    assert kernel_kinds({"aten::mm", "aten::softmax"}) == "other"


def test_the_quality_benchmark_never_trains_in_fp16():
    import torch

    from benchmarks.quality import fastest

    rows = [
        {"preset": "mini", "precision": "fp16", "bertforge_tokens_per_s": 900.0},
        {"preset": "mini", "precision": "bf16", "bertforge_tokens_per_s": 800.0},
        {"preset": "mini", "precision": "fp32", "bertforge_tokens_per_s": 500.0},
    ]
    assert fastest(rows, "mini", "bertforge", torch.device("cpu")) == "bf16"
    assert fastest(rows[:1], "mini", "bertforge", torch.device("cpu")) in ("bf16", "fp32")


def test_the_inference_benchmark_without_glue_dev_files_is_refused(tmp_path):
    from benchmarks import glue, infer
    from benchmarks.glue import GLUE_DATA

    (tmp_path / "SST-2").mkdir()
    (tmp_path / "SST-2" / "train.tsv").write_text("sentence\tlabel\ngood\t1\n", encoding="utf-8")
    assert (
        "holds no SST-2, RTE task folder with a train.tsv and a dev.tsv; give --glue-data"
        in infer.refusal(tmp_path)
    )
    (tmp_path / "SST-2" / "Dev.tsv").write_text("sentence\tlabel\nbad\t0\n", encoding="utf-8")
    assert "holds no RTE task folder" in infer.refusal(tmp_path)
    not_a_folder = tmp_path / "SST-2" / "Dev.tsv"
    assert infer.refusal(not_a_folder) == glue.refusal(None, not_a_folder, quick=True)
    assert infer.refusal(not_a_folder).startswith(f"--glue-data {not_a_folder} is not a folder; give")
    assert infer.refusal(Path(GLUE_DATA)) is None
