"""Token shards: a corpus tokenized once into flat binary files that are memory-mapped for training.

Owns the folder layout and its checks, among them `check_prepared_with`: that a folder holds the
ids of a given tokenizer. `tokens.bin` holds every token id back to back (uint16 when
the vocabulary fits, else uint32); `sentence_offsets.bin` (int64, num_sentences + 1) says where
each sentence starts in it; `document_offsets.bin` (int64, num_documents + 1) says which
sentences each document holds; `meta.json` records the counts, the tokenizer fingerprint and the
source file's content hash. Preparation streams the corpus in batches, so memory stays flat as
the corpus grows, and writes the folder atomically, one process at a time (`prepare_shards`; the
cache builds its entries under its own lock with `build_shards`); a full disk is one line naming
the folder.

Also owns `ShardSet`, several shard folders (one per corpus file) seen as one corpus, and
`concat_shards`, which builds it.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from bertforge.corpus import COLUMN_FORMATS, DEFAULT_TEXT_COLUMN, read_documents, resolve_format
from bertforge.errors import BertforgeError
from bertforge.io import atomic_directory, building_new_folder, file_sha256, read_json, write_json
from bertforge.progress import progress_bar
from bertforge.tokenizer import BertTokenizer

FORMAT_VERSION = 1
TOKENS_FILE = "tokens.bin"
SENTENCE_OFFSETS_FILE = "sentence_offsets.bin"
DOCUMENT_OFFSETS_FILE = "document_offsets.bin"
META_FILE = "meta.json"
_BATCH_CHARACTERS = 2_000_000  # about 500k tokens per tokenizer call
_BATCH_DOCUMENTS = 4096
_TOKEN_DTYPES = ("uint16", "uint32")
_COUNT_BLOCK = 1 << 24  # tokens read at once by max_token_id and token_counts
_OFFSET_BLOCK = 1 << 20  # offsets read at once when a folder is opened
_SCAN_BLOCK = 1 << 16  # tokens read at once by holds_token_outside, which ordinary text ends in its first


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


def prepare_shards(
    corpus: str | Path,
    tokenizer: BertTokenizer,
    out_dir: str | Path,
    format: str = "auto",
    show_progress: bool = True,
    text_column: str = DEFAULT_TEXT_COLUMN,
) -> dict:
    """Tokenize `corpus` into the new shard folder `out_dir` and return its meta.json content.

    One process at a time prepares a folder: another one preparing it is refused with one line, a
    folder that exists already too, and what a killed preparation of it left is removed first
    (`bertforge.io.building_new_folder`). `text_column`: the field of a jsonl file or the column of
    a Parquet file that holds the text.
    """
    with building_new_folder(Path(out_dir)):
        return build_shards(corpus, tokenizer, out_dir, format, show_progress, text_column=text_column)


def build_shards(
    corpus: str | Path,
    tokenizer: BertTokenizer,
    out_dir: str | Path,
    format: str = "auto",
    show_progress: bool = True,
    corpus_sha256: str | None = None,
    text_column: str = DEFAULT_TEXT_COLUMN,
) -> dict:
    """`prepare_shards` for a caller that holds the folder's lock (the cache's entry lock): the folder
    `out_dir` is written whole, replacing what was there.

    `corpus_sha256`: the corpus hash when the caller already has it (the cache does), to save a pass.
    """
    corpus = Path(corpus)
    corpus_format = resolve_format(corpus, format)  # checks the file and the format name first
    dtype = token_dtype(tokenizer.vocab_size)
    progress = progress_bar(
        total=corpus.stat().st_size,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=f"tokenizing {corpus.name}",
        disable=not show_progress,
    )
    with progress, atomic_directory(Path(out_dir)) as tmp, _ShardWriter(tmp, dtype) as writer:
        documents = read_documents(corpus, corpus_format, progress.update, text_column)
        for batch in _document_batches(documents):
            writer.add(batch, tokenizer)
        if writer.num_documents == 0:
            raise BertforgeError(f"{corpus} gave no tokens; check that it holds text in the expected format")
        meta = {
            "format_version": FORMAT_VERSION,
            "token_dtype": dtype.name,
            "num_tokens": writer.num_tokens,
            "num_sentences": writer.num_sentences,
            "num_documents": writer.num_documents,
            "vocab_size": tokenizer.vocab_size,
            "tokenizer_fingerprint": tokenizer.fingerprint,
            "source": {
                "path": str(corpus.resolve()),
                "bytes": corpus.stat().st_size,
                "sha256": corpus_sha256 or file_sha256(corpus),
            },
            "corpus_format": corpus_format,
        }
        if corpus_format in COLUMN_FORMATS:
            meta["text_column"] = text_column
        write_json(tmp / META_FILE, meta)
    return meta


def _document_batches(documents):
    """Group documents into batches of a few thousand documents or ~2M characters."""
    batch, characters = [], 0
    for document in documents:
        batch.append(document)
        characters += sum(map(len, document))
        if characters >= _BATCH_CHARACTERS or len(batch) >= _BATCH_DOCUMENTS:
            yield batch
            batch, characters = [], 0
    if batch:
        yield batch


class _ShardWriter:
    """Appends tokenized batches of documents to the three binary files.

    Arrays are written through the file objects, never with NumPy's `tofile`, whose failed write
    ("N requested and M written") carries no OS error: a full disk is then reported as one.
    """

    def __init__(self, folder: Path, dtype: np.dtype):
        self.dtype = dtype
        self.num_tokens = self.num_sentences = self.num_documents = 0
        with contextlib.ExitStack() as opened:  # closes those opened if opening the next fails
            self._tokens, self._sentences, self._documents = (
                opened.enter_context((folder / name).open("wb"))
                for name in (TOKENS_FILE, SENTENCE_OFFSETS_FILE, DOCUMENT_OFFSETS_FILE)
            )
            self._files = opened.pop_all()  # closed by __exit__ from here
        _write(self._sentences, np.zeros(1, np.int64))
        _write(self._documents, np.zeros(1, np.int64))

    def __enter__(self) -> _ShardWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self._files.close()  # each file, even when closing another failed

    def add(self, documents: list[list[str]], tokenizer: BertTokenizer) -> None:
        sentences = [sentence for document in documents for sentence in document]
        ids = tokenizer.encode_batch(sentences)
        lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
        kept = lengths > 0  # sentences with no tokens are skipped, then documents with no sentences
        owner = np.repeat(np.arange(len(documents)), [len(document) for document in documents])
        sentences_per_document = np.bincount(owner[kept], minlength=len(documents))
        sentences_per_document = sentences_per_document[sentences_per_document > 0]
        tokens = np.fromiter(itertools.chain.from_iterable(ids), self.dtype, count=int(lengths.sum()))
        _write(self._tokens, tokens)
        _write(self._sentences, self.num_tokens + np.cumsum(lengths[kept]))
        _write(self._documents, self.num_sentences + np.cumsum(sentences_per_document))
        self.num_tokens += len(tokens)
        self.num_sentences += int(kept.sum())
        self.num_documents += len(sentences_per_document)


def _write(handle: BinaryIO, array: np.ndarray) -> None:
    """Append `array`'s bytes to `handle` (machine byte order, as `np.memmap` reads them)."""
    handle.write(np.ascontiguousarray(array).data)


