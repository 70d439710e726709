"""Tagged data for token classification (named entities): CoNLL files and JSON lines.

Owns reading a file of sentences whose words carry one tag each, telling such a file from a
classification one (`is_tagged_file`), the tag set of a training file (`tag_names`: `O` first, then
each type's `B-` and `I-`) and the tag ids of a file under it (`tag_ids`), with one clear message
for every bad input: a missing or empty file, a token line with another number of columns than the
file's first one, a tag that is not `O`, `B-TYPE` or `I-TYPE`, a sentence whose tokens and tags
differ in number, and tags outside the tag set.

- CoNLL, as the shared tasks distribute it: one token a line, its columns separated by white space,
  the token in column 0 and the tag in the last (or the columns given by number, from 0), a blank
  line between sentences, `-DOCSTART-` lines skipped. CoNLL-2003's `EU NNP B-NP B-ORG` is read as
  the token `EU` tagged `B-ORG`.
- JSON lines: one sentence an object, `{"tokens": [...], "tags": [...]}` (or the fields given).

IOB1 and IOB2 are both read as they are; `bertforge.entities` reads entities from either.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bertforge.entities import OUTSIDE, PREFIXES, entity_spans, is_tag, split_tag
from bertforge.errors import BertforgeError
from bertforge.io import JSON_FAULTS
from bertforge.labeled import json_line, rare_below, read_text

TAGGING = "ner"  # the task type of a tagged file (`bertforge finetune --task ner`)
DOCSTART = "-DOCSTART-"
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
TAGGED_FILE = "tagged sentences: a token and its tag a line (CoNLL), or JSON lines"  # what such a file holds
CONLL_SUFFIXES = (".conll", ".conll03", ".iob", ".iob1", ".iob2", ".bio", ".ner")
JSON_FIELDS = ("tokens", "tags")  # the default token and tag fields of a JSON lines file
SNIFF_BYTES = 65536  # how much of a file `is_tagged_file` reads
SNIFF_LINES = 20
MOSTLY_TAGS = 0.8  # the share of sniffed rows ending in a tag that makes a file tagged


@dataclass
class TaggedExamples:
    """The sentences of one file, in file order; `lines[i]` is the line where sentence i starts
    (a CoNLL file's word j of it is on line `lines[i] + j`)."""

    path: Path
    sentences: list[list[str]]
    tags: list[list[str]]
    lines: list[int]
    conll: bool

    def __len__(self) -> int:
        return len(self.sentences)

    def where(self, sentence: int, word: int) -> str:
        line = self.lines[sentence] + (word if self.conll else 0)
        return f"{self.path} line {line}"


def read_tagged(
    path: str | Path, token_column: str | None = None, tag_column: str | None = None
) -> TaggedExamples:
    """Every sentence of a CoNLL or JSON lines file, refusing bad input with a clear message.

    Columns default to the token in column 0 and the tag in the last column (a CoNLL file), or the
    fields "tokens" and "tags" (JSON lines)."""
    path = Path(path)
    text = read_text(path, TAGGED_FILE)
    if is_json_lines(path, text):
        data = _read_json_lines(path, text, token_column or JSON_FIELDS[0], tag_column or JSON_FIELDS[1])
    else:
        data = _read_conll(path, text, _column(token_column, 0), _column(tag_column, -1))
    if not data.sentences:
        raise BertforgeError(f"{path} holds no sentences (only {DOCSTART} lines); give a tagged file")
    for number, tags in enumerate(data.tags):
        for word, tag in enumerate(tags):
            if not is_tag(tag):
                raise BertforgeError(
                    f"{data.where(number, word)}: the tag {tag!r} is not O, B-TYPE or I-TYPE (IOB1 or IOB2); "
                    "name the tag column with --label-column if this is another column"
                )
    return data


def is_json_lines(path: Path, text: str) -> bool:
    return path.suffix.lower() in JSON_SUFFIXES or text.lstrip().startswith("{")


def _column(value: str | None, default: int) -> int:
    if value is None:
        return default
    try:
        return int(value.strip())
    except ValueError:
        raise BertforgeError(
            f"a CoNLL file's columns are given by number, counting from 0 (-1: the last), got {value!r}"
        ) from None


def _read_conll(path: Path, text: str, token_column: int, tag_column: int) -> TaggedExamples:
    data = TaggedExamples(path, [], [], [], conll=True)
    width = first = None  # the columns of the file's first token line, and that line
    words: list[str] = []
    tags: list[str] = []
    for number, line in enumerate(text.split("\n") + [""], start=1):
        fields = line.split()
        if fields and fields[0] == DOCSTART:
            fields = []
        if not fields:
            if words:
                data.sentences.append(words)
                data.tags.append(tags)
                data.lines.append(number - len(words))
                words, tags = [], []
            continue
        if width is None:
            width, first = len(fields), number
            _check_columns(path, number, width, token_column, tag_column)
        if len(fields) != width:
            raise BertforgeError(
                f"{path} line {number} has {len(fields)} columns, but line {first} (the first token line) "
                f"has {width}; every token line needs the same columns (TOKEN ... TAG, separated by "
                "spaces or tabs), and a blank line between sentences"
            )
        words.append(fields[token_column])
        tags.append(fields[tag_column])
    return data


def _check_columns(path: Path, line: int, width: int, token_column: int, tag_column: int) -> None:
    if width < 2:
        raise BertforgeError(
            f"{path} line {line} has one column; a CoNLL file has the token and its tag on each line "
            "(TOKEN ... TAG)"
        )
    for name, column in (("token", token_column), ("tag", tag_column)):
        if not -width <= column < width:
            raise BertforgeError(
                f"{path} has {width} columns (0 to {width - 1}); there is no {name} column {column}"
            )


def _read_json_lines(path: Path, text: str, token_field: str, tag_field: str) -> TaggedExamples:
    data = TaggedExamples(path, [], [], [], conll=False)
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        record = json_line(path, number, raw)
        if not isinstance(record, dict) or token_field not in record or tag_field not in record:
            shown = ", ".join(record) if isinstance(record, dict) else "none: not an object"
            raise BertforgeError(
                f"{path} line {number} needs the fields {token_field!r} and {tag_field!r} (lists of the "
                f"sentence's tokens and tags); its fields are: {shown}"
            )
        words, tags = record[token_field], record[tag_field]
        if problem := _sentence_problem(words, tags, token_field, tag_field):
            raise BertforgeError(f"{path} line {number}: {problem}")
        data.sentences.append(words)
        data.tags.append(tags)
        data.lines.append(number)
    return data


def _sentence_problem(words, tags, token_field: str, tag_field: str) -> str | None:
    """What is wrong with one JSON line's tokens and tags, or None."""
    for field, values in ((token_field, words), (tag_field, tags)):
        if isinstance(values, list) and any(isinstance(v, int) for v in values) and field == tag_field:
            return (
                f"{field!r} holds numbers (tag ids); give the tags by name, such as B-PER and O, which "
                "name the tagger's labels"
            )
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return f"{field!r} must be a list of strings"
        if not values:
            return f"{field!r} is empty; remove the line, or give the sentence's {field}"
        if blank := next((i for i, v in enumerate(values, 1) if not v.strip()), None):
            return f"{field!r} item {blank} is empty; give every token its text and its tag"
    if len(words) != len(tags):
        return (
            f"{token_field!r} has {len(words)} items and {tag_field!r} {len(tags)}; give one tag, "
            "such as B-PER, per token"
        )
    return None


def is_tagged_file(path: str | Path, token_field: str | None = None, tag_field: str | None = None) -> bool:
    """Whether `path` looks like a tagged file: a CoNLL suffix; JSON lines whose first object has
    lists in its token and tag fields (`tokens` and `tags` unless named); or text starting with
    `-DOCSTART-` or with lines whose last column is a tag (`O`, `B-PER`)."""
    path = Path(path)
    if path.suffix.lower() in CONLL_SUFFIXES:
        return True
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as file:
            head = file.read(SNIFF_BYTES)
    except OSError:
        return False  # the reader of the file names the problem
    whole = head.split("\n")[:-1] if len(head) == SNIFF_BYTES else head.split("\n")  # a cut last line out
    lines = [line for line in whole if line.strip()][:SNIFF_LINES]
    if not lines:
        return False
    if is_json_lines(path, head):
        try:
            record = json.loads(lines[0])
        except JSON_FAULTS:  # its reader names the fault
            return False
        fields = (token_field or JSON_FIELDS[0], tag_field or JSON_FIELDS[1])
        return isinstance(record, dict) and all(isinstance(record.get(f), list) for f in fields)
    return looks_tagged(lines)


def looks_tagged(lines: list[str]) -> bool:
    """Whether the first non-blank lines of a text file are CoNLL's: `-DOCSTART-` first, or mostly rows
    whose last column is a tag."""
    if not lines:
        return False
    if lines[0].split()[0] == DOCSTART:
        return True
    rows = [line.split() for line in lines if line.split()[0] != DOCSTART]
    tagged = [row for row in rows if len(row) >= 2]  # a shorter row (a lost tag): the reader names it
    tags = sum(is_tag(row[-1]) for row in tagged)  # a typo among them: the reader names its line
    return 2 * len(tagged) > len(rows) and tags >= MOSTLY_TAGS * len(tagged)


def tag_names(data: TaggedExamples) -> list[str]:
    """The tag set of a training file: `O` first, then by type, each type's `B-` before its `I-`.
    A type has both (a small file may hold only one of them, IOB1's B- is rare), so that the
    validation file's may be either."""
    found = {tag for tags in data.tags for tag in tags}
    if len(found) < 2:
        raise BertforgeError(
            f"every word in {data.path} is tagged {next(iter(found))!r}; a tagger needs words of at "
            "least two tags"
        )
    kinds = {split_tag(tag)[1] for tag in found - {OUTSIDE}}
    warn_rare_types(data, sorted(kinds))
    both = {f"{prefix}-{kind}" for kind in kinds for prefix in PREFIXES}
    ordered = sorted(both, key=lambda tag: split_tag(tag)[::-1])
    return ([OUTSIDE] if OUTSIDE in found else []) + ordered


def warn_rare_types(data: TaggedExamples, kinds: list[str]) -> None:
    """Warn about entity types with under 1% of the entities (and a tenth of an even share), as
    `labeled.warn_rare_labels` does for classes: a typo'd tag ("B-PRS") becomes a type of its own."""
    counts = Counter(kind for tags in data.tags for kind, _, _ in entity_spans(tags))
    limit = rare_below(sum(counts.values()), len(kinds))
    rare = [kind for kind in kinds if counts[kind] < limit]
    if not rare:
        return
    first = next(
        data.where(i, start)
        for i, tags in enumerate(data.tags)
        for kind, start, _ in entity_spans(tags)
        if kind == rare[0]
    )
    found = ", ".join(f"{kind!r} ({counts[kind]:,})" for kind in kinds[:20])
    named = ", ".join(map(repr, rare[:5]))
    warnings.warn(
        f"the entity type{'s' * (len(rare) > 1)} {named} {'is' if len(rare) == 1 else 'are'} under 1% of the "
        f"{sum(counts.values()):,} entities (first at {first}); every distinct type is learnt, and the types "
        f"found are (entities): {found}; fix or remove the tags of a type that is a typo",
        stacklevel=2,
    )


def tag_ids(data: TaggedExamples, names: list[str]) -> list[list[int]]:
    """Each sentence's tag ids under `names`, refusing a tag the set does not hold (naming its line)."""
    index = {name: i for i, name in enumerate(names)}
    for number, tags in enumerate(data.tags):
        for word, tag in enumerate(tags):
            if tag not in index:
                raise BertforgeError(
                    f"{data.where(number, word)}: the tag {tag!r} is not in the training file; its "
                    f"tags are: {', '.join(names)}"
                )
    return [[index[tag] for tag in tags] for tags in data.tags]
