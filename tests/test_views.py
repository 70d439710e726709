"""Views of what a model learned: attention maps (`attention_view`, `bertforge attention`), several
runs' held-out curves (`plots.plot_runs`, `bertforge plot`) and `--report-to tensorboard`
(`reporting`).

Attention weights are recomputed, so they are checked against what the models really do: Hugging
Face's `output_attentions` on the same weights (BERT and OpenAIGPT, built from tiny configs) and
the sublayer's own output, which must equal the weights times its values.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch
from conftest import HF_TINY_SIZES, WIKI_VALID, assert_clean_failure, metrics_lines, tiny_config

from bertforge import reporting
from bertforge.attention_view import attention_maps, attention_weights
from bertforge.checkpoint import save_model_folder
from bertforge.cli import main
from bertforge.config import ModelConfig
from bertforge.config_rules import GPT_HIDDEN_ACT
from bertforge.errors import BertforgeError
from bertforge.gpt import GPTForSequenceClassification, GPTLMHeadModel
from bertforge.metrics_log import MetricsLog
from bertforge.model import BertForPreTraining, BertSelfAttention
from bertforge.plots import (
    FINETUNING_CURVES,
    attention_figure,
    finetuning_figure,
    plot_runs,
    run_curves,
    runs_figure,
)
from bertforge.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")

TOL = 1e-5
GPT_SIZES = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    hidden_act=GPT_HIDDEN_ACT,
    max_position_embeddings=64,
    layer_norm_eps=1e-5,
    initializer_range=0.2,  # attention far from uniform, so a wrong mask or scale shows
    objective="clm",
)


def bert(seed: int = 0, **changes) -> BertForPreTraining:
    torch.manual_seed(seed)
    return BertForPreTraining(ModelConfig(**{**HF_TINY_SIZES, "initializer_range": 0.2, **changes})).eval()


def gpt(seed: int = 0, **changes) -> GPTLMHeadModel:
    torch.manual_seed(seed)
    return GPTLMHeadModel(ModelConfig(**{**GPT_SIZES, **changes})).eval()


def padded_batch():
    """Two rows of 9 and 5 real tokens (padding 0 on the right), segment ids 0 then 1."""
    ids = torch.randint(5, 99, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = (torch.arange(9) < torch.tensor([[9], [5]])).long()
    token_types = (torch.arange(9) >= 4).long().expand(2, 9) * mask
    return ids * mask, token_types, mask


# ------------------------------------------------------------------------ recomputed attention


@torch.no_grad()
def test_bert_attention_equals_hugging_face_output_attentions_with_padding():
    ours = bert()
    config = transformers.BertConfig(**HF_TINY_SIZES, attn_implementation="eager")
    hf = transformers.BertForPreTraining(config).eval()
    hf.load_state_dict(ours.state_dict())
    ids, token_types, mask = padded_batch()
    weights = attention_weights(ours, ids, token_type_ids=token_types, attention_mask=mask)
    theirs = hf(input_ids=ids, token_type_ids=token_types, attention_mask=mask, output_attentions=True)
    assert weights.shape == (2, 2, 4, 9, 9)  # (batch, layers, heads, queries, keys)
    torch.testing.assert_close(weights, torch.stack(theirs.attentions, dim=1), rtol=0, atol=TOL)
    assert weights[1, ..., 5:].abs().max() == 0  # no query attends to a padding key
    assert weights.amax(-1).max() > 0.5  # far from uniform: the comparison means something


@torch.no_grad()
def test_gpt_attention_equals_openai_gpt_output_attentions():
    from bertforge.gpt_convert import hf_config, to_hf_state_dict

    ours = gpt()
    raw = {k: v for k, v in hf_config(ours.config).items() if k not in ("architectures", "model_type")}
    hf = transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(**raw)).eval()
    hf.load_state_dict(to_hf_state_dict(ours.state_dict()))
    ids = torch.randint(0, 99, (2, 12), generator=torch.Generator().manual_seed(4))
    weights = attention_weights(ours, ids)
    theirs = hf(input_ids=ids, output_attentions=True).attentions
    assert weights.shape == (2, 2, 4, 12, 12)
    torch.testing.assert_close(weights, torch.stack(theirs, dim=1), rtol=0, atol=TOL)
    assert weights.triu(diagonal=1).abs().max() == 0  # causal: nothing from a later token


@pytest.mark.parametrize("kind", ["bert", "gpt"])
@torch.no_grad()
def test_weights_times_values_give_what_each_sublayer_outputs(kind):
    """The recomputed weights are the ones the model used, padding mask included."""
    model = bert() if kind == "bert" else gpt()
    ids, token_types, mask = padded_batch()
    inputs = {"attention_mask": mask} | ({"token_type_ids": token_types} if kind == "bert" else {})
    seen = []  # (sublayer, input, output) of each attention sublayer, in order
    sublayers = [m for m in model.modules() if isinstance(m, BertSelfAttention)]
    hooks = [s.register_forward_hook(lambda m, args, out: seen.append((m, args[0], out))) for s in sublayers]
    weights = attention_weights(model, ids, **inputs)  # one forward pass, seen by both kinds of hook
    for hook in hooks:
        hook.remove()
    assert len(seen) == model.config.num_hidden_layers
    for layer, (module, x, out) in enumerate(seen):
        B, T, H = x.shape
        v = module.value(x).view(B, T, module.num_heads, module.head_dim).transpose(1, 2)
        expected = (weights[:, layer] @ v).transpose(1, 2).reshape(B, T, H)
        torch.testing.assert_close(out, expected, rtol=0, atol=TOL)


@torch.no_grad()
def test_a_gpt_classifier_maps_are_the_causal_maps_of_its_decoder():
    """Its last block computes the read-out token's row alone; the map still has every causal row."""
    lm = gpt()
    classifier = GPTForSequenceClassification(lm.config, num_labels=2).eval()
    classifier.gpt.load_state_dict(lm.gpt.state_dict())
    ids, _, mask = padded_batch()
    weights = attention_weights(classifier, ids, attention_mask=mask)
    torch.testing.assert_close(weights, attention_weights(lm, ids, attention_mask=mask), rtol=0, atol=TOL)
    assert weights.triu(diagonal=1).abs().max() == 0


