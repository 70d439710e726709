"""tools/fault_matrix.py keeps working: three of its cases run end to end (a bad corpus, a folder of
the wrong kind, a damaged tokenizer) and pass, and its verdicts tell a clean refusal from a
traceback, a second line or a wrong exit status."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "fault_matrix.py"
CASES = [
    "input/tokenizer-corpus-not-utf8",
    "kinds/classify-given-tokenizer",
    "damage/tokenizer-json-not-json",
]


@pytest.fixture
def matrix(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("fault_matrix", TOOL)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fault_matrix", module)  # (dataclasses look their module up there)
    spec.loader.exec_module(module)
    module.M = module.Matrix(tmp_path / "matrix", seed=0, exec_mode=False)
    return module


def test_three_cases_of_the_matrix_run_and_pass(tmp_path):
    out = tmp_path / "matrix"
    done = subprocess.run(
        [sys.executable, str(TOOL), "--out", str(out), "--only", ",".join(CASES)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    page = (out / "fault-matrix.md").read_text(encoding="utf-8")
    assert done.returncode == 0, done.stdout + done.stderr + page
    assert "3 cases: **3 pass, 0 FAIL, 0 skipped**" in page
    rows = [line for line in page.splitlines() if line.startswith("| ") and "/" in line.split("|")[1]]
    assert [row.split("|")[1].strip() for row in rows] == CASES
    assert all("| pass (" in row for row in rows)
    assert all(" bertforge " in row.split("|")[2] or "`bertforge " in row.split("|")[2] for row in rows)


def test_the_verdicts_tell_a_clean_refusal_from_the_rest(matrix):
    Result, Fail = matrix.Result, matrix.Fail
    clean = Result(2, "", "bertforge: warning: a note\nbertforge: error: corpus x.txt is empty; check it\n")
    assert "is empty" in matrix.refused(clean, "x.txt")
    for bad, why in [
        (Result(1, "", "Traceback (most recent call last):\n  ...\nValueError: boom\n"), "traceback"),
        (Result(0, "", ""), "expected exit 2"),
        (Result(2, "", "bertforge: error: one\nbertforge: error: two\n"), "not one error line"),
        (Result(2, "", "bertforge: error: x: [Errno 17] File exists\n"), "raw OS error"),
    ]:
        with pytest.raises(Fail, match=why):
            matrix.refused(bad)
    with pytest.raises(Fail, match="does not name 'y.txt'"):
        matrix.refused(clean, "y.txt")
    assert matrix.either(Result(0, "done\n", "")) is True
    with pytest.raises(Fail, match="traceback"):
        matrix.either(Result(1, "", "Traceback (most recent call last):\nKeyError\n"))


def test_weights_are_compared_tensor_by_tensor(matrix, tmp_path):
    import torch
    from safetensors.torch import save_file

    weights = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4)}
    save_file(weights, tmp_path / "one.safetensors")
    save_file(dict(weights, b=torch.ones(4) * 2), tmp_path / "two.safetensors")
    matrix.same_weights(tmp_path / "one.safetensors", tmp_path / "one.safetensors")
    with pytest.raises(matrix.Fail, match="1 of 2 tensors differ"):
        matrix.same_weights(tmp_path / "two.safetensors", tmp_path / "one.safetensors")
