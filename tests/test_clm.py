"""GPT-1 in the pipeline (`--objective clm`): packed windows, pretraining through the shared loop with
exact resume, export to and import from Hugging Face, `evaluate`, `generate`, fine-tuning a GPT
classifier and a GPT regressor (STS-B's scores), and the BERT commands refusing a GPT."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import (
    HF_TINY_GPT_SIZES,
    STSB_VALID_PAIRS,
    assert_clean_failure,
    metrics_lines,
    stsb_finetune_argv,
    tiny_config,
)

from bertforge.batches import pad_batch, real_tokens
from bertforge.cache import cached_shards, default_cache_dir
from bertforge.checkpoint import list_checkpoints, read_config, read_weights, save_model_folder
from bertforge.classifier import classify
from bertforge.cli import main
from bertforge.config import ModelConfig, RunConfig, apply_objective, validate
from bertforge.errors import BertforgeError
from bertforge.folders import open_classifier, open_pretrained
from bertforge.gpt import GPT_TIED_KEYS, GPTForSequenceClassification, GPTLMHeadModel
from bertforge.gpt_convert import from_hf_state_dict, hf_config, to_hf_state_dict
from bertforge.packing import PackedWindows, fewest_windows, packed_batches, window_starts
from bertforge.precision import PROBE_TOKENS, machine_key, probe_shapes
from bertforge.pretrain import pretrain
from bertforge.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")

SEP = 3
PROMPT = "the album was released in"
TOPICS = {"music": ("album", "song", "single", "music"), "war": ("army", "battle", "war", "fought")}


def clm_config(corpus: Path | None = None, valid: Path | None = None, **train) -> RunConfig:
    """conftest's tiny model as a GPT: GPT-1's activation and its 4 x hidden feed-forward."""
    config = tiny_config(corpus, valid, **train)
    apply_objective(config, "clm")
    config.model.intermediate_size = 4 * config.model.hidden_size
    return config


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory, wiki_slice, wiki_valid_slice, small_tokenizer_dir) -> Path:
    """A tiny GPT pretrained for 40 steps on the WikiText slice, evaluated at 0, 20 and 40."""
    run = tmp_path_factory.mktemp("gpt") / "run"
    config = clm_config(wiki_slice, wiki_valid_slice, max_steps=40, eval_every=20, batch_size=16)
    config.train.learning_rate = 3e-3
    cache = tmp_path_factory.getbasetemp() / "cache"
    pretrain(config, run, tokenizer_dir=small_tokenizer_dir, cache_dir=cache, show_progress=False)
    return run


@pytest.fixture(scope="module")
def gpt_export(tmp_path_factory, gpt_run) -> Path:
    out = tmp_path_factory.mktemp("gpt-export") / "hf"
    assert main(["export", "--model", str(gpt_run), "--out", str(out)]) == 0
    return out


# ------------------------------------------------------------------------------------ packing


def toy_shards() -> SimpleNamespace:
    """Three documents (the first of two sentences): 10 11 | 12, then 13, then 14 15 16 17 18."""
    return SimpleNamespace(
        tokens=np.arange(10, 19, dtype=np.uint16),
        sentence_offsets=np.array([0, 2, 3, 4, 9]),
        document_offsets=np.array([0, 2, 3, 4]),
    )


def test_windows_are_the_stream_of_documents_and_ends_cut_at_a_moving_offset():
    shards = toy_shards()
    stream = [10, 11, 12, SEP, 13, SEP, 14, 15, 16, 17, 18, SEP]  # each document, then its end token
    offsets = set()
    for epoch in range(8):
        starts = window_starts(shards, 4, seed=1, epoch=epoch)
        assert np.array_equal(starts, window_starts(shards, 4, seed=1, epoch=epoch))  # (seed, epoch) decide
        offset = int(starts.min())
        offsets.add(offset)
        assert sorted(starts.tolist()) == list(range(offset, len(stream) - 3, 4))  # back to back, all full
        windows = PackedWindows(shards, starts, 4, SEP)
        for start, item in zip(starts, windows, strict=True):
            assert item["input_ids"].dtype == np.int64
            assert item["input_ids"].tolist() == stream[start : start + 4]
    assert len(offsets) > 1  # the boundaries move between epochs
    with pytest.raises(BertforgeError, match="fewer than one sequence"):
        window_starts(shards, 13, seed=1, epoch=0)


@pytest.mark.parametrize("length", [2, 3, 4, 5, 7, 12])
def test_the_fewest_windows_of_any_epoch_are_counted_before_training(length):
    shards = toy_shards()  # a stream of 12 tokens
    counts = {len(window_starts(shards, length, seed=1, epoch=epoch)) for epoch in range(200)}
    assert fewest_windows(shards, length) == min(counts)


def test_packed_batches_of_a_real_corpus_have_no_padding_and_full_windows(wiki_slice, small_tokenizer_dir):
    tokenizer = load_tokenizer(small_tokenizer_dir)
    shards = cached_shards(wiki_slice, tokenizer, "auto", default_cache_dir(), False)
    batches = packed_batches(shards, 64, tokenizer.sep_id, 8, seed=5, epoch=2)
    windows = len(window_starts(shards, 64, seed=5, epoch=2))
    stream = shards.num_tokens + len(shards.document_offsets) - 1  # the tokens and one [SEP] per document
    assert windows * 64 > stream - 128  # the whole stream but its ends
    assert len(batches) == windows // 8  # full batches only
    seps = 0
    for index in range(len(batches)):
        batch = batches[index]
        assert set(batch) == {"input_ids"} and batch["input_ids"].shape == (8, 64)
        assert not (batch["input_ids"] == tokenizer.pad_id).any()
        assert real_tokens(batch) == 8 * 64
        seps += int((batch["input_ids"] == tokenizer.sep_id).sum())
    assert seps > 0  # documents end inside windows
    again = packed_batches(shards, 64, tokenizer.sep_id, 8, seed=5, epoch=2)
    assert torch.equal(batches[3]["input_ids"], again[3]["input_ids"])


# ------------------------------------------------------------------------------------ pretraining


def test_clm_config_takes_gpt_settings_and_refuses_what_openai_gpt_cannot_hold():
    config = RunConfig()
    apply_objective(config, "clm")
    assert (config.model.objective, config.model.hidden_act, config.data.nsp) == ("clm", "gelu_new", False)
    validate(config)
    config.data.nsp = True  # ignored: a GPT trains on packed text
    config.model.type_vocab_size = 1
    validate(config)
    config.model.hidden_act = "gelu"
    with pytest.raises(BertforgeError, match="gelu_new"):
        validate(config)
    config.model.objective = "gpt"
    with pytest.raises(BertforgeError, match="model.objective"):
        validate(config)


def test_clm_pretraining_lowers_the_held_out_next_token_loss(gpt_run):
    config = read_config(gpt_run)
    assert (config.model.objective, config.model.hidden_act) == ("clm", "gelu_new")
    valid = metrics_lines(gpt_run, "valid")
    assert [v["step"] for v in valid] == [0, 20, 40]
    assert {"clm_loss", "perplexity", "clm_accuracy"} <= set(valid[-1]) and "mlm_loss" not in valid[-1]
    assert valid[0]["clm_loss"] == pytest.approx(np.log(2000), abs=0.1)  # uniform over the vocabulary
    assert valid[-1]["clm_loss"] < valid[0]["clm_loss"] - 0.5
    assert valid[-1]["clm_accuracy"] > valid[0]["clm_accuracy"]
    train = metrics_lines(gpt_run, "train")
    assert train[-1]["loss"] == train[-1]["clm_loss"] and train[-1]["tokens_per_s"] > 0
    for folder in (gpt_run / "final", *list_checkpoints(gpt_run)):  # the tied head is never saved
        weights = read_weights(folder / "model.safetensors")
        assert not set(GPT_TIED_KEYS) & set(weights) and all(k.startswith("gpt.") for k in weights)
    assert (gpt_run / "loss.png").is_file()


@pytest.mark.slow
def test_clm_resume_reproduces_the_uninterrupted_run(
    tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir
):
    config = clm_config(wiki_slice, wiki_valid_slice, max_steps=8, eval_every=4, keep_checkpoints=3)
    full = tmp_path / "full"
    pretrain(config, full, tokenizer_dir=small_tokenizer_dir, show_progress=False)
    assert [p.name for p in list_checkpoints(full)] == ["step_000004", "step_000008"]

    cut = tmp_path / "cut"  # a run stopped after its step-4 checkpoint
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "checkpoints" / "step_000008")
    shutil.rmtree(cut / "final")
    pretrain(read_config(cut), cut, resume=True, show_progress=False)

    full_train, cut_train = metrics_lines(full, "train"), metrics_lines(cut, "train")
    assert [x["step"] for x in cut_train] == list(range(1, 9))
    for a, b in zip(full_train, cut_train, strict=True):
        assert a["clm_loss"] == b["clm_loss"] and a["clm_accuracy"] == b["clm_accuracy"]
    assert metrics_lines(full, "valid")[-1] == metrics_lines(cut, "valid")[-1]
    full_weights = read_weights(full / "final" / "model.safetensors")
    cut_weights = read_weights(cut / "final" / "model.safetensors")
    assert all(torch.equal(full_weights[k], cut_weights[k]) for k in full_weights)


def test_pretrain_objective_clm_on_the_command_line(
    tmp_path, capsys, wiki_slice, wiki_valid_slice, small_tokenizer_dir
):
    out = tmp_path / "run"
    argv = [
        *("pretrain", "--objective", "clm", "--preset", "tiny", "--corpus", str(wiki_slice)),
        *("--valid", str(wiki_valid_slice), "--tokenizer", str(small_tokenizer_dir), "--out", str(out)),
        *("--max-steps", "2", "--batch-size", "4", "--precision", "fp32", "--quiet"),
        *(
            "--set",
            "data.max_seq_length=32",
            "--set",
            "train.eval_every=2",
            "--set",
            "data.eval_max_pairs=16",
        ),
        *("--no-nsp", "--set", "data.mlm_probability=0.3"),  # BERT's, which a GPT reads none of
    ]
    assert main(argv) == 0
    printed, warned = capsys.readouterr()
    assert "held-out: clm_loss" in printed and "clm_accuracy" in printed and "next-token loss" in printed
    assert "bertforge: warning: data.mlm_probability, --no-nsp: a GPT (--objective clm) trains on" in warned
    config = read_config(out)
    model = config.model
    assert (model.objective, model.hidden_act, model.layer_norm_eps, model.hidden_size) == (
        "clm",
        "gelu_new",
        1e-5,  # GPT-1's, where BERT's is 1e-12
        128,
    )
    assert main(["export", "--model", str(out), "--out", str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["layer_norm_epsilon"] == 1e-5
    resume = ["pretrain", "--out", str(out), "--resume", "--objective", "clm"]
    assert_clean_failure(capsys, resume, "drop --objective")
    gelu = ["pretrain", "--objective", "clm", "--corpus", str(wiki_slice), "--out", str(tmp_path / "gelu")]
    assert_clean_failure(capsys, [*gelu, "--set", "model.hidden_act=gelu"], "gelu_new")


def test_precision_probe_times_a_gpts_vocabulary_projection():
    bert, gpt = ModelConfig(), ModelConfig(objective="clm")
    assert probe_shapes(gpt) == [*probe_shapes(bert), (PROBE_TOKENS, gpt.hidden_size, gpt.vocab_size)]
    assert machine_key(bert) != machine_key(gpt)
    assert machine_key(bert) == machine_key(ModelConfig(vocab_size=8))  # BERT's probe ignores the vocabulary


def test_a_gpt_run_on_a_bert_config_file_records_no_sentence_pairs(
    tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir
):
    """A config file that trains BERT with NSP (or NSP for its warmup) serves a GPT too, which trains
    none: the run's config.json says so, from the command line or the Python API."""
    from bertforge.cli import build_parser
    from bertforge.commands.pretraining import pretrain_config

    warmup_nsp = "[data]\nnsp = false\nwarmup_nsp = true\nwarmup_seq_length = 32\n"
    for name, data in (("nsp", "[data]\nnsp = true\n"), ("warmup", warmup_nsp)):
        (tmp_path / f"{name}.toml").write_text(f'preset = "mini"\n{data}', encoding="utf-8")
        argv = ["pretrain", "--config", str(tmp_path / f"{name}.toml"), "--corpus", "x", "--out", "y"]
        bert = pretrain_config(build_parser().parse_args(argv))
        assert bert.data.nsp or bert.data.warmup_nsp
        gpt = pretrain_config(build_parser().parse_args([*argv, "--objective", "clm"]))
        assert (gpt.model.objective, gpt.data.nsp, gpt.data.warmup_nsp) == ("clm", False, False)
    config = clm_config(wiki_slice, wiki_valid_slice, max_steps=1, eval_every=1)
    config.data.nsp = True  # as a BERT config would have it
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    assert not read_config(tmp_path / "run").data.nsp