def test_the_model_runs_in_eval_mode_and_keeps_its_mode():
    model = bert(attention_probs_dropout_prob=0.5, hidden_dropout_prob=0.5).train()
    ids = torch.randint(5, 99, (1, 8))
    first, second = attention_weights(model, ids), attention_weights(model, ids)
    assert torch.equal(first, second)  # no dropout
    assert model.training


# ---------------------------------------------------------------------------- maps of a text


@pytest.fixture(scope="module")
def tokenizer(small_tokenizer_dir):
    return load_tokenizer(small_tokenizer_dir)


def test_bert_maps_of_a_text_and_of_a_pair(tokenizer):
    model = bert(vocab_size=tokenizer.vocab_size)
    maps = attention_maps(model, tokenizer, "The game was released in Japan .")
    assert maps.tokens[0] == "[CLS]" and maps.tokens[-1] == "[SEP]" and not maps.causal
    T = len(maps.tokens)
    assert maps.weights.shape == (2, 4, T, T)
    torch.testing.assert_close(maps.weights.sum(-1), torch.ones(2, 4, T), rtol=1e-5, atol=1e-5)
    assert maps.weights.triu(diagonal=1).abs().max() > 0.01  # bidirectional
    pair = attention_maps(model, tokenizer, "The game was released .", pair="It sold well .")
    assert pair.tokens.count("[SEP]") == 2
    ids, token_types = tokenizer.encode_pair("The game was released .", "It sold well .")
    direct = attention_weights(model, torch.tensor([ids]), token_type_ids=torch.tensor([token_types]))[0]
    assert torch.equal(pair.weights, direct)  # segment ids reach the model


def test_gpt_maps_are_causal_and_read_the_text_as_a_prompt(tokenizer):
    model = gpt(vocab_size=tokenizer.vocab_size)
    maps = attention_maps(model, tokenizer, "The game was released in Japan .")
    assert maps.causal and "[CLS]" not in maps.tokens and "[SEP]" not in maps.tokens
    T = len(maps.tokens)
    torch.testing.assert_close(maps.weights.sum(-1), torch.ones(2, 4, T), rtol=1e-5, atol=1e-5)
    assert maps.weights.triu(diagonal=1).abs().max() == 0
    assert torch.all(maps.weights[:, :, 0, 0] == 1)  # the first token can only attend to itself


