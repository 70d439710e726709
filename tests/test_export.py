"""bertforge.export: Hugging Face loads our exports with equal logits, our tokenizer and theirs agree,
imports give equal logits, a run starts from an import, round trips are exact, bad folders are refused."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
import torch
from conftest import WIKI_VALID, assert_clean_failure, tiny_config
from safetensors.torch import load_file, save_file

import bertforge
from bertforge.checkpoint import read_weights, save_model_folder
from bertforge.config import RunConfig, save_json
from bertforge.errors import BertforgeError
from bertforge.export import export_model, import_hf
from bertforge.infer import fill_mask
from bertforge.model import BertForPreTraining
from bertforge.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")

TOL = 1e-5
LABELS = ["negative", "neutral", "positive"]
TEXTS = [
    "the game was released in japan in 1997 .",
    "he was born in the city of london and studied history .",
    "the river",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory, small_tokenizer_dir):
    """A run folder with a randomly initialised tiny model (spread-out weights) in final/."""
    tokenizer = load_tokenizer(small_tokenizer_dir)
    config = tiny_config()
    config.model.vocab_size = tokenizer.vocab_size
    config.model.initializer_range = 0.2  # logits far from uniform, so top-k orders are not near-ties
    torch.manual_seed(0)
    run = tmp_path_factory.mktemp("export") / "run"
    save_model_folder(run / "final", BertForPreTraining(config.model), tokenizer, config)
    return run


@pytest.fixture(scope="module")
def exported(run):
    return export_model(run, run.parent / "hf")["out"]


def batch(tokenizer):
    """TEXTS as right-padded pairs with segment ids (the last one alone), as tensors."""
    encoded = [
        tokenizer.encode_pair(TEXTS[0], TEXTS[1]),
        tokenizer.encode_pair(TEXTS[1]),
        tokenizer.encode_pair(TEXTS[2]),
    ]
    width = max(len(ids) for ids, _ in encoded)
    ids = torch.tensor([ids + [0] * (width - len(ids)) for ids, _ in encoded])
    types = torch.tensor([t + [0] * (width - len(t)) for _, t in encoded])
    return ids, types, (ids != 0).long()


def max_diff(a, b) -> float:
    """The largest absolute difference, for checks that two outputs differ (agreement is checked
    with `torch.testing.assert_close`)."""
    return (a - b).abs().max().item()


def test_export_writes_the_hugging_face_files(exported):
    names = sorted(p.name for p in exported.iterdir())
    for name in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        assert name in names
    assert "special_tokens_map.json" in names
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["BertForPreTraining"] and config["model_type"] == "bert"
    assert not [p for p in exported.parent.iterdir() if p.name.startswith(".hf.tmp")]  # written atomically


@torch.no_grad()
def test_hugging_face_classes_load_the_export_with_equal_logits(exported):
    ours, tokenizer = bertforge.load(exported.parent / "run")
    ids, types, mask = batch(tokenizer)
    mlm, nsp = ours(ids, token_type_ids=types, attention_mask=mask)
    real = mask.bool()

    model, info = transformers.BertForPreTraining.from_pretrained(exported, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    out = model.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask)
    torch.testing.assert_close(out.prediction_logits[real], mlm[real], rtol=0, atol=TOL)
    torch.testing.assert_close(out.seq_relationship_logits, nsp, rtol=0, atol=TOL)

    for cls in (transformers.BertForMaskedLM, transformers.AutoModelForMaskedLM):
        model, info = cls.from_pretrained(exported, output_loading_info=True)
        assert not info["missing_keys"]
        logits = model.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
        torch.testing.assert_close(logits[real], mlm[real], rtol=0, atol=TOL)

    model, info = transformers.BertModel.from_pretrained(exported, output_loading_info=True)
    assert not info["missing_keys"]
    out = model.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask)
    hidden, pooled = ours.bert(ids, token_type_ids=types, attention_mask=mask)
    torch.testing.assert_close(out.last_hidden_state[real], hidden[real], rtol=0, atol=TOL)
    torch.testing.assert_close(out.pooler_output, pooled, rtol=0, atol=TOL)


def test_pipeline_fill_mask_equals_bertforge_fill_mask(exported, capsys):
    from bertforge.cli import main

    text = "the game was [MASK] in japan ."
    assert main(["fill-mask", "--model", str(exported.parent / "run"), text, "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)["masks"][0]
    ranked = transformers.pipeline("fill-mask", model=str(exported), top_k=100)(text)
    # The pipeline also offers `##` pieces where a word starts, and special tokens; bertforge leaves them out.
    special = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    theirs = [p for p in ranked if not p["token_str"].startswith("##") and p["token_str"] not in special][:5]
    assert len(theirs) == 5 and len(ours) == 5
    assert [p["token"] for p in theirs] == [p["token_id"] for p in ours]
    assert [p["token_str"] for p in theirs] == [p["token"] for p in ours]
    for a, b in zip(theirs, ours, strict=True):
        assert a["score"] == pytest.approx(b["score"], abs=TOL)


def test_pipelines_truncate_long_texts_to_the_models_positions(exported, run):
    positions = json.loads((exported / "config.json").read_text())["max_position_embeddings"]
    for folder in (exported, run / "final"):  # a model folder's tokenizer files say the same
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        assert len(tokenizer("word " * (2 * positions), truncation=True)["input_ids"]) == positions
    fill = transformers.pipeline("fill-mask", model=str(exported))
    assert len(fill("the [MASK] " + "word " * (2 * positions), tokenizer_kwargs={"truncation": True})) == 5


def test_the_tokenizer_files_name_the_length_the_model_trained_at(tmp_path, run):
    model, tokenizer = bertforge.load(run)
    config = RunConfig.from_dict(json.loads((run / "final" / "config.json").read_text()))
    config.data.max_seq_length = 32  # of its 64 positions
    save_model_folder(tmp_path / "short" / "final", model, tokenizer, config)
    exported = export_model(tmp_path / "short", tmp_path / "hf")["out"]
    for folder in (tmp_path / "short" / "final", exported):
        assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == 32
        hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        assert len(hf_tokenizer("word " * 100, truncation=True)["input_ids"]) == 32
    assert json.loads((exported / "config.json").read_text())["max_position_embeddings"] == 64


def test_hugging_face_tokenizers_give_our_ids_on_wikitext_validation(exported):
    ours = load_tokenizer(exported)
    fast = transformers.BertTokenizerFast.from_pretrained(exported)
    auto = transformers.AutoTokenizer.from_pretrained(exported)
    lines = WIKI_VALID.read_text(encoding="utf-8").splitlines()
    assert len(lines) > 3000
    for start in range(0, len(lines), 1000):
        chunk = lines[start : start + 1000]
        expected = ours.encode_batch(chunk)
        assert fast(chunk, add_special_tokens=False)["input_ids"] == expected
        if start == 0:
            assert auto(chunk, add_special_tokens=False)["input_ids"] == expected
    ids, types = ours.encode_pair(lines[1], lines[3])
    encoded = fast(lines[1], lines[3])
    assert encoded["input_ids"] == ids and encoded["token_type_ids"] == types
    texts = [line for line in lines if line.strip()][:400]  # pairs of all lengths, truncated longest first
    firsts, seconds = texts[0::2], texts[1::2]
    for length in (33, 34):  # budgets of 30 and 31 tokens: an odd one goes to the longer text
        pairs = ours.encode_pairs(firsts, seconds, max_length=length)
        encoded = fast(firsts, seconds, truncation="longest_first", max_length=length)
        assert [ids for ids, _ in pairs] == encoded["input_ids"]
        assert [types for _, types in pairs] == encoded["token_type_ids"]
        assert sum(len(ids) == length for ids, _ in pairs) > 100
    for a, b in [(n, m) for n in range(12) for m in range(12)]:  # every case, at budgets of 4 to 8
        first, second = " ".join(["the"] * a) or "a", " ".join(["of"] * b) or "a"
        for length in range(7, 12):
            (ids, _), *_ = ours.encode_pairs([first], [second], max_length=length)
            assert ids == fast(first, second, truncation="longest_first", max_length=length)["input_ids"]


def test_export_then_import_gives_identical_weights(exported, tmp_path, run):
    result = import_hf(exported, tmp_path / "imported")
    assert result["initialised"] == [] and result["dropped"] == []
    original = read_weights(run / "final" / "model.safetensors")
    again = read_weights(tmp_path / "imported" / "model.safetensors")
    assert sorted(original) == sorted(again)
    assert all(torch.equal(original[k], again[k]) for k in original)
    original_config = json.loads((run / "final" / "config.json").read_text())
    assert json.loads((tmp_path / "imported" / "config.json").read_text()) == original_config
    assert (tmp_path / "imported" / "tokenizer.json").read_text() == (
        run / "final" / "tokenizer.json"
    ).read_text()


def test_load_opens_an_exported_folder(exported, run):
    model, tokenizer = bertforge.load(exported)
    reference, _ = bertforge.load(run)
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), reference.state_dict().values(), strict=True)
    )
    assert fill_mask(model, tokenizer, "the [MASK] .") == fill_mask(reference, tokenizer, "the [MASK] .")


# ------------------------------------------------------------------------------------ import


def hf_config(**overrides):
    sizes = dict(
        vocab_size=2000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    return transformers.BertConfig(**{**sizes, "max_position_embeddings": 64, **overrides})


def save_hf_folder(folder, model, tokenizer_dir, vocab_only: bool = False):
    """A Hugging Face folder as `save_pretrained` writes it, plus the tokenizer files."""
    model.save_pretrained(folder)
    names = ["vocab.txt"] if vocab_only else ["tokenizer.json", "vocab.txt"]
    for name in names:
        shutil.copy(tokenizer_dir / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def hf_pretraining(tmp_path_factory, small_tokenizer_dir):
    torch.manual_seed(1)
    model = transformers.BertForPreTraining(hf_config(initializer_range=0.2)).eval()
    return model, save_hf_folder(tmp_path_factory.mktemp("hf") / "bert", model, small_tokenizer_dir)


@torch.no_grad()
def assert_same_logits(hf_model, folder, tokenizer_dir):
    ours, tokenizer = bertforge.load(folder)
    ids, types, mask = batch(load_tokenizer(tokenizer_dir))
    mlm, nsp = ours(ids, token_type_ids=types, attention_mask=mask)
    out = hf_model(input_ids=ids, token_type_ids=types, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(out.prediction_logits[real], mlm[real], rtol=0, atol=TOL)
    torch.testing.assert_close(out.seq_relationship_logits, nsp, rtol=0, atol=TOL)


@pytest.mark.parametrize("activation", ["gelu_pytorch_tanh", "gelu_fast", "swish"])
def test_import_reads_hugging_faces_other_names_of_an_activation(tmp_path, small_tokenizer_dir, activation):
    torch.manual_seed(1)
    model = transformers.BertForPreTraining(hf_config(initializer_range=0.2, hidden_act=activation)).eval()
    folder = save_hf_folder(tmp_path / "bert", model, small_tokenizer_dir)
    import_hf(folder, tmp_path / "imported")
    assert_same_logits(model, tmp_path / "imported", small_tokenizer_dir)


def test_import_gives_equal_logits(hf_pretraining, tmp_path, small_tokenizer_dir):
    model, folder = hf_pretraining
    result = import_hf(folder, tmp_path / "imported")
    assert result["initialised"] == [] and result["dropped"] == []
    names = sorted(p.name for p in (tmp_path / "imported").iterdir())
    assert names == [
        "bertforge_tokenizer.json",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    config = RunConfig.from_dict(json.loads((tmp_path / "imported" / "config.json").read_text()))
    assert config.model.hidden_size == 32 and config.model.max_position_embeddings == 64
    assert_same_logits(model, tmp_path / "imported", small_tokenizer_dir)
    assert_same_logits(model, folder, small_tokenizer_dir)  # bertforge.load reads the HF folder itself


def test_import_pytorch_bin_with_tied_keys_and_a_vocab_only_tokenizer(
    tmp_path, hf_pretraining, small_tokenizer_dir
):
    model, folder = hf_pretraining
    source = tmp_path / "bin"
    source.mkdir()
    shutil.copy(folder / "config.json", source / "config.json")
    shutil.copy(small_tokenizer_dir / "vocab.txt", source / "vocab.txt")
    (source / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"].clone()
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"].clone()
    torch.save(state, source / "pytorch_model.bin")
    import_hf(source, tmp_path / "imported")
    assert_same_logits(model, tmp_path / "imported", small_tokenizer_dir)


def test_import_a_masked_lm_draws_the_missing_heads(tmp_path, small_tokenizer_dir):
    torch.manual_seed(2)
    model = transformers.BertForMaskedLM(hf_config()).eval()
    folder = save_hf_folder(tmp_path / "mlm", model, small_tokenizer_dir)
    result = import_hf(folder, tmp_path / "imported")
    assert {name.rsplit(".", 1)[0] for name in result["initialised"]} == {
        "bert.pooler.dense",
        "cls.seq_relationship",
    }
    ours, tokenizer = bertforge.load(tmp_path / "imported")
    ids, types, mask = batch(tokenizer)
    with torch.no_grad():
        mlm, _ = ours(ids, token_type_ids=types, attention_mask=mask)
        logits = model(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    torch.testing.assert_close(logits[mask.bool()], mlm[mask.bool()], rtol=0, atol=TOL)


def test_heads_an_import_drew_fresh_are_refused_where_they_are_read(tmp_path, capsys, small_tokenizer_dir):
    from bertforge.cli import main

    torch.manual_seed(2)
    masked_lm = save_hf_folder(
        tmp_path / "mlm", transformers.BertForMaskedLM(hf_config()), small_tokenizer_dir
    )
    bare = save_hf_folder(tmp_path / "bare", transformers.BertModel(hf_config()), small_tokenizer_dir)
    capsys.readouterr()  # transformers' progress bars
    assert import_hf(masked_lm, tmp_path / "imported_mlm")["untrained"] == ["nsp"]
    assert import_hf(bare, tmp_path / "imported_bare")["untrained"] == ["mlm", "nsp"]
    pair = ["the cat sat .", "it slept ."]
    for folder in (masked_lm, tmp_path / "imported_mlm"):  # the Hugging Face folder itself, and its import
        assert_clean_failure(
            capsys, ["nsp", "--model", str(folder), *pair], "has no trained next-sentence head"
        )
        assert main(["fill-mask", "--model", str(folder), "the [MASK] sat ."]) == 0
        capsys.readouterr()
    for folder in (bare, tmp_path / "imported_bare"):
        assert_clean_failure(
            capsys,
            ["fill-mask", "--model", str(folder), "the [MASK] sat ."],
            "no trained masked-language-model head",
        )
    assert bertforge.load(tmp_path / "imported_bare")  # the encoder itself opens, to fine-tune or pretrain
    export_model(tmp_path / "imported_bare", tmp_path / "exported_bare")  # its export keeps the note
    assert import_hf(tmp_path / "exported_bare", tmp_path / "reimported")["untrained"] == ["mlm", "nsp"]
    for folder in (tmp_path / "exported_bare", tmp_path / "reimported"):
        assert_clean_failure(capsys, ["fill-mask", "--model", str(folder), "the [MASK] sat ."], "no trained")


def test_import_a_vocabulary_in_googles_order(tmp_path, small_tokenizer_dir):
    """Google's vocab.txt puts [PAD] at 0 and [UNK] [CLS] [SEP] [MASK] at 100-103, after [unused*]."""
    tokens = (small_tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    specials, words = tokens[:5], tokens[5:]
    google = [specials[0], *words[:99], *specials[1:], *words[99:]]
    torch.manual_seed(3)
    model = transformers.BertForPreTraining(hf_config(initializer_range=0.2)).eval()
    source = tmp_path / "google"
    model.save_pretrained(source)
    (source / "vocab.txt").write_text("\n".join(google) + "\n", encoding="utf-8")
    (source / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))

    import_hf(source, tmp_path / "imported")
    ours, tokenizer = bertforge.load(tmp_path / "imported")
    assert tokenizer.special_ids == (0, 100, 101, 102, 103)
    theirs = transformers.AutoTokenizer.from_pretrained(source)
    for a, b in [(TEXTS[0], TEXTS[1]), (TEXTS[2], None)]:
        ids, types = tokenizer.encode_pair(a, b)
        expected = theirs(a, b)
        assert ids == expected["input_ids"] and types == expected["token_type_ids"]
        assert ids[0] == 101 and ids[-1] == 102
    ids, types, mask = batch(tokenizer)
    with torch.no_grad():
        mlm, nsp = ours(ids, token_type_ids=types, attention_mask=mask)
        out = model(input_ids=ids, token_type_ids=types, attention_mask=mask)
    torch.testing.assert_close(out.prediction_logits[mask.bool()], mlm[mask.bool()], rtol=0, atol=TOL)
    torch.testing.assert_close(out.seq_relationship_logits, nsp, rtol=0, atol=TOL)


