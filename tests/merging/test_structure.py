"""The layout's promises: lazy imports (no torch for the schema), no world imported by the runner,
the lm-eval tasks or the shared fixtures, world commands from the registry."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORLDS = ("merging.worlds.toy", "merging.worlds.smol", "merging.worlds.gemma")


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout


@pytest.mark.parametrize("statement", ["import merging.recipe", "import logitcomp; logitcomp.CompositionConfig",
                                       "import bridge", "import merging.cli, merging.runner, merging.variants"])
def test_schema_and_packages_import_no_torch(statement):
    assert _fresh(f"{statement}\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))") == "[]\n"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", ["merging/runner.py", "merging/variants.py", "merging/harness.py", "merging/recipe.py",
                                  "merging/recipe_file.py", "merging/plan.py", "merging/sweeps.py", "merging/distributed.py",
                                  "recipes/tasks/toy/utils.py", "recipes/tasks/smol/utils.py", "tests/common.py",
                                  "tests/conftest.py"])
def test_runner_tasks_and_shared_fixtures_import_no_world(path):
    worlds = [m for m in _imports(ROOT / path) if m.startswith(WORLDS)]
    relative = [n.module for n in ast.walk(ast.parse((ROOT / path).read_text()))
                if isinstance(n, ast.ImportFrom) and n.level and n.module and n.module.startswith(("worlds.toy", "worlds.smol", "worlds.gemma"))]
    assert worlds == [] and relative == [], (path, worlds, relative)


def test_logitcomp_and_bridge_import_nothing_above_them():
    for package, forbidden in (("logitcomp", ("bridge", "merging")), ("bridge", ("merging",))):
        for path in (ROOT / package).glob("*.py"):
            assert not [m for m in _imports(path) if m.split(".")[0] in forbidden], path


def test_every_registered_world_writes_its_shipped_task_files(tmp_path, capsys):
    from merging.cli import build_parser
    from merging.worlds import WORLDS as REGISTRY

    parser = build_parser()
    for world in [w for w in REGISTRY if (ROOT / "recipes" / "tasks" / w).is_dir()]:  # gemma uses smol's tasks
        args = parser.parse_args([world, "tasks", str(tmp_path / world)])
        assert args.func(args) == 0
        written = sorted(p.name for p in (tmp_path / world).iterdir())
        assert written and set(written) <= {p.name for p in (ROOT / "recipes" / "tasks" / world).iterdir()}, written
        for name in written:
            assert (tmp_path / world / name).read_bytes() == (ROOT / "recipes" / "tasks" / world / name).read_bytes(), name
