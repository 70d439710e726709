"""Every kind of model folder bertforge reads: finding the one a path names, and opening it.

The kinds, as `find_model_folder` tells them apart:
- a run folder (what `bertforge pretrain` or `finetune` writes): its `final/` when there is one,
  else its newest checkpoint. A fine-tuning folder with one run per seed (`seed_N/`) is refused,
  naming one of them;
- a model folder (a run's `final/`, or what `bertforge import-hf` writes): model.safetensors,
  config.json (bertforge's RunConfig) and the tokenizer files;
- a checkpoint (`checkpoints/step_NNNNNN/`): a model folder whose tokenizer is its run's
  `tokenizer/`; its weights and config are checked against the hashes in its checksums.json;
- a classifier folder (a fine-tuning run's `final/`): a model folder with labels.json;
- a Hugging Face folder: what `bertforge export` writes, or a BERT or OpenAIGPT model saved by
  `transformers`: config.json with a `model_type`, model.safetensors or pytorch_model.bin
  (sharded or not), tokenizer.json or vocab.txt, and for a classifier its labels in `id2label`.

`folder_kind` names what any folder of bertforge's holds, these and the run folders that no model
is read from (a GLUE benchmark), so that a command refuses a folder of another kind, naming it,
before it touches anything there.

Opening (every model on the CPU, in eval mode):
- `open_pretrained`: model, tokenizer and run config of any folder but one of our classifiers:
  BERT with its MLM and NSP heads, or GPT-1 with its LM head (`model.objective = "clm"`);
- `open_encoder`: run config, tokenizer and encoder weights, where fine-tuning starts;
- `open_classifier`: model, tokenizer, labels and run config of a classifier (ours or exported);
- `open_tagger`: the same for a tagger (a token classifier: `bertforge.tagger`);
- `open_hf_folder`: a Hugging Face folder as a pretraining model, with a report of the weights
  drawn fresh or left out (what `bertforge import-hf` writes). A head the folder lacked (a bare
  `BertModel` has neither MLM nor NSP head) is untrained: its run config says so for NSP
  (`data.nsp = false`), an import lists it in untrained_heads.json, and `open_pretrained` refuses
  a command that would read it.

The files' formats are `bertforge.checkpoint`'s and `bertforge.tokenizer`'s; Hugging Face's names
and configs are converted by `bertforge.bert_convert` and `bertforge.gpt_convert`.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from bertforge import bert_convert, gpt_convert
from bertforge.checkpoint import (
    CONFIG,
    LABELS,
    STATE,
    WEIGHTS,
    check_and_load_state,
    check_tokenizer_fits,
    check_tokenizer_is_the_models,
    check_tokenizer_is_the_runs,
    list_checkpoints,
    load_weights,
    pretraining_model,
    read_config,
    read_state,
    read_weights,
    verify_checkpoint,
)
from bertforge.classifier import ENCODER, Classifier, read_labels, sequence_classifier
from bertforge.config import ModelConfig, RunConfig, load_json, validate
from bertforge.config_rules import trains_nsp
from bertforge.errors import BertforgeError
from bertforge.gpt import GPTLMHeadModel
from bertforge.io import read_json, write_json
from bertforge.model import BertForPreTraining, BertForTokenClassification
from bertforge.tagger import is_tagger_folder, token_classifier
from bertforge.tokenizer import (
    SETTINGS_FILE,
    TOKENIZER_FILE,
    VOCAB_FILE,
    BertTokenizer,
    bert_form,
    hf_lowercase,
    load_tokenizer,
)

POOLER = "bert.pooler."  # older transformers versions saved one in token classifiers, unused
BERTFORGE_CONFIG = "bertforge_config.json"  # our run config, in a folder that `bertforge export` wrote
HF_BIN = "pytorch_model.bin"
UNTRAINED_HEADS = "untrained_heads.json"  # an import's heads that its source lacked, drawn fresh
HEADS = {
    "mlm": ("cls.predictions.", "masked-language-model"),
    "nsp": ("cls.seq_relationship.", "next-sentence"),
}
MODEL_HINT = "give a run folder, its final/ or one of its checkpoints"
CLASSIFIER_HINT = "give a fine-tuned classifier or tagger folder, written by `bertforge finetune` or `export`"
# The files that mark the run folders of `bertforge finetune` and `bertforge glue` (their modules'
# TASK and SETTINGS), and a pretraining run's tokenizer folder.
FINETUNE_TASK = "finetune.json"
ARMS = ("pretrained", "scratch")  # --compare-scratch's folders in a fine-tuning run: RUN/ARM/seed_N
GLUE_SETTINGS = "glue_task.json"
RUN_TOKENIZER = "tokenizer"

PretrainingModel = BertForPreTraining | GPTLMHeadModel


@dataclass(frozen=True)
class ModelFolder:
    """A model folder found on disk (see `find_model_folder`)."""

    path: Path  # holds the weights and config.json
    tokenizer_dir: Path  # holds the tokenizer files: `path`, or a checkpoint's run's tokenizer/
    hugging_face: bool  # config.json is a Hugging Face config (an export, or a transformers model)

    @property
    def is_checkpoint(self) -> bool:
        return (self.path / STATE).is_file()

    @property
    def has_labels(self) -> bool:
        """A classifier of ours, or one we exported (an export keeps labels.json beside id2label)."""
        return (self.path / LABELS).is_file()


# ---------------------------------------------------------------------------------------- finding


def find_model_folder(path: str | Path, *, classifier: bool = False) -> ModelFolder:
    """The model folder that `path` names: itself, its `final/` or, unless a `classifier` is wanted,
    its newest checkpoint. With `classifier`, a folder that names no labels is refused."""
    path = Path(path)
    hint = CLASSIFIER_HINT if classifier else MODEL_HINT
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "does not exist"
        raise BertforgeError(f"model folder {path} {what}; {hint}")
    if (path / "final" / WEIGHTS).is_file():
        path = path / "final"
    elif not classifier and not (path / WEIGHTS).is_file() and list_checkpoints(path):
        newest = list_checkpoints(path)[-1]  # (a checkpoint has no labels: never a classifier folder)
        warnings.warn(
            f"{path} has no final/ model yet: using its newest checkpoint, {newest.name}", stacklevel=2
        )
        path = newest
    if is_hf_folder(path):
        folder = ModelFolder(path, path, hugging_face=True)
    else:
        check_model_files(path, hint)
        tokenizer_dir = own_tokenizer_folder(path)
        folder = ModelFolder(path, tokenizer_dir, hugging_face=False)
    if classifier and not folder.has_labels and not read_json(path / CONFIG).get("id2label"):
        raise BertforgeError(
            f"{path} holds a pretrained model, not a fine-tuned classifier or tagger (it names no labels); "
            "fine-tune it first with `bertforge finetune`"
        )
    return folder


def own_tokenizer_folder(path: Path) -> Path:
    """Where the tokenizer of a model folder of ours is: in it, or for a checkpoint its run's tokenizer/."""
    if (path / TOKENIZER_FILE).is_file():
        return path
    if path.parent.name == "checkpoints":
        return path.parent.parent / "tokenizer"
    raise BertforgeError(
        f"model folder {path} has no {TOKENIZER_FILE}; copy the tokenizer files saved with the model "
        "back into it (its run's tokenizer/ folder holds them)"
    )


