"""A Hugging Face BERT whose embedding matrix has more rows than its tokenizer has tokens (padded to
a multiple of 8 or 64 for speed): imported with its rows, predicting only real tokens, exported back
the same. A tokenizer larger than the embeddings stays refused."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_clean_failure, tiny_config

import bertforge
from bertforge import pretrain as pretrain_module
from bertforge.checkpoint import read_weights
from bertforge.classifier import classify
from bertforge.cli import main
from bertforge.config import RunConfig
from bertforge.evaluate import pretraining_batch_sums, pretraining_metrics
from bertforge.folders import open_classifier
from bertforge.infer import fill_mask
from bertforge.losses import NO_LABEL
from bertforge.model import PADDED_ROW_BIAS
from bertforge.runtime import size_embeddings

transformers = pytest.importorskip("transformers")

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "ran",
    "to",
    "house",
    "big",
    "small",
    "red",
    "blue",
    "green",
    "old",
    "new",
    "man",
    "woman",
    "child",
    "saw",
    "ate",
    "fish",
    "bird",
    "tree",
    "sun",
    "moon",
    "day",
    "night",
    "was",
    "is",
    "and",
    "with",
    "under",
    "over",
    "in",
    "out",
    "up",
    "down",
    "walk",
    "talk",
    "book",
    "read",
    "wrote",
    "good",
    "bad",
    "happy",
    "sad",
    "fast",
    "slow",
    ".",
    ",",
    "it",
    "he",
    "she",
]
TOKENS = SPECIALS + WORDS  # 60 tokens
ROWS = 72  # the embedding rows: 12 more than tokens, as in the report
TEXTS = ["the cat sat on the mat", "a big dog ran to the old house", "the woman read a good book"]
TOL = 1e-5
CUDA = torch.device("cuda")


def hf_bert(cls, rows: int):
    config = transformers.BertConfig(
        vocab_size=rows,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    model = cls(config).eval()
    if hasattr(model, "cls"):
        with torch.no_grad():  # padding rows the model would predict first, were they not left out
            model.cls.predictions.bias[len(TOKENS) :] = 50.0
    return model


def save_with_vocab(model, folder):
    model.save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(TOKENS) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return folder


@pytest.fixture(scope="module", params=["BertForPreTraining", "BertForMaskedLM"])
def padded(request, tmp_path_factory):
    """(transformers model, its folder, the bertforge import of it)."""
    folder = tmp_path_factory.mktemp("padded")
    model = hf_bert(getattr(transformers, request.param), ROWS)
    save_with_vocab(model, folder / "hf")
    assert main(["import-hf", "--from", str(folder / "hf"), "--out", str(folder / "imported")]) == 0
    return model, folder / "hf", folder / "imported"


def mlm_logits(model, ids, types, mask):
    out = model(input_ids=ids, token_type_ids=types, attention_mask=mask)
    return out.logits if hasattr(out, "logits") else out.prediction_logits


def encoded(tokenizer):
    rows = [[tokenizer.cls_id, *ids, tokenizer.sep_id] for ids in tokenizer.encode_batch(TEXTS)]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [tokenizer.pad_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, torch.zeros_like(ids), mask


@torch.no_grad()
def test_import_keeps_the_rows_and_gives_the_logits_of_transformers(padded):
    model, source, imported = padded
    config = json.loads((imported / "config.json").read_text())
    assert config["model"]["vocab_size"] == ROWS and config["tokenizer"]["vocab_size"] == len(TOKENS)
    weights = read_weights(imported / "model.safetensors")
    assert weights["bert.embeddings.word_embeddings.weight"].shape == (ROWS, 32)

    for folder in (imported, source):  # bertforge.load also reads the Hugging Face folder itself
        ours, tokenizer = bertforge.load(folder)
        assert tokenizer.vocab_size == len(TOKENS)
        ids, types, mask = encoded(tokenizer)
        assert int(ids.max()) < len(TOKENS) and (ids == tokenizer.unk_id).sum() == 0
        mlm, _ = ours(ids, token_type_ids=types, attention_mask=mask)
        theirs = mlm_logits(model, ids, types, mask)
        real = mask.bool()
        assert mlm.shape[-1] == ROWS
        torch.testing.assert_close(
            mlm[real][:, : len(TOKENS)], theirs[real][:, : len(TOKENS)], rtol=0, atol=TOL
        )


def test_fill_mask_predicts_only_real_tokens(padded, capsys):
    _, _, imported = padded
    model, tokenizer = bertforge.load(imported)
    text = "the cat [MASK] on the [MASK]"
    with torch.no_grad():  # without the cut, every prediction would be a padding row (bias 50)
        ids = torch.tensor([[tokenizer.cls_id, *tokenizer.encode_batch([text])[0], tokenizer.sep_id]])
        mlm, _ = model(ids)
        assert (mlm[ids == tokenizer.mask_id].argmax(-1) >= len(TOKENS)).all()
        real = mlm[ids == tokenizer.mask_id][:, : len(TOKENS)].softmax(-1)  # (2, tokens)
    predictions = fill_mask(model, tokenizer, text, top_k=100)
    ids = [option["token_id"] for mask in predictions for option in mask]
    special = list(tokenizer.special_ids)  # never offered
    assert (
        len(ids) == 2 * (len(TOKENS) - len(special))
        and max(ids) < len(TOKENS)
        and not set(ids) & set(special)
    )
    # each mask's scores: the softmax over the real tokens, the special tokens' share left out
    offered = 1 - real[:, special].sum(-1)
    for mask, share in zip(predictions, offered.tolist(), strict=True):
        assert abs(sum(option["score"] for option in mask) - share) < 1e-4

    capsys.readouterr()
    assert main(["fill-mask", "--model", str(imported), "--top-k", "5", text]) == 0
    assert "[unused" not in capsys.readouterr().out


@torch.no_grad()
def test_mlm_loss_and_accuracy_leave_out_the_padding_rows(padded):
    _, _, imported = padded
    model, tokenizer = bertforge.load(imported)
    ids, types, mask = encoded(tokenizer)
    positions = mask.flatten().nonzero().squeeze(1)  # (M,) every real token predicted
    labels = ids.flatten()[positions]  # (M,)
    batch = {
        "input_ids": ids,
        "token_type_ids": types,
        "attention_mask": mask,
        "masked_positions": positions,
        "masked_labels": labels,
        "nsp_labels": torch.full((len(TEXTS),), NO_LABEL),
    }
    sums = pretraining_batch_sums(model, batch, tokenizer.vocab_size)
    logits, _ = model(ids, token_type_ids=types, attention_mask=mask, masked_positions=positions)
    assert (logits.argmax(-1) >= len(TOKENS)).all()  # with every row, a padding row always wins
    real = logits[:, : len(TOKENS)]
    expected = torch.nn.functional.cross_entropy(real, labels, reduction="sum")
    torch.testing.assert_close(sums["mlm_loss_sum"], expected, rtol=1e-5, atol=1e-4)
    assert int(sums["mlm_correct"]) == int((real.argmax(-1) == labels).sum())
    metrics = pretraining_metrics(model, [batch], tokenizer.vocab_size)
    assert metrics["mlm_loss"] == pytest.approx(float(expected) / len(labels), rel=1e-5)


def test_export_writes_the_padded_model_back_predicting_only_real_tokens(padded, tmp_path):
    """Every weight comes back the same but the padding rows' MLM bias, which the export sets so low
    that transformers' softmax over all rows predicts the real tokens bertforge predicts."""
    model, _, imported = padded
    exported = tmp_path / "exported"
    assert main(["export", "--model", str(imported), "--out", str(exported)]) == 0
    assert json.loads((exported / "config.json").read_text())["vocab_size"] == ROWS
    reloaded = transformers.BertForPreTraining.from_pretrained(exported).eval()
    theirs = transformers.AutoTokenizer.from_pretrained(exported)
    assert len(theirs) == len(TOKENS)
    original, bias = model.state_dict(), "cls.predictions.bias"
    for name, tensor in reloaded.state_dict().items():
        if name in original and not name.endswith("predictions.decoder.bias"):  # the bias, tied
            expected = original[name].clone()  # a masked LM has no pooler or NSP head: drawn on import
            if name == bias:
                expected[len(TOKENS) :] = PADDED_ROW_BIAS
            assert torch.equal(tensor, expected), name

    ours, tokenizer = bertforge.load(imported)
    ids, types, mask = encoded(tokenizer)
    with torch.no_grad():
        theirs_logits = mlm_logits(reloaded, ids, types, mask)[mask.bool()]  # every row
        ours_logits = ours(ids, token_type_ids=types, attention_mask=mask)[0][mask.bool()]
    assert (theirs_logits.argmax(-1) < len(TOKENS)).all()
    assert float(theirs_logits.softmax(-1)[:, len(TOKENS) :].sum(-1).max()) < 1e-6
    assert torch.equal(theirs_logits.argmax(-1), ours_logits[:, : len(TOKENS)].argmax(-1))

    assert main(["import-hf", "--from", str(exported), "--out", str(tmp_path / "again")]) == 0
    first, second = (
        read_weights(exported / "model.safetensors"),
        read_weights(tmp_path / "again" / "model.safetensors"),
    )
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_pretraining_continues_from_a_padded_model_and_resumes(padded, tmp_path, capsys):
    _, _, imported = padded
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"{a} . {b} .\n\n" for a in TEXTS for b in TEXTS * 20))
    run = tmp_path / "run"
    common = ["--quiet", "--set", "data.max_seq_length=32", "--set", "train.batch_size=4"]
    argv = ["pretrain", "--init", str(imported), "--corpus", str(corpus), "--out", str(run), *common]
    assert main([*argv, "--max-steps", "2", "--set", "train.eval_every=1"]) == 0, capsys.readouterr().err
    assert main(["pretrain", "--out", str(run), "--resume", "--max-steps", "3", "--quiet"]) == 0
    weights = read_weights(run / "final" / "model.safetensors")
    assert weights["bert.embeddings.word_embeddings.weight"].shape == (ROWS, 32)
    _, tokenizer = bertforge.load(run)
    assert tokenizer.vocab_size == len(TOKENS)


