"""Held-out evaluation: fixed masks and pairs, the metrics, and the unigram-entropy reference."""

from __future__ import annotations

import json
import math
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import SHARED_DATA

from bertforge.evaluate import unigram_entropy

# ids 0-4 are special: [PAD], [UNK], [CLS], [SEP], [MASK]
SPECIAL = SimpleNamespace(special_ids=(0, 1, 2, 3, 4), unk_id=1, sep_id=3)


def entropy(*counts: int) -> float:
    total = sum(counts)
    return -sum(c / total * math.log(c / total) for c in counts)


def test_unigram_entropy_of_known_counts_ignores_special_tokens():
    # 5 occurs twice, 6 and 7 once each: p = (1/2, 1/4, 1/4).
    tokens = np.array([2, 5, 6, 3, 5, 7, 3, 0, 0], dtype=np.uint16)
    shards = SimpleNamespace(tokens=tokens, num_tokens=len(tokens), vocab_size=10)
    assert unigram_entropy(shards, SPECIAL) == pytest.approx(entropy(2, 1, 1))


def test_a_gpts_unigram_reference_counts_what_its_windows_predict():
    # Two documents, [5 6] and [UNK 5]: a GPT's stream is 5 6 [SEP] [UNK] 5 [SEP], and it predicts the
    # [UNK] and both [SEP]s too; masking never picks them.
    tokens = np.array([5, 6, 1, 5], dtype=np.uint16)
    shards = SimpleNamespace(
        tokens=tokens,
        num_tokens=4,
        vocab_size=10,
        sentence_offsets=np.array([0, 2, 4]),
        document_offsets=np.array([0, 1, 2]),
    )
    assert unigram_entropy(shards, SPECIAL, "clm") == pytest.approx(entropy(2, 1, 1, 2))
    assert unigram_entropy(shards, SPECIAL, "mlm") == pytest.approx(entropy(2, 1))