def test_pretraining_starts_from_an_imported_model(tmp_path, hf_pretraining, wiki_slice, capsys):
    from bertforge.cli import main

    _, folder = hf_pretraining
    assert main(["import-hf", "--from", str(folder), "--out", str(tmp_path / "imported")]) == 0
    assert "pretrain --init" in capsys.readouterr().out
    run = tmp_path / "run"
    argv = ["pretrain", "--init", str(tmp_path / "imported"), "--corpus", str(wiki_slice), "--out", str(run)]
    argv += ["--max-steps", "1", "--lr", "1e-4", "--set", "data.max_seq_length=64"]
    argv += ["--set", "train.schedule=constant", "--set", "train.warmup_ratio=0"]  # the one step has lr 1e-4
    assert main(argv) == 0, capsys.readouterr().err
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["hidden_size"] == 32  # the imported model's size
    assert (run / "tokenizer" / "vocab.txt").read_text() == (tmp_path / "imported" / "vocab.txt").read_text()
    start = read_weights(tmp_path / "imported" / "model.safetensors")
    end = read_weights(run / "final" / "model.safetensors")
    # One step at lr 1e-4 moves each weight by about 1e-4; a fresh init would differ by ~0.02.
    for name in (
        "bert.embeddings.word_embeddings.weight",
        "bert.encoder.layer.0.attention.self.query.weight",
    ):
        assert 0 < max_diff(start[name], end[name]) < 2e-3


