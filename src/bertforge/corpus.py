"""Corpus readers: turn a text file into a stream of documents, each a list of sentences.

Owns format detection (WikiText, plain text with blank-line documents, JSON lines), the
rule-based sentence splitter, undoing WikiText's tokenisation artifacts, and the error messages
for unreadable input. Files are read line by line, so memory does not grow with the corpus.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from bertforge.errors import BertforgeError

FORMATS = ("auto", "wikitext", "text", "jsonl")

# Terminal punctuation, then closing quotes/brackets (attached, or space-separated as in WikiText),
# then an optional space-separated straight quote (closing or opening: decided by quote parity),
# then whitespace before something that may start a sentence.
_BOUNDARY = re.compile(
    r"""[.!?]+
        (?:["'”’»)\]]|\s[)\]”’»])*
        (?P<quote>\s")?
        \s+
        (?=(?P<next>["'“‘«]|[(\[]?\s?[^\W_]))""",
    re.VERBOSE,
)
_LAST_WORD = re.compile(r"[^\s\"'“‘«(\[]+\Z")
_INITIALS = re.compile(r"(?:[A-Za-z]\.)*[A-Z]")  # "J", "U.S", "e.g"
_ABBREVIATIONS = frozenset(
    {
        *("Mr", "Mrs", "Ms", "Dr", "St", "Prof", "Sr", "Jr", "Mt", "Gen", "Col", "Lt", "Capt", "Sgt"),
        *("Rev", "Gov", "Sen", "Rep", "No", "Nos", "Fig", "Vol", "Inc", "Ltd", "Co"),
        *("e.g", "i.e", "etc", "vs", "cf", "approx", "ca", "E.g", "I.e", "Etc", "Vs", "Cf"),
    }
)
_WIKITEXT_HEADING = re.compile(r"(=(?: =)*) (.*) \1")  # on a stripped line: level = number of "="
_WIKITEXT_TITLE_LINE = re.compile(r" = [^=](?:.*[^=])? = ?")  # the raw form of a level-1 heading
_WIKITEXT_ARTIFACTS = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), ("<unk>", "[UNK]"))
_DETECT_LINES = 100


def split_sentences(text: str) -> list[str]:
    """Split `text` after `.`, `!` or `?` that is followed by a capital, a digit or an opening quote.

    Common abbreviations (Mr., e.g., No.) and initials (J., U.S.) do not end a sentence.
    Works on normal text and on WikiText's space-separated form ("the end . The next").
    """
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(text):
        cut = _cut(text, match, start)
        if cut is not None:
            sentence = text[start:cut].strip()
            if sentence:
                sentences.append(sentence)
            start = cut
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def _cut(text: str, match: re.Match, start: int) -> int | None:
    """Where the sentence ending at `match` stops, or None when `match` is not a boundary."""
    if _is_abbreviation(text, match.start()):
        return None
    if match["quote"]:
        opening = text.count('"', start, match.start("quote")) % 2 == 0
        return match.start("quote") if opening else match.end()
    follower = match["next"]
    if follower == '"' and text.count('"', start, match.end()) % 2 == 1:
        return None  # a closing quote followed by a lower-case word: the sentence goes on
    if follower in "\"'“‘«":
        return match.end()
    return match.end() if follower[-1].isupper() or follower[-1].isdigit() else None


def _is_abbreviation(text: str, position: int) -> bool:
    if text[position] != "." or position == 0 or text[position - 1].isspace():
        return False
    word = _LAST_WORD.search(text, max(0, position - 32), position)
    return word is not None and (word[0] in _ABBREVIATIONS or _INITIALS.fullmatch(word[0]) is not None)


class _Lines:
    """The decoded lines of a UTF-8 file as (line number, text), counting the bytes read so far."""

    def __init__(self, path: Path):
        self.path = path
        self.bytes_read = 0

    def __iter__(self) -> Iterator[tuple[int, str]]:
        with self.path.open("rb") as handle:
            for number, raw in enumerate(handle, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise BertforgeError(
                        f"{self.path} is not UTF-8 text: undecodable bytes on line {number} "
                        f"(byte offset {self.bytes_read + error.start}); convert the file to UTF-8, "
                        f"e.g. `iconv -f latin1 -t utf-8 in.txt > out.txt`"
                    ) from None
                self.bytes_read += len(raw)
                if number == 1:
                    line = line.removeprefix("\ufeff")
                yield number, line.rstrip("\r\n")


def _check_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise BertforgeError(f"corpus file {path} does not exist; check the path")
    if path.is_dir():
        raise BertforgeError(f"corpus path {path} is a folder; give the path of one text file")
    if path.stat().st_size == 0:
        raise BertforgeError(f"corpus file {path} is empty; give a file that holds text")
    return path


def detect_format(path: str | Path) -> str:
    """Guess a corpus file's format: jsonl, wikitext or text.

    "jsonl" when the first non-blank line is a JSON object, "wikitext" when a ` = Title = ` line
    occurs among the first non-blank lines, otherwise "text".
    """
    path = _check_file(path)
    seen = 0
    for _, line in _Lines(path):
        if not line.strip():
            continue
        if seen == 0 and line.lstrip().startswith("{") and _is_json_object(line):
            return "jsonl"
        if _WIKITEXT_TITLE_LINE.fullmatch(line):
            return "wikitext"
        seen += 1
        if seen >= _DETECT_LINES:
            break
    return "text"


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


def read_documents(
    path: str | Path, format: str = "auto", on_progress: Callable[[int], None] | None = None
) -> Iterator[list[str]]:
    """Stream the documents of a corpus file, each a non-empty list of sentences.

    `format` is one of auto, wikitext, text, jsonl. `on_progress(n)` is called with the number
    of bytes consumed since its last call (for progress bars). The path and format are checked
    at once; decoding and JSON errors surface while iterating.
    """
    path = _check_file(path)
    return _stream(path, _READERS[resolve_format(path, format)], on_progress)


def resolve_format(path: str | Path, format: str = "auto") -> str:
    """Check the file and the format name; for "auto", detect the format from the file."""
    path = _check_file(path)
    if format not in FORMATS:
        raise BertforgeError(f"unknown corpus format {format!r}; choose one of: {', '.join(FORMATS)}")
    return detect_format(path) if format == "auto" else format


def _stream(path: Path, reader, on_progress: Callable[[int], None] | None) -> Iterator[list[str]]:
    lines = _Lines(path)
    reported = count = 0
    for document in reader(lines):
        count += 1
        if on_progress is not None:
            on_progress(lines.bytes_read - reported)
            reported = lines.bytes_read
        yield document
    if on_progress is not None:
        on_progress(lines.bytes_read - reported)
    if count == 0:
        raise BertforgeError(f"corpus file {path} has no text (only blank lines or headings); check the file")


def _wikitext_documents(lines: _Lines) -> Iterator[list[str]]:
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


def _text_documents(lines: _Lines) -> Iterator[list[str]]:
    paragraph: list[str] = []
    for _, line in lines:
        text = line.strip()
        if text:
            paragraph.append(text)
        elif paragraph:
            yield split_sentences(" ".join(paragraph))
            paragraph = []
    if paragraph:
        yield split_sentences(" ".join(paragraph))


def _jsonl_documents(lines: _Lines) -> Iterator[list[str]]:
    for number, line in lines:
        if not line.strip():
            continue
        document = _sentences_of_paragraphs(_jsonl_text(line, number, lines.path).splitlines())
        if document:
            yield document


def _jsonl_text(line: str, number: int, path: Path) -> str:
    hint = 'each line must be one JSON object with a string "text" field, e.g. {"text": "..."}'
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise BertforgeError(f"{path}, line {number}: not valid JSON ({error.msg}); {hint}") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise BertforgeError(f'{path}, line {number}: no string "text" field; {hint}')
    return record["text"]


def _sentences_of_paragraphs(paragraphs: Iterable[str]) -> list[str]:
    return [sentence for paragraph in paragraphs for sentence in split_sentences(paragraph)]


_READERS = {"wikitext": _wikitext_documents, "text": _text_documents, "jsonl": _jsonl_documents}