# ------------------------------------------------------------------------------ using the model


def test_evaluate_gives_the_runs_held_out_next_token_metrics(gpt_run, wiki_valid_slice, capsys):
    assert (
        main(["evaluate", "--model", str(gpt_run), "--corpus", str(wiki_valid_slice), "--json", "--quiet"])
        == 0
    )
    metrics = json.loads(capsys.readouterr().out)
    last = metrics_lines(gpt_run, "valid")[-1]
    for key in ("clm_loss", "perplexity", "clm_accuracy"):
        assert metrics[key] == pytest.approx(last[key], rel=1e-6)
    assert "mlm_loss" not in metrics and metrics["unigram_entropy"] > 0
    argv = ["evaluate", "--model", str(gpt_run), "--corpus", str(wiki_valid_slice), "--no-nsp"]
    assert main(argv) == 2
    assert "drop --nsp/--no-nsp" in capsys.readouterr().err


def test_export_loads_in_transformers_with_equal_logits_and_generates(gpt_run, gpt_export):
    config = json.loads((gpt_export / "config.json").read_text())
    model, tokenizer, _ = open_pretrained(gpt_run)
    assert config["architectures"] == ["OpenAIGPTLMHeadModel"] and config["eos_token_id"] == tokenizer.sep_id
    for cls in (transformers.OpenAIGPTLMHeadModel, transformers.AutoModelForCausalLM):
        hf = cls.from_pretrained(gpt_export).eval()
        ids = torch.tensor(tokenizer.encode_batch(["the game was released in japan , and it sold well ."]))
        with torch.no_grad():
            torch.testing.assert_close(hf(input_ids=ids).logits, model(ids), rtol=0, atol=1e-5)
    generator = transformers.pipeline("text-generation", model=str(gpt_export))
    text = generator(PROMPT, do_sample=False, max_new_tokens=8)[0]["generated_text"]
    assert text.startswith(PROMPT) and len(text) > len(PROMPT)


