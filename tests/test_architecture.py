"""docs/ARCHITECTURE.md stays true: it names every module of src/bertforge once, and every import
goes to the importer's own layer or a lower one, with no exception (lazy imports inside functions
included), and without cycles inside a layer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "bertforge"
PAGE = ROOT / "docs" / "ARCHITECTURE.md"


def drawn_layers() -> dict[str, int]:
    """Module name (`commands.*` for the command modules) -> its layer number, from the drawing."""
    drawing = PAGE.read_text(encoding="utf-8").split("```")[1]
    layers: dict[str, int] = {}
    layer = None
    for line in drawing.splitlines():
        if heading := re.match(r"\s*(\d+) \w", line):
            layer = int(heading.group(1))
        elif entry := re.match(r"   (\S+)\s{2,}\S", line):
            assert layer is not None and entry.group(1) not in layers, line
            layers[entry.group(1)] = layer
    return layers


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[0] == "commands":
        return "commands.*"
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    """The bertforge modules `path` imports, at its top or inside functions."""
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "bertforge":
            found |= {alias.name if alias.name in modules else "__init__" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bertforge."):
            found.add(node.module.removeprefix("bertforge."))
        elif isinstance(node, ast.Import):
            found |= {
                a.name.removeprefix("bertforge.") for a in node.names if a.name.startswith("bertforge.")
            }
            found |= {"__init__" for a in node.names if a.name == "bertforge"}  # its attributes: unseen
    return {"commands.*" if name.startswith("commands") else name for name in found}


def test_every_import_is_one_the_layer_check_reads():
    """No relative imports and no imports by name at run time, which `imported_modules` would miss."""
    hidden = sorted(
        f"{module_name(path)}: line {node.lineno}"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if (isinstance(node, ast.ImportFrom) and node.level)
        or (isinstance(node, ast.Import) and any(a.name == "importlib" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("importlib"))
        or (isinstance(node, ast.Name) and node.id == "__import__")
    )
    assert not hidden, "imports the layer check cannot follow: " + ", ".join(hidden)


def test_the_drawing_names_every_module_once():
    assert set(drawn_layers()) == {module_name(path) for path in PACKAGE.rglob("*.py")}


def test_imports_go_down_the_layers():
    layers = drawn_layers()
    upward = sorted(
        f"{module_name(path)} -> {target}"
        for path in PACKAGE.rglob("*.py")
        for target in imported_modules(path)
        if layers[target] > layers[module_name(path)]
    )
    assert not upward, "imports up the layers of docs/ARCHITECTURE.md: " + ", ".join(upward)


def test_no_imports_go_round_in_a_layer():
    layers = drawn_layers()
    graph = {module_name(p): imported_modules(p) - {module_name(p)} for p in PACKAGE.rglob("*.py")}

    def comes_back(start: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for target in graph[todo.pop()]:
                if target == start:
                    return True
                if target not in seen and layers[target] == layers[start]:
                    seen.add(target)
                    todo.append(target)
        return False

    assert not sorted(name for name in graph if comes_back(name))
