"""`bertforge finetune` and `bertforge classify`: help, an end-to-end run, export parity, the comparison
with a from-scratch arm, bad input."""

from __future__ import annotations

import json
import random
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from conftest import assert_clean_failure
from safetensors.torch import save_file

import bertforge
from bertforge.cli import main
from bertforge.finetune import (
    PAIR_BATCH_SIZE,
    PAIR_EPOCHS,
    PAIR_LEARNING_RATE,
    default_learning_rate,
    finetuning_config,
)
from bertforge.glue_recipes import DEFAULT_RECIPES

WORDS = {
    "yes": ("album", "song", "single", "music"),
    "no": ("army", "battle", "war", "game"),
}


def pair_rows(count: int, seed: int) -> list[tuple[str, str, str]]:
    """(question, answer, label): the label says whether the answer is on the question's topic."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        topic = ("yes", "no")[i % 2]
        label = ("yes", "no")[rng.randint(0, 1)]
        other = topic if label == "yes" else ("no" if topic == "yes" else "yes")
        question = " ".join(rng.choices(WORDS[topic], k=3))
        answer = " ".join(rng.choices(WORDS[other], k=3))
        rows.append((question, answer, label))
    return rows


def write_csv(path: Path, rows, header: str = "question,answer,label") -> Path:
    path.write_text(header + "\n" + "".join(",".join(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("pairs")
    return write_csv(folder / "train.csv", pair_rows(48, 0)), write_csv(
        folder / "valid.csv", pair_rows(16, 1)
    )


def finetune_argv(model: Path, train: Path, valid: Path, out: Path, *extra: str) -> list[str]:
    return [
        "finetune",
        "--model",
        str(model),
        "--train",
        str(train),
        "--valid",
        str(valid),
        "--text-column",
        "question",
        "--text-pair-column",
        "answer",
        "--label-column",
        "label",
        "--out",
        str(out),
        "--max-length",
        "32",
        "--batch-size",
        "8",
        "--lr",
        "3e-3",
        "--quiet",
        *extra,
    ]


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, tiny_pretrained_run, data) -> Path:
    out = tmp_path_factory.mktemp("finetuned") / "run"
    assert main(finetune_argv(tiny_pretrained_run, *data, out, "--epochs", "2")) == 0
    return out


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "finetune" in out and "classify" in out
    for argv, flag in (
        (["finetune", "--help"], "--from-scratch"),
        (["finetune", "--help"], "--compare-scratch"),
        (["classify", "--help"], "--json"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0 and flag in capsys.readouterr().out


def test_finetune_writes_a_classifier_folder(finetuned):
    final = finetuned / "final"
    assert json.loads((final / "labels.json").read_text()) == {"labels": ["no", "yes"], "pairs": True}
    for name in ("model.safetensors", "config.json", "tokenizer.json", "vocab.txt"):
        assert (final / name).is_file()
    for name in ("metrics.jsonl", "curves.png", "result.json", "finetune.json", "config.json"):
        assert (finetuned / name).is_file()
    result = json.loads((finetuned / "result.json").read_text())
    assert result["epochs"] == 2 and result["best_epoch"] in (1, 2) and result["steps"] == 12


def test_classify_texts_pairs_and_files(tmp_path, capsys, finetuned):
    with pytest.warns(UserWarning, match="fine-tuned on text pairs, and 1 of 2 texts have no tab"):
        assert main(["classify", "--model", str(finetuned), "album song", "war\tbattle army"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].endswith("war\tbattle army")
    label, score, _ = lines[0].split("\t", 2)
    assert label in ("yes", "no") and 0.5 <= float(score) <= 1.0

    inputs = tmp_path / "texts.txt"
    inputs.write_text("album song\tsingle music\nwar\tsong\n", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pairs, as the model was trained: no warning
        assert main(["classify", "--model", str(finetuned / "final"), "--input", str(inputs), "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in records] == ["album song\tsingle music", "war\tsong"]
    assert all(sum(r["probabilities"].values()) == pytest.approx(1.0) for r in records)
    assert all(r["score"] == max(r["probabilities"].values()) for r in records)


def test_a_resume_of_a_finished_run_says_it_had_finished(tmp_path, capsys, finetuned):
    run = tmp_path / "run"
    shutil.copytree(finetuned, run)
    assert main(["finetune", "--out", str(run), "--resume"]) == 0
    assert capsys.readouterr().out.startswith("\nthe run had already finished; nothing was trained\n")


@pytest.mark.parametrize(
    "texts, message",
    [
        (["album song\t"], "text 1 of 1: its second text gives no tokens"),
        (["war\tsong", "\u200b\tsong"], "text 2 of 2: its text gives no tokens"),
        (["\u200b\t\u200b"], "text 1 of 1: its text and its second text give no tokens"),
    ],
)
def test_classify_refuses_a_text_or_half_of_a_pair_without_tokens(capsys, finetuned, texts, message):
    """Its input would be [CLS] a [SEP] [SEP]; Hugging Face's pipeline reads an empty second text as none."""
    assert_clean_failure(capsys, ["classify", "--model", str(finetuned), *texts], message)


