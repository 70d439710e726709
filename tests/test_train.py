"""The training loop: schedule, a falling validation loss, exact resume, save and reload."""

from __future__ import annotations

import shutil
import time

import pytest
import torch
from conftest import metrics_lines, tiny_config

from bertforge.checkpoint import list_checkpoints, read_weights
from bertforge.config import TrainConfig
from bertforge.errors import BertforgeError
from bertforge.folders import open_pretrained
from bertforge.optimizer import Schedule, build_optimizer
from bertforge.pretrain import pretrain


def test_schedule_warms_up_then_decays_linearly():
    schedule = Schedule(TrainConfig(learning_rate=1.0, max_steps=100, warmup_steps=10))
    assert schedule.learning_rate(schedule.progress(5, 0)) == pytest.approx(0.5)
    assert schedule.learning_rate(schedule.progress(10, 0)) == pytest.approx(1.0)
    assert schedule.learning_rate(schedule.progress(55, 0)) == pytest.approx(0.5)
    assert schedule.learning_rate(schedule.progress(100, 0)) == pytest.approx(0.0)


def test_warmup_stable_decay_holds_the_peak_until_its_decay():
    train = TrainConfig(learning_rate=1.0, max_steps=100, warmup_steps=10, schedule="wsd", decay_ratio=0.2)
    schedule = Schedule(train)
    assert schedule.learning_rate(schedule.progress(5, 0)) == pytest.approx(0.5)
    assert schedule.learning_rate(schedule.progress(50, 0)) == pytest.approx(1.0)
    assert schedule.learning_rate(schedule.progress(80, 0)) == pytest.approx(1.0)
    assert schedule.learning_rate(schedule.progress(90, 0)) == pytest.approx(0.5)
    assert schedule.learning_rate(schedule.progress(100, 0)) == pytest.approx(0.0)


def test_time_budget_drives_progress():
    schedule = Schedule(TrainConfig(max_steps=1_000_000, max_minutes=2.0, warmup_ratio=0.0))
    assert schedule.progress(10, 60.0) == pytest.approx(0.5)
    assert schedule.progress(10, 150.0) == 1.0


def test_no_weight_decay_on_biases_and_layernorm():
    from bertforge.model import BertForPreTraining

    model = BertForPreTraining(tiny_config().model)
    decay, no_decay = build_optimizer(model, TrainConfig(weight_decay=0.01), torch.device("cpu")).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(not names[id(p)].endswith("bias") and "LayerNorm" not in names[id(p)] for p in decay["params"])
    assert all(names[id(p)].endswith("bias") or "LayerNorm" in names[id(p)] for p in no_decay["params"])
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.01


def test_layer_decay_scales_each_layers_rate_and_the_loop_applies_it(
    tmp_path, wiki_slice, small_tokenizer_dir
):
    from bertforge.checkpoint import OPTIMIZER, list_checkpoints
    from bertforge.model import BertForPreTraining

    config = tiny_config(wiki_slice, max_steps=6, checkpoint_every=3, layer_decay=0.5)
    model = BertForPreTraining(config.model)  # two layers: embeddings 1/8, layer 0 1/4, layer 1 1/2
    groups = build_optimizer(model, config.train, torch.device("cpu")).param_groups
    scale = {id(p): group["lr_scale"] for group in groups for p in group["params"]}
    for name, param in model.named_parameters():
        expected = (
            0.125
            if "embeddings" in name
            else 0.25
            if ".layer.0." in name
            else 0.5
            if ".layer.1." in name
            else 1
        )
        assert scale[id(param)] == expected, name
    assert (
        len(build_optimizer(model, TrainConfig(), torch.device("cpu")).param_groups) == 2
    )  # no decay: as ever

    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    middle = list_checkpoints(tmp_path / "run")[0]  # step 3 of 6: the rate is not yet 0
    saved = torch.load(middle / OPTIMIZER, weights_only=True)["optimizer"]
    rates = {group["lr_scale"]: group["lr"] for group in saved["param_groups"]}
    assert set(rates) == {0.125, 0.25, 0.5, 1.0} and rates[1.0] > 0
    assert all(rate == pytest.approx(scale * rates[1.0]) for scale, rate in rates.items())


@pytest.mark.rendered
@pytest.mark.slow
def test_validation_loss_falls_on_wikitext(tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir):
    config = tiny_config(wiki_slice, wiki_valid_slice, max_steps=80, eval_every=40, batch_size=16)
    config.train.learning_rate = 3e-3
    config.train.mlm_bias_init = "zero"  # from ln(V): the loop must learn the frequencies too
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    valid = metrics_lines(tmp_path / "run", "valid")
    assert [v["step"] for v in valid] == [0, 40, 80]
    assert valid[-1]["mlm_loss"] < valid[0]["mlm_loss"] - 1.0
    assert valid[-1]["mlm_accuracy"] > valid[0]["mlm_accuracy"]
    assert (tmp_path / "run" / "loss.png").stat().st_size > 10_000
    assert metrics_lines(tmp_path / "run", "train")[-1]["tokens_per_s"] > 0


