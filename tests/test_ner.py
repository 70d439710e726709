"""Token classification end to end: the tagger against Hugging Face's `BertForTokenClassification`
both ways, fine-tuning on a slice of CoNLL-2003 (entity F1 rises), the comparison with random
weights, the `tag` command's output, export to `pipeline("token-classification")` and back, and bad
input (one error line each)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import HF_TINY_SIZES, SHARED_DATA, assert_clean_failure, metrics_lines, tiny_config
from safetensors.torch import load_file, save_file

from bertforge.checkpoint import read_weights, save_model_folder
from bertforge.classifier import save_classifier
from bertforge.cli import main
from bertforge.commands.finetuning import comparison_table
from bertforge.comparison import compare_with_scratch
from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.export import export_model
from bertforge.finetune import FinetuneTask, build_classifier, finetune, finetuning_config
from bertforge.folders import open_encoder, open_tagger
from bertforge.gpt import GPTLMHeadModel
from bertforge.losses import NO_LABEL
from bertforge.model import BertForTokenClassification
from bertforge.tagger import TOKEN_TASK, tag, token_classifier
from bertforge.tagging import score_tagging
from bertforge.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")

CONLL = SHARED_DATA / "conll2003"
TAGS = ["O", "B-PER", "I-PER"]


def conll_slice(source: Path, out: Path, sentences: int) -> Path:
    """The first `sentences` sentences of a CoNLL file, as distributed (CoNLL-2003's have one blank line
    after each sentence)."""
    lines, count = [], 0
    for line in source.read_text(encoding="utf-8").split("\n"):
        lines.append(line)
        count += not line.strip()
        if count == sentences:
            break
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def conll(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("conll")
    return conll_slice(CONLL / "train.txt", folder / "train.txt", 600), conll_slice(
        CONLL / "dev.txt", folder / "dev.txt", 150
    )


def ner_config(epochs_lr: float = 3e-3):
    config = finetuning_config()
    config.data.max_seq_length = 32  # CoNLL's longer sentences become windows
    config.train.batch_size = 16
    config.train.learning_rate = epochs_lr
    config.train.log_every = 10
    config.runtime.precision = "fp32"
    return config


@pytest.fixture(scope="module")
def tagger_run(tmp_path_factory, tiny_pretrained_run, conll) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("ner") / "run"
    task = FinetuneTask(str(tiny_pretrained_run), str(conll[0]), str(conll[1]), None, None, epochs=4)
    return out, finetune(task, ner_config(), out, show_progress=False)


# ---------------------------------------------------------------------------------------------- model


def padded_batch():
    g = torch.Generator().manual_seed(0)
    attention_mask = (torch.arange(10) < torch.tensor([10, 6, 3])[:, None]).long()  # (B, T)
    input_ids = torch.randint(1, HF_TINY_SIZES["vocab_size"], (3, 10), generator=g) * attention_mask
    return input_ids, torch.zeros_like(input_ids), attention_mask


@torch.no_grad()
def test_tagger_matches_hugging_face_both_ways():
    torch.manual_seed(5)
    config = transformers.BertConfig(**HF_TINY_SIZES, num_labels=5, attn_implementation="eager")
    hf = transformers.BertForTokenClassification(config).eval()
    ours = BertForTokenClassification(ModelConfig(**HF_TINY_SIZES), 5).eval()
    assert {k: v.shape for k, v in ours.state_dict().items()} == {
        k: v.shape for k, v in hf.state_dict().items()
    }
    assert not any("pooler" in key for key in ours.state_dict())
    input_ids, token_type_ids, attention_mask = padded_batch()

    def assert_same(mine: BertForTokenClassification) -> None:
        theirs = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask).logits
        got = mine(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        assert got.shape == (3, 10, 5)
        torch.testing.assert_close(got, theirs, rtol=0, atol=1e-5)

    ours.load_state_dict(hf.state_dict())  # theirs into ours
    assert_same(ours)
    fresh = BertForTokenClassification(ModelConfig(**HF_TINY_SIZES), 5).eval()  # ours into theirs
    hf.load_state_dict(fresh.state_dict())
    assert_same(fresh)


def test_a_gpt_is_refused_as_a_tagger(tmp_path, capsys, small_tokenizer_dir, conll):
    config = tiny_config()
    config.model.objective, config.model.hidden_act, config.model.intermediate_size = "clm", "gelu_new", 128
    config.model.vocab_size = 2000
    with pytest.raises(BertforgeError, match="token classification needs a BERT"):
        token_classifier(config.model, 3)
    save_model_folder(
        tmp_path / "gpt", GPTLMHeadModel(config.model), load_tokenizer(small_tokenizer_dir), config
    )
    argv = ["finetune", "--model", str(tmp_path / "gpt"), "--train", str(conll[0]), "--valid", str(conll[1])]
    assert_clean_failure(capsys, [*argv, "--out", str(tmp_path / "run")], "token classification needs a BERT")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------ training


def test_fine_tuning_on_conll_raises_entity_f1(tagger_run):
    out, summary = tagger_run
    run = summary["runs"][0]
    valid = metrics_lines(out, "valid")
    assert [v["epoch"] for v in valid] == [0, 1, 2, 3, 4]
    assert run["best"]["f1"] == max(v["f1"] for v in valid[1:]) == valid[run["best_epoch"]]["f1"]
    assert run["best"]["f1"] > valid[0]["f1"] + 0.1  # from untrained tags to entities found
    assert run["labels"] == ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    assert run["task_type"] == "ner" and set(run["per_type"]) == {"LOC", "MISC", "ORG", "PER"}
    assert sum(scores["support"] for scores in run["per_type"].values()) > 100
    entities = metrics_lines(out, "entities")
    assert [e["epoch"] for e in entities] == [0, 1, 2, 3, 4] and set(entities[-1]["per_type"]) >= {"PER"}
    train = metrics_lines(out, "train")
    assert train[-1]["tagging_loss"] < train[0]["tagging_loss"]
    assert (out / "curves.png").stat().st_size > 10_000

    final = out / "final"
    assert json.loads((final / "labels.json").read_text())["task"] == TOKEN_TASK
    weights = read_weights(final / "model.safetensors")
    assert {"classifier.weight", "classifier.bias"} <= set(weights) and not any(
        "pooler" in k for k in weights
    )
    predictions = json.loads((out / "valid_predictions.json").read_text())
    assert len(predictions["true"]) == len(predictions["predicted"]) == 150
    assert [len(s) for s in predictions["true"]] == [len(s) for s in predictions["predicted"]]


def test_windows_scored_in_length_order_give_each_sentence_its_own_predictions():
    """Evaluation batches windows from the shortest to the longest; `score_tagging` puts them back in
    file order before joining a long sentence's windows, so any batching order gives the same scores."""
    g = torch.Generator().manual_seed(0)
    names = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    sizes = [7, 4, 9, 5, 8, 3]  # positions of each window, [CLS] and [SEP] included
    sentences = [[0], [1, 2], [3], [4, 5]]  # the windows of each sentence: a long one is cut in two
    logits = [torch.randn(n, len(names), generator=g) for n in sizes]
    labels = []
    for n in sizes:
        row = torch.full((n,), NO_LABEL)
        row[1 : n - 1 : 2] = torch.randint(0, len(names), ((n - 1) // 2,), generator=g)  # words' first pieces
        labels.append(row)
    words = [logit.argmax(-1)[row != NO_LABEL].tolist() for logit, row in zip(logits, labels, strict=True)]
    expected = [[tag for w in windows for tag in words[w]] for windows in sentences]
    truth = [[int(t) for w in windows for t in labels[w][labels[w] != NO_LABEL]] for windows in sentences]

    def batched(order: list[int]):
        """(logits (B, T, K), labels (B, T)) of two windows at a time, padded as evaluation pads."""
        for at in range(0, len(order), 2):
            rows = order[at : at + 2]
            width = max(sizes[r] for r in rows)
            yield (
                torch.stack([F.pad(logits[r], (0, 0, 0, width - sizes[r])) for r in rows]),
                torch.stack([F.pad(labels[r], (0, width - sizes[r]), value=NO_LABEL) for r in rows]),
            )

    in_file_order = score_tagging(batched(list(range(6))), list(range(6)), truth, names)
    by_length = sorted(range(6), key=sizes.__getitem__)
    in_length_order = score_tagging(batched(by_length), by_length, truth, names)
    assert in_file_order[2] == in_length_order[2] == expected
    assert in_length_order[0] == pytest.approx(in_file_order[0]) and in_length_order[1] == in_file_order[1]
    assert 0 < in_file_order[0]["accuracy"] < 1  # some words right, some wrong: the order shows


@pytest.mark.slow
def test_a_comparison_with_random_weights_tests_entity_f1_over_sentences(
    tmp_path, tiny_pretrained_run, conll
):
    task = FinetuneTask(
        str(tiny_pretrained_run), str(conll[0]), str(conll[1]), None, None, epochs=1, seeds=[1, 2]
    )
    comparison = compare_with_scratch(task, ner_config(), tmp_path / "cmp", show_progress=False)
    assert comparison["metric"] == "f1" and comparison["bootstrap"]["examples"] == 150
    assert comparison["bootstrap"]["unit"] == "sentences"
    assert "paired bootstrap over 150 validation sentences (" in comparison_table(comparison)
    pairs = comparison["pairs"]
    assert [p["seed"] for p in pairs] == [1, 2]
    assert all(p["difference"] == pytest.approx(p["pretrained"] - p["scratch"]) for p in pairs)
    summary = json.loads((tmp_path / "cmp" / "scratch" / "summary.json").read_text())
    assert set(summary) >= {"f1", "precision", "last_epoch_f1"}


# ------------------------------------------------------------------------------------------- tagging


@pytest.fixture
def biased_tagger(tmp_path, small_tokenizer_dir):
    """A tagger whose head ignores the text and tags every word with `bias`'s largest tag."""

    def make(bias: list[float]) -> Path:
        config = tiny_config()
        config.model.vocab_size = 2000
        model = BertForTokenClassification(config.model, len(TAGS))
        with torch.no_grad():
            model.classifier.weight.zero_()
            model.classifier.bias.copy_(torch.tensor(bias))
        folder = tmp_path / f"tagger-{bias.index(max(bias))}"
        save_classifier(folder, model, load_tokenizer(small_tokenizer_dir), config, TAGS, TOKEN_TASK)
        return folder

    return make


def test_tag_prints_each_entity_with_its_type_offsets_and_score(biased_tagger, capsys):
    folder = biased_tagger([0.0, 5.0, 0.0])  # every word B-PER: an entity each
    text = "Peter Blackburn met Ada."
    assert main(["tag", "--model", str(folder), text]) == 0
    lines = capsys.readouterr().out.splitlines()
    score = math.exp(5) / (math.exp(5) + 2)
    assert lines[0] == text
    assert lines[1:] == [
        f"  PER    {span:>9}  {score:.4f}  {word}"
        for span, word in (
            ("0-5", "Peter"),
            ("6-15", "Blackburn"),
            ("16-19", "met"),
            ("20-23", "Ada"),
            ("23-24", "."),
        )
    ]
    assert main(["tag", "--model", str(folder), "--json", text, "Rome"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in records] == [text, "Rome"]
    words = records[0]["words"]
    assert [w["word"] for w in words] == ["Peter", "Blackburn", "met", "Ada", "."]
    assert all(text[w["start"] : w["end"]] == w["word"] and w["tag"] == "B-PER" for w in words)
    assert all(e["score"] == pytest.approx(score) for e in records[0]["entities"])


def test_tag_joins_words_into_entities_and_reads_files(biased_tagger, capsys, tmp_path):
    folder = biased_tagger([0.0, 0.0, 5.0])  # every word I-PER: one entity per text (IOB1's start)
    inputs = tmp_path / "texts.txt"
    inputs.write_text("The  European Commission\nsaid it\n", encoding="utf-8")
    assert main(["tag", "--model", str(folder), "--input", str(inputs), "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["entities"][0]["text"] for r in records] == ["The  European Commission", "said it"]
    assert [(e["start"], e["end"]) for r in records for e in r["entities"]] == [(0, 24), (0, 7)]
    folder = biased_tagger([5.0, 0.0, 0.0])
    assert main(["tag", "--model", str(folder), "nothing here"]) == 0
    assert capsys.readouterr().out.splitlines() == ["nothing here", "  (no entities)"]


def test_long_texts_are_tagged_in_windows_put_back_together(tagger_run):
    model, tokenizer, labels, config = open_tagger(tagger_run[0])
    text = " ".join(
        ["Germany said on Thursday that Peter Blackburn of the European Union met in Brussels ."] * 2
    )
    whole = tag(model, tokenizer, labels, [text], max_length=64)[0]  # the model's positions: one window
    windowed = tag(model, tokenizer, labels, [text], max_length=8)[0]
    assert [(w["start"], w["end"]) for w in windowed["words"]] == [
        (w["start"], w["end"]) for w in whole["words"]
    ]
    assert len(whole["words"]) == len(text.split())
    assert all(text[e["start"] : e["end"]] == e["text"] for e in whole["entities"] + windowed["entities"])


def test_texts_tagged_together_in_batches_of_like_length_are_tagged_as_each_alone(tagger_run):
    """Long texts (two windows each at 16 tokens) among short ones, in batches of 2: every word keeps
    its own tag and score, in input order."""
    model, tokenizer, labels, _ = open_tagger(tagger_run[0])
    long = "Germany said on Thursday that Peter Blackburn of the European Union met in Brussels ."
    texts = ["Peter met Anna .", long, "Paris .", long.replace("Germany", "France"), "EU ."]
    together = tag(model, tokenizer, labels, texts, max_length=16, batch_size=2)
    for text, tagged in zip(texts, together, strict=True):
        alone = tag(model, tokenizer, labels, [text], max_length=16)[0]
        assert [(w["word"], w["tag"]) for w in tagged["words"]] == [
            (w["word"], w["tag"]) for w in alone["words"]
        ]
        assert [w["score"] for w in tagged["words"]] == pytest.approx(
            [w["score"] for w in alone["words"]], abs=1e-6
        )
    with pytest.raises(BertforgeError, match="batch_size must be at least 1"):
        tag(model, tokenizer, labels, texts, batch_size=-1)


def test_a_tagger_reads_the_length_it_was_fine_tuned_at_by_default(tagger_run, tmp_path, monkeypatch):
    import bertforge.tagger

    lengths = []
    encode = bertforge.tagger.encode_words

    def recorded(tokenizer, pieces, length):
        lengths.append(length)
        return encode(tokenizer, pieces, length)

    monkeypatch.setattr(bertforge.tagger, "encode_words", recorded)
    export_model(tagger_run[0], tmp_path / "hf")
    for folder in (tagger_run[0], tmp_path / "hf"):
        model, tokenizer, labels, config = open_tagger(folder)
        tag(model, tokenizer, labels, ["Peter Blackburn"])
        assert config.data.max_seq_length == 32 < model.config.max_position_embeddings
    assert lengths == [32, 32]


# -------------------------------------------------------------------------------------- Hugging Face


def test_export_is_a_token_classification_pipeline_with_equal_logits(tagger_run, tmp_path, capsys):
    out = tagger_run[0]
    assert main(["export", "--model", str(out), "--out", str(tmp_path / "hf")]) == 0
    assert "BertForTokenClassification" in capsys.readouterr().out
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_config["architectures"] == ["BertForTokenClassification"]
    model, tokenizer, labels, _ = open_tagger(out)
    assert hf_config["id2label"] == {str(i): name for i, name in enumerate(labels)}
    assert hf_config["label2id"] == {name: i for i, name in enumerate(labels)}

    hf = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "hf").eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    texts = ["EU rejects German call to boycott British lamb .", "Peter Blackburn"]
    encoded = hf_tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = hf(**encoded).logits
        ours = model(
            encoded["input_ids"],
            token_type_ids=encoded["token_type_ids"],
            attention_mask=encoded["attention_mask"],
        )
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)

    pipe = transformers.pipeline("token-classification", model=hf, tokenizer=hf_tokenizer)
    (tagged,) = tag(model, tokenizer, labels, [texts[0]])
    first_pieces = {word["start"]: word for word in tagged["words"]}
    found = [p for p in pipe(texts[0]) if p["start"] in first_pieces]  # the pipeline tags every piece
    expected = [w for w in tagged["words"] if w["tag"] != "O"]
    assert [(p["start"], p["entity"]) for p in found] == [(w["start"], w["tag"]) for w in expected]
    assert all(abs(p["score"] - first_pieces[p["start"]]["score"]) <= 1e-5 for p in found)
    grouped = transformers.pipeline(  # each word read at its first piece, as the README tells
        "token-classification", model=hf, tokenizer=hf_tokenizer, aggregation_strategy="first"
    )
    for text in texts:  # words without inner punctuation, which transformers splits and `tag` does not
        (ours,) = tag(model, tokenizer, labels, [text])
        theirs = grouped(text)
        assert [(e["entity"], e["start"], e["end"]) for e in ours["entities"]] == [
            (e["entity_group"], e["start"], e["end"]) for e in theirs
        ]
        assert [e["score"] for e in theirs] == pytest.approx([e["score"] for e in ours["entities"]], abs=1e-5)

    again, *_ = open_tagger(tmp_path / "hf")  # the export tags as the run did
    torch.testing.assert_close(again.state_dict(), model.state_dict(), rtol=0, atol=0)


@pytest.mark.parametrize("tags, other", [(["O", "S-PER", "B-LOC", "E-LOC"], "S-PER"), (["O", "PER"], "PER")])
def test_a_hugging_face_tagger_without_iob_tags_is_refused(
    tmp_path, small_tokenizer_dir, capsys, tags, other
):
    """BIOES tags, or tags without B- and I-, hold no entities that IOB's rules read."""
    config = transformers.BertConfig(**{**HF_TINY_SIZES, "vocab_size": 2000}, id2label=dict(enumerate(tags)))
    transformers.BertForTokenClassification(config).save_pretrained(tmp_path / "hf")
    load_tokenizer(small_tokenizer_dir).save(tmp_path / "hf")
    capsys.readouterr()  # transformers' progress while saving
    message = f"tags words with {other!r}, which is not a tag of the IOB schemes"
    assert_clean_failure(capsys, ["tag", "--model", str(tmp_path / "hf"), "Rome"], message)


def test_a_hugging_face_tagger_is_read_and_imported(tmp_path, small_tokenizer_dir, capsys):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        **{**HF_TINY_SIZES, "vocab_size": 2000},
        id2label=dict(enumerate(TAGS)),
        label2id={tag: i for i, tag in enumerate(TAGS)},
    )
    hf = transformers.BertForTokenClassification(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    load_tokenizer(small_tokenizer_dir).save(tmp_path / "hf")
    model, tokenizer, labels, _ = open_tagger(tmp_path / "hf")
    assert labels == TAGS
    input_ids, token_type_ids, attention_mask = padded_batch()
    with torch.no_grad():
        expected = hf(input_ids=input_ids, attention_mask=attention_mask).logits
        got = model(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert main(["import-hf", "--from", str(tmp_path / "hf"), "--out", str(tmp_path / "imported")]) == 0
    printed = capsys.readouterr().out
    assert "fine-tuning heads left out: classifier.bias, classifier.weight" in printed
    assert main(["tag", "--model", str(tmp_path / "hf"), "Rome"]) == 0

    # as older transformers versions saved one: an unused pooler, TensorFlow-era LayerNorm names
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    hidden = HF_TINY_SIZES["hidden_size"]
    weights["bert.pooler.dense.weight"], weights["bert.pooler.dense.bias"] = (
        torch.zeros(hidden, hidden),
        torch.zeros(hidden),
    )
    for kind, old_name in (("weight", "gamma"), ("bias", "beta")):
        weights[f"bert.embeddings.LayerNorm.{old_name}"] = weights.pop(f"bert.embeddings.LayerNorm.{kind}")
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    old_style, _, _, config = open_tagger(tmp_path / "hf")
    assert config.data.max_seq_length == HF_TINY_SIZES["max_position_embeddings"]  # as transformers reads it
    with torch.no_grad():
        got = old_style(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------- bad input


def test_a_tagger_is_named_for_what_it_is_and_its_encoder_starts_a_classifier(
    tagger_run, tiny_pretrained_run, tmp_path, capsys
):
    tagger = tagger_run[0] / "final"
    texts = tmp_path / "texts.txt"
    texts.write_text("Rome is old\n", encoding="utf-8")
    embed_argv = ["embed", "--model", str(tagger), "--input", str(texts), "--out", str(tmp_path / "e.npy")]
    message = assert_clean_failure(capsys, embed_argv, "holds a fine-tuned tagger (it has labels.json)")
    assert "use `bertforge tag`" in message
    message = assert_clean_failure(
        capsys, ["tag", "--model", str(tiny_pretrained_run), "Rome"], "not a fine-tuned"
    )
    assert "classifier or tagger" in message

    config, _, encoder = open_encoder(tagger)
    assert not any(name.startswith("pooler.") for name in encoder)  # a tagger has no pooler
    classifier = build_classifier(config, 2, encoder)  # a fresh pooler, the tagger's encoder
    fresh = build_classifier(config, 2, None)
    torch.testing.assert_close(classifier.bert.pooler.dense.weight, fresh.bert.pooler.dense.weight)
    torch.testing.assert_close(
        classifier.bert.embeddings.word_embeddings.weight, encoder["embeddings.word_embeddings.weight"]
    )


def test_bad_tagged_input_gives_one_error_line(tmp_path, capsys, tiny_pretrained_run, conll, biased_tagger):
    def finetune_argv(train: Path, valid: Path, *extra: str) -> list[str]:
        out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        return ["finetune", "--model", str(tiny_pretrained_run), "--train", str(train), "--valid", str(valid),
                "--out", str(out), "--max-length", "32", *extra]  # fmt: skip

    columns = tmp_path / "columns.txt"
    columns.write_text("EU NNP B-ORG\nrejects O\nGerman NNP B-MISC\n", encoding="utf-8")
    untagged = tmp_path / "untagged.txt"
    untagged.write_text("EU B-ORG\nrejects\nGerman B-MISC\n", encoding="utf-8")  # a word without its tag
    for task in (["--task", "ner"], []):  # a short line does not stop the file being seen as tagged
        assert_clean_failure(
            capsys, finetune_argv(columns, conll[1], *task), "columns.txt line 2 has 2 columns"
        )
        assert_clean_failure(
            capsys, finetune_argv(untagged, conll[1], *task), "untagged.txt line 2 has 1 column"
        )
    packed = tmp_path / "train.txt.gz"
    packed.write_bytes(gzip.compress(conll[0].read_bytes()))
    assert_clean_failure(
        capsys, finetune_argv(packed, conll[1]), f"`gunzip -c {packed} > {tmp_path / 'train.txt'}`"
    )
    unseen = tmp_path / "unseen.txt"
    unseen.write_text("Rome B-LOC\nis O\n\nAda B-PERSON\n", encoding="utf-8")
    assert_clean_failure(
        capsys,
        finetune_argv(conll[0], unseen),
        "unseen.txt line 4: the tag 'B-PERSON' is not in the training file",
    )
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    assert_clean_failure(capsys, finetune_argv(conll[0], empty, "--task", "ner"), "empty.txt is empty")
    err = assert_clean_failure(capsys, finetune_argv(empty, conll[1], "--task", "ner"), "empty.txt is empty")
    assert "a token and its tag a line" in err  # what a tagged file holds, not a table's rows
    assert_clean_failure(capsys, finetune_argv(empty, conll[1]), "empty.txt is empty")  # not: give columns
    without_valid = [a for a in finetune_argv(*conll) if a not in ("--valid", str(conll[1]))]
    assert_clean_failure(capsys, without_valid, "finetune needs --valid")
    from bertforge.cli import build_parser
    from bertforge.commands.finetuning import tagged_task

    assert tagged_task(
        build_parser().parse_args(finetune_argv(*conll, "--task", "auto"))
    )  # as with no --task
    lines = conll[0].read_text(encoding="utf-8").splitlines()
    typo = tmp_path / "typo.txt"  # a typo among the lines that tell a tagged file: its line is named
    typo.write_text("\n".join([*lines[:5], "Smith NNP B-NP PER", *lines[5:]]) + "\n", encoding="utf-8")
    assert_clean_failure(capsys, finetune_argv(typo, conll[1]), "typo.txt line 6: the tag 'PER' is not O")
    assert_clean_failure(
        capsys, finetune_argv(*conll, "--task", "regression"), "looks like a tagged file (a token and its tag"
    )
    assert_clean_failure(capsys, finetune_argv(*conll, "--reinit-pooler"), "drop --reinit-pooler")
    assert_clean_failure(
        capsys, [*finetune_argv(*conll)[:-2], "--max-length", "2"], "--max-length must be between 3 and"
    )  # [CLS] a word [SEP], not NSP's pair
    ids = tmp_path / "ids.jsonl"  # as a datasets export writes them: the tags as numbers
    ids.write_text(json.dumps({"tokens": ["EU", "rejects"], "ner_tags": [3, 0]}) + "\n", encoding="utf-8")
    assert_clean_failure(capsys, finetune_argv(ids, ids), "or --task ner for words tagged one a line")
    named = ["--text-column", "tokens", "--label-column", "ner_tags"]
    assert_clean_failure(capsys, finetune_argv(ids, ids, *named), "'ner_tags' holds numbers (tag ids)")
    as_table = [*named, "--task", "classification"]
    assert_clean_failure(capsys, finetune_argv(ids, ids, *as_table), "'tokens' holds a list, as tagged")
    assert not any(path.name.startswith("run") for path in tmp_path.iterdir())

    tagger = biased_tagger([0.0, 5.0, 0.0])
    assert_clean_failure(capsys, ["classify", "--model", str(tagger), "Rome"], "use `bertforge tag`")
    assert_clean_failure(capsys, ["tag", "--model", str(tagger)], "give texts to tag, or --input FILE")
