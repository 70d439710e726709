"""The unigram-entropy reference line: the MLM loss of a model that knows only token frequencies."""

from __future__ import annotations

import json
import math
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from bertforge.evaluate import unigram_entropy


def test_unigram_entropy_of_known_counts_ignores_special_tokens():
    # ids 0-4 are special; 5 occurs twice, 6 and 7 once each: p = (1/2, 1/4, 1/4).
    tokens = np.array([2, 5, 6, 3, 5, 7, 3, 0, 0], dtype=np.uint16)
    shards = SimpleNamespace(tokens=tokens, num_tokens=len(tokens), vocab_size=10)
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert unigram_entropy(shards, (0, 1, 2, 3, 4)) == pytest.approx(expected)


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