class TokenShards:
    """A prepared shard folder, memory-mapped read-only."""

    def __init__(self, path: Path, meta: dict, tokens, sentence_offsets, document_offsets):
        self.path = path
        self.meta = meta
        self.tokens = tokens  # (num_tokens,) uint16 | uint32
        self.sentence_offsets = sentence_offsets  # (num_sentences + 1,) int64
        self.document_offsets = document_offsets  # (num_documents + 1,) int64

    @classmethod
    def open(cls, path: str | Path) -> TokenShards:
        path = Path(path)
        if not path.is_dir():
            raise BertforgeError(f"token shard folder {path} does not exist; run prepare to create it")
        meta = _read_meta(path)
        counts = {key: meta[key] for key in ("num_tokens", "num_sentences", "num_documents")}
        tokens = _map(path, TOKENS_FILE, np.dtype(meta["token_dtype"]), counts["num_tokens"])
        sentence_offsets = _map(path, SENTENCE_OFFSETS_FILE, np.dtype(np.int64), counts["num_sentences"] + 1)
        document_offsets = _map(path, DOCUMENT_OFFSETS_FILE, np.dtype(np.int64), counts["num_documents"] + 1)
        if sentence_offsets[-1] != counts["num_tokens"] or document_offsets[-1] != counts["num_sentences"]:
            raise _damaged(path, "the offsets do not end at the token and sentence counts")
        for name, offsets in (
            (SENTENCE_OFFSETS_FILE, sentence_offsets),
            (DOCUMENT_OFFSETS_FILE, document_offsets),
        ):
            if not starts_at_zero_and_never_falls(offsets):
                raise _damaged(path, f"{name} does not start at 0 and rise")
        return cls(path, meta, tokens, sentence_offsets, document_offsets)

    @property
    def num_tokens(self) -> int:
        return int(self.meta["num_tokens"])

    @property
    def num_sentences(self) -> int:
        return int(self.meta["num_sentences"])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def tokenizer_fingerprint(self) -> str:
        return self.meta["tokenizer_fingerprint"]

    def max_token_id(self) -> int:
        """The largest token id held, read in blocks so that memory stays flat."""
        blocks = range(0, self.num_tokens, _COUNT_BLOCK)
        return max(int(np.max(self.tokens[start : start + _COUNT_BLOCK])) for start in blocks)


