"""PNG plots: a run's training and validation curves (`loss.png`, `curves.png`), several runs'
held-out curves on one figure (`bertforge plot`), and a model's attention maps (`bertforge attention`).

Each `*_figure` function builds a matplotlib figure from data (so tests can read its panels); the
PNG is drawn and written atomically by `save_png`.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bertforge.errors import BertforgeError
from bertforge.folders import folder_kind
from bertforge.io import atomic_write_bytes, read_json
from bertforge.metrics_log import MetricsLog
from bertforge.signals import stop_signals_held

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# The held-out metrics a pretraining run logs: (objective, loss key, accuracy key).
HELD_OUT = (("MLM", "mlm_loss", "mlm_accuracy"), ("next-token", "clm_loss", "clm_accuracy"))


def series(records: list[dict], split: str, key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if r["split"] == split and key in r]
    return [p[0] for p in points], [p[1] for p in points]


def pyplot():
    """matplotlib's pyplot on its file-only backend, imported when a figure is first drawn: the import
    takes most of a second, which the commands that draw nothing need not wait for."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def save_png(build: Callable[[], Figure], out_png: Path, dpi: int = 110) -> None:
    """Draw the figure that `build` makes and write it as a PNG at `out_png` atomically. A stop signal
    waits until it is drawn (`stop_signals_held`)."""
    buffer = io.BytesIO()
    with stop_signals_held():
        fig = build()
        try:
            fig.savefig(buffer, format="png", dpi=dpi)
        finally:
            pyplot().close(fig)
    atomic_write_bytes(Path(out_png), buffer.getvalue())


def plot_pretraining(metrics_path: Path, out_png: Path, masking: tuple[float, float] | None = None) -> None:
    """Write `pretraining_figure` of a run's `metrics.jsonl` as a PNG; `masking`: a BERT run's (fixed)
    training and held-out masking rates."""
    records = MetricsLog(Path(metrics_path)).read()
    save_png(lambda: pretraining_figure(records, masking), out_png)


@dataclass
class WarmupEnd:
    """Where a sequence-length warmup ended: the first full-length step, the lengths before and after."""

    step: int
    short: int
    full: int


def warmup_end(records: list[dict]) -> WarmupEnd | None:
    """The end of the run's sequence-length warmup (its "warmup_end" line); None if it had none or
    the warmup still lasts."""
    ends = [r for r in records if r["split"] == "warmup_end"]
    if not ends:
        return None
    return WarmupEnd(ends[-1]["step"], warmup_length(records) or 0, ends[-1]["seq_len"])


def pretraining_figure(records: list[dict], masking: tuple[float, float] | None = None) -> Figure:
    """Three panels: MLM (or, for a GPT run, next-token) loss, NSP loss (train and validation), and
    validation accuracies. With a sequence-length warmup, the held-out curves at the warmup's length
    are drawn too (dashed), and its end is a vertical line: the full-length held-out loss often
    rises while the run trains on short sequences, and drops once it trains at full length. The MLM
    panel's title gives the share of tokens masked in training (a schedule's, as logged; else `masking`'s
    first) and in evaluation (`masking`'s second): a higher training rate puts the training loss above
    the held-out one."""
    gpt = any("clm_loss" in record for record in records)
    lm_key, lm_title = (
        ("clm_loss", "next-token loss") if gpt else ("mlm_loss", masked_loss_title(records, masking))
    )
    held_out = [("valid", "o-", "")]  # (split, style, what the label adds)
    if short := warmup_length(records):
        held_out.append(("valid_short", "s--", f" at the warmup's {short} tokens"))
    losses = [(lm_key, lm_title)] + ([] if gpt else [("nsp_loss", "NSP loss")])  # GPT-1 has no NSP task
    fig, axes = pyplot().subplots(1, len(losses) + 1, figsize=(5 * len(losses) + 5, 4.2))
    for ax, (key, title) in zip(axes, losses, strict=False):
        steps, values = series(records, "train", key)
        if steps:
            ax.plot(steps, values, line_style(steps), label="train", markersize=3)
        held_out_lines(ax, records, key, "valid", held_out)
        ax.set(title=title, xlabel="step", ylabel="loss (cross-entropy, nats)")
        if not ax.has_data():
            ax.text(0.5, 0.5, "not trained in this run", ha="center", transform=ax.transAxes)
            ax.set(xticks=[], yticks=[])
    accuracies = (("mlm_accuracy", "MLM"), ("nsp_accuracy", "NSP"), ("clm_accuracy", "next-token"))
    for key, name in accuracies:
        held_out_lines(axes[-1], records, key, f"{name} accuracy", held_out)
    axes[-1].set(title="validation accuracy", xlabel="step", ylabel="accuracy", ylim=(0, 1))
    mark_warmup_end(axes, warmup_end(records))
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def line_style(steps: list) -> str:
    """A training curve's style: a line, or a dot where a run logged one point (a line of one point
    draws nothing)."""
    return "-" if len(steps) > 1 else "o"


