"""Labelled data for classification and regression: CSV, TSV (with or without a header row) and JSON lines.

Owns reading a file of texts, or text pairs, with one label each; detecting its format; telling a
classification from a regression (`task_type`: real-valued labels such as STS-B's "3.800" make a
regression); the label mapping of a classification (names in id order: whole numbers numerically,
string labels alphabetically) and the scores of a regression (`label_values`); pairs in both orders
(`in_both_orders`); and one clear message for every bad input: a missing file, undecodable bytes,
missing columns (naming the columns that exist), empty rows, a single class or a constant score,
validation labels never seen in training, and labels that are neither (real numbers mixed with text).
`read_lines` reads the unlabelled inputs of the commands that take one text per line.
A class with very few rows (a stray "maybe" among 0 and 1 would become a class of its own) is
named in a warning that lists every class found.

Columns are named by the header row; a file without a header names its columns by number,
counting from 0 (`--text-column 0 --label-column 1`), as pandas does for `header=None`.
TSV is read as GLUE writes it: tab-separated, no quoting (SST-2's sentences hold bare quotes).
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import math
import re
import shlex
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, get_args

from bertforge.errors import BertforgeError, to_utf8
from bertforge.io import JSON_FAULTS, json_fault

LabeledFormat = Literal["auto", "csv", "tsv", "jsonl"]  # auto: from the file name, else the text
FORMATS: tuple[LabeledFormat, ...] = get_args(LabeledFormat)
_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_SUFFIXES[".json"] = "jsonl"  # a .json file of one object per line; an array is refused with a hint
_INTEGER = re.compile(r"[+-]?\d+")
_WHOLE_NUMBER = re.compile(r"[+-]?\d+(\.0*)?")  # "1.0" too: pandas writes an integer column with gaps so
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")  # finite: no nan, no inf
TaskType = Literal["auto", "classification", "regression"]  # auto: regression for real-valued labels
TASK_TYPES: tuple[TaskType, ...] = get_args(TaskType)
RARE_SHARE = 0.01  # a class under 1% of the rows (and a tenth of an even share) is worth a warning


@dataclass
class LabeledExamples:
    """The examples of one file, in file order; `lines[i]` is where example i ends in the file."""

    path: Path
    texts: list[str]
    pairs: list[str] | None  # second texts, when a pair column was given
    labels: list[str]  # labels as read (integers in canonical form: "01" -> "1"; numbers as written)
    lines: list[int]

    def __len__(self) -> int:
        return len(self.texts)


def read_labeled(
    path: str | Path,
    text_column: str,
    label_column: str,
    text_pair_column: str | None = None,
    format: str = "auto",
) -> LabeledExamples:
    """Read every example of a CSV, TSV or JSON lines file, refusing bad input with a clear message."""
    path = Path(path)
    text = read_text(path)
    format = detect_labeled_format(path, text) if format == "auto" else format
    if format not in FORMATS:
        raise BertforgeError(f"unknown format {format!r}; choose one of: {', '.join(FORMATS)}")
    columns = [text_column, label_column] + ([text_pair_column] if text_pair_column else [])
    if len(set(columns)) < len(columns):
        raise BertforgeError(f"the text, label and text pair columns must differ, got {', '.join(columns)}")
    rows = _json_rows(path, text, columns) if format == "jsonl" else _table_rows(path, text, format, columns)
    examples = LabeledExamples(path, [], [] if text_pair_column else None, [], [])
    for line, values in rows:
        _add_example(examples, line, columns, values)
    if not examples.texts:
        raise BertforgeError(f"{path} holds a header but no examples; add the examples below it")
    return examples


GZIP_MAGIC = b"\x1f\x8b"
# /dev/stdin, <(...): bertforge hashes, sniffs and reads its files more than once
NOT_REGULAR = "is not a regular file (a pipe or a device); save the text to a file and give its path"
EMPTY_CHECK_BYTES = 4096  # a file no longer than this that holds only white space is empty


def check_data_file(path: Path, what: str = "one labelled example per line") -> None:
    """Refuse a missing file, a folder or an empty file (naming `what` a file should hold) and a
    gzip file."""
    path = Path(path)
    if not path.exists():
        raise BertforgeError(f"data file {path} does not exist; check the path")
    if path.is_dir():
        raise BertforgeError(f"{path} is a folder; give a file with {what}")
    if not path.is_file():
        raise BertforgeError(f"{path} {NOT_REGULAR}")
    with path.open("rb") as file:
        head = file.read(EMPTY_CHECK_BYTES)
    if not head.strip() and path.stat().st_size <= len(head):
        raise empty_file(path, what)
    compressed = head.startswith(GZIP_MAGIC)
    if compressed:
        plain = (
            path.with_suffix("") if path.suffix.lower() == ".gz" else path.with_name(f"unpacked{path.suffix}")
        )
        command = f"gunzip -c {shlex.quote(str(path))} > {shlex.quote(str(plain))}"
        raise BertforgeError(f"{path} is gzip-compressed; decompress it first, e.g. `{command}`")


LONGEST_FIELD = 2**31 - 1  # csv's largest field limit on every platform
CR_BEFORE_LF = re.compile(r"(?<!\r)\r+\n")  # from a run's first CR alone: linear in a run's length


def read_text(path: Path, what: str = "one labelled example per line") -> str:
    """The whole file as text, its lines ending in LF whether they ended in LF, CRLF or (a file
    without LF) CR, with a message naming the line of the first undecodable byte; an empty file or a
    folder is refused, naming `what` a file should hold."""
    check_data_file(path, what)
    raw = path.read_bytes()
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # a spreadsheet's "Unicode text"
        raise BertforgeError(f"{path} is UTF-16 text, not UTF-8; {to_utf8(path, 'utf-16')}")
    try:
        text = raw.decode("utf-8-sig")  # tolerate the byte-order mark spreadsheets write
    except UnicodeDecodeError as error:
        offset = error.start + len(codecs.BOM_UTF8) * raw.startswith(codecs.BOM_UTF8)  # in the file
        line = raw[:offset].count(b"\n" if b"\n" in raw else b"\r") + 1
        raise BertforgeError(
            f"{path} is not UTF-8 text: undecodable bytes on line {line} (byte offset {offset}); "
            f"{to_utf8(path)}"
        ) from None
    # CRLF (and the \r\r\n of CRLF text saved again on Windows) end lines as LF; a lone CR ends them
    # only in a file without LF (an old Mac's)
    text = CR_BEFORE_LF.sub("\n", text) if "\n" in text else text.replace("\r", "\n")
    text = text.rstrip("\r\n")  # blank lines at the very end are not empty rows
    if not text.strip():  # white space past what check_data_file reads
        raise empty_file(path, what)
    return text


def empty_file(path: Path, what: str) -> BertforgeError:
    """The error for a data file with nothing in it but white space."""
    return BertforgeError(f"data file {path} is empty; give a file with {what}")


def read_lines(path: Path, what: str) -> list[str]:
    """The lines of a text file of one input per line (`read_text`'s checks): blank lines at its end
    are left out, one anywhere else is refused, naming it."""
    lines = read_text(path, what).split("\n")
    while not lines[-1].strip():  # read_text refuses a file of blank lines
        lines.pop()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            raise BertforgeError(f"{path} line {number} is blank; give {what}, no blank lines")
    return lines


def detect_labeled_format(path: Path, text: str) -> str:
    """From the file name's suffix, else from the content: `{` starts JSON lines, a tab means TSV."""
    if path.suffix.lower() in _SUFFIXES:
        return _SUFFIXES[path.suffix.lower()]
    if text.lstrip().startswith("{"):
        return "jsonl"
    return "tsv" if "\t" in text.split("\n", 1)[0] else "csv"


def _table_rows(path: Path, text: str, format: str, columns: list[str]) -> Iterator[tuple[int, list[str]]]:
    """(line, values of `columns`) for each data row of a CSV or TSV file."""
    csv.field_size_limit(LONGEST_FIELD)  # a text may be far longer than csv's 128 KiB
    if format == "tsv":
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)  # a quote left open: named
    try:
        rows = [(reader.line_num, row) for row in reader]
    except csv.Error as error:
        where = f"{path} line {reader.line_num}"
        raise BertforgeError(f"{where} is not valid {format.upper()} ({error})") from None
    first = [field.strip() for field in rows[0][1]]
    if not any(first):
        raise BertforgeError(
            f"{path} line 1 is empty; the first line names the columns (or, in a file without a header "
            "row, holds the first example)"
        )
    if all(column in first for column in columns):
        positions, rows = [first.index(column) for column in columns], rows[1:]
    elif all(column.isdigit() for column in columns):
        positions = [int(column) for column in columns]
        if max(positions) >= len(first):
            raise BertforgeError(
                f"{path} has {len(first)} columns (numbered 0 to {len(first) - 1}); there is no column "
                f"{max(positions)}"
            )
        _refuse_header_read_as_data(path, rows, positions[1], first)
    else:
        missing = ", ".join(repr(column) for column in columns if column not in first)
        other = {"tsv": ("csv", ","), "csv": ("tsv", "\t")}[format]
        if len(first) == 1 and other[1] in first[0]:  # one column that the other separator splits
            hint = f"its one column is {first[0]!r}: read it as {other[0].upper()} with --format {other[0]}"
        else:
            hint = (
                f"its columns are: {', '.join(first)} (for a file without a header row, give columns by "
                "number, counting from 0)"
            )
        raise BertforgeError(f"{path} has no column {missing}; {hint}")
    width = len(first)
    for line, row in rows:
        if not any(field.strip() for field in row):
            raise BertforgeError(f"{path} line {line} is empty; remove empty rows")
        if len(row) != width:
            fix = "a TSV text cannot hold a tab" if format == "tsv" else "quote a text that holds commas"
            raise BertforgeError(
                f"{path} line {line} has {len(row)} fields where line 1 has {width}; every row has one value "
                f"per column ({fix})"
            )
        yield line, [row[position] for position in positions]