def test_init_conflicts_with_preset_and_tokenizer(tmp_path, capsys, wiki_slice, small_tokenizer_dir):
    argv = ["pretrain", "--init", str(tmp_path), "--corpus", str(wiki_slice), "--out", str(tmp_path / "r")]
    brings = "--init brings its own model size, objective and tokenizer: drop"
    assert_clean_failure(capsys, [*argv, "--preset", "mini"], f"{brings} --preset\n")
    assert_clean_failure(capsys, [*argv, "--tokenizer", str(small_tokenizer_dir)], f"{brings} --tokenizer\n")
    assert_clean_failure(
        capsys, [*argv, "--resume"], "--init starts a new run from a model and --resume continues"
    )
    shaping = [
        "--set",
        "model.hidden_size=256",
        "--set",
        "tokenizer.vocab_size=99",
        "--set",
        "model.hidden_dropout_prob=0",
    ]
    message = (
        "--init brings its own model and tokenizer: drop --set model.hidden_size, tokenizer.vocab_size, "
        "model.hidden_dropout_prob"
    )
    assert_clean_failure(capsys, [*argv, *shaping], message)


# ------------------------------------------------------------------------------------ classifier


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, small_tokenizer_dir):
    """A fine-tuned classifier folder as `finetune` writes it, from a random HF classifier."""
    torch.manual_seed(3)
    hf = transformers.BertForSequenceClassification(
        hf_config(num_labels=len(LABELS), initializer_range=0.2)
    ).eval()
    folder = tmp_path_factory.mktemp("classifier") / "model"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(folder / "model.safetensors"))
    config = tiny_config()
    config.model.vocab_size = 2000
    save_json(config, folder / "config.json")
    (folder / "labels.json").write_text(json.dumps({"labels": LABELS}))
    load_tokenizer(small_tokenizer_dir).save(folder)
    return hf, folder