def masked_loss_title(records: list[dict], masking: tuple[float, float] | None) -> str:
    """The title "MLM loss (train masks 30%, held-out 15%)": a schedule's first and last rates, from the
    training lines (which log them), else `masking`'s (training, held-out) rates."""
    rates = [r["mlm_probability"] for r in records if r["split"] == "train" and "mlm_probability" in r]
    rates = rates or ([masking[0]] if masking else [])
    if not rates:
        return "MLM loss"
    train = f"{rates[0]:.0%}" if rates[0] == rates[-1] else f"{rates[0]:.0%} to {rates[-1]:.0%}"
    held_out = "" if masking is None else f", held-out {masking[1]:.0%}"
    return f"MLM loss (train masks {train}{held_out})"


def held_out_lines(ax, records: list[dict], key: str, name: str, held_out: list[tuple]) -> None:
    """The held-out curves of `key`, one per (split, style, label's end) of `held_out`, in one colour."""
    color = None
    for split, style, where in held_out:
        steps, values = series(records, split, key)
        if steps:
            (line,) = ax.plot(steps, values, style, label=name + where, markersize=3, color=color)
            color = line.get_color()


def warmup_length(records: list[dict]) -> int | None:
    """The sequence length of the warmup's held-out lines ("valid_short"); None if the run has none."""
    lengths = [r["seq_len"] for r in records if r["split"] == "valid_short"]
    return lengths[-1] if lengths else None


def mark_warmup_end(axes, end: WarmupEnd | None) -> None:
    """A vertical line at the first full-length step on each panel that has curves, labelled on the
    first."""
    if end is None:
        return
    lengths = f"sequence length {end.short} to {end.full}" if end.short else f"full length ({end.full})"
    for index, ax in enumerate(axes):
        if index == 0 or ax.has_data():
            label = f"{lengths} from step {end.step}" if index == 0 else None
            ax.axvline(end.step, color="grey", linestyle=":", label=label)


# What a fine-tuning run's curves draw, by task kind: (its loss, the metrics panel's title,
# [(split, metric, label), ...]).
FINETUNING_CURVES = {
    "classification": (
        "classification_loss",
        "accuracy and macro F1",
        [
            ("valid", "accuracy", "validation accuracy"),
            ("valid", "macro_f1", "validation macro F1"),
            ("train", "accuracy", "training accuracy"),
        ],
    ),
    "regression": (
        "mse",
        "Pearson and Spearman correlation",
        [("valid", "pearson", "validation Pearson"), ("valid", "spearman", "validation Spearman")],
    ),
    "ner": (
        "tagging_loss",
        "entity F1, precision and recall",
        [
            ("valid", "f1", "validation entity F1"),
            ("valid", "precision", "validation entity precision"),
            ("valid", "recall", "validation entity recall"),
            ("train", "accuracy", "training token accuracy"),
        ],
    ),
}


def plot_finetuning(
    metrics_path: Path, out_png: Path, steps_per_epoch: int, kind: str = "classification"
) -> None:
    """Write `finetuning_figure` of a fine-tuning run's `metrics.jsonl` as a PNG."""
    records = MetricsLog(Path(metrics_path)).read()
    save_png(lambda: finetuning_figure(records, steps_per_epoch, kind), out_png)