def model_width(path: str | Path) -> int | None:
    """The hidden size of the model that `path` names, from its config alone (no weights read); None
    for a Hugging Face config that names none (opening the model then says what is wrong)."""
    return model_size(path, "hidden_size", "n_embd")


def model_positions(path: str | Path) -> int | None:
    """The longest sequence the model that `path` names reads, as `model_width` finds its width."""
    return model_size(path, "max_position_embeddings", "n_positions")


def model_size(path: str | Path, bert_key: str, gpt_key: str) -> int | None:
    folder = find_model_folder(path)
    if folder.hugging_face:
        hf = read_hf_config(folder.path)
        value = hf.get(bert_key, hf.get(gpt_key))
        return value if isinstance(value, int) else None
    return getattr(read_config(folder.path).model, bert_key)


def is_hf_folder(path: Path) -> bool:
    """A folder whose config.json is a Hugging Face config (it has `model_type`; ours has sections)."""
    try:
        return "model_type" in read_json(Path(path) / CONFIG)
    except (BertforgeError, OSError):
        return False


def check_model_files(path: Path, hint: str) -> None:
    """Refuse a folder of ours that lacks weights or config, naming a seed's folder where it has them."""
    seeds = sorted(p for p in [*path.glob("seed_*"), *path.glob("*/seed_*")] if p.is_dir())
    if seeds and not (path / WEIGHTS).is_file():
        raise BertforgeError(f"{path} holds one fine-tuning run per seed; give one of them, e.g. {seeds[0]}")
    kind = folder_kind(path)
    if kind is not None and kind.name == "pretraining run" and hint == CLASSIFIER_HINT:
        raise BertforgeError(f"{path} is a pretraining run, not a fine-tuned model; {hint}")
    if kind is not None and kind.name == "pretraining run" and not list_checkpoints(path):
        raise BertforgeError(
            f"{path} is a pretraining run with no model yet: neither final/ nor a checkpoint (one is saved "
            "every train.checkpoint_every steps); while it runs, wait for its first checkpoint"
        )
    if not (path / WEIGHTS).is_file() or not (path / CONFIG).is_file():
        raise BertforgeError(
            f"{path} is not a bertforge model folder (it needs {WEIGHTS} and {CONFIG}); {hint}"
        )