def test_a_tokenizer_larger_than_the_embeddings_is_refused(tmp_path, capsys):
    source = save_with_vocab(hf_bert(transformers.BertForMaskedLM, 50), tmp_path / "hf")
    argv = ["import-hf", "--from", str(source), "--out", str(tmp_path / "out")]
    capsys.readouterr()  # save_pretrained's progress bar
    assert_clean_failure(capsys, argv, "the tokenizer has 60 tokens but the model in")
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_far_smaller_than_the_embeddings_is_another_models(tmp_path, capsys):
    source = save_with_vocab(hf_bert(transformers.BertForMaskedLM, len(TOKENS) + 128), tmp_path / "hf")
    argv = ["import-hf", "--from", str(source), "--out", str(tmp_path / "out")]
    capsys.readouterr()  # save_pretrained's progress bar
    assert_clean_failure(capsys, argv, f"the tokenizer has 60 tokens but the model in {source} expects 188")
    assert not (tmp_path / "out").exists()


def test_a_padded_hugging_face_classifier_classifies_as_transformers_does(tmp_path):
    model = hf_bert(transformers.BertForSequenceClassification, ROWS)
    model.config.id2label, model.config.label2id = {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1}
    folder = save_with_vocab(model, tmp_path / "clf")
    ours, tokenizer, labels, _ = open_classifier(folder)
    assert labels == ["neg", "pos"] and ours.bert.embeddings.word_embeddings.weight.shape[0] == ROWS
    results = classify(ours, tokenizer, labels, TEXTS)
    with torch.no_grad():
        expected = model(*encoded(tokenizer)[:1], attention_mask=encoded(tokenizer)[2]).logits.softmax(-1)
    got = torch.tensor([[r["probabilities"][name] for name in labels] for r in results])
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)


