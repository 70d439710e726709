"""(7) Inference: labelling texts with a fine-tuned classifier, `bertforge.classifier.classify` (what
`bertforge classify` runs) against Hugging Face's text-classification pipeline on the same model, and
against that model called directly in a loop of batches.

The speed does not depend on the weights, so the model is BERT-Mini (tiny for `--quick`) with a
two-label head from random weights (seeded), with WikiText-2's 30,522-piece vocabulary (cached),
saved as a classifier folder and exported with `bertforge.export.export_model`: the pipeline reads
the export, bertforge the folder it came from. Two workloads from ../shared/data: SST-2's dev
sentences (872, short and of many lengths) and RTE's dev pairs (277, long). `--quick` takes the
first 64 of each. Every contender gets 64 texts a forward pass (`classify`'s default; the
pipeline's is 1) and cuts texts at 128 tokens, in one process with the same threads; rounds
alternate which goes first. The direct loop tokenizes each batch with the export's fast tokenizer
and pads it to its longest text, in input order.

Reported per workload: texts per second of each (median over rounds), bertforge's speed-up over
each (median of the rounds' ratios), and the largest difference from bertforge's in any text's
probability of a label (the same model: about 1e-7).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import Bench, median_ratio, model_config, synchronize
from benchmarks.data import wikitext
from bertforge.cache import cached_tokenizer
from bertforge.classifier import classify, save_classifier, sequence_classifier
from bertforge.config import RunConfig, TokenizerConfig
from bertforge.export import export_model
from bertforge.folders import open_classifier
from bertforge.glue_data import TASKS, find_tasks, read_split, task_file

WORKLOADS = {"SST-2": "SST-2 dev sentences", "RTE": "RTE dev pairs"}
LABELS = ["0", "1"]
BATCH_SIZE = 64
MAX_LENGTH = 128
ROUNDS = 5
QUICK_TEXTS, QUICK_ROUNDS = 64, 2


def dev_files(data: Path) -> dict[str, Path]:
    """The dev.tsv of each workload's task found under `data` (GLUE's layout)."""
    found, _ = find_tasks([Path(data)], list(WORKLOADS))
    files = {task: task_file(folder, "dev") for task, folder in found.items()}
    return {task: path for task, path in files.items() if path is not None}


def refusal(data: Path) -> str | None:
    """Why the infer entry cannot run with this GLUE folder (checked before the suite starts), or None."""
    missing = [task for task in WORKLOADS if task not in dev_files(data)]
    if missing:
        return (
            f"{data} holds no {' or '.join(missing)} folder with a train.tsv and a dev.tsv; give --glue-data "
            "or set BERTFORGE_GLUE to the folder above GLUE's task folders"
        )
    return None


def classifier_folders(bench: Bench) -> tuple[Path, Path]:
    """A random BERT-Mini (tiny for --quick) classifier folder and its Hugging Face export."""
    tokenizer = cached_tokenizer(
        [wikitext("train", bench.quick, bench.workdir)], TokenizerConfig(), "wikitext", bench.cache_dir
    )
    config = RunConfig()
    config.model = model_config("tiny" if bench.quick else "mini", tokenizer.vocab_size)
    config.tokenizer.vocab_size = tokenizer.vocab_size
    torch.manual_seed(0)
    folder, exported = bench.workdir / "infer-classifier", bench.workdir / "infer-export"
    save_classifier(folder, sequence_classifier(config.model, len(LABELS)), tokenizer, config, LABELS)
    export_model(folder, exported)
    return folder, exported


def workload(task: str, data: Path, quick: bool) -> tuple[list[str], list[str] | None]:
    """The dev texts (and second texts of pairs) of `task`."""
    examples = read_split(TASKS[task], dev_files(data)[task])
    count = QUICK_TEXTS if quick else len(examples)
    return examples.texts[:count], None if examples.pairs is None else examples.pairs[:count]


def run(data: Path, bench: Bench) -> list[dict]:
    folder, exported = classifier_folders(bench)
    model, tokenizer, labels, _ = open_classifier(folder)
    model.to(bench.device)
    import transformers

    pipe = transformers.pipeline("text-classification", model=str(exported), device=bench.device, top_k=None)

    def bertforge(texts: list[str], pairs: list[str] | None) -> torch.Tensor:
        answers = classify(
            model, tokenizer, labels, texts, pairs, MAX_LENGTH, BATCH_SIZE, warn_truncated=False
        )
        return torch.tensor([[answer["probabilities"][label] for label in LABELS] for answer in answers])

    def pipeline(texts: list[str], pairs: list[str] | None) -> torch.Tensor:
        given = (
            texts
            if pairs is None
            else [{"text": a, "text_pair": b} for a, b in zip(texts, pairs, strict=True)]
        )
        answers = pipe(given, batch_size=BATCH_SIZE, truncation=True, max_length=MAX_LENGTH)
        return torch.tensor([[scores(answer)[label] for label in LABELS] for answer in answers])

    def hf_model(texts: list[str], pairs: list[str] | None) -> torch.Tensor:
        return hf_model_probabilities(pipe.model, pipe.tokenizer, bench.device, texts, pairs)

    contenders = {"bertforge": bertforge, "hf": pipeline, "hf_model": hf_model}
    return [measure(task, data, contenders, bench) for task in WORKLOADS]


def scores(answer: list[dict]) -> dict[str, float]:
    """The pipeline's answer for one text (`top_k=None`: every label's) as label -> probability."""
    return {entry["label"]: entry["score"] for entry in answer}


@torch.inference_mode()
def hf_model_probabilities(model, tokenizer, device: torch.device, texts: list[str], pairs) -> torch.Tensor:
    """(texts, labels) probabilities from Hugging Face's model called directly, batches in input order,
    each padded to its longest text (what a hand-written loop over `transformers` does)."""
    model.eval()
    rows = []
    for start in range(0, len(texts), BATCH_SIZE):
        end = start + BATCH_SIZE
        batch = [texts[start:end]] + ([] if pairs is None else [pairs[start:end]])
        inputs = tokenizer(*batch, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
        rows.append(model(**inputs.to(device)).logits.float().softmax(-1).cpu())
    return torch.cat(rows)


def measure(task: str, data: Path, contenders: dict, bench: Bench) -> dict:
    """One workload's row: each of `contenders` gives the (texts, labels) probabilities of the texts
    (and pairs): `classify`, the pipeline, and Hugging Face's model called directly."""
    texts, pairs = workload(task, data, bench.quick)
    bench.log(f"infer: {len(texts)} {WORKLOADS[task]}")
    rounds = QUICK_ROUNDS if bench.quick else ROUNDS
    seconds, answers = alternated(contenders, (texts, pairs), rounds, bench.device)
    per_s = {name: len(texts) / statistics.median(times) for name, times in seconds.items()}
    return {
        "workload": WORKLOADS[task],
        "texts": len(texts),
        "batch": BATCH_SIZE,
        "max_length": MAX_LENGTH,
        "bertforge_texts_per_s": per_s["bertforge"],
        "hf_texts_per_s": per_s["hf"],
        "hf_model_texts_per_s": per_s["hf_model"],
        "speedup": median_ratio(seconds["hf"], seconds["bertforge"]),
        "speedup_over_model": median_ratio(seconds["hf_model"], seconds["bertforge"]),
        "largest_probability_difference": max(
            float((answers[name] - answers["bertforge"]).abs().max()) for name in ("hf", "hf_model")
        ),
    }


