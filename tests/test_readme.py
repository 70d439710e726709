"""The manual stays true: every command line in README.md and docs/ uses flags its command has, every
flag of every command is in the README, and every `section.key` the README names is a setting."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from pathlib import Path

import pytest

from bertforge.cli import build_parser
from bertforge.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


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


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_every_command_line_uses_flags_its_command_has(doc):
    known = commands()
    for line in command_lines(doc.read_text(encoding="utf-8")):
        name = re.search(r"bertforge (tokenizer train|[a-z-]+)", line).group(1)
        assert name in known, line
        words = line.split(f"bertforge {name}", 1)[1]
        unknown = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", words)) - flags(known[name])
        assert not unknown, f"{line}: {unknown}"


def test_the_readme_names_every_flag_of_every_command():
    missing = [f"{name} {flag}" for name, parser in commands().items() for flag in flags(parser)]
    assert [item for item in missing if item.split()[-1] not in README] == []


def test_every_setting_the_readme_names_exists():
    config = RunConfig()
    settings = {f"{s.name}.{key.name}" for s in fields(config) for key in fields(getattr(config, s.name))}
    file_names = (
        r"(?!json|safetensors|txt|tsv|bin|pt|png|npy|toml|tokens\b)"  # tokenizer.json, model.safetensors
    )
    named = set(re.findall(rf"`((?:model|tokenizer|data|train|runtime)\.{file_names}[a-z_0-9]+)", README))
    assert named - settings == set()
