"""Atomic file and folder writes, JSON files read and written one way, and the locks that give a
folder one writer at a time.

Writes go beside the target, then are renamed over it: a run interrupted mid-write leaves either
the old file or the new one, never half of one, and temporary siblings (`.NAME.tmp-*`) are removed
when the write fails. A folder is deleted by first renaming it aside (`.NAME.del-*`), so a kill
never leaves a half-deleted folder under its own name. What a killed writer leaves (`.NAME.tmp-*`,
`.NAME.old-*`, `.NAME.del-*`) is removed at the next start by the process that takes the folder's
lock (or, for a folder built whole such as a cache entry or prepared shards, the builder's lock
`.NAME.lock` beside it); a folder moved aside for a replacement that never arrived is put back.
Files and folders written this way get the modes `open` and `mkdir` would give them under the
process's umask (644 and 755 under 022), not the owner-only modes of their temporaries. A
write the disk refuses (full, read-only, no permission), or one under a path where a file stands
for a folder, raises `WriteError`: one line naming the path and the cause. Every JSON file bertforge writes is
`write_json`'s (indented, newline-terminated, atomic); every JSON object it reads is `read_json`'s,
which names the file and what is wrong with it in one line. Every file content hash bertforge
records (of a corpus, a checkpoint's files, a data file) is `file_sha256`'s. Locks are OS file locks
(`flock`) on a file that holds the owner's PID: the kernel frees them when their owner dies, so a
killed run never leaves a stale lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bertforge.errors import BertforgeError


def _read_umask() -> int:
    mask = os.umask(0)  # the umask can only be read by setting it
    os.umask(mask)
    return mask


UMASK = _read_umask()


def give_usual_mode(path: Path | str, folder: bool = False) -> None:
    """Give `path` the mode a plain `open` or `mkdir` would have given it, in place of the owner-only
    600 or 700 of `tempfile`'s temporaries, so that models and exports are readable where the umask
    lets them be."""
    os.chmod(path, (0o777 if folder else 0o666) & ~UMASK)


class WriteError(BertforgeError, OSError):
    """A write refused by the disk. Also an `OSError`, so that callers who tolerate a failed write
    (an optional cache file) still do."""

    def __init__(self, path: Path, code: int, reason: str = "") -> None:
        super().__init__(f"cannot write {path}: {reason or REASONS.get(code, os.strerror(code))}")
        self.errno = code


REASONS = {
    errno.ENOSPC: "no space left on device; free some space there or write elsewhere",
    errno.EDQUOT: "disk quota exceeded; free some space there or write elsewhere",
    errno.EFBIG: "the file is too large for that file system; write elsewhere",
    errno.EROFS: "the file system is read-only; write elsewhere",
    errno.EACCES: "permission denied; write elsewhere",
    errno.EPERM: "permission denied; write elsewhere",
}


def os_errno(error: BaseException) -> int | None:
    """The OS error code behind `error`: its own, a chained `OSError`'s, or the "(os error N)" that
    Rust libraries (safetensors, tokenizers) put in their messages; None when there is none."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno:
            return error.errno
        if match := re.search(r"\(os error (\d+)\)", str(error)):
            return int(match.group(1))
        error = error.__cause__ or error.__context__
    return None


def write_error(path: Path, error: BaseException) -> WriteError | None:
    """`WriteError` for a failed write of `path` when the disk refused it, or when a file stands where
    a folder above it should be; else None (a bug or a user error of its own keeps its type). An
    `OSError` about another file is not a write of `path`."""
    if isinstance(error, BertforgeError):
        return None
    code = os_errno(error)
    if code in (errno.EEXIST, errno.ENOTDIR) and (blocker := file_in_the_way(path)):
        return WriteError(path, code, f"{blocker} is a file, not a folder; choose a path under a folder")
    if code not in REASONS:
        return None
    filename = getattr(error, "filename", None)
    if isinstance(filename, str) and not _on_the_way(Path(path), Path(filename)):
        return None
    return WriteError(path, code)


def file_in_the_way(path: Path) -> Path | None:
    """The file that stands where a folder above `path` should be (`FILE` of `FILE/sub`), if any."""
    for parent in Path(path).absolute().parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def check_folder_path(path: Path) -> None:
    """Refuse a folder path `path` that cannot be made because a file stands above it."""
    if blocker := file_in_the_way(path):
        raise BertforgeError(f"{blocker} is a file, not a folder, so `out` cannot be {path}; choose another")


