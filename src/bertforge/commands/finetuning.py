"""Commands for classification, regression and tagging: `finetune` (train a classifier or a tagger),
`classify` and `tag` (use one).

Each handler builds its inputs from the arguments (reading the training file's header or first rows
where a default depends on the task) and calls one library function (`bertforge.finetune.finetune`,
with `--compare-scratch` `bertforge.comparison.compare_with_scratch`, `bertforge.classifier.classify`,
`bertforge.tagger.tag`); printing happens here.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from bertforge.commands import (
    add_device_argument,
    add_jobs_argument,
    add_precision_argument,
    add_report_to_argument,
    refuse_with_resume,
    seed_list,
)
from bertforge.config_rules import check_flags, count
from bertforge.errors import BertforgeError
from bertforge.labeled import FORMATS, TASK_TYPES
from bertforge.reporting import reporting_to
from bertforge.tagged import TAGGING

TASK_FLAGS = ("model", "train", "valid", "text_column", "label_column")
COLUMN_FLAGS = ("text_column", "label_column")  # a tagged file's have defaults
# How library errors name what `finetune`'s flags set (`bertforge.cli.in_flags`).
SETTING_FLAGS = {
    "task.epochs": "--epochs",
    "task.format": "--format",
    "task.task_type": "--task",
    "task.seeds": "--seeds",
    "task.from_scratch": "--from-scratch",
    "task.compare_scratch": "--compare-scratch",
    "task.reinit_pooler": "--reinit-pooler",
    "task.both_orders": "--both-orders",
    "task.text_pair_column": "--text-pair-column",
    "task.dropout": "--dropout",
    "data.max_seq_length": "--max-length",
    "train.batch_size": "--batch-size",
    "train.learning_rate": "--lr",
}
RESUME_IGNORES = (
    *TASK_FLAGS,
    *("text_pair_column", "format", "epochs", "lr", "batch_size", "max_length", "from_scratch"),
    "compare_scratch",
    "reinit_pooler",
    "both_orders",
    "task",
    "dropout",
    *("precision", "device", "set"),
)


def register(commands) -> None:
    add_finetune_command(commands)
    add_classify_command(commands)
    add_tag_command(commands)


def add_finetune_command(commands) -> None:
    p = commands.add_parser(
        "finetune",
        help="fine-tune a pretrained model to classify or score texts or text pairs, or to tag words",
        description="Fine-tune a classification head on the pooled [CLS] output (a GPT's: on the last "
        "token's state), and the encoder under it, "
        "with the pretraining loop (AdamW, warmup and linear decay, clipping, precision, checkpoints). "
        "Evaluates after every epoch (accuracy, macro F1, confusion matrix) and keeps the best epoch as "
        "OUT/final/. Files are CSV, TSV (with or without a header row: columns by name or by number "
        "from 0) or JSON lines; labels are strings or integers, or real numbers for a regression (one "
        "output, mean squared error; Pearson and Spearman correlation per epoch, the best epoch by "
        "Pearson). A tagged file (CoNLL: a token and its tag a line, the tag in the last column, a blank "
        "line between sentences; or JSON lines of tokens and tags) trains a head on every word's first "
        "piece (named entities: entity precision, recall and F1 per type each epoch, the best epoch by F1).",
    )
    add_task_arguments(p.add_argument_group("task and data"))
    add_recipe_arguments(p.add_argument_group("recipe"))
    add_seed_arguments(p.add_argument_group("seeds and the from-scratch comparison"))
    add_run_arguments(p.add_argument_group("run"))
    p.set_defaults(handler=run_finetune, setting_flags=SETTING_FLAGS)


def add_task_arguments(group) -> None:
    """The model, the data files, their columns and format, the task and --out."""
    group.add_argument(
        "--model", type=Path, help="a pretrained model: run folder, its final/, a checkpoint, or export"
    )
    group.add_argument("--train", type=Path, help="labelled training examples (.csv, .tsv, .jsonl, CoNLL)")
    group.add_argument("--valid", type=Path, help="labelled validation examples, evaluated after every epoch")
    group.add_argument(
        "--text-column", help="the column (or JSON field) holding the text (tagged: the tokens)"
    )
    group.add_argument("--text-pair-column", help="the column holding the second text of a pair (segment 1)")
    group.add_argument(
        "--label-column", help="the column holding the label (tagged: the tags; CoNLL default the last)"
    )
    group.add_argument("--format", choices=FORMATS, help="default: from the file name")
    group.add_argument(
        "--task",
        choices=(*TASK_TYPES, TAGGING),
        help="regression: real-valued labels, one output and the squared error; ner: a tag per word "
        "(default auto: ner for a tagged file, a regression when every label is a number and some are "
        "not whole numbers, such as 3.8)",
    )
    group.add_argument("--out", type=Path, required=True, help="run folder (must be new unless --resume)")


def add_recipe_arguments(group) -> None:
    """The fine-tuning recipe: epochs, learning rate, batch size, length, pooler, pair orders, dropout."""
    group.add_argument(
        "--epochs", type=int, help="passes over the training data (default 3; pairs 4, in both orders 2)"
    )
    group.add_argument(
        "--lr",
        type=float,
        help="peak learning rate (default by the model's hidden size: 3e-4 up to 256, "
        "1e-4 up to 512, else 5e-5; with --text-pair-column at most 1e-4, scored pairs 2e-4)",
    )
    group.add_argument("--batch-size", type=int, help="examples per optimizer step (default 32; pairs 16)")
    group.add_argument(
        "--max-length",
        type=int,
        help="tokens per example, longer ones truncated (tagged: split into windows; default 128)",
    )
    group.add_argument(
        "--reinit-pooler",
        action="store_true",
        help="leave out the pretrained pooler ([CLS] dense + tanh, which NSP trains): it starts fresh",
    )
    group.add_argument(
        "--both-orders",
        action="store_true",
        help="also train on each pair with its two texts swapped, for pairs that mean the same either "
        "way (paraphrase, similarity: glue's STS-B recipe); the default epochs halve, the steps stay",
    )
    group.add_argument(
        "--dropout",
        type=float,
        help="hidden and attention dropout while fine-tuning (default: the pretrained model's; for one "
        "pretrained without dropout 0.1, sentence pairs 0)",
    )


def add_seed_arguments(group) -> None:
    """Seeds, a from-scratch run and the paired comparison with one."""
    group.add_argument(
        "--seeds", type=seed_list, help="run once per seed (OUT/seed_N/) and report median and spread"
    )
    group.add_argument(
        "--from-scratch", action="store_true", help="same architecture and tokenizer, random init"
    )
    group.add_argument(
        "--compare-scratch",
        action="store_true",
        help="with --seeds: per seed, fine-tune --model and the same model from scratch (OUT/pretrained/, "
        "OUT/scratch/) and compare them with paired tests (OUT/comparison.json)",
    )


def add_run_arguments(group) -> None:
    """Arithmetic, device, runs at once, other settings, resume, progress and reporting."""
    add_precision_argument(group)
    add_device_argument(group, default=None)
    add_jobs_argument(group, "the seeds' runs (--seeds, --compare-scratch)")
    group.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a train or runtime setting, or data.max_seq_length (not the steps, minutes and "
        "evaluation intervals: --epochs sets those)",
    )
    group.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out with its saved settings (with --seeds: add seeds to it)",
    )
    group.add_argument("--quiet", action="store_true", help="no progress bars")
    add_report_to_argument(group)


def add_classify_command(commands) -> None:
    p = commands.add_parser(
        "classify",
        help="label texts with a fine-tuned classifier (or score them with a regression model)",
        description="Print each text's label and its probability (--json: every label's); for a "
        "regression model, each text's score. For a model fine-tuned on text pairs, separate the two "
        "texts with a tab; texts unlike those it was fine-tuned on (pairs or single texts), or longer "
        "than the length it was fine-tuned at (only their first tokens are read), draw a warning.",
    )
    p.add_argument("text", nargs="*", help="texts to classify")
    p.add_argument(
        "--model", type=Path, required=True, help="a fine-tuning run folder, its final/, or an export"
    )
    p.add_argument("--input", type=Path, help="a UTF-8 file with one text (or text<TAB>pair) per line")
    p.add_argument("--json", action="store_true", help="one JSON object per text")
    add_device_argument(p)
    p.add_argument("--batch-size", type=int, default=64, help="texts per forward pass")
    p.set_defaults(handler=run_classify)


def add_tag_command(commands) -> None:
    p = commands.add_parser(
        "tag",
        help="find the named entities in texts with a fine-tuned tagger",
        description="Print each text's entities: type, character offsets (start-end) and score (the mean "
        "probability of its words' tags); --json: one object per text with its entities and every "
        "word's tag. Texts are split into words as CoNLL-2003 writes them (at spaces, punctuation apart "
        'at a word\'s edges: "U.S." and "O\'Neil" are one word); a text longer than the '
        "model's length is tagged in windows.",
    )
    p.add_argument("text", nargs="*", help="texts to tag")
    p.add_argument("--model", type=Path, required=True, help="a tagging run folder, its final/, or an export")
    p.add_argument("--input", type=Path, help="a UTF-8 file with one text per line")
    p.add_argument("--json", action="store_true", help="one JSON object per text")
    add_device_argument(p)
    p.add_argument("--batch-size", type=int, default=64, help="windows per forward pass")
    p.set_defaults(handler=run_tag)


def finetune_inputs(args):
    """(task, config) from the arguments, or the saved ones with --resume."""
    from bertforge.config import apply_mapping, apply_overrides
    from bertforge.finetune import FinetuneTask, finetuning_config, read_saved_task, with_more_seeds
    from bertforge.folders import model_width
    from bertforge.labeled import check_data_file
    from bertforge.tagged import CONLL_SUFFIXES, TAGGED_FILE, is_tagged_file

    if args.resume:
        refuse_with_resume(args, RESUME_IGNORES, "the run's saved settings")
        task, config = read_saved_task(args.out)
        return (task if args.seeds is None else with_more_seeds(task, args.seeds)), config
    check_settable(args.set)
    check_flags(args, {"--epochs": count()})
    for path in (args.train, args.valid):
        if path is not None:  # before a tagged file that could not be sniffed asks for columns
            tagged = args.task == TAGGING or Path(path).suffix.lower() in CONLL_SUFFIXES
            check_data_file(path, *([TAGGED_FILE] if tagged else []))
    optional = COLUMN_FLAGS if tagged_task(args) else ()
    missing = [
        f"--{name.replace('_', '-')}"
        for name in TASK_FLAGS
        if getattr(args, name) is None and name not in optional
    ]
    columns = [flag for flag in missing if flag in ("--text-column", "--label-column")]
    chosen_table = args.task in ("classification", "regression") and args.train is not None
    if columns and chosen_table and is_tagged_file(args.train, args.text_column, args.label_column):
        raise BertforgeError(
            f"{args.train} looks like a tagged file (a token and its tag a line), which --task "
            f"{args.task} does not read; drop --task, or give a table with {', '.join(columns)}"
        )
    if missing:
        tagged_hint = ", or --task ner for words tagged one a line" if columns and args.task is None else ""
        raise BertforgeError(
            f"finetune needs {', '.join(missing)} (or --resume to continue a run{tagged_hint})"
        )
    task = FinetuneTask(
        model=str(args.model),
        train=str(args.train),
        valid=str(args.valid),
        text_column=args.text_column,
        label_column=args.label_column,
        text_pair_column=args.text_pair_column,
        format=args.format or "auto",
        epochs=default_epochs(args) if args.epochs is None else args.epochs,
        seeds=args.seeds,
        from_scratch=args.from_scratch,
        compare_scratch=args.compare_scratch,
        reinit_pooler=args.reinit_pooler,
        both_orders=args.both_orders,
        dropout=args.dropout,
        task_type=args.task or "auto",
    )
    pairs = args.text_pair_column is not None
    # whether the pairs are scored decides only the default rate: no need to read the file for a given --lr
    regression = pairs and args.lr is None and scored_pairs(args)
    config = finetuning_config(model_width(args.model), pairs, regression=regression)
    flags = {
        "train": {"learning_rate": args.lr, "batch_size": args.batch_size},
        "data": {"max_seq_length": args.max_length},
        "runtime": {"precision": args.precision, "device": args.device},
    }
    apply_mapping(
        config,
        {section: {k: v for k, v in values.items() if v is not None} for section, values in flags.items()},
        origin="command line",
    )
    apply_overrides(config, args.set)
    return task, config


PRETRAINING_ONLY = ("train.embedding_init", "train.mlm_bias_init")  # how a pretraining run's weights start


def check_settable(overrides: list[str]) -> None:
    """Refuse a `--set` that fine-tuning would ignore, rather than train as if it were taken."""
    from bertforge.finetune import EPOCH_SETTINGS

    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key.startswith(("model.", "tokenizer.")):
            raise BertforgeError(f"--set {item}: the model and tokenizer settings come from --model")
        if key in EPOCH_SETTINGS:  # `finetune.set_epochs` sets them from --epochs
            raise BertforgeError(
                f"--set {item}: finetune trains whole epochs and evaluates and checkpoints after each; "
                "set --epochs instead"
            )
        if key in PRETRAINING_ONLY:
            raise BertforgeError(
                f"--set {item}: the encoder's weights come from --model; {key} starts a pretraining"
            )
        if key.startswith("data.") and key != "data.max_seq_length":
            raise BertforgeError(
                f"--set {item}: of the data settings finetune reads data.max_seq_length (--max-length) only"
            )


def default_epochs(args) -> int:
    """3 (Devlin et al.'s), for sentence pairs GLUE's pair recipe's `PAIR_EPOCHS`, for pairs in both
    orders `BOTH_ORDERS_EPOCHS` (the same steps)."""
    from bertforge.finetune import BOTH_ORDERS_EPOCHS, PAIR_EPOCHS, FinetuneTask

    if args.text_pair_column is None:
        return FinetuneTask.epochs
    return BOTH_ORDERS_EPOCHS if args.both_orders else PAIR_EPOCHS


def scored_pairs(args) -> bool:
    """Whether the pairs' labels are real-valued scores: `--task regression`, or by default what the
    training file's labels say (`labeled.task_type`)."""
    from bertforge.labeled import read_labeled, task_type

    if args.task not in (None, "auto"):
        return args.task == "regression"
    columns = (args.text_column, args.label_column)
    if None in columns:
        return False  # finetune names the missing column
    file_format = args.format or "auto"
    train = read_labeled(args.train, *columns, text_pair_column=args.text_pair_column, format=file_format)
    return task_type(train) == "regression"


def tagged_task(args) -> bool:
    """`--task ner`, or no --task (or auto) and a training file that looks tagged."""
    from bertforge.tagged import is_tagged_file

    detected = (
        args.task in (None, "auto")
        and args.train is not None
        and is_tagged_file(args.train, args.text_column, args.label_column)
    )
    return args.task == TAGGING or detected


def run_finetune(args) -> int:
    from bertforge.finetune import METRICS, finetune, result_kind
    from bertforge.folders import refuse_glue_part
    from bertforge.progress import duration, metrics_text, plural

    if args.resume:
        refuse_glue_part(args.out)
    task, config = finetune_inputs(args)
    if (args.jobs or 1) > 1 and not task.seeds and not task.compare_scratch:
        warnings.warn(
            f"--jobs {args.jobs} has one run to train, which trains alone; --jobs trains the runs of "
            "--seeds or --compare-scratch at once",
            stacklevel=2,
        )
    with reporting_to(args.out, args.report_to):
        if task.compare_scratch:
            return run_comparison(args, task, config)
        summary = finetune(
            task, config, args.out, resume=args.resume, show_progress=not args.quiet, jobs=args.jobs
        )
    if args.resume and summary["this_invocation"]["runs_trained"] == 0:
        runs = f"{len(summary['runs'])} runs" if len(summary["runs"]) > 1 else "run"
        print(f"\nthe {runs} had already finished; nothing was trained")
    for run in summary["runs"]:
        epochs = f"{run['epochs']} {plural('epoch', run['epochs'])}"
        trained = f"{epochs} ({run['steps']:,} steps) in {duration(run['elapsed_s'])}"
        print(
            f"\nseed {run['seed']}: {trained}; best epoch {run['best_epoch']}, held-out: "
            + metrics_text(run["best"])
        )
    kind = result_kind(summary["runs"][0])
    if task.seeds:
        print()
        for name in METRICS[kind][:2]:
            stats = summary[name]
            print(
                f"{name}: median {stats['median']:.4f}, range {stats['min']:.4f}-{stats['max']:.4f} "
                f"(spread {stats['spread']:.4f}) over {len(task.seeds)} seeds"
            )
        print(f"time:     {time_line(summary, len(task.seeds))}")
        print(f"summary:  {args.out / 'summary.json'}")
    else:
        run = summary["runs"][0]
        if kind == "classification":
            print(confusion_text(run["labels"], run["confusion"]))
        if kind == TAGGING:
            print(entity_table(run["per_type"]))
        print(f"model:    {args.out / 'final'}")
        print(f"plots:    {args.out / 'curves.png'}")
        print(f"metrics:  {args.out / 'metrics.jsonl'}")
    return 0


def run_comparison(args, task, config) -> int:
    from bertforge.comparison import COMPARISON, compare_with_scratch

    comparison = compare_with_scratch(
        task, config, args.out, resume=args.resume, show_progress=not args.quiet, jobs=args.jobs
    )
    print()
    print(comparison_table(comparison))
    print(f"time:        {time_line(comparison, 2 * len(task.seeds))}")
    print(f"runs:        {args.out / 'pretrained'}, {args.out / 'scratch'}")
    print(f"comparison:  {args.out / COMPARISON}")
    return 0


def time_line(summary: dict, runs: int) -> str:
    """The runs' time: their own clocks, and with several at once the wall time too."""
    line = f"{summary['elapsed_s'] / 60:.1f} min for {runs} runs"
    now = summary["this_invocation"]
    jobs, share = now["jobs"], now["threads_per_run"]
    if jobs > 1:
        line += (
            f" by the runs' clocks ({now['wall_s'] / 60:.1f} min this invocation), {jobs} at a time, "
            f"{share} thread{'s' * (share > 1)} each"
        )
    return line


def majority_line(comparison: dict, majority: float) -> str:
    """The majority class's accuracy, and which arms' medians do not beat it."""
    behind = [arm for arm in ("pretrained", "scratch") if comparison[arm]["median"] <= majority]
    verdict = {0: "both arms beat it", 1: f"the {''.join(behind)} arm does not beat it"}.get(
        len(behind), "neither arm beats it: both answer as a constant would"
    )
    return f"majority class (the most frequent validation label for every example): {majority:.4f}; {verdict}"


def comparison_table(comparison: dict) -> str:
    """Per-seed accuracies (a regression: Pearson's r) of both arms and their difference, each column's
    median and range, and the two paired tests."""
    from bertforge.comparison import SEEDS_FOR_A_CLAIM, few_seeds_note

    columns = ("pretrained", "scratch", "difference")
    formats = (".4f", ".4f", "+.4f")

    def row(name, values) -> str:
        return f"{name:<8}" + "".join(
            f"{format(value, spec):>20}" for value, spec in zip(values, formats, strict=True)
        )

    lines = [f"the best epoch's validation {comparison['metric']}, per seed:"]
    lines.append(f"{'seed':<8}" + "".join(f"{name:>20}" for name in columns))
    lines += [row(str(pair["seed"]), [pair[name] for name in columns]) for pair in comparison["pairs"]]
    lines.append(row("median", [comparison[name]["median"] for name in columns]))
    ranges = [
        f"{comparison[n]['min']:{f}} to {comparison[n]['max']:{f}}"
        for n, f in zip(columns, formats, strict=True)
    ]
    lines.append(f"{'range':<8}" + "".join(f"{r:>20}" for r in ranges))
    sign, boot = comparison["sign_test"], comparison["bootstrap"]
    lines.append(
        f"sign test over seeds (exact, two-sided): pretrained better on {sign['wins']}, worse on "
        f"{sign['losses']}, {sign['ties']} ties dropped: p = {sign['p_value']:.4f}"
    )
    lines.append(
        f"paired bootstrap over {boot['examples']:,} validation {boot.get('unit', 'examples')} "
        f"({boot['resamples']:,} resamples): "
        f"gain {boot['gain']:+.4f}, {boot['confidence']:.0%} interval {boot['low']:+.4f} to "
        f"{boot['high']:+.4f}, p {format_p(boot['p_value'], boot['resamples'])}"
    )
    if (majority := comparison.get("majority_class")) is not None:
        lines.append(majority_line(comparison, majority))
    if len(comparison["seeds"]) < SEEDS_FOR_A_CLAIM:
        lines.append(f"note: {few_seeds_note(len(comparison['seeds']))}")
    return "\n".join(lines)


def format_p(p_value: float, resamples: int) -> str:
    """`= p`, or `< 2/resamples` when no resample crossed zero (the bootstrap's resolution)."""
    return f"< {2 / resamples:.4g}" if p_value == 0 else f"= {p_value:.4f}"


def confusion_text(labels: list[str], matrix: list[list[int]]) -> str:
    """The confusion matrix as a table: a row per true label, a column per predicted label."""
    width = max(max(len(label) for label in labels), max(len(str(n)) for row in matrix for n in row), 4)
    lines = ["confusion (rows: true label, columns: predicted):"]
    lines.append(" " * (width + 2) + " ".join(f"{label:>{width}}" for label in labels))
    for label, row in zip(labels, matrix, strict=True):
        lines.append(f"{label:>{width}}  " + " ".join(f"{n:>{width}}" for n in row))
    return "\n".join(lines)


def entity_table(per_type: dict[str, dict]) -> str:
    """The best epoch's entity precision, recall and F1 per type, with each type's true entities."""
    width = max([len(kind) for kind in per_type] + [6])
    lines = [f"{'entity':<{width}}  precision  recall      f1  support"]
    for kind, scores in per_type.items():
        lines.append(
            f"{kind:<{width}}  {scores['precision']:>9.4f}  {scores['recall']:>6.4f}  {scores['f1']:>6.4f}"
            f"  {scores['support']:>7,}"
        )
    return "\n".join(lines)


def classify_inputs(args) -> list[str]:
    from bertforge.labeled import read_lines

    if bool(args.text) == (args.input is not None):
        raise BertforgeError(
            f"give texts to {args.command}, or --input FILE with one text per line (not both)"
        )
    if args.input is None:
        for number, text in enumerate(args.text, 1):
            if not text.strip():
                raise BertforgeError(
                    f"text {number} of {len(args.text)} is empty; give texts with words in them"
                )
        return args.text
    return read_lines(args.input, "one text per line")


def opened_on_device(args, opener):
    """The texts of the arguments, and the model (on --device, reading the length it was fine-tuned
    at), tokenizer and labels of the folder `opener` reads from --model."""
    from bertforge.runtime import resolve_device

    check_flags(args, {"--batch-size": count()})
    texts = classify_inputs(args)
    model, tokenizer, labels, _ = opener(args.model)
    return texts, model.to(resolve_device(args.device)), tokenizer, labels


def run_classify(args) -> int:
    from bertforge.classifier import classify, read_pairs, warn_unlike_training
    from bertforge.folders import find_model_folder, open_classifier

    texts, model, tokenizer, labels = opened_on_device(args, open_classifier)
    firsts, pairs = zip(*[(text.split("\t", 1) + [None])[:2] for text in texts], strict=True)
    warn_unlike_training(read_pairs(find_model_folder(args.model, classifier=True).path), pairs)
    results = classify(model, tokenizer, labels, list(firsts), list(pairs), batch_size=args.batch_size)
    for text, result in zip(texts, results, strict=True):
        if args.json:
            print(json.dumps({"text": text, **result}))
        elif "label" in result:
            print(f"{result['label']}\t{result['score']:.4f}\t{text}")
        else:  # a regression model's score
            print(f"{result['score']:.4f}\t{text}")
    return 0


def run_tag(args) -> int:
    from bertforge.folders import open_tagger
    from bertforge.tagger import tag

    texts, model, tokenizer, labels = opened_on_device(args, open_tagger)
    results = tag(model, tokenizer, labels, texts, batch_size=args.batch_size)
    for text, result in zip(texts, results, strict=True):
        if args.json:
            print(json.dumps({"text": text, **result}))
            continue
        print(text)
        for entity in result["entities"]:
            offsets = f"{entity['start']}-{entity['end']}"
            print(f"  {entity['entity']:<6} {offsets:>9}  {entity['score']:.4f}  {entity['text']}")
        if not result["entities"]:
            print("  (no entities)")
    return 0
