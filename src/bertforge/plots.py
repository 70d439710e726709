"""PNG plots of a run's `metrics.jsonl`: training and validation curves."""

from __future__ import annotations

import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402

from bertforge.io import atomic_write_bytes  # noqa: E402


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line]


def series(records: list[dict], split: str, key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if r["split"] == split and key in r]
    return [p[0] for p in points], [p[1] for p in points]


def plot_pretraining(metrics_path: Path, out_png: Path) -> None:
    """Three panels: MLM loss, NSP loss (train and validation), and validation accuracies."""
    records = read_metrics(metrics_path)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title in ((axes[0], "mlm_loss", "MLM loss"), (axes[1], "nsp_loss", "NSP loss")):
        for split, style in (("train", "-"), ("valid", "o-")):
            steps, values = series(records, split, key)
            if steps:
                ax.plot(steps, values, style, label=split, markersize=3)
        ax.set(title=title, xlabel="step", ylabel="loss")
        if ax.has_data():
            ax.legend()
        else:
            ax.text(0.5, 0.5, "not trained in this run", ha="center", transform=ax.transAxes)
    for key, label in (("mlm_accuracy", "MLM accuracy"), ("nsp_accuracy", "NSP accuracy")):
        steps, values = series(records, "valid", key)
        if steps:
            axes[2].plot(steps, values, "o-", label=label, markersize=3)
    axes[2].set(title="validation accuracy", xlabel="step", ylabel="accuracy", ylim=(0, 1))
    if axes[2].has_data():
        axes[2].legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(Path(out_png), buffer.getvalue())


def plot_finetuning(metrics_path: Path, out_png: Path, steps_per_epoch: int) -> None:
    """Two panels against epochs: classification loss (train and validation), and validation accuracy
    and macro F1 with the training accuracy."""
    records = read_metrics(metrics_path)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for split, style in (("train", "-"), ("valid", "o-")):
        steps, values = series(records, split, "classification_loss")
        axes[0].plot([s / steps_per_epoch for s in steps], values, style, label=split, markersize=3)
    axes[0].set(title="classification loss", xlabel="epoch", ylabel="loss")
    for split, key, label in (
        ("valid", "accuracy", "validation accuracy"),
        ("valid", "macro_f1", "validation macro F1"),
        ("train", "accuracy", "training accuracy"),
    ):
        steps, values = series(records, split, key)
        style = "o-" if split == "valid" else "-"
        axes[1].plot([s / steps_per_epoch for s in steps], values, style, label=label, markersize=3)
    axes[1].set(title="accuracy and macro F1", xlabel="epoch", ylabel="score", ylim=(0, 1))
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(Path(out_png), buffer.getvalue())
