"""Regression fine-tuning (real-valued labels, one output, mean squared error): the head's Hugging Face
parity for BERT and GPT-1, telling real-valued labels from classes, learning STS-B's similarity
scores from a sample of its training file (from the mean score; in both orders), `classify` printing
the score, export and import, and the seeds summary and paired comparison on Pearson's r."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    HF_TINY_GPT_SIZES,
    HF_TINY_SIZES,
    STSB_TRAIN_PAIRS,
    STSB_VALID_PAIRS,
    assert_clean_failure,
    metrics_lines,
    stsb_finetune_argv,
    tiny_config,
)

from bertforge.checkpoint import read_weights
from bertforge.classifier import classify, save_classifier
from bertforge.cli import main
from bertforge.comparison import compare_runs, paired_bootstrap_pearson, run_folder
from bertforge.config import ModelConfig, apply_objective
from bertforge.errors import BertforgeError
from bertforge.export import export_model, import_hf
from bertforge.finetune import PAIR_BATCH_SIZE, PAIR_LEARNING_RATE, regression_loss, summarize_seeds
from bertforge.folders import open_classifier
from bertforge.glue_recipes import DEFAULT_RECIPES
from bertforge.gpt import GPTForSequenceClassification
from bertforge.gpt_convert import from_hf_state_dict, hf_config, to_hf_state_dict
from bertforge.labeled import label_names, read_labeled, task_type
from bertforge.metrics import pearson
from bertforge.model import BertForSequenceClassification
from bertforge.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")

PAIRS = [
    ("A man is playing a guitar.", "A man plays the guitar."),
    ("A cat sleeps.", "The stock market fell."),
]


@pytest.fixture(scope="module")
def regressor(tmp_path_factory, tiny_pretrained_run, stsb) -> Path:
    out = tmp_path_factory.mktemp("stsb-run") / "run"
    recipe = ("--epochs", "3", "--batch-size", "16", "--lr", "2e-3")  # a 32-wide model: a high rate
    assert main(stsb_finetune_argv(tiny_pretrained_run, stsb, out, *recipe)) == 0
    return out


# ------------------------------------------------------------------------------------------ parity


def padded_batch(vocab_size: int):
    lengths = torch.tensor([12, 7, 4])
    mask = (torch.arange(12) < lengths[:, None]).long()  # (B, T)
    ids = torch.randint(1, vocab_size, (3, 12), generator=torch.Generator().manual_seed(0)) * mask
    types = ((torch.arange(12) >= (lengths[:, None] // 2)) & mask.bool()).long()
    return ids, types, mask


@torch.no_grad()
def test_bert_regression_head_matches_hugging_face_both_ways():
    torch.manual_seed(3)
    settings = transformers.BertConfig(
        **HF_TINY_SIZES, num_labels=1, problem_type="regression", attn_implementation="eager"
    )
    hf = transformers.BertForSequenceClassification(settings).eval()
    ours = BertForSequenceClassification(ModelConfig(**HF_TINY_SIZES), 1).eval()
    ids, types, mask = padded_batch(HF_TINY_SIZES["vocab_size"])
    targets = torch.tensor([0.5, 3.8, 5.0])

    ours.load_state_dict(hf.state_dict())
    theirs = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=targets)
    assert theirs.logits.shape == (3, 1)
    torch.testing.assert_close(
        ours(ids, token_type_ids=types, attention_mask=mask), theirs.logits, rtol=0, atol=1e-5
    )
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": targets}
    loss, sums = regression_loss(ours, batch)  # Hugging Face's regression loss: the mean squared error
    torch.testing.assert_close(loss, theirs.loss, rtol=1e-5, atol=1e-6)
    assert sums["count"] == 3

    fresh = BertForSequenceClassification(ModelConfig(**HF_TINY_SIZES), 1).eval()  # other weights
    hf.load_state_dict(fresh.state_dict())
    theirs = hf(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    torch.testing.assert_close(
        fresh(ids, token_type_ids=types, attention_mask=mask), theirs, rtol=0, atol=1e-5
    )


@torch.no_grad()
def test_gpt_regression_head_matches_hugging_face_both_ways():
    config = ModelConfig(**HF_TINY_GPT_SIZES)
    torch.manual_seed(0)
    ours = GPTForSequenceClassification(config, 1).eval()
    raw = hf_config(config, labels=["score"])
    assert raw["num_labels"] == 1 and raw["problem_type"] == "regression"
    hf = transformers.OpenAIGPTForSequenceClassification(
        transformers.OpenAIGPTConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    ).eval()
    hf.load_state_dict(to_hf_state_dict(ours.state_dict()), strict=True)
    ids, _, mask = padded_batch(99)
    targets = torch.tensor([0.5, 3.8, 5.0])
    theirs = hf(input_ids=ids, attention_mask=mask, labels=targets)
    torch.testing.assert_close(ours(ids, attention_mask=mask), theirs.logits, rtol=0, atol=1e-5)
    batch = {"input_ids": ids, "token_type_ids": 0 * ids, "attention_mask": mask, "labels": targets}
    torch.testing.assert_close(regression_loss(ours, batch)[0], theirs.loss, rtol=1e-5, atol=1e-6)

    torch.manual_seed(1)
    hf = transformers.OpenAIGPTForSequenceClassification(hf.config).eval()  # other weights, back to ours
    back = GPTForSequenceClassification(config, 1).eval()
    back.load_state_dict(from_hf_state_dict(hf.state_dict()))
    torch.testing.assert_close(back(ids, attention_mask=mask), hf(input_ids=ids, attention_mask=mask).logits)


# ------------------------------------------------------------------------------------------ labels


def labeled(tmp_path: Path, labels: list, name: str = "data.jsonl"):
    path = tmp_path / name
    rows = [json.dumps({"text": f"text {i}", "label": value}) + "\n" for i, value in enumerate(labels)]
    path.write_text("".join(rows), encoding="utf-8")
    return read_labeled(path, "text", "label")


def test_real_valued_labels_make_a_regression(tmp_path, stsb):
    train = read_labeled(stsb[0], "sentence1", "score", text_pair_column="sentence2")
    assert train.labels[:2] == ["5", "3.800"] and task_type(train) == "regression"
    assert task_type(labeled(tmp_path, [0.5, 1, 2.25])) == "regression"  # JSON numbers
    assert task_type(labeled(tmp_path, ["1e-1", "2", "3"])) == "regression"
    assert task_type(labeled(tmp_path, [0, 1, 1, 0])) == "classification"  # integers are class ids
    csv = tmp_path / "floats.csv"  # pandas writes an integer column with missing values as floats
    csv.write_text("text,label\na,0.0\nb,1.0\nc,10.0\nd,2.0\n", encoding="utf-8")
    written_as_floats = read_labeled(csv, "text", "label")
    assert task_type(written_as_floats) == "classification"
    assert label_names(written_as_floats) == ["0", "1", "2", "10"]  # as a JSON 1.0, ordered as numbers
    mixed = labeled(tmp_path, ["1.0", 1, 1.0, "0", "0.00"])  # one class however its id is written
    assert mixed.labels == ["1", "1", "1", "0", "0"] and label_names(mixed) == ["0", "1"]
    assert task_type(labeled(tmp_path, ["pos", "neg"])) == "classification"
    assert task_type(labeled(tmp_path, [0, 1, 2]), "regression") == "regression"  # forced
    assert task_type(train, "classification") == "classification"


def test_labels_that_are_neither_are_refused(tmp_path):
    named = r"mixes real-valued labels \('0.5' on line 1\) with labels that are not numbers \('high'"
    with pytest.raises(BertforgeError, match=named):
        task_type(labeled(tmp_path, [0.5, 1.5, "high", 2]))
    with pytest.raises(BertforgeError, match="line 2: the label 'good' is not a number"):
        task_type(labeled(tmp_path, [1, "good"]), "regression")
    with pytest.raises(BertforgeError, match="are not numbers \\('nan' on line 1"):
        task_type(labeled(tmp_path, ["nan", "1.5"]))  # NaN is no score: it counts as text, mixed


def test_finetune_refuses_labels_that_are_neither(tmp_path, capsys, tiny_pretrained_run):
    path = tmp_path / "mixed.tsv"
    path.write_text("sentence1\tsentence2\tscore\na man\ta man plays\t4.5\na dog\tthe sky\t0.2\na\tb\thigh\n")
    out, model = tmp_path / "out", tiny_pretrained_run
    assert_clean_failure(capsys, stsb_finetune_argv(model, (path, path), out), "mixes real-valued labels")
    argv = stsb_finetune_argv(model, (path, path), out, "--task", "regression")
    assert_clean_failure(capsys, argv, "line 4: the label 'high' is not a number")
    same = tmp_path / "same.tsv"
    same.write_text("sentence1\tsentence2\tscore\na\tb\t2.5\nc\td\t2.5\n", encoding="utf-8")
    assert_clean_failure(
        capsys, stsb_finetune_argv(tiny_pretrained_run, (same, same), out), "has the score '2.5'"
    )
    assert not out.exists()


# -------------------------------------------------------------------------------------- fine-tuning


def test_finetune_learns_stsb_scores(regressor, stsb):
    result = json.loads((regressor / "result.json").read_text())
    valid = [r for r in metrics_lines(regressor, "valid") if "epoch" in r]
    assert [r["epoch"] for r in valid] == [0, 1, 2, 3]
    assert not metrics_lines(regressor, "confusion")
    # the best epoch is the one of highest Pearson's r, and it is well above chance and above the start
    best = max(valid[1:], key=lambda r: r["pearson"])
    assert result["best_epoch"] == best["epoch"] and result["best"]["pearson"] == best["pearson"]
    assert result["best"]["pearson"] > 0.25 and result["best"]["pearson"] > valid[0]["pearson"] + 0.1
    assert set(result["best"]) == {"pearson", "spearman", "mse"} and result["task_type"] == "regression"
    assert (regressor / "curves.png").stat().st_size > 10_000
    predictions = json.loads((regressor / "valid_predictions.json").read_text())
    scores = [float(line.split("\t")[-1]) for line in stsb[1].read_text().splitlines()[1:]]
    assert predictions["true"] == scores and len(predictions["predicted"]) == STSB_VALID_PAIRS
    assert pearson(predictions["predicted"], predictions["true"]) == pytest.approx(result["best"]["pearson"])
    errors = np.subtract(predictions["predicted"], predictions["true"])
    assert float(np.mean(errors**2)) == pytest.approx(result["best"]["mse"], rel=1e-4)
    final = regressor / "final"
    assert json.loads((final / "labels.json").read_text()) == {"labels": ["score"], "pairs": True}
    assert read_weights(final / "model.safetensors")["classifier.weight"].shape == (1, 32)


def test_a_regression_starts_at_the_mean_training_score(regressor, stsb):
    """The head's bias starts at the training scores' mean: before any step the validation MSE is the
    scores' spread around that mean, well below their spread around 0, where a bias of 0 would start."""
    train, valid = ([float(row.split("\t")[-1]) for row in p.read_text().splitlines()[1:]] for p in stsb)
    mean = sum(train) / len(train)
    around_mean = float(np.mean([(score - mean) ** 2 for score in valid]))
    start = metrics_lines(regressor, "valid")[0]
    assert start["epoch"] == 0 and start["mse"] == pytest.approx(around_mean, rel=0.05)
    assert around_mean < 0.5 * float(np.mean(np.square(valid)))


