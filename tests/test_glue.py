"""`bertforge glue`: GLUE's files read as distributed, damaged ones refused by file and line, GLUE's
scoring rules, the recipes file, a short benchmark with both arms and its report, and a resume that
runs no finished seed again."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import shutil
import signal
import time
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import SHARED_DATA, assert_clean_failure
from scipy import stats as scipy_stats
from test_stats import exact_p_value, five_seeds_with_many_tied_resamples

from bertforge import glue_data, glue_scores
from bertforge.comparison import ARMS, few_seeds_note
from bertforge.config import load_toml
from bertforge.errors import BertforgeError, Interrupted
from bertforge.finetune import EpochEvaluator, task_data
from bertforge.glue import (
    SCORES,
    benchmark,
    finetune_task,
    run_glue,
    run_tokens,
    settled,
    sweep_points,
    write_task_files,
)
from bertforge.glue_data import TASKS, find_tasks, read_split, read_task
from bertforge.glue_recipes import DEFAULT_RECIPES, Recipe, read_recipes, recipe_text
from bertforge.glue_report import (
    at_chance,
    chance_note,
    comparison_cells,
    majority_class,
    paired_comparison,
    plotted_series,
    published,
)
from bertforge.glue_scores import (
    FIGURES,
    PUBLISHED,
    glue_average,
    majority_label,
    paired_bootstrap_score,
    split_figures,
    task_score,
)
from bertforge.progress import RunsProgress
from bertforge.tokenizer import load_tokenizer
from bertforge.train import train

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the film was good", "a bad plot", "the army fought", "music and song", "it rained in may")


def tsv(path: Path, rows: list[list]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(map(str, row)) + "\n" for row in rows), encoding="utf-8")
    return path


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))


def write_glue(root: Path, rows: int = 24, seed: int = 0) -> Path:
    """All nine tasks in the layouts GLUE's download script writes (RTE in the `datasets` layout with
    integer labels, MRPC's dev with a labelled test.tsv, CoLA's test.tsv unlabelled as GLUE's)."""
    rng = random.Random(seed)

    def pairs(header, make, count=rows):
        return [header] + [make(i) for i in range(count)]

    def two(i):
        return sentence(rng), sentence(rng)

    for split in ("train", "dev"):
        tsv(root / "SST-2" / f"{split}.tsv", pairs(["sentence", "label"], lambda i: [sentence(rng), i % 2]))
        tsv(
            root / "CoLA" / f"{split}.tsv",
            [["gj04", i % 2, "*" if i % 2 == 0 else "", sentence(rng)] for i in range(rows)],
        )
        tsv(
            root / "MRPC" / f"{split}.tsv",
            pairs(
                ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                lambda i: [i % 2, 100 + i, 200 + i, *two(i)],
            ),
        )
        sts_header = [
            "index",
            "genre",
            "filename",
            "year",
            "old_index",
            "source1",
            "source2",
            "sentence1",
            "sentence2",
            "score",
        ]
        tsv(
            root / "STS-B" / f"{split}.tsv",
            pairs(
                sts_header,
                lambda i: [i, "main-news", "f", "2012", i, "none", "none", *two(i), f"{(i * 0.37) % 5:.3f}"],
            ),
        )
        tsv(
            root / "RTE" / f"{split}.tsv",
            pairs(["sentence1", "sentence2", "label", "idx"], lambda i: [*two(i), i % 2, i]),
        )
        tsv(
            root / "QNLI" / f"{split}.tsv",
            pairs(
                ["index", "question", "sentence", "label"],
                lambda i: [i, *two(i), ("entailment", "not_entailment")[i % 2]],
            ),
        )
        tsv(
            root / "QQP" / f"{split}.tsv",
            pairs(
                ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                lambda i: [i, i, i, *two(i), i % 2],
            ),
        )
        tsv(
            root / "WNLI" / f"{split}.tsv",
            pairs(["index", "sentence1", "sentence2", "label"], lambda i: [i, *two(i), i % 2]),
        )
    mnli = ["index", "promptID", "pairID", "genre", "sentence1", "sentence2", "gold_label"]
    labels = ("entailment", "neutral", "contradiction")
    for split in ("train", "dev_matched", "dev_mismatched"):
        tsv(
            root / "MNLI" / f"{split}.tsv",
            pairs(mnli, lambda i: [i, i, i, "fiction", *two(i), labels[i % 3]]),
        )
    tsv(
        root / "MRPC" / "test.tsv",
        pairs(["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"], lambda i: [i % 2, i, i, *two(i)], 10),
    )
    tsv(root / "CoLA" / "test.tsv", pairs(["index", "sentence"], lambda i: [i, sentence(rng)], 10))
    return root


@pytest.fixture
def glue_dir(tmp_path) -> Path:
    return write_glue(tmp_path / "glue_data")


# ------------------------------------------------------------------------------------------- reading


def test_each_task_is_read_in_the_layout_it_is_distributed_in(glue_dir):
    withheld = [["sentence1", "sentence2", "label", "idx"]] + [["a", "b", -1, i] for i in range(10)]
    tsv(glue_dir / "RTE" / "test.tsv", withheld)  # as `datasets` writes a test split
    found, skipped = find_tasks([glue_dir], list(TASKS))
    assert skipped == [] and set(found) == set(TASKS)
    data = {name: read_task(TASKS[name], folder) for name, folder in found.items()}
    assert all(len(d.train) == 24 for d in data.values())
    assert data["SST-2"].train.pairs is None and data["CoLA"].train.pairs is None
    assert (
        data["CoLA"].train.texts[0]
        == (glue_dir / "CoLA" / "train.tsv").read_text().split("\n")[0].split("\t")[3]
    )
    assert data["CoLA"].train.lines[0] == 1  # no header row
    assert set(data["RTE"].train.labels) == {"entailment", "not_entailment"}  # datasets' 0 and 1
    assert data["RTE"].train.labels[:2] == ["entailment", "not_entailment"]
    assert set(data["MNLI"].train.labels) == {"entailment", "neutral", "contradiction"}
    assert set(data["MNLI"].dev) == {"dev_matched", "dev_mismatched"}
    assert data["STS-B"].train.labels[1] == "0.370" and data["STS-B"].train.pairs is not None
    assert data["MRPC"].train.lines[0] == 2 and set(data["MRPC"].train.labels) == {"0", "1"}
    assert len(data["MRPC"].test["test"]) == 10  # labelled: scored
    assert data["CoLA"].test == {} and data["CoLA"].notes == ["CoLA: test.tsv has no labels, not scored"]
    assert data["RTE"].test == {} and data["RTE"].notes == ["RTE: test.tsv has no labels, not scored"]


def test_a_score_of_minus_one_is_a_withheld_label_in_a_test_file_only(tmp_path):
    write_glue(tmp_path)
    folder = tmp_path / "STS-B"
    rows = (folder / "dev.tsv").read_text().split("\n")
    withheld = [rows[0]] + ["\t".join(row.split("\t")[:-1] + ["-1.0"]) for row in rows[1:] if row]
    (folder / "test.tsv").write_text("\n".join(withheld) + "\n")
    assert read_task(TASKS["STS-B"], folder).test == {}
    (folder / "dev.tsv").write_text("\n".join(withheld) + "\n")
    with pytest.raises(BertforgeError, match=r"dev.tsv line 2: the score '-1.0' is not a number from 0 to 5"):
        read_task(TASKS["STS-B"], folder)


def test_folder_names_in_any_case_and_a_folder_above_them(tmp_path):
    write_glue(tmp_path / "a" / "glue")
    (tmp_path / "a" / "glue" / "STS-B").rename(tmp_path / "a" / "glue" / "stsb")
    (tmp_path / "a" / "glue" / "SST-2").rename(tmp_path / "a" / "sst2")
    found, skipped = find_tasks([tmp_path / "a"], ["SST-2", "STS-B", "RTE"])
    assert found == {
        "SST-2": tmp_path / "a" / "sst2",
        "STS-B": tmp_path / "a" / "glue" / "stsb",
        "RTE": tmp_path / "a" / "glue" / "RTE",
    }
    assert skipped == []


def test_the_shared_glue_files_read_as_they_are():
    """The real files (their first rows): MRPC's Quality columns, STS-B's ten, RTE's integer labels, SST-2."""
    found, skipped = find_tasks([SHARED_DATA], ["SST-2", "MRPC", "STS-B", "RTE", "CoLA"])
    assert set(found) == {"SST-2", "MRPC", "STS-B", "RTE"}
    assert skipped == [f"CoLA: skipped, no CoLA/ folder with a train.tsv in {SHARED_DATA}"]
    for name, folder in found.items():
        path = folder / "dev.tsv"
        examples = read_split(TASKS[name], path)
        with path.open(encoding="utf-8") as lines:
            rows = [line.rstrip("\n").split("\t") for line in lines]
        assert len(examples) == len(rows) - 1 and examples.lines[0] == 2
    stsb = read_split(TASKS["STS-B"], found["STS-B"] / "dev.tsv")
    assert all(0 <= float(score) <= 5 for score in stsb.labels) and len(set(stsb.labels)) > 20
    rte = read_split(TASKS["RTE"], found["RTE"] / "dev.tsv")
    assert set(rte.labels) == {"entailment", "not_entailment"}