def test_size_embeddings_pads_a_new_bert_on_a_gpu_only():
    config = RunConfig()
    size_embeddings(config, 30522, torch.device("cpu"))
    assert (config.model.vocab_size, config.tokenizer.vocab_size) == (30522, 30522)
    size_embeddings(config, 30522, torch.device("cuda"))
    assert (config.model.vocab_size, config.tokenizer.vocab_size) == (30528, 30522)  # as MosaicBERT
    size_embeddings(config, 30528, torch.device("cuda"))
    assert config.model.vocab_size == 30528  # a multiple of 64 already
    config.model.objective = "clm"
    size_embeddings(config, 30522, torch.device("cuda"))
    assert config.model.vocab_size == 30522  # GPT-1 keeps a row per token
    size_embeddings(config, 8192, torch.device("cpu"))  # a given tokenizer of another size than asked
    assert (config.model.vocab_size, config.tokenizer.vocab_size) == (8192, 8192)


def test_a_bert_pretrained_on_a_gpu_has_padded_rows_and_exports_exactly(
    tmp_path, wiki_slice, small_tokenizer_dir, monkeypatch
):
    """A new BERT pretrained on CUDA (here: its sizing as on CUDA) gets rows to a multiple of 64, which
    only ever stand for no token; export and import keep every weight, and transformers computes the
    same logits for the real tokens."""
    sized = pretrain_module.size_embeddings
    monkeypatch.setattr(
        pretrain_module, "size_embeddings", lambda config, tokens, device: sized(config, tokens, CUDA)
    )
    pretrain_module.pretrain(
        tiny_config(wiki_slice, max_steps=3, eval_every=3),
        tmp_path / "run",
        tokenizer_dir=small_tokenizer_dir,
        show_progress=False,
    )
    model, tokenizer = bertforge.load(tmp_path / "run")
    tokens, rows = tokenizer.vocab_size, model.config.vocab_size
    assert tokens % 64 and rows == -(-tokens // 64) * 64  # padded, or the test would show nothing
    padded_bias = model.cls.predictions.bias[tokens:]
    assert torch.equal(padded_bias, torch.full((rows - tokens,), PADDED_ROW_BIAS))  # never trained

    exported = tmp_path / "exported"
    assert main(["export", "--model", str(tmp_path / "run"), "--out", str(exported)]) == 0
    theirs = transformers.BertForPreTraining.from_pretrained(exported).eval()
    assert theirs.config.vocab_size == rows
    ids, types, mask = encoded(tokenizer)
    with torch.no_grad():
        ours_logits, _ = model.eval()(ids, token_type_ids=types, attention_mask=mask)
        their_logits = mlm_logits(theirs, ids, types, mask)
    real = mask.bool()
    torch.testing.assert_close(ours_logits[real], their_logits[real], rtol=0, atol=TOL)
    assert (their_logits[real].argmax(-1) < tokens).all()  # transformers' softmax over every row

    assert main(["import-hf", "--from", str(exported), "--out", str(tmp_path / "again")]) == 0
    first = read_weights(tmp_path / "run" / "final" / "model.safetensors")
    second = read_weights(tmp_path / "again" / "model.safetensors")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