def _on_the_way(path: Path, other: Path) -> bool:
    """Whether writing `path` touches `other`: a folder on its way, or a file beside it or within."""
    path, other = path.resolve(), other.resolve()
    return other == path or other in path.parents or path.parent in other.parents


def describe_os_error(error: OSError) -> str:
    """One line for an `OSError` that no writer turned into a `WriteError`."""
    where = f"{error.filename}: " if error.filename else ""
    return where + REASONS.get(error.errno, error.strerror or str(error))


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn a disk's refusal inside the block into a `WriteError` naming `path`."""
    try:
        yield
    except Exception as error:
        failure = write_error(path, error)
        if failure is None:
            raise
        raise failure from error


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
        try:
            give_usual_mode(tmp)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
            flush_folder(path.parent)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


def append_text(path: Path, text: str) -> None:
    """Append `text` to `path` (a log; a crash may tear its last line, which readers repair)."""
    with writing(path), Path(path).open("a", encoding="utf-8") as handle:
        handle.write(text)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def json_text(value, indent: int | None = 2) -> str:
    """`value` as bertforge writes JSON files: indented (`indent=None`: on one line), with a final newline."""
    return json.dumps(value, indent=indent) + "\n"


def write_json(path: Path, value, indent: int | None = 2) -> None:
    """Write `value` to `path` as JSON (`json_text`), atomically."""
    atomic_write_text(path, json_text(value, indent))


# What `json.loads` raises for text it cannot hold: `JSONDecodeError` (a ValueError), a ValueError for an
# integer of over 4,300 digits, and RecursionError for a nesting deeper than Python's recursion limit.
JSON_FAULTS = (ValueError, RecursionError)


def json_fault(error: ValueError | RecursionError) -> str:
    """Why Python's decoder refused a JSON text (one of `JSON_FAULTS`), without a position: its
    message, or a nesting too deep for it, or an integer too long to convert."""
    return error.msg if isinstance(error, json.JSONDecodeError) else str(error)


def read_json(
    path: Path,
    *,
    damaged: str = "the folder may be damaged",
    missing: str = "the folder is incomplete",
    error: type[BertforgeError] = BertforgeError,
) -> dict:
    """The JSON object in the file `path`. A missing file, one that is not JSON, or JSON that is not
    an object raises `error` naming the file and the problem, followed by the advice `missing` (for
    a missing file) or `damaged` (for the others)."""
    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{path} is missing; {missing}") from None
    except JSON_FAULTS as problem:  # UnicodeDecodeError too: it is a ValueError
        raise error(f"{path} is not valid JSON ({problem}); {damaged}") from None
    if not isinstance(value, dict):
        raise error(f"{path} does not hold a JSON object; {damaged}")
    return value


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's content, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def is_occupied(path: Path) -> bool:
    """True when `path` is a file or a folder with something in it: an output that must not be overwritten."""
    path = Path(path)
    if not path.exists():
        return False
    return not path.is_dir() or any(entry.name != LOCK_FILE for entry in path.iterdir())


def check_new_folder(out: Path) -> None:
    """Refuse an output folder that already holds something."""
    if Path(out).is_file():
        raise BertforgeError(f"{out} is a file; `out` must name a new folder")
    check_folder_path(out)
    if is_occupied(out):
        raise BertforgeError(f"{out} already exists and is not an empty folder; choose a new `out`")


def check_run_folder(out: Path, resume: bool, marker: str, kind: str) -> None:
    """Refuse `out` as the folder of a `kind` run ("fine-tuning run", say): a file; to resume, a
    folder without the `marker` file such a run writes; for a new run, a folder that holds anything
    (a run, begun or finished, when it has a `marker`)."""
    out = Path(out)
    if out.is_file():
        raise BertforgeError(f"{out} is a file; `out` must name a folder")
    check_folder_path(out)
    if (out / marker).is_file():
        if not resume:
            raise BertforgeError(
                f"{out} already holds a run (begun or finished); pass `resume=True` to continue it, or "
                "choose a new `out`"
            )
        return
    if resume:
        raise BertforgeError(f"{out} holds no {kind} to resume; start one without `resume=True`")
    if is_occupied(out):
        raise BertforgeError(f"{out} holds files but no {kind}; choose a new or empty `out`")