def test_a_gpt_classifier_is_shown_the_text_as_it_reads_it(tokenizer):
    """Fine-tuned on `[CLS] text [SEP]` (and pairs), as GPT-1's start and extract tokens."""
    model = GPTForSequenceClassification(gpt(vocab_size=tokenizer.vocab_size).config, num_labels=2).eval()
    maps = attention_maps(model, tokenizer, "The game was released in Japan .", "It sold well .")
    assert maps.causal and maps.tokens[0] == "[CLS]" and maps.tokens.count("[SEP]") == 2
    assert maps.weights.triu(diagonal=1).abs().max() == 0


def test_impossible_texts_are_refused(tokenizer):
    with pytest.raises(BertforgeError, match="not a pair"):
        attention_maps(gpt(vocab_size=tokenizer.vocab_size), tokenizer, "a text", pair="another")
    with pytest.raises(BertforgeError, match="empty"):
        attention_maps(bert(vocab_size=tokenizer.vocab_size), tokenizer, "   ")
    with pytest.raises(BertforgeError, match="the text is empty"):
        attention_maps(bert(vocab_size=tokenizer.vocab_size), tokenizer, "\u200b")  # no tokens
    with pytest.raises(
        BertforgeError,
        match="the text with .CLS. and .SEP. is 8. tokens long, more than the model's maximum of 64",
    ):
        attention_maps(bert(vocab_size=tokenizer.vocab_size), tokenizer, "the game " * 40)
    with pytest.raises(BertforgeError, match="the pair with .CLS. and two .SEP. is 67 tokens long"):
        attention_maps(bert(vocab_size=tokenizer.vocab_size), tokenizer, "the game " * 16, "the game " * 16)


def test_attention_figure_has_one_panel_per_layer_and_head_with_the_model_values(tokenizer):
    maps = attention_maps(bert(vocab_size=tokenizer.vocab_size), tokenizer, "The game was released .")
    weights = maps.weights.numpy()
    fig = attention_figure(maps.tokens, weights, layers=[0, 1], heads=[1, 3])
    assert len(fig.axes) == 4
    for ax, (layer, head) in zip(fig.axes, [(0, 1), (0, 3), (1, 1), (1, 3)], strict=True):
        # each panel's colours run to its own largest weight, which its title gives
        assert ax.get_title() == f"layer {layer + 1}, head {head + 1}, max {weights[layer, head].max():.2f}"
        assert ax.images[0].get_clim() == (0.0, float(weights[layer, head].max()))
        assert np.array_equal(ax.images[0].get_array(), weights[layer, head])
        assert [t.get_text() for t in ax.get_xticklabels()] == maps.tokens
        assert [t.get_text() for t in ax.get_yticklabels()] == maps.tokens


# ------------------------------------------------------------------------- `bertforge attention`


def png_size(path: Path) -> tuple[int, int]:
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[2] in (3, 4)
    return image.shape[:2]


@pytest.mark.rendered
def test_attention_command_draws_every_layer_and_head(tmp_path, capsys, tiny_pretrained_run):
    text = "The game was released in Japan ."
    out = tmp_path / "attn.png"
    assert main(["attention", "--model", str(tiny_pretrained_run), text, "--out", str(out)]) == 0
    assert "2 x 2 panels (layers x heads)" in capsys.readouterr().out
    height, width = png_size(out)
    assert abs(width - height) < 0.3 * width  # 2 x 2 square panels
    one = tmp_path / "one.png"
    argv = ["attention", "--model", str(tiny_pretrained_run), text, "--layers", "2", "--heads", "1"]
    assert main([*argv, "--out", str(one)]) == 0
    assert png_size(one)[1] < 0.6 * width  # one panel instead of two side by side
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["layers"] == [2] and shown["heads"] == [1] and not shown["causal"]
    from bertforge.folders import open_pretrained

    model, tokenizer, _ = open_pretrained(tiny_pretrained_run)
    maps = attention_maps(model, tokenizer, text)
    assert shown["tokens"] == maps.tokens
    np.testing.assert_allclose(shown["weights"], maps.weights[1:2, 0:1].numpy(), rtol=1e-5, atol=1e-6)
    assert all(value == round(value, 6) for value in np.ravel(shown["weights"]).tolist())  # no float32 noise
    assert not list(tmp_path.glob(".*tmp-*"))  # written atomically: no leftovers