@dataclass(frozen=True)
class FolderKind:
    """What a folder holds (see `folder_kind`)."""

    # "pretraining run", "fine-tuning run", "fine-tuning seed" or "arm", "GLUE benchmark" or "part",
    # "checkpoint", "classifier", "model folder" (what `pretrain --init` starts from)
    name: str
    what: str  # for a message: "a fine-tuning run (it has finetune.json)"
    resume: str = ""  # the command that continues it; "" for a model folder, which nothing resumes


def folder_kind(path: str | Path) -> FolderKind | None:
    """The kind of bertforge folder `path` is, told by the files it holds (nothing is written); None
    for a folder of none of these kinds (an empty one, say)."""
    path = Path(path)
    quoted = shlex.quote(str(path))
    if (path / GLUE_SETTINGS).is_file():
        resume = f"bertforge glue --out {quoted} --resume"
        return FolderKind("GLUE benchmark", f"a GLUE benchmark (it has {GLUE_SETTINGS})", resume)
    if (run := fine_tuning_run(path)) is not None:
        return fine_tuning_kind(path, run)
    if (path / STATE).is_file():
        run = path.parent.parent
        owner = folder_kind(run) if path.parent.name == "checkpoints" else None
        if owner is None or not owner.resume:  # a checkpoint copied out of its run
            return FolderKind("checkpoint", f"a training checkpoint outside its run folder (it has {STATE})")
        what = f"a training checkpoint of the {owner.name} in {run} (it has {STATE})"
        return FolderKind("checkpoint", what, owner.resume)
    if is_hf_folder(path):
        return FolderKind("model folder", "a Hugging Face model (its config.json has a model_type)")
    if (path / LABELS).is_file():
        return FolderKind("classifier", f"{fine_tuned_kind(path)[0]} (it has {LABELS})")
    if (path / WEIGHTS).is_file():
        return FolderKind("model folder", f"a model folder (it has {WEIGHTS}: a run's final/ or an import)")
    if (path / CONFIG).is_file() and (path / RUN_TOKENIZER).is_dir():
        resume = f"bertforge pretrain --out {quoted} --resume"
        return FolderKind("pretraining run", "a pretraining run", resume)
    return None


def fine_tuning_run(path: Path) -> Path | None:
    """The fine-tuning run `path` is, or holds one arm or seed of: `RUN`, `RUN/seed_N` (`--seeds`),
    `RUN/ARM` or `RUN/ARM/seed_N` (`--compare-scratch`); None for any other folder."""
    if (path / FINETUNE_TASK).is_file():
        return path
    if (run := seeds_run(path)) is not None:
        return run
    return path.parent if path.name in ARMS and (path.parent / FINETUNE_TASK).is_file() else None


