"""docs/adapters.md ("From your adapters to one model") runs as written: its YAML block is the recipe, its bash
blocks run in a shell and its Python block in a fresh interpreter, in a folder laid out as the page says (a tiny
base, two LoRA adapters of it, a prompts file, a task folder of one's own), so the page cannot drift."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from common import make_tiny_lora

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "adapters.md"
TOY = ROOT / "recipes" / "tasks" / "toy"
# the page's tasks, made from the toy world's (their names replaced): a skill each and the pair, with validation splits
OWN_TASKS = {"toy_a2b_c2d": "my_both", "toy_a2b": "my_math", "toy_c2d": "my_polite"}


def _blocks() -> list[tuple[str, str]]:
    return re.findall(r"```(\w+)\n(.*?)```", PAGE.read_text(), re.S)


def _world(root: Path, tiny) -> None:
    """The folder the page assumes: base/, adapters/{math,polite} (one rank and targets: Arrow's need), prompts/, my_tasks/."""
    shutil.copytree(tiny.base, root / "base")
    for seed, name in enumerate(("math", "polite"), 11):
        make_tiny_lora(root / "base", root / "adapters" / name, seed=seed, r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    (root / "prompts").mkdir()
    (root / "prompts" / "math.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["ABAB>", "AAB>BA", "BAAB>"]))
    tasks = root / "my_tasks"
    tasks.mkdir()
    for toy, own in OWN_TASKS.items():
        for suffix in ("", "_val"):
            text = (TOY / f"{toy}{suffix}.yaml").read_text()
            for old, new in OWN_TASKS.items():  # toy_a2b_c2d before toy_a2b (the dict's order)
                text = text.replace(old, new)
            (tasks / f"{own}{suffix}.yaml").write_text(re.sub(r"^tag: .*$", "", text, flags=re.M))  # no toy tags
    for path in [*TOY.glob("*.jsonl"), TOY / "utils.py"]:
        shutil.copy(path, tasks / path.name)


def test_the_adapters_page_runs_as_written(tiny, tmp_path):
    _world(tmp_path, tiny)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    ran = []
    for language, code in _blocks():
        if language == "yaml":
            name = re.match(r"# (\S+\.yaml)\n", code)[1]
            (tmp_path / name).write_text(code)
            continue
        command = ["bash", "-e", "-c", code] if language == "bash" else [sys.executable, "-c", code]
        proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, (code, proc.stdout[-2000:], proc.stderr[-3000:])
        ran.append((language, proc.stdout))
    assert [language for language, _ in ran] == ["bash", "bash", "python", "bash"]
    report = (tmp_path / "runs" / "mine" / "report.md").read_text()
    for row in ("math", "polite", "composed", "routed", "arrow", "ta"):
        assert f"| {row}" in report, row
    assert "## Routing" in report
    assert (tmp_path / "served" / "composition.json").is_file() and (tmp_path / "merged" / "mergekit_command.sh").is_file()
    assert "my_both" in ran[-1][1]  # lm-eval's table of the served folder