def is_header_row(first: list[str], rows: list[list[str]], positions: Iterable[int]) -> bool:
    """Whether `first`, a table's first row, names its columns rather than holding data: in one of the
    `positions`, a word above a column of numbers (`rows`, the rows after it)."""
    for position in positions:
        values = [row[position].strip() for row in rows if len(row) > position]
        if len(first) <= position or not values:  # a short first row names nothing there
            continue
        if not _NUMBER.fullmatch(first[position].strip()) and all(_NUMBER.fullmatch(v) for v in values):
            return True
    return False


def _refuse_header_read_as_data(path: Path, rows: list, label_position: int, first: list[str]) -> None:
    """Columns given by number on a file whose first row names them: a header would become an example."""
    if is_header_row(first, [row for _, row in rows[1:]], [label_position]):
        raise BertforgeError(
            f"{path} starts with a header row ({', '.join(first)}); give the columns by name, not by number"
        )


def json_line(path: Path, number: int, raw: str):
    """The value on line `number` of the JSON lines file `path`; one error naming the line if not JSON."""
    try:
        return json.loads(raw)
    except JSON_FAULTS as error:
        raise BertforgeError(
            f"{path} line {number} is not valid JSON ({json_fault(error)}); each line holds one JSON object"
        ) from None


def _json_rows(path: Path, text: str, columns: list[str]) -> Iterator[tuple[int, list]]:
    """(line, values of `columns`) for each object of a JSON lines file."""
    if text.lstrip().startswith("["):
        raise BertforgeError(f"{path} holds a JSON array; give JSON lines (one object per line)")
    for line, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            raise BertforgeError(f"{path} line {line} is empty; remove empty rows")
        record = json_line(path, line, raw)
        if not isinstance(record, dict):
            raise BertforgeError(f"{path} line {line} is not a JSON object; give one object per line")
        missing = [column for column in columns if column not in record]
        if missing:
            raise BertforgeError(
                f"{path} line {line} has no field {', '.join(map(repr, missing))}; "
                f"its fields are: {', '.join(record) or 'none'}"
            )
        yield line, [record[column] for column in columns]