def fine_tuning_kind(path: Path, run: Path) -> FolderKind:
    """`path`, the fine-tuning run `run` or one of its arms or seeds; in a GLUE benchmark, whose tasks
    are fine-tuning runs, a part of the benchmark, which continues it."""
    part = "" if path == run else "arm" if path.name in ARMS else "seed"
    if (run.parent / GLUE_SETTINGS).is_file():
        task = f"the {run.name} task"
        what = f"one {part} of {task}" if part else task
        resume = f"bertforge glue --out {shlex.quote(str(run.parent))} --resume"
        return FolderKind("GLUE part", f"{what} of the GLUE benchmark in {run.parent}", resume)
    resume = f"bertforge finetune --out {shlex.quote(str(run))} --resume"
    if not part:
        return FolderKind("fine-tuning run", f"a fine-tuning run (it has {FINETUNE_TASK})", resume)
    return FolderKind(f"fine-tuning {part}", f"one {part} of the fine-tuning run in {run}", resume)


def seeds_run(path: Path) -> Path | None:
    """The fine-tuning run a `seed_N` folder belongs to: `RUN/seed_N` (`--seeds`), or with
    `--compare-scratch` `RUN/pretrained/seed_N` and `RUN/scratch/seed_N`; None for any other folder."""
    if not path.name.startswith("seed_"):
        return None
    for run in (path.parent, path.parent.parent):
        if (run / FINETUNE_TASK).is_file():
            return run
    return None


# ---------------------------------------------------------------------------------------- opening


def open_pretrained(
    path: str | Path, needs: tuple[str, ...] = ()
) -> tuple[PretrainingModel, BertTokenizer, RunConfig]:
    """Model, tokenizer and run config of any model folder but one of our classifiers (a Hugging Face
    classifier opens as its encoder with fresh pretraining heads, as `open_hf_folder` reads it).
    `needs`: the heads ("mlm", "nsp") the caller reads, refused where they are untrained."""
    folder = find_model_folder(path)
    if folder.hugging_face:
        model, tokenizer, config, report = open_hf_folder(folder.path)
        refuse_untrained(path, report["untrained"], needs)
        model.untrained_heads = report["untrained"]  # which `bertforge.infer` refuses to read
        return read_as_trained(model, config), tokenizer, config
    refuse_untrained(path, untrained_heads(folder.path), needs)
    if folder.has_labels:
        kind, command, opener = fine_tuned_kind(folder.path)
        raise BertforgeError(
            f"{folder.path} holds {kind} (it has {LABELS}), not a pretrained model with its "
            f"pretraining heads; use `bertforge {command}` (or bertforge.folders.{opener}) for it"
        )
    config, tokenizer = read_config_and_tokenizer(folder)
    model = pretraining_model(config.model)
    load_weights(model, folder.path / WEIGHTS)
    model.untrained_heads = pretraining_heads_untrained(folder.path, config)
    model = read_as_trained(model, config, folder)
    if model.max_length < config.trained_length:
        warnings.warn(
            f"{folder.path} was written during the {model.max_length}-token sequence-length warmup: its "
            f"positions past {model.max_length} had not trained yet",
            stacklevel=2,
        )
    return model.eval(), tokenizer, config


def fine_tuned_kind(path: Path) -> tuple[str, str, str]:
    """What a folder with labels holds, the command that reads it and the function that opens it."""
    if is_tagger_folder(path):
        return "a fine-tuned tagger", "tag", "open_tagger"
    return "a fine-tuned classifier", "classify", "open_classifier"


def untrained_heads(folder: Path, initialised: Sequence[str] = ()) -> list[str]:
    """The pretraining heads ("mlm", "nsp") that `folder` holds untrained: those its untrained_heads.json
    names (an import, or its export) and those among the weights `open_hf_folder` drew fresh."""
    named = (
        read_json(folder / UNTRAINED_HEADS).get("heads", []) if (folder / UNTRAINED_HEADS).is_file() else []
    )
    drawn = [head for head, (prefix, _) in HEADS.items() if any(n.startswith(prefix) for n in initialised)]
    return [head for head in HEADS if head in named or head in drawn]


def pretraining_heads_untrained(folder: Path, config: RunConfig) -> list[str]:
    """The heads a pretraining folder of ours holds untrained: an import's, and a BERT's NSP head where
    the run trained MLM alone."""
    untrained = untrained_heads(folder)
    mlm_alone = config.model.objective == "mlm" and not trains_nsp(config)
    return untrained + ["nsp"] if mlm_alone and "nsp" not in untrained else untrained


