"""`bertforge glue-compare`: two finished benchmarks paired seed for seed on the tasks both ran, the
figures against their runs and an independent Pearson and Spearman, and the refusals."""

from __future__ import annotations

import json
import shutil
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import assert_clean_failure
from scipy import stats as scipy_stats
from test_glue import tiny_bench, write_glue

from bertforge.errors import BertforgeError
from bertforge.glue import GlueBenchmark, move_to_pretrained_arm, run_glue
from bertforge.glue_report import signed
from bertforge.glue_versus import arm_runs, compare_benchmarks, rows
from bertforge.io import LOCK_FILE, RunFolderLock


@pytest.fixture(scope="module")
def two_benchmarks(tmp_path_factory, tiny_pretrained_run) -> tuple[Path, Path]:
    """A: RTE and STS-B, seeds 1-2, both arms; B: STS-B and MRPC, seeds 1-3, the model arm alone and
    another learning rate (so its scores differ)."""
    root = tmp_path_factory.mktemp("versus")
    data = write_glue(root / "glue_data")
    first = root / "first"
    run_glue(tiny_bench(tiny_pretrained_run, data, root), first, show_progress=False, say=lambda line: None)
    other = root / "other"
    other.mkdir()
    second = root / "second"
    bench = tiny_bench(
        tiny_pretrained_run, data, other, tasks=["STS-B", "MRPC"], seeds=[1, 2, 3], compare_scratch=False
    )
    for recipe in bench.recipes.values():
        recipe["learning_rate"] = 1e-3
    run_glue(bench, second, show_progress=False, say=lambda line: None)
    return first, second


def test_the_shared_task_is_compared_seed_for_seed(two_benchmarks, tmp_path):
    first, second = two_benchmarks
    comparison = compare_benchmarks(first, second, tmp_path / "cmp")
    assert list(comparison["tasks"]) == ["STS-B"] and comparison["seeds"] == [1, 2]
    assert comparison["not_compared"] == ["MRPC", "RTE"] and comparison["names"] == ["first", "second"]
    reports = [json.loads((folder / "glue.json").read_text(encoding="utf-8")) for folder in two_benchmarks]
    scores = [
        {r["seed"]: r["score"] for r in report["tasks"]["STS-B"]["arms"]["pretrained"]["runs"]}
        for report in reports
    ]
    task = comparison["tasks"]["STS-B"]
    differences = [scores[0][seed] - scores[1][seed] for seed in (1, 2)]
    assert [p["difference"] for p in task["comparison"]["pairs"]] == pytest.approx(differences)
    assert task["comparison"]["difference"]["median"] == pytest.approx(statistics.median(differences))
    assert task["arms"]["second"]["median"] == pytest.approx(statistics.median([scores[1][1], scores[1][2]]))
    # The bootstrap's observed gain: the seeds' mean score of one minus the other's.
    gain = statistics.fmean(scores[0][s] for s in (1, 2)) - statistics.fmean(scores[1][s] for s in (1, 2))
    assert task["comparison"]["bootstrap"]["gain"] == pytest.approx(gain)
    assert task["recipes"]["first"]["learning_rate"] != task["recipes"]["second"]["learning_rate"]
    assert comparison["average"]["first"] == pytest.approx(task["arms"]["first"]["median"])
    markdown = (tmp_path / "cmp" / "compare.md").read_text(encoding="utf-8")
    assert "| STS-B |" in markdown and "different recipes (learning_rate)" in markdown
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:4] == b"\x89PNG"


def test_a_recipe_setting_an_older_benchmark_predates_is_not_a_difference(two_benchmarks, tmp_path):
    first, second = two_benchmarks
    older = tmp_path / "older"
    shutil.copytree(second, older)
    report = json.loads((older / "glue.json").read_text(encoding="utf-8"))
    for task in report["tasks"].values():
        del task["recipe"]["layer_decay"]  # at its default
    (older / "glue.json").write_text(json.dumps(report), encoding="utf-8")
    compare_benchmarks(first, older, tmp_path / "cmp")
    markdown = (tmp_path / "cmp" / "compare.md").read_text(encoding="utf-8")
    assert "different recipes (learning_rate)" in markdown


def test_a_comparison_folder_in_use_is_refused_and_left_alone(two_benchmarks, tmp_path):
    out = tmp_path / "cmp"
    with RunFolderLock(out):  # another glue-compare writing there
        with pytest.raises(BertforgeError, match="in use by another bertforge run"):
            compare_benchmarks(*two_benchmarks, out)
        assert [entry.name for entry in out.iterdir()] == [LOCK_FILE]
    assert not out.exists()