def test_attention_command_on_a_gpt_model_folder(tmp_path, capsys, tokenizer, small_tokenizer_dir):
    config = tiny_config()
    config.model = ModelConfig(**{**GPT_SIZES, "vocab_size": tokenizer.vocab_size})
    config.tokenizer.vocab_size = tokenizer.vocab_size
    folder = tmp_path / "gpt"
    save_model_folder(folder, gpt(vocab_size=tokenizer.vocab_size), tokenizer, config)
    assert main(["attention", "--model", str(folder), "one two three four", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    weights, T = np.array(shown["weights"]), len(shown["tokens"])
    assert shown["causal"] and weights.shape == (2, 4, T, T) and T >= 4
    assert np.all(np.triu(weights, k=1) == 0)


def test_attention_command_draws_a_fine_tuned_classifier_and_tagger(tmp_path, capsys, tiny_pretrained_run):
    from bertforge.checkpoint import LABELS
    from bertforge.classifier import label_file, sequence_classifier
    from bertforge.folders import open_pretrained
    from bertforge.tagger import TOKEN_TASK, token_classifier

    _, tokenizer, config = open_pretrained(tiny_pretrained_run)
    text = "The game was released in Japan ."
    for build, task in ((sequence_classifier, None), (token_classifier, TOKEN_TASK)):
        torch.manual_seed(0)
        model = build(config.model, 2).eval()
        folder = tmp_path / (task or "classifier") / "final"
        save_model_folder(folder, model, tokenizer, config, notes={LABELS: label_file(["a", "b"], task)})
        assert main(["attention", "--model", str(folder.parent), text, "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        np.testing.assert_allclose(
            shown["weights"], attention_maps(model, tokenizer, text).weights.numpy(), atol=1e-6
        )


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--out", "attn.txt"], "must end in .png"),
        ([], "give --out FILE.png, --json, or both"),
        (["--json", "--layers", "3"], "the model has 2 layers"),
        (["--json", "--pair", "b"], "give the second text once"),
    ],
)
def test_attention_command_refuses_impossible_requests(capsys, tiny_pretrained_run, extra, message):
    argv = ["attention", "--model", str(tiny_pretrained_run), "a", *(["b"] if "--pair" in extra else [])]
    assert_clean_failure(capsys, [*argv, *extra], message)


def test_an_empty_second_text_is_refused_not_dropped(capsys, tiny_pretrained_run):
    for second in (["  "], ["--pair", ""]):
        argv = ["attention", "--model", str(tiny_pretrained_run), "a b", *second, "--json"]
        assert_clean_failure(capsys, argv, "the second text is empty")


def test_layer_numbers_count_from_one(capsys, tiny_pretrained_run):
    with pytest.raises(SystemExit):
        main(["attention", "--model", str(tiny_pretrained_run), "a", "--json", "--layers", "0"])
    assert "count from 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["attention", "--model", str(tiny_pretrained_run), "a", "--json", "--layers", "2-1"])
    assert "'2-1': the range 2-1 runs backwards; write 1-2" in capsys.readouterr().err


# ---------------------------------------------------------------------------- `bertforge plot`


def write_run(
    folder: Path, loss_key: str, accuracy_key: str, tokens: bool = True, rate: float = 100.0
) -> Path:
    """A run folder with metrics.jsonl: train lines every 5 steps (100 tokens a step at `rate`
    tokens/s), valid lines at 0, 10 and 20."""
    folder.mkdir(parents=True)
    log = MetricsLog(folder / "metrics.jsonl")
    for step in range(0, 21, 5):
        if step:
            log.append({"step": step, "split": "train", "loss": 1.0, "tokens_per_s": rate})
        if step % 10 == 0:
            counted = {"tokens": 100 * step} if tokens and step else {}
            log.append(
                {"step": step, "split": "valid", **counted, loss_key: 9 - step / 10, accuracy_key: step / 100}
            )
    config = tiny_config()
    config.train.batch_size, config.data.max_seq_length = 4, 32  # 128 tokens a step, when estimated
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    return folder


def test_run_curves_place_evaluations_by_tokens_and_minutes(tmp_path):
    curves = run_curves(write_run(tmp_path / "bert", "mlm_loss", "mlm_accuracy"), "bert")
    assert curves.objective == "MLM" and not curves.estimated
    assert curves.tokens.tolist() == [0, 1000, 2000]
    np.testing.assert_allclose(
        curves.minutes, [0, 10 / 60, 20 / 60], rtol=1e-5, atol=1e-8
    )  # 1,000 tokens at 100 tokens/s: 10 s
    assert curves.loss.tolist() == [9, 8, 7] and curves.accuracy.tolist() == [0, 0.1, 0.2]
    gpt_run = run_curves(write_run(tmp_path / "gpt", "clm_loss", "clm_accuracy", rate=50.0), "gpt")
    assert gpt_run.objective == "next-token"
    np.testing.assert_allclose(gpt_run.minutes, [0, 20 / 60, 40 / 60], rtol=1e-5, atol=1e-8)
    old = run_curves(write_run(tmp_path / "old", "mlm_loss", "mlm_accuracy", tokens=False), "old")
    assert old.estimated and old.tokens.tolist() == [0, 1280, 2560]  # step x 4 x 32
    np.testing.assert_allclose(old.minutes, [0, 12.8 / 60, 25.6 / 60], rtol=1e-5, atol=1e-8)


def test_comparison_figure_has_one_line_per_run_in_each_panel(tmp_path):
    runs = [
        write_run(tmp_path / "bert", "mlm_loss", "mlm_accuracy"),
        write_run(tmp_path / "gpt", "clm_loss", "clm_accuracy"),
    ]
    curves = [run_curves(run, run.name) for run in runs]
    fig = runs_figure(curves)
    assert len(fig.axes) == 4
    loss_tokens, loss_minutes, accuracy_tokens, accuracy_minutes = fig.axes
    assert [line.get_label() for line in loss_tokens.lines] == ["bert (MLM)", "gpt (next-token)"]
    for ax, x, y in (
        (loss_tokens, "tokens", "loss"),
        (loss_minutes, "minutes", "loss"),
        (accuracy_tokens, "tokens", "accuracy"),
        (accuracy_minutes, "minutes", "accuracy"),
    ):
        for line, run in zip(ax.lines, curves, strict=True):
            np.testing.assert_allclose(line.get_xdata(), getattr(run, x), rtol=1e-5, atol=1e-8)
            np.testing.assert_allclose(line.get_ydata(), getattr(run, y), rtol=1e-5, atol=1e-8)
    assert "minutes" in loss_minutes.get_xlabel() and "tokens" in loss_tokens.get_xlabel()


@pytest.mark.parametrize("kind", ["classification", "regression", "ner"])
def test_finetuning_figure_draws_the_task_kinds_loss_and_metrics_per_epoch(kind):
    loss_key, _, metrics = FINETUNING_CURVES[kind]
    records = []
    for step in (0, 5, 10):  # 5 steps an epoch: a "valid" line per epoch, "train" lines between
        records.append(
            {
                "split": "valid",
                "step": step,
                loss_key: 1.0 / (step + 1),
                **{key: 0.1 + step / 20 for _, key, _ in metrics},
            }
        )
        if step:
            records.append(
                {
                    "split": "train",
                    "step": step - 2,
                    loss_key: 2.0 / step,
                    **{key: step / 30 for _, key, _ in metrics},
                }
            )
    fig = finetuning_figure(records, steps_per_epoch=5, kind=kind)
    loss, scores = fig.axes
    train, valid = loss.lines
    np.testing.assert_allclose(valid.get_xdata(), [0, 1, 2])
    np.testing.assert_allclose(valid.get_ydata(), [1.0, 1 / 6, 1 / 11])
    np.testing.assert_allclose(train.get_xdata(), [0.6, 1.6])
    assert [line.get_label() for line in scores.lines] == [label for _, _, label in metrics]
    for line, (split, _, _) in zip(scores.lines, metrics, strict=True):
        expected = [0.1, 0.35, 0.6] if split == "valid" else [5 / 30, 10 / 30]
        np.testing.assert_allclose(line.get_ydata(), expected)
    assert scores.get_ylim()[0] == (-1 if kind == "regression" else 0)


@pytest.fixture(scope="module")
def validated_run(tmp_path_factory, wiki_slice, wiki_valid_slice, small_tokenizer_dir) -> Path:
    """A tiny pretraining run with held-out metrics at steps 0, 2 and 4."""
    from bertforge.pretrain import pretrain

    run = tmp_path_factory.mktemp("validated") / "run"
    config = tiny_config(wiki_slice, wiki_valid_slice, max_steps=4, eval_every=2)
    pretrain(config, run, tokenizer_dir=small_tokenizer_dir, show_progress=False)
    return run


def test_the_mlm_panel_says_how_much_training_and_evaluation_mask():
    from bertforge.evaluate import EVAL_MASK_RATE
    from bertforge.plots import pretraining_figure

    def title(rates, masking=None):
        logged = [{"mlm_probability": r} for r in rates] or [{}, {}]  # a fixed rate is not logged
        train = [{"step": n, "split": "train", "mlm_loss": 7.0, **r} for n, r in enumerate(logged, 1)]
        valid = {"step": len(train), "split": "valid", "mlm_loss": 5.0, "mlm_accuracy": 0.1}
        return pretraining_figure([*train, valid], masking).axes[0].get_title()

    assert title([], (0.3, EVAL_MASK_RATE)) == "MLM loss (train masks 30%, held-out 15%)"
    assert title([0.3, 0.2, 0.15], (0.3, EVAL_MASK_RATE)) == "MLM loss (train masks 30% to 15%, held-out 15%)"
    assert title([]) == "MLM loss"


def test_a_gpts_figure_has_no_nsp_panel_and_a_curve_of_one_point_is_drawn():
    from bertforge.plots import pretraining_figure

    gpt = [
        {"step": 10, "split": "train", "clm_loss": 7.0},
        {"step": 10, "split": "valid", "clm_accuracy": 0.1},
    ]
    fig = pretraining_figure(gpt)
    assert [ax.get_title() for ax in fig.axes] == ["next-token loss", "validation accuracy"]
    (train,) = fig.axes[0].lines  # one logged point: a dot, which a line of one point would not draw
    assert train.get_marker() == "o" and list(train.get_ydata()) == [7.0]
    bert = [{"step": 10, "split": "train", "mlm_loss": 7.0, "nsp_loss": 0.7}]
    assert [ax.get_title() for ax in pretraining_figure(bert).axes][1] == "NSP loss"


def test_a_causal_maps_colours_leave_out_the_first_row(tokenizer):
    """Its first token attends only to itself (weight 1), which would set every panel's scale."""
    T = 4
    panel = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]  # uniform over the past
    fig = attention_figure(list("abcd"), panel[None, None], layers=[0], heads=[0])
    assert fig.axes[0].images[0].get_clim() == (0.0, 0.5) and fig.axes[0].get_title().endswith("max 0.50")