def test_classify_warns_of_inputs_unlike_the_training_and_an_export_keeps_what_they_were(tmp_path, finetuned):
    from bertforge.classifier import classify, warn_unlike_training
    from bertforge.export import export_model
    from bertforge.folders import open_classifier

    with pytest.warns(UserWarning, match="fine-tuned on single texts, and 1 of 3 texts have a tab"):
        warn_unlike_training(False, [None, "b", None])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_unlike_training(None, [None, "b"])  # a folder that does not say: no warning
        warn_unlike_training(False, [None, None])
        warn_unlike_training(True, ["a", "b"])

    export_model(finetuned, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "labels.json").read_text())["pairs"] is True
    with pytest.warns(UserWarning, match="fine-tuned on text pairs, and 1 of 1 texts have no tab"):
        assert main(["classify", "--model", str(tmp_path / "hf"), "album song"]) == 0
    long_pair = "album song\t" + "song " * 300
    for folder in (finetuned, tmp_path / "hf"):  # an export is read at the length it was fine-tuned at
        with pytest.warns(
            UserWarning, match="1 of 2 texts are longer than the 32 tokens the model reads"
        ) as got:
            assert main(["classify", "--model", str(folder), "album\tsong", long_pair]) == 0
        # raised from bertforge's code, not torch's inference_mode wrapper: the CLI prints it as one line
        assert Path(bertforge.__file__).parent in Path(got[0].filename).resolve().parents
    model, tokenizer, labels, _ = open_classifier(finetuned)
    assert model.config.max_position_embeddings > 32
    long_second = [long_pair.split("\t")[1]]
    with pytest.warns(UserWarning, match="longer than the 32 tokens"):  # the API reads as the CLI does
        by_default = classify(model, tokenizer, labels, ["album"], long_second)
    at_32 = classify(model, tokenizer, labels, ["album"], long_second, 32, warn_truncated=False)
    assert by_default == at_32
    with warnings.catch_warnings():  # glue cuts dev texts at its recipe's length, as in training: no warning
        warnings.simplefilter("error")
        classify(model, tokenizer, labels, ["album"], [long_pair.split("\t")[1]], 32, warn_truncated=False)


