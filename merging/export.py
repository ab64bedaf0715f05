"""`logitcomp export RECIPE ROW OUT`: one row of a recipe written as a model folder you can serve, as `mergekit-yaml`
writes a merge.

A composed or routed row becomes a composition folder (`ComposedModelForCausalLM.save_pretrained`: a transformers
model folder that `AutoModelForCausalLM`, `pipeline` and `lm_eval --model hf` open after `import logitcomp`), its
routing fitted as the run fits it; a merged row a mergekit folder (with `mergekit_config.yml` and the
`mergekit-yaml` command that rebuilds it); a merged_lora row a peft adapter; an arrow row a folder of its adapters
that opens, through the same Auto classes, into peft's Arrow model. A swept family's name exports the row
its run chose on validation (the run must have finished those rows, from unchanged inputs). Beside the model,
`logitcomp_export.json` records the recipe, the row and what its run fitted.
"""

from __future__ import annotations

import json
from pathlib import Path

from logitcomp.io import atomic_dir

from .errors import RecipeError
from .kinds import KINDS, Variant
from .plan import Plan, prepare
from .pool import ModelPool
from .sweeps import select

RECORD = "logitcomp_export.json"


def export_row(recipe_path, row: str, out, sets: dict | None = None, self_contained: bool = False, force: bool = False) -> Path:
    """Write the recipe's row `row` (a row's name, or a swept family's: its chosen row) into the folder `out`.
    Returns the folder.

    Raises:
        RecipeError: an unknown row, a family whose choice is not made yet, a kind that writes no model, or an
            `out` that is not empty (unless `force`).
    """
    p = prepare(recipe_path, check_tasks=True, sets=sets)
    variant = pick_row(p, row)
    kind = KINDS[variant.kind]
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()) and not force:
        raise RecipeError(f"{out}: not empty; choose a new folder or pass --force to replace it")
    p.paths.fetch()
    pool = ModelPool(p.recipe, p.paths)
    with atomic_dir(out) as tmp:
        fit = kind.export(variant, pool, tmp, self_contained)
        record = {"recipe": p.recipe.dump(), "row": variant.name, "kind": variant.kind,
                  **({"routing": {"fit": fit}} if fit else {})}
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return out


def pick_row(p: Plan, name: str) -> Variant:
    """The row named `name`, or the row the run chose for the swept family `name` (its finished records read)."""
    rows = {r.name: r for r in p.rows}
    if name in rows:
        return rows[name]
    family = [r for r in p.rows if r.family == name]
    if not family:
        raise RecipeError(f"row: {name!r} is not a row of {p.recipe.name}; its rows are {', '.join(rows)}")
    from .runner import finished, input_state

    results = {}
    for r in family:
        record, why = finished(r, p.recipe, p.paths, input_state(r, p.recipe, p.paths))
        if record is None:
            raise RecipeError(f"row: {name} is a swept family and its row {r.name} has no result{f' ({why})' if why else ''}; "
                              f"run the recipe first so that validation chooses, or name one row ({', '.join(x.name for x in family)})")
        results[r.name] = record["metrics"]
    chosen = select(results, family, p.recipe.evaluate.select_on).get(name)
    if chosen is None:
        raise RecipeError(f"row: {name} is a swept family without select_on; name one row ({', '.join(r.name for r in family)})")
    return rows[chosen["variant"]]