def test_both_orders_trains_on_each_pair_twice(tmp_path, capsys, tiny_pretrained_run, stsb):
    out = tmp_path / "run"
    recipe = ("--both-orders", "--epochs", "1", "--batch-size", "32", "--lr", "5e-3")
    assert main(stsb_finetune_argv(tiny_pretrained_run, stsb, out, *recipe)) == 0
    assert json.loads((out / "result.json").read_text())["steps"] == math.ceil(2 * STSB_TRAIN_PAIRS / 32)
    assert json.loads((out / "finetune.json").read_text())["task"]["both_orders"] is True
    single = stsb_finetune_argv(tiny_pretrained_run, stsb, tmp_path / "single", "--both-orders")
    single = [arg for arg in single if arg not in ("--text-pair-column", "sentence2")]
    message = "--both-orders swaps the two texts of each pair; name the second one's column with --text-pair"
    assert_clean_failure(capsys, single, message)
    assert not (tmp_path / "single").exists()


def as_classes(data: tuple[Path, Path], folder: Path) -> tuple[Path, Path]:
    """The pairs with each score replaced by whether it is at least 2.5 (0 or 1)."""
    copies = []
    for path in data:
        header, *rows = path.read_text(encoding="utf-8").splitlines()
        split = [row.rsplit("\t", 1) for row in rows]
        classes = [f"{columns}\t{int(float(score) >= 2.5)}" for columns, score in split]
        copy = folder / path.name
        copy.write_text("\n".join([header, *classes]) + "\n", encoding="utf-8")
        copies.append(copy)
    return copies[0], copies[1]


