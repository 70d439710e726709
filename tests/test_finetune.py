"""Fine-tuning: the classifier's Hugging Face parity, learning a toy task, seeds, --from-scratch, resume,
and the comparison of a pretrained arm with a from-scratch one."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import HF_TINY_SIZES, metrics_lines

from bertforge import finetune as finetune_module
from bertforge import reporting
from bertforge.checkpoint import list_checkpoints, read_weights
from bertforge.classifier import classify
from bertforge.comparison import compare_with_scratch
from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError, Interrupted
from bertforge.finetune import (
    EpochEvaluator,
    FinetuneTask,
    Job,
    build_classifier,
    check_task,
    encode,
    finetune,
    finetuning_config,
    length_grouped,
    prepare,
    read_saved_task,
    scores,
)
from bertforge.folders import open_classifier, open_encoder
from bertforge.labeled import read_labeled
from bertforge.model import BertForSequenceClassification
from bertforge.progress import RunsProgress
from bertforge.train import train

transformers = pytest.importorskip("transformers")

FILLERS = ("the", "in", "of", "was", "with", "by", "a")
TOPICS = {  # one class per topic: the labels are strings
    "music": ("album", "song", "single", "music"),
    "war": ("army", "battle", "war", "fought"),
}


def toy_rows(count: int, seed: int) -> list[dict]:
    """Texts mixing words of one topic with fillers in random order: separable by the topic's words."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        label = sorted(TOPICS)[i % len(TOPICS)]
        words = rng.choices(TOPICS[label], k=rng.randint(2, 5)) + rng.choices(FILLERS, k=rng.randint(1, 4))
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "label": label})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("toy")
    train = write_jsonl(folder / "train.jsonl", toy_rows(64, 0))
    return train, write_jsonl(folder / "valid.jsonl", toy_rows(30, 1))


def toy_task(pretrained: Path, toy: tuple[Path, Path], **overrides) -> FinetuneTask:
    values = dict(
        model=str(pretrained), train=str(toy[0]), valid=str(toy[1]), text_column="text", label_column="label"
    )
    return FinetuneTask(**{**values, **overrides})


def toy_config(**train):
    config = finetuning_config()
    config.data.max_seq_length = 32
    config.train.batch_size = 8
    config.train.learning_rate = 3e-3
    config.train.log_every = 2
    config.runtime.precision = "fp32"  # the same arithmetic on every machine; "auto" has its own tests
    for key, value in train.items():
        setattr(config.train, key, value)
    return config


def without_clock(result: dict) -> dict:
    return {key: value for key, value in result.items() if key != "elapsed_s"}


def without_speed(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in records]


# ---------------------------------------------------------------------------------------------- model

SIZES = HF_TINY_SIZES


def hf_classifier(num_labels: int):
    config = transformers.BertConfig(**SIZES, num_labels=num_labels, attn_implementation="eager")
    return transformers.BertForSequenceClassification(config).eval()


