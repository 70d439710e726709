"""Corpus readers: turn corpus files into a stream of documents, each a list of sentences.

Owns resolving `--corpus` values (files, folders, glob patterns) into a list of files, format
detection (WikiText, plain text with blank-line documents and a sentence a line, JSON lines,
Parquet, and the text of labelled files: a TSV or CSV table's text column, a CoNLL file's words),
the rule-based sentence splitter, undoing WikiText's tokenisation artifacts, and the error messages
for unreadable input. Text files are read line by line, gzip-compressed ones (`.gz`) decompressed
on the fly, and Parquet files in batches of rows, so memory does not grow with the corpus.
"""

from __future__ import annotations

import codecs
import csv
import glob
import gzip
import itertools
import json
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal, get_args

from bertforge.errors import BertforgeError, rewrite_command, to_utf8
from bertforge.io import JSON_FAULTS, json_fault
from bertforge.labeled import LONGEST_FIELD, NOT_REGULAR, is_header_row
from bertforge.tagged import CONLL_SUFFIXES, DOCSTART, SNIFF_LINES, looks_tagged

# auto: `detect_format`; tsv, csv and conll read the text of labelled files
CorpusFormat = Literal["auto", "wikitext", "text", "jsonl", "parquet", "tsv", "csv", "conll"]
FORMATS: tuple[CorpusFormat, ...] = get_args(CorpusFormat)
READER_VERSION = 6  # 2: a line break ends a sentence, 3: so does a CR alone, and Jan. or Corp. do not;
# 4: a quotation of several sentences ends with its closing quote, Ste. goes on; 5: a closing " before
# a lower-case word goes on, as do Bros., pp. and var., and a text field's lines end where a text
# file's do (not at a form feed, NEL or U+2028); 6: CRs before an LF end one line, as in labelled files;
# cached tokenizers and shards key on it
# the formats whose text sits in a named field (data.text_column)
COLUMN_FORMATS = ("jsonl", "parquet", "tsv", "csv")
_TABLE_SUFFIXES = {".tsv": "tsv", ".tab": "tsv", ".csv": "csv"}
DEFAULT_TEXT_COLUMN = "text"

# Terminal punctuation, then closing quotes/brackets (attached, or space-separated as in WikiText),
# then an optional space-separated straight quote (closing or opening: decided by quote parity),
# then whitespace before something that may start a sentence.
_BOUNDARY = re.compile(
    r"""(?<![.!?])[.!?]+  # a whole run of them (a match starting inside one would backtrack, O(n^2))
        (?:["'”’»)\]]|\s[)\]”’»])*
        (?P<quote>\s")?
        \s+
        (?=(?P<next>["'“‘«]|[(\[]?\s?[^\W_]))""",
    re.VERBOSE,
)
_LAST_WORD = re.compile(r"[^\s\"'“‘«(\[]+\Z")
# Words whose period is theirs, as written (lower-case "no." ends a sentence, "No. 5" does not)
_ABBREVIATIONS = frozenset(
    {
        *("Mr", "Mrs", "Ms", "Dr", "St", "Ste", "Prof", "Sr", "Jr", "Mt", "Ft", "Gen", "Col", "Lt", "Capt"),
        *("Sgt", "Rev", "Gov", "Sen", "Rep", "No", "Nos", "Fig", "Vol", "Inc", "Ltd", "Co", "Corp", "Bros"),
        *("pp", "var"),  # pages, variety
        *("Jan", "Feb", "Aug", "Sept", "Oct", "Nov", "Dec"),
        *("e.g", "i.e", "etc", "vs", "cf", "approx", "ca", "E.g", "I.e", "Etc", "Vs", "Cf"),
    }
)
_WIKITEXT_HEADING = re.compile(r"(=(?: =)*) (.*) \1")  # on a stripped line: level = number of "="
_WIKITEXT_ARTIFACTS = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), ("<unk>", "[UNK]"))
_DETECT_LINES = 100
_READ_BLOCK = 1 << 16  # bytes read at a time
# CR CR LF: CRLF text saved again through Windows' text mode. The lookbehind tries \r+\n at the first CR
# of a run alone, or a long run of CRs without an LF would take time quadratic in its length.
_LINE_END = re.compile(rb"(?<!\r)\r+\n|\r|\n")
_TEXT_LINE_END = re.compile(r"(?<!\r)\r+\n|\r|\n")  # in a field's text (str.splitlines: also \x0c, U+2028...)
_PARQUET_BATCH_ROWS = 1024
_GLOB_CHARACTERS = frozenset("*?[")