@pytest.mark.parametrize("labels", ["scores", "classes"])
def test_scored_pairs_default_to_glues_stsb_recipe(tmp_path, tiny_pretrained_run, stsb, labels):
    """Without --lr or --epochs, pairs whose labels are scores train at STS-B's recipe's rate (classes:
    the pair rate), and pairs in both orders for its epochs: the steps of `PAIR_EPOCHS` of one order."""
    data = stsb if labels == "scores" else as_classes(stsb, tmp_path)
    out = tmp_path / "run"
    assert main(stsb_finetune_argv(tiny_pretrained_run, data, out, "--both-orders")) == 0
    saved = json.loads((out / "finetune.json").read_text())
    recipe = DEFAULT_RECIPES["STS-B"]
    assert recipe["learning_rate"] != PAIR_LEARNING_RATE  # the two cases differ
    rate = recipe["learning_rate"] if labels == "scores" else PAIR_LEARNING_RATE
    assert saved["config"]["train"]["learning_rate"] == rate
    assert saved["task"]["epochs"] == recipe["epochs"]
    steps = recipe["epochs"] * math.ceil(2 * STSB_TRAIN_PAIRS / PAIR_BATCH_SIZE)
    assert json.loads((out / "result.json").read_text())["steps"] == steps


def test_classify_prints_the_score(regressor, capsys):
    assert main(["classify", "--model", str(regressor), "\t".join(PAIRS[0]), "\t".join(PAIRS[1])]) == 0
    lines = capsys.readouterr().out.splitlines()
    model, tokenizer, labels, _ = open_classifier(regressor)
    expected = classify(model, tokenizer, labels, *map(list, zip(*PAIRS, strict=True)))
    assert [line.split("\t")[0] for line in lines] == [f"{r['score']:.4f}" for r in expected]
    assert lines[1].endswith("\t".join(PAIRS[1]))
    with torch.no_grad():
        ids, types = tokenizer.encode_pair(*PAIRS[0])
        output = model(torch.tensor([ids]), token_type_ids=torch.tensor([types]))
    assert expected[0]["score"] == pytest.approx(output.item(), abs=1e-5)
    assert main(["classify", "--model", str(regressor), "--json", "\t".join(PAIRS[0])]) == 0
    record = json.loads(capsys.readouterr().out)
    assert set(record) == {"text", "score"} and record["score"] == pytest.approx(expected[0]["score"])


