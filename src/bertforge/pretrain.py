"""Pretraining from raw text (or the token shards `bertforge prepare` wrote, `data.shards`): the run
folder, its tokenizer and shards, and the objective: BERT's MLM+NSP, or with `model.objective =
"clm"` GPT-1's next-token prediction over packed windows of contiguous text (`bertforge.packing`),
trained by the same loop.

Run folder layout (`--out DIR`):

    config.json         the effective config (also inside every checkpoint and final/); data
                        paths absolute, so that `--resume` works from any working directory; a
                        resume that changes a setting (`--resume --max-steps 400`) records it
                        here, so that a plain `--resume` continues as asked
    data.json           the sha256 of every corpus and validation file (of a shard folder: its
                        meta.json), how the text was read (format, text column), the tokenizer's
                        fingerprint and the plain-text reader's version:
                        `--resume` refuses changed text unless `--allow-changed-data`
    tokenizer/          tokenizer.json, vocab.txt, tokenizer_config.json, bertforge_tokenizer.json
    metrics.jsonl       one line per log window ("train") and per evaluation ("valid"); with a
                        sequence-length warmup, also the evaluation at its length while it lasts
                        ("valid_short") and the first full-length step ("warmup_end")
    checkpoints/        step_NNNNNN/ folders, the newest `train.keep_checkpoints` kept
    final/              model.safetensors, config.json and the tokenizer: the trained model
    loss.png            train and validation curves (the warmup's end marked)

Nothing is written into the run folder until the corpus has been read, tokenized and checked,
except `.lock`: the running process's PID, held with an OS lock for the whole run (removed at the end).

`--resume` continues only a pretraining run's folder: any other kind (a fine-tuning run, a GLUE
benchmark, a model or checkpoint folder) is refused, naming it, before anything is written there.
`--resume` of a run stopped before its first checkpoint starts it afresh in its folder, with a
notice; a finished run whose checkpoints are gone is refused, since that would train a new model
over its final/. A run that SIGINT or SIGTERM stopped, or whose torchrun group lost a process, ends
with the command that continues it; after `torchrun --max-restarts N` restarts the group, it
continues from the last checkpoint by itself (see `commands.pretraining`). Ctrl-C before the run
kept anything (while its tokenizer or shards are built) says to run the command again instead.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from bertforge import distributed, reporting
from bertforge.batches import Batches, SeededBatches
from bertforge.cache import (
    cached_shards,
    cached_tokenizer,
    content_hash,
    default_cache_dir,
    refuse_changed_data,
    remove_orphans,
)
from bertforge.checkpoint import (
    CONFIG,
    RUN_DATA,
    check_tokenizer_fits,
    check_tokenizer_is_the_runs,
    holds_weights,
    list_checkpoints,
    pretraining_model,
    save_model_folder,
)
from bertforge.config import DataConfig, RunConfig, drop_pairs_for_a_gpt, max_predictions, save_json, validate
from bertforge.config_rules import trains_nsp
from bertforge.corpus import (
    COLUMN_FORMATS,
    READER_VERSION,
    check_text_file,
    resolve_corpus_files,
    resolve_format,
)
from bertforge.embedding_init import cooccurrence_embeddings
from bertforge.errors import BertforgeError, Interrupted
from bertforge.evaluate import (
    EVAL_MASK_RATE,
    evaluation_batches,
    next_token_batch_sums,
    pretraining_batch_sums,
    pretraining_metrics,
    unigram_entropy,
)
from bertforge.folders import folder_kind, open_pretrained, refuse_other_kind
from bertforge.gpt import summarize_clm
from bertforge.io import RunFolderLock, check_run_folder, read_json, remove_folder, write_json
from bertforge.loader import Ahead
from bertforge.losses import pretraining_loss, summarize_pretraining
from bertforge.masking import PretrainingCollator, pretraining_collator, subsampling_weights
from bertforge.model import BertForPreTraining
from bertforge.optimizer import Schedule
from bertforge.packing import fewest_windows, packed_batches
from bertforge.pairs import FEW_PAIRS, NO_NSP, PairDataset, build_pairs, document_ends, nsp_share
from bertforge.plots import plot_pretraining
from bertforge.precision import agree_on_precision, resolve_precision
from bertforge.runtime import apply_threads, resolve_device, size_embeddings
from bertforge.shards import (
    META_FILE,
    ShardSet,
    TokenShards,
    check_prepared_with,
    concat_shards,
    token_counts,
)
from bertforge.signals import StoppedEarly, signal_of
from bertforge.tokenizer import BertTokenizer, load_given_tokenizer, load_tokenizer
from bertforge.train import Objective, train
from bertforge.window_init import init_window_model


def pretrain(
    config: RunConfig,
    out: Path,
    tokenizer_dir: Path | None = None,
    resume: bool = False,
    cache_dir: Path | None = None,
    show_progress: bool = True,
    init: Path | None = None,
    allow_changed_data: bool = False,
) -> dict:
    """Train (or resume) a run in `out`; return the final step, time, tokens, validation metrics and
    the validation text's unigram entropy (the MLM loss to beat).

    `init`: a model folder (ours, imported or exported) to start from; its model and tokenizer
    sections replace the config's, and the corpus is tokenized with its tokenizer.
    `allow_changed_data`: resume even though a corpus or validation file changed since the run started.
    """
    out = Path(out)
    if resume:  # a folder of another kind is refused before the lock or anything else touches it
        check_pretraining_folder(out, resume)
    lock = RunFolderLock(out)
    resume_command = distributed.launch_command(continue_arguments(out, cache_dir))
    try:
        # One run per folder; under torchrun rank 0 owns it for all ranks.
        with (
            lock if distributed.launched().is_main else contextlib.nullcontext(),
            distributed.lost_processes_reported(f"continue with: {resume_command}"),
        ):
            return run_pretraining(
                config,
                out,
                tokenizer_dir,
                resume,
                cache_dir,
                show_progress,
                init,
                lock.created,
                allow_changed_data,
            )
    except Interrupted as stop:
        stop.resume_command = resume_command
        raise
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM before the loop took them, or a second one
        report = distributed.launched().is_main
        raise StoppedEarly(signal_of(stop), *after_ctrl_c(out, resume_command), report) from None


def continue_arguments(out: Path, cache_dir: Path | None) -> str:
    """`bertforge pretrain`'s arguments that continue the run in `out` as this call runs it (its
    settings are in `out`/config.json)."""
    cache = f" --cache-dir {shlex.quote(str(cache_dir))}" if cache_dir else ""
    return f"pretrain --out {shlex.quote(str(out))} --resume{cache}{reporting.continue_flag()}"


def after_ctrl_c(out: Path, resume_command: str) -> tuple[str, str]:
    """Where Ctrl-C stopped `pretrain` when the loop saved no checkpoint of its own, and what to do:
    continue from what the run folder keeps, or, when it keeps nothing, run the command again."""
    if checkpoints := list_checkpoints(out):
        last = checkpoints[-1].name
        return "", f"continue the run from its last checkpoint ({last}) with: {resume_command}"
    if folder_kind(out) is not None:  # a run folder without a checkpoint: `--resume` starts it afresh
        return "before the run's first checkpoint", f"start it again with: {resume_command}"
    return f"before the run in {out} started", (
        "nothing of it was kept: run the same command again "
        "(the tokenizer and shards that were complete are reused from the cache)"
    )


def run_pretraining(
    config: RunConfig,
    out: Path,
    tokenizer_dir: Path | None,
    resume: bool,
    cache_dir: Path | None,
    show_progress: bool,
    init: Path | None,
    created: bool,
    allow_changed_data: bool = False,
) -> dict:
    """`pretrain` in a folder this process owns; `created`: the folder did not exist before the call."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    remove_orphans(cache_dir)  # what tokenizer and shard builds killed mid-way left
    check_pretraining_folder(out, resume)
    if resume and not list_checkpoints(out):  # (a finished run was refused above)
        start_afresh(out)
        resume, tokenizer_dir = False, out / "tokenizer"  # the run's own tokenizer
    absolute_data_paths(config.data)
    if not resume:
        drop_pairs_for_a_gpt(config)
    validate(config)
    apply_threads(config.runtime)
    # Under torchrun every rank reads the cache (one builds each entry, the others wait on its lock),
    # then joins the process group: no collective can time out while a large corpus is tokenized,
    # and every rank has checked `out` before rank 0 writes there.
    device = resolve_device(config.runtime.device)
    with distributed.joined_after(device, config.runtime.dist_timeout_minutes) as world:
        corpus_files, prepared = training_text(config.data)  # checked before any work
        hashes = data_hashes(corpus_files, config.data.valid, prepared)
        warn_valid_in_training(corpus_files, config.data.valid, hashes, resume, prepared)
        if resume and not allow_changed_data:
            refuse_changed_corpus(out, hashes, config.data, text_files(corpus_files, config.data.valid))
        init_state = None
        if init is not None and not resume:
            init_state, tokenizer = init_from(init, config)
        else:
            tokenizer = run_tokenizer(
                config, out, tokenizer_dir, resume, cache_dir, corpus_files, show_progress
            )
        if init_state is None and not resume:  # a new model: a row per token (on CUDA, padded to 64)
            size_embeddings(config, tokenizer.vocab_size, device)
        config.model.pad_token_id = tokenizer.pad_id  # the embedding row that gets no gradient
        validate(config)
        train_shards = training_shards(corpus_files, prepared, tokenizer, config, cache_dir, show_progress)
        check_training_data(train_shards, config)
        warn_short_full_length_phase(config)
        held_out = validation_data(config, tokenizer, cache_dir, show_progress)
        refuse_read_while_changing(hashes, data_hashes(corpus_files, config.data.valid, prepared))

    choose_run_precision(config, world, cache_dir, show_progress)
    agree_on_precision(config)  # outside the block above: every rank must reach this collective
    if not resume and world.is_main:
        out.mkdir(parents=True, exist_ok=True)
        tokenizer.save(out / "tokenizer")
        save_json(config, out / CONFIG)
    if world.is_main and (not resume or allow_changed_data):
        write_json(
            out / RUN_DATA,
            {
                "sha256": hashes,
                "tokenizer": tokenizer.fingerprint,
                "text_reader": READER_VERSION,
                "reading": text_reading(config.data, text_files(corpus_files, config.data.valid)),
            },
        )
    try:
        result = train_and_save(
            config, out, tokenizer, train_shards, held_out, resume, show_progress, init_state=init_state
        )
    except BaseException as error:
        # A lost process's line says to continue with --resume, which restarts a run without checkpoints.
        lost = isinstance(error, RuntimeError) and distributed.communication_failed(error)
        if created and world.is_main and not list_checkpoints(out) and not lost:
            remove_folder(out)  # nothing resumable yet: leave no half-made run behind
        raise
    return {**result, **held_out.reference}