@pytest.mark.parametrize("problem, labels", [("multi_label_classification", 3), ("regression", 2)])
def test_a_hugging_face_classifier_of_another_problem_type_is_refused(
    tmp_path, capsys, small_tokenizer_dir, problem, labels
):
    """A sigmoid per label, or several scores: not one softmax or one score, as bertforge reads them."""
    names = {"id2label": {i: f"label {i}" for i in range(labels)}}
    hf = transformers.BertForSequenceClassification(hf_config(problem_type=problem, **names))
    folder = save_hf_folder(tmp_path / "hf", hf, small_tokenizer_dir)
    capsys.readouterr()  # transformers' progress while saving
    argv = ["classify", "--model", str(folder), "a text"]
    assert_clean_failure(capsys, argv, f"has problem_type = {problem!r}")


def test_classifier_export_loads_in_hugging_face_with_its_labels(classifier, tmp_path):
    hf, folder = classifier
    result = export_model(folder, tmp_path / "hf")
    assert result["architecture"] == "BertForSequenceClassification"
    out = tmp_path / "hf"
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["num_labels"] == 3
    model, info = transformers.BertForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert [model.config.id2label[i] for i in range(3)] == LABELS
    assert model.config.label2id == {label: i for i, label in enumerate(LABELS)}
    tokenizer = load_tokenizer(folder)
    ids, types, mask = batch(tokenizer)
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
        got = model.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    torch.testing.assert_close(expected, got, rtol=0, atol=TOL)
    classify = transformers.pipeline("text-classification", model=str(out))
    predictions = classify(TEXTS)
    assert all(p["label"] in LABELS for p in predictions)
    probabilities = expected[1].softmax(-1)  # row 1 of the batch is TEXTS[1] alone, as the pipeline sees it
    assert predictions[1]["label"] == LABELS[int(probabilities.argmax())]
    assert predictions[1]["score"] == pytest.approx(probabilities.max().item(), abs=TOL)
    assert (
        load_file(str(out / "model.safetensors")).keys()
        == load_file(str(folder / "model.safetensors")).keys()
    )


