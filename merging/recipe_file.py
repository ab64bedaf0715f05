"""Reading a recipe file: size and encoding bounds, safe YAML (no duplicate keys, no alias bombs, no
object tags), then the schema of `merging.recipe`. Every failure is one RecipeError line naming the
file and, past the YAML, the field.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from .errors import RecipeError
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


def load_recipe(path) -> tuple[Recipe, ResolvedPaths]:
    """Parse and validate a recipe file. Raises RecipeError with one line naming the file and field."""
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
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(f"{path}: {load_error(exc)}") from None
    return recipe, recipe.resolve(path.parent)
