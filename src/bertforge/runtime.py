"""Where and how tensors run: device choice, eval mode, autocast precision, TF32, transfers, threads,
data workers, and a new BERT's embedding rows on a GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from bertforge.config import RunConfig, RuntimeConfig
from bertforge.errors import BertforgeError

CUDA_WORKERS = 2  # background data workers per process on CUDA with runtime.num_workers = -1
CUDA_EMBEDDING_ROWS = 64  # a new BERT's word embedding rows on CUDA: a multiple of this


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise BertforgeError(f"{name!r} is not a device (runtime.device); use auto, cpu, cuda, cuda:N or mps")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BertforgeError("runtime.device asks for CUDA but no GPU is visible; use runtime.device=cpu")
    if device.type == "cuda" and (device.index or 0) >= (count := torch.cuda.device_count()):
        raise BertforgeError(
            f"runtime.device = {name!r}, but {count} GPU(s) are visible: use cuda:0 to cuda:{count - 1}"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise BertforgeError(
            "runtime.device asks for mps but this torch has no Apple GPU; use runtime.device=cpu"
        )
    return device


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) for the block; the model's former mode is restored after, even on error."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def autocast(device: torch.device, precision: str):
    """Mixed precision for the forward pass; fp32 runs without autocast."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def use_tf32(device: torch.device, enabled: bool) -> None:
    """On CUDA, let fp32 matmuls use TensorFloat-32 (Ampere and later: several times faster, with
    10-bit mantissa inputs and fp32 accumulation); `runtime.tf32 = false` keeps full fp32."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high" if enabled else "highest")


def to_device(batch: dict, device: torch.device) -> dict:
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}


def to_host(values: list[torch.Tensor]) -> list[float]:
    """0-d tensors as floats, in one device-to-host transfer (float64 keeps counts exact; MPS has none)."""
    dtype = torch.float32 if values[0].device.type == "mps" else torch.float64
    return torch.stack([value.to(dtype) for value in values]).tolist()


def data_workers(runtime: RuntimeConfig, device: torch.device) -> int:
    """`runtime.num_workers`, where -1 (auto) means 2 background workers on CUDA, so that masking the
    next batches overlaps the GPU's step, and none elsewhere (a CPU's cores are busy training)."""
    if runtime.num_workers >= 0:
        return runtime.num_workers
    return CUDA_WORKERS if device.type == "cuda" else 0


def apply_threads(runtime: RuntimeConfig) -> None:
    if runtime.threads:
        torch.set_num_threads(runtime.threads)


def size_embeddings(config: RunConfig, tokens: int, device: torch.device) -> None:
    """Give a new model one word embedding row per token of its tokenizer's `tokens`; on CUDA, a BERT's
    rows rounded up to a multiple of 64 (30,522 to 30,528, as MosaicBERT), so that the tied MLM
    decoder's matmuls run on whole tensor-core tiles. The extra rows stand for no token and are
    never predicted; the config's tokenizer section holds the tokenizer's own size, which tells such a
    padded vocabulary (`checkpoint.check_tokenizer_fits`)."""
    rows = tokens
    if device.type == "cuda" and config.model.objective == "mlm":
        rows = -(-tokens // CUDA_EMBEDDING_ROWS) * CUDA_EMBEDDING_ROWS
    config.model.vocab_size = rows
    config.tokenizer.vocab_size = tokens  # a given tokenizer's, or a small corpus's fewer than asked