def alternated(
    contenders: dict, arguments: tuple, rounds: int, device: torch.device
) -> tuple[dict[str, list[float]], dict]:
    """Seconds of each contender's whole pass over `arguments`, round by round, the order flipped every
    round, after one untimed pass of each; and each one's last answer."""
    names = list(contenders)
    answers = {name: contenders[name](*arguments) for name in names}
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else reversed(names):
            synchronize(device)
            start = time.perf_counter()
            answers[name] = contenders[name](*arguments)
            synchronize(device)
            seconds[name].append(time.perf_counter() - start)
    return seconds, answers


def lines(rows: list[dict], table) -> list[str]:
    return [
        "",
        f"(7) inference: bertforge classify against transformers' text-classification pipeline and its model "
        f"called directly, the same classifier, {BATCH_SIZE} texts a pass, cut at {MAX_LENGTH} tokens",
        table(
            {
                "workload": lambda r: r["workload"],
                "texts": lambda r: r["texts"],
                "bertforge texts/s": lambda r: f"{r['bertforge_texts_per_s']:,.0f}",
                "HF pipeline texts/s": lambda r: f"{r['hf_texts_per_s']:,.0f}",
                "HF model texts/s": lambda r: f"{r['hf_model_texts_per_s']:,.0f}",
                "speed-up (pipeline, model)": lambda r: (
                    f"{r['speedup']:.2f}x, {r['speedup_over_model']:.2f}x"
                ),
                "largest p difference": lambda r: f"{r['largest_probability_difference']:.1e}",
            },
            rows,
        ),
    ]