class ShardSet:
    """Several shard folders seen as one corpus: the documents of the first, then of the next, ...

    It has the attributes training reads from a `TokenShards` (`tokens`, `sentence_offsets`,
    `document_offsets`, `vocab_size`), so pairs are drawn from all documents at once
    and each folder contributes in proportion to its size. The offsets are shifted and
    concatenated in memory (8 bytes per sentence and per document); the token arrays stay
    memory-mapped, one per folder, behind `ConcatTokens`.
    """

    def __init__(self, parts: Sequence[TokenShards]):
        assert parts, "a shard set needs at least one shard folder"
        if len({part.tokenizer_fingerprint for part in parts}) > 1:
            raise BertforgeError(
                f"the shard folders {', '.join(str(part.path) for part in parts)} were made with different "
                "tokenizers; prepare them all with the same one"
            )
        self.parts = list(parts)
        token_starts = np.cumsum([0] + [part.num_tokens for part in parts])  # (P+1,)
        sentence_starts = np.cumsum([0] + [part.num_sentences for part in parts])  # (P+1,)
        self.tokens = ConcatTokens([part.tokens for part in parts], token_starts)
        self.sentence_offsets = _concat_offsets([part.sentence_offsets for part in parts], token_starts)
        self.document_offsets = _concat_offsets([part.document_offsets for part in parts], sentence_starts)

    @property
    def vocab_size(self) -> int:
        return self.parts[0].vocab_size


def _concat_offsets(offsets: list[np.ndarray], shifts: np.ndarray) -> np.ndarray:
    """Offset arrays of consecutive parts as one: each part's entries after its leading 0, shifted."""
    shifted = [part[1:] + shift for part, shift in zip(offsets, shifts[:-1], strict=True)]
    return np.concatenate([np.zeros(1, np.int64), *shifted])


class ConcatTokens:
    """Token arrays of several shard folders, indexed as if concatenated, without copying them.

    Supports `len()`, `.dtype` and contiguous slices, which is what `pairs.PairDataset` reads. A
    slice within one array (every sentence and document range is) is a view of that array;
    one across arrays is copied together.
    """

    def __init__(self, arrays: Sequence[np.ndarray], starts: np.ndarray):
        assert len(starts) == len(arrays) + 1, "starts holds each array's first index and the total"
        self.arrays = list(arrays)
        self.starts = np.asarray(starts, dtype=np.int64)  # (P+1,)
        self.dtype = np.result_type(*self.arrays)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError(f"ConcatTokens takes slices, not {type(key).__name__}")
        start, stop, step = key.indices(len(self))
        assert step == 1, "ConcatTokens takes contiguous slices"
        stop = max(start, stop)
        last = len(self.arrays) - 1
        first = min(int(np.searchsorted(self.starts, start, "right")) - 1, last)
        final = max(min(int(np.searchsorted(self.starts, stop, "left")) - 1, last), first)
        pieces = [
            self.arrays[p][max(start - self.starts[p], 0) : min(stop, self.starts[p + 1]) - self.starts[p]]
            for p in range(first, final + 1)
        ]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def concat_shards(parts: Sequence[TokenShards]) -> TokenShards | ShardSet:
    """One corpus from the shards of several files; a single folder is returned as it is."""
    return parts[0] if len(parts) == 1 else ShardSet(parts)


def check_prepared_with(shards: TokenShards, tokenizer: BertTokenizer) -> TokenShards:
    """Refuse a shard folder that another tokenizer prepared, or that holds ids past its vocabulary."""
    if shards.tokenizer_fingerprint != tokenizer.fingerprint:
        raise BertforgeError(
            f"token shard folder {shards.path} was prepared with another tokenizer than this run's: "
            "pretrain with the tokenizer that `bertforge prepare` used for it (--tokenizer), or prepare "
            "the corpus again with this one"
        )
    if shards.vocab_size != tokenizer.vocab_size:
        raise _damaged(
            shards.path,
            f"{META_FILE} says vocab_size {shards.vocab_size}, its tokenizer has {tokenizer.vocab_size}",
        )
    if problem := ids_past_vocabulary(shards, tokenizer):
        raise _damaged(shards.path, problem)
    return shards