def _add_example(examples: LabeledExamples, line: int, columns: list[str], values: list) -> None:
    """Check and append one row; `columns` and `values` are (text, label[, text pair])."""
    where = f"{examples.path} line {line}"
    examples.texts.append(_text(values[0], columns[0], where))
    examples.labels.append(label_name(values[1], columns[1], where))
    if examples.pairs is not None:
        examples.pairs.append(_text(values[2], columns[2], where))
    examples.lines.append(line)


def _text(value, column: str, where: str) -> str:
    if isinstance(value, list):
        raise BertforgeError(
            f"{where}: {column!r} holds a list, as tagged sentences' tokens do; to tag words, give "
            "--task ner (and the tags' field with --label-column)"
        )
    if not isinstance(value, str):
        raise BertforgeError(f"{where}: {column!r} must be text, got {json.dumps(value)}")
    if not value.strip():
        raise BertforgeError(f"{where}: the text in column {column!r} is empty; remove empty rows")
    return value


def label_name(value, column: str = "label", where: str = "") -> str:
    """A label as a name: strings stripped, whole numbers (and "007", 7.0, "7.0") in canonical decimal
    form, so that "1", 1.0 and "1.0" name one class; other finite numbers (a JSON 3.8) as Python
    writes them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if isinstance(value, str) and value.strip():
        value = value.strip()
        return str(int(value.partition(".")[0])) if _WHOLE_NUMBER.fullmatch(value) else value
    shown = json.dumps(value) if not isinstance(value, str) else "empty"
    raise BertforgeError(
        f"{where}: the label in column {column!r} is {shown}; give a class name, an integer class id "
        "or a number (a regression's score)"
    )


def label_names(data: LabeledExamples) -> list[str]:
    """The label mapping of a training set: names in id order (integers numerically, else alphabetically)."""
    names = set(data.labels)
    if len(names) < 2:
        raise BertforgeError(
            f"every example in {data.path} has the label {data.labels[0]!r}; "
            "a classifier needs examples of at least two classes"
        )
    numeric = all(_INTEGER.fullmatch(name) for name in names)
    ordered = sorted(names, key=int) if numeric else sorted(names)
    warn_rare_labels(data, ordered)
    return ordered


def rare_below(total: int, classes: int) -> float:
    """How few of `total` items a class (of `classes`) must have to be called rare: under 1%, and under a
    tenth of an even share, so that a task of hundreds of balanced classes has none."""
    return total * min(RARE_SHARE, 0.1 / classes)


def warn_rare_labels(data: LabeledExamples, names: list[str]) -> None:
    """Warn about classes with under 1% of the rows, listing every class found with its row count.

    A class must also be under a tenth of an even share, so that a task with hundreds of balanced
    classes (each under 1%) draws no warning.
    """
    counts = Counter(data.labels)
    limit = rare_below(len(data), len(names))
    rare = [name for name in names if counts[name] < limit]
    if not rare:
        return
    first_line = data.lines[data.labels.index(rare[0])]
    found = ", ".join(f"{name!r} ({counts[name]:,})" for name in names[:20])
    more = f" and {len(names) - 20} more" if len(names) > 20 else ""
    warnings.warn(
        f"{data.path}: {', '.join(map(repr, rare[:5]))} {'is' if len(rare) == 1 else 'are'} on under 1% of "
        f"the {len(data):,} rows (first on line {first_line}); every distinct label becomes a class, and "
        f"the classes found are (rows): {found}{more}; fix or remove the rows of a label that is a typo",
        stacklevel=2,
    )


def label_ids(data: LabeledExamples, names: list[str]) -> list[int]:
    """Each example's label id under `names`, refusing labels the mapping does not hold."""
    index = {name: i for i, name in enumerate(names)}
    unseen = sorted(set(data.labels) - set(index))
    if unseen:
        first_line = data.lines[data.labels.index(unseen[0])]
        raise BertforgeError(
            f"{data.path} has labels never seen in training: {', '.join(map(repr, unseen[:5]))} "
            f"(first on line {first_line}); the training labels are: {', '.join(map(repr, names))}"
        )
    return [index[label] for label in data.labels]