def finetuning_figure(records: list[dict], steps_per_epoch: int, kind: str) -> Figure:
    """Two panels against epochs: the task's loss (train and validation), and its validation metrics
    (accuracy and macro F1; Pearson and Spearman; entity F1, precision and recall) with the training
    ones."""
    loss_key, title, metrics = FINETUNING_CURVES[kind]
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2))
    for split in ("train", "valid"):
        steps, values = series(records, split, loss_key)
        style = "o-" if split == "valid" else line_style(steps)
        axes[0].plot([s / steps_per_epoch for s in steps], values, style, label=split, markersize=3)
    axes[0].set(title=loss_key.replace("_", " "), xlabel="epoch", ylabel="loss")
    for split, key, label in metrics:
        steps, values = series(records, split, key)
        style = "o-" if split == "valid" else line_style(steps)
        axes[1].plot([s / steps_per_epoch for s in steps], values, style, label=label, markersize=3)
    low = -1 if kind == "regression" else 0  # a correlation can fall below 0
    axes[1].set(title=title, xlabel="epoch", ylabel="score", ylim=(low, 1))
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------- several runs


@dataclass
class RunCurves:
    """One run's held-out loss and accuracy at each evaluation, placed by tokens and minutes."""

    label: str
    objective: str  # "MLM" or "next-token"
    tokens: np.ndarray
    minutes: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray
    estimated: bool  # a metrics.jsonl without token counts: tokens from batch size x sequence length


def run_curves(run_dir: Path, label: str) -> RunCurves:
    """The held-out curves of a pretraining run folder (its `metrics.jsonl` and `config.json`).

    Tokens are the real tokens trained on before each evaluation (the "tokens" of the "valid" lines;
    runs logged before they existed: step x batch size x sequence length). Minutes are training
    time: each "train" line's window of tokens divided by its throughput, summed, so evaluation and
    checkpoint time are left out.
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not Path(run_dir).is_dir():
        state = "is not a folder" if Path(run_dir).exists() else "does not exist"
        raise BertforgeError(f"{run_dir} {state}; give run folders written by bertforge pretrain")
    kind = folder_kind(run_dir)
    if kind is not None and kind.name.startswith(("fine-tuning", "GLUE")):
        raise BertforgeError(
            f"{run_dir} is {kind.what}, whose seeds draw their curves in their curves.png; `plot` compares "
            "pretraining runs"
        )
    if not path.is_file():
        raise BertforgeError(
            f"{run_dir} has no metrics.jsonl; give run folders written by bertforge pretrain"
        )
    records = MetricsLog(path).read(repair=True)
    valid = [r for r in records if r["split"] == "valid"]
    objective, loss_key, accuracy_key = held_out_keys(valid, path)
    points = [r for r in valid if r.get(loss_key) is not None and r.get(accuracy_key) is not None]
    tokens_at, estimated = token_positions(valid, Path(run_dir))
    steps = np.array([r["step"] for r in points], dtype=float)
    return RunCurves(
        label=label,
        objective=objective,
        tokens=tokens_at(steps),
        minutes=training_seconds(records, tokens_at)(steps) / 60,
        loss=np.array([r[loss_key] for r in points]),
        accuracy=np.array([r[accuracy_key] for r in points]),
        estimated=estimated,
    )


def held_out_keys(valid: list[dict], path: Path) -> tuple[str, str, str]:
    """The `HELD_OUT` entry whose loss the "valid" lines hold."""
    for keys in HELD_OUT:
        if any(record.get(keys[1]) is not None for record in valid):
            return keys
    if any("epoch" in record for record in valid):  # only fine-tuning logs its evaluations by epoch
        raise BertforgeError(
            f"{path.parent} is a fine-tuning run, whose curves are in its curves.png; `plot` compares "
            "pretraining runs"
        )
    raise BertforgeError(
        f"{path} holds no held-out MLM or next-token metrics; give pretraining runs that had validation "
        "text (--valid)"
    )


def token_positions(valid: list[dict], run_dir: Path):
    """(step -> tokens trained on before it, whether that is an estimate) for one run."""
    counted = {0: 0, **{r["step"]: r["tokens"] for r in valid if "tokens" in r}}
    if len(counted) > 1:
        steps, tokens = zip(*sorted(counted.items()), strict=True)
        return (lambda at: np.interp(at, steps, tokens)), False
    try:
        config = read_json(run_dir / "config.json")
        per_step = config["train"]["batch_size"] * config["data"]["max_seq_length"]
    except (BertforgeError, OSError, KeyError, TypeError):
        raise BertforgeError(
            f"{run_dir} logs no token counts and has no readable config.json to estimate them from"
        ) from None
    return (lambda at: np.asarray(at, dtype=float) * per_step), True


def training_seconds(records: list[dict], tokens_at):
    """step -> seconds of training before it, from the "train" lines' throughput."""
    windows = [r for r in records if r["split"] == "train" and r.get("tokens_per_s")]
    steps = np.array([0] + [r["step"] for r in windows], dtype=float)
    rates = np.array([r["tokens_per_s"] for r in windows], dtype=float)
    seconds = np.concatenate([[0.0], np.cumsum(np.diff(tokens_at(steps)) / rates)])
    return lambda at: np.interp(at, steps, seconds)