def test_export_gives_the_same_probabilities_in_transformers(tmp_path, finetuned):
    transformers = pytest.importorskip("transformers")
    from bertforge.classifier import classify
    from bertforge.export import export_model
    from bertforge.folders import open_classifier

    export_model(finetuned, tmp_path / "hf")
    texts, pairs = ["album song single", "war battle"], ["music song", "album"]
    model, tokenizer, labels, config = open_classifier(finetuned)
    ours = classify(model, tokenizer, labels, texts, pairs)

    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf.config.id2label == {0: "no", 1: "yes"}
    encoded = hf_tokenizer(texts, pairs, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = torch.softmax(hf(**encoded).logits, dim=-1)
    for row, result in zip(theirs.tolist(), ours, strict=True):
        assert max(abs(a - result["probabilities"][hf.config.id2label[i]]) for i, a in enumerate(row)) <= 1e-5

    pipe = transformers.pipeline("text-classification", model=hf, tokenizer=hf_tokenizer, top_k=None)
    scores = pipe({"text": texts[0], "text_pair": pairs[0]})
    by_label = {s["label"]: s["score"] for s in scores}
    assert max(abs(by_label[k] - v) for k, v in ours[0]["probabilities"].items()) <= 1e-5

    model, tokenizer, labels, _ = open_classifier(tmp_path / "hf")  # the exported folder classifies too
    again = classify(model, tokenizer, labels, texts, pairs)
    assert [r["label"] for r in again] == [r["label"] for r in ours]


def test_seeds_report_median_and_spread_and_resume_finishes(tmp_path, capsys, tiny_pretrained_run, data):
    out = tmp_path / "seeds"
    assert (
        main(finetune_argv(tiny_pretrained_run, *data, out, "--epochs", "1", "--seeds", "1,2", "--jobs", "2"))
        == 0
    )
    printed = capsys.readouterr().out
    assert "accuracy: median" in printed and "over 2 seeds" in printed
    assert re.search(r"min for 2 runs by the runs' clocks \(.* min this invocation\), 2 at a time", printed)
    for jobs in ("0", "two"):
        with pytest.raises(SystemExit) as exit_info:
            main(finetune_argv(tiny_pretrained_run, *data, tmp_path / "j", "--seeds", "1,2", "--jobs", jobs))
        assert exit_info.value.code == 2 and "whole number of runs" in capsys.readouterr().err
    assert not (tmp_path / "j").exists()
    assert (out / "seed_1" / "final").is_dir() and (out / "seed_2" / "final").is_dir()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [1, 2] and set(summary["accuracy"]) == {
        "n",
        "median",
        "min",
        "max",
        "mean",
        "std",
        "spread",
    }
    assert main(["finetune", "--out", str(out), "--resume", "--quiet"]) == 0  # nothing left to do
    assert "accuracy: median" in capsys.readouterr().out
    assert_clean_failure(capsys, ["classify", "--model", str(out), "x"], "one fine-tuning run per seed")


def test_resume_with_more_seeds_runs_only_the_new_ones(tmp_path, capsys, tiny_pretrained_run, data):
    out = tmp_path / "more-seeds"
    assert (
        main(finetune_argv(tiny_pretrained_run, *data, out, "--epochs", "1", "--seeds", "1,2", "--jobs", "1"))
        == 0
    )
    first = (out / "seed_1" / "result.json").read_text()
    stamp = (out / "seed_1" / "result.json").stat().st_mtime_ns
    assert_clean_failure(
        capsys, ["finetune", "--out", str(out), "--resume", "--seeds", "1,3"], "--seeds 1,2,3"
    )
    assert json.loads((out / "finetune.json").read_text())["task"]["seeds"] == [1, 2]  # refused: unchanged
    assert main(["finetune", "--out", str(out), "--resume", "--seeds", "1,2,3", "--quiet"]) == 0
    assert "over 3 seeds" in capsys.readouterr().out
    assert (out / "seed_1" / "result.json").read_text() == first
    assert (out / "seed_1" / "result.json").stat().st_mtime_ns == stamp  # not run again
    assert json.loads((out / "seed_3" / "result.json").read_text())["seed"] == 3
    assert json.loads((out / "summary.json").read_text())["seeds"] == [1, 2, 3]
    assert json.loads((out / "finetune.json").read_text())["task"]["seeds"] == [1, 2, 3]
    assert main(["finetune", "--out", str(out), "--resume", "--quiet"]) == 0  # the saved task has 3 seeds
    assert "over 3 seeds" in capsys.readouterr().out


def test_resume_refuses_changed_data_and_writes_nothing(tmp_path, capsys, tiny_pretrained_run, data):
    train, valid = (Path(shutil.copy(f, tmp_path / f.name)) for f in data)
    out = tmp_path / "run"
    argv = finetune_argv(
        tiny_pretrained_run, train, valid, out, "--epochs", "1", "--seeds", "1,2", "--jobs", "1"
    )
    assert main(argv) == 0
    saved = (out / "finetune.json").read_text()
    train.write_text(train.read_text() + train.read_text().splitlines()[-1] + "\n")
    argv = ["finetune", "--out", str(out), "--resume", "--seeds", "1,2,3"]
    assert_clean_failure(capsys, argv, "data changed since the run")
    assert (out / "finetune.json").read_text() == saved and not (out / "seed_3").exists()


def test_resume_refuses_an_encoder_changed_since_and_still_resumes_runs_saved_without_its_hash(
    tmp_path, capsys, tiny_pretrained_run, data
):
    from bertforge.checkpoint import read_weights

    model, out = tmp_path / "model", tmp_path / "run"
    shutil.copytree(tiny_pretrained_run / "final", model)
    argv = finetune_argv(model, *data, out, "--epochs", "1", "--seeds", "1", "--jobs", "1")
    assert main(argv) == 0
    weights = read_weights(model / "model.safetensors")
    weights["bert.pooler.dense.bias"] += 0.01  # as a longer pretraining of the same folder would
    save_file(weights, str(model / "model.safetensors"))
    saved = (out / "finetune.json").read_text()
    resume = ["finetune", "--out", str(out), "--resume", "--seeds", "1,2"]
    assert_clean_failure(capsys, resume, "started: pretrained encoder; resume only with the same model")
    assert (out / "finetune.json").read_text() == saved and not (out / "seed_2").exists()

    older = json.loads(saved)
    del older["data_sha256"]["pretrained encoder"]  # a run saved before the encoder's hash was kept
    (out / "finetune.json").write_text(json.dumps(older))
    assert main([*resume, "--quiet"]) == 0


def test_a_run_started_with_relative_paths_resumes_from_another_folder(
    tmp_path, capsys, monkeypatch, tiny_pretrained_run, data
):
    here = tmp_path / "here"
    here.mkdir()
    for path in (*data, tiny_pretrained_run):
        (shutil.copytree if path.is_dir() else shutil.copy)(path, here / path.name)
    monkeypatch.chdir(here)
    names = [Path(path.name) for path in (tiny_pretrained_run, *data)]
    argv = finetune_argv(*names, Path("tuned"), "--epochs", "1", "--seeds", "1,2", "--jobs", "1")
    assert main(argv) == 0
    task = json.loads((here / "tuned" / "finetune.json").read_text())["task"]
    assert [task[key] for key in ("model", "train", "valid")] == [str(here / name) for name in names]
    monkeypatch.chdir(tmp_path)
    assert main(["finetune", "--out", str(here / "tuned"), "--resume", "--seeds", "1,2,3", "--quiet"]) == 0
    assert "over 3 seeds" in capsys.readouterr().out


def test_from_scratch_flag(tmp_path, capsys, tiny_pretrained_run, data):
    out = tmp_path / "scratch"
    assert main(finetune_argv(tiny_pretrained_run, *data, out, "--epochs", "1", "--from-scratch")) == 0
    assert json.loads((out / "finetune.json").read_text())["task"]["from_scratch"] is True
    argv = ["finetune", "--out", str(out), "--resume", "--seeds", "1,2"]
    assert_clean_failure(capsys, argv, "started without --seeds")  # one run has no seeds to add to


def test_jobs_with_one_run_says_that_it_trains_alone(tmp_path, tiny_pretrained_run, data):
    out = tmp_path / "alone"
    with pytest.warns(UserWarning, match="--jobs 2 has one run to train, which trains alone"):
        assert main(finetune_argv(tiny_pretrained_run, *data, out, "--epochs", "1", "--jobs", "2")) == 0
    assert (out / "final").is_dir()


def test_reinit_pooler_flag(tmp_path, tiny_pretrained_run, data):
    out = tmp_path / "fresh-pooler"
    assert main(finetune_argv(tiny_pretrained_run, *data, out, "--epochs", "1", "--reinit-pooler")) == 0
    assert json.loads((out / "finetune.json").read_text())["task"]["reinit_pooler"] is True


def test_dropout_flag_sets_the_classifiers_dropout(tmp_path, capsys, tiny_pretrained_run, data):
    out = tmp_path / "dropout"
    assert main(finetune_argv(tiny_pretrained_run, *data, out, "--epochs", "1", "--dropout", "0.25")) == 0
    saved = json.loads((out / "finetune.json").read_text())
    assert saved["task"]["dropout"] == 0.25
    model = saved["config"]["model"]
    assert model["hidden_dropout_prob"] == model["attention_probs_dropout_prob"] == 0.25
    pretrained = json.loads((tiny_pretrained_run / "config.json").read_text())["model"]
    assert pretrained["hidden_dropout_prob"] == 0.1  # the pretrained model's setting, the default
    bad = tmp_path / "bad"
    argv = finetune_argv(tiny_pretrained_run, *data, bad, "--dropout", "1.5")
    assert_clean_failure(capsys, argv, "--dropout")
    assert not bad.exists()


def test_defaults_follow_the_model_learning_rate_by_width_and_pairs_dropout_for_one_pretrained_without(
    tmp_path, tiny_pretrained_run, data
):
    model = tmp_path / "no-dropout"
    shutil.copytree(tiny_pretrained_run, model)
    config_path = model / "final" / "config.json"
    config = json.loads(config_path.read_text())
    config["model"]["hidden_dropout_prob"] = config["model"]["attention_probs_dropout_prob"] = 0.0
    config_path.write_text(json.dumps(config))
    for pairs, rate, batch_size, epochs, dropout in ((True, 1e-4, 16, 4, 0.0), (False, 3e-4, 32, 3, 0.1)):
        out = tmp_path / f"defaults-{pairs}"
        argv = finetune_argv(model, *data, out)
        for flag in ("--lr", "--batch-size") + (() if pairs else ("--text-pair-column",)):
            del argv[argv.index(flag) : argv.index(flag) + 2]  # the helper's own value left out
        assert main(argv) == 0
        saved = json.loads((out / "finetune.json").read_text())
        config = saved["config"]
        assert config["model"]["hidden_size"] == 32 and config["train"]["learning_rate"] == rate
        assert config["train"]["batch_size"] == batch_size and saved["task"]["epochs"] == epochs
        model_config = config["model"]
        assert model_config["hidden_dropout_prob"] == model_config["attention_probs_dropout_prob"] == dropout
    out = tmp_path / "given"
    assert main(finetune_argv(model, *data, out, "--epochs", "1", "--lr", "1e-4", "--dropout", "0.2")) == 0
    saved = json.loads((out / "finetune.json").read_text())["config"]
    assert saved["train"]["learning_rate"] == 1e-4 and saved["model"]["hidden_dropout_prob"] == 0.2


@pytest.mark.parametrize(
    "width, rate", [(128, 3e-4), (256, 3e-4), (257, 1e-4), (512, 1e-4), (768, 5e-5), (None, 5e-5)]
)
def test_default_learning_rate_by_width(width, rate):
    assert default_learning_rate(width) == rate == finetuning_config(width).train.learning_rate
    pair_rate = finetuning_config(width, pairs=True).train.learning_rate
    assert pair_rate == default_learning_rate(width, pairs=True) == min(rate, 1e-4)
    scored_rate = finetuning_config(width, pairs=True, regression=True).train.learning_rate
    assert scored_rate == default_learning_rate(width, pairs=True, regression=True) == min(rate, 2e-4)
    assert default_learning_rate(width, regression=True) == rate  # single texts: by width alone


def test_sentence_pairs_get_the_glue_pair_recipe():
    recipe = DEFAULT_RECIPES["default"]  # the built-in [default]: Turc et al.'s 4 epochs, one order
    config = finetuning_config(256, pairs=True)
    pair_recipe = (recipe["learning_rate"], recipe["batch_size"], recipe["epochs"])
    assert pair_recipe == (PAIR_LEARNING_RATE, PAIR_BATCH_SIZE, PAIR_EPOCHS)
    assert config.train.batch_size == PAIR_BATCH_SIZE and config.train.learning_rate == PAIR_LEARNING_RATE
    assert finetuning_config(256).train.batch_size == 32


@pytest.mark.slow
def test_compare_scratch_prints_the_paired_table_and_resumes(tmp_path, capsys, tiny_pretrained_run, data):
    out = tmp_path / "cmp"
    argv = finetune_argv(
        tiny_pretrained_run, *data, out, "--epochs", "1", "--seeds", "1,2", "--compare-scratch", "--jobs", "1"
    )
    with pytest.warns(UserWarning, match="2 seeds support no claim"):
        assert main(argv) == 0
    printed = capsys.readouterr().out
    comparison = json.loads((out / "comparison.json").read_text())
    assert {"seeds", "pairs", "pretrained", "scratch", "difference", "sign_test", "bootstrap"} <= set(
        comparison
    )
    for arm in ("pretrained", "scratch"):
        assert json.loads((out / arm / "summary.json").read_text())["seeds"] == [1, 2]
        for name in ("result.json", "valid_predictions.json", "final"):
            assert (out / arm / "seed_1" / name).exists() and (out / arm / "seed_2" / name).exists()

    rows = {line.split()[0]: line.split()[1:] for line in printed.splitlines() if line.strip()}
    assert rows["seed"] == ["pretrained", "scratch", "difference"]
    first = comparison["pairs"][0]
    assert rows["1"] == [
        f"{first['pretrained']:.4f}",
        f"{first['scratch']:.4f}",
        f"{first['difference']:+.4f}",
    ]
    assert rows["median"][2] == f"{comparison['difference']['median']:+.4f}"
    assert rows["range"][:3] == [
        f"{comparison['pretrained']['min']:.4f}",
        "to",
        f"{comparison['pretrained']['max']:.4f}",
    ]
    assert f"p = {comparison['sign_test']['p_value']:.4f}" in printed
    assert "paired bootstrap over 16 validation examples (10,000 resamples)" in printed
    assert "95% interval" in printed and "use 5 or more" in printed
    labels = [row.rsplit(",", 1)[1] for row in data[1].read_text().splitlines()[1:] if row]
    majority = max(labels.count(label) for label in set(labels)) / len(labels)  # one answer for all
    assert comparison["majority_class"] == pytest.approx(majority)
    assert (
        f"majority class (the most frequent validation label for every example): {majority:.4f};" in printed
    )

    with pytest.warns(UserWarning):
        resumed = ["finetune", "--out", str(out), "--resume", "--quiet", "--jobs", "1"]  # as the first
        assert main(resumed) == 0  # nothing left to run
    table = printed[printed.index("\nseed") :]
    assert capsys.readouterr().out.endswith(table)
    assert_clean_failure(
        capsys, ["finetune", "--out", str(out), "--resume", "--compare-scratch"], "drop --compare-scratch"
    )
    with pytest.warns(UserWarning, match="3 seeds support no claim"):
        assert main(["finetune", "--out", str(out), "--resume", "--seeds", "1,2,3", "--quiet"]) == 0
    grown = json.loads((out / "comparison.json").read_text())
    assert grown["seeds"] == [1, 2, 3] and grown["pairs"][:2] == comparison["pairs"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--seeds", "1,2", "--compare-scratch", "--from-scratch"), "drop --from-scratch"),
        (("--seeds", "1", "--compare-scratch"), "at least 2 seeds"),
        (("--compare-scratch",), "needs --seeds"),
    ],
)
def test_compare_scratch_refuses_bad_combinations(
    tmp_path, capsys, tiny_pretrained_run, data, extra, message
):
    assert_clean_failure(capsys, finetune_argv(tiny_pretrained_run, *data, tmp_path / "out", *extra), message)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "train, valid, message",
    [
        ("question,answer,label\nq,a,yes\n", "question,answer,label\nq,a,yes\n", "at least two classes"),
        ("question,answer,label\nq,a,yes\nq,b,no\n", "question,answer,label\nq,a,maybe\n", "never seen"),
        ("question,answer,label\nq,a,yes\n\nq,b,no\n", "question,answer,label\nq,a,yes\n", "line 3 is empty"),
        ("question,reply,label\nq,a,yes\nq,b,no\n", "question,answer,label\nq,a,yes\n", "its columns are"),
        (b"question,answer,label\nq,a,yes\nq,b,no\n" + b"q,\xff,no\n", "", "not UTF-8"),
    ],
)
def test_bad_data_files(tmp_path, capsys, tiny_pretrained_run, train, valid, message):
    train_path, valid_path = tmp_path / "train.csv", tmp_path / "valid.csv"
    if isinstance(train, bytes):
        train_path.write_bytes(train)
    else:
        train_path.write_text(train)
    valid_path.write_text(valid or "question,answer,label\nq,a,yes\n")
    argv = finetune_argv(tiny_pretrained_run, train_path, valid_path, tmp_path / "out")
    assert_clean_failure(capsys, argv, message)
    assert not (tmp_path / "out").exists()


