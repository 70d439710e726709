"""Where and how tensors run: device choice, autocast precision, host-to-device transfer, threads."""

from __future__ import annotations

import contextlib

import torch

from bertforge.config import RuntimeConfig
from bertforge.errors import BertforgeError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise BertforgeError(
            f"runtime.device = {name!r} is not a device; use auto, cpu, cuda or cuda:N"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BertforgeError("runtime.device asks for CUDA but no GPU is visible; use runtime.device=cpu")
    return device


def autocast(device: torch.device, precision: str):
    """Mixed precision for the forward pass; fp32 runs without autocast."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def to_device(batch: dict, device: torch.device) -> dict:
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}


def apply_threads(runtime: RuntimeConfig) -> None:
    if runtime.threads:
        torch.set_num_threads(runtime.threads)