@pytest.mark.parametrize("end", ["\r\n", "\r", "\r\r\n"])
def test_a_glue_file_with_crlf_or_cr_line_ends_reads_as_distributed(tmp_path, end):
    """MRPC's dev file saved with Windows' or old Macs' line ends: the same examples, no CR in them."""
    original = SHARED_DATA / "glue" / "mrpc" / "dev.tsv"
    path = tmp_path / "dev.tsv"
    path.write_bytes(original.read_bytes().replace(b"\n", end.encode()))
    expected, data = read_split(TASKS["MRPC"], original), read_split(TASKS["MRPC"], path)
    assert (data.texts, data.pairs, data.labels, data.lines) == (
        expected.texts,
        expected.pairs,
        expected.labels,
        expected.lines,
    )


@pytest.mark.parametrize(
    "task, row, message",
    [
        ("SST-2", ["a fine film", "2"], "line 3: the label '2' is not one of SST-2's: 0, 1"),
        (
            "RTE",
            ["a", "b", "5", "9"],
            "line 3: the label '5' is not one of RTE's: entailment, not_entailment, 0, 1",
        ),
        (
            "STS-B",
            [0, "g", "f", "y", 0, "s", "s", "a", "b", "5.2"],
            "line 3: the score '5.2' is not a number from 0 to 5",
        ),
        (
            "STS-B",
            [0, "g", "f", "y", 0, "s", "s", "a", "b", "high"],
            "line 3: the score 'high' is not a number",
        ),
        (
            "MRPC",
            ["1", "7", "8", "only one string"],
            "line 3 has 4 tab-separated fields, not 5 (as the header has)",
        ),
        ("SST-2", ["  ", "1"], "line 3: a text is empty"),
        ("RTE", [], "line 3 is empty; GLUE's files have no blank lines"),
    ],
)
def test_a_damaged_row_is_one_error_naming_file_and_line(glue_dir, task, row, message):
    path = glue_dir / task / "train.tsv"
    lines = path.read_text(encoding="utf-8").split("\n")
    lines.insert(2, "\t".join(map(str, row)))
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(BertforgeError) as error:
        read_task(TASKS[task], glue_dir / task)
    assert str(error.value) == f"{path} {message}" or str(error.value).startswith(f"{path} {message}")


def test_qqps_damaged_rows_are_left_out_with_a_line_as_hugging_face_leaves_them(glue_dir):
    """QQP's train.tsv as distributed holds a question broken over two lines (missing fields)."""
    path = glue_dir / "QQP" / "train.tsv"
    lines = path.read_text(encoding="utf-8").split("\n")
    lines[3:3] = ["7\t1\t2\tWhat is", "x\tWhy?\t0", "8\t3\t4\t \tWhy not?\t1"]  # lines 4-6
    path.write_text("\n".join(lines), encoding="utf-8")
    data = read_task(TASKS["QQP"], glue_dir / "QQP")
    assert len(data.train) == 24 and data.train.lines[:3] == [2, 3, 7]
    assert data.notes == [
        "QQP: train.tsv: 3 damaged rows left out (line 4, 5, 6): missing fields or an empty question"
    ]
    rte = glue_dir / "RTE" / "train.tsv"  # another task's damaged row is an error
    rte.write_text(rte.read_text(encoding="utf-8").rstrip("\n") + "\nWhat is\n", encoding="utf-8")
    with pytest.raises(BertforgeError, match="has 1 tab-separated fields, not 4"):
        read_task(TASKS["RTE"], glue_dir / "RTE")


def test_a_file_of_another_layout_is_refused_with_the_columns_it_needs(glue_dir):
    path = tsv(glue_dir / "MRPC" / "dev.tsv", [["text", "label"], ["a", "1"]])
    with pytest.raises(
        BertforgeError,
        match=r"line 1 is not a MRPC header \(text, label\); MRPC files have the columns #1 String",
    ):
        read_split(TASKS["MRPC"], path)


def test_a_damaged_first_row_of_a_file_without_header_is_named_as_any_other_row(glue_dir):
    """CoLA's files have no header: a bad label on line 1 is the label's fault, as on line 2."""
    path = glue_dir / "CoLA" / "train.tsv"
    lines = path.read_text(encoding="utf-8").split("\n")
    for number in (1, 2):
        damaged = lines.copy()
        damaged[number - 1] = "gj04\t2\t\tA sentence."
        path.write_text("\n".join(damaged), encoding="utf-8")
        with pytest.raises(
            BertforgeError, match=f"train.tsv line {number}: the label '2' is not one of CoLA's"
        ):
            read_split(TASKS["CoLA"], path)


def test_a_missing_task_is_skipped_with_a_line(glue_dir, tmp_path):
    shutil.rmtree(glue_dir / "RTE")
    found, skipped = find_tasks([glue_dir], ["RTE", "WNLI"])
    assert list(found) == ["WNLI"] and skipped == [
        f"RTE: skipped, no RTE/ folder with a train.tsv in {glue_dir}"
    ]


def test_a_task_folder_without_its_dev_file_is_one_error(glue_dir):
    (glue_dir / "SST-2" / "dev.tsv").unlink()
    with pytest.raises(
        BertforgeError, match=r"SST-2 has no dev.tsv; .* hold train.tsv and dev.tsv: add it, or"
    ):
        read_task(TASKS["SST-2"], glue_dir / "SST-2")


def test_file_names_in_any_case(glue_dir):
    (glue_dir / "RTE" / "train.tsv").rename(glue_dir / "RTE" / "TRAIN.TSV")
    (glue_dir / "RTE" / "dev.tsv").rename(glue_dir / "RTE" / "Dev.tsv")
    found, skipped = find_tasks([glue_dir], ["RTE"])
    assert skipped == [] and len(read_task(TASKS["RTE"], found["RTE"]).dev["dev"]) == 24


def test_a_dev_label_no_training_example_has_is_refused_before_any_run(glue_dir, tmp_path):
    """Fine-tuning would refuse it too, but only when the task's turn comes, naming a file glue wrote."""
    recipes, _ = read_recipes({}, "built in")
    path = glue_dir / "MNLI" / "train.tsv"
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(line for line in lines if not line.endswith("\tneutral")) + "\n")
    mnli = read_task(TASKS["MNLI"], glue_dir / "MNLI")
    with pytest.raises(BertforgeError) as error:
        write_task_files(tmp_path / "m", mnli, recipes["MNLI"])
    assert str(error.value) == (
        f"{glue_dir / 'MNLI' / 'dev_matched.tsv'} line 3: the label 'neutral' is in no training example "
        f"({path} has 'contradiction', 'entailment'); fix the files, or leave the task out of --tasks"
    )
    rte = read_task(TASKS["RTE"], glue_dir / "RTE")  # a subset of one class
    with pytest.raises(
        BertforgeError, match=r"\(the recipe's 1 of 24 examples\): every label is 'entailment'"
    ):
        write_task_files(tmp_path / "r", rte, replace(recipes["RTE"], max_train_examples=1))
    path = glue_dir / "STS-B" / "train.tsv"
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()]
    path.write_text(
        "".join("\t".join([*row[:-1], "2.5" if i else row[-1]]) + "\n" for i, row in enumerate(rows))
    )
    stsb = read_task(TASKS["STS-B"], glue_dir / "STS-B")
    with pytest.raises(BertforgeError, match="every score is 2.5; nothing to regress on"):
        write_task_files(tmp_path / "s", stsb, recipes["STS-B"])


def test_task_names_in_any_spelling():
    assert [glue_data.task_spec(n).name for n in ("sst2", "STS-B", "sts_b", "mnli")] == [
        "SST-2",
        "STS-B",
        "STS-B",
        "MNLI",
    ]
    with pytest.raises(BertforgeError, match="'squad' is not a GLUE task"):
        glue_data.task_spec("squad")


# ------------------------------------------------------------------------------------------- scoring


def test_figures_and_scores_follow_glues_rules():
    true, predicted = ["1", "1", "1", "0", "0", "0"], ["1", "1", "0", "0", "0", "1"]
    # MRPC: TP 2, FP 1, FN 1 -> F1 = 4 / 6; 4 of 6 right
    mrpc = split_figures("MRPC", 0, true, predicted, ["0", "1"])
    assert mrpc == pytest.approx({"f1": 100 * 4 / 6, "acc": 100 * 4 / 6})
    # CoLA: Matthews (TP TN - FP FN) / sqrt(...) = (2*2 - 1*1) / sqrt(3*3*3*3) = 1/3
    assert split_figures("CoLA", 0, true, predicted, ["0", "1"]) == pytest.approx({"mcc": 100 / 3})
    # F1 of class "1" also when it is not the second name
    assert split_figures("QQP", 0, ["1", "x"], ["1", "1"], ["1", "x"])["f1"] == pytest.approx(100 * 2 / 3)
    stsb = split_figures("STS-B", 0, [0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 3.0, 2.0], [])
    assert stsb == pytest.approx({"pearson": 80.0, "spearman": 80.0})
    assert task_score("MRPC", {"f1": 80.0, "acc": 70.0}) == 75.0
    assert task_score("STS-B", {"pearson": 74.3, "spearman": 73.6}) == pytest.approx(73.95)
    assert task_score("MNLI", {"acc_m": 70.0, "acc_mm": 72.0}) == 71.0
    assert task_score("MNLI", {"acc_m": 70.0}) == 70.0
    assert task_score("SST-2", {}) is None
    assert glue_average({"SST-2": 80.0, "MRPC": 75.0, "STS-B": 73.95, "RTE": 55.0}) == pytest.approx(70.9875)


