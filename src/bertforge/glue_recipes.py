"""The recipes of `bertforge glue`: how each GLUE task is fine-tuned, and the `--sweep` grid.

Owns the built-in recipes (configs/glue.toml writes out the same, for a user to copy and edit),
reading a recipes file of that form ([default], one table per task for what differs, [sweep]) and
one clear message for an unknown table, an unknown setting or a value out of range. A file changes
what it sets and keeps the rest built in: its [default] reaches every task, its task tables their
task, so `[SST-2] learning_rate = 1e-4` alone keeps SST-2's batch size, epochs and length.
`both_orders` (each training pair also with its sentences swapped) holds for the tasks whose pairs
mean the same either way; [default]'s applies to those alone.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from bertforge.config import load_toml
from bertforge.config_rules import FRACTION, RANGES, count
from bertforge.errors import BertforgeError
from bertforge.glue_data import TASKS, task_spec
from bertforge.progress import plural

# The built-in recipes: configs/glue.toml holds the same, for a user to copy and edit (`--recipes`).
DEFAULT_RECIPES: dict[str, dict] = {
    "default": {
        "learning_rate": 1e-4,
        "epochs": 4,
        "batch_size": 16,
        "max_length": 128,
        "warmup": 0.1,
        "dropout": 0.0,
        "max_train_examples": 0,
        "both_orders": False,
        "layer_decay": 1.0,
    },
    "CoLA": {"max_length": 64},
    "MRPC": {"epochs": 2},
    "STS-B": {"learning_rate": 2e-4, "epochs": 2, "both_orders": True},
    "SST-2": {"learning_rate": 3e-4, "epochs": 2, "batch_size": 128, "max_length": 64},
    "QQP": {"epochs": 2, "batch_size": 32, "max_train_examples": 50000},
    "MNLI": {"epochs": 2, "batch_size": 32, "max_train_examples": 50000},
    "QNLI": {"epochs": 2, "batch_size": 32, "max_train_examples": 50000},
    "RTE": {"epochs": 2},
    "sweep": {"learning_rate": [3e-4, 1e-4, 5e-5], "batch_size": [16, 32]},
}


@dataclass(frozen=True)
class Recipe:
    """How one task is fine-tuned (a table of configs/glue.toml)."""

    learning_rate: float
    epochs: int
    batch_size: int
    max_length: int
    warmup: float  # the share of the steps spent warming up
    dropout: float
    max_train_examples: int  # 0: every training example
    both_orders: bool = False  # each training pair in both orders (tasks whose pairs read either way)
    layer_decay: float = 1.0  # each layer's rate this times the one above it (`train.layer_decay`)


def load_recipes(path: str | Path | None) -> tuple[dict[str, Recipe], dict[str, list]]:
    """Each task's recipe and the sweep's grid, from `path` (None: the built-in recipes)."""
    if path is None:
        return read_recipes({}, "the built-in recipes")
    return read_recipes(load_toml(path), str(path))


def read_recipes(table: dict, origin: str) -> tuple[dict[str, Recipe], dict[str, list]]:
    """Each task's recipe and the sweep's grid, from a TOML table in configs/glue.toml's form laid
    over the built-in recipes: per task, the built-in [default] and task table, then `table`'s
    [default], then its task table. `origin` names the table in messages."""
    unknown = [name for name in table if name not in ("default", "sweep") and not is_task(name)]
    if unknown:
        raise BertforgeError(
            f"{origin}: [{unknown[0]}] is not a GLUE task; the tables are [default], [sweep] and one "
            f"per task: {', '.join(TASKS)}"
        )
    named = [task_spec(key).name for key in table if key not in ("default", "sweep")]
    twice = sorted({name for name in named if named.count(name) > 1})
    if twice:
        raise BertforgeError(f"{origin}: {twice[0]} has two tables (names in other cases); keep one")
    given_default = recipe_values(table.get("default", {}), {}, f"{origin} [default]")
    recipes = {}
    for name in TASKS:
        base = {**DEFAULT_RECIPES["default"], **DEFAULT_RECIPES.get(name, {}), **given_default}
        own = next(
            (values for key, values in table.items() if is_task(key) and task_spec(key).name == name), {}
        )
        recipes[name] = task_recipe(name, own, base, f"{origin} [{name}]")
    return recipes, sweep_grid(table.get("sweep", DEFAULT_RECIPES["sweep"]), f"{origin} [sweep]")


def task_recipe(name: str, own: dict, base: dict, origin: str) -> Recipe:
    """The task's recipe: `base` updated by its own table; `both_orders` for symmetric tasks only."""
    values = recipe_values(own, base, origin)
    if not TASKS[name].symmetric:
        if own.get("both_orders"):
            symmetric = ", ".join(task for task, spec in TASKS.items() if spec.symmetric)
            raise BertforgeError(
                f"{origin}: both_orders is for pairs that mean the same in either order ({symmetric}); "
                f"{name}'s are not: drop it"
            )
        values["both_orders"] = False  # [default]'s holds for the symmetric tasks alone
    return Recipe(**values)