def test_model_folder_that_is_not_a_model(tmp_path, capsys, data):
    (tmp_path / "empty").mkdir()
    argv = finetune_argv(tmp_path / "empty", *data, tmp_path / "out")
    assert_clean_failure(capsys, argv, "not a bertforge model folder")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text('{"model_type": "gpt2"}')
    (tmp_path / "odd" / "model.safetensors").write_bytes(b"")
    assert_clean_failure(capsys, finetune_argv(tmp_path / "odd", *data, tmp_path / "out"), "'gpt2'")
    assert not (tmp_path / "out").exists()


def test_classify_needs_a_classifier(tmp_path, capsys, tiny_pretrained_run):
    assert_clean_failure(
        capsys,
        ["classify", "--model", str(tiny_pretrained_run), "hello"],
        "not a fine-tuned classifier or tagger",
    )
    assert_clean_failure(capsys, ["classify", "--model", str(tmp_path / "none"), "hello"], "does not exist")
    assert_clean_failure(capsys, ["tag", "--model", str(tmp_path / "none"), "hello"], "classifier or tagger")
    compared = tmp_path / "compared"  # `finetune --compare-scratch --seeds`: an arm's folder per seed
    for arm in ("scratch", "pretrained"):
        (compared / arm / "seed_1").mkdir(parents=True)
    message = (
        f"holds one fine-tuning run per seed; give one of them, e.g. {compared / 'pretrained' / 'seed_1'}"
    )
    assert_clean_failure(capsys, ["classify", "--model", str(compared), "hello"], message)


