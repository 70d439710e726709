"""The product speaks of itself as it is now: its pages, configs and code name no development round,
no issue number and (in the README) no commit, and each config's comments stay short."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))
PRODUCT = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *CONFIGS,
    *sorted((ROOT / "benchmarks").glob("*.md")),
    *sorted((ROOT / "src").rglob("*.py")),
]
ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth"
    r"|fourteenth|fifteenth|sixteenth|\d+(?:st|nd|rd|th)|last|previous"
)
HISTORY = [
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"\bsessions?\b",
        r"\bissues? #?\d+",
        rf"\b(?:{ORDINALS}) (?:session|round|version)\b",
        r"\bthe first version\b",
        r"\blast time\b",
        r"\bsince then\b",
        r"made for issue",
        r"\b(?:older|earlier) (?:versions?|layout|trainer|probe)\b",
        r"\bolder (?:runs?|checkpoints?|files)\b",
        r"\bonce wrote\b",
        r"\bpredates?\b",
    )
]
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
URL = re.compile(r"https?://\S+")
HEAD_COMMENT_LINES = 5
KEY_COMMENT_LINES = 1


def where(path: Path, number: int, line: str) -> str:
    return f"{path.relative_to(ROOT)}:{number}: {line.strip()}"


def test_no_product_file_tells_how_it_was_developed():
    hits = [
        where(path, number, line)
        for path in PRODUCT
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(pattern.search(line) for pattern in HISTORY)
    ]
    assert not hits, f"{len(hits)} lines speak of development rounds or issues:\n" + "\n".join(hits)


def test_the_readme_names_no_commit():
    readme = ROOT / "README.md"
    hits = [
        where(readme, number, line) + f"  ({', '.join(COMMIT.findall(URL.sub(' ', line)))})"
        for number, line in enumerate(readme.read_text(encoding="utf-8").splitlines(), 1)
        if COMMIT.search(URL.sub(" ", line))
    ]
    assert not hits, "README.md names commits:\n" + "\n".join(hits)


def trailing_comment(line: str) -> bool:
    """Whether a TOML key line ends in a comment (a `#` outside its strings)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            if char == quote and not (quote == '"' and line[index - 1] == "\\"):
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "#":
            return True
    return False


def comment_problems(path: Path) -> list[str]:
    """The head's comment lines over 5; each key or table with more than one comment line."""
    name, problems, block, head = path.relative_to(ROOT), [], [], True
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip()
        if text.startswith("#"):
            block.append(number)
            continue
        if not text:
            continue
        count = len(block) + trailing_comment(text)
        if head and len(block) > HEAD_COMMENT_LINES:
            problems.append(f"{name}:{block[0]}: {len(block)} comment lines before the first key (at most 5)")
        elif not head and count > KEY_COMMENT_LINES:
            key = text.split("=")[0].strip()
            problems.append(f"{name}:{number}: {key} has {count} comment lines (at most 1)")
        block, head = [], False
    if block:
        problems.append(f"{name}:{block[0]}: comment lines after the last key")
    return problems


def test_config_comments_stay_short():
    problems = [problem for path in CONFIGS for problem in comment_problems(path)]
    assert not problems, "configs with long comments:\n" + "\n".join(problems)