def test_resume_reproduces_the_uninterrupted_run(tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir):
    config = tiny_config(wiki_slice, wiki_valid_slice, max_steps=8, eval_every=4, keep_checkpoints=3)
    full = tmp_path / "full"
    pretrain(config, full, tokenizer_dir=small_tokenizer_dir, show_progress=False)
    assert [p.name for p in list_checkpoints(full)] == ["step_000004", "step_000008"]

    # Simulate a run stopped after its step-4 checkpoint: drop everything it wrote later.
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "checkpoints" / "step_000008")
    shutil.rmtree(cut / "final")
    from bertforge.checkpoint import read_config

    pretrain(read_config(cut), cut, resume=True, show_progress=False)

    full_train, cut_train = metrics_lines(full, "train"), metrics_lines(cut, "train")
    assert [x["step"] for x in cut_train] == list(range(1, 9))
    for a, b in zip(full_train, cut_train, strict=True):
        assert a["loss"] == b["loss"] and a["mlm_loss"] == b["mlm_loss"] and a["nsp_loss"] == b["nsp_loss"]
    assert metrics_lines(full, "valid")[-1] == metrics_lines(cut, "valid")[-1]
    tokens = [line["tokens"] for line in metrics_lines(full, "valid")]  # steps 0, 4 and 8
    assert tokens[0] == 0 < tokens[1] < tokens[2]
    full_weights = read_weights(full / "final" / "model.safetensors")
    cut_weights = read_weights(cut / "final" / "model.safetensors")
    assert all(torch.equal(full_weights[k], cut_weights[k]) for k in full_weights)


def test_saved_model_reloads_with_identical_outputs(tmp_path, wiki_slice, small_tokenizer_dir):
    config = tiny_config(wiki_slice, max_steps=4, eval_every=4)
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    final_model, tokenizer, _ = open_pretrained(tmp_path / "run")
    checkpoint_model, _, _ = open_pretrained(tmp_path / "run" / "checkpoints" / "step_000004")
    for (name, a), (_, b) in zip(
        final_model.state_dict().items(), checkpoint_model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    ids, types = tokenizer.encode_pair("the game was released in japan .", "it sold well .")
    ids, types = torch.tensor([ids]), torch.tensor([types])
    with torch.inference_mode():
        first = final_model(ids, token_type_ids=types)
        second = checkpoint_model(ids, token_type_ids=types)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert final_model.cls.predictions.decoder.weight is final_model.bert.embeddings.word_embeddings.weight


def test_mlm_only_run_without_nsp(tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir):
    config = tiny_config(wiki_slice, wiki_valid_slice, max_steps=4, eval_every=4)
    config.data.nsp = False
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    valid = metrics_lines(tmp_path / "run", "valid")[-1]
    assert "mlm_loss" in valid and "nsp_loss" not in valid


def test_gradient_accumulation_runs_and_logs_every_step(tmp_path, wiki_slice, small_tokenizer_dir):
    config = tiny_config(wiki_slice, max_steps=3, eval_every=3, gradient_accumulation_steps=2)
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    assert [x["step"] for x in metrics_lines(tmp_path / "run", "train")] == [1, 2, 3]


def test_time_budget_ends_the_run(tmp_path, wiki_slice, small_tokenizer_dir, capsys):
    config = tiny_config(wiki_slice, max_steps=1_000_000, eval_every=1_000_000, max_minutes=0.05)
    result = pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    assert 0 < result["step"] < 1_000_000
    spent = f"step {result['step']}: the time budget is spent; the last checkpoint follows"  # no --valid
    assert capsys.readouterr().out.count(spent) == 1  # what follows the budget is said to
    config.train.max_steps = 3  # the step limit ends the run within its budget: nothing to say
    pretrain(config, tmp_path / "steps", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    assert "time budget" not in capsys.readouterr().out
    assert 3.0 <= result["elapsed_s"] < 25  # the run lasts its 3-second budget, not much longer
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()  # LR decay by time: fake-clock test


def test_an_evaluation_that_spends_the_time_budget_ends_the_run_at_its_step(
    tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir, monkeypatch, capsys
):
    """Step 6's evaluation outlasts the 3-second budget: the run ends at step 6, evaluated and
    checkpointed once, rather than taking a step 7 at a learning rate of 0 and evaluating again."""
    from bertforge.train import Trainer

    evaluate = Trainer.evaluate

    def slow_evaluate(self, step, bar):
        evaluate(self, step, bar)
        if step == 6:
            time.sleep(4)

    monkeypatch.setattr(Trainer, "evaluate", slow_evaluate)
    config = tiny_config(wiki_slice, wiki_valid_slice, max_steps=1_000_000, eval_every=6, max_minutes=0.05)
    config.train.log_every, config.train.checkpoint_every = 4, 1000  # step 6 neither logs nor saves by them
    result = pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    assert result["step"] == 6
    spent = "step 6: the time budget is spent; the last checkpoint follows"  # after step 6's evaluation
    assert capsys.readouterr().out.count(spent) == 1
    lines = metrics_lines(tmp_path / "run")
    assert [(line["split"], line["step"]) for line in lines if line["step"] > 4] == [
        ("train", 6),
        ("valid", 6),
    ]
    assert [path.name for path in list_checkpoints(tmp_path / "run")][-1] == "step_000006"
    assert lines[-1]["tokens"] == result["tokens"]  # the held-out line counts every step's tokens


@pytest.mark.slow
def test_time_budget_progress_counts_the_budget_not_the_step_limit_in_a_few_plain_lines(
    tmp_path, wiki_slice, small_tokenizer_dir, capsys
):
    config = tiny_config(
        wiki_slice, max_steps=1_000_000, eval_every=1_000_000, max_minutes=0.05
    )  # several steps even on a loaded machine
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=True)
    err = capsys.readouterr().err  # not a terminal, as under nohup or CI: lines, not a redrawn bar
    assert "\r" not in err
    shown = [line for line in err.splitlines() if "of the time budget" in line]
    assert 1 <= len(shown) <= 10  # at most one per tenth of the 3 s budget
    assert shown[-1].startswith("100% (3/3 s of the time budget)")  # the budget, not 1e6 steps, is done
    assert "; step=" in shown[-1] and "loss=" in shown[-1] and "tok_s=" in shown[-1]
    assert "1000000" not in err


def test_a_run_logged_to_a_file_shows_a_line_per_tenth_of_its_steps(
    tmp_path, wiki_slice, small_tokenizer_dir, capsys
):
    config = tiny_config(wiki_slice, max_steps=20, eval_every=1_000)
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=True)
    err = capsys.readouterr().err
    shown = [line for line in err.splitlines() if " steps), " in line]
    assert "\r" not in err
    assert [line.split(" (")[0] for line in shown] == [f"{p}%" for p in range(10, 101, 10)]
    assert shown[4].startswith("50% (10/20 steps)") and "about" in shown[4] and "; step=10, loss=" in shown[4]


