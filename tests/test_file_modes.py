"""Files and folders that bertforge writes through temporaries get the modes a plain `open` or
`mkdir` would give them under the umask, not the owner-only modes `tempfile` makes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bertforge import io
from bertforge.cli import main


@pytest.fixture
def umask(monkeypatch):
    """Run the test under umask 027 (so that the group's and others' bits both tell)."""
    previous = os.umask(0o027)
    monkeypatch.setattr(io, "UMASK", 0o027)
    yield 0o027
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_atomic_writes_follow_the_umask(tmp_path, umask):
    io.atomic_write_text(tmp_path / "a.json", "{}")
    with io.atomic_directory(tmp_path / "folder") as staged:
        (staged / "inside.txt").write_text("x", encoding="utf-8")
    assert mode(tmp_path / "a.json") == 0o640
    assert mode(tmp_path / "folder") == 0o750
    assert mode(tmp_path / "folder" / "inside.txt") == 0o640


def test_an_export_is_readable_by_the_group_the_umask_lets_read_it(tmp_path, tiny_pretrained_run, umask):
    out = tmp_path / "hf"
    assert main(["export", "--model", str(tiny_pretrained_run), "--out", str(out)]) == 0
    paths = [out, *out.rglob("*")]
    assert len(paths) > 3
    for path in paths:
        assert mode(path) == (0o750 if path.is_dir() else 0o640), path