def test_the_published_rows_reproduce_the_model_cards_glue_score():
    """The model card's "Score": the mean of nine task scores, MNLI as the mean of m and mm."""
    every_figure = {task: {name for name, _, _ in FIGURES[task]} for task in TASKS}
    for row in published(every_figure)["models"].values():
        assert row["average_of_these_tasks"] == pytest.approx(row["glue_score"], abs=0.06)
    assert PUBLISHED["BERT-Mini (4/256)"]["tasks"]["MRPC"] == {"f1": 81.1, "acc": 71.8}


def test_the_bootstrap_of_a_task_score_sees_a_real_gain_and_no_gain():
    rng = random.Random(0)
    true = [str(rng.randint(0, 1)) for _ in range(300)]
    flip = {"0": "1", "1": "0"}

    def noisy(rate):
        return [t if rng.random() > rate else flip[t] for t in true]

    better = paired_bootstrap_score(
        "MRPC", true, [noisy(0.1), noisy(0.1)], [noisy(0.4), noisy(0.4)], ["0", "1"], 200
    )
    assert better["gain"] > 20 and better["p_value"] < 0.01 and better["low"] > 0
    same = [noisy(0.2), noisy(0.2)]
    assert paired_bootstrap_score("MRPC", true, same, same, ["0", "1"], 200)["p_value"] == 1.0


@pytest.mark.parametrize("task", ["MRPC", "STS-B", "CoLA", "MNLI"])
def test_the_bootstrap_of_a_task_score_is_each_resamples_score_recomputed_by_scipy(task, monkeypatch):
    """The same resamples (indices drawn at once from the seed), each arm's task score recomputed
    resample by resample with scipy's correlations or by hand, averaged over its seeds; scored a
    few resamples at a time, as QQP's 40,000 examples are."""
    monkeypatch.setattr(glue_scores, "BOOTSTRAP_CELLS", 1000)  # 2 resamples of 3 seeds x 120 examples
    rng = np.random.default_rng(6)
    size, resamples = 120, 300
    if task == "STS-B":
        true, labels = rng.integers(0, 11, size) / 2, []
        arms = [[true + rng.normal(scale=noise, size=size).round(1) for _ in range(3)] for noise in (1, 2)]
    else:
        classes = 3 if task == "MNLI" else 2
        true, labels = rng.integers(0, classes, size), [str(label) for label in range(classes)]
        wrong = (true + 1) % classes
        arms = [[np.where(rng.random(size) < flip, wrong, true) for _ in range(3)] for flip in (0.2, 0.4)]

    def score(truth, predicted):
        if task == "STS-B":
            pearson = scipy_stats.pearsonr(truth, predicted)[0]
            return 50 * (pearson + scipy_stats.spearmanr(truth, predicted)[0])
        if task == "CoLA":
            return 100 * scipy_stats.pearsonr(truth, predicted)[0]  # binary Matthews = phi = Pearson's r
        if task == "MNLI":
            return 100 * np.mean(truth == predicted)  # matched accuracy: the first dev file's score
        true_positives = np.sum(truth & predicted)
        f1 = 2 * true_positives / (truth.sum() + predicted.sum())
        return 50 * (f1 + np.mean(truth == predicted))

    def gain(index):
        a, b = (np.mean([score(true[index], run[index]) for run in arm]) for arm in arms)
        return a - b

    indices = np.random.default_rng(0).integers(0, size, size=(resamples, size))
    gains = np.array([gain(index) for index in indices])
    as_given = (lambda v: [str(x) for x in v]) if labels else list
    verdict = paired_bootstrap_score(
        task, as_given(true), *[[as_given(run) for run in arm] for arm in arms], labels, resamples
    )
    assert verdict["gain"] == pytest.approx(gain(np.arange(size)), abs=1e-9)
    assert verdict["gain"] > 0
    assert [verdict["low"], verdict["high"]] == pytest.approx(np.percentile(gains, [2.5, 97.5]), abs=1e-9)
    assert verdict["p_value"] == min(1.0, 2 * np.count_nonzero(gains <= 0) / resamples)


def test_the_bootstrap_of_a_task_score_counts_a_resample_with_no_gain_against_either_sign():
    """SST-2's score averaged over 5 seeds in percent: a resample with no gain is not +-1e-14."""
    a, b, summed = five_seeds_with_many_tied_resamples()
    true = ["1"] * a.shape[1]
    arms = [[["1" if right else "0" for right in seed] for seed in arm] for arm in (a, b)]
    verdict = paired_bootstrap_score("SST-2", true, *arms, ["0", "1"], 2000)
    assert verdict["p_value"] == exact_p_value(summed, 2000, 0)


def test_the_table_gives_the_bootstrap_mean_gain_where_its_sign_is_not_the_median_gain():
    """Two seeds tie and one is 20 points behind: the median gain is 0, the mean that the bootstrap
    tests is -6.7 (p about 0.04); a p-value beside +0.0 alone would read as a gain."""
    true = ["1"] * 60 + ["0"] * 40
    right, wrong = ["1"] * 100, ["0"] * 100  # 60% and 40%

    def runs(predictions):
        return [
            {"seed": seed, "score": 60.0 if p is right else 40.0, "predicted": p} for seed, p in predictions
        ]

    def cells_against_right(*pretrained):
        scratch = runs([(1, right), (2, right), (3, right)])
        arms = runs(list(enumerate(pretrained, 1)))
        return comparison_cells(paired_comparison("SST-2", "classification", true, arms, scratch, ARMS))

    gain, p_sign, p_boot = cells_against_right(right, right, wrong)
    assert gain == "+0.0" and p_sign == "1.000" and p_boot.endswith(" (mean -6.7)")
    assert 0 < float(p_boot.split()[0]) < 0.1
    all_behind = cells_against_right(wrong, wrong, wrong)
    assert all_behind[0] == "-20.0" and "mean" not in all_behind[2]


def test_the_few_seeds_note_counts_one_seed_in_the_singular():
    assert few_seeds_note(1).startswith("1 seed supports no claim about pretraining; use 5 or more")
    assert few_seeds_note(3).startswith("3 seeds support no claim")


def test_the_majority_class_is_what_a_model_at_chance_scores():
    assert majority_label(["1", "0", "1"]) == "1" and majority_label(["1", "0", "1", "0"]) == "0"
    rng = random.Random(2)
    true = ["0"] * 160 + ["1"] * 140
    rng.shuffle(true)
    flip = {"0": "1", "1": "0"}
    runs = [  # pretrained: 1 in 5 wrong; scratch: a coin
        {"arm": arm, "seed": seed, "predicted": [t if rng.random() > rate else flip[t] for t in true]}
        for seed in (1, 2, 3)
        for arm, rate in (("pretrained", 0.2), ("scratch", 0.5))
    ]
    sst2 = majority_class(
        "SST-2", {"train_majority": "0", "true": true, "runs": runs}, ["pretrained", "scratch"]
    )
    assert sst2["label"] == "0" and sst2["dev"] == {"acc": pytest.approx(100 * 160 / 300)}
    assert not at_chance(sst2, "pretrained") and at_chance(sst2, "scratch")
    # MRPC's constant "paraphrase": precision p (the share of "1"), recall 1, so F1 = 2p / (1 + p)
    mrpc = majority_class("MRPC", {"train_majority": "1", "true": true, "runs": runs}, ["pretrained"])
    share = 140 / 300
    assert mrpc["dev"] == pytest.approx({"f1": 100 * 2 * share / (1 + share), "acc": 100 * share})
    assert mrpc["score"] == pytest.approx((mrpc["dev"]["f1"] + mrpc["dev"]["acc"]) / 2)
    report = {
        "average": {"pretrained": {}, "scratch": {}},
        "tasks": {"SST-2": {"majority": sst2}, "STS-B": {}},
    }
    assert chance_note(report).endswith("at chance: SST-2 (scratch)")
    sst2["above"]["pretrained"] = sst2["above"]["scratch"]
    assert chance_note(report).endswith("at chance: SST-2 (both arms)")