def refuse_untrained(path: str | Path, untrained: list[str], needs: tuple[str, ...]) -> None:
    for head in (head for head in needs if head in untrained):
        raise BertforgeError(
            f"{path} has no trained {HEADS[head][1]} head: the Hugging Face weights it comes from have none "
            "(BertModel has neither head, BertForMaskedLM no NSP head), so its predictions would be noise; "
            "use a folder with that head (BertForPreTraining), or train it: bertforge pretrain --init "
            f"{shlex.quote(str(path))} --corpus TEXT --out RUN"
        )


def open_encoder(path: str | Path) -> tuple[RunConfig, BertTokenizer, dict[str, torch.Tensor]]:
    """Run config, tokenizer and encoder weights (`BertModel`'s, or a GPT's `GPTModel`'s) of any model
    folder. Pretraining heads (`cls.*`, `lm_head`) and classifier heads are left out: fine-tuning
    starts from the encoder (and BERT's pooler) only."""
    folder = find_model_folder(path)
    if folder.hugging_face:
        model, tokenizer, config, _ = open_hf_folder(folder.path)
        return config, tokenizer, getattr(model, ENCODER[config.model.objective]).state_dict()
    config, tokenizer = read_config_and_tokenizer(folder)
    weights = read_weights(folder.path / WEIGHTS)
    prefix = ENCODER[config.model.objective] + "."
    encoder = {name[len(prefix) :]: t for name, t in weights.items() if name.startswith(prefix)}
    return config, tokenizer, encoder


def encoder_trained_length(path: str | Path, config: RunConfig) -> int:
    """The longest sequence the model that `path` names trained at (`trained_length`), `config` its
    run config as `open_encoder` read it."""
    return trained_length(config, find_model_folder(path))


def open_classifier(path: str | Path) -> tuple[Classifier, BertTokenizer, list[str], RunConfig]:
    """Model, tokenizer, label names and run config of a classifier folder (ours or exported), or of
    a fine-tuning run folder's `final/`."""
    folder = find_model_folder(path, classifier=True)
    if is_tagger_folder(folder.path):
        raise BertforgeError(
            f"{folder.path} holds a tagger (a token classifier for named entities), not a sequence "
            "classifier; use `bertforge tag` (or bertforge.folders.open_tagger) for it"
        )
    return open_labelled_model(folder, sequence_classifier)


def open_tagger(path: str | Path) -> tuple[BertForTokenClassification, BertTokenizer, list[str], RunConfig]:
    """Model, tokenizer, tag names and run config of a tagger folder (ours, exported, or a Hugging Face
    `BertForTokenClassification`), or of a tagging run folder's `final/`."""
    folder = find_model_folder(path, classifier=True)
    if not is_tagger_folder(folder.path):
        raise BertforgeError(
            f"{folder.path} holds a sequence classifier, not a tagger; use `bertforge classify` for it, "
            "or fine-tune a tagger on a tagged file (CoNLL) with `bertforge finetune`"
        )
    return open_labelled_model(folder, token_classifier)


def open_any_model(path: str | Path) -> tuple[torch.nn.Module, BertTokenizer]:
    """Model and tokenizer of any model folder: a pretrained BERT or GPT, a classifier or a tagger."""
    folder = find_model_folder(path)
    if not folder.has_labels:
        model, tokenizer, _ = open_pretrained(folder.path)
        return model, tokenizer
    opener = open_tagger if is_tagger_folder(folder.path) else open_classifier
    model, tokenizer, _, _ = opener(folder.path)
    return model, tokenizer


def open_labelled_model(
    folder: ModelFolder, build
) -> tuple[torch.nn.Module, BertTokenizer, list[str], RunConfig]:
    """A classifier or tagger folder's model (made by `build(model config, number of labels)`),
    tokenizer, label names and run config."""
    if folder.hugging_face:
        config, tokenizer, weights = hf_classifier_parts(folder.path)
    else:
        config, tokenizer = read_config_and_tokenizer(folder)
        weights = read_weights(folder.path / WEIGHTS)
    labels = read_labels(folder.path)
    model = build(config.model, len(labels))
    if not any(name.startswith(POOLER) for name in model.state_dict()):  # a tagger
        weights = {name: tensor for name, tensor in weights.items() if not name.startswith(POOLER)}
    check_and_load_state(model, weights, source=str(folder.path / WEIGHTS))
    return read_as_trained(model, config).eval(), tokenizer, labels, config