def test_classify_batches_texts_of_like_length_and_answers_in_input_order(regressor, stsb, monkeypatch):
    """Pairs of alternating short and long texts, in batches of 2 and windows of 2 batches: each
    batch holds texts of like length (little padding), and every score is the pair's own, as
    classified alone."""
    import bertforge.classifier

    monkeypatch.setattr(bertforge.classifier, "SORTED_BATCHES", 2)
    rows = [line.split("\t") for line in stsb[1].read_text(encoding="utf-8").splitlines()[1:13]]
    texts = [row[-3] if i % 2 else row[-3][:12] for i, row in enumerate(rows)]
    pairs = [row[-2] if i % 2 else row[-2][:12] for i, row in enumerate(rows)]
    model, tokenizer, labels, _ = open_classifier(regressor)
    each = zip(texts, pairs, strict=True)
    alone = [classify(model, tokenizer, labels, [a], [b])[0]["score"] for a, b in each]
    padding, forward = [], model.forward

    def counting(input_ids, **inputs):
        padding.append(int((inputs["attention_mask"] == 0).sum()))
        return forward(input_ids, **inputs)

    monkeypatch.setattr(model, "forward", counting)
    scores = [r["score"] for r in classify(model, tokenizer, labels, texts, pairs, batch_size=2)]
    assert scores == pytest.approx(alone, abs=2e-6) and np.diff(np.sort(alone)).min() > 5e-6
    in_input_order = sum(
        abs(len(a[0]) - len(b[0]))
        for a, b in zip(*[tokenizer.encode_pairs(texts[i::2], pairs[i::2]) for i in (0, 1)], strict=True)
    )
    assert len(padding) == 6 and sum(padding) < in_input_order / 3
    with pytest.raises(BertforgeError, match="batch_size must be at least 1"):
        classify(model, tokenizer, labels, texts, pairs, batch_size=0)