@contextlib.contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; on success it replaces `path`, on failure it is removed."""
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        try:
            yield tmp
            for inside in [*tmp.rglob("*"), tmp]:  # safetensors writes its files owner-only too
                give_usual_mode(inside, folder=inside.is_dir())
                flush_to_disk(inside)  # before the rename makes the folder look complete
            replace_folder(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def flush_to_disk(path: Path) -> None:
    """fsync a file or folder: a file's bytes before its rename, so that a power loss cannot leave it
    empty under its name; a folder after a rename in it, so that the rename itself is kept."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def flush_folder(folder: Path) -> None:
    """fsync a folder after a rename in it, where its file system allows (some network and FUSE mounts
    refuse; a folder may be writable but not readable): the rename is done either way."""
    with contextlib.suppress(OSError):
        flush_to_disk(folder)


def replace_folder(new: Path, path: Path) -> None:
    """Rename the folder `new` to `path`, replacing the folder there: the old one is renamed aside
    first, so that `path` is never missing a complete copy for long."""
    old = move_aside(path) if path.exists() else None  # put back by `remove_leftovers` if killed next
    os.replace(new, path)
    flush_folder(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def move_aside(path: Path, tag: str = "old") -> Path:
    """Rename the folder `path` into a new hidden sibling `.NAME.TAG-*` and return that sibling."""
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.{tag}-", dir=path.parent))
    os.replace(path, aside / path.name)
    return aside


def remove_folder(path: Path) -> None:
    """Delete the folder `path`, renaming it aside (`.NAME.del-*`) first: interrupted, it leaves a
    leftover that `remove_leftovers` finishes, never a partial folder under its own name. Where the
    rename fails (a full disk), it is deleted in place: a clean-up must not hide the error it follows."""
    try:
        aside = move_aside(Path(path), "del")
    except OSError:
        aside = Path(path)
    shutil.rmtree(aside, ignore_errors=True)


LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<tag>tmp|old|del)-\w+$")  # the names used above


def remove_leftovers(folder: Path, depth: int = 5) -> None:
    """Remove what killed writers left in `folder` and its subfolders (`depth` levels, hidden ones
    skipped). Only for a folder whose lock the caller holds: nobody else is writing there."""
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return
    for entry in entries:
        if match := LEFTOVER.match(entry.name):
            remove_leftover(entry, match)
        elif depth > 1 and entry.is_dir() and not entry.is_symlink() and not entry.name.startswith("."):
            remove_leftovers(entry, depth - 1)


def remove_leftover(entry: Path, match: re.Match) -> None:
    """Remove one leftover; a folder that `atomic_directory` moved aside is put back when the kill
    came before its replacement took its place."""
    kept, target = entry / match["name"], entry.parent / match["name"]
    with contextlib.suppress(OSError):
        if match["tag"] == "old" and kept.is_dir() and not target.exists():
            os.replace(kept, target)
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            entry.unlink()


LOCK_FILE = ".lock"  # a run folder's lock; ignored by `is_occupied`


class FileLock:
    """An exclusive `flock` on `path`, which holds the owner's PID while it is held."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self, wait: bool) -> bool:
        """Take the lock (waiting for it when `wait`); False when another process holds it."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                return False
            except OSError:
                os.close(fd)
                raise
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the previous owner removed the file after we opened it: lock the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return True

    def owner(self) -> str:
        """The holder's PID as written in the lock file ("unknown" while it is being written)."""
        try:
            return self.path.read_text(encoding="utf-8").strip() or "unknown"
        except OSError:
            return "unknown"

    def release(self) -> None:
        """Remove the lock file while still holding it (waiters then retry on a new file), then unlock."""
        if self.fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino)