def resolve_corpus_files(specs: str | Path | Sequence[str | Path]) -> list[Path]:
    """The files named by corpus specs, sorted by absolute path, each once.

    A spec is a file, a folder (every file below it, through linked folders, hidden ones skipped) or
    a glob pattern (`data/*.txt`, `data/**/*.gz`). A folder or pattern without files is an error.
    """
    specs = [specs] if isinstance(specs, (str, Path)) else list(specs)
    specs = [str(spec) for spec in specs if str(spec)]
    if not specs:
        raise BertforgeError("no corpus file given; give data.corpus: a file, a folder or a glob pattern")
    files: dict[Path, Path] = {}
    for spec in specs:
        for file in _spec_files(spec):
            files.setdefault(file.resolve(), file)
    return [files[key] for key in sorted(files)]


def _spec_files(spec: str) -> list[Path]:
    path = Path(spec)
    if not path.exists() and _GLOB_CHARACTERS & set(spec):
        # A broken link, or a path through a link loop too deep to resolve, is skipped as in a folder.
        matches = [Path(match) for match in sorted(glob.glob(spec, recursive=True)) if os.path.exists(match)]
        files = [file for match in matches for file in (_folder_files(match) if match.is_dir() else [match])]
        if not files:
            raise BertforgeError(f"corpus pattern {spec!r} matches no file; check the pattern")
        return files
    if path.is_dir():
        files = _folder_files(path)
        if not files:
            raise BertforgeError(f"corpus folder {path} holds no files; check the path")
        _refuse_folder_of_ours(path)
        return files
    return [check_text_file(path)]


# Files that make a folder something other than text (the names the Hugging Face ecosystem and
# `bertforge prepare` give them), and what to do with such a folder instead.
_NOT_CORPUS = {
    "model.safetensors": ("a model", "a model goes to --init, or to finetune's --model"),
    "tokenizer/tokenizer.json": ("a pretraining run", "its model goes to --init, or to finetune's --model"),
    "tokenizer.json": ("a tokenizer", "a tokenizer goes to --tokenizer"),
    "tokens.bin": ("prepared shards", "give them with --shards"),
}


def _refuse_folder_of_ours(folder: Path) -> None:
    """A model, tokenizer or shard folder given as a corpus folder, named as what it is."""
    for name, (what, fix) in _NOT_CORPUS.items():
        if (folder / name).is_file():
            raise BertforgeError(f"corpus folder {folder} holds {what} ({name}), not text; {fix}")


def _folder_files(folder: Path) -> list[Path]:
    """Every file below `folder` but hidden ones and those named with a leading `_` (the `_SUCCESS` and
    `_metadata` of a Spark or Arrow dataset), through linked subfolders too (each real folder once: a
    link back up does not loop)."""
    files, seen = [], set()
    for root, folders, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            folders[:] = []
            continue
        seen.add(real)
        folders[:] = sorted(name for name in folders if not name.startswith("."))  # a fixed order of names
        files += [Path(root, name) for name in names if not name.startswith((".", "_"))]
    return sorted(file for file in files if file.is_file())