def ids_past_vocabulary(shards: TokenShards, tokenizer: BertTokenizer) -> str | None:
    """What is wrong with `shards` that hold ids the tokenizer does not have (flipped bits, a tampered
    folder), which would index past the embeddings in the middle of training; None when nothing is."""
    top = shards.max_token_id()
    if top >= tokenizer.vocab_size:
        return f"it holds token id {top}, but the tokenizer has {tokenizer.vocab_size} tokens"
    return None


def shard_parts(shards: TokenShards | ShardSet) -> list[TokenShards]:
    """The shard folders behind `shards`: a set's parts, or the one folder."""
    return shards.parts if isinstance(shards, ShardSet) else [shards]


def holds_token_outside(shards: TokenShards | ShardSet, exclude: Sequence[int]) -> bool:
    """Whether any token of `shards` is not one of `exclude`, read from the start in small blocks."""
    excluded = np.asarray(exclude)
    for part in shard_parts(shards):
        for start in range(0, part.num_tokens, _SCAN_BLOCK):
            if not np.isin(np.asarray(part.tokens[start : start + _SCAN_BLOCK]), excluded).all():
                return True
    return False


def token_counts(shards: TokenShards | ShardSet, exclude: Sequence[int] = ()) -> np.ndarray:
    """How often each token id occurs, (vocab_size,) int64, counted in blocks so memory stays flat;
    the ids in `exclude` (special tokens, which are never MLM labels) count 0."""
    parts = shard_parts(shards)
    counts = np.zeros(shards.vocab_size, dtype=np.int64)
    for part in parts:
        for start in range(0, part.num_tokens, _COUNT_BLOCK):
            block = np.asarray(part.tokens[start : start + _COUNT_BLOCK])
            counts += np.bincount(block, minlength=shards.vocab_size)[: shards.vocab_size]
    counts[list(exclude)] = 0
    return counts


REBUILD_ADVICE = "delete it and re-run prepare"  # the cache gives its own entries' advice


def _damaged(path: Path, why: str) -> BertforgeError:
    return BertforgeError(f"token shard folder {path} is damaged ({why}); {REBUILD_ADVICE}")


def starts_at_zero_and_never_falls(offsets: np.ndarray) -> bool:
    """Whether offsets (memory-mapped, read in blocks) start at 0 and never decrease."""
    if offsets[0] != 0:
        return False
    for start in range(0, len(offsets), _OFFSET_BLOCK):
        if (np.diff(np.asarray(offsets[start : start + _OFFSET_BLOCK + 1])) < 0).any():
            return False
    return True


def _read_meta(path: Path) -> dict:
    if not (path / META_FILE).is_file():
        raise BertforgeError(
            f"{path} is not a token shard folder (it has no {META_FILE}); give the folder that "
            "`bertforge prepare` wrote, or run prepare again if that folder lost the file"
        )
    meta = read_json(
        path / META_FILE, damaged="the token shard folder is damaged: delete it and re-run prepare"
    )
    if meta.get("format_version") != FORMAT_VERSION:
        raise BertforgeError(
            f"token shard folder {path} has format_version {meta.get('format_version')!r}, but this "
            f"bertforge reads version {FORMAT_VERSION}; delete the folder and re-run prepare"
        )
    counts_ok = all(
        isinstance(meta.get(key), int) and meta[key] > 0
        for key in ("num_tokens", "num_sentences", "num_documents", "vocab_size")
    )
    if not counts_ok or meta.get("token_dtype") not in _TOKEN_DTYPES:
        raise _damaged(path, f"{META_FILE} lacks valid counts or token_dtype")
    if not isinstance(meta.get("tokenizer_fingerprint"), str):
        raise _damaged(path, f"{META_FILE} does not name the tokenizer that prepared it")
    return meta


def _map(path: Path, name: str, dtype: np.dtype, count: int) -> np.memmap:
    file = path / name
    if not file.is_file():
        raise _damaged(path, f"{name} is missing")
    size, expected = file.stat().st_size, count * dtype.itemsize
    if size != expected:
        raise _damaged(path, f"{name} has {size} bytes, meta.json implies {expected}")
    return np.memmap(file, dtype=dtype, mode="r", shape=(count,))