def init_from(path: Path, config: RunConfig) -> tuple[dict[str, torch.Tensor], BertTokenizer]:
    """Weights and tokenizer to start pretraining from; `config` takes the source's model and
    tokenizer sections (its architecture, dropout and vocabulary win over any other setting)."""
    model, tokenizer, source = open_pretrained(path)
    config.model, config.tokenizer = source.model, source.tokenizer
    if config.train.embedding_init != "normal" and distributed.launched().is_main:
        warnings.warn(
            f"the weights come from {path}: train.embedding_init = "
            f'"{config.train.embedding_init}" is not applied',
            stacklevel=2,
        )
    return model.state_dict(), tokenizer


def training_text(data: DataConfig) -> tuple[list[Path], list[TokenShards]]:
    """The corpus files (`data.corpus`), or the shard folders that `bertforge prepare` wrote
    (`data.shards`), opened and checked before any work (the validation file too); exactly one of
    the two is given."""
    if data.shards and data.corpus:
        raise BertforgeError(
            "data.corpus and data.shards both name the training text; give one: --corpus or --shards"
        )
    if data.valid:
        check_text_file(data.valid, "validation")
    if data.shards:  # each folder once, as each corpus file
        return [], [TokenShards.open(folder) for folder in dict.fromkeys(map(os.path.realpath, data.shards))]
    return resolve_corpus_files(data.corpus), []