def is_gzip(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".gz"


def is_parquet(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".parquet"


def split_sentences(text: str) -> list[str]:
    """Split `text` after `.`, `!` or `?` that is followed by a capital, a digit or an opening quote.

    Common abbreviations (Mr., e.g., No.) and initials (J., U.S.) do not end a sentence.
    Works on normal text and on WikiText's space-separated form ("the end . The next").
    """
    sentences, start = [], 0
    quotes = _QuoteCount(text)
    for match in _BOUNDARY.finditer(text):
        cut = _cut(match, quotes)
        if cut is not None:
            sentence = text[start:cut].strip()
            if sentence:
                sentences.append(sentence)
            start = cut
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


class _QuoteCount:
    """The straight double quotes of a paragraph before a position, counted once, left to right.

    From the paragraph's start, not the sentence's: a quotation of several sentences closes after
    the last of them (WikiText: `" Stop . Now . " She left .`), and that quote is a closing one."""

    def __init__(self, text: str):
        self.text, self.counted_to, self.count = text, 0, 0

    def open_before(self, position: int) -> bool:
        """Whether a quotation is open at `position` (positions asked for never decrease)."""
        self.count += self.text.count('"', self.counted_to, position)
        self.counted_to = position
        return self.count % 2 == 1


def _cut(match: re.Match, quotes: _QuoteCount) -> int | None:
    """Where the sentence ending at `match` stops, or None when `match` is not a boundary."""
    if _is_abbreviation(quotes.text, match.start()):
        return None
    follower = match["next"]
    if match["quote"]:
        if not quotes.open_before(match.start("quote")):  # an opening quote starts the next sentence
            return match.start("quote")
        return match.end() if _starts_sentence(follower) else None  # a closing one: as without it
    if follower == '"' and quotes.open_before(match.end()):
        return None  # a closing quote followed by a lower-case word: the sentence goes on
    return match.end() if _starts_sentence(follower) else None


def _starts_sentence(follower: str) -> bool:
    """Whether what follows a boundary may start a sentence: an opening quote, or a capital or a
    digit (after an optional bracket)."""
    return follower in "\"'“‘«" or follower[-1].isupper() or follower[-1].isdigit()


def _is_abbreviation(text: str, position: int) -> bool:
    if text[position] != "." or position == 0 or text[position - 1].isspace():
        return False
    word = _LAST_WORD.search(text, max(0, position - 32), position)
    return word is not None and takes_its_period(word[0])


def takes_its_period(word: str) -> bool:
    """Whether a period after `word` is part of it, not a sentence's end: initials ("J", "U.S", "a.m")
    or a listed abbreviation ("Mr", "e.g", "Corp", "CORP"). The sentence splitter and `bertforge tag`'s
    word splitter (`bertforge.alignment`) both ask this."""
    parts = word.split(".")
    letters = all(len(part) == 1 and part.isalpha() for part in parts)
    initials = letters and (len(parts) > 1 or word.isupper())  # a lone lower-case letter ends sentences
    return initials or word in _ABBREVIATIONS or (word.isupper() and word.capitalize() in _ABBREVIATIONS)


def _byte_lines(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of a byte stream read in blocks, each with its end: LF, CRLF, CRs before an LF (CRLF
    text saved again through Windows' text mode: CR CR LF) or CR alone (classic Mac OS). Each byte is
    looked at once, however long its line."""
    pieces: list[bytes] = []  # the line under way
    for block in _whole_line_ends(blocks):
        start = 0
        for end in _LINE_END.finditer(block):
            pieces.append(block[start : end.end()])
            yield b"".join(pieces)
            pieces.clear()
            start = end.end()
        pieces.append(block[start:])
    if line := b"".join(pieces):
        yield line


def _whole_line_ends(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """The blocks, cut again so that none ends inside a line end: the CRs that end a block wait for
    the next byte that is not a CR, which tells whether they end one line (before an LF) or each one."""
    held: list[bytes] = []
    for block in blocks:
        content = block.rstrip(b"\r")
        if content:
            yield b"".join(held) + content
            held.clear()
        held.append(block[len(content) :])
    yield b"".join(held)


class _Lines:
    """The decoded lines of a UTF-8 file as (line number, text); a `.gz` file is decompressed on the fly.

    `bytes_read` counts the (decompressed) bytes read so far, `consumed` the bytes of the file
    itself, for progress bars.
    """

    def __init__(self, path: Path):
        self.path = path
        self.bytes_read = self.consumed = 0

    def __iter__(self) -> Iterator[tuple[int, str]]:
        for number, raw in enumerate(self._raw_lines(), 1):
            if number == 1 and (kind := _binary_kind(raw, self.path)):
                raise BertforgeError(f"{self.path} is {kind}")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise BertforgeError(
                    f"{self.path} is not UTF-8 text: undecodable bytes on line {number} "
                    f"(byte offset {self.bytes_read - len(raw) + error.start}); {to_utf8(self.path)}"
                ) from None
            if "\x00" in line:  # the normalizer would drop them and glue words together
                raise BertforgeError(
                    f"{self.path} holds NUL bytes on line {number}: a binary file or an archive (a "
                    ".tar.gz: extract it), not text; give text files"
                )
            if number == 1:
                line = line.removeprefix("\ufeff")
            yield number, line.rstrip("\r\n")

    def raw_lines(self, numbers: set[int]) -> dict[int, bytes]:
        """The given lines as bytes with their ends, read anew: for an error's advice."""
        found, last = {}, max(numbers)
        for number, raw in enumerate(_Lines(self.path)._raw_lines(), 1):
            if number in numbers:
                found[number] = raw
            if number >= last:
                break
        return found

    def _raw_lines(self) -> Iterator[bytes]:
        """The file's lines as bytes, each with its end; `bytes_read` and `consumed` include it."""
        compressed = is_gzip(self.path)
        with self.path.open("rb") as handle:
            blocks = self._gunzip(handle) if compressed else iter(lambda: handle.read(_READ_BLOCK), b"")
            for raw in _byte_lines(blocks):
                self.bytes_read += len(raw)
                self.consumed = handle.tell() if compressed else self.bytes_read
                yield raw

    def _gunzip(self, handle) -> Iterator[bytes]:
        try:
            unpacked = gzip.GzipFile(fileobj=handle, mode="rb")
            while block := unpacked.read(_READ_BLOCK):
                yield block
        except (OSError, EOFError, zlib.error) as error:
            raise BertforgeError(
                f"{self.path} is not a readable gzip file ({error}); check that it was copied whole "
                f"(`gzip -t {self.path}`), or drop the .gz ending if it is plain text"
            ) from None


# The first bytes of files that are not UTF-8 text: what each is, and what to do with it.
_BINARY_STARTS = {
    b"PAR1": ("a Parquet file", "give it the .parquet ending, or --format parquet"),
    **{
        b"BZh%d1AY&SY" % level: (
            "bzip2-compressed",
            "decompress it (`bunzip2 -k FILE`), or compress it with gzip",
        )
        for level in range(1, 10)
    },
    b"\xfd7zXZ": ("xz-compressed", "decompress it (`unxz -k FILE`), or compress it with gzip"),
    b"\x1f\x8b": ("gzip-compressed", "give it a .gz ending, which bertforge reads as it is"),
    b"\x28\xb5\x2f\xfd": ("zstd-compressed", "decompress it (`unzstd -k FILE`), or compress it with gzip"),
    b"PK\x03\x04": ("a zip archive", "extract it and give its text files"),
    b"%PDF": ("a PDF", "extract its text first (`pdftotext FILE`)"),
    b"\x89PNG": ("a PNG image", "leave it out of the corpus"),
    b"\xff\xd8\xff": ("a JPEG image", "leave it out of the corpus"),
}


def _binary_kind(first_line: bytes, path: Path) -> str | None:
    """ "KIND, not UTF-8 text; FIX" for a file that starts with a UTF-16 byte-order mark or as one of
    `_BINARY_STARTS`."""
    if first_line.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return f"UTF-16 text, not UTF-8 text; {to_utf8(path, 'utf-16')}"
    for start, (kind, fix) in _BINARY_STARTS.items():
        if first_line.startswith(start):
            return f"{kind}, not UTF-8 text; {fix}"
    return None


class _ParquetRows:
    """The texts of one column of a Parquet file as (row number, text), read in batches of rows.

    The file and its column are checked on creation. `consumed` estimates the file's bytes read
    so far from the rows read (Parquet has no byte position), for progress bars.
    """

    def __init__(self, path: Path, column: str):
        self.path, self.column = path, column
        self.consumed = 0
        _check_parquet_magic(path)  # before asking for pyarrow, which a file of another kind needs not
        self._pa = _pyarrow()
        schema = self._open().schema_arrow
        if column not in schema.names:
            raise BertforgeError(
                f"{path} has no column {column!r}; its columns are: {', '.join(schema.names)}; "
                f"name the text column with data.text_column{_several_columns_note(column)}"
            )
        kind = schema.field(column).type
        if not self._is_text(kind):
            raise BertforgeError(
                f"{path}: column {column!r} holds {kind}, not text; "
                "name the text column with data.text_column"
            )

    def _is_text(self, kind) -> bool:
        """A string column, of any width or layout, or a dictionary (pandas' category) of strings."""
        types = self._pa.types
        if types.is_dictionary(kind):
            kind = kind.value_type
        string_view = getattr(types, "is_string_view", lambda _: False)  # pyarrow 16 and later
        return types.is_string(kind) or types.is_large_string(kind) or string_view(kind)

    def _open(self):
        try:
            return self._pa.parquet.ParquetFile(self.path)
        except (OSError, self._pa.ArrowException) as error:
            raise self._unreadable(error) from None

    def _unreadable(self, error: Exception) -> BertforgeError:
        return BertforgeError(f"{self.path} is not a readable Parquet file ({error}); check the file")

    def __iter__(self) -> Iterator[tuple[int, str]]:
        parquet = self._open()
        size, rows = self.path.stat().st_size, max(parquet.metadata.num_rows, 1)
        number = 0
        try:
            for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=[self.column]):
                for text in batch.column(0).to_pylist():
                    number += 1
                    self.consumed = size * number // rows
                    if text is not None:
                        yield number, text
        except (OSError, self._pa.ArrowException) as error:
            raise self._unreadable(error) from None


_PARQUET_MAGIC = (b"PAR1", b"PARE")  # the first 4 bytes of a Parquet file (PARE: its footer encrypted)


def _check_parquet_magic(path: Path) -> None:
    """Refuse a `.parquet` file that does not start as Parquet files do."""
    with path.open("rb") as handle:
        start = handle.read(4)
    if start not in _PARQUET_MAGIC:
        named = "name a text corpus with another ending than .parquet"
        asked = "read it as another format than parquet (data.format)"
        raise BertforgeError(
            f"{path} is not a Parquet file (Parquet files start with the bytes PAR1, it starts with "
            f"{start!r}); check the file, or {named if is_parquet(path) else asked}"
        )


def _pyarrow():
    """pyarrow with its parquet module, imported on first use: it is an optional dependency."""
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401  (makes `pyarrow.parquet` an attribute)
    except ImportError:
        raise BertforgeError(
            "reading Parquet files needs pyarrow; install it with `pip install 'bertforge[parquet]'`"
        ) from None
    return pyarrow


def check_text_file(path: str | Path, role: str = "corpus") -> Path:
    """`path`, refused unless it is a file with something in it; `role` names it in the message."""
    path = Path(path)
    if not path.exists():
        raise BertforgeError(f"{role} file {path} does not exist; check the path")
    if path.is_dir():
        raise BertforgeError(f"{role} path {path} is a folder; give the path of one text file")
    if not path.is_file():
        raise BertforgeError(f"{role} file {path} {NOT_REGULAR}")
    if path.stat().st_size == 0:
        raise BertforgeError(f"{role} file {path} is empty; give a file that holds text")
    return path


def detect_format(path: str | Path) -> str:
    """Guess a corpus file's format: parquet, tsv, csv, jsonl, wikitext, conll or text.

    "parquet" for a `.parquet` file; otherwise, looking through gzip compression, "jsonl" when the
    first non-blank line is a JSON object, "wikitext" when a heading (` = Title = `, ` = = Section = = `)
    occurs among the first non-blank lines, "conll" for a CoNLL ending or tagged
    words (`tagged.looks_tagged`), "tsv" or "csv" for a `.tsv`, `.tab` or `.csv` ending, else "text".
    """
    path = check_text_file(path)
    if is_parquet(path):
        return "parquet"
    suffix = (path.with_suffix("") if path.suffix.lower() == ".gz" else path).suffix.lower()
    first: list[str] = []  # the first non-blank lines
    for _, line in _Lines(path):
        if not line.strip():
            continue
        first.append(line)
        if len(first) == 1 and _looks_like_json(path, line):
            what, query = (
                ("a JSON array", "'.[]'") if line.lstrip()[0] == "[" else ("JSON over several lines", ".")
            )
            raise BertforgeError(
                f'{path} holds {what}, not JSON lines (one object a line, such as {{"text": "..."}}); '
                f"convert it, e.g. `jq -c {query} FILE > FILE.jsonl`"
            )
        # A broken first line of a file named as JSON is JSON lines too: its reader names the fault.
        if len(first) == 1 and line.lstrip().startswith("{") and (_is_json_object(line) or _named_json(path)):
            return "jsonl"
        if _looks_like_wikitext(line):
            return "wikitext"
        if len(first) >= _DETECT_LINES:
            break
    if suffix in CONLL_SUFFIXES or looks_tagged(first[:SNIFF_LINES]):  # a word and its tags a line
        return "conll"
    return _TABLE_SUFFIXES.get(suffix, "text")


def _looks_like_wikitext(line: str) -> bool:
    """A WikiText heading of any level: ` = Title = `, ` = = Section = = `, or either stripped of its
    spaces (a slice cut mid-article, a re-saved copy). Its ` @-@ ` alone is no evidence: WikiText's
    sentences rearranged into documents of their own are text."""
    return bool(_WIKITEXT_HEADING.fullmatch(line.strip()))


def _looks_like_json(path: Path, first_line: str) -> bool:
    """A JSON array, or an object over several lines, in a file named as JSON: not JSON lines."""
    return _named_json(path) and (first_line.lstrip().startswith("[") or first_line.strip() == "{")


def _named_json(path: Path) -> bool:
    return any(suffix.lower() in (".json", ".jsonl") for suffix in path.suffixes)


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except JSON_FAULTS:  # its reader names the fault
        return False


def read_documents(
    path: str | Path,
    format: str = "auto",
    on_progress: Callable[[int], None] | None = None,
    text_column: str = DEFAULT_TEXT_COLUMN,
) -> Iterator[list[str]]:
    """Stream the documents of a corpus file, each a non-empty list of sentences.

    `format` is one of `FORMATS`. `text_column` names the field of a JSON line or the column of a
    Parquet, TSV or CSV file that holds the text. `on_progress(n)` is called with
    the number of the file's bytes consumed since its last call (for progress bars). The path,
    the format and a Parquet file's column are checked at once; decoding and JSON errors surface
    while iterating.
    """
    path = check_text_file(path)
    format = resolve_format(path, format)
    source = _ParquetRows(path, text_column) if format == "parquet" else _Lines(path)
    return _stream(path, _READERS[format](source, text_column), source, on_progress)


def resolve_format(path: str | Path, format: str = "auto") -> str:
    """Check the file and the format name; for "auto", detect the format from the file."""
    path = check_text_file(path)
    if format not in FORMATS:
        raise BertforgeError(f"unknown corpus format {format!r}; choose one of: {', '.join(FORMATS)}")
    if is_parquet(path) and format not in ("auto", "parquet"):
        raise BertforgeError(
            f"{path} is a Parquet file but the corpus format is {format!r}; use data.format=auto or parquet"
        )
    return detect_format(path) if format == "auto" else format


def _stream(
    path: Path, documents: Iterator[list[str]], source, on_progress: Callable[[int], None] | None
) -> Iterator[list[str]]:
    reported = count = 0
    for document in documents:
        count += 1
        if on_progress is not None:
            on_progress(source.consumed - reported)
            reported = source.consumed
        yield document
    if on_progress is not None:
        on_progress(source.consumed - reported)
    if count == 0:
        raise BertforgeError(
            f"{path} has no text (only blank lines, headings, or empty or null text fields); check the file"
        )


def _wikitext_documents(lines: _Lines, _column: str) -> Iterator[list[str]]:
    document: list[str] = []
    for _, line in lines:
        text = clean_wikitext(line).strip()  # before stripping: a line may end in " @,@ "
        if not text:
            continue
        heading = _WIKITEXT_HEADING.fullmatch(text)
        if heading is None:
            document.extend(split_sentences(text))
        elif heading[1] == "=":  # an article title starts a new document; section headings are dropped
            if document:
                yield document
            document = []
    if document:
        yield document


def clean_wikitext(text: str) -> str:
    """Undo WikiText's number/hyphen splitting and turn `<unk>` into BERT's `[UNK]`."""
    for artifact, replacement in _WIKITEXT_ARTIFACTS:
        text = text.replace(artifact, replacement)
    return text


def _text_documents(lines: _Lines, _column: str) -> Iterator[list[str]]:
    """Blank lines end a document, and a line break a sentence (Google's input format: a sentence a
    line), as within a JSON line's text; each line is split at its sentence ends too."""
    paragraph: list[str] = []
    for _, line in lines:
        text = line.strip()
        if text:
            paragraph.append(text)
        elif paragraph:
            yield _sentences_of_paragraphs(paragraph)
            paragraph = []
    if paragraph:
        yield _sentences_of_paragraphs(paragraph)


def _jsonl_documents(lines: _Lines, column: str) -> Iterator[list[str]]:
    for number, line in lines:
        if not line.strip():
            continue
        document = _sentences_of_paragraphs(_lines_of(_jsonl_text(line, number, lines.path, column)))
        if document:
            yield document


# A TSV is read as GLUE's are, without quoting: a tab inside a value, or a line break, has no escape
_QUOTED_TSV = (
    "; the row holds quoted values, and TSV files are read without quoting (a tab or line break cannot "
    "be inside a value): write it without quotes, or as CSV"
)


def _several_columns_note(column: str) -> str:
    """For a file without columns to join: that several (`a,b`) are a table's."""
    return "; several columns, a,b, are read from TSV and CSV files only" if "," in column else ""


_JSON_KINDS = {bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}


def _jsonl_text(line: str, number: int, path: Path, column: str) -> str:
    field = json.dumps(column)
    hint = f'each line must be one JSON object with a string {field} field, e.g. {{{field}: "..."}}'
    hint += " (another field: data.text_column)"
    try:
        record = json.loads(line)
    except JSON_FAULTS as error:
        raise BertforgeError(f"{path}, line {number}: not valid JSON ({json_fault(error)}); {hint}") from None
    if isinstance(record, dict) and column in record and record[column] is None:
        return ""  # a record without text, as a null in a Parquet column
    if isinstance(record, dict) and column in record and not isinstance(record[column], str):
        kind = _JSON_KINDS.get(type(record[column]), "null")
        raise BertforgeError(f"{path}, line {number}: the {field} field is {kind}, not a string; {hint}")
    if not isinstance(record, dict) or column not in record:
        fields = f" (its fields: {', '.join(record)})" if isinstance(record, dict) and record else ""
        raise BertforgeError(
            f"{path}, line {number}: no string {field} field{fields}; {hint}{_several_columns_note(column)}"
        )
    text = record[column]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:  # a lone surrogate escape, such as "\ud83d" of a cut emoji
        raise BertforgeError(
            f"{path}, line {number}: the {field} field holds {text[error.start]!r}, half of a character "
            "(a lone surrogate escape, as in text cut inside an emoji); remove or replace it"
        ) from None
    return text


def _parquet_documents(rows: _ParquetRows, _column: str) -> Iterator[list[str]]:
    """One document per row; a row's lines are paragraphs, as in a JSON line's text."""
    for _, text in rows:
        document = _sentences_of_paragraphs(_lines_of(text))
        if document:
            yield document


def _table_documents(lines: _Lines, column: str, delimiter: str) -> Iterator[list[str]]:
    """One document per row of a TSV or CSV table: the text of its `column`, named in the header row
    or, in a table without one, counted from 0; several, comma-separated, in their order (a pair
    task's two sentences)."""
    kind = "TSV" if delimiter == "\t" else "CSV"
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL  # GLUE's TSVs hold bare quotes
    csv.field_size_limit(LONGEST_FIELD)  # a document may be far longer than csv's 128 KiB
    rows = (line + "\n" for _, line in lines)
    reader = csv.reader(rows, delimiter=delimiter, quoting=quoting, strict=True)  # a quote left open: named
    try:
        header = next(reader, [])
        positions, by_number = _text_positions(lines.path, header, column)
        numbered = ((reader.line_num, row) for row in reader)
        ahead = list(itertools.islice(numbered, _HEADER_EVIDENCE_ROWS)) if by_number else []
        if ahead and is_header_row(header, [row for _, row in ahead], range(len(header))):
            raise BertforgeError(
                f"{lines.path} starts with a header row ({', '.join(header)}); name the text's column "
                "(data.text_column) instead of giving its number, or the header becomes a document"
            )
        for line, row in itertools.chain([(1, header)] if by_number else [], ahead, numbered):
            if not row:
                continue
            if len(row) != len(header):
                quoted = any(value.startswith('"') for value in row) and quoting == csv.QUOTE_NONE
                raise BertforgeError(
                    f"{lines.path} line {line} has {len(row)} fields where line 1 has "
                    f"{len(header)}; every row has one value per column"
                    + (_QUOTED_TSV if quoted else _lone_cr_note(lines, line))
                )
            texts = [row[position] for position in positions]
            if document := _sentences_of_paragraphs(line for text in texts for line in _lines_of(text)):
                yield document
    except csv.Error as error:
        raise BertforgeError(f"{lines.path} line {reader.line_num} is not valid {kind} ({error})") from None


def _lone_cr_note(lines: _Lines, line: int) -> str:
    """For a short row: that a CR alone ended it, or the line before it, in a file whose line 1 ends in
    a line feed (a CR inside a field, which labelled files keep in the line and a corpus reads as a line
    end, as in classic Mac OS text)."""
    raw = lines.raw_lines({1, line - 1, line})
    cut = [number for number in (line - 1, line) if number > 1 and _ends_in_text_and_cr(raw[number])]
    if not cut or not raw[1].endswith(b"\n"):
        return ""
    return (
        f"; line {cut[0]} ends in a CR alone where line 1 ends in a line feed: the corpus reader ends a "
        "line at every CR, so a CR inside a field cuts its row; turn the CRs into spaces, e.g. "
        f"`{rewrite_command(lines.path, _CRS_TO_SPACES, 'spaced')}`"
    )


_CRS_TO_SPACES = "tr '\\r' ' '"  # spaces, not deleted: `tr -d` would glue a field's words together


def _ends_in_text_and_cr(raw: bytes) -> bool:
    """Whether a line holds text and ends in a CR alone (not a line of CRs, nor CRLF)."""
    return raw.endswith(b"\r") and bool(raw.strip(b"\r"))


_HEADER_EVIDENCE_ROWS = 100  # rows read ahead to tell a header row from data (`labeled.is_header_row`)


def _text_positions(path: Path, header: list[str], column: str) -> tuple[list[int], bool]:
    """Where the text columns are, and whether they were given by number (a table without a header)."""
    wanted = [name.strip() for name in column.split(",")]
    names = [name.strip() for name in header]
    if all(name.isdigit() and int(name) < len(header) for name in wanted):
        return [int(name) for name in wanted], True
    missing = [name for name in wanted if name not in names]
    if missing:
        raise BertforgeError(
            f"{path} has no column {', '.join(map(repr, missing))} (its columns: {', '.join(names)}); "
            "name the text's column (data.text_column; several: a,b; in a table without a header row, "
            "numbers counted from 0), or read the file as plain text with data.format=text"
        )
    return [names.index(name) for name in wanted], False


def _conll_documents(lines: _Lines, _column: str) -> Iterator[list[str]]:
    """A CoNLL file's words, a sentence per blank-line block (its first column joined by spaces) and a
    document per `-DOCSTART-` line; the tags are left out."""
    document: list[str] = []
    words: list[str] = []
    for _, line in itertools.chain(lines, [(0, "")]):  # a last blank line ends the last sentence
        fields = line.split()
        if fields and fields[0] != DOCSTART:
            words.append(fields[0])
            continue
        if words:
            document.append(" ".join(words))
            words = []
        if fields and document:  # -DOCSTART-: a new document
            yield document
            document = []
    if document:
        yield document


def _lines_of(text: str) -> list[str]:
    """A text field's lines, each a paragraph, broken as a text file's are."""
    return _TEXT_LINE_END.split(text)


def _sentences_of_paragraphs(paragraphs: Iterable[str]) -> list[str]:
    return [sentence for paragraph in paragraphs for sentence in split_sentences(paragraph)]


# format -> reader(source, text_column); a Parquet source holds its own column.
_READERS = {
    "wikitext": _wikitext_documents,
    "text": _text_documents,
    "jsonl": _jsonl_documents,
    "parquet": _parquet_documents,
    "tsv": lambda lines, column: _table_documents(lines, column, "\t"),
    "csv": lambda lines, column: _table_documents(lines, column, ","),
    "conll": _conll_documents,
}
