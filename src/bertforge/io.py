"""Atomic file and folder writes: write beside the target, then rename over it.

A run interrupted mid-write leaves either the old file or the new one, never half of one, and
temporary siblings (`.NAME.tmp-*`) are removed when the write fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bertforge.errors import BertforgeError


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def is_occupied(path: Path) -> bool:
    """True when `path` is a file or a folder with something in it: an output that must not be overwritten."""
    path = Path(path)
    return path.exists() and (not path.is_dir() or any(path.iterdir()))


def check_new_folder(out: Path) -> None:
    """Refuse an output folder that already holds something."""
    if is_occupied(out):
        raise BertforgeError(f"{out} already exists and is not an empty folder; choose a new --out")


@contextlib.contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; on success it replaces `path`, on failure it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            # Rename the old folder aside first so that `path` is never missing a complete copy for long.
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