def training_shards(
    corpus_files: list[Path],
    prepared: list[TokenShards],
    tokenizer: BertTokenizer,
    config: RunConfig,
    cache_dir: Path,
    show_progress: bool,
) -> TokenShards | ShardSet:
    """The training text as one corpus of shards: the prepared folders if given (made by this
    tokenizer), else the corpus files tokenized through the cache."""
    data = config.data
    if prepared:
        return concat_shards([check_prepared_with(part, tokenizer) for part in prepared])
    return concat_shards(
        [
            cached_shards(file, tokenizer, data.format, cache_dir, show_progress, data.text_column)
            for file in corpus_files
        ]
    )


@dataclass
class HeldOut:
    """The fixed evaluation batches of `data.valid` at the run's sequence length, and at its warmup's
    (`warmup_batches`, empty without a sequence-length warmup), and the text's unigram entropy."""

    batches: list[dict] = field(default_factory=list)
    warmup_batches: list[dict] = field(default_factory=list)
    reference: dict[str, float] = field(default_factory=dict)


def validation_data(
    config: RunConfig, tokenizer: BertTokenizer, cache_dir: Path, show_progress: bool
) -> HeldOut:
    """The held-out batches of `data.valid`, at the full length and the warmup's; none without it."""
    data = config.data
    if not data.valid:
        return HeldOut()
    valid_shards = cached_shards(
        Path(data.valid), tokenizer, data.format, cache_dir, show_progress, data.text_column
    )
    objective, text = config.model.objective, f"the validation file {data.valid}"
    warmup = replace(data, max_seq_length=data.warmup_seq_length, nsp=data.nsp or data.warmup_nsp)
    return HeldOut(
        batches=evaluation_batches(valid_shards, tokenizer, data, objective, text),
        warmup_batches=evaluation_batches(valid_shards, tokenizer, warmup, objective, text)
        if data.warmup_seq_length
        else [],
        reference={"unigram_entropy": unigram_entropy(valid_shards, tokenizer, objective)},
    )