def test_import_hf_round_trip(tmp_path, capsys, gpt_run, gpt_export, wiki_valid_slice):
    imported = tmp_path / "imported"
    assert main(["import-hf", "--from", str(gpt_export), "--out", str(imported)]) == 0
    ours, theirs = (
        read_weights(gpt_run / "final" / "model.safetensors"),
        read_weights(imported / "model.safetensors"),
    )
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert (
        load_tokenizer(imported).fingerprint == load_tokenizer(gpt_run / "final").fingerprint
    )  # byte for byte
    assert read_config(imported).model == read_config(gpt_run / "final").model
    capsys.readouterr()
    metrics = []
    for model in (gpt_run, imported, gpt_export):
        assert (
            main(["evaluate", "--model", str(model), "--corpus", str(wiki_valid_slice), "--json", "--quiet"])
            == 0
        )
        metrics.append(json.loads(capsys.readouterr().out))
    assert metrics[0] == metrics[1] == metrics[2]


def test_pretraining_starts_from_an_exported_gpt(tmp_path, gpt_run, gpt_export, wiki_slice):
    out = tmp_path / "run"
    argv = ["pretrain", "--init", str(gpt_export), "--corpus", str(wiki_slice), "--out", str(out)]
    argv += ["--max-steps", "2", "--batch-size", "4", "--precision", "fp32", "--quiet"]
    assert main([*argv, "--set", "data.max_seq_length=32", "--set", "train.eval_every=2"]) == 0
    assert read_config(out).model == read_config(gpt_run).model  # a GPT, the exported one's size
    first = metrics_lines(out, "train")[0]
    assert first["clm_loss"] < np.log(2000) - 0.5  # the pretrained weights, not a fresh model


