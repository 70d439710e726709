"""GLUE's task files as distributed: finding each task's folder and reading its TSV files.

Owns the nine tasks' file layouts (GLUE's download script, and the `datasets`-style TSVs with
integer labels), finding a task's folder among the folders given (names in any case, with or
without the dash: `SST-2/`, `sst2/`, `STS-B/`, `stsb/`), and reading each file into
`bertforge.labeled.LabeledExamples` with one clear message, naming file and line, for a damaged
row: a field count unlike the header's, a label outside the task's set, a score that is not a
number from 0 to 5, an empty text. QQP's files, distributed with rows whose fields are missing, lose
those rows (and rows with an empty question) with one line; Hugging Face's readers drop the former.

A split whose header has no label column (GLUE's own test.tsv files) is read as None: there is
nothing to score. STS-B's scores are kept as written (`"3.800"`); every other label is a class name
(`datasets`' integer labels mapped to GLUE's names, e.g. RTE's 0 to "entailment").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bertforge.errors import BertforgeError
from bertforge.labeled import LabeledExamples, read_text

TaskKind = Literal["classification", "regression"]
SCORE_RANGE = (0.0, 5.0)  # STS-B's similarity scores


@dataclass(frozen=True)
class Layout:
    """Where a file's text, second text and label are: header names, or field numbers (from 0) for a
    file without a header row, whose rows then have exactly `fields` fields."""

    text: str | int
    pair: str | int | None
    label: str | int
    fields: int | None = None

    @property
    def has_header(self) -> bool:
        return isinstance(self.text, str)


@dataclass(frozen=True)
class TaskSpec:
    """One GLUE task: its name, files, layouts and label set."""

    name: str
    kind: TaskKind
    layouts: tuple[Layout, ...]
    labels: tuple[str, ...] = ()  # class names; empty for regression
    integer_labels: tuple[str, ...] = ()  # `datasets`' integer label i is labels_by_id[i]
    dev: tuple[str, ...] = ("dev",)  # file stems; the first is the one fine-tuning validates on
    test: tuple[str, ...] = ("test",)
    symmetric: bool = False  # a pair means the same in either order (paraphrase, similarity)
    damaged_rows: bool = False  # QQP as distributed has rows with missing fields: left out

    @property
    def key(self) -> str:
        return folder_key(self.name)


def _pairs(*names: tuple[str, str], label: str = "label") -> tuple[Layout, ...]:
    return tuple(Layout(first, second, label) for first, second in names)


NLI = ("entailment", "not_entailment")
BINARY = ("0", "1")
TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            "CoLA",
            "classification",
            (Layout(3, None, 1, fields=4), Layout("sentence", None, "label")),
            BINARY,
        ),
        TaskSpec("SST-2", "classification", (Layout("sentence", None, "label"),), BINARY),
        TaskSpec(
            "MRPC",
            "classification",
            _pairs(("#1 String", "#2 String"), label="Quality") + _pairs(("sentence1", "sentence2")),
            BINARY,
            symmetric=True,
        ),
        TaskSpec(
            "STS-B",
            "regression",
            _pairs(("sentence1", "sentence2"), label="score") + _pairs(("sentence1", "sentence2")),
            symmetric=True,
        ),
        TaskSpec(
            "QQP",
            "classification",
            _pairs(("question1", "question2"), label="is_duplicate") + _pairs(("question1", "question2")),
            BINARY,
            symmetric=True,
            damaged_rows=True,
        ),
        TaskSpec(
            "MNLI",
            "classification",
            _pairs(("sentence1", "sentence2"), label="gold_label") + _pairs(("premise", "hypothesis")),
            ("contradiction", "entailment", "neutral"),
            integer_labels=("entailment", "neutral", "contradiction"),
            dev=("dev_matched", "dev_mismatched"),
            test=("test_matched", "test_mismatched"),
        ),
        TaskSpec(
            "QNLI", "classification", _pairs(("question", "sentence"), ("sentence1", "sentence2")), NLI, NLI
        ),
        TaskSpec("RTE", "classification", _pairs(("sentence1", "sentence2")), NLI, NLI),
        TaskSpec("WNLI", "classification", _pairs(("sentence1", "sentence2")), BINARY),
    )
}


def folder_key(name: str) -> str:
    """A task or folder name compared without case, dashes or underscores: "STS-B" -> "stsb"."""
    return name.lower().replace("-", "").replace("_", "")


def task_spec(name: str) -> TaskSpec:
    for spec in TASKS.values():
        if spec.key == folder_key(name):
            return spec
    raise BertforgeError(f"{name!r} is not a GLUE task; choose from: {', '.join(TASKS)}")


@dataclass
class TaskData:
    """A task's files, read and checked: the training set, its dev sets (the first validates the
    fine-tuning) and its labelled test sets, each by file stem."""

    spec: TaskSpec
    folder: Path
    train: LabeledExamples
    dev: dict[str, LabeledExamples]
    test: dict[str, LabeledExamples] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # e.g. a test.tsv without labels


def find_tasks(data: list[Path], names: list[str]) -> tuple[dict[str, Path], list[str]]:
    """The folder of each task of `names` found in `data` (each a folder of task folders, a parent of
    such folders, or a task folder itself), and one line per task not found."""
    found: dict[str, Path] = {}
    for root in data:
        root = Path(root)
        if not root.is_dir():
            raise BertforgeError(f"--data {root} is not a folder; give the folder that holds the GLUE tasks")
        for folder in candidate_folders(root):
            spec = next((s for s in TASKS.values() if s.key == folder_key(folder.name)), None)
            if spec is None or spec.name not in names or task_file(folder, "train") is None:
                continue
            if spec.name in found and found[spec.name].resolve() != folder.resolve():
                raise BertforgeError(
                    f"{spec.name} is in two folders, {found[spec.name]} and {folder}; give --data for one"
                )
            found[spec.name] = folder
    where = ", ".join(str(root) for root in data)
    skipped = [
        f"{name}: skipped, no {name}/ folder with a train.tsv in {where}"
        for name in names
        if name not in found
    ]
    return {name: found[name] for name in names if name in found}, skipped


def task_file(folder: Path, stem: str) -> Path | None:
    """The file `stem`.tsv of a task folder, its name in any case (TRAIN.TSV, Dev.tsv); None if absent."""
    exact = folder / f"{stem}.tsv"
    if exact.is_file():
        return exact
    wanted = exact.name.lower()
    return next((p for p in sorted(folder.iterdir()) if p.name.lower() == wanted and p.is_file()), None)


def candidate_folders(root: Path) -> list[Path]:
    """`root`, its subfolders and theirs (GLUE's layout, or one folder above it)."""
    children = sorted(p for p in root.iterdir() if p.is_dir())
    return [root, *children, *(p for child in children for p in sorted(child.iterdir()) if p.is_dir())]


def read_task(spec: TaskSpec, folder: Path) -> TaskData:
    """Read a task's train, dev and (labelled) test files from its folder."""
    folder = Path(folder)
    skipped: dict[str, list[int]] = {}
    train_path = task_file(folder, "train")
    train = read_split(spec, train_path, skipped=skipped)
    if train is None:
        raise BertforgeError(f"{train_path} has no label column; {layout_hint(spec)}")
    dev, test, notes = {}, {}, []
    for stem in spec.dev:
        path = task_file(folder, stem)
        if path is None:
            if stem == spec.dev[0]:
                raise BertforgeError(
                    f"{folder} has no {stem}.tsv; GLUE's task folders hold train.tsv and {stem}.tsv: "
                    "add it, or leave the task out of --tasks"
                )
            notes.append(f"{spec.name}: no {stem}.tsv, not scored")
            continue
        examples = read_split(spec, path, skipped=skipped)
        if examples is None:
            raise BertforgeError(f"{path} has no label column; {layout_hint(spec)}")
        dev[stem] = examples
    for stem in spec.test:
        path = task_file(folder, stem)
        if path is not None:
            examples = read_split(spec, path, test=True, skipped=skipped)
            if examples is None:
                notes.append(f"{spec.name}: {path.name} has no labels, not scored")
            else:
                test[stem] = examples
    notes += [skipped_note(spec, name, lines) for name, lines in skipped.items()]
    return TaskData(spec, folder, train, dev, test, notes)


def refuse_untrainable(data: TaskData, kept_labels: list[str], subset: str) -> None:
    """Refuse, before any run starts, training labels a task cannot learn from (one class, or one
    score) and a dev label that no training example has. `subset`: how the training examples were
    chosen, for the message ("" for the whole file)."""
    train = f"{data.train.path}{subset}"
    fix = "fix the files, or leave the task out of --tasks"
    if data.spec.kind == "regression":
        if len(set(map(float, kept_labels))) < 2:
            raise BertforgeError(f"{train}: every score is {kept_labels[0]}; nothing to regress on; {fix}")
        return
    classes = sorted(set(kept_labels))
    if len(classes) < 2:
        raise BertforgeError(f"{train}: every label is {classes[0]!r}; a classifier needs two classes; {fix}")
    dev = data.dev[data.spec.dev[0]]
    unseen = next((i for i, label in enumerate(dev.labels) if label not in classes), None)
    if unseen is not None:
        raise BertforgeError(
            f"{dev.path} line {dev.lines[unseen]}: the label {dev.labels[unseen]!r} is in no training "
            f"example ({train} has {', '.join(map(repr, classes))}); {fix}"
        )


def skipped_note(spec: TaskSpec, name: str, lines: list[int]) -> str:
    shown = ", ".join(str(line) for line in lines[:5]) + (", ..." if len(lines) > 5 else "")
    return (
        f"{spec.name}: {name}: {len(lines)} damaged row{'s' if len(lines) > 1 else ''} left out (line "
        f"{shown}): missing fields or an empty question"
    )


def read_split(
    spec: TaskSpec, path: Path, test: bool = False, skipped: dict[str, list[int]] | None = None
) -> LabeledExamples | None:
    """One file of `spec`'s task; None when its header has the texts but no label column, or, for a
    `test` file, when every label is -1 (how `datasets` writes a test split whose labels are withheld).
    A task with `damaged_rows` leaves out rows with missing fields or an empty text, their line numbers
    put in `skipped` under the file's name; any other task's damaged row is refused."""
    skipped = {} if skipped is None else skipped
    rows = [line.split("\t") for line in read_text(Path(path)).split("\n")]
    layout, start = choose_layout(spec, path, rows[0])
    if layout is None:
        return None
    header = rows[0] if layout.has_header else None
    width = len(header) if header else layout.fields
    text, pair, label = (position(header, column) for column in (layout.text, layout.pair, layout.label))
    if test and labels_withheld([row[label] for row in rows[start:] if len(row) == width]):
        return None
    examples = LabeledExamples(Path(path), [], [] if pair is not None else None, [], [])
    for number in range(start, len(rows)):
        row, where = rows[number], f"{path} line {number + 1}"
        fault = row_fault(row, width, text, pair, "header" if header else "task")
        if fault and spec.damaged_rows:
            skipped.setdefault(Path(path).name, []).append(number + 1)
            continue
        if fault:
            raise BertforgeError(f"{where}{fault}")
        examples.texts.append(row[text])
        if pair is not None:
            examples.pairs.append(row[pair])
        examples.labels.append(checked_label(spec, row[label], where))
        examples.lines.append(number + 1)
    if not examples.texts:
        raise BertforgeError(f"{path} holds a header but no examples; add the examples below it")
    return examples


def row_fault(row: list[str], width: int, text: int, pair: int | None, shaped_by: str) -> str | None:
    """What is wrong with a row, to follow its file and line in a message: other than `width` fields
    (the count its header or task, `shaped_by`, has), or an empty text; None for a whole row."""
    if row == [""]:
        return " is empty; GLUE's files have no blank lines"
    if len(row) != width:
        return f" has {len(row)} tab-separated fields, not {width} (as the {shaped_by} has)"
    if not row[text].strip() or (pair is not None and not row[pair].strip()):
        return ": a text is empty; GLUE's files have a text in every row"
    return None


def labels_withheld(labels: list[str]) -> bool:
    """Whether every label is -1 (or -1.0)."""
    try:
        return bool(labels) and all(float(label) == -1 for label in labels)
    except ValueError:
        return False


def choose_layout(spec: TaskSpec, path: Path, first: list[str]) -> tuple[Layout | None, int]:
    """The layout the first row matches and the row where examples start; (None, 1) for a header
    with the texts but no label (an unlabelled test file)."""
    names = [name.strip() for name in first]
    for layout in spec.layouts:
        if layout.has_header and all(c in names for c in (layout.text, layout.pair, layout.label) if c):
            return layout, 1
    for layout in spec.layouts:
        if not layout.has_header and len(first) == layout.fields:
            return layout, 0  # its label is checked as every row's is, with the line's number
    if any(layout.has_header and texts_named(layout, names) for layout in spec.layouts):
        return None, 1
    raise BertforgeError(
        f"{path} line 1 is not a {spec.name} header ({', '.join(names)}); {layout_hint(spec)}"
    )


def texts_named(layout: Layout, names: list[str]) -> bool:
    return layout.text in names and (layout.pair is None or layout.pair in names)


def layout_hint(spec: TaskSpec) -> str:
    """The column layouts `spec`'s files may have, for a message."""
    shown = []
    for layout in spec.layouts:
        if layout.has_header:
            shown.append(" + ".join(c for c in (layout.text, layout.pair, layout.label) if c))
        else:
            shown.append(f"no header, {layout.fields} fields, text in field {layout.text + 1}")
    return f"{spec.name} files have the columns {' or '.join(shown)}"


def position(header: list[str] | None, column: str | int | None) -> int | None:
    if column is None or isinstance(column, int):
        return column
    return [name.strip() for name in header].index(column)


def checked_label(spec: TaskSpec, value: str, where: str) -> str:
    """A class name of the task, or a score from 0 to 5 for regression."""
    value = value.strip()
    if spec.kind == "regression":
        try:
            score = float(value)
        except ValueError:
            score = None
        if score is None or not SCORE_RANGE[0] <= score <= SCORE_RANGE[1]:
            raise BertforgeError(f"{where}: the score {value!r} is not a number from 0 to 5")
        return value
    if value in spec.labels:
        return value
    if spec.integer_labels and value.isdigit() and int(value) < len(spec.integer_labels):
        return spec.integer_labels[int(value)]
    allowed = list(spec.labels) + [str(i) for i in range(len(spec.integer_labels))]
    raise BertforgeError(f"{where}: the label {value!r} is not one of {spec.name}'s: {', '.join(allowed)}")