def train_and_save(
    config: RunConfig,
    out: Path,
    tokenizer: BertTokenizer,
    train_shards: TokenShards | ShardSet,
    held_out: HeldOut,
    resume: bool,
    show_progress: bool,
    init_state: dict | None = None,
) -> dict:
    torch.manual_seed(config.runtime.seed)
    model = pretraining_model(config.model)
    mlm = config.model.objective == "mlm"
    if init_state is not None:  # `pretrain --init`: start from a saved model's weights
        model.load_state_dict(init_state)
    elif mlm and not resume:  # a resumed run loads its checkpoint's weights in `train`
        if config.train.mlm_bias_init == "unigram":
            init_mlm_bias(model, train_shards, tokenizer.special_ids)
        model.silence_padded_rows(tokenizer.vocab_size)
        if config.train.embedding_init != "normal" and distributed.launched().is_main:
            # Rank 0 alone: DistributedDataParallel gives its weights to every rank when it wraps the model.
            init_word_embeddings(model, train_shards, tokenizer.special_ids, config, show_progress)
    batches, loss, summarize_sums = objective_parts(config.model.objective)
    warmup_length = config.data.warmup_seq_length
    objective = Objective(
        model=model,
        batches=batches(train_shards, tokenizer, config, config.data.max_seq_length),
        loss=functools.partial(loss, vocab_size=tokenizer.vocab_size),  # a padded vocabulary's extra rows out
        evaluate=held_out_metrics(held_out.batches, tokenizer, config, show_progress),
        summarize=summarize_sums,
        # Short sequences first: Google BERT's 128 then 512 in small (Devlin et al. 2019, appendix A.2).
        warmup_batches=batches(train_shards, tokenizer, config, warmup_length, **warmup_pairs(config.data))
        if warmup_length
        else None,
        warmup_fraction=config.data.warmup_seq_fraction,
        warmup_evaluate=held_out_metrics(held_out.warmup_batches, tokenizer, config, show_progress),
        warmup_seq_len=warmup_length,
        seq_len=config.data.max_seq_length,
        masking_rate=masking_rate_schedule(config.data) if mlm else None,
    )
    result = train(
        objective,
        config,
        out,
        resume=resume,
        show_progress=show_progress,
        on_resume=functools.partial(save_json, config, out / CONFIG),  # the settings it continues with
    )
    if distributed.launched().is_main:
        # a resume at the run's end writes what a stop after the last step left unwritten, nothing
        # else; final/ of an earlier end (a run resumed to train on, then stopped) is replaced
        new_final = bool(result["steps_run"]) or not holds_weights(out / "final", model)
        if new_final:
            save_model_folder(out / "final", model.cpu(), tokenizer, config)
        if new_final or not (out / "loss.png").is_file():
            masking = (config.data.mlm_probability, EVAL_MASK_RATE) if mlm else None
            plot_pretraining(out / "metrics.jsonl", out / "loss.png", masking)
    distributed.barrier()  # the other ranks return once the run folder is complete
    return result


def held_out_metrics(
    batches: list[dict], tokenizer: BertTokenizer, config: RunConfig, show_progress: bool
) -> Callable:
    """model -> its held-out metrics on `batches` (none without validation text); `show_progress`: a
    passing bar on a terminal while they are computed (a log keeps only their line)."""
    precision, size = config.runtime.precision, tokenizer.vocab_size
    return lambda model: (
        pretraining_metrics(model, batches, size, precision, show_progress, passing=True) if batches else {}
    )


def warmup_pairs(data: DataConfig) -> dict:
    """`epoch_batches`' settings for the sequence-length warmup: NSP pairs with `data.warmup_nsp`."""
    return {"nsp": True} if data.warmup_nsp else {}


def objective_parts(objective: str) -> tuple:
    """(epoch batches, loss, summarize) of an objective: BERT's MLM + NSP ("mlm") or GPT's next token."""
    if objective == "clm":
        return packed_epoch_batches, causal_lm_loss, summarize_clm
    return epoch_batches, masked_lm_and_nsp_loss, summarize_pretraining


