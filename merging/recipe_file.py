"""Reading a recipe file: size and encoding bounds, safe YAML (no duplicate keys, no alias bombs, no
object tags), the recipe's variables (`vars:`, set from the command line with `--set NAME=VALUE`), then
the schema of `merging.recipe`. Every failure is one RecipeError line naming the file and, past the
YAML, the field.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from .errors import RecipeError, did_you_mean
from .recipe import Recipe, ResolvedPaths, load_error

MAX_BYTES = 1 << 20  # a recipe is a page of YAML; a larger file is a mistake or an attack
MAX_NODES = 100_000  # YAML nodes after alias expansion (a 1 kB alias bomb expands to billions)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML keeps the last one silently) and
    documents whose aliases expand to more than MAX_NODES nodes (PyYAML shares aliased nodes, but
    validating and dumping the recipe walks every expanded copy)."""

    def construct_document(self, node):
        sizes: dict[int, int | None] = {}

        def expanded(n) -> int:  # nodes of the tree with every alias copied out; memoised per node
            if id(n) in sizes and sizes[id(n)] is None:
                raise yaml.constructor.ConstructorError(None, None, "a recursive alias (a node inside itself)", n.start_mark)
            if id(n) not in sizes:
                sizes[id(n)] = None  # being measured
                children = [c for pair in n.value for c in pair] if isinstance(n, yaml.MappingNode) else \
                    n.value if isinstance(n, yaml.SequenceNode) else []
                sizes[id(n)] = 1 + sum(expanded(c) for c in children)
            return sizes[id(n)]

        if expanded(node) > MAX_NODES:
            raise yaml.constructor.ConstructorError(None, None, f"aliases expand to more than {MAX_NODES} YAML nodes", node.start_mark)
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_text(path: Path) -> str:
    """The recipe's text, at most MAX_BYTES of UTF-8. Raises RecipeError naming the file."""
    if not path.is_file():
        raise RecipeError(f"{path}: no such recipe file")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise RecipeError(f"{path}: {size} bytes; a recipe may hold at most {MAX_BYTES} bytes")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def parse_sets(items: list[str] | None) -> dict:
    """`--set NAME=VALUE` items as {name: value}; a value is read as a YAML scalar (`2` an int, `x` text).
    Raises RecipeError naming the item that is not NAME=VALUE."""
    values = {}
    for item in items or []:
        name, sep, text = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise RecipeError(f"--set: expected NAME=VALUE (a variable of the recipe's vars:), got {item!r}")
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            value = text
        values[name] = value if isinstance(value, (str, int, float, bool)) else text
    return values


def _substitute(data, values: dict, where: str = ""):
    """`data` with every `${NAME}` in its strings replaced by the variable's value (a string that is exactly
    `${NAME}` takes the value with its type). Raises RecipeError naming the field and the unknown variable."""
    if isinstance(data, dict):
        return {k: _substitute(v, values, f"{where}.{k}" if where else str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [_substitute(v, values, f"{where}[{i}]") for i, v in enumerate(data)]
    if not isinstance(data, str) or "${" not in data:
        return data
    for name in VARIABLE.findall(data):
        if name not in values:
            raise RecipeError(f"{where}: unknown variable ${{{name}}}{did_you_mean(name, values)}; "
                              f"declare it under vars: (the recipe's variables: {', '.join(values) or 'none'})")
    whole = VARIABLE.fullmatch(data)
    return values[whole.group(1)] if whole else VARIABLE.sub(lambda m: str(values[m.group(1)]), data)


def _with_variables(data: dict, sets: dict) -> dict:
    """The recipe with its variables substituted: `vars:` gives each its default, `sets` (from `--set`)
    overrides them; the values used stay under `vars:`, so that the outputs record them."""
    declared = data.get("vars") or {}
    if not isinstance(declared, dict) or not all(isinstance(v, (str, int, float, bool)) for v in declared.values()):
        raise RecipeError("vars: expected a mapping of variable names to text or numbers, e.g. {seed: 0}")
    unknown = [n for n in sets if n not in declared]
    if unknown:
        raise RecipeError(f"--set: {unknown[0]!r} is not a variable of the recipe{did_you_mean(unknown[0], declared)}; "
                          f"its vars: {', '.join(declared) or 'none (declare them under vars:)'}")
    values = {**declared, **sets}
    rest = _substitute({k: v for k, v in data.items() if k != "vars"}, values)
    return {**rest, "vars": values} if values else rest


def load_recipe(path, sets: dict | None = None) -> tuple[Recipe, ResolvedPaths]:
    """Parse and validate a recipe file, its variables set from `sets` (`--set NAME=VALUE`, see `parse_sets`).
    Raises RecipeError with one line naming the file and field."""
    path = Path(path)
    text = _read_text(path)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except RecursionError:
        raise RecipeError(f"{path}: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError(f"{path}{where}: {problem}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: expected a mapping of recipe keys")
    try:
        data = _with_variables(data, sets or {})
    except RecipeError as exc:
        raise RecipeError(f"{path}: {exc}") from None
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(f"{path}: {load_error(exc)}") from None
    return recipe, recipe.resolve(path.parent)