def test_classify_input_problems(tmp_path, capsys, finetuned):
    blank = tmp_path / "blank.txt"
    blank.write_text("one\n\nthree\n")
    assert_clean_failure(
        capsys, ["classify", "--model", str(finetuned), "--input", str(blank)], "line 2 is blank"
    )
    assert_clean_failure(capsys, ["classify", "--model", str(finetuned)], "give texts to classify")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    argv = ["classify", "--model", str(finetuned), "--input", str(empty)]
    assert_clean_failure(capsys, argv, "is empty; give a file with one text per line")
    argv = ["classify", "--model", str(finetuned), "fine", " "]
    assert_clean_failure(capsys, argv, "text 2 of 2 is empty")


def test_output_folder_and_settings(tmp_path, capsys, tiny_pretrained_run, data, finetuned):
    assert_clean_failure(
        capsys,
        finetune_argv(tiny_pretrained_run, *data, finetuned),
        "already holds a run (begun or finished)",
    )
    out = tmp_path / "out"
    assert_clean_failure(
        capsys, finetune_argv(tiny_pretrained_run, *data, out, "--max-length", "100"), "--max-length"
    )
    assert_clean_failure(capsys, finetune_argv(tiny_pretrained_run, *data, out, "--epochs", "0"), "--epochs")
    assert_clean_failure(
        capsys, finetune_argv(tiny_pretrained_run, *data, out, "--set", "model.hidden_size=8"), "--model"
    )
    for ignored, fix in (("train.max_steps=5", "set --epochs instead"), ("data.nsp=true", "--max-length")):
        assert_clean_failure(capsys, finetune_argv(tiny_pretrained_run, *data, out, "--set", ignored), fix)
    assert_clean_failure(
        capsys, finetune_argv(tiny_pretrained_run, *data, out, "--lr", "-1"), "--lr must be in (0, 1], got -1"
    )
    assert_clean_failure(
        capsys,
        finetune_argv(tiny_pretrained_run, *data, out, "--batch-size", "0"),
        "--batch-size must be positive, got 0",
    )
    assert not out.exists()
    assert_clean_failure(capsys, ["finetune", "--out", str(out), "--resume"], "no fine-tuning run to resume")
    assert_clean_failure(capsys, ["finetune", "--out", str(finetuned), "--resume", "--lr", "1"], "drop --lr")
    assert_clean_failure(
        capsys, ["finetune", "--out", str(out), "--model", str(tiny_pretrained_run)], "needs --train"
    )