def refuse_less_than_a_batch(sequences: int, config: RunConfig) -> None:
    """Refuse a corpus that gives fewer sequences than one optimizer step takes, with both counts."""
    if sequences < config.train.batch_size:
        raise BertforgeError(
            f"the training text gives {sequences:,} sequences of up to {config.data.max_seq_length} tokens, "
            f"fewer than one batch of {config.train.batch_size}; lower train.batch_size or add text"
        )


JUDGED_PAIRS = 50  # fewer sequences than this tell nothing about a corpus's documents
SHORT_FILL = 0.5  # sequences filled below this share on average are worth a warning


def check_training_data(shards: TokenShards | ShardSet, config: RunConfig) -> None:
    """Draw epoch 0's sequences once (a GPT's: count the fewest windows of any epoch), so that an
    unusable corpus is refused before anything is written."""
    data, seed = config.data, config.runtime.seed
    if config.model.objective == "clm":
        refuse_less_than_a_batch(fewest_windows(shards, data.max_seq_length), config)
        return
    nsp = trains_nsp(config)  # BERT here: in the warmup or all along
    pairs = build_pairs(shards, data.max_seq_length, data.short_seq_prob, nsp, seed, 0, data.cross_documents)
    refuse_less_than_a_batch(len(pairs), config)
    if not distributed.launched().is_main or len(pairs) < JUDGED_PAIRS:  # too few to tell chance apart
        return
    specials = np.where(pairs[:, 4] == NO_NSP, 2, 3)  # (N,) [CLS] and one [SEP] or two
    real = (pairs[:, 1] - pairs[:, 0] + pairs[:, 3] - pairs[:, 2] + specials).mean()
    if real < SHORT_FILL * data.max_seq_length:
        fix = short_sequences_fix(data)
        warnings.warn(
            f"the sequences hold {real:.0f} real tokens on average of the {data.max_seq_length} they could: "
            "each is taken from one document, and the corpus's documents are short (in plain text a blank "
            f"line ends one; in JSON lines and tables each line or row is one); {fix}, or lower "
            "data.max_seq_length",
            stacklevel=2,
        )
    if nsp and (share := nsp_share(pairs)) < FEW_PAIRS:
        warnings.warn(
            f"{share:.0%} of the sequences are next-sentence pairs: nearly every document of the corpus "
            "has one sentence, which has no next one to pair with, so it trains MLM alone. In plain text "
            "a blank line ends a document: if there is one after every line, remove them; a table's rows "
            "are one document each. Or set data.nsp = false",
            stacklevel=2,
        )


def short_sequences_fix(data) -> str:
    """What gives fuller sequences under these settings."""
    if data.nsp:
        across = " (MLM alone, on windows that run across documents)" if data.cross_documents else ""
        return f"join documents, set data.nsp = false{across}"
    if data.warmup_nsp:  # the warmup's NSP pairs are the short ones
        return "join documents, or drop data.warmup_nsp"
    return "set data.cross_documents = true"


# Below this share of the learning-rate area, the full-length phase after a sequence-length warmup
# left held-out MLM at 128 tokens at 21% (docs/records/glue.md: 0.4% of the area after 0.936).
FULL_LENGTH_MIN_SHARE = 0.02


def warn_short_full_length_phase(config: RunConfig) -> None:
    """Warn when a sequence-length warmup leaves too little of the learning rate for the full length."""
    data = config.data
    if not data.warmup_seq_length or not distributed.launched().is_main:
        return
    share = Schedule(config.train).share_after(data.warmup_seq_fraction)
    if share < FULL_LENGTH_MIN_SHARE:
        warnings.warn(
            f"data.warmup_seq_fraction = {data.warmup_seq_fraction:g} leaves the {data.max_seq_length}-token "
            f"phase {share:.1%} of the run's learning-rate area, and the model may stay weak at that "
            "length; lower the fraction (the configs use 0.7 and 0.8)",
            stacklevel=2,
        )


def choose_run_precision(config: RunConfig, world, cache_dir: Path, show_progress: bool) -> None:
    """Resolve `runtime.precision = "auto"` before the config is saved. Under torchrun only rank 0
    decides (its CPU probe runs alone); `agree_on_precision` gives its choice to the others."""
    if not world.is_main:
        return
    device = distributed.local_device(resolve_device(config.runtime.device), world)
    choice = resolve_precision(config, device, cache_dir)
    if choice is not None and show_progress:
        print(choice.describe(), flush=True)