def run_labels(runs: list[Path]) -> list[str]:
    """Each run's folder name; the paths as given when two names are the same."""
    names = [Path(run).resolve().name for run in runs]
    return names if len(set(names)) == len(names) else [str(run) for run in runs]


def runs_figure(curves: list[RunCurves]) -> Figure:
    """Held-out loss (top) and accuracy (bottom) against tokens (left) and minutes (right), one line
    per run."""
    fig, axes = pyplot().subplots(2, 2, figsize=(12, 8.5), squeeze=False)
    for run in curves:
        label = f"{run.label} ({run.objective}{', estimated' if run.estimated else ''})"
        for column, x in enumerate((run.tokens, run.minutes)):
            axes[0][column].plot(x, run.loss, "o-", markersize=3, label=label)
            axes[1][column].plot(x, run.accuracy, "o-", markersize=3, label=label)
    xlabels = ("tokens trained on", "minutes of training (evaluation time left out)")
    for column, xlabel in enumerate(xlabels):
        axes[0][column].set(title="held-out loss", xlabel=xlabel, ylabel="loss")
        axes[1][column].set(title="held-out accuracy", xlabel=xlabel, ylabel="top-1 accuracy")
        axes[1][column].set_ylim(bottom=0)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_runs(runs: list[Path], out_png: Path) -> list[RunCurves]:
    """Draw several runs' held-out curves on one figure (`runs_figure`) and write it as a PNG."""
    curves = [run_curves(run, label) for run, label in zip(runs, run_labels(runs), strict=True)]
    save_png(lambda: runs_figure(curves), out_png)
    return curves


# ----------------------------------------------------------------------------- attention maps


def attention_figure(tokens: list[str], weights: np.ndarray, layers: list[int], heads: list[int]) -> Figure:
    """A grid of heat maps: one row per layer of `layers`, one column per head of `heads` (0-based
    indices into `weights`, (layers, heads, T, T)); queries down the rows, keys along the columns.
    Each panel's colours run from 0 to its own largest weight, which its title gives: a near-uniform
    head (weights about 1/T) would otherwise look as sharp as one that attends to a single token. In a
    causal (GPT) map the first token attends only to itself, with weight 1: the scale leaves its row out."""
    T = len(tokens)
    side = min(max(1.2 + 0.12 * T, 2.4), 6.0)  # inches per panel: room for its title
    fontsize = min(8.0, 0.8 * side * 72 / T)  # a tick label fits its row
    fig, axes = pyplot().subplots(
        len(layers), len(heads), figsize=(side * len(heads), side * len(layers) + 0.5), squeeze=False
    )
    for row, layer in enumerate(layers):
        for column, head in enumerate(heads):
            ax = axes[row][column]
            panel = weights[layer, head]
            causal = T > 1 and not np.triu(panel, 1).any()
            top = float((panel[1:] if causal else panel).max())
            ax.imshow(panel, cmap="viridis", vmin=0.0, vmax=top, interpolation="nearest")
            ax.set_title(f"layer {layer + 1}, head {head + 1}, max {top:.2f}", fontsize=8)
            ax.set_xticks(range(T), tokens, rotation=90, fontsize=fontsize)
            ax.set_yticks(range(T), tokens, fontsize=fontsize)
    fig.suptitle(
        "attention: each row is a query token, its columns the keys it attends to (a row sums to 1); "
        "colours from 0 to each panel's largest weight (in a GPT's, past the first row)",
        fontsize=9,
        wrap=True,
    )
    fig.tight_layout()
    return fig