def test_sequence_length_warmup_uses_short_pairs_for_its_share_of_the_run(
    tmp_path, monkeypatch, wiki_slice, small_tokenizer_dir
):
    import bertforge.pretrain
    from bertforge.io import read_json

    widths = []
    real_loss = bertforge.pretrain.masked_lm_and_nsp_loss

    def recording_loss(model, batch, vocab_size):
        widths.append(batch["input_ids"].shape[1])
        return real_loss(model, batch, vocab_size)

    monkeypatch.setattr(bertforge.pretrain, "masked_lm_and_nsp_loss", recording_loss)
    config = tiny_config(wiki_slice, max_steps=8)
    config.data.warmup_seq_length, config.data.warmup_seq_fraction = 16, 0.5
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    assert len(widths) == 8  # one micro-batch a step
    assert max(widths[:4]) == 16  # packed close to the warmup length, for half of the steps
    assert min(widths[4:]) > 16 and max(widths[4:]) == 64
    # The slice's first 16-token epoch is longer than 4 steps: it was cut, and epoch 1 was the first long one.
    state = read_json(list_checkpoints(tmp_path / "run")[-1] / "state.json")
    assert state["warmup_end_epoch"] == 1


def test_a_sequence_length_warmup_is_also_evaluated_at_its_length_and_its_end_is_marked(
    tmp_path, monkeypatch, wiki_slice, wiki_valid_slice, small_tokenizer_dir
):
    import bertforge.pretrain
    from bertforge.metrics_log import MetricsLog
    from bertforge.plots import pretraining_figure, warmup_end

    widths = []  # per evaluation: its widest batch
    real_metrics = bertforge.pretrain.pretraining_metrics

    def recording_metrics(model, batches, *args, **kwargs):
        widths.append(max(batch["input_ids"].shape[1] for batch in batches))
        return real_metrics(model, batches, *args, **kwargs)

    monkeypatch.setattr(bertforge.pretrain, "pretraining_metrics", recording_metrics)
    figures = []  # loss.png's, drawn and kept instead of written
    monkeypatch.setattr("bertforge.plots.save_png", lambda draw, path, **_: figures.append(draw()))
    config = tiny_config(wiki_slice, wiki_valid_slice, max_steps=8, eval_every=2)
    config.data.warmup_seq_length, config.data.warmup_seq_fraction = 16, 0.5
    run = tmp_path / "run"
    pretrain(config, run, tokenizer_dir=small_tokenizer_dir, show_progress=False)
    short, valid = metrics_lines(run, "valid_short"), metrics_lines(run, "valid")
    assert [line["step"] for line in valid] == [0, 2, 4, 6, 8]
    assert [line["step"] for line in short] == [0, 2, 4]  # the steps trained on 16-token pairs
    assert all(line["seq_len"] == 16 and line["mlm_loss"] > 0 and "nsp_accuracy" in line for line in short)
    # full length, then the warmup's, at each evaluation within the warmup
    assert [width <= 16 for width in widths] == [False, True, False, True, False, True, False, False]
    assert metrics_lines(run, "warmup_end") == [{"step": 5, "split": "warmup_end", "seq_len": 64}]

    records = MetricsLog(run / "metrics.jsonl").read()
    end = warmup_end(records)
    assert (end.step, end.short, end.full) == (5, 16, 64)
    figure = pretraining_figure(records)
    assert figures[0].axes[0].get_title() == "MLM loss (train masks 15%, held-out 15%)"  # loss.png's
    lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
    assert list(lines["valid at the warmup's 16 tokens"].get_xdata()) == [0, 2, 4]
    assert list(lines["sequence length 16 to 64 from step 5"].get_xdata()) == [5, 5]  # a vertical line
    assert warmup_end([r for r in records if r["split"] != "warmup_end"]) is None


