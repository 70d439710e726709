"""Commands for pretraining: `tokenizer train`, `prepare`, `pretrain` and `evaluate`."""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import shlex
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from bertforge.commands import (
    add_device_argument,
    add_model_text_column_argument,
    add_precision_argument,
    add_report_to_argument,
)
from bertforge.config import (
    EXPLICIT_PRECISIONS,
    OBJECTIVES,
    PRESETS,
    TOKENIZER_KINDS,
    RunConfig,
    TokenizerConfig,
    apply_mapping,
    apply_objective,
    apply_overrides,
    apply_preset,
    drop_pairs_for_a_gpt,
    load_toml,
    objective_named,
    validate,
)
from bertforge.corpus import DEFAULT_TEXT_COLUMN, FORMATS
from bertforge.errors import BertforgeError
from bertforge.io import building_new_folder, check_new_folder
from bertforge.reporting import reporting_to
from bertforge.signals import StoppedEarly, signal_of

FORMAT_HELP = (
    "corpus format (default auto: .parquet, .tsv, .tab and .csv files by their ending, through a .gz too, "
    "others from their text; tsv, csv and conll read a labelled file's text)"
)
TEXT_COLUMN_HELP = (
    f'the JSON-lines field, or Parquet, TSV or CSV column holding the text (default "{DEFAULT_TEXT_COLUMN}"; '
    "a table's several: a,b)"
)
# How library errors name what these commands' flags set (`bertforge.cli.in_flags`). `pretrain` keeps
# the names that config validation uses (data.format, runtime.precision): a bad value there came from
# --set or --config, since argparse checks the flags' own values.
CORPUS_FLAGS = {"data.corpus": "--corpus", "data.shards": "--shards", "data.text_column": "--text-column"}
READER_FLAGS = {**CORPUS_FLAGS, "data.format": "--format"}
TOKENIZER_FLAGS = {
    **READER_FLAGS,
    "tokenizer.vocab_size": "--vocab-size",
    "tokenizer.min_frequency": "--min-freq",
}
EVALUATE_FLAGS = {**READER_FLAGS, "runtime.precision": "--precision", "`max_length`": "--max-length"}


def register(commands) -> None:
    add_tokenizer_command(commands)
    add_prepare_command(commands)
    add_pretrain_command(commands)
    add_evaluate_command(commands)


def add_tokenizer_command(commands) -> None:
    tokenizer = commands.add_parser("tokenizer", help="train a vocabulary on a corpus")
    actions = tokenizer.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser(
        "train",
        help="learn a WordPiece or word-level vocabulary",
        description="Learn a vocabulary; specials [PAD] [UNK] [CLS] [SEP] [MASK] get ids 0-4.",
    )
    p.add_argument(
        "--corpus",
        nargs="+",
        action="extend",
        required=True,
        help="files to learn from: files, folders or quoted glob patterns (.gz and .parquet included); "
        "repeat or list several",
    )
    p.add_argument(
        "--kind",
        choices=TOKENIZER_KINDS,
        default=TokenizerConfig.kind,
        help="the vocabulary's model (default %(default)s)",
    )
    p.add_argument(
        "--vocab-size", type=int, default=TokenizerConfig.vocab_size, help="pieces (default %(default)s)"
    )
    p.add_argument(
        "--min-freq",
        type=int,
        default=TokenizerConfig.min_frequency,
        help="minimum word frequency (default %(default)s)",
    )
    p.add_argument("--cased", action="store_true", help="keep case and accents (default: lower-case)")
    p.add_argument("--format", default="auto", choices=FORMATS, help=FORMAT_HELP)
    p.add_argument("--text-column", default=DEFAULT_TEXT_COLUMN, help=TEXT_COLUMN_HELP)
    p.add_argument("--out", type=Path, required=True, help="folder for tokenizer.json and vocab.txt")
    p.set_defaults(handler=run_tokenizer_train, setting_flags=TOKENIZER_FLAGS)


