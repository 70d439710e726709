"""What a model looks like on disk: weights, training checkpoints and model folders.

A checkpoint folder (`checkpoints/step_000200/`) holds everything needed to resume exactly:

    model.safetensors   weights; tied aliases (the MLM decoder, a GPT's LM head) are dropped, as
                        Hugging Face does
    optimizer.pt        optimizer and grad-scaler state: tensors and plain values only, so it loads
                        with `torch.load(weights_only=True)`
    state.json          step, data position, elapsed time, RNG states, last metrics, and the
                        sha256 of the weights, optimizer and config
    config.json         the effective run config
    checksums.json      the sha256 of every other file, state.json included, written last; a
                        checkpoint is checked against it before anything of it is used

A model folder (`final/`) holds `model.safetensors`, `config.json` and the tokenizer files;
`bertforge.folders` finds the folder a path names and opens it with the readers here. Weights
written here carry a hash of their tensors in their metadata, checked as they are read, so a
flipped bit in a model folder is an error, not wrong predictions.
Every folder is written beside its final name and renamed into place, so a crash never leaves a
half-written checkpoint that `--resume` would pick up; a checkpoint damaged later (a flipped bit,
a truncated file, a removed file) fails its hash check and is reported as `DamagedCheckpoint`.
A checkpoint without checksums.json, whose state.json does not say it has one, is checked against the
hashes its state.json holds (if any); its state.json itself cannot be.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import pickle
import re
import struct
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from bertforge.config import ModelConfig, RunConfig, load_json, save_json, validate_saved
from bertforge.errors import BertforgeError
from bertforge.gpt import GPT_TIED_KEYS, GPTLMHeadModel
from bertforge.io import atomic_directory, file_sha256, read_json, remove_folder, write_json
from bertforge.model import TIED_KEYS, BertForPreTraining
from bertforge.tokenizer import BertTokenizer

WEIGHTS = "model.safetensors"
TOKENIZER_METADATA = "tokenizer_fingerprint"  # in the weights' metadata
TENSORS_METADATA = "tensors_sha256"  # in the weights' metadata
OPTIMIZER = "optimizer.pt"
STATE = "state.json"
CONFIG = "config.json"
CHECKSUMS = "checksums.json"  # a checkpoint's manifest: {"sha256": {file name: hex digest}}
LABELS = "labels.json"  # a classifier folder's label names, in id order
CHECKPOINT_PATTERN = re.compile(r"^step_(\d{6,})$")
HASHED = (WEIGHTS, OPTIMIZER, CONFIG)  # the files whose sha256 state.json records
TIED = {**TIED_KEYS, **GPT_TIED_KEYS}  # aliases of tied tensors, BERT's and GPT's: never saved
CLASSIFIER_HEADS = ("classifier.", "score.")  # a BERT and a GPT classifier's head: one row per label


class DamagedCheckpoint(BertforgeError):
    """A checkpoint or model file that is missing, unreadable, or not what was written."""


def weights_to_save(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict without tied aliases, as contiguous CPU tensors (safetensors refuses shared ones)."""
    return {
        name: tensor.detach().to("cpu").contiguous()
        for name, tensor in model.state_dict().items()
        if name not in TIED
    }


def save_weights(model: torch.nn.Module, path: Path, tokenizer: BertTokenizer | None = None) -> None:
    """Write weights to `path` (inside a folder that is itself written atomically); the metadata names
    the `tokenizer` they were trained with, which `check_tokenizer_is_the_models` compares."""
    tensors = weights_to_save(model)
    metadata = {"format": "pt", TENSORS_METADATA: tensors_sha256(tensors)}
    if tokenizer is not None:
        metadata[TOKENIZER_METADATA] = tokenizer.fingerprint
    save_file(tensors, str(path), metadata=metadata)
    sort_metadata(path)