def test_a_benchmark_stopped_while_gaining_the_scratch_arm_still_compares(two_benchmarks, tmp_path):
    """A rerun with --compare-scratch moves the runs so far under pretrained/; stopped before its new
    report, the folder's glue.json is the old one, whose runs glue-compare still finds."""
    first, second = two_benchmarks
    grown = tmp_path / "copy" / second.name  # the same name: the same column names
    shutil.copytree(second, grown)
    settings = json.loads((grown / "glue.json").read_text(encoding="utf-8"))["settings"]
    move_to_pretrained_arm(replace(GlueBenchmark(**settings), compare_scratch=True), grown)
    assert (grown / "STS-B" / "pretrained" / "seed_1").is_dir() and not (grown / "STS-B" / "seed_1").exists()
    before = compare_benchmarks(first, second, tmp_path / "before")
    after = compare_benchmarks(first, grown, tmp_path / "after")
    assert after["tasks"]["STS-B"]["comparison"] == before["tasks"]["STS-B"]["comparison"]


def test_each_runs_predictions_score_as_its_report_says(two_benchmarks):
    """The predictions paired are each run's own: Pearson and Spearman recomputed by scipy."""
    for folder in two_benchmarks:
        report = json.loads((folder / "glue.json").read_text(encoding="utf-8"))
        lines = (folder / "data" / "STS-B" / "dev.jsonl").read_text(encoding="utf-8").splitlines()
        true = [float(json.loads(line)["label"]) for line in lines]
        for run in arm_runs("STS-B", folder, report, [1, 2], "pretrained"):
            pearson = scipy_stats.pearsonr(true, run["predicted"])[0]
            spearman = scipy_stats.spearmanr(true, run["predicted"])[0]
            assert run["score"] == pytest.approx(50 * (pearson + spearman), abs=1e-6)


def test_the_command_prints_the_table_and_refuses_what_it_cannot_compare(
    two_benchmarks, tmp_path, capsys, tiny_pretrained_run
):
    from bertforge.cli import main

    first, second = two_benchmarks
    assert main(["glue-compare", str(second), str(first), "--out", str(tmp_path / "c")]) == 0
    printed = capsys.readouterr().out
    header = ["task", "second", "first", "difference", "p", "sign", "p", "boot"]
    assert printed.split("\n")[0].split() == header
    assert printed.split("\n")[1].startswith("STS-B") and "average" in printed
    assert_clean_failure(
        capsys, ["glue-compare", str(first), str(first), "--out", str(tmp_path / "d")], "two different"
    )
    assert_clean_failure(
        capsys, ["glue-compare", str(first), str(tmp_path), "--out", str(tmp_path / "d")], "no finished GLUE"
    )
    damaged = tmp_path / "damaged"
    shutil.copytree(second, damaged)
    dev = damaged / "data" / "STS-B" / "dev.jsonl"
    dev.write_text(dev.read_text(encoding="utf-8").replace("4.", "3.", 1), encoding="utf-8")
    assert_clean_failure(
        capsys, ["glue-compare", str(first), str(damaged), "--out", str(tmp_path / "d")], "different dev"
    )
    assert not (tmp_path / "d").exists()  # nothing is written for a refused comparison
    run = ["glue-compare", str(first), str(tiny_pretrained_run), "--out", str(tmp_path / "d")]
    assert_clean_failure(capsys, run, f"{tiny_pretrained_run} holds a pretraining run, not a GLUE benchmark;")
    again = ["glue-compare", str(second), str(first), "--out"]
    assert main([*again, str(tmp_path / "c")]) == 0  # an earlier comparison is replaced
    files = {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()}
    assert_clean_failure(capsys, [*again, str(first)], f"{first} holds other things than a comparison (")
    assert {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()} == files
    (tmp_path / "file").write_text("x")
    assert_clean_failure(capsys, [*again, str(tmp_path / "file")], "is a file; --out must name a folder")


def test_benchmarks_without_a_shared_task_or_seed_are_refused(two_benchmarks, tmp_path):
    first, second = two_benchmarks
    lone = tmp_path / "lone"
    shutil.copytree(second, lone)
    report = json.loads((lone / "glue.json").read_text(encoding="utf-8"))
    del report["tasks"]["STS-B"]
    (lone / "glue.json").write_text(json.dumps(report), encoding="utf-8")
    with pytest.raises(BertforgeError, match="share no GLUE task"):
        compare_benchmarks(first, lone, tmp_path / "x")
    report = json.loads((second / "glue.json").read_text(encoding="utf-8"))
    report["settings"]["seeds"] = [7]
    (lone / "glue.json").write_text(json.dumps(report), encoding="utf-8")
    with pytest.raises(BertforgeError, match="share no fine-tuning seed"):
        compare_benchmarks(first, lone, tmp_path / "x")