class RunFolderLock:
    """One owner per run folder: `FOLDER/.lock`, held from `acquire` to `release`.

    `acquire` creates the folder if needed (`created` says whether it did), refuses, with one line
    naming the owner's PID, a folder another process holds, and removes what killed writers left
    there (`remove_leftovers`); `release` removes the lock file, and the folder too when this lock
    created it and nothing else was written there.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.created = not self.folder.exists()
        self.lock = FileLock(self.folder / LOCK_FILE)

    def acquire(self) -> RunFolderLock:
        if self.folder.exists() and not self.folder.is_dir():
            raise BertforgeError(f"{self.folder} is a file; `out` must name a folder")
        check_folder_path(self.folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            taken = self.lock.acquire(wait=False)
        except OSError as error:
            raise BertforgeError(
                f"cannot lock {self.folder} ({error.strerror}); choose another `out`"
            ) from None
        if not taken:
            raise BertforgeError(
                f"{self.folder} is in use by another bertforge run (process {self.lock.owner()}); "
                "wait for it to finish or choose another `out`"
            )
        remove_leftovers(self.folder)
        return self

    def release(self) -> None:
        self.lock.release()
        if self.created:
            with contextlib.suppress(OSError):
                self.folder.rmdir()  # only when empty

    def __enter__(self) -> RunFolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def builder_lock(folder: Path) -> FileLock:
    """The lock of whoever builds the folder `folder` whole (`atomic_directory`): `.NAME.lock` beside
    it, since the folder itself is replaced."""
    return FileLock(Path(folder).parent / f".{Path(folder).name}.lock")


@contextlib.contextmanager
def entry_lock(folder: Path) -> Iterator[None]:
    """Hold `.NAME.lock` beside a shared cache entry `folder` while it is checked and built, so that
    a second process waits for the first to build it and then reuses it."""
    folder = Path(folder)
    lock = builder_lock(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        taken = lock.acquire(wait=False)
    except OSError as error:
        raise BertforgeError(
            f"cannot write to the cache folder {folder.parent} ({error.strerror}); "
            "set BERTFORGE_CACHE to a writable folder"
        ) from None
    if not taken:
        print(
            f"bertforge: waiting for process {lock.owner()} to finish building {folder}",
            file=sys.stderr,
            flush=True,
        )
        lock.acquire(wait=True)
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def building_new_folder(folder: Path) -> Iterator[None]:
    """Be the one process that builds the new folder `folder` (whole, with `atomic_directory`) while
    the block runs (`sole_writer`); remove what a killed build of it left beside it, and refuse
    `folder` unless it is new (checked under the lock: of two processes started together, the second
    finds the first's folder)."""
    folder = Path(folder)
    check_new_folder(folder)
    with sole_writer(folder):
        remove_leftovers_of(folder)
        check_new_folder(folder)
        yield


@contextlib.contextmanager
def sole_writer(path: Path) -> Iterator[None]:
    """Hold the `builder_lock` of `path` (a folder written whole, or a file) while the block runs,
    refusing with one line that names the owner while another process holds it."""
    path = Path(path)
    lock = builder_lock(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise write_error(path, error) or BertforgeError(
            f"cannot make the folder {path.parent} for {path} ({error.strerror}); choose another `out`"
        ) from None
    try:
        taken = lock.acquire(wait=False)
    except OSError as error:
        raise write_error(path, error) or BertforgeError(
            f"cannot write {path}: its lock file {lock.path.name} cannot be made in {path.parent} "
            f"({error.strerror}); choose an `out` in a folder you can write to"
        ) from None
    if not taken:
        raise BertforgeError(
            f"{path} is being written by another bertforge process (process {lock.owner()}); wait for "
            "it to finish or choose another `out`"
        )
    try:
        yield
    finally:
        lock.release()


def remove_leftovers_of(folder: Path) -> None:
    """Remove what killed writers of `folder` left beside it (`.NAME.tmp-*`, ...). Only for the holder
    of its `builder_lock`: nobody else is writing it."""
    with contextlib.suppress(OSError):
        for entry in Path(folder).parent.iterdir():
            if (match := LEFTOVER.match(entry.name)) and match["name"] == Path(folder).name:
                remove_leftover(entry, match)


def remove_orphaned_entries(folder: Path) -> None:
    """Remove the leftovers beside the entries of a shared cache folder that no live process is
    building: those whose entry lock (see `entry_lock`) this process can take at once."""
    try:
        names = {m["name"] for entry in Path(folder).iterdir() if (m := LEFTOVER.match(entry.name))}
    except OSError:
        return
    for name in sorted(names):
        lock = builder_lock(Path(folder) / name)
        with contextlib.suppress(OSError):
            if lock.acquire(wait=False):
                try:  # listed again under the lock: a writer that finished meanwhile left nothing
                    remove_leftovers_of(Path(folder) / name)
                finally:
                    lock.release()