def test_classifier_with_labels_that_do_not_match_its_head(classifier, tmp_path):
    _, folder = classifier
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "labels.json").write_text(json.dumps({"labels": ["a", "b"]}))
    with pytest.raises(BertforgeError, match="classifier.weight has shape"):
        export_model(broken, tmp_path / "out")
    (broken / "labels.json").write_text(json.dumps({"labels": ["a", "a", "b"]}))
    with pytest.raises(BertforgeError, match="distinct"):
        export_model(broken, tmp_path / "out")
    with pytest.raises(BertforgeError, match="fine-tuned classifier"):
        bertforge.load(folder)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------ refusals


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_an_edited_checkpoint_is_refused_by_export_and_by_fine_tuning(tmp_path, capsys, tiny_pretrained_run):
    """Each reader of a checkpoint checks its files against the hashes written with them."""
    from bertforge.folders import open_encoder

    run = broken_copy(tmp_path, tiny_pretrained_run, "edited")
    checkpoint = sorted((run / "checkpoints").iterdir())[-1]
    config = checkpoint / "config.json"
    config.write_text(config.read_text().replace('"gelu"', '"relu"'))
    assert '"relu"' in config.read_text()
    message = "config.json differs from what was written (sha256 mismatch)"
    assert_clean_failure(
        capsys, ["export", "--model", str(checkpoint), "--out", str(tmp_path / "o")], message
    )
    assert not (tmp_path / "o").exists()
    with pytest.raises(BertforgeError, match=re.escape(message)):
        open_encoder(checkpoint)