def test_mnlis_majority_class_and_published_rows_score_only_the_dev_files_the_benchmark_has():
    """The majority class is scored on matched alone, so it gets no MNLI score beside the arms' mean of
    matched and mismatched; without dev_mismatched.tsv the published rows' MNLI is matched alone too."""
    true = ["entailment", "neutral", "contradiction", "neutral"]
    runs = [{"arm": "pretrained", "seed": 1, "predicted": true}]
    mnli = majority_class("MNLI", {"train_majority": "neutral", "true": true, "runs": runs}, ["pretrained"])
    assert mnli["dev"] == {"acc_m": 50.0} and mnli["score"] is None
    tiny = published({"MNLI": {"acc_m"}, "SST-2": {"acc"}})["models"]["BERT-Tiny (2/128)"]
    assert tiny["tasks"]["MNLI"] == {"acc_m": 70.2}
    assert tiny["average_of_these_tasks"] == pytest.approx((70.2 + 83.2) / 2)


def test_the_shared_rte_and_mrpc_have_the_majority_classes_glue_reports():
    """RTE's training set leans to entailment by 8 pairs, its dev set by 15 of 277; MRPC's are paraphrases."""
    found, _ = find_tasks([SHARED_DATA], ["RTE", "MRPC"])
    rte, mrpc = (read_task(TASKS[name], found[name]) for name in ("RTE", "MRPC"))
    assert majority_label(rte.train.labels) == "entailment" and majority_label(mrpc.train.labels) == "1"
    dev = rte.dev["dev"].labels
    assert dev.count("entailment") / len(dev) == pytest.approx(146 / 277)


def test_the_majority_class_is_that_of_the_examples_trained_on(tmp_path):
    """A recipe's subset of RTE (max_train_examples) has its own most frequent label: the one counted
    in the training file glue writes, not the whole set's (entailment)."""
    found, _ = find_tasks([SHARED_DATA], ["RTE"])
    rte = read_task(TASKS["RTE"], found["RTE"])
    recipe, _ = read_recipes({}, "built in")
    majorities = set()
    for size in (9, 15, 21, 27, 33):
        files = write_task_files(tmp_path / str(size), rte, replace(recipe["RTE"], max_train_examples=size))
        written = [json.loads(line)["label"] for line in files.train.read_text(encoding="utf-8").splitlines()]
        counts = {label: written.count(label) for label in set(written)}
        assert len(written) == size and counts[files.majority] > size / 2
        majorities.add(files.majority)
    assert majorities == {"entailment", "not_entailment"}


# ------------------------------------------------------------------------------------------- recipes


def test_configs_glue_toml_holds_the_built_in_recipes():
    path = ROOT / "configs" / "glue.toml"
    assert read_recipes(load_toml(path), str(path)) == read_recipes(DEFAULT_RECIPES, "built in")
    header = path.read_text(encoding="utf-8").split("\n[")[0].splitlines()
    assert len(header) <= 6  # five lines and a blank one


def test_recipes_refuse_unknown_tables_keys_and_values():
    for table, message in (
        ({"squad": {}}, r"\[squad\] is not a GLUE task"),
        ({"RTE": {"lr": 1e-4}}, r"\[RTE\]: unknown setting 'lr'"),
        ({"rte": {"epochs": 1.5}}, r"\[RTE\]: epochs must be a whole number, got 1.5"),
        ({"default": {"warmup": 1.0}}, r"\[default\]: warmup must be in \[0, 1\), got 1.0"),
        ({"SST-2": {"batch_size": "32"}}, r"\[SST-2\]: batch_size must be a whole number, got '32'"),
        ({"MRPC": {"learning_rate": 0}}, r"\[MRPC\]: learning_rate must be in \(0, 1\], got 0"),
        ({"MRPC": {"max_length": 2}}, r"\[MRPC\]: max_length must be at least 4, got 2"),
        ({"sweep": {"batch_size": 16}}, r"\[sweep\]: batch_size must be a list"),
        ({"sweep": {"learning_rate": []}}, r"\[sweep\]: learning_rate must be a list of one or more"),
        ({"sweep": [3e-4, 1e-4]}, r"\[sweep\]: sweep must be a table of lists"),
        ({"sweep": {"batch_size": [16, 16]}}, r"\[sweep\]: batch_size lists a value twice"),
        ({"SST-2": 3e-4}, r"\[SST-2\] must be a table of recipe settings"),
        (
            {"rte": {"epochs": 1}, "RTE": {"epochs": 2}},
            r"f.toml: RTE has two tables \(names in other cases\)",
        ),
        ({"STS-B": {"both_orders": 1}}, r"\[STS-B\]: both_orders must be true or false, got 1"),
        ({"RTE": {"both_orders": True}}, r"\[RTE\]: both_orders is for pairs that mean the same in either"),
    ):
        with pytest.raises(BertforgeError, match=message):
            read_recipes(table, "f.toml")
    recipes, _ = read_recipes({"default": {"epochs": 2}, "sts-b": {"learning_rate": 3e-4}}, "f.toml")
    assert (
        recipes["STS-B"].epochs == 2 and recipes["STS-B"].learning_rate == 3e-4 and recipes["RTE"].epochs == 2
    )
    recipes, _ = read_recipes({"default": {"both_orders": True}}, "f.toml")  # the symmetric tasks take it
    assert {name for name, recipe in recipes.items() if recipe.both_orders} == {"MRPC", "STS-B", "QQP"}


def test_a_recipes_file_changes_what_it_sets_and_keeps_the_rest_built_in():
    """A task table with one setting keeps the task's built-in recipe for the others; the file's
    [default] reaches every task, even one whose built-in table sets the key; the file's own task
    table is above its [default]."""
    built_in, _ = read_recipes({}, "built in")
    recipes, _ = read_recipes({"sst-2": {"learning_rate": 1e-4}}, "f.toml")
    assert recipes["SST-2"] == replace(built_in["SST-2"], learning_rate=1e-4)
    assert (recipes["SST-2"].batch_size, recipes["SST-2"].epochs, recipes["SST-2"].max_length) == (128, 2, 64)
    assert {name: recipe for name, recipe in recipes.items() if name != "SST-2"} == {
        name: recipe for name, recipe in built_in.items() if name != "SST-2"
    }
    recipes, _ = read_recipes({"default": {"epochs": 3}, "MRPC": {"epochs": 1}}, "f.toml")
    assert {name: recipe.epochs for name, recipe in recipes.items()} == {
        name: 1 if name == "MRPC" else 3 for name in TASKS
    }
    assert recipes["STS-B"] == replace(built_in["STS-B"], epochs=3)  # its rate and both orders kept


def test_each_recipe_reads_as_a_line():
    built_in, _ = read_recipes({}, "built in")
    assert recipe_text(built_in["SST-2"]) == (
        "learning rate 0.0003, 2 epochs, batch 128, 64 tokens, warmup 0.1, dropout 0"
    )
    assert ", 1 epoch, " in recipe_text(replace(built_in["SST-2"], epochs=1))
    assert recipe_text(built_in["STS-B"]).endswith(
        "2 epochs, batch 16, 128 tokens, warmup 0.1, dropout 0, pairs in both orders"
    )
    assert recipe_text(built_in["QQP"]).split(", ")[-1] == "at most 50,000 training examples"


def test_both_orders_trains_on_each_pair_and_its_swap(tmp_path, small_tokenizer_dir):
    """STS-B's built-in recipe: glue writes each kept pair once and asks finetune for both orders,
    which trains on the pairs, then on the same pairs with their sentences swapped and the same scores."""
    recipes, _ = read_recipes(DEFAULT_RECIPES, "built in")
    assert recipes["STS-B"].both_orders and not recipes["RTE"].both_orders
    found, _ = find_tasks([SHARED_DATA], ["STS-B"])
    data = read_task(TASKS["STS-B"], found["STS-B"])
    recipe = replace(recipes["STS-B"], max_train_examples=40)
    files = write_task_files(tmp_path, data, recipe)
    rows = [json.loads(line) for line in files.train.read_text(encoding="utf-8").splitlines()]
    assert files.train_examples == len(rows) == 40 and len({(row["text"], row["pair"]) for row in rows}) == 40
    task = finetune_task(SimpleNamespace(model="unused"), data, files, recipe, [1], False)
    assert task.both_orders
    tokenizer = load_tokenizer(small_tokenizer_dir)
    train_set = task_data(task, tokenizer, 64).train_set
    texts, pairs = [row["text"] for row in rows], [row["pair"] for row in rows]
    encoded = [(example["input_ids"], example["token_type_ids"]) for example in train_set]
    expected = tokenizer.encode_pairs(texts, pairs, 64) + tokenizer.encode_pairs(pairs, texts, 64)
    assert encoded == [(list(ids), list(types)) for ids, types in expected]
    assert [example["label"] for example in train_set] == [float(row["label"]) for row in rows] * 2


# ----------------------------------------------------------------------------------------- benchmark

TINY_RECIPES = """
[default]
learning_rate = 3e-3
epochs = 1
batch_size = 8
max_length = 32
warmup = 0.0

[STS-B]
both_orders = true
"""


def tiny_bench(model: Path, data: Path, tmp_path: Path, **kwargs):
    recipes = tmp_path / "recipes.toml"
    recipes.write_text(TINY_RECIPES, encoding="utf-8")
    settings = dict(tasks=["RTE", "STS-B"], seeds=[1, 2], compare_scratch=True, precision="fp32")
    return benchmark(model, [data], recipes_file=recipes, **{**settings, **kwargs})