def test_warmup_nsp_trains_on_pairs_with_nsp_then_on_windows_alone(
    tmp_path, monkeypatch, wiki_slice, small_tokenizer_dir
):
    import bertforge.pretrain

    seen = []  # per step: (width, pairs labelled for NSP, segment-1 tokens)
    real_loss = bertforge.pretrain.masked_lm_and_nsp_loss

    def recording_loss(model, batch, vocab_size):
        labelled = int((batch["nsp_labels"] >= 0).sum())
        seen.append((batch["input_ids"].shape[1], labelled, int(batch["token_type_ids"].sum())))
        return real_loss(model, batch, vocab_size)

    monkeypatch.setattr(bertforge.pretrain, "masked_lm_and_nsp_loss", recording_loss)
    config = tiny_config(wiki_slice, max_steps=8, log_every=1)
    config.data.nsp, config.data.warmup_nsp = False, True
    config.data.warmup_seq_length, config.data.warmup_seq_fraction = 16, 0.5
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    batch_size = config.train.batch_size
    assert all(width <= 16 and labelled == batch_size and second > 0 for width, labelled, second in seen[:4])
    assert all(width > 16 and labelled == 0 and second == 0 for width, labelled, second in seen[4:])
    train_lines = metrics_lines(tmp_path / "run", "train")
    assert all("nsp_loss" in line for line in train_lines[:4])  # both heads while warming up
    assert not any("nsp_loss" in line for line in train_lines[4:])  # MLM alone after it
    assert not any("nsp_accuracy" in line for line in metrics_lines(tmp_path / "run", "valid"))


def test_warmup_nsp_needs_a_run_without_nsp_and_a_warmup():
    from bertforge.config import validate
    from bertforge.errors import BertforgeError

    config = tiny_config()
    config.data.warmup_nsp = True
    for nsp, warmup in ((True, 32), (False, 0)):
        config.data.nsp, config.data.warmup_seq_length = nsp, warmup
        with pytest.raises(BertforgeError, match="data.warmup_nsp"):
            validate(config)
    config.data.nsp, config.data.warmup_seq_length = False, 32
    validate(config)


def test_sequence_length_warmup_must_be_shorter_than_the_full_length():
    from bertforge.config import validate
    from bertforge.errors import BertforgeError

    config = tiny_config()
    for bad in (64, 128, 4):
        config.data.warmup_seq_length = bad
        with pytest.raises(BertforgeError, match="data.warmup_seq_length"):
            validate(config)
    config.data.warmup_seq_length = 32
    validate(config)
    for bad in (0.0, 1.0, 1.5):
        config.data.warmup_seq_fraction = bad
        with pytest.raises(BertforgeError, match=r"data.warmup_seq_fraction must be in \(0, 1\)"):
            validate(config)


def assert_resumes_exactly(tmp_path, full, checkpoint_steps: tuple[int, ...]) -> None:
    """Resuming `full` from each of its checkpoints but the last logs the same losses and ends with
    the same weights."""
    from bertforge.checkpoint import read_config

    logged = metrics_lines(full, "train")
    for resume_from in checkpoint_steps[:-1]:
        cut = tmp_path / f"cut{resume_from}"
        shutil.copytree(full, cut)
        for later in (step for step in checkpoint_steps if step > resume_from):
            shutil.rmtree(cut / "checkpoints" / f"step_{later:06d}")
        shutil.rmtree(cut / "final")
        pretrain(read_config(cut), cut, resume=True, show_progress=False)
        assert [x["loss"] for x in metrics_lines(cut, "train")] == [x["loss"] for x in logged]
        full_weights = read_weights(full / "final" / "model.safetensors")
        cut_weights = read_weights(cut / "final" / "model.safetensors")
        assert all(torch.equal(full_weights[k], cut_weights[k]) for k in full_weights)


