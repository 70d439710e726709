"""Command groups of the `bertforge` CLI; each module has `register(subparsers)`. The arguments that
several groups take are added here, written once."""

from __future__ import annotations

from bertforge.config import PRECISIONS


def add_device_argument(p, default: str | None = "auto") -> None:
    """`--device` (`runtime.device`); a training command's default None keeps its config's."""
    p.add_argument("--device", default=default, help="auto, cpu, cuda, cuda:N")


def add_precision_argument(p) -> None:
    """`--precision` of a training run (`runtime.precision`; auto is measured by `bertforge.precision`)."""
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="arithmetic (default auto: the faster of fp32 and bf16 here, measured once and cached)",
    )