def test_evaluate_reads_the_named_text_column(tmp_path, tiny_pretrained_run, wiki_valid_slice, capsys):
    from bertforge.cli import main
    from bertforge.corpus import read_documents

    lines = [" ".join(document) for document in read_documents(wiki_valid_slice)]
    corpus = tmp_path / "valid.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "body": text}) + "\n" for i, text in enumerate(lines)))
    argv = ["evaluate", "--model", str(tiny_pretrained_run), "--corpus", str(corpus), "--json", "--quiet"]
    assert main([*argv, "--text-column", "body"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["mlm_loss"] > 0 and metrics["unigram_entropy"] > 0
    assert main(argv) == 2  # the default column, "text", is not in these records
    assert '"text"' in capsys.readouterr().err
    showcase = ["showcase", "--model", str(tiny_pretrained_run), "--corpus", str(corpus), "--sentences", "2"]
    assert main([*showcase, "--text-column", "body"]) == 0
    assert main(showcase) == 2 and "--text-column" in capsys.readouterr().err  # a flag it has
    run = tmp_path / "run"  # a run that read its corpus's "body" field: both read that field by default
    shutil.copytree(tiny_pretrained_run, run)
    for path in (run / "config.json", run / "final" / "config.json"):
        config = json.loads(path.read_text(encoding="utf-8"))
        config["data"]["text_column"] = "body"
        path.write_text(json.dumps(config), encoding="utf-8")
    assert main([*argv[:2], str(run), *argv[3:]]) == 0
    assert json.loads(capsys.readouterr().out) == metrics
    assert main([*showcase[:2], str(run), *showcase[3:]]) == 0


def test_evaluate_shows_its_progress_over_the_batches_unless_quiet(
    tiny_pretrained_run, wiki_valid_slice, capsys
):
    from bertforge.cli import main

    argv = ["evaluate", "--model", str(tiny_pretrained_run), "--corpus", str(wiki_valid_slice), "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("evaluating: ")]
    assert lines and lines[-1].startswith("evaluating: 100% (") and " batch" in lines[-1]
    assert main([*argv, "--quiet"]) == 0
    quiet_out, quiet_err = capsys.readouterr()
    assert json.loads(out) == json.loads(quiet_out) and "evaluating" not in quiet_err


def evaluate_json(capsys, model, corpus, *flags) -> dict:
    from bertforge.cli import main

    assert (
        main(["evaluate", "--model", str(model), "--corpus", str(corpus), "--json", "--quiet", *flags]) == 0
    )
    return json.loads(capsys.readouterr().out)


def test_evaluate_on_pairs_or_windows_whatever_the_model_trained_on(
    tmp_path, tiny_pretrained_run, wiki_valid_slice, capsys
):
    on_pairs = evaluate_json(capsys, tiny_pretrained_run, wiki_valid_slice)  # trained with NSP: pairs
    assert "nsp_accuracy" in on_pairs
    assert evaluate_json(capsys, tiny_pretrained_run, wiki_valid_slice, "--nsp") == on_pairs
    on_windows = evaluate_json(capsys, tiny_pretrained_run, wiki_valid_slice, "--no-nsp")
    assert "nsp_accuracy" not in on_windows  # no pairs, no NSP labels
    assert on_windows["mlm_loss"] != on_pairs["mlm_loss"]  # other sequences

    # The same weights, as a model trained without NSP: windows by default, and on pairs its NSP
    # head (never trained) is not scored.
    mlm_only = tmp_path / "mlm-only"
    shutil.copytree(tiny_pretrained_run / "final", mlm_only)
    config = json.loads((mlm_only / "config.json").read_text())
    config["data"]["nsp"] = False
    (mlm_only / "config.json").write_text(json.dumps(config))
    assert evaluate_json(capsys, mlm_only, wiki_valid_slice) == on_windows
    with pytest.warns(UserWarning, match="pretrained without NSP .* its NSP head is untrained"):
        paired = evaluate_json(capsys, mlm_only, wiki_valid_slice, "--nsp")
    assert paired == {key: value for key, value in on_pairs.items() if not key.startswith("nsp_")}


def test_evaluate_names_its_no_nsp_for_text_of_one_document(tmp_path, tiny_pretrained_run, capsys):
    from bertforge.cli import main

    one_document = tmp_path / "one.txt"
    one_document.write_text("the film opened in may . it ran for a year .\n" * 40, encoding="utf-8")
    argv = ["evaluate", "--model", str(tiny_pretrained_run), "--corpus", str(one_document), "--quiet"]
    assert main(argv) == 2  # a model trained with NSP evaluates on pairs, which need two documents
    error = capsys.readouterr().err
    assert "has one document" in error and "--no-nsp" in error and "Traceback" not in error
    assert main([*argv, "--no-nsp", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mlm_loss"] > 0


@pytest.mark.parametrize(("loss", "says"), [(6.9, True), (6.7, True), (5.1, False)])
def test_a_loss_not_below_the_unigram_reference_is_called_untrained(capsys, loss, says):
    from bertforge.commands.pretraining import print_metrics

    print_metrics({"mlm_loss": loss, "mlm_accuracy": 0.1, "unigram_entropy": 6.7}, label="held-out: ")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"held-out: mlm_loss {loss:.4f}, mlm_accuracy 0.1000"
    assert lines[1].startswith("          reference: unigram entropy 6.7000, the MLM loss")
    note = " " * 10 + "the MLM loss is not below it yet: the model has not learned to use context"
    assert (f"{note}; train longer" in lines) == says and len(lines) == 2 + says


def test_evaluation_masks_and_pairs_do_not_follow_the_runs_training_settings(
    tmp_path, tiny_pretrained_run, wiki_valid_slice, capsys
):
    reference = evaluate_json(capsys, tiny_pretrained_run / "final", wiki_valid_slice)
    windows = evaluate_json(capsys, tiny_pretrained_run / "final", wiki_valid_slice, "--no-nsp")
    trained_otherwise = {"whole_word_masking": True, "short_seq_prob": 0.6, "cross_documents": False}
    for key, value in trained_otherwise.items():
        model = tmp_path / key
        shutil.copytree(tiny_pretrained_run / "final", model)
        config = json.loads((model / "config.json").read_text())
        config["data"][key] = value
        (model / "config.json").write_text(json.dumps(config))
        assert evaluate_json(capsys, model, wiki_valid_slice) == reference, key
        assert evaluate_json(capsys, model, wiki_valid_slice, "--no-nsp") == windows, key


def test_a_text_the_tokenizer_reads_as_unknown_is_refused(tmp_path, tiny_pretrained_run, capsys):
    from bertforge.cli import main

    unknown = tmp_path / "unknown.txt"
    unknown.write_text("\n\n".join("\u6f22\u5b57\u304b\u306a \u6587\u7ae0 \u3002" * 20 for _ in range(6)))
    argv = ["evaluate", "--model", str(tiny_pretrained_run), "--corpus", str(unknown), "--quiet"]
    assert main(argv) == 2  # it would read as a perfect MLM loss of 0: nothing could be masked
    error = capsys.readouterr().err
    assert "nothing but [UNK]" in error and "Traceback" not in error


def expected_top1(logits, labels) -> float:
    """argmax's accuracy with its tie-break drawn at random: 1/k for a label among k tied maxima."""
    total = 0.0
    for row, label in zip(logits.tolist(), labels.tolist(), strict=True):
        tied = [i for i, value in enumerate(row) if value == max(row)]
        total += (label in tied) / len(tied)
    return total


def test_a_tie_for_the_top_logit_counts_as_its_share_of_a_hit():
    import torch

    from bertforge.gpt import next_token_sums
    from bertforge.losses import NO_LABEL, pretraining_sums

    torch.manual_seed(0)
    logits = (torch.randn(400, 12) * 0.2).round(decimals=1).bfloat16()  # many rows tie
    labels = logits.float().argmax(-1)
    labels[::3] = torch.randint(0, 12, (134,))
    nsp = torch.zeros(2, 2)
    sums = pretraining_sums(logits, labels, nsp, torch.full((2,), NO_LABEL), 12)
    assert float(sums["mlm_correct"]) == pytest.approx(expected_top1(logits.float(), labels), abs=1e-3)
    assert expected_top1(logits.float(), labels) < int((logits.float().argmax(-1) == labels).sum())
    unlabelled = labels.clone()
    unlabelled[:200] = NO_LABEL
    sums = pretraining_sums(logits, unlabelled, nsp, torch.full((2,), NO_LABEL), 12)
    assert float(sums["mlm_correct"]) == pytest.approx(
        expected_top1(logits[200:].float(), labels[200:]), abs=1e-3
    )

    ids = torch.randint(0, 12, (4, 101))  # position t predicts token t + 1
    clm = next_token_sums(logits.view(4, 100, 12).repeat(1, 2, 1)[:, :101], ids)
    scores = logits.view(4, 100, 12).repeat(1, 2, 1)[:, :100].flatten(0, 1).float()
    assert float(clm["clm_correct"]) == pytest.approx(expected_top1(scores, ids[:, 1:].flatten()), abs=1e-3)


def test_evaluate_warns_when_no_document_offers_a_next_sentence(tmp_path, tiny_pretrained_run, capsys):
    """A table of single sentences (SST-2's rows): a row is a document, nearly always of one sentence,
    so nearly all its sequences are MLM windows and few are next-sentence pairs to score."""
    from bertforge.cli import main

    rows = (SHARED_DATA / "sst-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[:300]
    corpus = tmp_path / "rows.tsv"
    corpus.write_text("\n".join(rows) + "\n", encoding="utf-8")
    argv = ["evaluate", "--model", str(tiny_pretrained_run), "--corpus", str(corpus), "--nsp", "--json"]
    with pytest.warns(UserWarning, match=r"\d% of the sequences of .*rows.tsv are next-sentence pairs"):
        assert main([*argv, "--quiet", "--text-column", "sentence"]) == 0
    assert json.loads(capsys.readouterr().out)["mlm_loss"] > 0