def read_as_trained(
    model: torch.nn.Module, config: RunConfig, folder: ModelFolder | None = None
) -> torch.nn.Module:
    """`model`, marked with the length it was trained at (`model.max_length`, which inference reads
    up to: positions past it never trained)."""
    model.max_length = trained_length(config, folder)
    return model


def trained_length(config: RunConfig, folder: ModelFolder | None = None) -> int:
    """The longest sequence the model in `folder` has trained at: its run's (`RunConfig.trained_length`),
    or for a checkpoint written during the sequence-length warmup, the warmup's (its state says the
    warmup has not ended; a state without that key counts as ended)."""
    if folder is not None and folder.is_checkpoint and config.data.warmup_seq_length:
        state = read_state(folder.path)
        if "warmup_end_epoch" in state and state["warmup_end_epoch"] is None:
            return min(config.data.warmup_seq_length, config.trained_length)
    return config.trained_length


def open_hf_folder(path: str | Path) -> tuple[PretrainingModel, BertTokenizer, RunConfig, dict]:
    """Model (BERT with its pretraining heads, or GPT's language model), tokenizer, run config and a
    report `{"initialised", "dropped", "untrained"}` from a Hugging Face BERT or OpenAIGPT folder: head
    weights it lacked (drawn fresh, as Hugging Face does), task heads it had that pretraining does not
    use, and the pretraining heads left untrained (`untrained_heads`)."""
    src = Path(path)
    if not src.is_dir():
        raise BertforgeError(f"{src} is not a folder; give a Hugging Face model folder")
    model_config, tokenizer = hf_model_config_and_tokenizer(src)
    config = run_config_for(src, model_config, tokenizer)
    check_tokenizer_fits(tokenizer, config, src, recorded=False)
    weights = read_hf_weights(src)
    if model_config.objective == "clm":
        model, dropped = gpt_convert.language_model_from_hf(model_config, weights, src)
        return model, tokenizer, config, {"initialised": [], "dropped": dropped, "untrained": []}
    model, report = bert_convert.model_from_hf_weights(model_config, weights, src)
    report["untrained"] = untrained_heads(src, report["initialised"])
    if "nsp" in report["untrained"]:
        config.data.nsp = config.data.warmup_nsp = False  # nothing trained its NSP head
    return model.eval(), tokenizer, config, report


def read_config_and_tokenizer(folder: ModelFolder) -> tuple[RunConfig, BertTokenizer]:
    """The run config and tokenizer of a model folder of ours, checked to fit each other; a checkpoint's
    weights and config checked against the hashes written with them, whoever goes on to read them."""
    if folder.is_checkpoint:
        verify_checkpoint(folder.path, (WEIGHTS, CONFIG))
    config = read_config(folder.path)
    tokenizer = load_tokenizer(folder.tokenizer_dir)
    check_tokenizer_fits(tokenizer, config, folder.path)
    check_tokenizer_is_the_models(tokenizer, folder.path)
    if folder.is_checkpoint:  # its weights name no tokenizer; its run's data.json does
        check_tokenizer_is_the_runs(tokenizer, folder.tokenizer_dir.parent)
    return config, tokenizer


# ---------------------------------------------------------------------------- Hugging Face folders


def hf_model_config_and_tokenizer(src: Path) -> tuple[ModelConfig, BertTokenizer]:
    """The model config and tokenizer (in bertforge's form) of a Hugging Face BERT or OpenAIGPT folder."""
    raw = read_hf_config(src)
    if raw["model_type"] == gpt_convert.MODEL_TYPE:
        model_config = gpt_convert.model_config_from_hf(raw, str(src / CONFIG))
        return model_config, bert_form(read_hf_tokenizer(src))
    return bert_convert.model_config_from_hf(raw, src), read_hf_tokenizer(src)