def broken_copy(tmp_path, folder, name="broken"):
    copy = tmp_path / name
    shutil.copytree(folder, copy)
    return copy


def test_a_hugging_face_bert_of_one_segment_type_fills_masks_and_imports(
    tmp_path, capsys, small_tokenizer_dir
):
    """type_vocab_size = 1 (no NSP head, no second segment): read as a masked language model."""
    torch.manual_seed(2)
    hf = transformers.BertForMaskedLM(hf_config(type_vocab_size=1)).eval()
    folder = save_hf_folder(tmp_path / "hf", hf, small_tokenizer_dir)
    from bertforge.cli import main

    assert main(["fill-mask", "--model", str(folder), "the [MASK] was released ."]) == 0
    assert main(["import-hf", "--from", str(folder), "--out", str(tmp_path / "imported")]) == 0
    ours, tokenizer = bertforge.load(tmp_path / "imported")
    ids = torch.tensor([tokenizer.encode_pair("the game was released .", None)[0]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids)[0], hf(input_ids=ids).logits, rtol=0, atol=TOL)


def test_import_refuses_what_is_not_a_bert(tmp_path, capsys, hf_pretraining, run):
    _, folder = hf_pretraining

    def refused(source, message):
        assert_clean_failure(
            capsys, ["import-hf", "--from", str(source), "--out", str(tmp_path / "out")], message
        )
        assert not (tmp_path / "out").exists()

    other = broken_copy(tmp_path, folder, "gpt2")
    edit_config(other, model_type="gpt2")
    refused(other, "holds a 'gpt2' model")

    no_weights = broken_copy(tmp_path, folder, "no_weights")
    (no_weights / "model.safetensors").unlink()
    refused(no_weights, "has no weights")

    wrong_shapes = broken_copy(tmp_path, folder, "shapes")
    edit_config(wrong_shapes, intermediate_size=48)
    refused(wrong_shapes, "but config.json's sizes say (48")

    missing_encoder = broken_copy(tmp_path, folder, "missing")
    weights = load_file(str(missing_encoder / "model.safetensors"))
    del weights["bert.encoder.layer.1.output.dense.weight"]
    save_file(weights, str(missing_encoder / "model.safetensors"))
    refused(missing_encoder, "missing ['bert.encoder.layer.1.output.dense.weight']")

    refused(run / "final", "no model_type; it is not a Hugging Face model config (it is bertforge's own: use")
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "empty", "has no config.json")

    no_tokenizer = broken_copy(tmp_path, folder, "no_tokenizer")
    (no_tokenizer / "tokenizer.json").unlink()
    (no_tokenizer / "vocab.txt").unlink()
    refused(no_tokenizer, "neither tokenizer.json nor vocab.txt")

    no_mask = broken_copy(tmp_path, folder, "no_mask")
    (no_mask / "tokenizer.json").unlink()
    tokens = (no_mask / "vocab.txt").read_text().splitlines()
    tokens[4] = "[MASK2]"
    (no_mask / "vocab.txt").write_text("\n".join(tokens) + "\n")
    refused(no_mask, "no_mask/vocab.txt lacks [MASK]")

    decoder = broken_copy(tmp_path, folder, "decoder")
    edit_config(decoder, is_decoder=True)
    refused(decoder, "decoder")