def full_recipe(saved: dict) -> dict:
    """A recipe from a glue.json, with the settings that it lacks at their defaults."""
    defaults = {f.name: f.default for f in fields(Recipe) if f.default is not MISSING}
    return defaults | saved


def recipe_text(recipe: Recipe) -> str:
    """The recipe in a line, for the user to see what each task runs."""
    parts = [
        f"learning rate {recipe.learning_rate:g}",
        f"{recipe.epochs} {plural('epoch', recipe.epochs)}",
        f"batch {recipe.batch_size}",
        f"{recipe.max_length} tokens",
        f"warmup {recipe.warmup:g}",
        f"dropout {recipe.dropout:g}",
    ]
    if recipe.max_train_examples:
        parts.append(f"at most {recipe.max_train_examples:,} training examples")
    if recipe.both_orders:
        parts.append("pairs in both orders")
    if recipe.layer_decay != 1.0:
        parts.append(f"layer decay {recipe.layer_decay:g}")
    return ", ".join(parts)


def is_task(name: str) -> bool:
    try:
        task_spec(name)
    except BertforgeError:
        return False
    return True


def recipe_values(values: dict, base: dict, origin: str) -> dict:
    """`base` updated by `values`, each key known and each value of its type and range."""
    if not isinstance(values, dict):
        raise BertforgeError(f"{origin} must be a table of recipe settings")
    types = {f.name: f.type for f in fields(Recipe)}
    merged = dict(base)
    for key, value in values.items():
        if key not in types:
            raise BertforgeError(f"{origin}: unknown setting {key!r}; the settings are: {', '.join(types)}")
        merged[key] = checked_setting(key, value, types[key], origin)
    return merged


# Each number's range, as a run config's (`bertforge.config_rules`); both_orders is true or false.
LIMITS = {
    "learning_rate": RANGES["train.learning_rate"],
    "epochs": count(),
    "batch_size": count(),
    "max_length": count(4),
    "warmup": FRACTION,
    "dropout": FRACTION,
    "max_train_examples": count(0),  # 0: every example
    "layer_decay": RANGES["train.layer_decay"],
}


def checked_setting(key: str, value, kind: str, origin: str):
    if kind == "bool":
        if not isinstance(value, bool):
            raise BertforgeError(f"{origin}: {key} must be true or false, got {value!r}")
        return value
    allowed = LIMITS[key]
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if not numeric or (kind == "int" and not isinstance(value, int)):
        kind_said = "a whole number" if kind == "int" else "a number"
        raise BertforgeError(f"{origin}: {key} must be {kind_said}, got {value!r}")
    if not allowed.holds(value):
        raise BertforgeError(f"{origin}: {key} {allowed.requirement(value)}, got {value!r}")
    return float(value) if kind == "float" else value


def sweep_grid(values: dict, origin: str) -> dict[str, list]:
    if not isinstance(values, dict):
        raise BertforgeError(
            f"{origin}: sweep must be a table of lists, e.g. [sweep] learning_rate = "
            f"{DEFAULT_RECIPES['sweep']['learning_rate']}, got {values!r}"
        )
    grid = {}
    for key in ("learning_rate", "batch_size"):
        choices = values.get(key, DEFAULT_RECIPES["sweep"][key])
        if not isinstance(choices, list) or not choices:
            raise BertforgeError(
                f"{origin}: {key} must be a list of one or more values, e.g. {DEFAULT_RECIPES['sweep'][key]}"
            )
        kind = "float" if key == "learning_rate" else "int"
        grid[key] = [checked_setting(key, value, kind, origin) for value in choices]
        if len(set(grid[key])) < len(grid[key]):
            raise BertforgeError(f"{origin}: {key} lists a value twice ({choices}); list each once")
    unknown = sorted(set(values) - set(grid))
    if unknown:
        raise BertforgeError(
            f"{origin}: unknown setting {unknown[0]!r}; the grid has learning_rate, batch_size"
        )
    return grid
