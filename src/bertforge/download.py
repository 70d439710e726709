"""Public corpora fetched once into the bertforge cache: WikiText-2, for the demo and for anyone
without a copy of it.

`fetch_corpus(name, cache_dir)` returns the folder `CACHE/data/NAME` holding the corpus's files and
downloads those it lacks (standard library only, with a timeout) from URLs pinned to one commit, so
that the bytes cannot change. A download goes to a temporary sibling (`.FILE.tmp-*`), is checked
against the digests carried here (its git object id in that commit, what `git hash-object FILE`
prints, and its sha256 where one is known), and only then renamed to its own name: a cut connection,
a timeout or a wrong checksum removes the temporary, so the folder holds whole, checked files and
nothing else; files already there (put there by hand, say) are checked against the same digests. No
network, or a server that sends other bytes, is one `BertforgeError` line saying how to get the
files or how to run on any text. Progress shows as a bar on a terminal and as plain lines elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import shlex
import ssl
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bertforge.errors import BertforgeError
from bertforge.io import entry_lock, give_usual_mode, remove_leftovers, writing
from bertforge.progress import progress_bar

TIMEOUT_S = 60.0  # for the connection and for each read
CHUNK = 1 << 16
NETWORK_ERRORS = (
    urllib.error.URLError,
    http.client.HTTPException,
    ConnectionError,
    TimeoutError,
    ssl.SSLError,
)
PYTORCH_EXAMPLES = (  # the commit that put WikiText-2 into pytorch/examples
    "https://raw.githubusercontent.com/pytorch/examples/d5678bc8ac0cdd79dbd5e44d4130271018bcec4e/"
    "word_language_model/data/wikitext-2"
)


@dataclass(frozen=True)
class RemoteFile:
    name: str  # the file's name in the cache folder
    url: str
    git_blob: str  # sha1 of b"blob SIZE\0" + the bytes: the file's id in the pinned commit
    sha256: str | None = None


@dataclass(frozen=True)
class Corpus:
    name: str
    files: tuple[RemoteFile, ...]
    elsewhere: str  # how else to get the files into {folder}, for the message when the download fails


CORPORA = {
    "wikitext-2": Corpus(
        "wikitext-2",
        (
            RemoteFile(
                "wiki.train.tokens",
                f"{PYTORCH_EXAMPLES}/train.txt",
                "2d84b35af79e411d73ea7cae83c73964c6ac83b4",
            ),
            RemoteFile(
                "wiki.valid.tokens",
                f"{PYTORCH_EXAMPLES}/valid.txt",
                "eec944eb2d9e46061cd34a6913528797db6842fc",
                "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
            ),
        ),
        "put WikiText-2's wiki.train.tokens and wiki.valid.tokens in {folder}",
    ),
}


def corpus_folder(name: str, cache_dir: Path) -> Path:
    return Path(cache_dir) / "data" / name


def fetch_corpus(
    name: str, cache_dir: Path, show_progress: bool = True, timeout: float | None = None
) -> Path:
    """The cache folder holding the files of the corpus `name`, downloading those it lacks (`timeout`
    in seconds for the connection and each read, `TIMEOUT_S` by default)."""
    corpus, timeout = CORPORA[name], timeout or TIMEOUT_S
    folder = corpus_folder(name, cache_dir)
    present = [remote for remote in corpus.files if (folder / remote.name).is_file()]
    for remote in present:  # also those a user put there, as the offline message asks
        if problem := other_bytes(folder / remote.name, remote):
            raise BertforgeError(
                f"{folder / remote.name} is not {corpus.name}'s {remote.name} ({problem}); delete it and "
                f"run `{fetch_command(corpus, folder)}` again, or put the original file there"
            )
    if len(present) < len(corpus.files):
        with entry_lock(folder):
            folder.mkdir(parents=True, exist_ok=True)
            remove_leftovers(folder, depth=1)  # the temporaries of a download that was killed
            for remote in corpus.files:
                if not (folder / remote.name).is_file():
                    download(remote, folder / remote.name, corpus, show_progress, timeout)
    return folder


def fetch_command(corpus: Corpus, folder: Path) -> str:
    """The command that fetches `corpus` into the cache that holds `folder`."""
    return f"bertforge fetch {corpus.name} --cache-dir {shlex.quote(str(folder.parent.parent))}"


def download(remote: RemoteFile, target: Path, corpus: Corpus, show_progress: bool, timeout: float) -> None:
    """Download `remote` to `target` through a temporary sibling, checked before it takes its name."""
    with writing(target):
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
        try:
            give_usual_mode(tmp)
            with os.fdopen(fd, "wb") as out:
                receive(remote.url, out, remote.name, show_progress, timeout)
                out.flush()
                os.fsync(out.fileno())
            check_digests(Path(tmp), remote)
            os.replace(tmp, target)
        except NetworkFailure as failure:
            os.unlink(tmp)
            raise unreachable(remote, corpus, target.parent, str(failure)) from None
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


class NetworkFailure(Exception):
    """A download that the network broke off; its message says how."""


def receive(url: str, out, name: str, show_progress: bool, timeout: float) -> None:
    """Write the bytes served at `url` to the open file `out`, all of them or a `NetworkFailure`; an
    error of the disk propagates (`writing` names it)."""
    try:
        response = urllib.request.urlopen(url, timeout=timeout)
    except NETWORK_ERRORS as error:
        raise NetworkFailure(reason(error)) from None
    received, size = 0, response.length  # from Content-Length; None when the server sent none
    with response, progress(url, name, size, show_progress) as advance:
        while True:
            try:
                chunk = response.read(CHUNK)
            except NETWORK_ERRORS as error:
                raise NetworkFailure(reason(error, received)) from None
            if not chunk:
                break
            out.write(chunk)
            received += len(chunk)
            advance(len(chunk))
    if size is not None and received < size:
        raise NetworkFailure(f"the connection closed after {received} of {size} bytes")


def reason(error: Exception, received: int = 0) -> str:
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    if isinstance(error, http.client.IncompleteRead):
        return f"the connection closed after {received + len(error.partial)} bytes"
    return str(error) or type(error).__name__


def unreachable(remote: RemoteFile, corpus: Corpus, folder: Path, why: str) -> BertforgeError:
    """The one line for a download that failed: what happened, then how to get the corpus or do without."""
    elsewhere = corpus.elsewhere.format(folder=folder)
    return BertforgeError(
        f"cannot download {corpus.name} ({remote.url}: {why}); connect to the internet and run "
        f"`{fetch_command(corpus, folder)}` again, or {elsewhere}, or run the demo on any text: "
        "make demo CORPUS=my.txt VALID=my-valid.txt"
    )


def digests(path: Path) -> tuple[str, str]:
    """(git object id, sha256) of a file's bytes."""
    git = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    sha256 = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            git.update(chunk)
            sha256.update(chunk)
    return git.hexdigest(), sha256.hexdigest()


def check_digests(path: Path, remote: RemoteFile) -> None:
    if problem := other_bytes(path, remote):
        raise BertforgeError(
            f"{remote.url} sent other bytes than expected ({problem}); nothing was kept: try again later, "
            "or get the file elsewhere and pass it with --corpus or --valid"
        )


def other_bytes(path: Path, remote: RemoteFile) -> str | None:
    """How the file `path` differs from `remote`'s digests; None when it is that file."""
    git, sha256 = digests(path)
    if git == remote.git_blob and (remote.sha256 is None or sha256 == remote.sha256):
        return None
    return f"sha256 {sha256}, git object {git}; expected git object {remote.git_blob}"


@contextlib.contextmanager
def progress(url: str, name: str, size: int | None, show_progress: bool) -> Iterator[Callable[[int], None]]:
    """Yield the function to call with each chunk's length (`bertforge.progress`: a bar on a terminal,
    plain lines in a log)."""
    if show_progress:
        print(f"bertforge: downloading {url}", file=sys.stderr, flush=True)
    with progress_bar(total=size, unit="B", unit_scale=True, desc=name, disable=not show_progress) as bar:
        yield bar.update