def init_mlm_bias(
    model: BertForPreTraining, shards: TokenShards | ShardSet, special_ids: tuple[int, ...]
) -> None:
    """Start the MLM output bias at the log frequencies of the training tokens.

    The model then predicts word frequencies from step 0 ("init well", Karpathy 2019) instead of
    spending its first steps learning them through the tied embeddings. Adam moves the bias by about
    the learning rate per step, so from zero it needs thousands of steps to span the ~10 nats
    between frequent and rare tokens; measured here, the prior also lets post-LN BERT train at
    learning rates that otherwise collapse it into predicting the most frequent token.
    """
    counts = token_counts(shards, exclude=special_ids).astype(np.float64)
    log_prior = np.log((counts + 0.5) / (counts.sum() + 0.5 * len(counts)))  # add-half: all finite
    with torch.no_grad():
        model.cls.predictions.bias[: len(log_prior)].copy_(torch.from_numpy(log_prior))


def init_word_embeddings(
    model: BertForPreTraining,
    shards: TokenShards | ShardSet,
    special_ids: tuple[int, ...],
    config: RunConfig,
    show_progress: bool = False,
) -> None:
    """Start the word embeddings (and so the tied MLM decoder) from the corpus's co-occurrences; with
    `window_model`, layer 1 and the MLM transform too, as a count-based window model."""
    started = time.perf_counter()
    if config.train.embedding_init == "window_model":
        init_window_model(model, shards, special_ids, config)
        what = "word embeddings, positions, layer 1 and the MLM transform: a count-based window model"
        counted = "PMI"
    else:
        vectors = cooccurrence_embeddings(
            shards, config.model.hidden_size, config.model.initializer_range, special_ids, config.runtime.seed
        )
        with torch.no_grad():
            model.bert.embeddings.word_embeddings.weight[: len(vectors)].copy_(vectors)
        what, counted = "word embeddings: from the corpus's co-occurrences", "PPMI-SVD"
    if show_progress:  # called on rank 0 alone
        seconds = time.perf_counter() - started
        print(f"{what} ({counted}, {seconds:.1f} s)", flush=True)


def check_pretraining_folder(out: Path, resume: bool) -> None:
    """Refuse `out` for this run: resuming needs a pretraining run there (not a folder of another
    kind, nor a finished run whose checkpoints are gone), a new run an empty folder."""
    model_hint = f"; to train it further, start a new run from its weights with --init {out}"
    refuse_other_kind(out, "pretraining run", model_hint, resume)
    if not (out / CONFIG).is_file() and (checkpoints := list_checkpoints(out)):  # a run that lost its copy
        saved = checkpoints[-1] / CONFIG
        raise BertforgeError(f"{out} holds checkpoints but no {CONFIG}; copy {saved} into {out}, then resume")
    check_run_folder(out, resume, CONFIG, "bertforge run")
    if resume and not list_checkpoints(out) and (out / "final").exists():
        raise BertforgeError(
            f"{out} holds a finished run whose checkpoints are gone (it has final/ but no checkpoints/"
            "step_*): `resume=True` would train a new model over final/; to train it further, start a new "
            f"run from its weights with --init {out}"
        )


def start_afresh(out: Path) -> None:
    """Make a run that stopped before its first checkpoint start again: nothing of it can be resumed."""
    if distributed.launched().is_main:
        warnings.warn(
            f"{out} has no checkpoint yet (its run stopped before the first one); starting the run afresh",
            stacklevel=2,
        )
        (out / "metrics.jsonl").unlink(missing_ok=True)


def absolute_data_paths(data: DataConfig) -> None:
    """Make the corpus specs (files, folders, glob patterns), the shard folders and the validation file
    absolute, so that the saved config names the same files from any working directory."""
    if isinstance(data.corpus, (str, Path)):  # a library caller's single path
        data.corpus = [str(data.corpus)] if str(data.corpus) else []
    for name, values in (("data.corpus", data.corpus), ("data.shards", data.shards)):
        if any(not str(value).strip() for value in values):  # abspath("") would name this folder
            raise BertforgeError(
                f"{name} holds an empty path (an unset shell variable?); name a file or folder"
            )
    data.corpus = [os.path.abspath(spec) for spec in data.corpus]
    data.shards = [os.path.abspath(folder) for folder in data.shards]
    data.valid = os.path.abspath(data.valid) if data.valid else data.valid


def data_hashes(corpus_files: list[Path], valid: str, prepared: list[TokenShards]) -> dict[str, str]:
    """The sha256 of every training and validation file, by absolute path (what `--resume` checks);
    a shard folder's is that of its meta.json, which names its source text, tokenizer and counts."""
    hashes = {os.path.abspath(file): content_hash(file) for file in text_files(corpus_files, valid)}
    return hashes | {os.path.abspath(part.path): content_hash(part.path / META_FILE) for part in prepared}