def add_prepare_command(commands) -> None:
    p = commands.add_parser(
        "prepare",
        help="tokenize a corpus into memory-mapped shards",
        description="Tokenize once into flat token shards with sentence and document offsets; "
        "`pretrain --shards` trains on them.",
    )
    p.add_argument(
        "--corpus",
        type=Path,
        action="append",
        required=True,
        help="one corpus file; prepare each corpus into its own folder, and give `pretrain --shards` once "
        "per folder",
    )
    p.add_argument("--tokenizer", type=Path, required=True, help="a folder written by `tokenizer train`")
    p.add_argument("--format", default="auto", choices=FORMATS, help=FORMAT_HELP)
    p.add_argument("--text-column", default=DEFAULT_TEXT_COLUMN, help=TEXT_COLUMN_HELP)
    p.add_argument("--out", type=Path, required=True, help="a new folder for the shards")
    p.set_defaults(handler=run_prepare, setting_flags=READER_FLAGS)


def add_pretrain_command(commands) -> None:
    p = commands.add_parser(
        "pretrain",
        help="pretrain a BERT with MLM + NSP (or a GPT-1, --objective clm) from raw text",
        description="Train the tokenizer and shards when missing (cached by content), then pretrain. "
        "Settings apply in order: defaults, --preset, --objective, --config, flags, --set.",
    )
    add_training_text_arguments(p)
    p.add_argument("--out", type=Path, required=True, help="run folder (must be new unless --resume)")
    add_starting_point_arguments(p)
    add_setting_arguments(p)
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument(
        "--allow-changed-data",
        action="store_true",
        help="with --resume: continue although the corpus or validation text changed since the run started",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        help="tokenizer and shard cache (default $BERTFORGE_CACHE, else ~/.cache/bertforge)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_report_to_argument(p)
    p.set_defaults(handler=run_pretrain, setting_flags=CORPUS_FLAGS)


def add_training_text_arguments(p) -> None:
    """pretrain's --corpus or --shards, and --valid."""
    p.add_argument(
        "--corpus",
        action="append",
        help="training text: a file (WikiText, plain text, JSON lines, Parquet; .gz read as it is), a "
        "folder (every file in it) or a quoted glob pattern; repeat to train on several corpora",
    )
    p.add_argument(
        "--shards",
        action="append",
        metavar="DIR",
        help="train on a folder of token shards written by `bertforge prepare` instead of --corpus, "
        "with the --tokenizer that prepared it; repeat for several folders",
    )
    p.add_argument("--valid", type=Path, help="held-out text for evaluation")


def add_starting_point_arguments(p) -> None:
    """pretrain's settings before the flags (--preset, --objective, --config, --set) and the
    tokenizer or model it starts from."""
    p.add_argument("--preset", choices=tuple(PRESETS), help="model size after Turc et al. 2019")
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        help="mlm (default): BERT, masked LM + NSP; clm: GPT-1, next-token prediction on packed text "
        "(model.objective; applied after --preset, before --config)",
    )
    p.add_argument(
        "--config", type=Path, help="a TOML file with [model] [tokenizer] [data] [train] [runtime]"
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a setting"
    )
    p.add_argument("--tokenizer", type=Path, help="use this tokenizer instead of training one")
    p.add_argument(
        "--init",
        type=Path,
        help="start from this model (a bertforge model, or one from import-hf or export); its size and "
        "tokenizer replace any other model settings",
    )


def add_setting_arguments(p) -> None:
    """pretrain's flags that set one setting each (`--set` sets any)."""
    p.add_argument("--format", choices=FORMATS, help=FORMAT_HELP)
    p.add_argument("--text-column", help=TEXT_COLUMN_HELP)
    p.add_argument("--max-steps", type=int, help="optimizer steps (train.max_steps)")
    p.add_argument("--max-minutes", type=float, help="time budget; the LR schedule ends when it runs out")
    p.add_argument("--batch-size", type=int, help="sequences per optimizer step (train.batch_size)")
    p.add_argument("--lr", type=float, help="peak learning rate (train.learning_rate)")
    add_precision_argument(p)
    add_device_argument(p, default=None)
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--no-nsp",
        action="store_true",
        help="MLM only (data.nsp=false): the text in whole windows, which run on across documents",
    )