def test_a_run_with_a_sequence_length_warmup_resumes_exactly(tmp_path, short_corpus, small_tokenizer_dir):
    from bertforge.cache import cached_shards, default_cache_dir
    from bertforge.io import read_json
    from bertforge.pretrain import epoch_batches
    from bertforge.tokenizer import load_tokenizer

    # Checkpoints at steps 5, 10 and 12; the warmup ends before step 10 (9 / 12 = 0.75 of the run).
    config = tiny_config(short_corpus, max_steps=12, eval_every=5, keep_checkpoints=3)
    config.data.warmup_seq_length, config.data.max_seq_length = 16, 32
    config.data.warmup_seq_fraction = 0.75
    full = tmp_path / "full"
    pretrain(config, full, tokenizer_dir=small_tokenizer_dir, show_progress=False)
    tokenizer = load_tokenizer(small_tokenizer_dir)
    shards = cached_shards(short_corpus, tokenizer, "auto", default_cache_dir(), False)
    # The warmup's first epoch ends before its last step, its second is cut short at step 9.
    assert 5 <= len(epoch_batches(shards, tokenizer, config, 16)(0)) < 9
    assert read_json(full / "checkpoints" / "step_000005" / "state.json")["warmup_end_epoch"] is None
    assert read_json(full / "checkpoints" / "step_000010" / "state.json")["warmup_end_epoch"] == 2
    assert_resumes_exactly(tmp_path, full, (5, 10, 12))  # within the warmup, and after it ended
    ends = metrics_lines(full, "warmup_end")
    assert [end["step"] for end in ends] == [10]  # the warmup ended after step 9
    for resumed in ("cut5", "cut10"):  # logged again after the switch, or kept from before the checkpoint
        assert metrics_lines(tmp_path / resumed, "warmup_end") == ends


def test_the_masking_rate_moves_epoch_by_epoch_to_its_final_value(
    tmp_path, monkeypatch, short_corpus, small_tokenizer_dir
):
    import bertforge.pretrain

    masked_shares = []
    real_loss = bertforge.pretrain.masked_lm_and_nsp_loss

    def recording_loss(model, batch, vocab_size):
        # The maskable tokens: ids above the five specials, and those that masking made [MASK] (id 4).
        maskable = batch["input_ids"] >= 4
        masked_shares.append(batch["masked_positions"].numel() / int(maskable.sum()))
        return real_loss(model, batch, vocab_size)

    monkeypatch.setattr(bertforge.pretrain, "masked_lm_and_nsp_loss", recording_loss)
    config = tiny_config(short_corpus, max_steps=30, eval_every=30)
    config.data.max_seq_length = 32
    config.data.mlm_probability, config.data.final_mlm_probability = 0.4, 0.1
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)

    rates = [line["mlm_probability"] for line in metrics_lines(tmp_path / "run", "train")]  # one per step
    assert rates[0] == 0.4 and 0.1 <= rates[-1] < 0.2
    assert rates == sorted(rates, reverse=True) and len(set(rates)) >= 4  # several epochs, each lower
    for step, (rate, before) in enumerate(zip(rates, [None, *rates[:-1]], strict=True), 1):
        if rate != before:  # an epoch started at this step: the rate of the progress before it
            assert rate == pytest.approx(0.4 - 0.3 * (step - 1) / 30, abs=1e-4)
    for share, rate in zip(masked_shares, rates, strict=True):
        assert share == pytest.approx(rate, abs=0.05)  # round(rate * n) of each pair's n tokens


def test_a_run_with_a_changing_masking_rate_resumes_exactly(tmp_path, short_corpus, small_tokenizer_dir):
    from bertforge.io import read_json

    config = tiny_config(short_corpus, max_steps=12, eval_every=5, keep_checkpoints=3)
    config.data.max_seq_length = 32
    config.data.mlm_probability, config.data.final_mlm_probability = 0.3, 0.15
    full = tmp_path / "full"
    pretrain(config, full, tokenizer_dir=small_tokenizer_dir, show_progress=False)
    state = read_json(full / "checkpoints" / "step_000010" / "state.json")
    assert state["masking_epoch"] >= 1 and 0.15 < state["masking_rate"] < 0.3
    assert_resumes_exactly(tmp_path, full, (5, 10, 12))