def counting_training(monkeypatch) -> list[Path]:
    trained = []

    def counted(objective, config, run_dir, **kwargs):
        trained.append(Path(run_dir))
        return train(objective, config, run_dir, **kwargs)

    monkeypatch.setattr("bertforge.finetune.train", counted)
    return trained


def interrupted_at(monkeypatch, run: int) -> list[Path]:
    """Fine-tuning that raises KeyboardInterrupt as run number `run` starts; the runs started, in order."""
    started = []

    def interrupting(objective, config, run_dir, **kwargs):
        started.append(Path(run_dir))
        if len(started) == run:
            raise KeyboardInterrupt
        return train(objective, config, run_dir, **kwargs)

    monkeypatch.setattr("bertforge.finetune.train", interrupting)
    return started


@pytest.mark.filterwarnings("ignore:.*seeds support no claim")
@pytest.mark.slow
def test_a_short_benchmark_with_both_arms_writes_its_report(
    tmp_path, tiny_pretrained_run, glue_dir, monkeypatch
):
    trained = counting_training(monkeypatch)
    out, said = tmp_path / "bench", []
    report = run_glue(
        tiny_bench(tiny_pretrained_run, glue_dir, tmp_path), out, show_progress=False, say=said.append
    )
    assert len(trained) == 8  # 2 tasks x 2 seeds x 2 arms
    assert {p.name for p in out.iterdir()} >= {"glue.json", "glue.md", "glue.png", "RTE", "STS-B", "data"}
    saved = json.loads((out / "glue.json").read_text(encoding="utf-8"))
    assert saved == json.loads(json.dumps(report))
    assert saved["tasks"].keys() == {"RTE", "STS-B"} and saved["machine"]["torch"]
    for name, figures in (("RTE", {"acc"}), ("STS-B", {"pearson", "spearman"})):
        task = saved["tasks"][name]
        assert task["recipe"]["epochs"] == 1 and task["train_examples"] == 24
        for arm in ("pretrained", "scratch"):
            runs = task["arms"][arm]["runs"]
            assert [r["seed"] for r in runs] == [1, 2] and all(set(r["dev"]) == figures for r in runs)
            scores = [r["score"] for r in runs]
            assert task["arms"][arm]["score"]["median"] == pytest.approx(sum(scores) / 2)
            assert (out / name / arm / "seed_1" / "final").is_dir()
        comparison = task["comparison"]
        assert [p["seed"] for p in comparison["pairs"]] == [1, 2]
        assert (
            comparison["sign_test"]["wins"]
            + comparison["sign_test"]["losses"]
            + comparison["sign_test"]["ties"]
            == 2
        )
    medians = [saved["tasks"][t]["arms"]["scratch"]["score"]["median"] for t in ("RTE", "STS-B")]
    assert saved["average"]["scratch"]["score"] == pytest.approx(sum(medians) / 2)
    assert saved["published"]["models"]["BERT-Mini (4/256)"]["average_of_these_tasks"] == pytest.approx(
        (57.9 + 74.35) / 2
    )
    markdown = (out / "glue.md").read_text(encoding="utf-8")
    assert (
        "| RTE | acc |" in markdown and "| average | score |" in markdown and "--compare-scratch" in markdown
    )
    assert "STS-B: trained on each pair in both orders" in markdown
    # RTE's 24 training pairs are half entailment: the tie goes to the first name, half of dev right
    assert (
        saved["tasks"]["RTE"]["majority"]["label"] == "entailment"
        and "majority" not in saved["tasks"]["STS-B"]
    )
    assert saved["tasks"]["RTE"]["majority"]["dev"] == {"acc": 50.0}
    assert "| pretrained | scratch | majority | gain |" in markdown and "| RTE | acc |" in markdown
    assert "- majority: the training set's most frequent label" in markdown
    assert len((out / "data" / "STS-B" / "train.jsonl").read_text(encoding="utf-8").splitlines()) == 24
    assert json.loads((out / "STS-B" / "finetune.json").read_text(encoding="utf-8"))["task"]["both_orders"]
    assert (out / "glue.png").read_bytes()[:4] == b"\x89PNG"
    groups, series = plotted_series(saved)
    assert groups == ["RTE", "STS-B", "average"]
    drawn = {label: values for label, values, _, _ in series}
    assert list(drawn) == [
        "pretrained (dev)",
        "from scratch (dev)",
        "majority class (dev)",
        *(f"{model}, published (test)" for model in PUBLISHED),
    ]
    for label, arm in (("pretrained (dev)", "pretrained"), ("from scratch (dev)", "scratch")):
        scores = [saved["tasks"][t]["arms"][arm]["score"]["median"] for t in ("RTE", "STS-B")]
        assert drawn[label] == [*scores, saved["average"][arm]["score"]]
    assert drawn["BERT-Mini (4/256), published (test)"] == pytest.approx([57.9, 74.35, (57.9 + 74.35) / 2])
    recipes = [
        f"{name}'s recipe: {recipe_text(Recipe(**saved['tasks'][name]['recipe']))}" for name in saved["tasks"]
    ]
    assert said == [*recipes, f"note: {few_seeds_note(2)}"]  # nothing skipped, no unlabelled test file


