"""The benchmark suite runs end to end: `python -m benchmarks.run --quick` (a tiny model on slices of
WikiText-2) measures all four of its parts against `transformers` and writes its JSON. This keeps
`make bench` from drifting behind the code it measures; the figures themselves are not checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_quick_benchmark_suite_measures_every_part(tmp_path):
    out = tmp_path / "latest.json"
    command = [sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(out)]
    command += ["--cache-dir", str(tmp_path / "cache"), "--threads", "2"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text(encoding="utf-8"))
    assert {row["precision"] for row in results["step"]} == {"fp32", "bf16"}
    for row in results["step"]:
        assert row["bertforge_tokens_per_s"] > 0 and row["hf_tokens_per_s"] > 0
    for row in results["e2e"]:
        assert row["e2e_real_tokens_per_s"] > 0 and 0.0 <= row["padding_fraction"] < 1.0
    assert results["prep"]["x10"]["tokens"] > results["prep"]["single"]["tokens"] > 0
    for model in ("bertforge", "hf"):
        assert results["quality"][model]["steps"] > 0
        assert 0.0 <= results["quality"][model]["mlm_accuracy"] <= 1.0


def test_the_step_benchmark_sets_both_models_dropout(tmp_path):
    out = tmp_path / "step.json"
    command = [sys.executable, "-m", "benchmarks.run", "--quick", "--only", "step", "--precisions", "bf16"]
    command += ["--dropout", "0", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--threads", "2"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text(encoding="utf-8"))["step"]
    assert [row["dropout"] for row in rows] == [0.0]
    assert "dropout 0" in done.stdout