def test_the_final_masking_rate_must_be_a_rate():
    from bertforge.config import validate
    from bertforge.errors import BertforgeError

    config = tiny_config()
    for bad in (-0.1, 1.0, 1.5):
        config.data.final_mlm_probability = bad
        with pytest.raises(BertforgeError, match=r"data.final_mlm_probability must be 0 .* or in \(0, 1\)"):
            validate(config)
    config.data.final_mlm_probability = 0.15
    validate(config)


def test_a_warmup_that_leaves_the_full_length_little_of_the_learning_rate_is_warned_about():
    import warnings

    from bertforge.config import RunConfig
    from bertforge.pretrain import warn_short_full_length_phase

    train = TrainConfig(warmup_ratio=0.06, max_steps=1000)
    for fraction in (0.5, 0.8, 0.936):  # linear decay: the area after f is (1 - f)^2 / (1 - warmup)
        assert Schedule(train).share_after(fraction) == pytest.approx((1 - fraction) ** 2 / 0.94, abs=1e-4)
    config = RunConfig(train=train)
    config.data.warmup_seq_length, config.data.max_seq_length = 32, 128
    config.data.warmup_seq_fraction = 0.936
    with pytest.warns(UserWarning, match=r"leaves the 128-token phase 0\.4% of the run's learning-rate area"):
        warn_short_full_length_phase(config)
    for fraction, length in ((0.8, 32), (0.936, 0)):  # the demo's share; no warmup at all
        config.data.warmup_seq_fraction, config.data.warmup_seq_length = fraction, length
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warn_short_full_length_phase(config)