def hf_classifier_parts(src: Path) -> tuple[RunConfig, BertTokenizer, dict[str, torch.Tensor]]:
    """Run config, tokenizer and weights (in our names) of an exported BERT or OpenAIGPT classifier.

    The config is the fine-tuning run's where bertforge exported the folder, so that it is read at
    the length it was fine-tuned at; another's is read as `transformers` reads it, up to its positions."""
    refuse_other_problem_types(src)
    model_config, tokenizer = hf_model_config_and_tokenizer(src)
    config = run_config_for(src, model_config, tokenizer)
    check_tokenizer_fits(tokenizer, config, src, recorded=False)
    weights = read_hf_weights(src)
    if model_config.objective == "clm":
        return config, tokenizer, gpt_convert.from_hf_state_dict(weights)
    return config, tokenizer, bert_convert.classifier_weights(weights)


def refuse_other_problem_types(src: Path) -> None:
    """A classifier's outputs are one softmax over its labels, or one score: refuse a Hugging Face
    classifier made for another reading (a sigmoid per label, or several scores)."""
    raw = read_hf_config(src)
    problem, outputs = raw.get("problem_type"), len(raw.get("id2label") or {}) or raw.get("num_labels", 2)
    if problem == "multi_label_classification" or (problem == "regression" and outputs > 1):
        kind = (
            "a multi-label classifier" if problem != "regression" else f"a regression with {outputs} scores"
        )
        raise BertforgeError(
            f"{src / CONFIG} has problem_type = {problem!r}: {kind}, which bertforge does not read (its "
            "classifiers give one label per text, or one score); use transformers for it"
        )


def read_hf_config(src: Path) -> dict:
    path = src / CONFIG
    if not path.is_file():
        raise BertforgeError(f"{src} has no {CONFIG}; it is not a Hugging Face model folder")
    raw = read_json(path, damaged="it is not a Hugging Face model config")
    if "model_type" not in raw:
        ours = "model" in raw and "data" in raw  # a bertforge run's or model folder's config
        own = " (it is bertforge's own: use the folder as it is, or start a run from it with --init)"
        raise BertforgeError(
            f"{path} has no model_type; it is not a Hugging Face model config{own if ours else ''}"
        )
    return raw


def read_hf_tokenizer(src: Path) -> BertTokenizer:
    """The source's tokenizer (tokenizer.json, or vocab.txt with tokenizer_config.json's casing).

    Staged in a temporary folder so that a tokenizer.json saved with truncation or padding turned
    on loads without them, and a bare vocab.txt gets its casing.
    """
    backend = None
    if (src / TOKENIZER_FILE).is_file():
        try:
            backend = Tokenizer.from_file(str(src / TOKENIZER_FILE))
        except Exception as error:  # the Rust side raises a bare Exception for any parse problem
            raise BertforgeError(f"{src / TOKENIZER_FILE} is not a valid tokenizer file ({error})") from None
    elif (src / "merges.txt").is_file():  # GPT-1's and GPT-2's byte-pair files, without a tokenizer.json
        raise BertforgeError(
            f"{src} holds a BPE tokenizer (vocab.json and merges.txt); bertforge supports WordPiece and "
            "WordLevel tokenizers: import a folder with one (as `bertforge export` writes), or pretrain a "
            "GPT here (--objective clm)"
        )
    elif not (src / VOCAB_FILE).is_file():
        raise BertforgeError(
            f"{src} has neither {TOKENIZER_FILE} nor {VOCAB_FILE}: it holds no tokenizer; copy in the "
            "model's tokenizer files"
        )
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp)
        if backend is not None:
            backend.save(str(staged / TOKENIZER_FILE))
        else:
            shutil.copyfile(src / VOCAB_FILE, staged / VOCAB_FILE)
            casing = {"kind": "wordpiece", "lowercase": hf_lowercase(src)}
            write_json(staged / SETTINGS_FILE, casing)
        if (src / SETTINGS_FILE).is_file():  # a bertforge export: kind, casing, min_frequency
            shutil.copyfile(src / SETTINGS_FILE, staged / SETTINGS_FILE)
        try:
            return load_tokenizer(staged)
        except BertforgeError as error:
            raise BertforgeError(str(error).replace(str(staged), str(src))) from None