@pytest.mark.filterwarnings("ignore:.*seeds support no claim")
@pytest.mark.slow
def test_an_interrupted_benchmark_continues_without_running_finished_seeds(
    tmp_path, tiny_pretrained_run, glue_dir, monkeypatch
):
    bench, out = (
        tiny_bench(tiny_pretrained_run, glue_dir, tmp_path, tasks=["RTE"], seeds=[1, 2, 3]),
        tmp_path / "b",
    )
    interrupted_at(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        run_glue(bench, out, show_progress=False)
    finished = {p: p.stat().st_mtime_ns for p in out.glob("RTE/*/seed_*/result.json")}
    assert len(finished) == 3 and not (out / "glue.json").exists()

    trained = counting_training(monkeypatch)
    report = run_glue(bench, out, show_progress=False)  # the same settings: continues
    assert trained == [
        out / "RTE" / "scratch" / "seed_2",
        out / "RTE" / "pretrained" / "seed_3",
        out / "RTE" / "scratch" / "seed_3",
    ]
    assert {p: p.stat().st_mtime_ns for p in finished} == finished
    assert [r["seed"] for r in report["tasks"]["RTE"]["arms"]["scratch"]["runs"]] == [1, 2, 3]

    trained.clear()
    run_glue(None, out, resume=True, show_progress=False)
    assert trained == []
    with pytest.raises(BertforgeError, match=r"other settings \(seeds\)"):
        run_glue(
            tiny_bench(tiny_pretrained_run, glue_dir, tmp_path, tasks=["RTE"], seeds=[1, 2]),
            out,
            show_progress=False,
        )


def test_a_rerun_may_name_the_tasks_that_ran_of_a_benchmark_saved_with_all_nine(tmp_path, glue_dir):
    """Without --tasks all nine are saved, found or not: naming the ones that ran drops nothing."""
    out = tmp_path / "b"
    out.mkdir()
    everything = benchmark(glue_dir, [glue_dir], seeds=[1, 2])
    (out / "glue_task.json").write_text(json.dumps(asdict(everything)), encoding="utf-8")
    for name in ("RTE", "STS-B"):  # the tasks whose runs started
        (out / name).mkdir()
    ran = replace(
        everything, tasks=["RTE", "STS-B"], recipes={n: everything.recipes[n] for n in ("STS-B", "RTE")}
    )
    assert settled(ran, out, resume=False)[0].tasks == ["STS-B", "RTE"]  # the saved order
    with pytest.raises(BertforgeError, match=r"other settings \(tasks\); a rerun may add"):
        settled(replace(ran, tasks=["RTE"]), out, resume=False)


@pytest.mark.filterwarnings("ignore:.*seeds support no claim")
@pytest.mark.slow
def test_a_rerun_adds_tasks_seeds_and_the_scratch_arm_without_running_finished_runs_again(
    tmp_path, tiny_pretrained_run, glue_dir, monkeypatch
):
    out = tmp_path / "b"
    smaller = tiny_bench(
        tiny_pretrained_run, glue_dir, tmp_path, tasks=["RTE"], seeds=[1], compare_scratch=False
    )
    first = run_glue(smaller, out, show_progress=False, jobs=2)
    finished = (out / "RTE" / "seed_1" / "result.json").read_text(encoding="utf-8")
    assert first["machine"]["jobs"] == 1  # a run alone: no second worker to take half the threads

    trained = counting_training(monkeypatch)
    larger = tiny_bench(tiny_pretrained_run, glue_dir, tmp_path, tasks=["STS-B", "RTE"], seeds=[2, 1])
    report = run_glue(larger, out, show_progress=False)  # in this process, where training is counted
    new_runs = [("RTE", "scratch", 1), ("RTE", "pretrained", 2), ("RTE", "scratch", 2)] + [
        ("STS-B", arm, seed) for seed in (1, 2) for arm in ("pretrained", "scratch")
    ]
    assert sorted(trained) == sorted(out / task / arm / f"seed_{seed}" for task, arm, seed in new_runs)
    assert not (out / "RTE" / "seed_1").exists()  # the finished run became the pretrained arm's
    assert (out / "RTE" / "pretrained" / "seed_1" / "result.json").read_text(encoding="utf-8") == finished
    assert list(report["tasks"]) == ["RTE", "STS-B"]  # the benchmark's own first: the sweep's seed stays
    rte = report["tasks"]["RTE"]
    assert [run["seed"] for run in rte["arms"]["scratch"]["runs"]] == [1, 2]
    assert (
        rte["arms"]["pretrained"]["runs"][0]["score"]
        == first["tasks"]["RTE"]["arms"]["pretrained"]["runs"][0]["score"]
    )
    assert [pair["seed"] for pair in rte["comparison"]["pairs"]] == [1, 2]
    task = json.loads((out / "RTE" / "finetune.json").read_text(encoding="utf-8"))["task"]
    assert task["seeds"] == [1, 2] and task["compare_scratch"]

    trained.clear()
    run_glue(None, out, resume=True, show_progress=False)  # the grown settings were saved
    assert trained == []
    settings = json.loads((out / "glue_task.json").read_text(encoding="utf-8"))
    for recipe in settings["recipes"].values():  # as saved before recipes had both_orders
        if not recipe["both_orders"]:
            del recipe["both_orders"]
    (out / "glue_task.json").write_text(json.dumps(settings), encoding="utf-8")
    run_glue(larger, out, show_progress=False)  # the same command continues it
    assert trained == []
    with pytest.raises(BertforgeError, match=r"other settings \(compare_scratch\); a rerun may add"):
        run_glue(replace(larger, compare_scratch=False), out, show_progress=False)
    faster = {**larger.recipes["RTE"], "learning_rate": 1e-2}
    with pytest.raises(BertforgeError, match=r"other settings \(recipes\); a rerun may add"):
        run_glue(replace(larger, recipes={**larger.recipes, "RTE": faster}), out, show_progress=False)


@pytest.mark.filterwarnings("ignore:.*seeds support no claim")
@pytest.mark.slow
def test_a_stopped_benchmark_reports_the_tasks_it_keeps_and_finishes_the_rest_later(
    tmp_path, tiny_pretrained_run, glue_dir, monkeypatch, capsys
):
    from bertforge.cli import main

    bench = tiny_bench(tiny_pretrained_run, glue_dir, tmp_path, seeds=[1], compare_scratch=False)
    out, started = tmp_path / "b", interrupted_at(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        run_glue(bench, out, show_progress=False)
    assert started == [out / "RTE" / "seed_1", out / "STS-B" / "seed_1"]
    capsys.readouterr()  # the stopped run's lines

    trained = counting_training(monkeypatch)
    assert main(["glue", "--out", str(out), "--resume", "--tasks", "rte", "--quiet"]) == 0
    assert trained == []
    said, table = capsys.readouterr().out.split("\n", 1)
    assert said == (
        "the report will cover RTE only, of the benchmark's RTE, STS-B; continue it without --tasks to "
        "report them all"
    )
    assert "\nRTE " in table and "STS-B" not in table
    saved = json.loads((out / "glue.json").read_text(encoding="utf-8"))
    assert saved["tasks"].keys() == {"RTE"} and saved["settings"]["tasks"] == ["RTE", "STS-B"]
    assert json.loads((out / "glue_task.json").read_text(encoding="utf-8"))["tasks"] == ["RTE", "STS-B"]
    other = ["glue", "--out", str(out), "--resume", "--tasks", "mrpc"]
    message = assert_clean_failure(capsys, other, "has no MRPC (its tasks: RTE, STS-B)")
    assert "run its command again with them: bertforge glue --model" in message
    assert "--tasks RTE,STS-B,MRPC --seeds" in message

    assert main([*shlex.split(saved["command"])[1:], "--quiet"]) == 0  # the whole benchmark's command
    assert trained == [out / "STS-B" / "seed_1"]
    assert json.loads((out / "glue.json").read_text(encoding="utf-8"))["tasks"].keys() == {"RTE", "STS-B"}


def test_the_command_skips_a_missing_task_scores_test_files_and_prints_the_table(
    tmp_path, tiny_pretrained_run, glue_dir, capsys
):
    from bertforge.cli import main

    recipes = tmp_path / "recipes.toml"
    recipes.write_text(TINY_RECIPES, encoding="utf-8")
    shutil.rmtree(glue_dir / "WNLI")
    out = tmp_path / "cmd"
    argv = ["glue", "--model", str(tiny_pretrained_run), "--data", str(glue_dir), "--out", str(out)]
    assert (
        main(
            [
                *argv,
                "--tasks",
                "mrpc,mnli,wnli",
                "--seeds",
                "1",
                "--recipes",
                str(recipes),
                "--precision",
                "fp32",
            ]
        )
        == 0
    )
    printed = capsys.readouterr()
    assert printed.out.startswith(f"WNLI: skipped, no WNLI/ folder with a train.tsv in {glue_dir}\n")
    table = printed.out.split("\n\n")
    header = ["task", "figure", "pretrained", "majority", "Tiny*", "Mini*", "Small*"]
    assert table[2].split("\n")[0].split() == header
    assert "labelled test files:" in printed.out and "average" in printed.out
    progress = printed.err.strip().split("\n")  # not a terminal: a line per run
    assert progress[0].startswith("glue: 1/2 runs: MRPC pretrained seed 1 done, dev score ")
    assert progress[1].startswith("glue: 2/2 runs: MNLI pretrained seed 1 done")
    saved = json.loads((out / "glue.json").read_text(encoding="utf-8"))
    mnli, mrpc = saved["tasks"]["MNLI"]["arms"]["pretrained"], saved["tasks"]["MRPC"]["arms"]["pretrained"]
    assert set(mnli["dev"]) == {"acc_m", "acc_mm"} and mnli["score"]["median"] == pytest.approx(
        (mnli["dev"]["acc_m"]["median"] + mnli["dev"]["acc_mm"]["median"]) / 2
    )
    assert set(mrpc["test"]) == {"f1", "acc"} and saved["tasks"]["MRPC"]["test_examples"] == {"test": 10}
    majority = saved["tasks"]["MNLI"]["majority"]  # three classes of 8: the first name; matched alone
    assert majority["label"] == "contradiction" and set(majority["dev"]) == {"acc_m"}
    assert saved["skipped"] == [f"WNLI: skipped, no WNLI/ folder with a train.tsv in {glue_dir}"]
    assert_clean_failure(capsys, ["glue", "--out", str(out), "--resume", "--seeds", "1,2"], "drop --seeds")
    assert_clean_failure(capsys, ["glue", "--out", str(tmp_path / "x")], "glue needs --model and --data")
    for jobs in ("0", "two"):
        with pytest.raises(SystemExit) as exit_info:
            main([*argv[:-1], str(tmp_path / "j"), "--jobs", jobs])
        assert (
            exit_info.value.code == 2 and "give a whole number of runs, 1 or more" in capsys.readouterr().err
        )
    assert not (tmp_path / "j").exists()
    with pytest.raises(BertforgeError, match="`jobs` must be at least 1; got 0"):
        run_glue(tiny_bench(tiny_pretrained_run, glue_dir, tmp_path), tmp_path / "j", jobs=0)
    assert not (tmp_path / "j").exists()
    assert_clean_failure(
        capsys, [*argv[:-1], str(tmp_path / "y"), "--tasks", "squad"], "'squad' is not a GLUE task"
    )
    recipes.write_text("[default]\nmax_length = 100\n", encoding="utf-8")  # the tiny model has 64 positions
    too_long = [*argv[:-1], str(tmp_path / "z"), "--tasks", "rte", "--recipes", str(recipes), "--quiet"]
    message = f"{recipes}: RTE's max_length 100 is more than the 64 positions of the model"
    assert_clean_failure(capsys, too_long, message)
    assert not (tmp_path / "z").exists()  # nothing half-made is left


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"recipes": {}}, "it has no whole recipe for RTE"),
        (
            {"recipes": {"RTE": {**asdict(read_recipes({}, "built in")[0]["RTE"]), "epochs": "two"}}},
            "RTE's recipe: epochs must be a whole number, got 'two'",
        ),
        ({"tasks": ["RTE", "SQuAD"]}, "'SQuAD' is not a GLUE task"),
        ({"seeds": "1,2"}, "its seeds or tasks are not lists of numbers and names"),
        ({"data": "glue"}, "its model or data is not a path"),
        ({"colour": "red"}, "an unknown setting 'colour'"),
        ({"model": "removed"}, "it lacks settings every benchmark has"),
    ],
)
def test_a_damaged_settings_file_is_one_error_naming_it(tmp_path, glue_dir, capsys, change, problem):
    out = tmp_path / "bench"
    out.mkdir()
    settings = {**asdict(benchmark(tmp_path / "model", [glue_dir], tasks=["rte"])), **change}
    settings = {key: value for key, value in settings.items() if value != "removed"}
    (out / "glue_task.json").write_text(json.dumps(settings), encoding="utf-8")
    message = f"glue_task.json is damaged ({problem}"
    assert_clean_failure(capsys, ["glue", "--out", str(out), "--resume", "--quiet"], message)
    again = [
        "glue",
        "--model",
        str(tmp_path / "model"),
        "--data",
        str(glue_dir),
        "--out",
        str(out),
        "--quiet",
    ]
    assert_clean_failure(capsys, again, message)
    assert sorted(p.name for p in out.iterdir()) == ["glue_task.json"]