def refuse_read_while_changing(before: dict[str, str], after: dict[str, str]) -> None:
    """Refuse a run whose data files changed between their hashes (what data.json records) and the
    end of reading them: its tokenizer, shards and record would describe different texts."""
    if changed := sorted(name for name in before if before[name] != after.get(name)):
        raise BertforgeError(
            f"{', '.join(changed)} changed while the run read it; run again once it is complete"
        )


def warn_valid_in_training(
    corpus_files: list[Path], valid: str, hashes: dict[str, str], resume: bool, prepared: list[TokenShards]
) -> None:
    """Warn (once, as a run starts) when the validation file's bytes are also a training file's, or
    the text a shard folder of `prepared` was made from."""
    if not valid or resume or not distributed.launched().is_main:
        return
    held_out = hashes[os.path.abspath(valid)]
    same = [str(file) for file in corpus_files if hashes[os.path.abspath(file)] == held_out]
    same += [str(part.path) for part in prepared if part.meta.get("source", {}).get("sha256") == held_out]
    if same:
        warnings.warn(
            f"the validation file {valid} is also training text ({same[0]}): its held-out figures "
            "measure what the model memorised; give text the run does not train on",
            stacklevel=3,
        )


def text_reading(data: DataConfig, files: list[Path]) -> dict[str, str | None]:
    """How the text files are read into documents: their format, and the text's field or column where
    one of them has columns (JSON lines, Parquet, TSV, CSV)."""
    columns = any(resolve_format(file, data.format) in COLUMN_FORMATS for file in files)
    return {"format": data.format, "text_column": data.text_column if columns else None}


def text_files(corpus_files: list[Path], valid: str) -> list[Path]:
    return [*corpus_files, *([Path(valid)] if valid else [])]


def refuse_changed_corpus(out: Path, hashes: dict[str, str], data: DataConfig, files: list[Path]) -> None:
    """Refuse to resume on text other than the run started on: other files, files read otherwise
    (another format or text field), or by another version of the reader (`corpus.READER_VERSION`;
    data.json without `text_reader`: version 1), whose sentences may differ; a run folder without
    data.json is not checked."""
    if not (out / RUN_DATA).is_file():
        return
    saved = read_json(out / RUN_DATA)
    current = text_reading(data, files)
    reading = saved.get("reading", current)  # a data.json without it: not checked
    if files and reading != current:
        column = reading.get("text_column")
        how = f"format {reading['format']!r}" + (f", text field or column {column!r}" if column else "")
        raise BertforgeError(
            f"the run in {out} read its text as {how}; resume reading it so (drop --format, --text-column "
            "or their --set), pass `allow_changed_data=True` to train on the text read otherwise, or start a "
            "new run"
        )
    refuse_changed_data(
        saved.get("sha256", {}),
        hashes,
        out,
        "resume on the text it started on, pass `allow_changed_data=True` to train on the changed text, "
        "or start a new run",
    )
    if files and saved.get("text_reader", 1) != READER_VERSION:
        raise BertforgeError(
            f"the run in {out} read its text with version {saved.get('text_reader', 1)} of the text reader, "
            f"and this is version {READER_VERSION}, which may split sentences elsewhere (at every line "
            "break, a CR alone included but CRs before an LF as one, not after a.m., Corp. or pp., and a "
            "quotation at its closing quote unless a lower-case word follows), so its sentence pairs may "
            "change; pass `allow_changed_data=True` to go on with the text read anew, or start a new run"
        )


def run_tokenizer(
    config: RunConfig,
    out: Path,
    tokenizer_dir: Path | None,
    resume: bool,
    cache_dir: Path,
    corpus_files: list[Path],
    show_progress: bool = True,
) -> BertTokenizer:
    """The run's own tokenizer when resuming, a given one, or one trained (and cached) on the corpus files."""
    if resume:
        return run_own_tokenizer(out, config)
    if tokenizer_dir:
        tokenizer = load_given_tokenizer(Path(tokenizer_dir))
        config.tokenizer = replace(  # what the run's config.json says is the tokenizer it trains with
            config.tokenizer,
            kind=tokenizer.kind,
            vocab_size=tokenizer.vocab_size,
            lowercase=tokenizer.lowercase,
            min_frequency=tokenizer.min_frequency or config.tokenizer.min_frequency,
        )
        return tokenizer
    if not corpus_files:
        raise BertforgeError(
            "training on prepared shards (data.shards) needs the tokenizer that prepared them: "
            "pass it with --tokenizer"
        )
    data = config.data
    return cached_tokenizer(
        corpus_files, config.tokenizer, data.format, cache_dir, data.text_column, show_progress
    )