def padded_batch():
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([12, 7, 4])
    attention_mask = (torch.arange(12) < lengths[:, None]).long()  # (B, T)
    input_ids = torch.randint(1, SIZES["vocab_size"], (3, 12), generator=g) * attention_mask
    token_type_ids = ((torch.arange(12) >= (lengths[:, None] // 2)) & attention_mask.bool()).long()
    return input_ids, token_type_ids, attention_mask


@torch.no_grad()
def test_classifier_matches_hugging_face_both_ways():
    torch.manual_seed(3)
    hf = hf_classifier(3)
    ours = BertForSequenceClassification(ModelConfig(**SIZES), 3).eval()
    assert {k: v.shape for k, v in ours.state_dict().items()} == {
        k: v.shape for k, v in hf.state_dict().items()
    }
    input_ids, token_type_ids, attention_mask = padded_batch()

    ours.load_state_dict(hf.state_dict())
    theirs = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask).logits
    assert theirs.shape == (3, 3)
    torch.testing.assert_close(
        ours(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask),
        theirs,
        rtol=0,
        atol=1e-5,
    )

    fresh = BertForSequenceClassification(ModelConfig(**SIZES), 3).eval()  # other random weights
    hf.load_state_dict(fresh.state_dict())
    theirs = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(
        fresh(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask),
        theirs,
        rtol=0,
        atol=1e-5,
    )


def test_classifier_head_is_initialised_as_hugging_face():
    torch.manual_seed(0)
    model = BertForSequenceClassification(
        ModelConfig(**{**SIZES, "hidden_size": 256, "num_attention_heads": 4}), 50
    )
    assert torch.equal(model.classifier.bias, torch.zeros(50))
    assert model.classifier.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_scores_from_a_confusion_matrix():
    confusion = torch.tensor([[5, 1, 0], [2, 2, 0], [0, 0, 0]])  # the third class never occurs
    result = scores(confusion)
    assert result["accuracy"] == pytest.approx(7 / 10)
    f1_a, f1_b = 2 * 5 / (6 + 7), 2 * 2 / (4 + 3)
    assert result["macro_f1"] == pytest.approx((f1_a + f1_b) / 2)
    # Gorodkin's multi-class MCC: (c s - sum p_k t_k) / sqrt((s^2 - sum p_k^2)(s^2 - sum t_k^2))
    assert result["matthews"] == pytest.approx((7 * 10 - (7 * 6 + 3 * 4)) / ((100 - 58) * (100 - 52)) ** 0.5)


# ---------------------------------------------------------------------------------------------- data


def test_text_pairs_get_segment_ids_zero_then_one(tmp_path, small_tokenizer_dir):
    from bertforge.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(small_tokenizer_dir)
    path = tmp_path / "pairs.csv"
    path.write_text("first,second,label\nthe game was played,in the city,yes\nthe song,the album,no\n")
    data = read_labeled(path, "first", "label", text_pair_column="second")
    examples = encode(tokenizer, data, [0, 1], max_length=32)
    ids, types = examples[0]["input_ids"], examples[0]["token_type_ids"]
    first, second = tokenizer.encode_batch(["the game was played", "in the city"])
    assert ids == [tokenizer.cls_id, *first, tokenizer.sep_id, *second, tokenizer.sep_id]
    assert types == [0] * (len(first) + 2) + [1] * (len(second) + 1)
    single = encode(tokenizer, read_labeled(path, "first", "label"), [0, 1], max_length=32)[0]
    assert set(single["token_type_ids"]) == {0}
    truncated = encode(tokenizer, data, [0, 1], max_length=6)[0]
    assert len(truncated["input_ids"]) == 6 and truncated["token_type_ids"][-1] == 1


def padded_tokens(order: np.ndarray, lengths: np.ndarray, batch_size: int) -> int:
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return sum(lengths[batch].max() * len(batch) for batch in batches)


def test_length_grouped_batches_are_a_shuffled_epoch_with_little_padding():
    lengths = np.random.default_rng(0).integers(3, 64, size=1000)
    order = np.random.default_rng(1).permutation(1000)
    grouped = length_grouped(order, lengths, 32, np.random.default_rng(2), window=10)

    assert sorted(grouped) == list(range(1000))  # every example once
    assert padded_tokens(grouped, lengths, 32) < 1.2 * lengths.sum() < 0.7 * padded_tokens(order, lengths, 32)
    batches = [grouped[i : i + 32] for i in range(0, 1000, 32)]
    assert len(batches[-1]) == 1000 % 32  # the short batch stays last
    spreads = [np.ptp(lengths[batch]) for batch in batches[:-1]]
    assert np.median(spreads) <= 8  # 10 batches a window: a batch spans about a tenth of the lengths
    maxima = [lengths[batch].max() for batch in batches[:-1]]
    assert maxima != sorted(maxima) and maxima != sorted(maxima, reverse=True)  # batches shuffled
    again = length_grouped(order, lengths, 32, np.random.default_rng(2), window=10)
    assert np.array_equal(grouped, again)


def test_length_grouping_is_on_for_finetuning_and_changes_only_the_batches(
    tmp_path, tiny_pretrained_run, toy
):
    assert finetuning_config().train.group_by_length  # (the other tests here fine-tune with it)
    task = toy_task(tiny_pretrained_run, toy, epochs=1)
    for name, grouped in (("grouped", True), ("plain", False)):
        finetune(task, toy_config(group_by_length=grouped), tmp_path / name, show_progress=False)
    grouped, plain = (metrics_lines(tmp_path / name, "train") for name in ("grouped", "plain"))
    valid = [metrics_lines(tmp_path / name, "valid")[-1]["tokens"] for name in ("grouped", "plain")]
    assert valid[0] == valid[1]  # the same real tokens: the epoch
    assert [line["loss"] for line in grouped] != [line["loss"] for line in plain]  # in other batches


# ---------------------------------------------------------------------------------------------- training


@pytest.mark.rendered
def test_tiny_model_learns_a_separable_task(tmp_path, tiny_pretrained_run, toy):
    summary = finetune(
        toy_task(tiny_pretrained_run, toy, epochs=4), toy_config(), tmp_path / "run", show_progress=False
    )
    run = summary["runs"][0]
    assert run["best"]["accuracy"] == 1.0 and run["best"]["macro_f1"] == 1.0
    assert run["labels"] == ["music", "war"]  # string labels, in alphabetical order
    assert run["confusion"] == [[15, 0], [0, 15]]

    out = tmp_path / "run"
    valid = metrics_lines(out, "valid")
    assert [v["epoch"] for v in valid] == [0, 1, 2, 3, 4]  # before fine-tuning, then every epoch
    assert [c["epoch"] for c in metrics_lines(out, "confusion")] == [0, 1, 2, 3, 4]
    assert valid[run["best_epoch"]]["accuracy"] == 1.0
    assert (out / "curves.png").stat().st_size > 10_000
    assert not (out / "checkpoints").exists() and not (out / "best").exists()

    final = out / "final"
    assert sorted(p.name for p in final.iterdir()) == [
        "bertforge_tokenizer.json",
        "config.json",
        "labels.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    weights = read_weights(final / "model.safetensors")
    assert {"classifier.weight", "classifier.bias", "bert.pooler.dense.weight"} <= set(weights)
    assert all(
        k.startswith(("bert.embeddings.", "bert.encoder.", "bert.pooler.", "classifier.")) for k in weights
    )
    assert json.loads((final / "labels.json").read_text()) == {"labels": ["music", "war"], "pairs": False}

    model, tokenizer, labels, config = open_classifier(out)
    predictions = classify(model, tokenizer, labels, ["the army fought a battle", "a song of the album"])
    assert [p["label"] for p in predictions] == ["war", "music"]
    assert sum(predictions[0]["probabilities"].values()) == pytest.approx(1.0)


def test_the_best_epoch_is_chosen_by_the_metric_the_task_names(tmp_path, tiny_pretrained_run, toy):
    task = toy_task(tiny_pretrained_run, toy, epochs=3, best_by="matthews")
    run = finetune(task, toy_config(), tmp_path / "run", show_progress=False)["runs"][0]
    valid = metrics_lines(tmp_path / "run", "valid")
    best = max(valid[1:], key=lambda line: (line["matthews"], -line["classification_loss"]))
    assert run["best_by"] == "matthews" and run["best_epoch"] == best["epoch"]
    assert run["best"]["matthews"] == best["matthews"]
    with pytest.raises(BertforgeError, match="best_by 'pearson' does not score a classification"):
        finetune(
            toy_task(tiny_pretrained_run, toy, epochs=1, best_by="pearson"),
            toy_config(),
            tmp_path / "wrong",
            show_progress=False,
        )
    assert not (tmp_path / "wrong").exists()  # nothing half-written


def test_seeds_are_reproducible_and_differ(tmp_path, tiny_pretrained_run, toy):
    summary = finetune(
        toy_task(tiny_pretrained_run, toy, epochs=1, seeds=[1, 2]),
        toy_config(),
        tmp_path / "seeds",
        show_progress=False,
    )
    config = toy_config()
    config.runtime.seed = 1
    finetune(toy_task(tiny_pretrained_run, toy, epochs=1), config, tmp_path / "again", show_progress=False)

    seed_1, seed_2, again = tmp_path / "seeds" / "seed_1", tmp_path / "seeds" / "seed_2", tmp_path / "again"
    assert without_speed(metrics_lines(seed_1, "train")) == without_speed(metrics_lines(again, "train"))
    assert metrics_lines(seed_1, "valid") == metrics_lines(again, "valid")
    first, second = (
        read_weights(seed_1 / "final" / "model.safetensors"),
        read_weights(again / "final" / "model.safetensors"),
    )
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert metrics_lines(seed_1, "train")[0]["loss"] != metrics_lines(seed_2, "train")[0]["loss"]

    saved = json.loads((tmp_path / "seeds" / "summary.json").read_text())
    assert saved["seeds"] == [1, 2] and saved == json.loads(json.dumps(summary))
    accuracies = [r["best"]["accuracy"] for r in summary["runs"]]
    assert summary["accuracy"]["median"] == pytest.approx(sum(accuracies) / 2)
    assert summary["accuracy"]["spread"] == pytest.approx(max(accuracies) - min(accuracies))


def test_from_scratch_replaces_only_the_encoder(tiny_pretrained_run):
    config, _, encoder = open_encoder(tiny_pretrained_run)
    config.runtime.seed = 5
    tuned = build_classifier(config, 3, encoder)
    scratch = build_classifier(config, 3, None)
    assert torch.equal(
        tuned.bert.embeddings.word_embeddings.weight, encoder["embeddings.word_embeddings.weight"]
    )
    assert not torch.equal(
        scratch.bert.embeddings.word_embeddings.weight, encoder["embeddings.word_embeddings.weight"]
    )
    assert torch.equal(tuned.classifier.weight, scratch.classifier.weight)  # same seed, same head


def test_reinit_pooler_keeps_the_encoder_but_starts_the_pooler_as_from_scratch(tiny_pretrained_run):
    config, _, encoder = open_encoder(tiny_pretrained_run)
    config.runtime.seed = 5
    fresh = build_classifier(config, 3, encoder, reinit_pooler=True)
    tuned = build_classifier(config, 3, encoder)
    scratch = build_classifier(config, 3, None)
    pooler = fresh.bert.pooler.dense.weight
    assert torch.equal(pooler, scratch.bert.pooler.dense.weight)
    assert torch.equal(tuned.bert.pooler.dense.weight, encoder["pooler.dense.weight"])
    assert not torch.equal(pooler, encoder["pooler.dense.weight"])
    layer = "encoder.layer.0.attention.self.query.weight"
    assert torch.equal(fresh.bert.state_dict()[layer], encoder[layer])  # the rest is pretrained
    with pytest.raises(BertforgeError, match="reinit_pooler"):
        task = FinetuneTask("m", "t", "v", "text", "label", from_scratch=True, reinit_pooler=True)
        check_task(task)


def test_from_scratch_run(tmp_path, tiny_pretrained_run, toy):
    finetune(
        toy_task(tiny_pretrained_run, toy, epochs=1), toy_config(), tmp_path / "tuned", show_progress=False
    )
    finetune(
        toy_task(tiny_pretrained_run, toy, epochs=1, from_scratch=True),
        toy_config(),
        tmp_path / "scratch",
        show_progress=False,
    )
    # The scratch arm's encoder starts from its own draw: after one epoch it is far from the pretrained
    # weights, which the tuned arm moved from only a little (epoch 0's losses cannot tell: both heads
    # start near 0, and the two losses agree to float32's last digit).
    key = "embeddings.word_embeddings.weight"
    pretrained = read_weights(tiny_pretrained_run / "final" / "model.safetensors")[f"bert.{key}"]
    moved = {
        arm: (read_weights(tmp_path / arm / "final" / "model.safetensors")[f"bert.{key}"] - pretrained)
        .abs()
        .mean()
        for arm in ("tuned", "scratch")
    }
    assert moved["scratch"] > 5 * moved["tuned"], moved
    assert json.loads((tmp_path / "scratch" / "finetune.json").read_text())["task"]["from_scratch"] is True


def test_resume_after_an_interruption_gives_the_uninterrupted_run(
    tmp_path, tiny_pretrained_run, toy, monkeypatch
):
    task, config = toy_task(tiny_pretrained_run, toy, epochs=3), toy_config()
    finetune(task, config, tmp_path / "full", show_progress=False)

    original = EpochEvaluator.__call__

    def interrupted(self, model):
        if self.epoch == 2:
            raise KeyboardInterrupt  # after epoch 2's last step, before its evaluation and checkpoint
        return original(self, model)

    monkeypatch.setattr(EpochEvaluator, "__call__", interrupted)
    with pytest.raises(KeyboardInterrupt):
        finetune(task, config, tmp_path / "cut", show_progress=False)
    assert (tmp_path / "cut" / "checkpoints").is_dir() and not (tmp_path / "cut" / "final").exists()
    monkeypatch.setattr(EpochEvaluator, "__call__", original)

    finetune(*read_saved_task(tmp_path / "cut"), tmp_path / "cut", resume=True, show_progress=False)
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert metrics_lines(full, "valid") == metrics_lines(cut, "valid")
    assert metrics_lines(full, "confusion") == metrics_lines(cut, "confusion")
    assert without_speed(metrics_lines(full, "train")) == without_speed(metrics_lines(cut, "train"))
    first, second = (
        read_weights(full / "final" / "model.safetensors"),
        read_weights(cut / "final" / "model.safetensors"),
    )
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_a_resume_past_a_damaged_newest_checkpoint_counts_epochs_from_the_one_it_restored(
    tmp_path, tiny_pretrained_run, toy, monkeypatch
):
    task, config = toy_task(tiny_pretrained_run, toy, epochs=3), toy_config()
    config.train.keep_checkpoints = 2
    finetune(task, config, tmp_path / "full", show_progress=False)
    original = EpochEvaluator.__call__

    def interrupted(self, model):
        if self.epoch == 3:
            raise KeyboardInterrupt  # the checkpoints of epochs 1 and 2 are saved
        return original(self, model)

    monkeypatch.setattr(EpochEvaluator, "__call__", interrupted)
    with pytest.raises(KeyboardInterrupt):
        finetune(task, config, tmp_path / "cut", show_progress=False)
    monkeypatch.setattr(EpochEvaluator, "__call__", original)
    newest = list_checkpoints(tmp_path / "cut")[-1]
    (newest / "state.json").write_text('{"step": ')  # torn: the resume goes back to epoch 1's
    with pytest.warns(UserWarning, match="state.json"):
        finetune(*read_saved_task(tmp_path / "cut"), tmp_path / "cut", resume=True, show_progress=False)
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert [line["epoch"] for line in metrics_lines(cut, "valid")] == [0, 1, 2, 3]
    assert metrics_lines(full, "valid") == metrics_lines(cut, "valid")


def test_best_epoch_predictions_are_saved_per_validation_example(tmp_path, tiny_pretrained_run, toy):
    summary = finetune(
        toy_task(tiny_pretrained_run, toy, epochs=2), toy_config(), tmp_path / "run", show_progress=False
    )
    run, saved = summary["runs"][0], json.loads((tmp_path / "run" / "valid_predictions.json").read_text())
    assert saved["epoch"] == run["best_epoch"] and saved["labels"] == ["music", "war"]
    assert saved["true"] == [i % 2 for i in range(30)]  # the validation file's labels, in its order
    correct = [p == t for p, t in zip(saved["predicted"], saved["true"], strict=True)]
    assert sum(correct) / len(correct) == pytest.approx(run["best"]["accuracy"])
    assert (
        sum(p == 1 and t == 0 for p, t in zip(saved["predicted"], saved["true"], strict=True))
        == (run["confusion"][0][1])
    )


def test_evaluation_pads_as_little_as_length_sorted_batches_and_predicts_in_file_order(
    tmp_path, tiny_pretrained_run, toy, monkeypatch
):
    """Each epoch's evaluation batches the validation set from its shortest example to its longest;
    the predictions it saves are still the file's order: `classify`'s labels on the kept model."""
    monkeypatch.setattr(finetune_module, "EVAL_BATCH_SIZE", 4)
    task, config = toy_task(tiny_pretrained_run, toy, epochs=4), toy_config()
    job = prepare(task, config, tmp_path / "job", resume=False, show_progress=False)
    texts = [row["text"] for row in toy_rows(30, 1)]
    lengths = [len(ids) for ids, _ in job.tokenizer.encode_pairs(texts, [None] * len(texts), 32)]
    assert len(set(lengths)) > 3  # texts of several lengths: batching in file order pads more
    shortest_first = sorted(lengths)
    least = sum(max(shortest_first[i : i + 4]) * len(shortest_first[i : i + 4]) for i in range(0, 30, 4))
    assert sum(batch["input_ids"].numel() for batch in job.valid_batches) == least

    summary = finetune(task, config, tmp_path / "run", show_progress=False)
    saved = json.loads((tmp_path / "run" / "valid_predictions.json").read_text())
    model, tokenizer, labels, _ = open_classifier(tmp_path / "run" / "final")
    expected = [labels.index(result["label"]) for result in classify(model, tokenizer, labels, texts)]
    assert saved["predicted"] == expected and len(set(expected)) == 2
    assert summary["runs"][0]["best_epoch"] == saved["epoch"]


# ---------------------------------------------------------------------------------------------- comparison

TWO_SEEDS = "ignore:2 seeds support no claim"


def test_compare_with_scratch_pairs_the_arms_seed_by_seed(tmp_path, tiny_pretrained_run, toy):
    task, out = toy_task(tiny_pretrained_run, toy, epochs=1, seeds=[1, 2]), tmp_path / "cmp"
    with pytest.warns(UserWarning, match="use 5 or more"):
        comparison = compare_with_scratch(task, toy_config(), out, show_progress=False)
    assert json.loads((out / "finetune.json").read_text())["task"]["compare_scratch"] is True
    assert json.loads((out / "comparison.json").read_text()) == json.loads(json.dumps(comparison))

    accuracies = {}
    for arm in ("pretrained", "scratch"):
        assert json.loads((out / arm / "summary.json").read_text())["seeds"] == [1, 2]
        for seed in (1, 2):
            assert (out / arm / f"seed_{seed}" / "final").is_dir()
            result = json.loads((out / arm / f"seed_{seed}" / "result.json").read_text())
            accuracies[arm, seed] = result["best"]["accuracy"]
    differences = [accuracies["pretrained", s] - accuracies["scratch", s] for s in (1, 2)]
    assert comparison["pairs"] == [
        {
            "seed": s,
            "pretrained": accuracies["pretrained", s],
            "scratch": accuracies["scratch", s],
            "difference": d,
        }
        for s, d in zip((1, 2), differences, strict=True)
    ]
    assert comparison["difference"]["median"] == pytest.approx(statistics.median(differences))
    assert comparison["scratch"]["min"] == min(accuracies["scratch", s] for s in (1, 2))
    assert comparison["bootstrap"]["gain"] == pytest.approx(sum(differences) / 2)
    assert comparison["bootstrap"]["examples"] == 30 and 0 < comparison["bootstrap"]["p_value"] <= 1
    sign = comparison["sign_test"]
    assert sign["wins"] + sign["losses"] + sign["ties"] == 2 and sign["p_value"] in (0.5, 1.0)

    config = toy_config()  # the scratch arm is exactly a --from-scratch run with the same seed
    config.runtime.seed = 2
    alone = tmp_path / "alone"
    finetune(
        toy_task(tiny_pretrained_run, toy, epochs=1, from_scratch=True), config, alone, show_progress=False
    )
    assert metrics_lines(alone, "valid") == metrics_lines(out / "scratch" / "seed_2", "valid")
    assert metrics_lines(out / "pretrained" / "seed_2", "valid") != metrics_lines(alone, "valid")


@pytest.mark.filterwarnings(TWO_SEEDS)
def test_an_interrupted_comparison_resumes_without_running_finished_seeds_again(
    tmp_path, tiny_pretrained_run, toy, monkeypatch
):
    task, out = toy_task(tiny_pretrained_run, toy, epochs=1, seeds=[1, 2]), tmp_path / "cmp"
    original = Job.run

    def interrupted(self, seed, run_dir, from_scratch):
        if seed == 2 and from_scratch:
            raise KeyboardInterrupt
        return original(self, seed, run_dir, from_scratch)

    monkeypatch.setattr(Job, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        compare_with_scratch(task, toy_config(), out, show_progress=False)
    assert (out / "pretrained" / "seed_2" / "result.json").is_file() and not (
        out / "scratch" / "seed_2"
    ).exists()
    assert not (out / "comparison.json").exists()
    finished = {path: path.stat().st_mtime_ns for path in out.glob("*/seed_*/result.json")}
    assert len(finished) == 3

    monkeypatch.setattr(Job, "run", original)
    trained = []

    def counted(objective, config, run_dir, **kwargs):
        trained.append(run_dir)
        return train(objective, config, run_dir, **kwargs)

    monkeypatch.setattr("bertforge.finetune.train", counted)
    comparison = compare_with_scratch(*read_saved_task(out), out, resume=True, show_progress=False)
    assert trained == [out / "scratch" / "seed_2"]
    assert {path: path.stat().st_mtime_ns for path in finished} == finished
    assert [pair["seed"] for pair in comparison["pairs"]] == [1, 2]


@pytest.mark.filterwarnings(TWO_SEEDS)
def test_runs_at_once_in_workers_end_as_the_serial_runs_and_a_stopped_comparison_resumes_to_them(
    tmp_path, tiny_pretrained_run, toy, capsys, monkeypatch
):
    task, parallel = toy_task(tiny_pretrained_run, toy, epochs=2, seeds=[1, 2]), tmp_path / "parallel"
    advance = RunsProgress.advance

    def signal_after_the_first_run(self, *args):
        advance(self, *args)
        if self.runs_done == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # SIGINT: ignored in a background job

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # the workers' share of 2 threads: the same arithmetic
        serial = compare_with_scratch(task, toy_config(), tmp_path / "serial", show_progress=False)
        torch.set_num_threads(2)
        monkeypatch.setattr(RunsProgress, "advance", signal_after_the_first_run)
        with (
            reporting.reporting_to(parallel, "tensorboard"),
            pytest.raises(Interrupted, match=rf"continue with: bertforge finetune --out {parallel} --resume"),
        ):
            compare_with_scratch(task, toy_config(), parallel, show_progress=False, jobs=2)
        finished = len(list(parallel.glob("*/seed_*/result.json")))
        assert 1 <= finished < 4
        monkeypatch.setattr(RunsProgress, "advance", advance)
        with reporting.reporting_to(parallel, "tensorboard"):
            resumed = compare_with_scratch(*read_saved_task(parallel), parallel, resume=True, jobs=2)
        shutil.rmtree(parallel / "scratch" / "seed_2")  # one run left: alone, with a worker's share
        again = compare_with_scratch(
            *read_saved_task(parallel), parallel, resume=True, jobs=2, show_progress=False
        )
    finally:
        torch.set_num_threads(threads)
    assert again["pairs"] == serial["pairs"]
    assert (again["this_invocation"]["jobs"], again["this_invocation"]["threads_per_run"]) == (1, 1)
    assert serial["this_invocation"]["jobs"] == 1
    assert (resumed["this_invocation"]["jobs"], resumed["this_invocation"]["threads_per_run"]) == (2, 1)
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune: ")]
    assert len(progress) == 4 - finished and progress[-1].startswith("finetune: 4/4 runs: ")  # a line a run
    assert all(
        re.search(r"(pretrained|scratch) seed [12] done, accuracy [01]\.\d{4}", line) for line in progress
    )
    assert resumed["pairs"] == serial["pairs"] and resumed["bootstrap"] == serial["bootstrap"]
    for arm in ("pretrained", "scratch"):
        for seed in (1, 2):
            run = Path(arm) / f"seed_{seed}"
            lines = metrics_lines(parallel / run, "valid")
            assert lines == metrics_lines(tmp_path / "serial" / run, "valid") and len(lines) == 3
            assert list((parallel / "tensorboard" / run).glob("events.out.tfevents.*"))
        summaries = [
            json.loads((out / arm / "summary.json").read_text()) for out in (tmp_path / "serial", parallel)
        ]
        runs = [[without_clock(result) for result in summary["runs"]] for summary in summaries]
        assert runs[0] == runs[1] and [r["seed"] for r in runs[1]] == [1, 2]


def test_compare_with_scratch_refuses_bad_combinations(tmp_path, tiny_pretrained_run, toy):
    for overrides, message in (
        (dict(seeds=[1, 2], from_scratch=True), "drop task.from_scratch"),
        (dict(seeds=[1]), "at least 2 seeds"),
        (dict(seeds=None), "at least 2 seeds"),
    ):
        with pytest.raises(BertforgeError, match=message):
            compare_with_scratch(
                toy_task(tiny_pretrained_run, toy, **overrides), toy_config(), tmp_path / "c"
            )
    with pytest.raises(BertforgeError, match="compare_with_scratch"):
        finetune(
            toy_task(tiny_pretrained_run, toy, seeds=[1, 2], compare_scratch=True),
            toy_config(),
            tmp_path / "c",
        )
    assert not (tmp_path / "c").exists()
