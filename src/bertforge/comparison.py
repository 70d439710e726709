"""The downstream comparison behind `bertforge finetune --compare-scratch`: what pretraining bought.

For every seed, two fine-tuning runs with the same data, recipe and seed: the pretrained arm (the
encoder of `task.model`) and the from-scratch arm (the same architecture and tokenizer from random
weights; the same head, example order and dropout, see `finetune.build_classifier`). Then paired
statistics from `bertforge.stats` on the best epoch's validation accuracy (a regression's: Pearson's
r; a tagger's: entity F1): the per-seed differences and their median, an exact sign test over seeds
(training randomness) and a paired bootstrap over validation examples (the evaluation set's sampling
noise; Pearson's r and entity F1 are no means over examples, so `paired_bootstrap_pearson` and
`paired_bootstrap_f1` recompute them on every resample, of sentences for F1).

Each run's best epoch is chosen on the validation set that also scores it, alike in both arms: the
accuracies are optimistic, the comparison of the two procedures is even-handed.

Comparison folder (`--out OUT`):

    finetune.json                 the task and settings (what `--resume` reads)
    pretrained/seed_N/            a fine-tuning run (see `bertforge.finetune`), with its
                                  valid_predictions.json
    pretrained/summary.json       the arm's median and spread over seeds
    scratch/seed_N/, scratch/summary.json   the same for the from-scratch arm
    comparison.json               the pairs, each arm's summary and the paired tests
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from bertforge.config import RunConfig
from bertforge.entities import f1_from_counts, sentence_counts
from bertforge.errors import BertforgeError
from bertforge.finetune import (
    METRICS,
    PREDICTIONS,
    RESULT,
    SUMMARY,
    FinetuneTask,
    SeedRun,
    removed_unless_progress,
    result_kind,
    run_seeds,
    start,
    summarize_seeds,
)
from bertforge.folders import ARMS
from bertforge.io import read_json, write_json
from bertforge.metrics import pearson_rows
from bertforge.stats import bootstrap_gains, bootstrap_verdict, paired_bootstrap, sign_test, summary
from bertforge.tagged import TAGGING

COMPARISON = "comparison.json"
SEEDS_FOR_A_CLAIM = 5
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def compare_with_scratch(
    task: FinetuneTask,
    config: RunConfig,
    out: Path,
    resume: bool = False,
    show_progress: bool = True,
    jobs: int | None = 1,
) -> dict:
    """Fine-tune both arms on every seed of `task.seeds` (at least 2), seed by seed (`jobs` runs at
    once: `finetune.run_seeds`); write each arm's summary.json and `comparison.json`, and return the
    comparison. Finished runs are not run again."""
    task, out, began = replace(task, compare_scratch=True), Path(out), time.time()
    job, created = start(task, config, out, resume, show_progress)
    if len(task.seeds) < SEEDS_FOR_A_CLAIM:
        warnings.warn(few_seeds_note(len(task.seeds)), stacklevel=2)
    runs = [
        SeedRun(seed, run_folder(out, arm, seed), arm == "scratch", f"{arm} seed {seed}")
        for seed in task.seeds
        for arm in ARMS
    ]
    with removed_unless_progress(out, created, [run.run_dir for run in runs], jobs):
        results, at_once = run_seeds(job, runs, config, out, jobs)
    for arm in ARMS:
        scratch = arm == "scratch"
        arm_results = [
            result for run, result in zip(runs, results, strict=True) if run.from_scratch == scratch
        ]
        write_json(out / arm / SUMMARY, summarize_seeds(arm_results))
    invocation = {**at_once, "wall_s": time.time() - began}
    comparison = {**compare_runs(out, task.seeds), "this_invocation": invocation}
    write_json(out / COMPARISON, comparison)
    return comparison


def few_seeds_note(count: int) -> str:
    return (
        f"{'1 seed supports' if count == 1 else f'{count} seeds support'} no claim about pretraining; use "
        f"{SEEDS_FOR_A_CLAIM} or more (even then "
        "the exact sign test reaches p < 0.05 only from 6 seeds that all agree)"
    )


def run_folder(out: Path, arm: str, seed: int) -> Path:
    return Path(out) / arm / f"seed_{seed}"


def compare_runs(
    out: Path, seeds: list[int], resamples: int = BOOTSTRAP_RESAMPLES, bootstrap_seed: int = BOOTSTRAP_SEED
) -> dict:
    """The paired statistics of the finished runs of both arms in `out`."""
    results = {arm: [read_json(run_folder(out, arm, seed) / RESULT) for seed in seeds] for arm in ARMS}
    kind = result_kind(results["pretrained"][0])
    metric = METRICS[kind][0]
    pretrained, scratch = ([r["best"][metric] for r in results[arm]] for arm in ARMS)
    differences = [a - b for a, b in zip(pretrained, scratch, strict=True)]
    pairs = zip(seeds, pretrained, scratch, differences, strict=True)
    records = best_records(out, seeds)
    bootstrap = paired_bootstrap_of(kind, records, resamples, bootstrap_seed)
    bootstrap["unit"] = "sentences" if kind == TAGGING else "examples"  # what the bootstrap resamples
    majority = majority_share(records["pretrained"][0]["true"]) if kind == "classification" else None
    return {
        "majority_class": majority,  # the accuracy of the most frequent validation label (a constant)
        "metric": metric,  # of each run's best epoch on the validation set
        "seeds": list(seeds),
        "pairs": [{"seed": s, "pretrained": a, "scratch": b, "difference": d} for s, a, b, d in pairs],
        "pretrained": summary(pretrained),
        "scratch": summary(scratch),
        "difference": summary(differences),
        "sign_test": sign_test(differences),
        "bootstrap": bootstrap,
        "elapsed_s": sum(r["elapsed_s"] for arm in ARMS for r in results[arm]),
    }


def majority_share(labels: list) -> float:
    """The share of the most frequent label: the best accuracy that one answer for all can reach."""
    return max(np.unique(np.asarray(labels), return_counts=True)[1]) / len(labels)


def paired_bootstrap_of(kind: str, records: dict[str, list[dict]], resamples: int, seed: int) -> dict:
    """The paired bootstrap over validation examples of both arms' best predictions (`best_records`):
    of accuracy, Pearson's r (a regression) or entity F1 (a tagger, over sentences)."""
    if kind == TAGGING:
        counts = {arm: np.stack([tagged_counts(record) for record in records[arm]]) for arm in ARMS}
        return paired_bootstrap_f1(counts["pretrained"], counts["scratch"], resamples, seed)
    true = np.asarray(records["pretrained"][0]["true"])
    predicted = {arm: np.stack([np.asarray(r["predicted"]) for r in records[arm]]) for arm in ARMS}
    if kind == "regression":
        return paired_bootstrap_pearson(true, predicted["pretrained"], predicted["scratch"], resamples, seed)
    correct = {arm: predicted[arm] == true for arm in ARMS}
    return paired_bootstrap(correct["pretrained"], correct["scratch"], resamples, seed)