def test_the_random_weights_arms_compare_alike_and_need_a_scratch_arm(two_benchmarks, tmp_path):
    first, second = two_benchmarks
    with pytest.raises(BertforgeError, match="ran no scratch arm; benchmark it with --compare-scratch"):
        compare_benchmarks(first, second, tmp_path / "x", arm="scratch")
    twin = tmp_path / "twin"
    shutil.copytree(first, twin)
    comparison = compare_benchmarks(first, twin, tmp_path / "s", arm="scratch")
    task = comparison["tasks"]["RTE"]["comparison"]
    assert list(comparison["tasks"]) == ["RTE", "STS-B"] and comparison["arm"] == "scratch"
    assert [p["difference"] for p in task["pairs"]] == [0.0, 0.0]  # the same runs: no difference
    assert task["bootstrap"]["p_value"] == 1.0 and task["sign_test"]["ties"] == 2
    assert "--arm scratch" in (tmp_path / "s" / "compare.md").read_text(encoding="utf-8")


def test_damaged_reports_dev_files_and_scores_are_one_clear_error(two_benchmarks, tmp_path):
    first, damaged = tmp_path / "first", tmp_path / "damaged"  # copies: the module's stay as they are
    shutil.copytree(two_benchmarks[0], first)
    shutil.copytree(two_benchmarks[1], damaged)
    report_text = (damaged / "glue.json").read_text(encoding="utf-8")
    (damaged / "glue.json").write_text('{"tasks": []}', encoding="utf-8")
    with pytest.raises(BertforgeError, match=r"glue.json is damaged \(not a GLUE report\); run `bertforge"):
        compare_benchmarks(first, damaged, tmp_path / "x")
    (damaged / "glue.json").write_text(report_text, encoding="utf-8")
    scores = damaged / "STS-B" / "seed_2" / "glue_scores.json"
    saved = scores.read_text(encoding="utf-8")
    record = json.loads(saved)
    record["predicted"] = record["predicted"][:-1]
    scores.write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(BertforgeError, match="predictions do not match its 24 dev examples; delete its"):
        compare_benchmarks(first, damaged, tmp_path / "x")
    scores.unlink()
    with pytest.raises(BertforgeError, match="glue_scores.json is missing; continue"):
        compare_benchmarks(first, damaged, tmp_path / "x")
    scores.write_text(saved, encoding="utf-8")
    for folder in (first, damaged):
        dev = folder / "data" / "STS-B" / "dev.jsonl"
        dev.write_text(dev.read_text(encoding="utf-8") + "not json\n", encoding="utf-8")
    with pytest.raises(BertforgeError, match=r"dev.jsonl line 25 is not valid JSON"):
        compare_benchmarks(first, damaged, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_benchmark_grown_but_not_finished_compares_its_report_and_says_so(two_benchmarks, tmp_path, capsys):

    first, second = two_benchmarks
    grown = tmp_path / "grown"
    shutil.copytree(second, grown)
    settings = json.loads((grown / "glue_task.json").read_text(encoding="utf-8"))
    (grown / "glue_task.json").write_text(json.dumps({**settings, "seeds": [1, 2, 3, 4]}), encoding="utf-8")
    comparison = compare_benchmarks(first, grown, tmp_path / "cmp")
    assert comparison["seeds"] == [1, 2]  # the runs its report holds
    note = (
        f"{grown} is unfinished: its report has no seeds 4 yet; finish it with `bertforge glue --out {grown}"
    )
    assert comparison["benchmarks"]["grown"]["unfinished"].startswith(note)
    assert note in (tmp_path / "cmp" / "compare.md").read_text(encoding="utf-8")
    assert comparison["benchmarks"]["first"]["unfinished"] is None

    (grown / "glue.json").unlink()  # stopped before its first report
    argv = ["glue-compare", str(first), str(grown), "--out", str(tmp_path / "cmp2")]
    assert_clean_failure(
        capsys,
        argv,
        f"holds no finished GLUE benchmark; finish it with `bertforge glue --out {grown} --resume`",
    )


def test_a_difference_that_rounds_to_zero_reads_plus_zero_in_the_table():
    cells = {"median": 70.0, "min": 69.0, "max": 71.0}
    comparison = {
        "names": ["a", "b"],
        "tasks": {
            "STS-B": {
                "arms": {"a": cells, "b": cells},
                "comparison": {
                    "difference": {"median": -0.04},
                    "sign_test": {"p_value": 1.0},
                    "bootstrap": {"gain": -0.03, "p_value": 0.9, "resamples": 1000},
                },
            }
        },
        "average": {"a": 70.0, "b": 70.04},
    }
    table = rows(comparison)
    assert table[1][3] == "+0.0" and table[2][3] == "+0.0"
    assert [signed(value) for value in (-1.26, 2.0, 0.04)] == ["-1.3", "+2.0", "+0.0"]