def test_a_corpus_of_one_sentence_documents_is_warned_about(tmp_path, wiki_slice, small_tokenizer_dir):
    import warnings

    from bertforge.cache import cached_shards
    from bertforge.pretrain import check_training_data
    from bertforge.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(small_tokenizer_dir)
    config = tiny_config(wiki_slice)
    text = wiki_slice.read_text(encoding="utf-8")
    parts = [
        part
        for part in text.split(" . ")
        if len(part.split()) > 5 and not {"...", "!", "?"} & set(part.split())
    ]
    sentences = [" ".join(part.split()) + " ." for part in parts][:600]  # one sentence, one line each
    one_line_documents = tmp_path / "blank-after-each.txt"  # `sed G`: a blank line after every sentence
    one_line_documents.write_text("\n\n".join(sentences) + "\n", encoding="utf-8")
    shards = cached_shards(one_line_documents, tokenizer, "text", tmp_path / "cache", False)
    with pytest.warns(UserWarning, match=r"^0% of the sequences are next-sentence pairs: .* MLM alone"):
        check_training_data(shards, config)
    beside_articles = tmp_path / "articles-then-rows.txt"  # the rows train MLM alone, the articles NSP
    articles = ["\n".join(sentences[i : i + 10]) for i in range(0, 400, 10)]  # a sentence a line
    beside_articles.write_text("\n\n".join(articles + sentences[400:]) + "\n", encoding="utf-8")
    mixed = cached_shards(beside_articles, tokenizer, "text", tmp_path / "cache", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_training_data(mixed, config)
    config.data.nsp, config.data.max_seq_length = False, 128  # MLM alone across documents: whole windows
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_training_data(shards, config)
    config.data.cross_documents = False  # one sentence a window
    with pytest.warns(UserWarning, match=r"on average of the 128 .* set data.cross_documents = true"):
        check_training_data(shards, config)
    config.data.cross_documents = True
    config.data.max_seq_length = 64
    few = tmp_path / "few.txt"  # a handful of pairs: chance, not the corpus, decides the shares
    few.write_text("\n\n".join(sentences[:20]) + "\n", encoding="utf-8")
    config.data.nsp = True
    config.train.batch_size = 64  # more than the handful of pairs: refused with both counts
    with pytest.raises(
        BertforgeError, match=r"gives \d+ sequences of up to 64 tokens, fewer than one batch of 64"
    ):
        check_training_data(cached_shards(few, tokenizer, "text", tmp_path / "cache", False), config)
    config.train.batch_size = 8
    # WikiText's documents: about half random, full windows (its sentences here keep a heading or two,
    # which would make "auto" read them as WikiText)
    for corpus, form in ((few, "text"), (wiki_slice, "auto")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_training_data(cached_shards(corpus, tokenizer, form, tmp_path / "cache", False), config)


def test_mask_subsampling_masks_frequent_tokens_less_and_leaves_evaluation_alone(
    wiki_slice, small_tokenizer_dir
):
    from bertforge.cache import cached_shards, default_cache_dir
    from bertforge.evaluate import evaluation_batches
    from bertforge.pretrain import epoch_batches
    from bertforge.shards import token_counts
    from bertforge.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(small_tokenizer_dir)
    shards = cached_shards(wiki_slice, tokenizer, "auto", default_cache_dir(), False)
    counts = token_counts(shards, exclude=tokenizer.special_ids)
    frequent = torch.from_numpy(counts / counts.sum() > 1e-2)  # "the", ",", "." and the like

    def frequent_share(config) -> tuple[float, int]:
        labels = torch.cat(
            [batch["masked_labels"] for batch in epoch_batches(shards, tokenizer, config, 64)(0)]
        )
        return frequent[labels].double().mean().item(), labels.numel()

    config = tiny_config(wiki_slice)
    uniform, uniform_count = frequent_share(config)
    config.data.mask_subsampling = 1e-3
    weighted, weighted_count = frequent_share(config)
    assert weighted_count == uniform_count  # the same number of targets
    assert uniform > 0.2 and weighted < 0.5 * uniform
    # Evaluation keeps BERT's uniform 15%: its batches do not depend on the setting.
    config.data.valid = str(wiki_slice)
    subsampled = evaluation_batches(shards, tokenizer, config.data, config.model.objective)
    config.data.mask_subsampling = 0.0
    plain = evaluation_batches(shards, tokenizer, config.data, config.model.objective)
    assert all(
        torch.equal(a["masked_labels"], b["masked_labels"]) for a, b in zip(plain, subsampled, strict=True)
    )


class FakeClock:
    """Stands for the `time` module the training loop reads (`time.perf_counter`): the seconds
    only move when a test moves them."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


def test_a_resumed_time_budgets_bar_starts_where_the_run_stopped(
    tmp_path, monkeypatch, wiki_slice, small_tokenizer_dir
):
    """A 20-second budget on a fake clock (1 s a step), checkpointed at step 5 and resumed: the bar
    starts at 5 of the 20 s, so that its ETA counts only this process's seconds and work."""
    import bertforge.pretrain
    import bertforge.train
    from bertforge.checkpoint import read_config

    clock, bars = FakeClock(), []
    real_loss, real_bar = bertforge.pretrain.masked_lm_and_nsp_loss, bertforge.train.progress_bar

    def timed_loss(model, batch, vocab_size):
        clock.now += 1.0
        return real_loss(model, batch, vocab_size)

    def recorded_bar(**kwargs):
        bars.append((kwargs.get("initial", 0), kwargs["total"]))
        return real_bar(**kwargs)

    monkeypatch.setattr(bertforge.train, "time", clock)
    monkeypatch.setattr(bertforge.train, "progress_bar", recorded_bar)
    monkeypatch.setattr(bertforge.pretrain, "masked_lm_and_nsp_loss", timed_loss)
    config = tiny_config(
        wiki_slice, max_steps=1_000_000, eval_every=1_000_000, max_minutes=1 / 3, keep_checkpoints=10
    )
    config.train.checkpoint_every = 5
    full = tmp_path / "full"
    assert pretrain(config, full, tokenizer_dir=small_tokenizer_dir, show_progress=False)["step"] == 20
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    for later in list_checkpoints(cut)[1:]:
        shutil.rmtree(later)
    shutil.rmtree(cut / "final")
    pretrain(read_config(cut), cut, resume=True, show_progress=False)
    assert bars == [(0, 20), (5, 20)]


def test_time_budget_schedules_follow_the_clock_not_the_steps(
    tmp_path, monkeypatch, wiki_slice, small_tokenizer_dir
):
    """With a 30-second budget on a fake clock where a step of 16-token pairs takes 1 s and one of
    64-token pairs 1.5 s: the sequence-length warmup (half the budget) ends at 15 s, after 15 steps,
    the LR warms up over the first quarter of the time and then decays with it, and the run ends
    with the step that reaches 30 s (step 25), neither sooner nor later."""
    import bertforge.pretrain
    import bertforge.train

    clock, widths = FakeClock(), []
    real_loss = bertforge.pretrain.masked_lm_and_nsp_loss

    def timed_loss(model, batch, vocab_size):
        width = batch["input_ids"].shape[1]
        widths.append(width)
        clock.now += 1.0 if width <= 16 else 1.5  # one micro-batch a step
        return real_loss(model, batch, vocab_size)

    monkeypatch.setattr(bertforge.train, "time", clock)
    monkeypatch.setattr(bertforge.pretrain, "masked_lm_and_nsp_loss", timed_loss)
    config = tiny_config(wiki_slice, max_steps=1_000_000, eval_every=1_000_000, max_minutes=0.5)
    config.train.warmup_ratio = 0.25
    config.data.warmup_seq_length, config.data.warmup_seq_fraction = 16, 0.5
    run = tmp_path / "run"
    result = pretrain(config, run, tokenizer_dir=small_tokenizer_dir, show_progress=False)

    assert result["step"] == 25 and result["elapsed_s"] == 30.0
    assert max(widths[:15]) <= 16 and min(widths[15:]) > 16
    assert metrics_lines(run, "warmup_end") == [{"step": 16, "split": "warmup_end", "seq_len": 64}]
    schedule, peak = Schedule(config.train), config.train.learning_rate
    for line in metrics_lines(run, "train"):
        step = line["step"]
        before = step - 1.0 if step <= 16 else 15.0 + 1.5 * (step - 16)  # seconds when the step began
        progress = max(before / 30.0, (step - 1) / 1_000_000)  # at the step's start
        expected = peak * (progress / 0.25 if progress < 0.25 else (1 - progress) / 0.75)
        assert line["lr"] == pytest.approx(expected, rel=1e-9, abs=1e-12), step
        assert line["lr"] == pytest.approx(schedule.learning_rate(progress), rel=1e-9, abs=1e-12)
    lrs = [line["lr"] for line in metrics_lines(run, "train")]
    # The highest at step 9, the first to start after 7.5 s (a quarter of 30 s), not at 1e6 / 4 steps.
    assert lrs.index(max(lrs)) == 8
    assert lrs[:9] == sorted(lrs[:9]) and lrs[8:] == sorted(lrs[8:], reverse=True)
    assert len(lrs) == 25 and lrs[-1] == pytest.approx(peak * (1 - 28.5 / 30) / 0.75)


@pytest.mark.parametrize("warmup", [0.0, 0.25])
def test_each_step_takes_the_rate_at_its_start_as_google_and_hugging_face(
    tmp_path, wiki_slice, small_tokenizer_dir, warmup
):
    config = tiny_config(wiki_slice, max_steps=8, eval_every=8, warmup_ratio=warmup)
    pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    peak, warmup_steps = config.train.learning_rate, round(warmup * 8)
    # transformers' get_linear_schedule_with_warmup, step s of 0..7 (Google's optimization.py too)
    expected = [
        peak * s / warmup_steps if s < warmup_steps else peak * (8 - s) / (8 - warmup_steps) for s in range(8)
    ]
    lrs = [line["lr"] for line in metrics_lines(tmp_path / "run", "train")]
    assert lrs == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert min(lrs[1:]) > 0  # every step after the first updates the weights, the last one too


def test_a_time_budget_that_runs_out_between_two_steps_still_ends_with_its_last_steps_records(
    tmp_path, monkeypatch, wiki_slice, wiki_valid_slice, small_tokenizer_dir
):
    """On a fake clock a step takes 1 s and the bar's update 0.5 s, so the 15-second budget runs out
    after the 10th step's records were decided (at 14.5 s) and before the 11th begins: the run takes
    one more step and ends with it logged, evaluated and checkpointed, as every run ends."""
    import bertforge.pretrain
    import bertforge.train

    clock = FakeClock()
    real_loss, real_advance = bertforge.pretrain.masked_lm_and_nsp_loss, bertforge.train.Trainer.advance

    def timed_loss(model, batch, vocab_size):
        clock.now += 1.0
        return real_loss(model, batch, vocab_size)

    def slow_advance(self, bar, elapsed_s):
        real_advance(self, bar, elapsed_s)
        clock.now += 0.5

    monkeypatch.setattr(bertforge.train, "time", clock)
    monkeypatch.setattr(bertforge.pretrain, "masked_lm_and_nsp_loss", timed_loss)
    monkeypatch.setattr(bertforge.train.Trainer, "advance", slow_advance)
    config = tiny_config(wiki_slice, max_steps=1_000_000, eval_every=1_000_000, max_minutes=0.25)
    config.data.valid = str(wiki_valid_slice)
    config.train.checkpoint_every = 1_000_000
    run = tmp_path / "run"
    result = pretrain(config, run, tokenizer_dir=small_tokenizer_dir, show_progress=False)

    assert result["step"] == 11
    assert metrics_lines(run, "train")[-1]["step"] == 11
    assert [line["step"] for line in metrics_lines(run, "valid")] == [0, 11]
    assert [path.name for path in list_checkpoints(run)] == ["step_000011"]


def test_a_run_without_validation_text_logs_no_empty_valid_lines(tiny_pretrained_run):
    assert metrics_lines(tiny_pretrained_run, "train") and metrics_lines(tiny_pretrained_run, "valid") == []


def test_the_advice_for_short_sequences_follows_the_settings():
    from bertforge.config import DataConfig
    from bertforge.pretrain import short_sequences_fix

    assert short_sequences_fix(DataConfig()).endswith(
        "data.nsp = false (MLM alone, on windows that run across documents)"
    )
    assert short_sequences_fix(DataConfig(cross_documents=False)) == "join documents, set data.nsp = false"
    assert (
        short_sequences_fix(DataConfig(nsp=False, warmup_nsp=True))
        == "join documents, or drop data.warmup_nsp"
    )
    assert (
        short_sequences_fix(DataConfig(nsp=False, cross_documents=False)) == "set data.cross_documents = true"
    )
