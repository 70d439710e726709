"""`torch.compile` for the training step, and telling its own failures apart: a model that fails to
compile trains in eager mode with a warning (`bertforge.train` redoes the failed step), while an
out-of-memory or communication error raised in compiled code is not mistaken for one.

The model compiles for fixed shapes (`dynamic=False`): the collators give every batch one shape,
and a graph for one shape runs faster than a graph for any. A micro-batch with fewer rows (the
short last batch of a fine-tuning epoch) runs in eager mode instead of compiling a second graph
(`for_batch`).
"""

from __future__ import annotations

import warnings

import torch


def compile_model(model: torch.nn.Module, enabled: bool) -> torch.nn.Module:
    """`torch.compile(model)`, or the model itself when compiling is off or unavailable.

    Compilation itself happens at the first call; `bertforge.train` falls back to eager mode when
    that fails (`Trainer.gradients`).
    """
    if not enabled:
        return model
    try:
        return torch.compile(model, dynamic=False)
    except Exception as error:  # torch.compile is optional; eager mode is always correct
        warn_eager(error)
        return model


def for_batch(model: torch.nn.Module, batch: dict, rows: int) -> torch.nn.Module:
    """`model`, or for a batch of other than the compiled `rows` sequences the model it compiled."""
    if is_compiled(model) and batch["input_ids"].shape[0] != rows:
        return model._orig_mod
    return model


def warn_eager(error: Exception) -> None:
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    warnings.warn(f"torch.compile failed ({first_line}); training in eager mode", stacklevel=3)


def is_compiled(model: torch.nn.Module) -> bool:
    return hasattr(model, "_orig_mod")  # set only on a torch.compile wrapper


def is_compile_error(error: BaseException) -> bool:
    """Whether `error` is torch.compile's own failure (tracing, a backend, no C++ compiler or Triton),
    not an out-of-memory or communication error that surfaced in compiled code: those are re-raised."""
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = getattr(error, "inner_exception", None) or error.__cause__ or error.__context__
    if any(isinstance(e, (torch.OutOfMemoryError, torch.distributed.DistError)) for e in chain):
        return False
    return isinstance(chain[0], torch._dynamo.exc.TorchDynamoException)