def sort_metadata(path: Path) -> None:
    """Rewrite a safetensors file's header with its metadata in key order (safetensors writes them in
    hash-map order), so that equal weights give equal bytes. The header keeps its length."""
    with open(path, "r+b") as file:
        (length,) = struct.unpack("<Q", file.read(8))  # the header's bytes, after these 8
        header = json.loads(file.read(length))
        header["__metadata__"] = dict(sorted(header.get("__metadata__", {}).items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(text) <= length:  # as written, in another order: it fits (padded as safetensors pads)
            file.seek(8)
            file.write(text.ljust(length))


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """One hash of named tensors' bytes, whatever their dtype."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode("utf-8"))
        digest.update(tensors[name].detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def check_tokenizer_is_the_models(tokenizer: BertTokenizer, folder: Path) -> None:
    """Refuse a tokenizer other than the one the model in `folder` was trained with, where its weights
    name one, else where the tokenizer's own settings file did (`saved_fingerprint`: tokenizer.json
    replaced alone). Same-size tokenizers pass `check_tokenizer_fits`, and would give other words silently."""
    expected = weights_tokenizer(folder / WEIGHTS) or tokenizer.saved_fingerprint
    if expected and expected != tokenizer.fingerprint:
        raise BertforgeError(
            f"{tokenizer.source} is not the tokenizer the model in {folder} was trained with (another "
            f"fingerprint: {tokenizer.fingerprint}, not {expected}); use the tokenizer saved with the model"
        )


RUN_DATA = "data.json"  # a pretraining run's data files' hashes and its tokenizer's fingerprint


def check_tokenizer_is_the_runs(tokenizer: BertTokenizer, run: Path) -> None:
    """Refuse a tokenizer in a pretraining run's folder other than the one the run started with (the
    fingerprint its data.json records; a run without one is not checked): its checkpoints' weights name
    none."""
    path = run / RUN_DATA
    started_with = read_json(path).get("tokenizer") if path.is_file() else None
    if started_with not in (None, tokenizer.fingerprint):
        raise BertforgeError(
            f"{run / 'tokenizer'} is not the tokenizer this run started with ({path} holds another "
            "fingerprint); put the run's own tokenizer back, or start a new run"
        )


def weights_tokenizer(path: Path) -> str | None:
    """The fingerprint of the tokenizer named in a weights file's metadata; None where there is none
    (files written without it, Hugging Face's)."""
    return weights_metadata(path).get(TOKENIZER_METADATA)


def holds_weights(folder: Path, model: torch.nn.Module) -> bool:
    """Whether the weights of the model folder are `model`'s as they are now (by the hash saved in
    their metadata)."""
    saved = weights_metadata(folder / WEIGHTS).get(TENSORS_METADATA)
    return saved is not None and saved == tensors_sha256(weights_to_save(model))


def weights_metadata(path: Path) -> dict[str, str]:
    """A safetensors file's metadata; empty where it has none or cannot be read (reading the weights
    says why)."""
    try:
        with safe_open(str(path), "pt") as weights:
            return weights.metadata() or {}
    except (SafetensorError, OSError, ValueError):
        return {}


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a weights file: safetensors, or a pickled PyTorch state dict (Hugging Face's
    `pytorch_model.bin`); `DamagedCheckpoint` when it is missing or cannot be read."""
    if not path.is_file():
        raise DamagedCheckpoint(f"{path} is missing; the model folder is incomplete")
    if path.suffix != ".safetensors":
        return read_pickled_weights(path)
    in_checkpoint = (path.parent / STATE).is_file()
    fix = "use another checkpoint" if in_checkpoint else "replace it with an intact copy of the model"
    try:
        with safe_open(str(path), "pt") as weights:
            expected = (weights.metadata() or {}).get(TENSORS_METADATA)  # none in files written without it
            tensors = {name: weights.get_tensor(name) for name in weights.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as error:
        raise DamagedCheckpoint(f"{path} is damaged and cannot be read ({error}); {fix}") from None
    if expected is not None and tensors_sha256(tensors) != expected:
        raise DamagedCheckpoint(f"{path} is damaged: its tensors differ from the hash saved with them; {fix}")
    return tensors


def read_pickled_weights(path: Path) -> dict[str, torch.Tensor]:
    try:
        # weights_only: a pickle from the internet must not run code.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several unrelated types for a bad file
        raise DamagedCheckpoint(
            f"{path} cannot be read as PyTorch weights ({type(error).__name__}): it may be cut short or "
            "another kind of file; replace it with an intact copy"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise DamagedCheckpoint(
            f"{path} does not hold a state dict of tensors; give the weights file that `save_pretrained` "
            "or `torch.save(model.state_dict())` writes"
        )
    return state


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load safetensors weights into `model`, refusing any mismatch with a clear message."""
    check_and_load_state(model, read_weights(path), source=str(path))


def check_and_load_state(model: torch.nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """Load `weights` into `model` once `check_keys_and_shapes` accepts them (tied aliases aside)."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items() if name not in TIED}
    given = {name: t for name, t in weights.items() if name not in TIED}
    check_keys_and_shapes(given, expected, source)
    model.load_state_dict(given, strict=False)
    if hasattr(model, "tie_weights"):
        model.tie_weights()


def check_keys_and_shapes(
    weights: dict[str, torch.Tensor],
    expected: dict[str, tuple[int, ...]],
    source: str | Path,
    expected_by: str = "the model expects",
) -> None:
    """Refuse `weights` unless they hold exactly the `expected` names, each of the expected shape;
    `expected_by` says where the shapes come from (in the message)."""
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise BertforgeError(
            f"{source} does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}; "
            "was it saved by another architecture?"
        )
    for name, shape in expected.items():
        given = tuple(weights[name].shape)
        if given != shape:
            hint = shape_hint(name, given, shape)
            raise BertforgeError(f"{source}: {name} has shape {given} but {expected_by} {shape}{hint}")


def shape_hint(name: str, given: tuple[int, ...], expected: tuple[int, ...]) -> str:
    """Which setting a misshapen tensor points at: the word embeddings' rows are `model.vocab_size`,
    a classifier head's rows the labels."""
    if "word_embeddings" in name and len(given) == len(expected) == 2:
        if given[0] != expected[0]:
            rows = f"model.vocab_size is {expected[0]} but the weights have {given[0]} rows"
            return f" ({rows}: was config.json edited?)"
        return (
            f" (model.hidden_size is {expected[1]} but the weights have {given[1]}: was config.json edited?)"
        )
    if name.startswith(CLASSIFIER_HEADS) and given[0] != expected[0]:
        return f" ({expected[0]} labels are named but the head has {given[0]} rows: was {LABELS} edited?)"
    return " (the config's model sizes do not match these weights: was config.json edited?)"


def encode_rng(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def decode_rng(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def rng_states(device: torch.device) -> dict:
    """Torch's global RNG states that dropout on `device` draws from: the CPU's, and on CUDA that GPU's
    only (a process trains on one device; other GPUs may not be visible where it resumes). Data
    order and masking use their own seeds."""
    states = {"torch_cpu": encode_rng(torch.get_rng_state())}
    if device.type == "cuda":
        states["torch_cuda"] = encode_rng(torch.cuda.get_rng_state(device))
    return states


def restore_rng_states(states: dict, device: torch.device) -> None:
    torch.set_rng_state(decode_rng(states["torch_cpu"]))
    saved = states.get("torch_cuda")
    if device.type != "cuda" or saved is None:
        return
    if isinstance(saved, list):  # written before only the own device's state was kept: one per GPU
        index = device.index or 0
        saved = saved[index] if index < len(saved) else None
    if saved is not None:
        torch.cuda.set_rng_state(decode_rng(saved), device)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    state: dict,
    config: RunConfig,
) -> Path:
    """Write `checkpoints/step_NNNNNN/` atomically and return its path."""
    target = checkpoint_dir(run_dir, step)
    with atomic_directory(target) as tmp:
        save_weights(model, tmp / WEIGHTS)
        extra = {"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict() if scaler else None}
        with (tmp / OPTIMIZER).open("wb") as handle:  # a full disk then surfaces as Python's OSError
            torch.save(extra, handle)
        save_json(config, tmp / CONFIG)
        hashes = {name: file_sha256(tmp / name) for name in HASHED}
        rng = rng_states(model_device(model))
        write_json(tmp / STATE, dict(state, step=step, rng=rng, sha256=hashes, checksums=CHECKSUMS))
        write_checksums(tmp, hashes)
    return target


def write_checksums(folder: Path, known: dict[str, str]) -> None:
    """Record the sha256 of every file in `folder` (those in `known` already hashed) in its
    checksums.json, the last file written."""
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != CHECKSUMS)
    hashes = {name: known.get(name) or file_sha256(folder / name) for name in files}
    write_json(folder / CHECKSUMS, {"sha256": hashes})


def verify_checkpoint(path: Path, names: tuple[str, ...] | None = None) -> None:
    """Check the files of checkpoint folder `path` (all of them, or `names`) against its
    checksums.json; a checkpoint without one (see the module's docstring) against its state.json's hashes."""
    manifest = path / CHECKSUMS
    if not manifest.is_file():
        state = read_state(path)
        if state.get("checksums"):  # written with one, which is gone
            raise DamagedCheckpoint(f"{manifest} is missing; the checkpoint is incomplete")
        verify_files(path, state, names or HASHED)
        return
    damaged, missing = "use another checkpoint", "the checkpoint is incomplete"
    recorded = read_json(manifest, damaged=damaged, missing=missing, error=DamagedCheckpoint).get("sha256")
    if not isinstance(recorded, dict) or STATE not in recorded:
        raise DamagedCheckpoint(f"{manifest} does not list the checkpoint's files; {damaged}")
    for name in names or tuple(recorded):
        if name not in recorded:
            raise DamagedCheckpoint(f"{manifest} does not list {name}; {damaged}")
        check_hash(path, name, recorded[name])


def verify_files(path: Path, state: dict, names: tuple[str, ...] = HASHED) -> None:
    """Check `names` in checkpoint folder `path` against the sha256 its state.json recorded (none in
    the oldest checkpoints)."""
    recorded = state.get("sha256") or {}
    for name in names:
        if name in recorded:
            check_hash(path, name, recorded[name])


def check_hash(path: Path, name: str, sha256: str) -> None:
    """Refuse file `name` of checkpoint `path` unless it is there with this sha256."""
    if not (path / name).is_file():
        raise DamagedCheckpoint(f"{path / name} is missing; the checkpoint is incomplete")
    if file_sha256(path / name) != sha256:
        raise DamagedCheckpoint(
            f"checkpoint {path} is damaged: {name} differs from what was written (sha256 mismatch)"
        )


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first (temporary siblings are never matched)."""
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and CHECKPOINT_PATTERN.match(p.name)]
    return sorted(found, key=checkpoint_step)


def checkpoint_step(path: Path) -> int:
    """The step of a checkpoint folder `step_NNNNNN` (one `list_checkpoints` found)."""
    return int(CHECKPOINT_PATTERN.match(path.name).group(1))


def prune_checkpoints(run_dir: Path, keep: int, saved_step: int) -> None:
    """Delete all but the newest `keep` checkpoints up to `saved_step`, the one just written, each
    renamed aside first (see `remove_folder`). Any later one is deleted too: a resume went back past
    it (it was damaged), and kept, it would count as newer than the checkpoints the run goes on to save."""
    checkpoints = list_checkpoints(run_dir)
    reached = [path for path in checkpoints if checkpoint_step(path) <= saved_step]
    later = checkpoints[len(reached) :]  # oldest first: the rest are past `saved_step`
    for old in reached[:-keep] + later:
        with contextlib.suppress(OSError):  # a checkpoint that cannot be deleted is merely kept
            remove_folder(old)


def load_checkpoint(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
) -> dict:
    """Restore model, optimizer, scaler and RNG from a checkpoint folder; return its state dict.

    Every file is checked against its recorded hash before anything is loaded.
    """
    verify_checkpoint(path)
    state = read_state(path)
    load_weights(model, path / WEIGHTS)
    try:
        extra = torch.load(path / OPTIMIZER, map_location="cpu", weights_only=True)
        optimizer.load_state_dict(extra["optimizer"])
    except FileNotFoundError:
        raise DamagedCheckpoint(f"{path / OPTIMIZER} is missing; the checkpoint is incomplete") from None
    except (RuntimeError, KeyError, ValueError, EOFError, pickle.UnpicklingError) as error:
        cause = str(error).split(". ")[0]  # torch's reasons run on for several sentences
        raise DamagedCheckpoint(
            f"{path / OPTIMIZER} is damaged or from another model ({cause}); use another checkpoint"
        ) from None
    if scaler is not None and extra.get("scaler"):
        scaler.load_state_dict(extra["scaler"])
    try:
        restore_rng_states(state["rng"], model_device(model))
    except (KeyError, TypeError, ValueError, RuntimeError) as error:  # binascii.Error is a ValueError
        raise DamagedCheckpoint(
            f"{path / STATE} holds a damaged random state ({error}); use another checkpoint"
        ) from None
    return state


COUNTS = ("step", "epoch", "batch", "tokens")  # state.json's whole numbers
AT_LEAST_ONE = ("micro_batch", "world_size")  # and those that cannot be 0


def read_state(path: Path) -> dict:
    state = read_json(
        path / STATE,
        damaged="use another checkpoint",
        missing="the checkpoint is incomplete",
        error=DamagedCheckpoint,
    )
    if "step" not in state or not isinstance(state.get("rng"), dict):
        raise DamagedCheckpoint(f"{path / STATE} does not hold a bertforge training state")
    for name, least in [*((name, 0) for name in COUNTS), *((name, 1) for name in AT_LEAST_ONE)]:
        if name in state and not is_count(state[name], least):
            raise DamagedCheckpoint(
                f"{path / STATE} holds {name} = {state[name]!r}, not a whole number from {least}; "
                "use another checkpoint"
            )
    elapsed = state.get("elapsed_s", 0.0)
    if isinstance(elapsed, bool) or not isinstance(elapsed, int | float) or not 0 <= elapsed < math.inf:
        raise DamagedCheckpoint(
            f"{path / STATE} holds elapsed_s = {elapsed!r}, not a number of seconds from 0; "
            "use another checkpoint"
        )
    return state


def is_count(value, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def read_config(folder: Path) -> RunConfig:
    """A run, checkpoint or model folder's config, its model, tokenizer and data sections checked (an
    edited or damaged one is named as such, not reported later as weights that do not fit or a
    sequence that the model cannot read)."""
    config = load_json(folder / CONFIG)
    validate_saved(config, folder / CONFIG, "the file was edited or is damaged")
    return config


def pretraining_model(config: ModelConfig) -> BertForPreTraining | GPTLMHeadModel:
    """The model `config.objective` pretrains: BERT with its MLM and NSP heads ("mlm"), or GPT-1 with
    its language-model head ("clm")."""
    return GPTLMHeadModel(config) if config.objective == "clm" else BertForPreTraining(config)


PADDING_ROWS = 128  # below this many extra rows, a Hugging Face model's rows are taken as padding


def check_tokenizer_fits(
    tokenizer: BertTokenizer, config: RunConfig, source: Path, recorded: bool = True
) -> None:
    """One embedding row per token, or a padded vocabulary: more rows than tokens (Hugging Face models
    pad to a multiple of 8 or 64 for speed), recorded as such by the config's tokenizer section holding
    the tokenizer's own size. The extra rows stand for no token and are never predicted. A Hugging Face
    folder records no tokenizer size (`recorded` False): there, fewer than `PADDING_ROWS` extra rows are
    padding, and more mean the tokenizer is another model's."""
    tokens, rows = tokenizer.vocab_size, config.model.vocab_size
    padded = (
        tokens < rows and config.tokenizer.vocab_size == tokens and (recorded or rows < tokens + PADDING_ROWS)
    )
    if tokens == rows or padded:
        return
    expects = f"has only {rows} embedding rows" if tokens > rows else f"expects {rows}"
    raise BertforgeError(
        f"the tokenizer has {tokens} tokens but the model in {source} {expects} (model.vocab_size): "
        "tokenizer and model do not match; use the tokenizer saved with the model"
    )


def save_model_folder(
    folder: Path,
    model: torch.nn.Module,
    tokenizer: BertTokenizer,
    config: RunConfig,
    notes: dict | None = None,
) -> None:
    """Write weights, config and tokenizer files into `folder`, atomically; `notes`: more JSON
    files, by name."""
    with atomic_directory(folder) as tmp:
        save_weights(model, tmp / WEIGHTS, tokenizer)
        save_json(config, tmp / CONFIG)
        tokenizer.save(tmp, config.trained_length)
        for name, payload in (notes or {}).items():
            write_json(tmp / name, payload)
