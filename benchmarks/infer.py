"""(7) Inference: labelling texts with a fine-tuned classifier, `bertforge.classifier.classify` (what
`bertforge classify` runs) against Hugging Face's text-classification pipeline on the same model, and
against that model called directly in a loop of batches.

The speed does not depend on the weights, so the model is BERT-Mini (tiny for `--quick`) with a
two-label head from random weights (seeded), with WikiText-2's 30,522-piece vocabulary (cached),
saved as a classifier folder and exported with `bertforge.export.export_model`: the pipeline reads
the export, bertforge the folder it came from. The head's weights are drawn wider than BERT's 0.02,
so that the probabilities spread over texts and a text read differently shows. Two workloads from
GLUE's folder (../shared/data): SST-2's dev sentences (872, short and of many lengths) and RTE's dev
pairs (277, long); `--quick` takes the first 64 of each.

Every contender gets 64 texts a forward pass (`classify`'s default; the pipeline's is 1) and cuts
texts at 128 tokens, in one process with the same threads, tokenizing included; rounds rotate which
goes first. `classify` batches texts of like length; to show what that gives, it also runs on 64
texts at a time in input order (the batches the others make). The direct loop tokenizes each batch
with the export's fast tokenizer and pads it to its longest text.

Reported per workload: texts per second of each (median over rounds), bertforge's speed-up over each
(median of the rounds' ratios), and the largest difference from bertforge's in any text's
probability of a label (the same model: about 1e-7).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from benchmarks.common import Bench, interleaved, median_ratio, model_config
from benchmarks.data import wikitext
from benchmarks.glue import folder_refusal, missing_refusal
from bertforge.cache import cached_tokenizer
from bertforge.classifier import classify, save_classifier, sequence_classifier
from bertforge.config import RunConfig, TokenizerConfig
from bertforge.errors import BertforgeError
from bertforge.export import export_model
from bertforge.folders import open_classifier
from bertforge.glue_data import TASKS, find_tasks, read_split, task_file

WORKLOADS = {"SST-2": "SST-2 dev sentences", "RTE": "RTE dev pairs"}
LABELS = ["0", "1"]
HEAD_STD = 0.5  # BERT's 0.02 leaves every probability near 0.5
BATCH_SIZE = 64
MAX_LENGTH = 128
ROUNDS, QUICK_ROUNDS = 8, 4  # multiples of the four contenders: each goes first as often
QUICK_TEXTS = 64


def dev_files(data: Path) -> dict[str, Path]:
    """The dev.tsv of each workload's task found under `data` (GLUE's layout)."""
    found, _ = find_tasks([Path(data)], list(WORKLOADS))
    files = {task: task_file(folder, "dev") for task, folder in found.items()}
    return {task: path for task, path in files.items() if path is not None}


def refusal(data: Path) -> str | None:
    """Why the infer entry cannot run with this GLUE folder (checked before the suite starts), or None."""
    if why := folder_refusal(data):
        return why
    try:
        missing = [task for task in WORKLOADS if task not in dev_files(data)]
    except BertforgeError as error:  # a task in two folders
        return str(error)
    return missing_refusal(data, missing, "a train.tsv and a dev.tsv")


def classifier_folders(bench: Bench) -> tuple[Path, Path]:
    """A random BERT-Mini (tiny for --quick) classifier folder and its Hugging Face export."""
    tokenizer = cached_tokenizer(
        [wikitext("train", bench.quick, bench.workdir)], TokenizerConfig(), "wikitext", bench.cache_dir
    )
    config = RunConfig()
    config.model = model_config("tiny" if bench.quick else "mini", tokenizer.vocab_size)
    config.tokenizer.vocab_size = tokenizer.vocab_size
    torch.manual_seed(0)
    model = sequence_classifier(config.model, len(LABELS))
    torch.nn.init.normal_(model.classifier.weight, std=HEAD_STD)
    folder, exported = bench.workdir / "infer-classifier", bench.workdir / "infer-export"
    save_classifier(folder, model, tokenizer, config, LABELS)
    export_model(folder, exported)
    return folder, exported


def workload(task: str, data: Path, quick: bool) -> tuple[list[str], list[str] | None]:
    """The dev texts (and second texts of pairs) of `task`."""
    path = dev_files(data)[task]
    examples = read_split(TASKS[task], path)
    if examples is None:
        raise BertforgeError(f"{path} has no label column; give GLUE's dev.tsv")
    count = QUICK_TEXTS if quick else len(examples)
    return examples.texts[:count], None if examples.pairs is None else examples.pairs[:count]


def contenders(bench: Bench) -> dict:
    """Each contender: (texts, second texts or None) -> (texts, labels) probabilities."""
    import transformers

    folder, exported = classifier_folders(bench)
    model, tokenizer, labels, _ = open_classifier(folder)
    model.to(bench.device)
    pipe = transformers.pipeline("text-classification", model=str(exported), device=bench.device, top_k=None)

    def bertforge(texts: list[str], pairs: list[str] | None) -> torch.Tensor:
        answers = classify(
            model, tokenizer, labels, texts, pairs, MAX_LENGTH, BATCH_SIZE, warn_truncated=False
        )
        return torch.tensor([[answer["probabilities"][label] for label in LABELS] for answer in answers])

    def bertforge_input_order(texts: list[str], pairs: list[str] | None) -> torch.Tensor:
        chunks = [
            (texts[i : i + BATCH_SIZE], pairs and pairs[i : i + BATCH_SIZE]) for i in input_batches(texts)
        ]
        return torch.cat([bertforge(*chunk) for chunk in chunks])

    def pipeline(texts: list[str], pairs: list[str] | None) -> torch.Tensor:
        given = (
            texts
            if pairs is None
            else [{"text": a, "text_pair": b} for a, b in zip(texts, pairs, strict=True)]
        )
        answers = pipe(given, batch_size=BATCH_SIZE, truncation=True, max_length=MAX_LENGTH)
        return torch.tensor([[scores(answer)[label] for label in LABELS] for answer in answers])

    @torch.inference_mode()
    def hf_model(texts: list[str], pairs: list[str] | None) -> torch.Tensor:
        pipe.model.eval()
        rows = []
        for i in input_batches(texts):
            batch = [texts[i : i + BATCH_SIZE]] + ([] if pairs is None else [pairs[i : i + BATCH_SIZE]])
            inputs = pipe.tokenizer(
                *batch, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt"
            )
            rows.append(pipe.model(**inputs.to(bench.device)).logits.float().softmax(-1).cpu())
        return torch.cat(rows)

    return {
        "bertforge": bertforge,
        "bertforge_input_order": bertforge_input_order,
        "hf": pipeline,
        "hf_model": hf_model,
    }


def input_batches(texts: list[str]) -> range:
    """The first index of each batch of `BATCH_SIZE` texts in input order."""
    return range(0, len(texts), BATCH_SIZE)


def scores(answer: list[dict]) -> dict[str, float]:
    """The pipeline's answer for one text (`top_k=None`: every label's) as label -> probability."""
    return {entry["label"]: entry["score"] for entry in answer}


def run(data: Path, bench: Bench) -> list[dict]:
    """One row per workload (`measure`)."""
    labelling = contenders(bench)
    return [measure(task, data, labelling, bench) for task in WORKLOADS]


def measure(task: str, data: Path, labelling: dict, bench: Bench) -> dict:
    """Texts/s of each contender on `task`'s dev texts, bertforge's speed-ups and the largest
    difference in a probability."""
    texts, pairs = workload(task, data, bench.quick)
    bench.log(f"infer: {len(texts)} {WORKLOADS[task]}")
    answers: dict[str, torch.Tensor] = {}
    passes = {
        name: answering(answers, name, contender, texts, pairs) for name, contender in labelling.items()
    }
    seconds = interleaved(passes, 1, QUICK_ROUNDS if bench.quick else ROUNDS, 1, bench.device).seconds
    ours = seconds["bertforge"]
    return {
        "workload": WORKLOADS[task],
        "texts": len(texts),
        "batch": BATCH_SIZE,
        "max_length": MAX_LENGTH,
        **{f"{name}_texts_per_s": len(texts) / statistics.median(times) for name, times in seconds.items()},
        "speedup": median_ratio(seconds["hf"], ours),
        "speedup_over_model": median_ratio(seconds["hf_model"], ours),
        "speedup_over_input_order": median_ratio(seconds["bertforge_input_order"], ours),
        "largest_probability_difference": max(
            float((answers[name] - answers["bertforge"]).abs().max()) for name in answers
        ),
    }


def answering(answers: dict, name: str, contender, texts: list[str], pairs: list[str] | None):
    """One timed pass of `contender` over the texts, keeping its answer as `answers[name]`."""

    def one_pass() -> None:
        answers[name] = contender(texts, pairs)

    return one_pass


def lines(rows: list[dict], table) -> list[str]:
    """The report's lines for the inference rows."""
    return [
        "",
        f"(7) inference: bertforge classify against transformers' text-classification pipeline and its model "
        f"called directly, the same classifier, {BATCH_SIZE} texts a pass, cut at {MAX_LENGTH} tokens",
        table(
            {
                "workload": lambda r: r["workload"],
                "texts": lambda r: r["texts"],
                "bertforge texts/s": lambda r: f"{r['bertforge_texts_per_s']:,.0f}",
                "in input order": lambda r: f"{r['bertforge_input_order_texts_per_s']:,.0f}",
                "HF pipeline texts/s": lambda r: f"{r['hf_texts_per_s']:,.0f}",
                "HF model texts/s": lambda r: f"{r['hf_model_texts_per_s']:,.0f}",
                "speed-up (pipeline, model, input order)": lambda r: ", ".join(
                    f"{r[key]:.2f}x" for key in ("speedup", "speedup_over_model", "speedup_over_input_order")
                ),
                "largest p difference": lambda r: f"{r['largest_probability_difference']:.1e}",
            },
            rows,
        ),
    ]