def test_tasks_that_name_no_task_are_refused(tmp_path, glue_dir, capsys):
    argv = ["glue", "--model", str(tmp_path / "model"), "--data", str(glue_dir), "--out", str(tmp_path / "b")]
    for tasks in ("", ",", " , "):
        assert_clean_failure(capsys, [*argv, "--tasks", tasks], "--tasks names no task")
    assert not (tmp_path / "b").exists()


def test_compare_scratch_with_one_seed_is_refused_before_anything_runs(tmp_path, glue_dir, capsys):
    out = tmp_path / "b"
    argv = ["glue", "--model", str(tmp_path / "model"), "--data", str(glue_dir), "--out", str(out)]
    message = "--compare-scratch pairs the arms seed by seed and needs --seeds with at least 2 seeds"
    assert_clean_failure(capsys, [*argv, "--seeds", "3", "--compare-scratch"], message)
    assert not out.exists()


def test_the_sweep_keeps_the_best_recipe_on_dev_and_says_so(
    tmp_path, tiny_pretrained_run, glue_dir, monkeypatch
):
    recipes = tmp_path / "recipes.toml"
    recipes.write_text(
        TINY_RECIPES + "\n[sweep]\nlearning_rate = [3e-3, 1e-4]\nbatch_size = [4]\n", encoding="utf-8"
    )
    ends = []  # the progress's work done and planned, as it closes: the sweep's runs weighed alike
    close = RunsProgress.close
    monkeypatch.setattr(
        RunsProgress, "close", lambda self: (ends.append((self.done_work, self.total)), close(self))
    )
    labels, advance = [], RunsProgress.advance
    monkeypatch.setattr(
        RunsProgress,
        "advance",
        lambda self, key, label, *rest: (labels.append(label), advance(self, key, label, *rest)),
    )
    bench = benchmark(
        tiny_pretrained_run, [glue_dir], ["RTE"], [1], sweep=True, recipes_file=recipes, precision="fp32"
    )
    out, said = tmp_path / "sweep", []
    report = run_glue(bench, out, show_progress=False, say=said.append, jobs=2)  # the grid's points at once
    task = report["tasks"]["RTE"]
    # the task's own recipe first (TINY_RECIPES: 3e-3, batch 8), then the grid's points
    assert [(p["learning_rate"], p["batch_size"]) for p in task["sweep"]] == [(3e-3, 8), (3e-3, 4), (1e-4, 4)]
    assert len(ends) == 1 and ends[0][0] == ends[0][1] > 0
    best = max(task["sweep"], key=lambda p: p["score"])  # the first among equals
    assert (task["recipe"]["learning_rate"], task["recipe"]["batch_size"]) == (
        best["learning_rate"],
        best["batch_size"],
    )
    assert task["recipe_chosen_on_dev"]
    assert said == [
        f"RTE's recipe: {recipe_text(Recipe(**bench.recipes['RTE']))}",
        f"RTE: --sweep chose learning rate {best['learning_rate']:g}, batch size {best['batch_size']} on dev "
        "(seed 1); "
        "its dev figures are optimistic",
    ]
    points = sorted(p.name for p in (out / "sweep" / "RTE").iterdir())
    assert points == ["lr0.0001-bs4", "lr0.003-bs4", "lr0.003-bs8"]
    assert sorted(labels) == ["RTE pretrained seed 1"] + [
        f"RTE pretrained seed 1 (sweep {p})" for p in points
    ]
    markdown = (out / "glue.md").read_text(encoding="utf-8")
    assert (
        "| RTE† | acc |" in markdown
        and "chosen on dev by --sweep: its dev figures are optimistic" in markdown
    )


def test_a_recipe_longer_than_the_pretrained_sequences_is_warned_about_naming_the_task(
    tmp_path, tiny_pretrained_run, glue_dir
):
    short = tmp_path / "short"  # pretrained on 16-token sequences; the recipes fine-tune at 32
    shutil.copytree(tiny_pretrained_run / "final", short)
    config = json.loads((short / "config.json").read_text(encoding="utf-8"))
    config["data"]["max_seq_length"] = 16
    (short / "config.json").write_text(json.dumps(config), encoding="utf-8")
    bench = tiny_bench(short, glue_dir, tmp_path, tasks=["RTE"], seeds=[1], compare_scratch=False)
    with pytest.warns(UserWarning) as caught:
        run_glue(bench, tmp_path / "out", show_progress=False)
    said = [warning for warning in caught if "pretrained on sequences" in str(warning.message)]
    expected = f"RTE: {short} was pretrained on sequences of up to 16 tokens"
    assert said and all(str(warning.message).startswith(expected) for warning in said)
    # from where fine-tuning raised it, so that the command prints it as one `bertforge: warning:` line
    assert {Path(warning.filename).name for warning in said} == {"finetune.py"}


def test_the_sweep_tries_the_tasks_own_recipe_first_and_each_grid_point_once():
    grid = {"learning_rate": [3e-4, 1e-4], "batch_size": [16, 32]}
    own_in_grid = Recipe(**{**DEFAULT_RECIPES["default"], "learning_rate": 1e-4, "batch_size": 32})
    assert sweep_points(grid, own_in_grid) == [(1e-4, 32), (3e-4, 16), (3e-4, 32), (1e-4, 16)]
    own_outside = Recipe(**{**DEFAULT_RECIPES["default"], "learning_rate": 2e-4, "batch_size": 16})
    assert sweep_points(grid, own_outside) == [(2e-4, 16), (3e-4, 16), (3e-4, 32), (1e-4, 16), (1e-4, 32)]


def run_figures(report: dict) -> dict:
    """Every run's dev figures and predictions, by task, arm and seed."""
    return {
        (name, arm, run["seed"]): (run["dev"], run["best_epoch"], scored_predictions(run["folder"]))
        for name, task in report["tasks"].items()
        for arm, summary in task["arms"].items()
        for run in summary["runs"]
    }


def scored_predictions(run_folder: str) -> list:
    return json.loads((Path(run_folder) / "glue_scores.json").read_text(encoding="utf-8"))["predicted"]


def test_the_eta_weighs_each_run_by_the_tokens_it_trains_on(small_tokenizer_dir):
    """A run's weight for the ETA, against the tokenizer's own count of what it trains on: the same
    ratio for each shared task (their runs' optimizer steps a second differ 3.2x, tokens a second 18%)."""
    tokenizer = load_tokenizer(small_tokenizer_dir)
    recipes, _ = read_recipes(DEFAULT_RECIPES, "built in")
    found, _ = find_tasks([SHARED_DATA], ["SST-2", "MRPC", "STS-B", "RTE"])
    ratios = []
    for name, folder in found.items():
        train, recipe = read_task(TASKS[name], folder).train, recipes[name]
        counted = sum(
            len(ids) for ids, _ in tokenizer.encode_pairs(train.texts, train.pairs, recipe.max_length)
        )
        estimated = run_tokens(train, len(train), recipe.epochs, recipe.max_length)
        ratios.append(estimated / (recipe.epochs * counted))
    assert len(ratios) == 4 and max(ratios) / min(ratios) < 1.25, ratios


