"""Token shards: a corpus tokenized once into flat binary files that are memory-mapped for training.

Owns the folder layout and its checks. `tokens.bin` holds every token id back to back (uint16 when
the vocabulary fits, else uint32); `sentence_offsets.bin` (int64, num_sentences + 1) says where
each sentence starts in it; `document_offsets.bin` (int64, num_documents + 1) says which
sentences each document holds; `meta.json` records the counts, the tokenizer fingerprint and the
source file's content hash. Preparation streams the corpus in batches, so memory stays flat as
the corpus grows, and writes the folder atomically.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from pathlib import Path
from typing import BinaryIO

import numpy as np
from tqdm import tqdm

from bertforge.corpus import read_documents, resolve_format
from bertforge.errors import BertforgeError
from bertforge.io import atomic_directory
from bertforge.tokenizer import BertTokenizer

FORMAT_VERSION = 1
TOKENS_FILE = "tokens.bin"
SENTENCE_OFFSETS_FILE = "sentence_offsets.bin"
DOCUMENT_OFFSETS_FILE = "document_offsets.bin"
META_FILE = "meta.json"
_BATCH_CHARACTERS = 2_000_000  # about 500k tokens per tokenizer call
_BATCH_DOCUMENTS = 4096
_TOKEN_DTYPES = ("uint16", "uint32")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's content, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def prepare_shards(
    corpus: str | Path,
    tokenizer: BertTokenizer,
    out_dir: str | Path,
    format: str = "auto",
    show_progress: bool = True,
    corpus_sha256: str | None = None,
) -> dict:
    """Tokenize `corpus` into a shard folder at `out_dir` and return its meta.json content.

    `corpus_sha256`: the corpus hash when the caller already has it (the cache does), to save a pass.
    """
    corpus = Path(corpus)
    corpus_format = resolve_format(corpus, format)  # checks the file and the format name first
    dtype = token_dtype(tokenizer.vocab_size)
    progress = tqdm(
        total=corpus.stat().st_size,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=f"tokenizing {corpus.name}",
        file=sys.stderr,
        disable=not show_progress,
    )
    with progress, atomic_directory(Path(out_dir)) as tmp, _ShardWriter(tmp, dtype) as writer:
        for batch in _document_batches(read_documents(corpus, corpus_format, on_progress=progress.update)):
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
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
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
    """Appends tokenized batches of documents to the three binary files."""

    def __init__(self, folder: Path, dtype: np.dtype):
        self.dtype = dtype
        self.num_tokens = self.num_sentences = self.num_documents = 0
        self._tokens: BinaryIO = (folder / TOKENS_FILE).open("wb")
        self._sentences: BinaryIO = (folder / SENTENCE_OFFSETS_FILE).open("wb")
        self._documents: BinaryIO = (folder / DOCUMENT_OFFSETS_FILE).open("wb")
        np.zeros(1, np.int64).tofile(self._sentences)
        np.zeros(1, np.int64).tofile(self._documents)

    def __enter__(self) -> _ShardWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        for handle in (self._tokens, self._sentences, self._documents):
            handle.close()

    def add(self, documents: list[list[str]], tokenizer: BertTokenizer) -> None:
        sentences = [sentence for document in documents for sentence in document]
        ids = tokenizer.encode_batch(sentences)
        lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
        kept = lengths > 0  # sentences with no tokens are skipped, then documents with no sentences
        owner = np.repeat(np.arange(len(documents)), [len(document) for document in documents])
        sentences_per_document = np.bincount(owner[kept], minlength=len(documents))
        sentences_per_document = sentences_per_document[sentences_per_document > 0]
        tokens = np.fromiter(itertools.chain.from_iterable(ids), self.dtype, count=int(lengths.sum()))
        tokens.tofile(self._tokens)
        (self.num_tokens + np.cumsum(lengths[kept])).tofile(self._sentences)
        (self.num_sentences + np.cumsum(sentences_per_document)).tofile(self._documents)
        self.num_tokens += len(tokens)
        self.num_sentences += int(kept.sum())
        self.num_documents += len(sentences_per_document)


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
        return cls(path, meta, tokens, sentence_offsets, document_offsets)

    @property
    def num_tokens(self) -> int:
        return int(self.meta["num_tokens"])

    @property
    def num_sentences(self) -> int:
        return int(self.meta["num_sentences"])

    @property
    def num_documents(self) -> int:
        return int(self.meta["num_documents"])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def tokenizer_fingerprint(self) -> str:
        return self.meta["tokenizer_fingerprint"]

    def document(self, d: int) -> list[np.ndarray]:
        """The token ids of each sentence of document `d`."""
        first, last = self.document_offsets[d], self.document_offsets[d + 1]
        bounds = self.sentence_offsets[first : last + 1]
        return [self.tokens[start:stop] for start, stop in zip(bounds[:-1], bounds[1:], strict=True)]


def _damaged(path: Path, why: str) -> BertforgeError:
    return BertforgeError(f"token shard folder {path} is damaged ({why}); delete it and re-run prepare")


def _read_meta(path: Path) -> dict:
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _damaged(path, f"{META_FILE} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _damaged(path, f"{META_FILE} is not valid JSON") from None
    if not isinstance(meta, dict):
        raise _damaged(path, f"{META_FILE} does not hold a JSON object")
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
    return meta


def _map(path: Path, name: str, dtype: np.dtype, count: int) -> np.memmap:
    file = path / name
    if not file.is_file():
        raise _damaged(path, f"{name} is missing")
    size, expected = file.stat().st_size, count * dtype.itemsize
    if size != expected:
        raise _damaged(path, f"{name} has {size} bytes, meta.json implies {expected}")
    return np.memmap(file, dtype=dtype, mode="r", shape=(count,))