def test_the_readmes_python_example_runs(tiny_pretrained_run, finetuned):
    """The README's Python API block, on a tiny pretrained run and a fine-tuned one."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert '"runs/mini"' in block and '"runs/sst2/pretrained/seed_1"' in block
    block = block.replace('"runs/mini"', repr(str(tiny_pretrained_run)))
    block = block.replace('"runs/sst2/pretrained/seed_1"', repr(str(finetuned)))
    block = block.replace("\nclassifier.classify(", "\nclassified = classifier.classify(")
    names: dict = {}
    exec(compile(block, "README.md", "exec"), names)  # noqa: S102 (the README's own example)
    [result] = names["classified"]
    assert result["label"] in names["labels"] and abs(sum(result["probabilities"].values()) - 1) < 1e-5


def test_fine_tuning_past_the_pretrained_length_says_so(tmp_path, tiny_pretrained_run, data):
    """A model pretrained on 16-token sequences (positions for 64): fine-tuning at 32 warns that
    positions 16-31 start untrained; at 16 it does not."""
    short = tmp_path / "short"
    shutil.copytree(tiny_pretrained_run, short)
    for path in (short / "config.json", short / "final" / "config.json"):
        config = json.loads(path.read_text(encoding="utf-8"))
        config["data"]["max_seq_length"] = 16
        path.write_text(json.dumps(config), encoding="utf-8")
    argv = finetune_argv(short, *data, tmp_path / "at32", "--epochs", "1")
    with pytest.warns(
        UserWarning, match="pretrained on sequences of up to 16 tokens: fine-tuning at 32 starts"
    ):
        assert main(argv) == 0
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*pretrained on sequences")
        assert (
            main([*finetune_argv(short, *data, tmp_path / "at16", "--epochs", "1"), "--max-length", "16"])
            == 0
        )
        scratch = [*finetune_argv(short, *data, tmp_path / "scratch", "--epochs", "1"), "--from-scratch"]
        assert main(scratch) == 0  # random weights throughout: nothing to say about positions