def task_type(data: LabeledExamples, requested: str = "auto") -> Literal["classification", "regression"]:
    """Whether the training file `data` is a classification or a regression: `requested`, or for
    "auto" a regression when every label is a number and some label is not a whole number ("3.800",
    0.5; `label_name` writes "1.0" as "1", a class id). Refuses, naming a row of each, labels that are
    neither: real numbers mixed with text."""
    if requested not in TASK_TYPES:
        raise BertforgeError(f"task type {requested!r} is not one of: {', '.join(TASK_TYPES)}")
    if requested == "regression":
        label_values(data)  # every label a number
        return "regression"
    numbers = [bool(_NUMBER.fullmatch(label)) for label in data.labels]
    real = [i for i, label in enumerate(data.labels) if numbers[i] and not _INTEGER.fullmatch(label)]
    if requested == "classification" or not real:
        return "classification"
    text = [i for i, number in enumerate(numbers) if not number]
    if text:
        first_real, first_text = real[0], text[0]
        raise BertforgeError(
            f"{data.path} mixes real-valued labels ({data.labels[first_real]!r} on line "
            f"{data.lines[first_real]}) with labels that are not numbers ({data.labels[first_text]!r} on "
            f"line {data.lines[first_text]}); a regression needs a number in every row, a classification "
            "class names or integer ids: fix those rows"
        )
    return "regression"


def in_both_orders(data: LabeledExamples) -> LabeledExamples:
    """Every pair, then the same pairs with their two texts swapped, with the same labels: for pairs
    that mean the same in either order (paraphrase, similarity)."""
    assert data.pairs is not None
    return replace(
        data,
        texts=data.texts + data.pairs,
        pairs=data.pairs + data.texts,
        labels=data.labels * 2,
        lines=data.lines * 2,
    )


def label_values(data: LabeledExamples) -> list[float]:
    """Each example's label as a number (a regression's target), refusing a label that is not one."""
    for label, line in zip(data.labels, data.lines, strict=True):
        if not _NUMBER.fullmatch(label):
            raise BertforgeError(
                f"{data.path} line {line}: the label {label!r} is not a number; a regression needs a "
                "real-valued label in every row (or use --task classification)"
            )
    return [float(label) for label in data.labels]


def check_regression_targets(data: LabeledExamples, values: list[float]) -> None:
    """Refuse a training set whose scores are all equal: there is nothing to regress on."""
    if min(values) == max(values):
        raise BertforgeError(
            f"every example in {data.path} has the score {data.labels[0]!r}; a regression needs "
            "examples with different scores"
        )