def test_export_refusals(tmp_path, capsys, run, exported):
    (tmp_path / "empty").mkdir()
    assert_clean_failure(
        capsys,
        ["export", "--model", str(tmp_path / "empty"), "--out", str(tmp_path / "o")],
        "not a bertforge model",
    )
    assert_clean_failure(
        capsys, ["export", "--model", str(run), "--out", str(exported)], "not an empty folder"
    )
    if os.path.isdir("/proc/self"):  # a folder where no file can be made, even by root
        argv = ["export", "--model", str(run), "--out", "/proc/bertforge-export"]
        assert_clean_failure(capsys, argv, "cannot write /proc/bertforge-export: its lock file")
        argv = ["export", "--model", str(run), "--out", "/proc/bertforge-export/hf"]
        assert_clean_failure(capsys, argv, "cannot make the folder /proc/bertforge-export for")
    damaged = broken_copy(tmp_path, run)
    weights = damaged / "final" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:500])
    argv = ["export", "--model", str(damaged), "--out", str(tmp_path / "o")]
    err = assert_clean_failure(capsys, argv, "damaged and cannot be read")
    assert err.rstrip().endswith("replace it with an intact copy of the model")  # not a checkpoint
    assert not (tmp_path / "o").exists()
    flipped = broken_copy(tmp_path, run, "flipped")
    weights = flipped / "final" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0x01  # one bit of a tensor: the file still reads
    weights.write_bytes(bytes(data))
    for command in (["export", "--out", str(tmp_path / "o")], ["fill-mask", "a [MASK] ."]):
        err = assert_clean_failure(
            capsys, [command[0], "--model", str(flipped), *command[1:]], "tensors differ"
        )
    assert not (tmp_path / "o").exists()


def test_a_run_without_nsp_exports_its_nsp_head_as_untrained(
    tmp_path, wiki_slice, small_tokenizer_dir, capsys
):
    from bertforge.cli import main
    from bertforge.pretrain import pretrain

    config = tiny_config(wiki_slice, max_steps=2, eval_every=2)
    config.data.nsp = False
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    assert main(["export", "--model", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    assert "untrained heads (nsp)" in capsys.readouterr().out
    assert json.loads((tmp_path / "hf" / "untrained_heads.json").read_text()) == {"heads": ["nsp"]}
    assert main(["nsp", "--model", str(tmp_path / "hf"), "A sentence .", "Another ."]) == 2  # as the run