def run_own_tokenizer(out: Path, config: RunConfig) -> BertTokenizer:
    """The tokenizer of the run in `out`, refused where it is not the one the run started with (its
    fingerprint in data.json; a data.json without it: its size against the model's rows)."""
    tokenizer = load_tokenizer(out / "tokenizer")
    check_tokenizer_is_the_runs(tokenizer, out)
    check_tokenizer_fits(tokenizer, config, out)
    return tokenizer


def epoch_batches(
    shards: TokenShards | ShardSet,
    tokenizer: BertTokenizer,
    config: RunConfig,
    length: int,
    nsp: bool | None = None,
):
    """(epoch, masking rate) -> micro-batches of freshly drawn pairs of at most `length` tokens
    (Google's algorithm; with `nsp` False, or by default `data.nsp`, contiguous windows) with dynamic
    masking at that rate (default: `data.mlm_probability`)."""
    # At this epoch's `length`: under torch.compile its batches are padded to it, not to the run's
    # data.max_seq_length (masking is the same: a sequence's cap on masked tokens never binds below it).
    data = replace(config.data, max_seq_length=length)
    seed, compiled = config.runtime.seed, config.runtime.compile
    nsp = data.nsp if nsp is None else nsp
    micro_batch = distributed.batch_plan(config.train).micro_batch  # kept global batch under torchrun
    # Under torch.compile the masked positions are padded to the most any epoch's rate masks: one graph.
    most = max(data.mlm_probability, data.final_mlm_probability)
    room = max_predictions(replace(data, mlm_probability=most))
    weights = masking_weights(shards, tokenizer, data)
    collators: dict[float, PretrainingCollator] = {}
    ends = document_ends(shards)  # for windows across documents; the same every epoch
    epoch_pairs = Ahead(
        functools.partial(
            build_pairs, shards, length, data.short_seq_prob, nsp, seed, cross_documents=data.cross_documents
        )
    )

    def batches(epoch: int, mlm_probability: float | None = None) -> SeededBatches:
        rate = data.mlm_probability if mlm_probability is None else mlm_probability
        if rate not in collators:
            rated = replace(data, mlm_probability=rate)
            collators[rate] = pretraining_collator(
                tokenizer, rated, fixed_shapes=compiled, masked_room=room, token_weights=weights
            )
        pairs = epoch_pairs(epoch)  # the next epoch's are built meanwhile
        examples = PairDataset(shards, pairs, tokenizer.cls_id, tokenizer.sep_id, ends)
        return SeededBatches(examples, micro_batch, collators[rate], seed, epoch)

    return batches


def masking_weights(
    shards: TokenShards | ShardSet, tokenizer: BertTokenizer, data: DataConfig
) -> np.ndarray | None:
    """Each token's weight in the choice of what to mask (`data.mask_subsampling`), from its
    frequency in the training text; None when every token is alike (BERT)."""
    if not data.mask_subsampling:
        return None
    return subsampling_weights(token_counts(shards, exclude=tokenizer.special_ids), data.mask_subsampling)


def masking_rate_schedule(data: DataConfig) -> Callable[[float], float] | None:
    """The run's progress in [0, 1] -> its masking rate, linear from `data.mlm_probability` to
    `data.final_mlm_probability` (Ankner et al. 2023, "Dynamic Masking Rate Schedules for MLM
    Pretraining": 30% decaying to 15%); None when the rate is fixed."""
    start, end = data.mlm_probability, data.final_mlm_probability
    if not end:
        return None
    return lambda progress: round(start + (end - start) * progress, 4)


def packed_epoch_batches(
    shards: TokenShards | ShardSet, tokenizer: BertTokenizer, config: RunConfig, length: int
):
    """epoch -> micro-batches of packed windows of `length` tokens of contiguous text (GPT's next-token
    objective)."""
    seed = config.runtime.seed
    micro_batch = distributed.batch_plan(config.train).micro_batch  # kept global batch under torchrun

    def batches(epoch: int) -> Batches:
        return packed_batches(shards, length, tokenizer.sep_id, micro_batch, seed, epoch)

    return batches


def masked_lm_and_nsp_loss(model: torch.nn.Module, batch: dict, vocab_size: int) -> tuple[torch.Tensor, dict]:
    sums = pretraining_batch_sums(model, batch, vocab_size)
    return pretraining_loss(sums), sums


def causal_lm_loss(model: torch.nn.Module, batch: dict, vocab_size: int) -> tuple[torch.Tensor, dict]:
    """Mean next-token cross-entropy over the batch's targets, and the sums to log."""
    sums = next_token_batch_sums(model, batch, vocab_size)
    return sums["clm_loss_sum"] / sums["clm_count"], sums