def test_the_eta_of_runs_side_by_side_counts_the_work_of_the_runs_under_way(monkeypatch, capsys):
    """Two workers take twelve runs of 5-15 minutes in turn, each at one unit of work a second: after
    each run ends, the ETA is when the last one will end, within the minute it rounds to and a tenth.
    The runs share one label, as a sweep's grid points do; their folders tell them apart.
    The ended runs' work over the wall time alone gave none after the first run, and 68 minutes after
    the second, with 40 left."""
    now = [0.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    work = [60 * minutes for minutes in [5, 15, 10, 5, 15, 10, 5, 5, 15, 10, 10, 5]]
    keys = {"before": 600} | {f"lr{run}/seed_1": units for run, units in enumerate(work)}
    progress = RunsProgress("glue", keys, [True] + [False] * len(work), True, "token", at_once=2)
    free, events = [0.0, 0.0], []  # events: (time, 0 for an end, 1 for a start, run)
    for run, units in enumerate(work):
        worker = free.index(min(free))
        events += [(free[worker], 1, run), (free[worker] + units, 0, run)]
        free[worker] += units
    truths = []
    for now[0], kind, run in sorted(events):
        if kind:
            progress.start(f"lr{run}/seed_1")
        else:
            progress.advance(f"lr{run}/seed_1", "SST-2 seed 1", False, "dev score 50.0")
            truths.append((max(free) - now[0]) / 60)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "glue: 2/13 runs: SST-2 seed 1 done, dev score 50.0; about 50 min left"
    assert lines[-1] == "glue: 13/13 runs: SST-2 seed 1 done, dev score 50.0"  # the run done before counts
    for line, truth in zip(lines[:-1], truths, strict=False):
        eta = re.search(r"about (\d+) min left|under a minute left", line)
        minutes = 0.5 if eta[1] is None else int(eta[1])
        assert abs(minutes - truth) <= 0.5 + 0.1 * truth, (line, truth)


def test_the_eta_of_runs_one_after_another_is_their_pace_over_the_work_left(monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    work = {"seed 0": 100, "seed 1": 300, "seed 2": 300, "seed 3": 600}
    progress = RunsProgress("finetune", work, [True, False, False, False], True)
    now[0] = 150.0  # 300 steps in 150 s: 900 left at 2 a second
    progress.advance("seed 1", "seed 1", False, "accuracy 0.8")
    now[0] = 300.0
    progress.advance("seed 2", "seed 2", False, "accuracy 0.8")
    assert capsys.readouterr().err.splitlines() == [
        "finetune: 2/4 runs: seed 1 done, accuracy 0.8; about 8 min left",
        "finetune: 3/4 runs: seed 2 done, accuracy 0.8; about 5 min left",
    ]


def test_a_log_gets_a_line_a_minute_while_runs_are_under_way(monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    work = {"seed 1": 600, "seed 2": 600, "seed 3": 600}
    progress = RunsProgress("finetune", work, [False, False, False], True, at_once=2)
    progress.start("seed 1")
    progress.start("seed 2")
    for now[0] in (30.0, 59.0, 61.0, 90.0):
        progress.tick()
    now[0] = 120.0
    progress.advance("seed 1", "seed 1", False, "accuracy 0.8")
    progress.start("seed 3")
    for now[0] in (150.0, 179.0, 181.0):
        progress.tick()
    assert capsys.readouterr().err.splitlines() == [
        "finetune: 0/3 runs done, 2 under way, 1:01 so far",
        "finetune: 1/3 runs: seed 1 done, accuracy 0.8; about 1 min left",
        "finetune: 1/3 runs done, 2 under way, 3:01 so far; under a minute left",
    ]


@pytest.mark.filterwarnings("ignore:.*seeds support no claim")
@pytest.mark.slow
def test_runs_in_parallel_workers_end_as_the_serial_runs_and_a_stopped_one_resumes_to_them(
    tmp_path, tiny_pretrained_run, glue_dir, monkeypatch
):
    bench = tiny_bench(tiny_pretrained_run, glue_dir, tmp_path, tasks=["STS-B"])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # the workers' share of 2 threads: the same arithmetic
        serial = run_figures(run_glue(bench, tmp_path / "serial", show_progress=False))
        torch.set_num_threads(2)
        advance = RunsProgress.advance

        def signal_after_the_first_run(self, *args):
            advance(self, *args)
            if self.runs_done == 1:
                os.kill(os.getpid(), signal.SIGTERM)  # SIGINT: ignored in a background job

        monkeypatch.setattr(RunsProgress, "advance", signal_after_the_first_run)
        out = tmp_path / "stopped"
        with pytest.raises(
            Interrupted, match=rf"continue with: bertforge glue --out {out} --resume --jobs 2$"
        ):
            run_glue(bench, out, show_progress=False, jobs=2)
        assert 1 <= len(list(out.glob("*/*/seed_*/result.json"))) < 4 and not (out / "glue.json").exists()
        monkeypatch.setattr(RunsProgress, "advance", advance)
        report = run_glue(None, out, resume=True, show_progress=False, jobs=2)
        assert run_figures(report) == serial
        assert report["machine"]["jobs"] == 2
        arms = [arm for task in report["tasks"].values() for arm in task["arms"].values()]
        assert all([run["seed"] for run in arm["runs"]] == [1, 2] for arm in arms)  # in the order given
        # Stopped with one run left to train and one to score: they get a worker's share of the
        # threads, as in the uninterrupted benchmark, not all of them (which changes the last bits).
        shutil.rmtree(out / "STS-B" / "scratch" / "seed_2")
        (out / "STS-B" / "pretrained" / "seed_1" / SCORES).unlink()
        (out / "glue.json").unlink()
        again = run_glue(None, out, resume=True, show_progress=False, jobs=2)
        assert run_figures(again) == serial
        assert (again["machine"]["jobs"], again["machine"]["threads_per_run"]) == (1, 1)  # one worker
    finally:
        torch.set_num_threads(threads)


@pytest.mark.filterwarnings("ignore:.*seeds support no claim")
def test_a_benchmark_stopped_in_its_first_run_keeps_the_checkpoint_and_resumes_to_the_same_figures(
    tmp_path, tiny_pretrained_run, glue_dir, monkeypatch
):
    recipes = tmp_path / "two-epochs.toml"
    recipes.write_text(TINY_RECIPES.replace("epochs = 1", "epochs = 2"), encoding="utf-8")
    settings = dict(tasks=["RTE"], seeds=[1], compare_scratch=False, precision="fp32")
    bench = benchmark(tiny_pretrained_run, [glue_dir], recipes_file=recipes, **settings)
    full = run_figures(run_glue(bench, tmp_path / "full", show_progress=False))
    evaluate = EpochEvaluator.__call__

    def stopped_in_epoch_2(self, model):
        if self.epoch == 2:
            raise KeyboardInterrupt  # after epoch 1's checkpoint, before epoch 2's
        return evaluate(self, model)

    monkeypatch.setattr(EpochEvaluator, "__call__", stopped_in_epoch_2)
    out = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        run_glue(bench, out, show_progress=False)
    assert list(out.glob("RTE/seed_1/checkpoints/step_*")) and not list(out.rglob("result.json"))
    monkeypatch.setattr(EpochEvaluator, "__call__", evaluate)
    assert run_figures(run_glue(None, out, resume=True, show_progress=False)) == full


def test_a_dev_file_added_after_a_run_is_scored_on_resume_without_training_again(
    tmp_path, tiny_pretrained_run, glue_dir, monkeypatch
):
    mismatched = glue_dir / "MNLI" / "dev_mismatched.tsv"
    kept = mismatched.read_bytes()
    mismatched.unlink()
    bench = tiny_bench(
        tiny_pretrained_run, glue_dir, tmp_path, tasks=["MNLI"], seeds=[1], compare_scratch=False
    )
    out = tmp_path / "b"
    (before,) = run_glue(bench, out, show_progress=False, jobs=1)["tasks"]["MNLI"]["arms"]["pretrained"][
        "runs"
    ]
    assert set(before["dev"]) == {"acc_m"}
    mismatched.write_bytes(kept)
    trained = counting_training(monkeypatch)
    (after,) = run_glue(None, out, resume=True, show_progress=False, jobs=1)["tasks"]["MNLI"]["arms"][
        "pretrained"
    ]["runs"]
    assert trained == [] and set(after["dev"]) == {"acc_m", "acc_mm"}
    assert after["dev"]["acc_m"] == before["dev"]["acc_m"]
    assert after["score"] == (after["dev"]["acc_m"] + after["dev"]["acc_mm"]) / 2
    scores = out / "MNLI" / "seed_1" / SCORES  # as written before it named its files: kept as it is
    old = {k: v for k, v in json.loads(scores.read_text(encoding="utf-8")).items() if k != "files"}
    scores.write_text(json.dumps(old), encoding="utf-8")
    run_glue(None, out, resume=True, show_progress=False, jobs=1)
    assert json.loads(scores.read_text(encoding="utf-8")) == old


def test_the_settings_keep_absolute_paths_so_a_benchmark_resumes_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipes = tmp_path / "recipes.toml"
    recipes.write_text("[RTE]\nepochs = 1\n", encoding="utf-8")
    bench = benchmark("runs/mini", ["data/glue", "data/sst-2"], tasks=["rte"], recipes_file="recipes.toml")
    assert bench.model == str(tmp_path / "runs" / "mini")
    assert bench.data == [str(tmp_path / "data" / "glue"), str(tmp_path / "data" / "sst-2")]
    assert bench.recipes_file == str(recipes)


def test_a_damaged_scores_file_is_scored_again_on_resume_and_a_classifier_benchmarked_is_noted(
    tmp_path, tiny_pretrained_run, glue_dir, monkeypatch
):
    bench = tiny_bench(
        tiny_pretrained_run, glue_dir, tmp_path, tasks=["RTE"], seeds=[1], compare_scratch=False
    )
    out = tmp_path / "b"
    before = run_figures(run_glue(bench, out, show_progress=False, jobs=1))
    scores = out / "RTE" / "seed_1" / SCORES
    scores.write_text("{", encoding="utf-8")  # as a disk that lost the file's end would leave it
    trained = counting_training(monkeypatch)
    after = run_figures(run_glue(None, out, resume=True, show_progress=False, jobs=1))
    assert after == before and trained == []  # scored again from final/ (its predictions read back)

    said, classifier = [], out / "RTE" / "seed_1"
    run_glue(replace(bench, model=str(classifier)), tmp_path / "c", show_progress=False, say=said.append)
    assert said[0].startswith(f"note: {classifier / 'final'} is a fine-tuned classifier; glue fine-tunes")
