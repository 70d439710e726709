"""(6) Token classification's wall time: `bertforge finetune` of BERT-Mini on all of CoNLL-2003 train
(14,041 sentences) for 3 epochs, scored on dev after each, against its target of 10 minutes on 2
CPU cores.

The time does not depend on the weights, so without `--ner-model RUN` the model is BERT-Mini
(the "mini" preset) from random weights with the 30,522-piece WordPiece vocabulary of WikiText-2
train (cached); with it, that pretrained model, whose dev F1 then means something. `--quick`
instead fine-tunes the tiny preset for one epoch on the first 500 training sentences, scored on the
first 100 dev sentences. The benchmark folder is temporary.

Reported: the wall minutes of the whole `finetune` call (the target's measure: reading and
tokenizing the data, training, the evaluations after each epoch, writing the run), the minutes on
the run's own clock (training and evaluation), and the best epoch's entity F1 on dev.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from benchmarks.common import Bench, model_config
from benchmarks.data import wikitext
from bertforge.cache import cached_tokenizer
from bertforge.checkpoint import save_model_folder
from bertforge.config import RunConfig, TokenizerConfig
from bertforge.errors import BertforgeError
from bertforge.finetune import FinetuneTask, finetune, finetuning_config
from bertforge.folders import find_model_folder, model_width
from bertforge.model import BertForPreTraining

CONLL_DATA = os.environ.get(
    "BERTFORGE_CONLL", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "conll2003")
)
EPOCHS = 3
TARGET_MINUTES = 10.0
QUICK_SENTENCES = {"train.txt": 500, "dev.txt": 100}
QUICK_SAID = "--quick: the tiny preset, 1 epoch on the first 500 training sentences, 100 dev sentences"


def refusal(model: Path | None, data: Path) -> str | None:
    """Why the ner entry cannot run with these arguments (checked before the suite starts), or None."""
    try:
        if model is not None:
            find_model_folder(model)
    except BertforgeError as error:
        return str(error)
    missing = [name for name in QUICK_SENTENCES if not (Path(data) / name).is_file()]
    if missing:
        return (
            f"{data} holds no CoNLL-2003 {' or '.join(missing)}; give --ner-data or set BERTFORGE_CONLL to "
            "the folder holding train.txt and dev.txt"
        )
    return None


def random_model(bench: Bench) -> Path:
    """BERT-Mini (tiny for --quick) from random weights, with WikiText-2's 30,522-piece vocabulary."""
    tokenizer = cached_tokenizer(
        [wikitext("train", bench.quick, bench.workdir)], TokenizerConfig(), "wikitext", bench.cache_dir
    )
    config = RunConfig()
    config.model = model_config("tiny" if bench.quick else "mini", tokenizer.vocab_size)
    config.tokenizer.vocab_size = tokenizer.vocab_size
    out = bench.workdir / "ner-model"
    save_model_folder(out, BertForPreTraining(config.model), tokenizer, config)
    return out


def sliced(data: Path, out: Path) -> Path:
    """A folder holding the first sentences of train.txt and dev.txt (one blank line after each)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, count in QUICK_SENTENCES.items():
        lines, ended = [], 0
        for line in (Path(data) / name).read_text(encoding="utf-8").split("\n"):
            lines.append(line)
            ended += not line.strip()
            if ended == count:
                break
        (out / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def run(model: Path | None, data: Path, bench: Bench) -> dict:
    given = model is not None
    model = model if given else random_model(bench)
    data = sliced(data, bench.workdir / "ner-data") if bench.quick else Path(data)
    epochs = 1 if bench.quick else EPOCHS
    task = FinetuneTask(str(model), str(data / "train.txt"), str(data / "dev.txt"), None, None, epochs=epochs)
    config = finetuning_config(model_width(model))  # finetune's defaults, as a user gets them
    config.runtime.device = str(bench.device)
    if bench.quick:
        config.runtime.precision = "fp32"
    bench.log(f"ner: fine-tuning {model} on {data} for {epochs} epoch{'s' * (epochs > 1)}")
    start = time.perf_counter()
    summary = finetune(task, config, bench.workdir / "ner", show_progress=not bench.quick)
    minutes = (time.perf_counter() - start) / 60
    run = summary["runs"][0]
    return {
        "model": str(model) if given else f"{'tiny' if bench.quick else 'mini'} from random weights",
        "data": str(data),
        "workload": QUICK_SAID if bench.quick else f"all of train.txt, {EPOCHS} epochs, batch 32, 128 tokens",
        "epochs": epochs,
        "steps": run["steps"],
        "wall_minutes": minutes,
        "fine_tuning_minutes": run["elapsed_s"] / 60,
        "target_minutes": TARGET_MINUTES,
        "target_met": None if bench.quick else minutes <= TARGET_MINUTES,  # quick is not its workload
        "dev_f1": run["best"]["f1"],
        "best_epoch": run["best_epoch"],
    }


def lines(result: dict) -> list[str]:
    verdict = {True: "met", False: "NOT met", None: "not judged (--quick is not its workload)"}
    return [
        "",
        f"(6) ner: bertforge finetune on CoNLL-2003, {result['workload']}; model {result['model']}",
        f"wall: {result['wall_minutes']:.1f} min for {result['steps']:,} steps (on the run's clock "
        f"{result['fine_tuning_minutes']:.1f}); target <= {result['target_minutes']:g} min on 2 CPU cores: "
        f"{verdict[result['target_met']]}",
        f"dev entity F1 of the best epoch ({result['best_epoch']}): {result['dev_f1']:.4f}",
    ]
