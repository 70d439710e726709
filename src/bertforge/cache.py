"""Content-addressed cache of trained tokenizers and prepared token shards.

A key is a hash of what determines the result (corpus bytes, tokenizer settings or fingerprint,
corpus format, and a text column other than "text" for JSON lines and tables), so re-running on
the same text reuses the work and changed text never hits a stale entry (`cache_key` makes every
key, the precision probe's in `bertforge.precision` too). Shards are kept per
corpus file: a run on several files reuses those of any file it has seen before. The cache lives
in `$BERTFORGE_CACHE`, else `~/.cache/bertforge`. Shards are checked on open: an id beyond the
tokenizer's vocabulary names the entry as damaged. An entry is built under a lock of its own
(`.KEY.lock` beside it): of two runs on a cold cache one builds it, the other waits and reuses it;
what a build killed mid-way left is removed by the next run (`remove_orphans`). The same content
hashes tell a resumed run whether its data files are still those it started on (`refuse_changed_data`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from bertforge.config import TokenizerConfig
from bertforge.corpus import COLUMN_FORMATS, DEFAULT_TEXT_COLUMN, READER_VERSION, resolve_format
from bertforge.errors import BertforgeError
from bertforge.io import entry_lock, file_sha256, remove_folder, remove_orphaned_entries
from bertforge.shards import REBUILD_ADVICE, TokenShards, build_shards, ids_past_vocabulary
from bertforge.tokenizer import (
    TRAINING_VERSION,
    BertTokenizer,
    load_tokenizer,
    train_tokenizer,
    vocabulary_size_text,
)


def default_cache_dir() -> Path:
    return Path(os.environ.get("BERTFORGE_CACHE") or Path.home() / ".cache" / "bertforge")


@functools.lru_cache(maxsize=64)
def _content_hash(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(Path(path))


def content_hash(path: Path) -> str:
    """sha256 of a file's bytes, memoised per (path, size, mtime) within the process."""
    path = Path(path)
    if not path.is_file():
        raise BertforgeError(f"corpus file {path} does not exist; check the path")
    stat = path.stat()
    return _content_hash(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def refuse_changed_data(saved: dict[str, str], current: dict[str, str], run: Path, fix: str) -> None:
    """Refuse to resume the run in `run` on other data than it started on. `saved` and `current` map
    each data file (a role or a path) to its sha256; a file in only one of them has changed too."""
    edited = sorted(name for name in saved.keys() & current.keys() if saved[name] != current[name])
    added, dropped = (
        ", ".join(sorted(names)) for names in (current.keys() - saved.keys(), saved.keys() - current.keys())
    )
    parts = [f"data changed since the run in {run} started: {', '.join(edited)}"] if edited else []
    if added and dropped:
        parts.append(f"the run in {run} started on {dropped}, not on {added}")
    elif added:
        parts.append(f"the run in {run} did not start on {added}")
    elif dropped:
        parts.append(f"the run in {run} started on {dropped} too")
    if parts:
        raise BertforgeError(f"{'; '.join(parts)}; {fix}")


def remove_orphans(cache_dir: Path) -> None:
    """Remove the temporary folders of tokenizer and shard builds that were killed mid-way."""
    for kind in ("tokenizers", "shards"):
        remove_orphaned_entries(Path(cache_dir) / kind)


def cache_key(*parts) -> str:
    """A cache entry's name: a short hash of what its content depends on (JSON-serialisable `parts`)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def _column_part(formats: list[str], text_column: str) -> list[str]:
    """The text column as a key part when it matters; empty for the default, which keys leave out."""
    uses_column = any(fmt in COLUMN_FORMATS for fmt in formats)
    return [text_column] if uses_column and text_column != DEFAULT_TEXT_COLUMN else []


def cached_tokenizer(
    corpus_files: list[Path],
    config: TokenizerConfig,
    format: str,
    cache_dir: Path,
    text_column: str = DEFAULT_TEXT_COLUMN,
    show_progress: bool = True,
) -> BertTokenizer:
    """Train a tokenizer on all the corpus files unless one with the same inputs is cached; with
    `show_progress`, the trainer's bars on a terminal and a line on stdout say what was trained."""
    formats = [resolve_format(f, format) for f in corpus_files]
    hashes = [content_hash(f) for f in corpus_files]
    key = cache_key(
        hashes,
        asdict(config),
        formats,
        *_column_part(formats, text_column),
        f"trainer-v{TRAINING_VERSION}",  # a vocabulary of another trainer version is not reused
        f"reader-v{READER_VERSION}",  # nor one counted from text another reader read
    )
    folder = cache_dir / "tokenizers" / key
    if (folder / "tokenizer.json").is_file():
        return cached_entry_tokenizer(folder)
    with entry_lock(folder):
        if (folder / "tokenizer.json").is_file():  # built by another process while this one waited
            return cached_entry_tokenizer(folder)
        started = time.perf_counter()
        tokenizer = train_tokenizer(
            list(corpus_files), config, folder, format, show_progress, text_column=text_column
        )
        refuse_changed_while_read(corpus_files, hashes, folder)
        if show_progress:
            names = ", ".join(Path(path).name for path in corpus_files)
            seconds = time.perf_counter() - started
            print(
                f"tokenizer: {vocabulary_size_text(tokenizer, config)} from {names} ({seconds:.1f} s)",
                flush=True,
            )
        return tokenizer


def cached_shards(
    corpus: Path,
    tokenizer: BertTokenizer,
    format: str,
    cache_dir: Path,
    show_progress: bool = True,
    text_column: str = DEFAULT_TEXT_COLUMN,
) -> TokenShards:
    """Tokenize one corpus file into shards unless shards of the same text and tokenizer are cached."""
    fmt = resolve_format(corpus, format)
    corpus_sha256 = content_hash(corpus)
    reader = f"reader-v{READER_VERSION}"  # shards of another reader's sentences are not reused
    key = cache_key(corpus_sha256, tokenizer.fingerprint, fmt, *_column_part([fmt], text_column), reader)
    folder = cache_dir / "shards" / key
    if not (folder / "meta.json").is_file():
        with entry_lock(folder):
            if not (folder / "meta.json").is_file():  # built by another process while this one waited
                build_shards(corpus, tokenizer, folder, fmt, show_progress, corpus_sha256, text_column)
                refuse_changed_while_read([corpus], [corpus_sha256], folder)
    try:
        shards = TokenShards.open(folder)
    except BertforgeError as error:
        raise BertforgeError(str(error).replace(REBUILD_ADVICE, CACHE_ADVICE)) from None
    return checked_ids(shards, tokenizer)


CACHE_ADVICE = "delete that folder (it is rebuilt on the next run)"


def cached_entry_tokenizer(folder: Path) -> BertTokenizer:
    """The tokenizer of a cache entry, refused as a damaged entry where it does not load, or where its
    tokenizer.json is not the one its settings file recorded (an edit, a flipped bit)."""
    try:
        tokenizer = load_tokenizer(folder)
    except BertforgeError as error:
        raise BertforgeError(f"damaged cache entry {folder}: {error}; {CACHE_ADVICE}") from None
    if tokenizer.saved_fingerprint not in (None, tokenizer.fingerprint):
        raise BertforgeError(
            f"damaged cache entry {folder}: its tokenizer.json is not the one it was saved with; "
            + CACHE_ADVICE
        )
    return tokenizer


def refuse_changed_while_read(files: Sequence[Path], hashes: Sequence[str], entry: Path) -> None:
    """Refuse (and remove) a cache entry built from files that changed while they were read: its
    key names the text as it was before."""
    for file, expected in zip(files, hashes, strict=True):
        if content_hash(file) != expected:
            remove_folder(entry)
            raise BertforgeError(f"{file} changed while it was read; run again once it is complete")


def checked_ids(shards: TokenShards, tokenizer: BertTokenizer) -> TokenShards:
    """Refuse cached shards holding ids the tokenizer does not have."""
    if problem := ids_past_vocabulary(shards, tokenizer):
        raise BertforgeError(f"damaged cache entry {shards.path}: {problem}; {CACHE_ADVICE}")
    return shards
