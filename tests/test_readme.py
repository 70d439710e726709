"""The manual stays true: every command line in README.md and docs/ uses flags its command has, the
README shows every command at work and stays at most 300 lines, every `section.key` it or
docs/configuration.md names is a setting, and docs/configuration.md lists every setting with its
default."""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from bertforge.cli import build_parser
from bertforge.config import RunConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]
MAX_README_LINES = 300


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def commands() -> dict[str, argparse.ArgumentParser]:
    """Each command by the words that name it (`tokenizer train`), with its parser."""
    found = subcommands(build_parser())
    for action, parser in subcommands(found.pop("tokenizer")).items():
        found[f"tokenizer {action}"] = parser
    return found


def flags(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings} - {"-h", "--help"}


def command_lines(text: str) -> list[str]:
    """The `bertforge ...` lines of the bash blocks, continuation lines joined, comments dropped."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            code = line.split(" #")[0]
            if re.search(r"(^|-m |\s)bertforge [a-z]", code):
                lines.append(code)
    return lines


def command_name(line: str) -> str:
    return re.search(r"bertforge (tokenizer train|[a-z-]+)", line).group(1)


def settings() -> dict[str, object]:
    """Every `section.key` with its default, from the dataclasses of bertforge.config."""
    config = RunConfig()
    found = {}
    for section in fields(config):
        for key in fields(getattr(config, section.name)):
            default = key.default if key.default is not MISSING else key.default_factory()
            found[f"{section.name}.{key.name}"] = default
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_command_line_uses_flags_its_command_has(doc):
    known = commands()
    wrong = []
    for line in command_lines(doc.read_text(encoding="utf-8")):
        name = command_name(line)
        if name not in known:
            wrong.append(f"{line.strip()}: no command {name!r}")
            continue
        words = line.split(f"bertforge {name}", 1)[1]
        unknown = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", words)) - flags(known[name])
        if unknown:
            wrong.append(f"{line.strip()}: {name} has no {', '.join(sorted(unknown))}")
    assert not wrong, "command lines with flags their command lacks:\n" + "\n".join(wrong)


def test_the_readme_shows_every_command_with_an_example():
    shown = {command_name(line) for line in command_lines(README.read_text(encoding="utf-8"))}
    missing = sorted(set(commands()) - shown)
    assert not missing, f"README.md has no ```bash example of: {', '.join(missing)}"


def test_the_readme_has_at_most_300_lines():
    count = len(README.read_text(encoding="utf-8").splitlines())
    assert count <= MAX_README_LINES, f"README.md has {count} lines, {count - MAX_README_LINES} too many"


@pytest.mark.parametrize("doc", [README, CONFIGURATION], ids=lambda path: path.name)
def test_every_setting_a_page_names_exists(doc):
    file_names = (
        r"(?!json|safetensors|txt|tsv|bin|pt|png|npy|toml|tokens\b)"  # tokenizer.json, model.safetensors
    )
    pattern = rf"`((?:model|tokenizer|data|train|runtime)\.{file_names}[a-z_0-9]+)"
    named = set(re.findall(pattern, doc.read_text(encoding="utf-8")))
    unknown = sorted(named - set(settings()))
    assert not unknown, f"{doc.name} names settings that do not exist: {', '.join(unknown)}"


def test_the_configuration_page_lists_every_setting_with_its_default():
    rows = re.findall(r"^\| `([a-z_]+\.[a-z_0-9]+)` \| `([^`]*)` \|", CONFIGURATION.read_text("utf-8"), re.M)
    listed = dict(rows)
    expected = settings()
    problems = [f"{name}: missing" for name in expected if name not in listed]
    problems += [f"{name}: not a setting" for name in listed if name not in expected]
    problems += [f"{name}: listed twice" for name in listed if sum(row[0] == name for row in rows) > 1]
    for name, text in listed.items():
        if name in expected:
            shown = tomllib.loads(f"v = {text}")["v"]
            if shown != expected[name] or type(shown) is not type(expected[name]):
                problems.append(f"{name}: default shown as {text}, is {expected[name]!r}")
    assert not problems, "docs/configuration.md disagrees with bertforge.config:\n" + "\n".join(problems)