def test_generate_greedy_equals_transformers_and_a_seed_repeats_a_draw(gpt_run, gpt_export, capsys):
    argv = ["generate", "--model", str(gpt_run), PROMPT, "--max-new-tokens", "12", "--json"]
    assert main([*argv, "--greedy"]) == 0
    ours = json.loads(capsys.readouterr().out)
    hf = transformers.OpenAIGPTLMHeadModel.from_pretrained(gpt_export).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(gpt_export)
    encoded = hf_tokenizer(PROMPT, return_tensors="pt")
    theirs = hf.generate(**encoded, do_sample=False, max_new_tokens=12)
    assert ours["token_ids"] == theirs[0].tolist() and ours["new_tokens"] > 0
    assert ours["text"].startswith(PROMPT)

    draws = []
    for _ in range(2):
        assert main([*argv, "--seed", "7", "--top-k", "20", "--temperature", "0.8"]) == 0
        draws.append(json.loads(capsys.readouterr().out)["token_ids"])
    assert draws[0] == draws[1]
    assert main(["generate", "--model", str(gpt_export), PROMPT, "--greedy", "--max-new-tokens", "12"]) == 0
    assert capsys.readouterr().out.strip() == ours["text"]  # the exported folder generates the same


def test_generate_shows_the_prompt_as_typed_and_says_what_it_could_not_read(gpt_run, capsys):
    argv = ["generate", "--model", str(gpt_run), "--greedy", "--max-new-tokens", "4", "--json"]
    assert main([*argv, "The Album, 1999: it"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["text"].startswith("The Album, 1999: it ") and "warning" not in out.err
    assert main([*argv, "\u65e5\u672c is"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["text"].startswith("\u65e5\u672c is ")  # not dropped as [UNK]
    assert "2 of the prompt's 3 tokens are unknown to the tokenizer" in out.err
    assert main([*argv, "\u65e5\u672c"]) == 0  # nothing of it decodes: the first new word after a space
    assert re.match(r"\u65e5\u672c [a-z]", json.loads(capsys.readouterr().out)["text"])
    assert main([*argv, "the album "]) == 0  # a space at its end: not doubled
    assert re.match(r"the album [a-z]", json.loads(capsys.readouterr().out)["text"])
    assert main([*argv, "--temperature", "0", "the album"]) == 0  # greedy decoding reads no temperature
    capsys.readouterr()
    sampled = ["generate", "--model", str(gpt_run), "the album", "--temperature", "0"]
    assert_clean_failure(
        capsys, sampled, "--temperature must be above 0; for the most likely tokens, give --greedy"
    )


def test_a_long_generation_shows_its_progress_unless_quiet(gpt_run, capsys):
    argv = ["generate", "--model", str(gpt_run), PROMPT, "--greedy", "--max-new-tokens", "200"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "generate" in err and "tokens" in err and "about" in err  # plain lines here, a bar on a terminal
    assert out.startswith(PROMPT)
    assert main([*argv, "--quiet"]) == 0
    assert capsys.readouterr() == (out, "")
    assert main([*argv[:-1], "10"]) == 0  # a short one: no bar
    assert capsys.readouterr().err == ""


def test_a_tokenizer_taken_from_a_gpt_export_frames_and_decodes_as_bertforge_does(gpt_run, gpt_export):
    from bertforge.tokenizer import load_given_tokenizer

    ours, given = load_tokenizer(gpt_run / "tokenizer"), load_given_tokenizer(gpt_export)
    ids = ours.encode_batch([PROMPT + " playing"])[0]
    assert load_tokenizer(gpt_export).decode(ids) == " " + PROMPT + " playing"  # the export's generation form
    assert given.decode(ids) == ours.decode(ids) == PROMPT + " playing"
    assert given.encode_pair(PROMPT, "it sold well") == ours.encode_pair(PROMPT, "it sold well")
    assert given.vocab_size == ours.vocab_size and given.kind == ours.kind


def test_import_names_the_tensor_the_weights_hold_and_a_missing_tokenizer(
    tmp_path, capsys, gpt_run, gpt_export, wiki_slice
):
    bert_weights = {"bert.embeddings.LayerNorm.bias": torch.zeros(4)}  # an unprefixed (bare model) file
    with pytest.raises(BertforgeError, match="the weights hold bert.embeddings.LayerNorm.bias, not a tensor"):
        from_hf_state_dict(bert_weights)
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(gpt_export / name, bare / name)
    argv = ["import-hf", "--from", str(bare), "--out", str(tmp_path / "imported")]
    assert_clean_failure(capsys, argv, "has neither tokenizer.json nor vocab.txt: it holds no tokenizer")
    (bare / "vocab.json").write_text('{"a</w>": 0}', encoding="utf-8")  # as openai-gpt's own folder has
    (bare / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    assert_clean_failure(capsys, argv, "holds a BPE tokenizer (vocab.json and merges.txt); bertforge")
    argv = [
        "pretrain",
        "--corpus",
        str(wiki_slice),
        "--tokenizer",
        str(gpt_run),
        "--out",
        str(tmp_path / "r"),
    ]
    assert_clean_failure(
        capsys, argv, f"a run's tokenizer is in its tokenizer/ folder, {gpt_run / 'tokenizer'}"
    )


def test_a_gpt_window_too_short_is_named_as_a_window():
    config = clm_config()
    config.data.max_seq_length = 2
    with pytest.raises(
        BertforgeError, match=r"at least 3 \(a window of text whose tokens predict the next ones\)"
    ):
        validate(config)


def test_the_export_tells_transformers_the_length_the_gpt_trained_at(gpt_run, tmp_path):
    model, tokenizer, config = open_pretrained(gpt_run)
    config.data.max_seq_length = 24  # of its 64 positions
    save_model_folder(tmp_path / "model", model, tokenizer, config)
    assert main(["export", "--model", str(tmp_path / "model"), "--out", str(tmp_path / "hf")]) == 0
    for folder in (tmp_path / "model", tmp_path / "hf"):
        assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == 24
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert len(hf_tokenizer("word " * 100, truncation=True)["input_ids"]) == 24


def test_generate_reads_no_more_than_the_length_the_model_was_trained_on(gpt_run, tmp_path, capsys):
    from bertforge.generate import generate

    model, tokenizer, config = open_pretrained(gpt_run)
    config.data.max_seq_length = trained = 24  # as if trained on 24 of its 64 positions
    torch.manual_seed(0)
    with torch.no_grad():  # weights spread wide, so that what a prediction reads shows in its draws
        for weight in model.parameters():
            weight.normal_(0, 0.5)
    model_dir = tmp_path / "model"
    save_model_folder(model_dir, model, tokenizer, config)
    steps = config.model.max_position_embeddings  # well past the trained length
    draw = ["--seed", "3", "--top-k", "0", "--top-p", "1", "--temperature", "1.5"]  # draws, not a greedy loop
    argv = ["generate", "--model", str(model_dir), PROMPT, "--max-new-tokens", str(steps), "--json", *draw]
    assert main(argv) == 0
    ours = json.loads(capsys.readouterr().out)["token_ids"]
    prompt = torch.tensor(tokenizer.encode_batch([PROMPT])[0])
    settings = dict(do_sample=True, seed=3, temperature=1.5, eos_token_id=tokenizer.sep_id)
    assert ours == generate(model, prompt, steps, window=trained, **settings).tolist() and len(ours) > trained
    assert ours != generate(model, prompt, steps, **settings).tolist()  # the positions' window reads more


@pytest.mark.parametrize(
    "command",
    [
        ["fill-mask", "the [MASK] sat ."],
        ["nsp", "a .", "b ."],
        ["showcase", "--corpus", "x"],
        ["embed", "--input", "x", "--out", "x.npy"],
    ],
)
def test_bert_commands_refuse_a_gpt_in_one_line(tmp_path, capsys, gpt_run, command):
    if command[0] in ("showcase", "embed"):
        (tmp_path / "x").write_text("one line of text .\n")
        command = [part if part != "x" else str(tmp_path / "x") for part in command]
    assert_clean_failure(capsys, [*command, "--model", str(gpt_run)], "holds a GPT")


def test_generate_refuses_a_bert_and_an_empty_prompt(capsys, tiny_pretrained_run, gpt_run):
    assert_clean_failure(capsys, ["generate", "--model", str(tiny_pretrained_run), PROMPT], "holds a BERT")
    assert_clean_failure(capsys, ["generate", "--model", str(gpt_run), " "], "prompt is empty")


# ---------------------------------------------------------------------------------- fine-tuning


def toy_rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        label = sorted(TOPICS)[i % 2]
        words = rng.choices(TOPICS[label], k=rng.randint(2, 5)) + rng.choices(("the", "of", "a"), k=2)
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "label": label})
    return rows


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("toy")
    paths = folder / "train.jsonl", folder / "valid.jsonl"
    for path, rows in zip(paths, (toy_rows(48, 0), toy_rows(16, 1)), strict=True):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return paths


def finetune_argv(model: Path, toy: tuple[Path, Path], out: Path, *extra: str) -> list[str]:
    return [
        *("finetune", "--model", str(model), "--train", str(toy[0]), "--valid", str(toy[1])),
        *("--text-column", "text", "--label-column", "label", "--out", str(out), "--epochs", "2"),
        *(
            "--batch-size",
            "8",
            "--lr",
            "3e-3",
            "--max-length",
            "32",
            "--precision",
            "fp32",
            "--quiet",
            *extra,
        ),
    ]


@pytest.fixture(scope="module")
def gpt_classifier(tmp_path_factory, gpt_run, toy) -> Path:
    out = tmp_path_factory.mktemp("gpt-sst") / "run"
    assert main(finetune_argv(gpt_run, toy, out)) == 0
    return out


@torch.no_grad()
def test_gpt_classifier_matches_hugging_face_both_ways():
    config = ModelConfig(**HF_TINY_GPT_SIZES)
    torch.manual_seed(0)
    ours = GPTForSequenceClassification(config, 3).eval()
    raw = hf_config(config, labels=["a", "b", "c"])
    assert raw["architectures"] == ["OpenAIGPTForSequenceClassification"] and raw["num_labels"] == 3
    settings = transformers.OpenAIGPTConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    hf = transformers.OpenAIGPTForSequenceClassification(settings).eval()
    hf.load_state_dict(to_hf_state_dict(ours.state_dict()), strict=True)
    lengths = torch.tensor([12, 7, 3])
    mask = (torch.arange(12) < lengths[:, None]).long()  # (B, T): right padding, as pad_batch makes
    ids = torch.randint(1, 99, (3, 12), generator=torch.Generator().manual_seed(1)) * mask  # pad id 0
    theirs = hf(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(ours(ids, attention_mask=mask), theirs, rtol=0, atol=1e-5)
    torch.testing.assert_close(ours(ids[:1]), hf(input_ids=ids[:1]).logits, rtol=0, atol=1e-5)  # no padding
    back = GPTForSequenceClassification(config, 3).eval()
    back.load_state_dict(from_hf_state_dict(hf.state_dict()))
    torch.testing.assert_close(back(ids, attention_mask=mask), theirs, rtol=0, atol=1e-5)


def test_gpt_classifier_runs_its_last_block_for_the_read_token_with_hugging_faces_gradients():
    """Only the last real token goes through the last block's queries, attention output and
    feed-forward (its keys and values still come from every position): the logits and every
    gradient stay Hugging Face's."""
    config = ModelConfig(**HF_TINY_GPT_SIZES)
    torch.manual_seed(2)
    ours = GPTForSequenceClassification(config, 3).eval()  # eval: no dropout, gradients as in training
    settings = hf_config(config, labels=["a", "b", "c"])
    hf = transformers.OpenAIGPTForSequenceClassification(
        transformers.OpenAIGPTConfig(**{k: v for k, v in settings.items() if k != "model_type"})
    ).eval()
    hf.load_state_dict(to_hf_state_dict(ours.state_dict()), strict=True)
    mask = (torch.arange(12) < torch.tensor([12, 7, 3])[:, None]).long()  # (B, T), right padding
    ids = torch.randint(1, 99, (3, 12), generator=torch.Generator().manual_seed(3)) * mask
    rows = []
    last_ffn = ours.gpt.layer[-1].intermediate.dense
    last_ffn.register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[:2]))
    logits = {"ours": ours(ids, attention_mask=mask), "hf": hf(input_ids=ids, attention_mask=mask).logits}
    assert rows == [(3, 1)]  # one position per sequence, not 12
    for name in logits:
        F.cross_entropy(logits[name], torch.tensor([0, 2, 1])).backward()
    torch.testing.assert_close(logits["ours"], logits["hf"], rtol=0, atol=1e-5)
    grads = {n: p.grad for n, p in ours.named_parameters() if n != "score.weight"}
    assert all(g.abs().max() > 1e-4 for n, g in grads.items() if not n.endswith("key.bias")), "all take part"
    theirs = dict(hf.named_parameters())
    for name, grad in to_hf_state_dict(grads).items():
        torch.testing.assert_close(grad, theirs[name].grad, rtol=1e-4, atol=1e-6, msg=name)
    torch.testing.assert_close(ours.score.weight.grad, hf.score.weight.grad, rtol=1e-4, atol=1e-6)


REAL = torch.tensor([10, 6, 2])[:, None]  # real tokens per row of 10
READ_AT_CASES = {  # padding: (attention mask, positions read)
    "none": (None, [9, 4, 0]),  # any positions: each sees the keys up to it
    "right": ((torch.arange(10) < REAL).long(), [9, 5, 1]),
    "left": ((torch.arange(10) >= 10 - REAL).long(), [9, 9, 9]),
}


@pytest.mark.parametrize("padding", READ_AT_CASES)
def test_gpt_reads_one_position_per_row_as_the_whole_sequence_gives_it(padding):
    mask, positions = READ_AT_CASES[padding]
    torch.manual_seed(4)
    model = GPTForSequenceClassification(ModelConfig(**HF_TINY_GPT_SIZES), 2).gpt.eval()
    ids = torch.randint(1, 99, (3, 10), generator=torch.Generator().manual_seed(5))
    read_at = torch.tensor(positions)
    with torch.no_grad():
        whole = model(ids, attention_mask=mask)[torch.arange(3), read_at]  # (B, H)
        alone = model(ids, attention_mask=mask, read_at=read_at)  # (B, 1, H)
    assert alone.shape == (3, 1, 32)
    torch.testing.assert_close(alone[:, 0], whole, rtol=0, atol=1e-5)


def test_finetune_a_gpt_writes_a_gpt_classifier(gpt_classifier, capsys):
    result = json.loads((gpt_classifier / "result.json").read_text())
    assert result["best_epoch"] in (1, 2) and 0 <= result["best"]["accuracy"] <= 1
    weights = read_weights(gpt_classifier / "final" / "model.safetensors")
    assert weights["score.weight"].shape == (2, 32) and "score.bias" not in weights
    assert all(k.startswith("gpt.") for k in weights if k != "score.weight")
    assert main(["classify", "--model", str(gpt_classifier), "album song of the", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["label"] in TOPICS


def test_gpt_classifier_export_equals_hugging_face(gpt_classifier, tmp_path):
    out = tmp_path / "hf"
    assert main(["export", "--model", str(gpt_classifier), "--out", str(out)]) == 0
    hf = transformers.OpenAIGPTForSequenceClassification.from_pretrained(out).eval()
    model, tokenizer, labels, _ = open_classifier(gpt_classifier)
    texts = ["album song of the", "the war battle fought by the army of a", "music"]
    batch = pad_batch([{"input_ids": tokenizer.encode_pair(text)[0]} for text in texts], tokenizer.pad_id)
    with torch.no_grad():
        ours = model(batch["input_ids"], attention_mask=batch["attention_mask"])
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)

    pipe = transformers.pipeline("text-classification", model=str(out), top_k=None)
    expected = classify(model, tokenizer, labels, texts)
    for scores, result in zip(pipe(texts), expected, strict=True):
        by_label = {s["label"]: s["score"] for s in scores}
        assert max(abs(by_label[k] - v) for k, v in result["probabilities"].items()) <= 1e-5
    exported, hf_tokenizer, hf_labels, _ = open_classifier(out)  # the export classifies the same
    assert hf_labels == labels and hf_tokenizer.fingerprint == tokenizer.fingerprint
    assert [r["label"] for r in classify(exported, hf_tokenizer, hf_labels, texts)] == [
        r["label"] for r in expected
    ]


def test_finetune_a_gpt_learns_stsb_scores_as_a_regression(tmp_path, capsys, gpt_run, stsb):
    out = tmp_path / "gpt-stsb"
    recipe = ("--epochs", "5", "--batch-size", "16", "--lr", "2e-3")  # a 32-wide GPT of 40 steps
    assert main(stsb_finetune_argv(gpt_run, stsb, out, *recipe)) == 0
    capsys.readouterr()  # its summary
    result = json.loads((out / "result.json").read_text())
    valid = [r for r in metrics_lines(out, "valid") if "epoch" in r]
    assert [r["epoch"] for r in valid] == [0, 1, 2, 3, 4, 5] and result["task_type"] == "regression"
    best = max(valid[1:], key=lambda r: r["pearson"])  # the best epoch is the one of highest Pearson's r
    assert result["best_epoch"] == best["epoch"] and result["best"]["pearson"] == best["pearson"]
    assert set(result["best"]) == {"pearson", "spearman", "mse"}
    curve = [r["pearson"] for r in valid]
    assert result["best"]["pearson"] > 0.2 and result["best"]["pearson"] > valid[0]["pearson"] + 0.15, curve
    predictions = json.loads((out / "valid_predictions.json").read_text())
    assert len(predictions["predicted"]) == STSB_VALID_PAIRS
    assert read_weights(out / "final" / "model.safetensors")["score.weight"].shape == (1, 32)
    pair = ("A man is playing a guitar.", "A man plays the guitar.")
    assert main(["classify", "--model", str(out), "--json", "\t".join(pair)]) == 0
    printed = json.loads(capsys.readouterr().out)
    model, tokenizer, labels, _ = open_classifier(out)
    assert set(printed) == {"text", "score"}
    assert printed["score"] == pytest.approx(
        classify(model, tokenizer, labels, [pair[0]], [pair[1]])[0]["score"]
    )


def test_finetune_a_gpt_refuses_reinit_pooler(tmp_path, capsys, gpt_run, toy):
    out = tmp_path / "fresh-pooler"
    assert_clean_failure(capsys, finetune_argv(gpt_run, toy, out, "--reinit-pooler"), "has no pooler")
    assert not out.exists()


@pytest.mark.slow
def test_finetune_a_gpt_against_scratch(tmp_path, capsys, gpt_run, toy):
    out = tmp_path / "compare"
    argv = finetune_argv(gpt_run, toy, out, "--compare-scratch", "--seeds", "1,2")
    argv[argv.index("--epochs") + 1] = "1"
    assert main(argv) == 0
    assert "sign test" in capsys.readouterr().out
    comparison = json.loads((out / "comparison.json").read_text())
    assert [pair["seed"] for pair in comparison["pairs"]] == [1, 2]
    pretrained = read_weights(out / "pretrained" / "seed_1" / "final" / "model.safetensors")
    scratch = read_weights(out / "scratch" / "seed_1" / "final" / "model.safetensors")
    assert pretrained.keys() == scratch.keys() and "score.weight" in pretrained


def test_a_gpt_model_loads_as_a_gpt(gpt_run):
    model, _, config = open_pretrained(gpt_run)
    assert isinstance(model, GPTLMHeadModel) and config.model.objective == "clm"


def test_a_hugging_face_gpt_counts_as_trained_on_all_its_positions(tmp_path, small_tokenizer_dir):
    """GPT-1 trained on windows of its 512 positions, Google's BERTs ended at 512 tokens: another's model
    is read at all its positions (`generate` and `fill-mask` alike), not at bertforge's default 128."""
    from bertforge.folders import run_config_for

    tokenizer = load_tokenizer(small_tokenizer_dir)
    gpt = ModelConfig(
        **{**HF_TINY_GPT_SIZES, "vocab_size": tokenizer.vocab_size, "max_position_embeddings": 512}
    )
    assert run_config_for(tmp_path, gpt, tokenizer).data.max_seq_length == 512
    bert = ModelConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=512)
    assert run_config_for(tmp_path, bert, tokenizer).data.max_seq_length == 512