def test_export_is_a_hugging_face_regression_model(regressor, tmp_path, capsys):
    out = tmp_path / "hf"
    assert export_model(regressor, out)["architecture"] == "BertForSequenceClassification"
    config = json.loads((out / "config.json").read_text())
    assert config["num_labels"] == 1 and config["problem_type"] == "regression"
    assert config["id2label"] == {"0": "score"}
    for folder in (regressor / "final", out):  # transformers cuts where fine-tuning did: --max-length 48
        assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == 48
    hf = transformers.BertForSequenceClassification.from_pretrained(out).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    model, tokenizer, labels, _ = open_classifier(regressor)
    firsts, seconds = map(list, zip(*PAIRS, strict=True))
    ours = classify(model, tokenizer, labels, firsts, seconds)
    with torch.no_grad():
        theirs = hf(**hf_tokenizer(firsts, seconds, padding=True, return_tensors="pt")).logits  # (B, 1)
    assert theirs.shape == (2, 1)
    assert max(abs(a - r["score"]) for a, r in zip(theirs[:, 0].tolist(), ours, strict=True)) <= 1e-5
    pipe = transformers.pipeline("text-classification", model=str(out), function_to_apply="none")
    scored = pipe({"text": firsts[0], "text_pair": seconds[0]})
    scored = scored[0] if isinstance(scored, list) else scored
    assert scored["label"] == "score" and scored["score"] == pytest.approx(ours[0]["score"], abs=1e-5)

    exported, hf_tok, hf_labels, _ = open_classifier(out)  # the export reads back as a regression model
    assert hf_labels == ["score"] and exported.num_labels == 1
    again = classify(exported, hf_tok, hf_labels, firsts, seconds)
    assert max(abs(a["score"] - b["score"]) for a, b in zip(again, ours, strict=True)) <= 1e-5
    assert main(["classify", "--model", str(out), "\t".join(PAIRS[0])]) == 0
    assert capsys.readouterr().out.split("\t")[0] == f"{ours[0]['score']:.4f}"

    report = import_hf(out, tmp_path / "imported")  # import-hf keeps the encoder and drops the head
    assert report["dropped"] == ["classifier.bias", "classifier.weight"]
    imported = read_weights(tmp_path / "imported" / "model.safetensors")
    encoder = read_weights(regressor / "final" / "model.safetensors")
    assert all(torch.equal(imported[k], v) for k, v in encoder.items() if k.startswith("bert."))