def best_records(out: Path, seeds: list[int]) -> dict[str, list[dict]]:
    """Arm -> the valid_predictions.json of each seed's run: the best epoch's prediction of every
    validation example (label ids, a regression's scores, a tagger's tag ids per sentence) beside
    the true ones, which must be the same in every run."""
    truth, records = None, {}
    for arm in ARMS:
        records[arm] = []
        for seed in seeds:
            path = run_folder(out, arm, seed) / PREDICTIONS
            if not path.is_file():
                raise BertforgeError(f"{path} is missing; fine-tune that seed again to compare it")
            record = read_json(path)
            truth = record["true"] if truth is None else truth
            if record["true"] != truth:
                raise BertforgeError(f"{path} was made on other validation data than the other runs")
            records[arm].append(record)
    return records


def tagged_counts(record: dict) -> np.ndarray:
    """(sentences, 3): a tagger's entities found, predicted and true in each validation sentence."""
    names = record["labels"]
    true, predicted = ([[names[i] for i in tags] for tags in record[key]] for key in ("true", "predicted"))
    return sentence_counts(true, predicted)


def paired_bootstrap_pearson(
    true: np.ndarray,
    predicted_a: np.ndarray,
    predicted_b: np.ndarray,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = 0.95,
) -> dict[str, float]:
    """`stats.paired_bootstrap` for the gain in Pearson's r of arm a over arm b.

    `predicted_a` and `predicted_b` are (seeds, examples) scores of the same seeds, `true` the
    (examples,) targets; r is averaged over seeds. The examples are resampled with replacement (each
    resample the same for both arms and every seed) and r recomputed on each; the p-value and the
    percentile interval are read as `stats.paired_bootstrap` reads them.
    """
    true = np.asarray(true, dtype=np.float64)
    a, b = np.atleast_2d(predicted_a).astype(np.float64), np.atleast_2d(predicted_b).astype(np.float64)
    if a.shape != b.shape or a.shape[1] != true.size or true.size == 0:
        raise ValueError(f"both arms need scores of the same examples: {a.shape}, {b.shape}, {true.shape}")
    observed = float(pearson_rows(a, true).mean() - pearson_rows(b, true).mean())

    def gain(index: np.ndarray) -> np.ndarray:
        target = true[index]  # (R, N)
        return pearson_rows(a[:, index], target).mean(0) - pearson_rows(b[:, index], target).mean(0)

    gains = bootstrap_gains(gain, true.size, resamples, seed)
    return bootstrap_verdict(observed, gains, int(true.size), seed, confidence)


def paired_bootstrap_f1(
    counts_a: np.ndarray,
    counts_b: np.ndarray,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = 0.95,
) -> dict[str, float]:
    """`stats.paired_bootstrap` for the gain in entity F1 of arm a over arm b.

    `counts_a` and `counts_b` are (seeds, sentences, 3): each run's entities found, predicted and
    true per validation sentence (`entities.sentence_counts`); F1 is averaged over seeds. The
    sentences are resampled with replacement (the same for both arms and every seed) and F1
    recomputed from the resample's summed counts, as for `paired_bootstrap_pearson`.
    """
    a, b = np.asarray(counts_a, dtype=np.float64), np.asarray(counts_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 3 or a.shape[2] != 3 or a.shape[1] == 0:
        raise ValueError(f"both arms need counts of the same sentences: {a.shape}, {b.shape}")
    size = a.shape[1]
    observed = float(f1_from_counts(a.sum(1)).mean() - f1_from_counts(b.sum(1)).mean())

    def gain(index: np.ndarray) -> np.ndarray:
        rows = np.arange(len(index))[:, None] * size
        weights = np.bincount((rows + index).ravel(), minlength=len(index) * size).reshape(len(index), size)
        sums = {arm: np.einsum("rn,snk->srk", weights, counts) for arm, counts in (("a", a), ("b", b))}
        return f1_from_counts(sums["a"]).mean(0) - f1_from_counts(sums["b"]).mean(0)  # (R,)

    gains = bootstrap_gains(gain, size, resamples, seed)
    return bootstrap_verdict(observed, gains, size, seed, confidence)
