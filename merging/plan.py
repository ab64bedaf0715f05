"""The rows of a comparison, planned once per run: a recipe's `variants:` expanded by their kinds.

`experts` becomes one row per expert, and a swept variant one row per value, named `NAME[PARAM=VALUE]`
and tagged with its family (NAME) so that the runner can pick one value on the validation task.
Each row carries everything its model is built from (composition config, merge method, weights).

`prepare(path)` is the first half of every command that reads a recipe: load and validate the
file, plan its rows, check its inputs; it returns a `Plan` that the later steps take as it is.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from .checks import check_inputs
from .errors import RecipeError
from .kinds import KINDS, Variant
from .recipe import Recipe, ResolvedPaths, VariantSpec
from .recipe_file import load_recipe


MAX_ROW_NAME = 200  # bytes; `NAME.json.partial-XXXXXX` must stay within a file name's 255


@dataclass(frozen=True)
class Plan:
    """A loaded, validated recipe, the absolute paths it names and its rows in order."""

    recipe: Recipe
    paths: ResolvedPaths
    rows: list[Variant]


def plan(recipe: Recipe) -> list[Variant]:
    """The recipe's rows in order. Raises RecipeError naming the variant whose options do not hold."""
    rows = []
    for item in recipe.variants:
        spec = VariantSpec.shorthand(item) if isinstance(item, str) else item
        try:
            rows += spec.rows(recipe)
        except ValueError as exc:
            raise RecipeError(f"variants: {spec.name}: {exc}") from None
    for row in rows:  # a row names files (variants/NAME.json, lm_eval/NAME, models/NAME): within the file systems' 255 bytes
        if len(row.name.encode()) > MAX_ROW_NAME:
            raise RecipeError(f"variants: the row {row.name[:40]}... has a {len(row.name.encode())}-byte name; "
                              f"row names (expert and variant names, with [PARAM=VALUE] when swept) hold at most {MAX_ROW_NAME} bytes")
    return rows


def prepare(path, check_tasks: bool = True, sets: dict | None = None) -> Plan:
    """Load, validate and plan a recipe file (its variables set from `sets`), then check its inputs offline
    (`check_tasks`: its lm-eval tasks too). Raises RecipeError with one line naming the file or the field."""
    recipe, paths = load_recipe(path, sets)
    rows = plan(recipe)
    check_inputs(recipe, paths, rows, check_tasks)
    return Plan(recipe, paths, rows)