def add_evaluate_command(commands) -> None:
    p = commands.add_parser(
        "evaluate",
        help="held-out MLM and NSP (or a GPT's next-token) metrics of a saved model",
        description="Evaluate at a fixed 15% mask with fixed seeds: MLM loss, perplexity, MLM accuracy, "
        "NSP loss and NSP accuracy; for a GPT, next-token loss, perplexity and accuracy on fixed windows.",
    )
    p.add_argument(
        "--model", type=Path, required=True, help="a run folder, final/, checkpoint or exported folder"
    )
    p.add_argument("--corpus", type=Path, required=True, help="held-out text (the run's --valid)")
    p.add_argument("--format", default="auto", choices=FORMATS, help=FORMAT_HELP)
    p.add_argument(
        "--max-pairs",
        type=int,
        help="evaluate at most this many pairs or GPT windows; 0: all of them (default: the model's)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        help="tokens per pair (default: the model's training length); "
        "to compare runs trained at different lengths",
    )
    p.add_argument(
        "--nsp",
        action=argparse.BooleanOptionalAction,
        help="evaluate on NSP sentence pairs (--nsp) or contiguous windows (--no-nsp); default: the kind "
        "the model trained on. To compare a model trained with NSP and one without on the same sequences",
    )
    add_model_text_column_argument(p)
    add_device_argument(p)
    p.add_argument(
        "--precision",
        default="auto",
        choices=("auto", *EXPLICIT_PRECISIONS),
        help="auto: the GPU's mixed precision on CUDA, fp32 on a CPU",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--cache-dir",
        type=Path,
        help="tokenized text cache (default $BERTFORGE_CACHE, else ~/.cache/bertforge)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress")
    p.set_defaults(handler=run_evaluate, setting_flags=EVALUATE_FLAGS)


def run_tokenizer_train(args) -> int:
    from bertforge.corpus import resolve_corpus_files
    from bertforge.tokenizer import train_tokenizer, vocabulary_size_text

    config = TokenizerConfig(
        kind=args.kind, vocab_size=args.vocab_size, min_frequency=args.min_freq, lowercase=not args.cased
    )
    validate(RunConfig(tokenizer=config))
    check_new_folder(args.out)
    files = resolve_corpus_files(args.corpus)
    with building_new_folder(args.out), nothing_kept_on_ctrl_c(args.out):
        tokenizer = train_tokenizer(files, config, args.out, format=args.format, text_column=args.text_column)
    print(f"tokenizer: {vocabulary_size_text(tokenizer, config)} written to {args.out}")
    return 0


def run_prepare(args) -> int:
    from bertforge.shards import prepare_shards
    from bertforge.tokenizer import load_given_tokenizer

    pattern = (
        len(args.corpus) == 1 and not Path(args.corpus[0]).exists() and glob.has_magic(str(args.corpus[0]))
    )
    if len(args.corpus) > 1 or pattern:
        raise BertforgeError(
            "prepare takes one --corpus file, not a pattern; prepare each corpus file into its own folder "
            "and give `pretrain --shards` once per folder"
        )
    check_new_folder(args.out)
    with nothing_kept_on_ctrl_c(args.out):
        meta = prepare_shards(
            args.corpus[0],
            load_given_tokenizer(args.tokenizer),
            args.out,
            format=args.format,
            text_column=args.text_column,
        )
    print(
        f"shards: {meta['num_documents']:,} documents, {meta['num_sentences']:,} sentences, "
        f"{meta['num_tokens']:,} tokens written to {args.out}"
    )
    shards, tokenizer = shlex.quote(str(args.out)), shlex.quote(str(args.tokenizer))
    print(f"train on them with: bertforge pretrain --shards {shards} --tokenizer {tokenizer} --out RUN")
    return 0


@contextlib.contextmanager
def nothing_kept_on_ctrl_c(out: Path) -> Iterator[None]:
    """Ctrl-C in the block (a command that writes `out` whole, or not at all) says so, and to run the
    command again: there is nothing to resume."""
    try:
        yield
    except KeyboardInterrupt as stop:
        then = "nothing of it was kept: run the same command again"
        raise StoppedEarly(signal_of(stop), f"before {out} was complete", then) from None


def pretrain_config(args) -> RunConfig:
    """The run's config: saved one when resuming, else defaults, preset, file, flags, --set."""
    from bertforge.checkpoint import read_config
    from bertforge.pretrain import check_pretraining_folder

    if args.resume:
        refuse_resume_flags(args)
        check_pretraining_folder(args.out, resume=True)
        config = read_config(args.out)
        saved = RunConfig.from_dict(config.to_dict())
    elif args.allow_changed_data:
        raise BertforgeError("--allow-changed-data applies to --resume only; drop it for a new run")
    else:
        config = RunConfig()
        if args.preset:
            apply_preset(config, args.preset)
        settings = load_toml(args.config) if args.config else {}
        if objective := args.objective or objective_named(settings, args.set):
            apply_objective(config, objective)
        if args.config:
            apply_mapping(config, settings, origin=str(args.config))
    flags = {
        "data.corpus": args.corpus,  # every --corpus value; `pretrain` saves them absolute
        "data.shards": args.shards,
        "data.valid": str(args.valid) if args.valid else None,
        "data.format": args.format,
        "data.text_column": args.text_column,
        "data.nsp": False if args.no_nsp else None,
        "train.max_steps": args.max_steps,
        "train.max_minutes": args.max_minutes,
        "train.batch_size": args.batch_size,
        "train.learning_rate": args.lr,
        "runtime.precision": args.precision,
        "runtime.device": args.device,
        "runtime.seed": args.seed,
    }
    apply_mapping(config, nest({k: v for k, v in flags.items() if v is not None}), origin="command line")
    apply_overrides(config, args.set)
    if args.resume:
        refuse_reshaping(saved, config, args.out)
    else:
        drop_pairs_for_a_gpt(config)
    validate(config)
    warn_unread_by_a_gpt(config, args)
    return config


# BERT's sentence pairs and masking, which a GPT's next-token objective reads none of
BERT_ONLY = (
    "data.nsp",
    "data.warmup_nsp",
    "data.short_seq_prob",
    "data.mlm_probability",
    "data.final_mlm_probability",
    "data.max_predictions_per_seq",
    "data.whole_word_masking",
)


def warn_unread_by_a_gpt(config: RunConfig, args) -> None:
    """Name the BERT-only settings given on the command line of a GPT run (a config file's are left
    alone: one file may serve both objectives)."""
    if config.model.objective != "clm":
        return
    given = {item.partition("=")[0].strip() for item in args.set or []}
    named = [key for key in BERT_ONLY if key in given] + (["--no-nsp"] if args.no_nsp else [])
    if named:
        print(
            f"bertforge: warning: {', '.join(named)}: a GPT (--objective clm) trains on contiguous text "
            "without masks or sentence pairs, and reads none of this",
            file=sys.stderr,
        )


def refuse_resume_flags(args) -> None:
    """Refuse flags that `--resume` would otherwise ignore: the run keeps its model, tokenizer and recipe."""
    given = [flag for flag in ("preset", "objective", "config", "tokenizer") if getattr(args, flag)]
    if given:
        flags = ", ".join(f"--{flag}" for flag in given)
        raise BertforgeError(
            f"--resume continues the run in {args.out} with its own model, tokenizer and settings; "
            f"drop {flags} (--set and the training flags still apply)"
        )


def refuse_reshaping(saved: RunConfig, config: RunConfig, out: Path) -> None:
    """Refuse a `--set` that would give a resumed run another model or tokenizer than its checkpoints,
    or other optimizer groups (`train.layer_decay`) than its saved optimizer state."""
    changed = [
        f"{section}.{key}"
        for section in ("model", "tokenizer")
        for key, value in asdict(getattr(config, section)).items()
        if asdict(getattr(saved, section))[key] != value
    ] + (["train.layer_decay"] if saved.train.layer_decay != config.train.layer_decay else [])
    if changed:
        raise BertforgeError(
            f"--resume keeps the model, tokenizer and optimizer groups of the run in {out}; drop --set "
            f"{', '.join(changed)}, "
            f"or start a new run from its weights with --init {out}"
        )


def nest(flat: dict) -> dict:
    nested: dict = {}
    for name, value in flat.items():
        section, key = name.split(".")
        nested.setdefault(section, {})[key] = value
    return nested


def restarted_by_torchrun(args) -> bool:
    """Whether torchrun restarted the processes (`--max-restarts`) of a run this command line began in
    --out: then it continues that run from its last checkpoint, with its saved settings."""
    from bertforge.checkpoint import CONFIG
    from bertforge.distributed import launched, restart_count

    restarted = not args.resume and restart_count() > 0 and (args.out / CONFIG).is_file()
    if restarted and launched().is_main:
        print(f"bertforge: torchrun restarted the run in {args.out}; continuing it", file=sys.stderr)
    return restarted


def run_pretrain(args) -> int:
    from bertforge.checkpoint import read_config
    from bertforge.distributed import launched
    from bertforge.pretrain import pretrain
    from bertforge.progress import duration

    if args.init and args.resume:
        raise BertforgeError("--init starts a new run from a model and --resume continues a run: give one")
    given = {"--preset": args.preset, "--objective": args.objective, "--tokenizer": args.tokenizer}
    if args.init and (clashing := [flag for flag, value in given.items() if value]):
        raise BertforgeError(
            f"--init brings its own model size, objective and tokenizer: drop {' and '.join(clashing)}"
        )
    names = [item.partition("=")[0].strip() for item in args.set]
    reshaping = [name for name in names if name.startswith(("model.", "tokenizer."))]
    if args.init and reshaping:
        raise BertforgeError(f"--init brings its own model and tokenizer: drop --set {', '.join(reshaping)}")
    retokenizing = [name for name in names if name.startswith("tokenizer.")]
    if args.tokenizer and retokenizing:
        raise BertforgeError(
            f"--tokenizer brings a trained tokenizer, which --set {', '.join(retokenizing)} would not "
            "change: drop one"
        )
    restarted = restarted_by_torchrun(args)
    config = read_config(args.out) if restarted else pretrain_config(args)
    with reporting_to(args.out, args.report_to):
        result = pretrain(
            config,
            args.out,
            tokenizer_dir=args.tokenizer,
            resume=args.resume or restarted,
            cache_dir=args.cache_dir,
            show_progress=not args.quiet,
            init=args.init,
            allow_changed_data=args.allow_changed_data,
        )
    if not launched().is_main:
        return 0  # under torchrun, rank 0 reports for the run
    if args.resume and result["steps_run"] == 0:
        print(
            f"\nthe run had already reached its end ({result['step']} steps); to train on, resume with a "
            "larger --max-steps or --max-minutes"
        )
    took, rate = duration(result["elapsed_s"]), result["tokens"] / max(result["elapsed_s"], 1e-9)
    print(f"\ntrained {result['step']} steps, {result['tokens']:,} tokens in {took}", end=" ")
    print(f"({rate:,.0f} real tokens/s)")
    metrics = {k: v for k, v in result.items() if k not in ("step", "steps_run", "elapsed_s", "tokens")}
    if metrics:
        print_metrics(metrics, label="held-out: ")
    print(f"model:    {args.out / 'final'}")
    print(f"plots:    {args.out / 'loss.png'}")
    print(f"metrics:  {args.out / 'metrics.jsonl'}")
    return 0


def run_evaluate(args) -> int:
    from bertforge.config_rules import check_flags, count
    from bertforge.evaluate import evaluate_model

    check_flags(args, {"--max-pairs": count(0)})  # 0: every pair
    metrics = evaluate_model(
        args.model,
        args.corpus,
        format=args.format,
        device=args.device,
        precision=args.precision,
        max_pairs=args.max_pairs,
        max_length=args.max_length,
        cache_dir=args.cache_dir,
        show_progress=not args.quiet,
        text_column=args.text_column,
        nsp=args.nsp,
    )
    if args.json:
        print(json.dumps(metrics))
    else:
        print_metrics(metrics)
    return 0


def print_metrics(metrics: dict[str, float], label: str = "") -> None:
    """The metrics on one line, then the unigram entropy as the reference for `mlm_loss` (a GPT's
    `clm_loss`)."""
    from bertforge.progress import metrics_text

    metrics = dict(metrics)
    entropy = metrics.pop("unigram_entropy", None)
    print(label + metrics_text(metrics))
    if entropy is not None:
        indent = " " * len(label)
        key, loss = ("clm_loss", "next-token") if "clm_loss" in metrics else ("mlm_loss", "MLM")
        print(
            f"{indent}reference: unigram entropy {entropy:.4f}, the {loss} loss of a model that knows only "
            "how often each token occurs; below it, the model uses context"
        )
        if metrics.get(key, -math.inf) >= entropy:
            print(
                f"{indent}the {loss} loss is not below it yet: the model has not learned to use context; "
                "train longer"
            )