def test_gpt_regression_exports_to_openai_gpt(tmp_path, small_tokenizer_dir, capsys):
    tokenizer = load_tokenizer(small_tokenizer_dir)
    config = tiny_config()
    apply_objective(config, "clm")
    config.model.intermediate_size = 4 * config.model.hidden_size
    config.model.vocab_size = tokenizer.vocab_size
    config.model.initializer_range = 0.2  # outputs far from zero
    torch.manual_seed(0)
    model = GPTForSequenceClassification(config.model, 1).eval()
    save_classifier(tmp_path / "gpt", model, tokenizer, config, ["similarity"])
    out = tmp_path / "hf"
    assert main(["export", "--model", str(tmp_path / "gpt"), "--out", str(out)]) == 0
    capsys.readouterr()
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["OpenAIGPTForSequenceClassification"]
    assert raw["num_labels"] == 1 and raw["problem_type"] == "regression"
    hf = transformers.OpenAIGPTForSequenceClassification.from_pretrained(out).eval()
    texts = ["the game was released in japan", "he was born in the city of london and studied history"]
    ours = classify(model, tokenizer, ["similarity"], texts)
    pipe = transformers.pipeline("text-classification", model=str(out), function_to_apply="none")
    for text, result in zip(texts, ours, strict=True):
        ids = torch.tensor([tokenizer.encode_pair(text)[0]])
        with torch.no_grad():
            assert hf(input_ids=ids).logits.item() == pytest.approx(result["score"], abs=1e-5)
        scored = pipe(text)
        scored = scored[0] if isinstance(scored, list) else scored
        assert scored["label"] == "similarity" and scored["score"] == pytest.approx(result["score"], abs=1e-5)
    assert main(["classify", "--model", str(out), texts[0]]) == 0
    assert capsys.readouterr().out.split("\t")[0] == f"{ours[0]['score']:.4f}"


# ----------------------------------------------------------------------------------- seeds, comparison


def fake_result(seed: int, pearson_r: float, spearman_r: float) -> dict:
    best = {"pearson": pearson_r, "spearman": spearman_r, "mse": 1.0}
    return {"seed": seed, "task_type": "regression", "best": best, "last": best, "elapsed_s": 1.0}


def test_seeds_summary_is_on_pearson():
    summary = summarize_seeds([fake_result(1, 0.5, 0.4), fake_result(2, 0.7, 0.6), fake_result(3, 0.6, 0.3)])
    assert summary["pearson"] == {
        **{"n": 3, "median": 0.6, "min": 0.5, "max": 0.7, "spread": pytest.approx(0.2)},
        **{"mean": pytest.approx(0.6), "std": pytest.approx(0.1)},  # sample standard deviation
    }
    assert summary["spearman"]["median"] == 0.4 and summary["last_epoch_pearson"]["max"] == 0.7
    assert "accuracy" not in summary


def test_paired_comparison_is_on_pearson(tmp_path):
    """compare_runs on the files of finished regression runs: Pearson's r per seed, the sign test on its
    differences, and a paired bootstrap that recomputes r on every resample."""
    rng = np.random.default_rng(0)
    true = rng.uniform(0, 5, size=120)
    seeds = [1, 2, 3]
    for seed in seeds:
        for arm, noise in (("pretrained", 0.8), ("scratch", 2.5)):
            predicted = true + rng.normal(scale=noise, size=true.size)
            folder = run_folder(tmp_path, arm, seed)
            folder.mkdir(parents=True)
            r = pearson(predicted, true)
            (folder / "result.json").write_text(json.dumps(fake_result(seed, r, r)))
            record = {"epoch": 1, "labels": ["score"], "true": true.tolist(), "predicted": predicted.tolist()}
            (folder / "valid_predictions.json").write_text(json.dumps(record))
    comparison = compare_runs(tmp_path, seeds, resamples=500)
    assert comparison["metric"] == "pearson"
    pairs = comparison["pairs"]
    assert all(p["difference"] == pytest.approx(p["pretrained"] - p["scratch"]) for p in pairs)
    assert all(p["difference"] > 0 for p in pairs)
    assert comparison["sign_test"]["wins"] == 3
    boot = comparison["bootstrap"]
    assert boot["gain"] == pytest.approx(statistics_mean([p["difference"] for p in pairs]))
    assert boot["low"] > 0 and boot["p_value"] < 0.01 and boot["examples"] == 120

    # each resample takes the same examples in both arms: equal arms give a gain of exactly 0
    same = paired_bootstrap_pearson(true, true[None] + 1, true[None] + 1, resamples=50)
    assert same["gain"] == 0 and same["low"] == same["high"] == 0 and same["p_value"] == 1.0


def statistics_mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)
