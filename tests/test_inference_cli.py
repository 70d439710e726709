"""The inference commands: fill-mask, nsp, embed, showcase, export and import-hf as a user types them,
and one clear message for every bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_clean_failure, tiny_config

import bertforge
from bertforge.batches import pad_batch
from bertforge.checkpoint import save_model_folder
from bertforge.cli import main
from bertforge.config import validate
from bertforge.errors import BertforgeError
from bertforge.export import export_model
from bertforge.infer import embed, fill_mask, next_sentence
from bertforge.model import BertForPreTraining
from bertforge.tokenizer import load_tokenizer

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"


def save_random_model(folder: Path, tokenizer_dir: Path, nsp: bool = True, warmup_nsp: bool = False) -> Path:
    tokenizer = load_tokenizer(tokenizer_dir)
    config = tiny_config()
    config.model.vocab_size = tokenizer.vocab_size
    config.model.initializer_range = 0.2
    config.data.nsp, config.data.warmup_nsp = nsp, warmup_nsp
    config.data.warmup_seq_length = 32 if warmup_nsp else 0  # warmup_nsp needs a warmup (validate)
    validate(config)
    torch.manual_seed(0)
    save_model_folder(folder / "final", BertForPreTraining(config.model), tokenizer, config)
    return folder


@pytest.fixture(scope="module")
def run(tmp_path_factory, small_tokenizer_dir) -> Path:
    return save_random_model(tmp_path_factory.mktemp("cli") / "run", small_tokenizer_dir)


@pytest.fixture(scope="module")
def loaded(run):
    return bertforge.load(run)


def lines_file(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "command, expected",
    [
        ("fill-mask", "--top-k"),
        ("nsp", "--input"),
        ("embed", "--pooling"),
        ("showcase", "--sentences"),
        ("export", "--out"),
        ("import-hf", "--from"),
    ],
)
def test_each_command_has_help(capsys, command, expected):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert expected in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert command in capsys.readouterr().out


def test_fill_mask_prints_words_and_the_filled_text(capsys, run, loaded):
    text = "the game was [MASK] in japan ."
    assert main(["fill-mask", "--model", str(run), text, "--top-k", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    expected = fill_mask(*loaded, text, top_k=3)[0]
    assert out[0] == text and len(out) == 4
    for line, p in zip(out[1:], expected, strict=True):
        assert line.split()[0] == f"{p['score']:.4f}" and line.endswith(p["sequence"])


def test_fill_mask_input_file_as_json_lines(capsys, tmp_path, run, loaded):
    texts = ["the [MASK] was released .", "in [MASK] , the [MASK] was long ."]
    assert (
        main(
            [
                "fill-mask",
                "--model",
                str(run),
                "--input",
                str(lines_file(tmp_path, "in.txt", texts)),
                "--json",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["text"] for row in rows] == texts
    assert [row["masks"] for row in rows] == json.loads(json.dumps(fill_mask(*loaded, texts)))
    assert len(rows[1]["masks"]) == 2


def test_nsp_pairs_from_arguments_and_tsv(capsys, tmp_path, run, loaded):
    assert main(["nsp", "--model", str(run), "the game was released .", "it sold well .", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["is_next"] == pytest.approx(
        next_sentence(*loaded, "the game was released .", "it sold well .")
    )
    tsv = lines_file(
        tmp_path, "pairs.tsv", ["a first sentence .\tand a second .", "one more .\tthe last one ."]
    )
    assert main(["nsp", "--model", str(run), "--input", str(tsv)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(0.0 <= float(line.split()[0]) <= 1.0 for line in out)


def test_nsp_and_showcase_take_a_model_with_nsp_in_its_warmup_only(
    capsys, tmp_path, small_tokenizer_dir, wiki_valid_slice
):
    warmup_only = save_random_model(tmp_path / "warmup_nsp", small_tokenizer_dir, nsp=False, warmup_nsp=True)
    assert main(["nsp", "--model", str(warmup_only), "the game was released .", "it sold well ."]) == 0
    captured = capsys.readouterr()
    assert "P(B follows A)" in captured.out
    assert "bertforge: warning:" in captured.err and "only on the 32-token pairs" in captured.err
    corpus = ["--corpus", str(wiki_valid_slice)]
    showcase = ["showcase", "--model", str(warmup_only), *corpus, "--sentences", "2"]
    assert main(showcase) == 0
    assert capsys.readouterr().out.count("\n  true next ") == 2
    evaluate = ["evaluate", "--model", str(warmup_only), *corpus, "--nsp", "--json", "--quiet"]
    assert main([*evaluate, "--max-pairs", "16"]) == 0  # its NSP head trained: its figures are reported
    assert "nsp_accuracy" in json.loads(capsys.readouterr().out)


def test_a_model_is_read_up_to_the_length_it_was_trained_at(tmp_path, small_tokenizer_dir):
    folder = save_random_model(tmp_path / "short", small_tokenizer_dir)
    config = json.loads((folder / "final" / "config.json").read_text(encoding="utf-8"))
    config["data"]["max_seq_length"] = 16  # of its 64 positions: those past 16 never trained
    (folder / "final" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    model, tokenizer = bertforge.load(folder)
    text = " ".join(["word"] * 20)
    with pytest.raises(BertforgeError, match="more than the model's maximum of 16"):
        fill_mask(model, tokenizer, "[MASK] " + text)
    with pytest.raises(BertforgeError, match="more than the model's maximum of 16"):
        next_sentence(model, tokenizer, text, "short .")
    with pytest.warns(UserWarning, match="longer than the model's maximum of 16"):
        cut = embed(model, tokenizer, [text])
    np.testing.assert_allclose(cut, embed(model, tokenizer, [" ".join(["word"] * 14)]), atol=1e-6)


def test_a_checkpoint_from_the_sequence_length_warmup_reads_at_the_warmup_length(
    tmp_path, wiki_slice, small_tokenizer_dir
):
    from bertforge.pretrain import pretrain

    config = tiny_config(wiki_slice, max_steps=6, eval_every=6, checkpoint_every=2, keep_checkpoints=3)
    config.data.warmup_seq_length, config.data.warmup_seq_fraction = 16, 0.5  # steps 1-3 at 16 tokens
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    checkpoints = tmp_path / "run" / "checkpoints"
    with pytest.warns(UserWarning, match="during the 16-token sequence-length warmup"):
        during, tokenizer = bertforge.load(checkpoints / "step_000002")
    assert during.max_length == 16  # positions 16-63 had not trained yet
    with pytest.raises(BertforgeError, match="more than the model's maximum of 16"):
        fill_mask(during, tokenizer, "[MASK] " + " ".join(["word"] * 20))
    assert bertforge.load(checkpoints / "step_000004")[0].max_length == 64
    assert bertforge.load(tmp_path / "run")[0].max_length == 64  # final/
    export_model(checkpoints / "step_000002", tmp_path / "hf")  # transformers cuts where training stood
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["model_max_length"] == 16
    assert bertforge.load(tmp_path / "hf")[0].max_length == 16  # and bertforge reading the export
    # A state.json from before the warmup's end was recorded: read as trained at full length.
    state = json.loads((checkpoints / "step_000002" / "state.json").read_text())
    del state["warmup_end_epoch"]
    (checkpoints / "step_000002" / "state.json").write_text(json.dumps(state))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning about a warmup
        assert bertforge.load(checkpoints / "step_000002")[0].max_length == 64


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_embed_writes_the_library_vectors(capsys, tmp_path, run, loaded, pooling):
    texts = ["a first text .", "a second , longer text about the river .", "x"]
    out = tmp_path / "vectors.npy"
    argv = [
        "embed",
        "--model",
        str(run),
        "--input",
        str(lines_file(tmp_path, "t.txt", texts)),
        "--out",
        str(out),
    ]
    assert main([*argv, "--pooling", pooling]) == 0
    assert "3 x 32" in capsys.readouterr().out
    vectors = np.load(out)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, embed(*loaded, texts, pooling=pooling), atol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt", "vectors.npy"]  # no temporary left


def test_embed_shows_progress_for_large_inputs_and_warns_on_truncation(capsys, tmp_path, run):
    texts = [f"line number {i} of a long file ." for i in range(1200)] + [" ".join(["word"] * 80)]
    argv = ["embed", "--model", str(run), "--input", str(lines_file(tmp_path, "big.txt", texts))]
    assert main([*argv, "--out", str(tmp_path / "big.npy"), "--batch-size", "128"]) == 0
    err = capsys.readouterr().err
    assert "embed" in err and "batch" in err  # the tqdm bar
    assert "bertforge: warning: 1 of 1201 texts are longer than the model's maximum of 64" in err
    assert np.load(tmp_path / "big.npy").shape == (1201, 32)


def test_showcase_prints_predictions_and_nsp(capsys, run, wiki_valid_slice, monkeypatch):
    assert main(["showcase", "--model", str(run), "--corpus", str(wiki_valid_slice), "--sentences", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fill-mask: one word of each of 3 sentences of ")
    assert out.count("[MASK]") == 3 and out.count("true: ") == 3 and "top-5:" in out
    assert "next sentence prediction" in out and out.count("\n  true next ") == 3
    pairs = re.findall(r"true next (\d\.\d\d)   random (\d\.\d\d)", out)
    above = sum(float(true) > float(random) for true, random in pairs)  # as printed: rounding keeps order,
    ties = sum(true == random for true, random in pairs)  # but not always a difference
    (count,) = re.findall(r"scored above the random one for (\d) of 3 sentences", out)
    assert above <= int(count) <= above + ties
    assert re.search(r"top-5: '[^']+' \d\.\d\d, ", out)  # words quoted: a comma or a period is one
    assert main(["showcase", "--model", str(run), "--corpus", str(wiki_valid_slice), "--sentences", "3"]) == 0
    assert capsys.readouterr().out == out  # seeded
    batches = []
    monkeypatch.setattr(
        "bertforge.batches.pad_batch", lambda rows, pad: batches.append(len(rows)) or pad_batch(rows, pad)
    )
    argv = ["showcase", "--model", str(run), "--corpus", str(wiki_valid_slice), "--sentences", "3"]
    assert main([*argv, "--batch-size", "1"]) == 0
    assert capsys.readouterr().out == out and set(batches) == {1}  # one text at a time, the same answers
    assert "note:" not in out
    assert (
        main(["showcase", "--model", str(run), "--corpus", str(wiki_valid_slice), "--sentences", "100000"])
        == 0
    )
    out = capsys.readouterr().out
    shown = out.count("true: ")
    assert f"has {shown:,} sentences that fit" in out and "not 100,000" in out and 3 < shown < 100_000


def test_showcase_says_why_it_leaves_next_sentence_prediction_out(
    capsys, tmp_path, small_tokenizer_dir, wiki_valid_slice
):
    mlm_alone = save_random_model(tmp_path / "mlm", small_tokenizer_dir, nsp=False)
    argv = ["showcase", "--model", str(mlm_alone), "--corpus", str(wiki_valid_slice), "--sentences", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "one word of each of 1 sentence of" in out and "the true word is in the top 5 for" in out
    assert out.endswith("\nnext sentence prediction left out: the model's NSP head never trained\n")
    lines = [line for line in wiki_valid_slice.read_text(encoding="utf-8").splitlines() if line.strip()]
    one_document = tmp_path / "one.txt"  # plain text without a blank line: one document
    one_document.write_text("\n".join(line for line in lines if not line.strip().startswith("=")) + "\n")
    two_heads = save_random_model(tmp_path / "both", small_tokenizer_dir)
    assert (
        main(["showcase", "--model", str(two_heads), "--corpus", str(one_document), "--sentences", "2"]) == 0
    )
    assert capsys.readouterr().out.endswith(
        "\nnext sentence prediction left out: the text has one document\n"
    )


def test_output_piped_to_a_reader_that_leaves_ends_quietly(run, tmp_path):
    import subprocess
    import sys

    texts = lines_file(tmp_path, "texts.txt", ["the [MASK] ."] * 4)  # about 48 KB of output each
    argv = [sys.executable, "-m", "bertforge", "fill-mask", "--model", str(run), "--top-k", "2000"]
    process = subprocess.Popen([*argv, "--input", str(texts)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline() == b"the [MASK] .\n"
    process.stdout.close()  # as `| head -1` does: the rest, past what a pipe holds (64 KB), has nowhere to go
    assert process.wait(timeout=120) == 141  # 128 + SIGPIPE, as Unix tools end
    assert process.stderr.read() == b""
    # A short output, buffered until the command ends, to a reader gone before it is written.
    buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    process = subprocess.Popen(
        [*argv[:-1], "3", "the [MASK] ."], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=buffered
    )
    process.stdout.close()
    assert process.wait(timeout=120) == 141
    assert process.stderr.read() == b""


def test_demo_runs_the_showcase_after_pretraining():
    recipe = MAKEFILE.read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert recipe.index("pretrain") < recipe.index("showcase --model $(OUT)")


def test_export_and_import_commands(capsys, tmp_path, run):
    assert main(["export", "--model", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert "BertForPreTraining.from_pretrained" in capsys.readouterr().out
    assert main(["import-hf", "--from", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    assert "imported" in capsys.readouterr().out
    assert main(["fill-mask", "--model", str(tmp_path / "hf"), "a [MASK] .", "--json"]) == 0
    from_export = capsys.readouterr().out
    assert main(["fill-mask", "--model", str(tmp_path / "back"), "a [MASK] .", "--json"]) == 0
    assert capsys.readouterr().out == from_export


def test_bad_inputs(capsys, tmp_path, run, small_tokenizer_dir):
    model = ["--model", str(run)]
    assert_clean_failure(capsys, ["fill-mask", *model, "no mask at all"], "has no [MASK]")
    assert_clean_failure(capsys, ["fill-mask", *model, ""], "is empty")
    assert_clean_failure(capsys, ["fill-mask", *model], "give either a text or --input")
    long_text = "[MASK] " + " ".join(["word"] * 100)
    assert_clean_failure(capsys, ["fill-mask", *model, long_text], "more than the model's maximum of 64")
    empty = lines_file(tmp_path, "empty.txt", [])
    assert_clean_failure(capsys, ["fill-mask", *model, "--input", str(empty)], "is empty")
    blank = lines_file(tmp_path, "blank.txt", ["the [MASK] .", "  ", "a [MASK] ."])
    assert_clean_failure(capsys, ["fill-mask", *model, "--input", str(blank)], "blank.txt line 2 is blank")
    ends_blank = tmp_path / "ends_blank.txt"  # blank lines at the end are no texts, as for classify
    ends_blank.write_text("the [MASK] .\n\n  \n", encoding="utf-8")
    assert main(["fill-mask", *model, "--input", str(ends_blank), "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    no_mask = lines_file(tmp_path, "nomask.txt", ["the [MASK] .", "no mask here"])
    assert_clean_failure(
        capsys, ["fill-mask", *model, "--input", str(no_mask)], "text 2 ('no mask here') has no [MASK]"
    )
    assert_clean_failure(
        capsys, ["fill-mask", *model, "--input", str(tmp_path / "missing.txt")], "does not exist"
    )
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 [MASK]\n")
    latin1 = ["fill-mask", *model, "--input", str(tmp_path / "latin1.txt")]
    assert_clean_failure(capsys, latin1, "is not UTF-8 text: undecodable bytes on line 1")
    folder = ["fill-mask", *model, "--input", str(tmp_path)]
    assert_clean_failure(capsys, folder, f"{tmp_path} is a folder; give a file with")
    tokenizer_file = [
        "prepare",
        "--corpus",
        str(tmp_path / "latin1.txt"),
        "--tokenizer",
        str(tmp_path / "latin1.txt"),
    ]
    assert_clean_failure(
        capsys, [*tokenizer_file, "--out", str(tmp_path / "s")], "is a file, not a folder; train"
    )

    assert_clean_failure(capsys, ["nsp", *model, "only one sentence"], "give two sentences")
    tabs = lines_file(tmp_path, "bad.tsv", ["a\tb", "no tab here"])
    assert_clean_failure(capsys, ["nsp", *model, "--input", str(tabs)], "line 2 of")
    assert_clean_failure(capsys, ["nsp", *model, "", "b"], "is empty")

    texts = str(lines_file(tmp_path, "texts.txt", ["one", "two"]))
    assert_clean_failure(
        capsys, ["embed", *model, "--input", texts, "--out", str(tmp_path / "v.txt")], ".npy"
    )
    assert_clean_failure(
        capsys, ["embed", *model, "--input", str(empty), "--out", str(tmp_path / "v.npy")], "is empty"
    )
    assert not (tmp_path / "v.npy").exists()

    (tmp_path / "not_a_model").mkdir()
    not_a_model = ["--model", str(tmp_path / "not_a_model")]
    assert_clean_failure(capsys, ["fill-mask", *not_a_model, "a [MASK] ."], "not a bertforge model folder")
    starting = tmp_path / "starting"  # a pretraining run before its first checkpoint
    (starting / "tokenizer").mkdir(parents=True)
    (starting / "config.json").write_text("{}", encoding="utf-8")
    starting_run = ["fill-mask", "--model", str(starting), "a [MASK] ."]
    assert_clean_failure(capsys, starting_run, "is a pretraining run with no model yet")
    (starting / "checkpoints" / "step_000100").mkdir(parents=True)  # with a checkpoint, not a classifier
    classify = ["classify", "--model", str(starting), "a text"]
    assert_clean_failure(capsys, classify, "is a pretraining run, not a fine-tuned model; give a fine-tuned")
    assert_clean_failure(capsys, ["nsp", "--model", str(tmp_path / "nowhere"), "a", "b"], "does not exist")

    mlm_only = save_random_model(tmp_path / "mlm_only", small_tokenizer_dir, nsp=False)
    assert_clean_failure(
        capsys, ["nsp", "--model", str(mlm_only), "a", "b"], "without next sentence prediction"
    )


def test_a_run_without_final_is_read_at_its_newest_checkpoint_with_a_notice(tmp_path, tiny_pretrained_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_pretrained_run, run)
    shutil.rmtree(run / "final")  # as a run interrupted before its end leaves it
    newest = sorted((run / "checkpoints").iterdir())[-1]
    with pytest.warns(
        UserWarning, match=re.escape(f"{run} has no final/ model yet: using its newest checkpoint")
    ):
        assert main(["fill-mask", "--model", str(run), "the [MASK] sat ."]) == 0
    model, _ = bertforge.load(newest)
    with pytest.warns(UserWarning, match=newest.name):
        from_run, _ = bertforge.load(run)
    ours, theirs = model.state_dict(), from_run.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