def run_config_for(src: Path, model_config: ModelConfig, tokenizer: BertTokenizer) -> RunConfig:
    """Our run config for an imported model: the one a bertforge export carries, or defaults; the
    model section always comes from config.json and the tokenizer section from the tokenizer. Another's
    model is taken as trained at all its positions (Google's BERTs ended at 512 tokens, GPT-1 on windows)."""
    ours = (src / BERTFORGE_CONFIG).is_file()
    config = load_json(src / BERTFORGE_CONFIG) if ours else RunConfig()
    if not ours:
        config.data.max_seq_length = model_config.max_position_embeddings
    config.model = model_config
    config.tokenizer.kind = tokenizer.kind
    config.tokenizer.lowercase = tokenizer.lowercase
    config.tokenizer.vocab_size = tokenizer.vocab_size
    config.data.max_seq_length = min(config.data.max_seq_length, model_config.max_position_embeddings)
    if model_config.type_vocab_size < 2:  # one segment (RoBERTa-like BERTs): no sentence pairs, no NSP
        config.data.nsp = config.data.warmup_nsp = False
    validate(config)
    return config


def read_hf_weights(src: Path) -> dict[str, torch.Tensor]:
    """All tensors of `model.safetensors` or `pytorch_model.bin`, sharded or not (`.index.json`).

    Only files inside `src` are read: an index naming `../x` or `/x`, or a symlink that leads out
    of the folder, is refused (a downloaded folder must not make bertforge read other files).
    """
    for name in (WEIGHTS, HF_BIN):
        index = src / f"{name}.index.json"
        if index.is_file():
            shards = [inside(src, shard) for shard in shard_files(inside(src, index))]
            return {k: v for shard in shards for k, v in read_weights(shard).items()}
        if (src / name).is_file():
            return read_weights(inside(src, src / name))
    raise BertforgeError(
        f"{src} has no weights: expected {WEIGHTS} or {HF_BIN} (TensorFlow and Flax weights are not read)"
    )


def shard_files(index: Path) -> list[Path]:
    raw = read_json(index, damaged="the model folder may be damaged")
    try:
        names = sorted(set(raw["weight_map"].values()))
    except (KeyError, AttributeError, TypeError) as error:
        raise BertforgeError(f"{index} is damaged ({error})") from None
    for name in names:
        if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
            raise BertforgeError(
                f"{index} names the weight file {name!r}, outside its folder; "
                "an index may name only files beside it"
            )
    return [index.parent / name for name in names]


def inside(src: Path, path: Path) -> Path:
    """`path`, refused when it resolves (through symlinks) outside `src`. A Hugging Face cache
    snapshot (`.../snapshots/REV/`) links its files into the repository's `blobs/`: allowed."""
    root, target = src.resolve(), path.resolve()
    allowed = [root]
    if root.parent.name == "snapshots":
        allowed.append(root.parent.parent / "blobs")
    if not any(folder in target.parents for folder in allowed):
        raise BertforgeError(
            f"{path} leads to {target}, outside {src}; bertforge reads weights only from inside "
            "the model folder (copy the file in instead of linking it)"
        )
    return path


def refuse_glue_part(out: Path) -> None:
    """Refuse to resume a task of a GLUE benchmark, or one of its arms or seeds, as a fine-tuning run of
    its own: `glue` continues it, and scores it."""
    kind = folder_kind(out)
    if kind is not None and kind.name == "GLUE part":
        raise BertforgeError(
            f"{out} holds {kind.what}, not a fine-tuning run to resume; continue it with: {kind.resume}"
        )


def refuse_other_kind(out: Path, wanted: str, model_hint: str = "", resume: bool = True) -> None:
    """Refuse to resume (or with `resume` False, to start), in `out`, a run of the kind named `wanted`
    ("pretraining run", say) when the folder holds something else, naming what it holds and how that
    continues; `model_hint` follows the name of a model folder (e.g. how to train from it)."""
    kind = folder_kind(out)
    if kind is None or kind.name == wanted:
        return
    if kind.name == "GLUE part" and wanted == "fine-tuning run" and (Path(out) / FINETUNE_TASK).is_file():
        return  # a GLUE task: `glue` resumes it as a fine-tuning run (`refuse_glue_part` stops users)
    if not resume:
        raise BertforgeError(f"{out} holds {kind.what}; choose a new `out` for the {wanted}")
    then = f"; continue it with: {kind.resume}" if kind.resume else ""
    if not kind.resume and kind.name == "model folder":
        then = model_hint
    raise BertforgeError(f"{out} holds {kind.what}, not a {wanted} to resume{then}")