@pytest.mark.rendered
def test_plot_command_writes_the_figure(tmp_path, capsys, validated_run):
    other = write_run(tmp_path / "other", "mlm_loss", "mlm_accuracy")
    out = tmp_path / "cmp.png"
    assert main(["plot", str(validated_run), str(other), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "run: MLM loss" in printed and "other: MLM loss" in printed
    assert " min of training (evaluation left out)" in printed
    height, width = png_size(out)
    assert width > height > 500
    # A real run logs the tokens it trained on at each evaluation, as its checkpoint counts them.
    state = json.loads((validated_run / "checkpoints" / "step_000004" / "state.json").read_text())
    curves = run_curves(validated_run, "run")
    assert curves.tokens[-1] == state["tokens"] > 0 and curves.minutes[-1] > 0


def test_plot_command_refuses_a_folder_without_held_out_metrics(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_clean_failure(capsys, ["plot", str(empty), "--out", str(tmp_path / "c.png")], "no metrics.jsonl")
    missing = ["plot", str(tmp_path / "nope"), "--out", str(tmp_path / "c.png")]
    assert_clean_failure(capsys, missing, f"{tmp_path / 'nope'} does not exist")
    (tmp_path / "a.txt").write_text("x")
    a_file = ["plot", str(tmp_path / "a.txt"), "--out", str(tmp_path / "c.png")]
    assert_clean_failure(capsys, a_file, "a.txt is not a folder; give run folders")
    MetricsLog(empty / "metrics.jsonl").append({"step": 1, "split": "train", "loss": 1.0})
    assert_clean_failure(capsys, ["plot", str(empty), "--out", str(tmp_path / "c.png")], "--valid")
    MetricsLog(empty / "metrics.jsonl").append({"step": 0, "split": "valid", "epoch": 0, "accuracy": 0.5})
    fine_tuned = "is a fine-tuning run, whose curves are in its curves.png; `plot` compares pretraining runs"
    assert_clean_failure(capsys, ["plot", str(empty), "--out", str(tmp_path / "c.png")], fine_tuned)
    (tmp_path / "finetuned").mkdir()
    (tmp_path / "finetuned" / "finetune.json").write_text("{}")  # the root of a fine-tuning run
    argv = ["plot", str(tmp_path / "finetuned"), "--out", str(tmp_path / "c.png")]
    assert_clean_failure(
        capsys, argv, "is a fine-tuning run (it has finetune.json), whose seeds draw their curves"
    )
    (tmp_path / "finetuned" / "pretrained").mkdir()  # one arm of it, its seeds below
    argv = ["plot", str(tmp_path / "finetuned" / "pretrained"), "--out", str(tmp_path / "c.png")]
    arm = f"is one arm of the fine-tuning run in {tmp_path / 'finetuned'}, whose seeds"
    assert_clean_failure(capsys, argv, arm)


def test_plot_labels_runs_by_folder_name_or_path_when_names_repeat(tmp_path):
    a = write_run(tmp_path / "a" / "run", "mlm_loss", "mlm_accuracy")
    b = write_run(tmp_path / "b" / "run", "mlm_loss", "mlm_accuracy")
    c = write_run(tmp_path / "c", "mlm_loss", "mlm_accuracy")
    assert [curve.label for curve in plot_runs([a, c], tmp_path / "1.png")] == ["run", "c"]
    assert [curve.label for curve in plot_runs([a, b], tmp_path / "2.png")] == [str(a), str(b)]


# -------------------------------------------------------------------- `--report-to tensorboard`


class StubWriter:
    opened: list[tuple[Path, int]] = []
    scalars: list[tuple[Path, str, float, int]] = []

    def __init__(self, log_dir: Path, purge_step: int) -> None:
        self.log_dir = log_dir
        StubWriter.opened.append((log_dir, purge_step))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        StubWriter.scalars.append((self.log_dir, tag, value, step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def stub_writer(monkeypatch):
    StubWriter.opened, StubWriter.scalars = [], []
    monkeypatch.setattr(reporting, "open_tensorboard_writer", StubWriter)
    monkeypatch.setitem(sys.modules, "tensorboard", sys)  # "installed", whether or not it is
    return StubWriter


def test_records_appended_to_metrics_reach_the_writer_within_the_block(tmp_path, stub_writer):
    out = tmp_path / "out"
    out.mkdir()
    MetricsLog(out / "metrics.jsonl").append({"step": 0, "split": "valid", "mlm_loss": 9.0})  # before
    with reporting.reporting_to(out, "tensorboard"):
        MetricsLog(out / "metrics.jsonl").append(
            {"step": 3, "split": "valid", "tokens": 96, "mlm_loss": 7.5, "mlm_accuracy": 0.25}
        )
        MetricsLog(out / "metrics.jsonl").append({"step": 4, "split": "train", "loss": 7.0, "lr": 1e-3})
        seed = out / "seed_2"
        seed.mkdir()
        MetricsLog(seed / "metrics.jsonl").append(
            {"step": 2, "split": "confusion", "labels": ["a", "b"], "matrix": [[1, 0], [0, 1]]}
        )
        MetricsLog(seed / "metrics.jsonl").append({"step": 2, "split": "valid", "epoch": 1, "accuracy": 1.0})
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        MetricsLog(elsewhere / "metrics.jsonl").append({"step": 1, "split": "valid", "mlm_loss": 1.0})
    MetricsLog(out / "metrics.jsonl").append({"step": 5, "split": "valid", "mlm_loss": 7.0})  # after
    board = out.resolve() / "tensorboard"
    assert stub_writer.opened == [(board, 3), (board / "seed_2", 2)]  # purge from the first record on
    assert stub_writer.scalars == [
        (board, "valid/mlm_loss", 7.5, 3),
        (board, "valid/mlm_accuracy", 0.25, 3),
        (board, "train/loss", 7.0, 4),
        (board, "train/lr", 1e-3, 4),
        (board / "seed_2", "valid/accuracy", 1.0, 2),
    ]


def test_no_reporting_unless_asked(tmp_path, stub_writer):
    with reporting.reporting_to(tmp_path, "none"):
        MetricsLog(tmp_path / "metrics.jsonl").append({"step": 1, "split": "valid", "mlm_loss": 1.0})
    assert stub_writer.opened == []


def test_the_command_that_continues_a_reported_run_goes_on_reporting(tmp_path, stub_writer):
    from bertforge.errors import Interrupted
    from bertforge.finetune import removed_unless_progress
    from bertforge.pretrain import continue_arguments

    def finetune_continue_command() -> str:
        with pytest.raises(Interrupted) as stop, removed_unless_progress(tmp_path, False, run_dirs=[]):
            raise Interrupted(signal.SIGINT, 3, tmp_path / "checkpoints" / "step_000003", report=True)
        return stop.value.resume_command

    with reporting.reporting_to(tmp_path, "tensorboard"):
        assert continue_arguments(tmp_path, None).endswith(" --resume --report-to tensorboard")
        assert finetune_continue_command().endswith(" --resume --report-to tensorboard")
    assert continue_arguments(tmp_path, None).endswith(" --resume")  # nothing reported, no flag
    assert finetune_continue_command().endswith(" --resume")


@pytest.mark.parametrize("command", ["pretrain", "finetune"])
def test_report_to_tensorboard_without_the_package_is_one_line(
    tmp_path, capsys, monkeypatch, tiny_pretrained_run, command
):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # importing it raises ImportError
    out = tmp_path / "run"
    if command == "pretrain":
        argv = ["pretrain", "--corpus", str(WIKI_VALID), "--out", str(out)]
    else:
        rows = tmp_path / "rows.csv"
        rows.write_text("text,label\ngood,1\nbad,0\n", encoding="utf-8")
        data = [
            "--train",
            str(rows),
            "--valid",
            str(rows),
            "--text-column",
            "text",
            "--label-column",
            "label",
        ]
        argv = ["finetune", "--model", str(tiny_pretrained_run), *data, "--out", str(out)]
    err = assert_clean_failure(capsys, [*argv, "--report-to", "tensorboard"], "needs the tensorboard package")
    assert "pip install 'bertforge[tensorboard]'" in err
    assert not out.exists()


def test_pretraining_writes_the_metrics_as_tensorboard_events(
    tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir
):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from bertforge.pretrain import pretrain

    run = tmp_path / "run"
    config = tiny_config(wiki_slice, wiki_valid_slice, max_steps=3, eval_every=3)
    with reporting.reporting_to(run, "tensorboard"):  # what `pretrain --report-to tensorboard` does
        pretrain(config, run, tokenizer_dir=small_tokenizer_dir, show_progress=False)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    for split, key in (("valid", "mlm_loss"), ("valid", "nsp_accuracy"), ("train", "loss"), ("train", "lr")):
        logged = [(r["step"], r[key]) for r in metrics_lines(run, split)]
        shown = [(e.step, e.value) for e in events.Scalars(f"{split}/{key}")]
        assert [s for s, _ in shown] == [s for s, _ in logged]
        np.testing.assert_allclose([v for _, v in shown], [v for _, v in logged], rtol=1e-6, atol=1e-8)
    assert "valid/tokens" not in events.Tags()["scalars"]
