"""Issue 30's fault matrix: a full disk at each write of a run (merge, lm-eval outputs, the row's record, the
reports) x {first run, resume, --force}, SIGTERM and kill -9 at each of those stages, and a stale lock left by a
run killed inside another PID namespace. No cell may exit 0 with a corrupt or missing output, print a traceback, or
lose the previous outputs; after each, a plain rerun ends with every output whole (tests/merging/fault_matrix.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from merging.cli import TERMINATED

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks"
DRIVER = Path(__file__).with_name("fault_matrix.py")
NAMESPACES = shutil.which("unshare") is not None and subprocess.run(
    ["unshare", "--mount", "--map-root-user", "true"], capture_output=True).returncode == 0
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="needs private mount namespaces (unshare) for a small tmpfs")


def _outputs(tmp_path: Path, tiny) -> tuple[Path, Path, Path, Path]:
    """A two-row recipe (base; a task-arithmetic merge of two LoRA experts), a finished output of it and the
    output a run killed after its first row leaves."""
    import merging.runner as runner

    recipe = {"name": "faults", "base": str(tiny.base), "experts": {"a": str(tiny.adapters["a"]), "b": str(tiny.adapters["b"])},
              "variants": ["base", "merged"], "merge": {"method": "task_arithmetic"},
              "evaluate": {"tasks": ["toy_a2b_c2d"], "include_path": str(TASKS), "limit": 2, "batch_size": 2}, "output": "out"}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    out = tmp_path / "out"
    runner.run_recipe(path, echo=lambda *_: None)
    good, resume = tmp_path / "good", tmp_path / "resume"
    shutil.copytree(out, good)
    shutil.copytree(out, resume)
    for name in ("variants/merged.json", "lm_eval/merged", "models", "results.json", "report.md", "report.png"):
        target = resume / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    shutil.rmtree(out)
    out.mkdir()
    return path, out, good, resume


@needs_namespaces
def test_no_fault_leaves_a_corrupt_output_behind_an_exit_0(tiny, tmp_path):
    path, out, good, resume = _outputs(tmp_path, tiny)
    script = 'mount -t tmpfs -o size=64m tmpfs "$1" || exit 99; shift; exec "$@"'
    env = {k: v for k, v in os.environ.items() if k != "HF_ALLOW_CODE_EVAL"}
    proc = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", script, "sh", str(out),
                           sys.executable, str(DRIVER), str(out), str(path), str(good), str(resume)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert proc.returncode == 0 and "Traceback" not in proc.stdout, proc.stderr[-3000:]
    cells = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(cells) == 3 * 4 + 4 + 4, proc.stdout
    failures = []
    for c in cells:
        expected = {"full": 2, "term": 143, "kill": -9}[c["fault"]]
        line_ok = {"full": lambda line: line.startswith("logitcomp: error: ") and (str(out) in line or "lm_eval/" in line)  # names the file
                   and ("disk is full" in line or "No space left on device" in line or "MiB free" in line),
                   "term": lambda line: line == TERMINATED, "kill": lambda line: True}[c["fault"]](c["line"])
        if c["exit"] != expected or not line_ok or c["problems"] or c["rerun_exit"] != 0 or c["rerun_problems"] \
                or c["rerun_results"] != ["base", "merged"]:
            failures.append(c)
    print("\n".join(f"{c['fault']:<5} {c['mode']:<7} {c['stage']:<8} exit {c['exit']:>4}  rerun {c['rerun_exit']}  {c['line']}" for c in cells))
    assert not failures, json.dumps(failures, indent=1)


@pytest.mark.skipif(shutil.which("unshare") is None or subprocess.run(
    ["unshare", "--pid", "--fork", "--map-root-user", "true"], capture_output=True).returncode != 0,
    reason="needs a private PID namespace (unshare)")
def test_a_run_killed_inside_another_pid_namespace_leaves_no_lock_behind(tmp_path):
    """Issue 30.2: a run killed as pid 1 of a container left a lock that refused every later run."""
    from merging.output import LOCK, output_lock

    out = tmp_path / "out"
    code = ("import os, pathlib, signal, sys\nfrom merging.output import output_lock\n"
            "with output_lock(pathlib.Path(sys.argv[1])):\n    print(os.getpid(), flush=True)\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run(["unshare", "--pid", "--fork", "--map-root-user", sys.executable, "-c", code, str(out)],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout.strip() == "1" and (out / LOCK).read_text().startswith("pid 1 on ")  # killed as its namespace's pid 1
    with output_lock(out):
        assert (out / LOCK).read_text().startswith(f"pid {os.getpid()} on ")


@needs_namespaces
def test_an_output_on_a_read_only_disk_is_refused_by_validate(tiny, tmp_path):
    """Issue 30.9: `run` found a read-only output only when it first wrote, after spending compute. Root may write
    into any folder whatever its mode, so the output lies on a read-only mount (which stops root too)."""
    recipe = {"name": "ro", "base": str(tiny.base), "experts": {"a": str(tiny.adapters["a"])}, "variants": ["base"],
              "evaluate": {"tasks": ["toy_a2b_c2d"], "include_path": str(TASKS), "limit": 2}, "output": "disk/out"}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    (tmp_path / "disk").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "HF_ALLOW_CODE_EVAL"}
    for command in ("validate", "run"):
        script = 'mount -t tmpfs -o size=1m,ro tmpfs "$1" || exit 99; shift; exec "$@"'
        proc = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", script, "sh", str(tmp_path / "disk"),
                               sys.executable, "-m", "merging.cli", command, str(path)], capture_output=True, text=True, env=env)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            f"logitcomp: error: output: {tmp_path / 'disk' / 'out'} is not writable here ({tmp_path / 'disk'} is read-only for this user); "
            "choose an empty or new folder for the results"], proc.stderr
