"""The layout's promises: lazy imports (no torch for the schema), no import cycle, no world imported
by the runner, the lm-eval tasks or the shared fixtures, world commands from the registry, kinds only
in their registry, and docs/ARCHITECTURE.md listing exactly the modules there are."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORLDS = ("merging.worlds.toy", "merging.worlds.smol", "merging.worlds.gemma")


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout


@pytest.mark.parametrize("statement", ["import merging.recipe", "import logitcomp; logitcomp.CompositionConfig",
                                       "import bridge", "import merging.cli, merging.runner, merging.pool, merging.plan",
                                       "import logitcomp.rules"])
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


RUNNER_SIDE = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "merging").rglob("*.py")
                     if "worlds" not in p.parts and p.name != "cli.py" or p.parent.name == "harness")


@pytest.mark.parametrize("path", [*RUNNER_SIDE, "recipes/tasks/toy/utils.py", "recipes/tasks/smol/utils.py", "tests/common.py", "tests/conftest.py"])
def test_runner_tasks_and_shared_fixtures_import_no_world(path):
    worlds = [m for m in _imports(ROOT / path) if m.startswith(WORLDS)]
    relative = [n.module for n in ast.walk(ast.parse((ROOT / path).read_text()))
                if isinstance(n, ast.ImportFrom) and n.level and n.module and n.module.startswith(("worlds.toy", "worlds.smol", "worlds.gemma"))]
    assert worlds == [] and relative == [], (path, worlds, relative)


def test_a_run_loads_no_world():
    """The runner, its checks (the code sandbox included) and the lm-eval tasks' helpers leave every world unloaded."""
    code = ("import merging.runner, merging.checks, merging.sandbox, merging.generate, merging.harness.model, sys; "
            "print(sorted(m for m in sys.modules if m.startswith('merging.worlds')))")
    assert _fresh(code) == "[]\n"


PACKAGES = ("logitcomp", "bridge", "merging")


def _project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the three packages."""
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its file (function-level imports included):
    `from X import Y` counts as X.Y when that is a module, else as X."""
    modules = _project_modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph (its modules in order), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_project_modules():
    assert _cycle(_import_graph()) is None, " -> ".join(_cycle(_import_graph()))


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_architecture_lists_every_module_and_only_modules_that_exist():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = text.split("## Modules", 1)[1].split("```")[1]  # the module tree
    listed, folders = set(), []
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        names = re.split(r"\s{2,}", line.strip())[0]  # `io.py, lazy.py   what they hold`
        folders = folders[:depth]
        if names.endswith("/") and " " not in names:
            folders.append(names.rstrip("/"))
            continue
        for name in names.split(","):
            if name.strip().endswith(".py") and "*" not in name and folders and folders[0] in PACKAGES:
                listed.add("/".join([*folders, name.strip()]))
    from merging.kinds import KINDS

    if "*.py" in block:  # `kinds/*.py`: one module per registered kind, each counted as listed
        listed |= {f"merging/kinds/{type(k).__module__.rsplit('.', 1)[1]}.py" for k in KINDS.values()}
    existing = {str(p.relative_to(ROOT)) for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    assert existing - listed == set(), f"modules missing from docs/ARCHITECTURE.md: {sorted(existing - listed)}"
    assert listed - existing == set(), f"docs/ARCHITECTURE.md lists modules that do not exist: {sorted(listed - existing)}"


def test_kinds_are_compared_only_inside_their_registry():
    """No module of merging outside merging/kinds (and the worlds, whose models are also called `base`)
    compares a variant kind with a string literal."""
    from merging.kinds import KINDS

    offenders = []
    for path in (ROOT / "merging").rglob("*.py"):
        if {"kinds", "worlds"} & set(path.relative_to(ROOT).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                literals = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                if any(value in KINDS or value == "expert" for value in literals):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


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


SCRIPTS = sorted(p.relative_to(ROOT) for p in [*(ROOT / "scripts").glob("*.py"), *(ROOT / "experiments").glob("*/*.py")])


@pytest.mark.parametrize("script", SCRIPTS, ids=str)
def test_every_script_imports_and_is_named_in_a_page(script):
    """A script's imports name what the packages hold (scripts/ and experiments/*/ are on sys.path: tests/conftest.py),
    and a page says what it is for: docs/ for scripts/, its study's README for an experiment's."""
    importlib.import_module(script.stem)
    pages = (ROOT / "docs").glob("*.md") if script.parts[0] == "scripts" else [ROOT / script.parent / "README.md"]
    assert any(str(script) in page.read_text() or script.name in page.read_text() for page in pages), script


@pytest.mark.slow
def test_the_gpu_check_runs_its_logic_on_the_cpu_and_says_it_measured_no_gpu():
    env = {**os.environ, "PY": sys.executable, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--cpu"], capture_output=True, text=True, cwd=ROOT, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "no GPU figure measured" in lines[0]
    table = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in lines[2:] if line.startswith("| ") and "---" not in line}
    assert float(table["exactness fp32: max abs(composed - separate models)"]) <= 1e-4
    assert float(table["exactness bf16: max abs(composed - separate models)"]) <= 0.1
    assert sum(k.startswith("loglikelihood peak") for k in table) == 1 and sum(k.startswith("generate b1") for k in table) == 3
    assert float(table["loglikelihood peak (2 x 32): composed k=2 / single"]) > 0
