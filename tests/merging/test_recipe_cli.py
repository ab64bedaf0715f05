"""Recipes and the CLI: schema, validation, and bad input (exit 2, one line naming the field or file, nothing written)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from common import make_tiny_llama, make_tiny_lora, run_side_by_side
from merging.recipe import Recipe, RecipeError
from merging.recipe_file import load_recipe

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks"


def write_recipe(tmp_path: Path, tiny, **changes) -> Path:
    data = {
        "name": "tiny",
        "base": str(tiny.base),
        "experts": {"a": {"path": str(tiny.adapters["a"]), "weight": 1.0}, "b": str(tiny.adapters["b"])},
        "evaluate": {"tasks": ["toy_a2b_c2d"], "include_path": str(TASKS), "limit": 4, "batch_size": 4},
        "output": "out",
    }
    for key, value in changes.items():
        data[key] = value
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli_command(*args, cwd=None) -> dict:
    """`subprocess.run`'s arguments for `logitcomp ARGS` (code evaluation not opted into)."""
    env = {k: v for k, v in os.environ.items() if k != "HF_ALLOW_CODE_EVAL"}
    return dict(args=[sys.executable, "-m", "merging.cli", *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env)


def cli(*args, cwd=None):
    return subprocess.run(**cli_command(*args, cwd=cwd))


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_schema_round_trips_and_resolves_paths_against_the_file(tiny, tmp_path):
    recipe, paths = load_recipe(write_recipe(tmp_path, tiny))
    assert Recipe.model_validate(yaml.safe_load(recipe.to_yaml())) == recipe
    assert recipe.experts["b"].weight == 1.0 and recipe.variants == ["base", "experts", "composed", "merged", "merged_lora"]
    assert paths.output == (tmp_path / "out").resolve()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\nbogus: 1\n", r"unknown key 'bogus'; allowed keys: name, base, experts"),
        ("name: x\nname: y\n", r"line 2\): duplicate key 'name'"),
        ("name: !!python/object:os.system x\n", r"could not determine a constructor for the tag"),
    ],
)
def test_yaml_problems_are_one_line(tmp_path, text, message):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError, match=message):
        load_recipe(path)
    _assert_clean_failure(cli("validate", path), message, tmp_path)


def test_duplicate_expert_names_through_the_cli(tiny, tmp_path):
    path = write_recipe(tmp_path, tiny)
    text = path.read_text().replace("  b: ", f"  a: {tiny.adapters['b']}\n  b: ", 1)
    path.write_text(text)
    _assert_clean_failure(cli("run", path), r"duplicate key 'a'", tmp_path)


def _assert_clean_failure(proc, pattern: str, tmp_path: Path):
    """Exit 2, one line matching `pattern`, and nothing written: no output folder, and every file
    under tmp_path (recipe, models, adapters) was already there when the recipe was written."""
    import re

    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(pattern, lines[0]), lines[0]
    assert not (tmp_path / "out").exists()
    recipe_time = max(p.stat().st_mtime_ns for p in tmp_path.glob("*.yaml"))
    assert not [name for name, mtime in _tree(tmp_path).items() if mtime > recipe_time], _tree(tmp_path)


@pytest.mark.parametrize("name", ["..", "../x", "/abs", "a/b", "", ".hidden", "math.v2", "base", "composed", "merged_lora", "experts"])
def test_expert_names_are_identifiers_not_paths_or_variants(tiny, tmp_path, name):
    """A name becomes lm_eval/<name> and variants/<name>.json: a path or a variant's name is refused at validate."""
    recipe = write_recipe(tmp_path, tiny, experts={name: str(tiny.adapters["a"])})
    pattern = r"is a variant name" if name in ("base", "composed", "merged_lora", "experts") else r"expert name .*: expected letters"
    _assert_clean_failure(cli("validate", recipe), pattern, tmp_path)


def test_output_must_not_mix_with_the_users_files(tiny, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    cases = {"/": "a system root", ".": "the recipe's folder", "..": "the recipe's folder", str(tiny.base): "a model folder",
             str(tiny.base.parent): "a model folder", str(foreign): "a non-empty folder that no recipe run wrote"}
    for i, (output, reason) in enumerate(cases.items()):
        proc = cli("validate" if i % 2 else "run", write_recipe(tmp_path, tiny, output=output))
        _assert_clean_failure(proc, rf"output: .* is {reason}.*; choose an empty or new folder", tmp_path)
    assert (foreign / "notes.txt").read_text() == "mine"
    # issue 30.5: a folder of the user's that holds a hand-written recipe.yaml is not an earlier output, even with --force
    mine = tmp_path / "my_recipes"
    mine.mkdir()
    text = "# my recipe, with my comments\n" + write_recipe(tmp_path, tiny).read_text()
    (mine / "recipe.yaml").write_text(text)
    proc = cli("run", write_recipe(tmp_path, tiny, output=str(mine)), "--force")
    _assert_clean_failure(proc, r"output: .*my_recipes is a non-empty folder that no recipe run wrote", tmp_path)
    assert sorted(p.name for p in mine.iterdir()) == ["recipe.yaml"] and (mine / "recipe.yaml").read_text() == text


def test_a_second_run_of_one_output_is_refused_and_leftovers_are_swept(tmp_path):
    """The lock is a kernel lock (flock): held while its holder lives, whatever its file says (issue 30.2)."""
    import fcntl

    from merging.output import LOCK, output_lock

    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text("pid 4242 on elsewhere")
    holder = os.open(out / LOCK, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # a live run holds it
    with pytest.raises(RecipeError, match=r"being written by another run \(pid 4242 on elsewhere\)"):
        with output_lock(out):
            pass
    os.close(holder)  # the holder ends (as a killed process's lock is released by the kernel)
    (out / LOCK).write_text("1")  # what a run killed inside a container (pid 1) leaves: refused forever before
    (out / "lm_eval" / ".a2b.partial-x1y2").mkdir(parents=True)
    (out / "variants").mkdir()
    (out / "variants" / ".base.json.partial-k3j4").write_text('{"metr')  # an atomic write killed mid-way
    with output_lock(out):
        assert (out / LOCK).read_text().startswith(f"pid {os.getpid()} on ") and not list(out.rglob(".*.partial-*"))
    assert (out / "lm_eval").is_dir()
    with output_lock(out):  # released at the end of the block
        pass


def test_runs_starting_together_on_a_stale_lock_hold_it_one_at_a_time(tmp_path):
    """Issue 30.3: four processes released at once on a dead run's lock file; exactly one holds it."""
    out = tmp_path / "out"
    out.mkdir()
    (out / ".logitcomp.lock").write_text("999999999")
    go = tmp_path / "go"
    code = ("import sys, time, pathlib\nfrom merging.output import output_lock\nfrom merging.errors import RecipeError\n"
            "print('ready', flush=True)\ngo = pathlib.Path(sys.argv[1])\nwhile not go.exists(): time.sleep(0.001)\n"
            "try:\n    with output_lock(pathlib.Path(sys.argv[2])):\n        print('held', flush=True); time.sleep(3)\n"
            "except RecipeError:\n    print('refused', flush=True)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(go), str(out)], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    go.touch()
    outcomes = sorted(proc.communicate(timeout=60)[0].strip() for proc in procs)
    assert outcomes == ["held", "refused", "refused", "refused"], outcomes


def test_runner_writes_only_inside_its_output(tmp_path):
    from merging.recipe import RecipeError
    from merging.output import inside

    out = tmp_path.resolve()
    assert inside(out, "variants", "a.json") == out / "variants" / "a.json"
    for parts in (("..", "x"), ("variants", "..", ".."), (".",), ("/etc",)):
        with pytest.raises(RecipeError, match="would be written outside"):
            inside(out, *parts)


def test_adapter_of_another_base_and_pickles_are_refused(tiny, tmp_path):
    other = make_tiny_llama(tmp_path / "other", seed=3)
    stray = make_tiny_lora(other, tmp_path / "stray", seed=1, r=2, lora_alpha=2, target_modules=["q_proj"])
    _assert_clean_failure(cli("run", write_recipe(tmp_path, tiny, experts={"s": str(stray)})), r"expert 's': .* is an adapter of .*other", tmp_path)
    pickled = tmp_path / "pickled"
    model = AutoModelForCausalLM.from_pretrained(tiny.full_expert)
    model.config.save_pretrained(pickled)
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")
    _assert_clean_failure(cli("run", write_recipe(tmp_path, tiny, experts={"p": str(pickled)})), r"experts\.p: .* only pickled weights .*allow_pickle", tmp_path)
    proc = cli("validate", write_recipe(tmp_path, tiny, experts={"p": str(pickled)}, allow_pickle=True))
    assert proc.returncode == 0, proc.stderr


def test_output_of_another_recipe_is_refused_unless_forced(tiny, tmp_path):
    recipe = write_recipe(tmp_path, tiny)
    out = tmp_path / "out"
    out.mkdir()
    (out / "recipe.yaml").write_text("name: another\n")
    (out / ".logitcomp.lock").write_text("pid 1 on elsewhere")  # what every run leaves: the folder is an earlier output
    proc = cli("run", recipe, "--dry-run")
    assert proc.returncode == 2 and "holds results of a different recipe" in proc.stderr
    assert (out / "recipe.yaml").read_text() == "name: another\n"
    proc = cli("run", recipe, "--dry-run", "--force")
    assert proc.returncode == 0 and "composed" in proc.stdout


def test_debug_shows_the_traceback(tiny, tmp_path):
    proc = cli("--debug", "validate", write_recipe(tmp_path, tiny, merge={"method": "avg"}))
    assert proc.returncode != 0 and "Traceback" in proc.stderr


SHIPPED = sorted(str(p.relative_to(TASKS.parents[1])) for p in [*TASKS.parent.glob("*.yaml"), *TASKS.parents[1].glob("experiments/*/*.yaml")])


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_and_study_recipes_parse(name):
    recipe, paths = load_recipe(TASKS.parents[1] / name)
    assert Recipe.model_validate(yaml.safe_load(recipe.to_yaml())) == recipe
    assert paths.include_paths in ([], [TASKS])
    if recipe.vars:  # a recipe of every seed: another value gives other worlds and another output
        other = load_recipe(TASKS.parents[1] / name, {"seed": recipe.vars["seed"] + 1})[1]
        assert other.output != paths.output


def test_gemma_recipe_validates_and_dry_runs_offline():
    """The paper's table for GPU users: lm-eval's standard task names, valid and dry-run here with the code opt-in
    its header names (HumanEval+ and MBPP+ run model-written code), refused in one line without it."""
    recipe = TASKS.parent / "gemma2-2b-math-code.yaml"
    opted = [{**c, "env": {**c["env"], "HF_ALLOW_CODE_EVAL": "1"}} for c in (cli_command("validate", recipe), cli_command("run", recipe, "--dry-run"))]
    validated, proc, refused = run_side_by_side(*opted, cli_command("validate", recipe))  # each mostly indexes lm-eval's tasks
    assert validated.returncode == 0, validated.stderr
    assert "tasks gsm8k, minerva_math, humaneval_plus, mbpp_plus" in validated.stdout
    assert proc.returncode == 0, proc.stderr
    for row in ("base", "math", "code", "composed", "merged"):
        assert row in proc.stdout
    assert refused.returncode != 0 and refused.stderr.strip().startswith("logitcomp: error: evaluate.confirm_run_unsafe_code: HF_ALLOW_CODE_EVAL")


def test_resume_reuses_a_variant_only_while_its_resolved_inputs_are_unchanged(tiny, tmp_path, monkeypatch):
    """Issue 12.5: one recipe text in two folders, relative paths to different worlds, one output:
    the second world reused the first world's results (the fingerprint was the text)."""
    import shutil

    import merging.runner as runner

    calls = []
    real = runner.evaluate_variant
    monkeypatch.setattr(runner, "evaluate_variant", lambda v, *a: calls.append(v.name) or real(v, *a))
    out = tmp_path / "shared_out"
    recipes = []
    for folder, seed in (("one", 0), ("two", 5)):
        world = tmp_path / folder / "world"
        make_tiny_llama(world / "base", seed=seed)
        make_tiny_lora(world / "base", world / "a", seed=1)
        text = {"name": "resume", "base": "world/base", "experts": {"a": "world/a"}, "variants": ["base", "experts"],
                "evaluate": {"tasks": ["toy_a2b_c2d"], "include_path": str(TASKS), "limit": 2, "batch_size": 2}, "output": str(out)}
        recipes.append(tmp_path / folder / "recipe.yaml")
        recipes[-1].write_text(yaml.safe_dump(text, sort_keys=False))
    lines = []
    runner.run_recipe(recipes[0], echo=lines.append)
    runner.run_recipe(recipes[0], echo=lines.append)  # unchanged: both variants reused
    assert calls == ["base", "a"]
    runner.run_recipe(recipes[1], echo=lines.append)  # same text, other world: both run again
    assert calls == ["base", "a"] * 2
    assert "variants/base.json: base changed since it was made; running it again" in lines
    assert any(line.startswith("variants/a.json: base, experts.a changed since it was made") for line in lines)
    recorded = json.loads((out / "variants" / "a.json").read_text())["inputs"]
    assert recorded["base"]["path"] == str((tmp_path / "two" / "world" / "base").resolve())
    retrained = make_tiny_lora(tmp_path / "two" / "world" / "base", tmp_path / "retrained", seed=9)
    shutil.copy(retrained / "adapter_model.safetensors", tmp_path / "two" / "world" / "a")  # the expert retrained
    runner.run_recipe(recipes[1], echo=lines.append)
    assert calls == ["base", "a"] * 2 + ["a"]


def test_generate_takes_the_rule_of_the_recipe_or_of_the_command_line(tiny, tmp_path):
    import torch
    from transformers import AutoTokenizer

    from logitcomp import ComposedModelForCausalLM, CompositionConfig

    recipe = write_recipe(tmp_path, tiny, compose={"rule": "tempered", "rule_params": {"scale": 0.5}})
    tok = AutoTokenizer.from_pretrained(tiny.base)
    batch = tok(["CAB>"], return_tensors="pt")
    experts = {"a": tiny.adapters["a"], "b": tiny.adapters["b"]}
    for args, config in (([], CompositionConfig(rule="tempered", rule_params={"scale": 0.5})),
                         (["--rule", "activity", "--rule-param", "gamma=3"], CompositionConfig(rule="activity", rule_params={"gamma": 3.0}))):
        proc = cli("generate", "--recipe", recipe, "--prompt", "CAB>", "--max-new-tokens", "8", *args)
        assert proc.returncode == 0, proc.stderr
        composed = ComposedModelForCausalLM.from_experts(tiny.base, experts, config=config)
        with torch.no_grad():
            out = composed.generate(**batch, max_new_tokens=8, do_sample=False)
        assert proc.stdout.splitlines()[0] == tok.decode(out[0, batch.input_ids.shape[1]:], skip_special_tokens=True)


def test_a_corrupt_or_changed_row_record_is_run_again_and_dry_run_says_so(tiny, tmp_path, monkeypatch):
    """Issue 30.8 and 30.11: a variants/NAME.json that is truncated, `[]`, `null` or `{"inputs": 5}` is named in one
    line and its row runs again (no traceback, no --force needed); `--dry-run` makes the same reuse decision as `run`."""
    import merging.runner as runner

    calls = []
    real = runner.evaluate_variant
    monkeypatch.setattr(runner, "evaluate_variant", lambda v, *a: calls.append(v.name) or real(v, *a))
    recipe = write_recipe(tmp_path, tiny, variants=["base", "experts"])
    runner.run_recipe(recipe, echo=lambda *_: None)
    records = tmp_path / "out" / "variants"
    good = (records / "a.json").read_text()
    for bad, why in ((good[: len(good) // 2], r"unreadable \(JSONDecodeError"), ("[]", "not a finished row's record"),
                     ("null", "not a finished row's record"), ('{"inputs": 5}', "not a finished row's record")):
        (records / "a.json").write_text(bad)
        plan = []
        runner.run_recipe(recipe, dry_run=True, echo=plan.append)
        assert any(line.split()[:2] == ["a", "experts"] and line.split()[2:4] == ["to", "run"] for line in plan), plan
        assert any(line.split()[:4] == ["base", "base", "done,", "skipped"] for line in plan), plan
        lines, before = [], len(calls)
        runner.run_recipe(recipe, echo=lines.append)
        assert calls[before:] == ["a"] and any(line.startswith("variants/a.json: ") and re.search(why, line) for line in lines), lines
    assert json.loads((records / "a.json").read_text())["metrics"]  # rewritten whole by the last run


def test_a_recipe_that_only_adds_rows_reuses_its_output(tiny, tmp_path):
    """Rows may be added to a finished run's recipe (only they run); a changed or removed row is another recipe."""
    from merging.output import check_recorded_recipe

    row = lambda floor: {"name": "c", "kind": "composed", "floor": floor}  # noqa: E731
    recipe, paths = load_recipe(write_recipe(tmp_path, tiny, variants=["base", row(-5.0)]))
    paths.output.mkdir()
    (paths.output / "recipe.yaml").write_text(recipe.to_yaml())
    check_recorded_recipe(paths.output, load_recipe(write_recipe(tmp_path, tiny, variants=["base", row(-5.0), "experts"]))[0])
    for variants in (["base"], ["base", row(-6.0), "experts"]):
        with pytest.raises(RecipeError, match=r"holds results of a different recipe"):
            check_recorded_recipe(paths.output, load_recipe(write_recipe(tmp_path, tiny, variants=variants))[0])


def test_a_recipe_that_adds_an_expert_reuses_its_output_and_runs_the_rows_it_changes(tiny, tmp_path, monkeypatch):
    """An expert may be added to a finished run's recipe: its row and the rows that combine every expert (no
    `experts:`) run, the others are reused; a changed or removed expert is another recipe."""
    import merging.runner as runner
    from merging.output import check_recorded_recipe

    calls = []
    real = runner.evaluate_variant
    monkeypatch.setattr(runner, "evaluate_variant", lambda v, *a: calls.append(v.name) or real(v, *a))
    a = {"path": str(tiny.adapters["a"]), "weight": 1.0}
    rows = ["base", "experts", {"name": "c", "kind": "composed"}, {"name": "ca", "kind": "composed", "experts": ["a"]}]
    runner.run_recipe(write_recipe(tmp_path, tiny, experts={"a": a}, variants=rows), echo=lambda *_: None)
    assert calls == ["base", "a", "c", "ca"]
    runner.run_recipe(write_recipe(tmp_path, tiny, experts={"a": a, "b": str(tiny.adapters["b"])}, variants=rows), echo=lambda *_: None)
    assert calls[4:] == ["b", "c"]
    out = tmp_path / "out"
    for experts in ({"a": a}, {"a": str(tiny.adapters["b"]), "b": str(tiny.adapters["b"])}):  # b removed; a changed
        with pytest.raises(RecipeError, match=r"holds results of a different recipe"):
            check_recorded_recipe(out, load_recipe(write_recipe(tmp_path, tiny, experts=experts, variants=rows))[0])


def test_another_recipe_written_before_the_lock_is_caught_under_it(tiny, tmp_path, monkeypatch):
    """Issue 30.4: the recorded-recipe check ran only before the lock (hub downloads in between), so two recipes
    on one output could interleave; it runs again once the lock is held."""
    import merging.runner as runner

    path = write_recipe(tmp_path, tiny, variants=["base"])
    recipe, paths = load_recipe(path)
    other = recipe.model_copy(update={"name": "other"}).to_yaml()
    real = runner.check_output

    def another_run_writes_meanwhile(p):  # after the first checks, before the lock: another recipe's run writes
        real(p)
        p.output.mkdir(exist_ok=True)
        (p.output / ".logitcomp.lock").write_text("pid 7 on elsewhere")
        (p.output / "recipe.yaml").write_text(other)

    monkeypatch.setattr(runner, "check_output", another_run_writes_meanwhile)
    with pytest.raises(RecipeError, match=r"holds results of a different recipe"):
        runner.run_recipe(path, echo=lambda *_: None)
    assert (paths.output / "recipe.yaml").read_text() == other and not (paths.output / "variants").exists()


def test_an_output_inside_the_include_path_does_not_make_every_row_run_again(tiny, tmp_path, monkeypatch):
    """Issue 30.6: `include_path: .` with `output: runs/r1` (a common layout) re-ran every row at every run: the run's
    own files changed the task folder's fingerprint."""
    import shutil

    import merging.runner as runner

    calls = []
    real = runner.evaluate_variant
    monkeypatch.setattr(runner, "evaluate_variant", lambda v, *a: calls.append(v.name) or real(v, *a))
    folder = tmp_path / "project"
    folder.mkdir()
    for name in ("toy_a2b_c2d.yaml", "a2b_c2d.jsonl", "utils.py"):
        shutil.copy(TASKS / "toy" / name, folder / name)
    recipe = {"name": "inside", "base": str(tiny.base), "experts": {"a": str(tiny.adapters["a"])}, "variants": ["base", "experts"],
              "evaluate": {"tasks": ["toy_a2b_c2d"], "include_path": ".", "limit": 2, "batch_size": 2}, "output": "runs/r1"}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    runner.run_recipe(path, echo=lambda *_: None)
    runner.run_recipe(path, echo=lambda *_: None)
    assert calls == ["base", "a"]  # the second run reused both rows
    (folder / "a2b_c2d.jsonl").write_text((folder / "a2b_c2d.jsonl").read_text())  # a task file touched: both run again
    runner.run_recipe(path, echo=lambda *_: None)
    assert calls == ["base", "a"] * 2


@pytest.mark.skipif(shutil.which("unshare") is None or subprocess.run(["unshare", "--mount", "--map-root-user", "true"]).returncode != 0,
                    reason="needs a private mount namespace (unshare) for a small tmpfs")
@pytest.mark.parametrize("kind", ["merged", "merged_lora"])
def test_a_full_disk_during_a_merge_is_one_line_and_leaves_nothing_half_written(tiny, tmp_path, kind):
    """Issue 30.7: a full disk while mergekit (or merge-as-LoRA) writes was a 15-45 line traceback, exit 1. Here the
    output folder is a 16 KiB tmpfs in a private mount namespace: the tiny merge does not fit in it."""
    path = write_recipe(tmp_path, tiny, variants=[kind], merge={"lora": True})
    out = tmp_path / "out"
    out.mkdir()
    script = 'mount -t tmpfs -o size=16k tmpfs "$1" || exit 99; "$2" -m merging.cli merge "$3"; rc=$?; ' \
             'echo "left: $(find "$1/models" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)"; exit $rc'
    command = cli_command()
    proc = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", script, "sh", str(out), sys.executable, str(path)],
                          capture_output=True, text=True, env=command["env"])
    assert proc.returncode == 2, proc.stderr
    row = kind
    assert proc.stderr.splitlines()[-1].startswith(f"logitcomp: error: variants: {row}: the disk is full writing its merged model into "), proc.stderr
    assert "MiB free); nothing was kept" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout.splitlines()[-1] == "left: 0"  # atomic_dir removed its partial folder


def test_outputs_lm_eval_could_not_write_whole_fail_the_row_and_keep_the_previous_ones(tiny, tmp_path, monkeypatch):
    """Issue 30.1: lm-eval's tracker logs a warning on a failed write (a full disk) and goes on; a --force rerun then
    exited 0 with a results JSON cut short and empty sample files, the previous good outputs deleted."""
    from lm_eval.loggers import EvaluationTracker

    import merging.runner as runner

    path = write_recipe(tmp_path, tiny, variants=["base"])
    runner.run_recipe(path, echo=lambda *_: None)
    out = tmp_path / "out"
    good = {p.relative_to(out): p.read_bytes() for p in (out / "lm_eval").rglob("*") if p.is_file()}
    record = (out / "variants" / "base.json").read_bytes()

    def full_disk(self, task_name, samples):  # what a failed write leaves: the file created, nothing in it
        folder = Path(self.output_path) / "model"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"samples_{task_name}_2026-01-01T00-00-00.000000.jsonl").write_bytes(b"")  # as lm-eval names it

    monkeypatch.setattr(EvaluationTracker, "save_results_samples", full_disk)
    with pytest.raises(OSError, match=r"^lm_eval/base: lm-eval did not write its outputs whole \(samples of toy_a2b_c2d: 0 of 4 records; "
                                      r"\d+ MiB free on that disk\); the previous outputs are kept$"):
        runner.run_recipe(path, force=True, echo=lambda *_: None)
    assert {p.relative_to(out): p.read_bytes() for p in (out / "lm_eval").rglob("*") if p.is_file()} == good
    assert (out / "variants" / "base.json").read_bytes() == record and not list(out.rglob("*partial*"))


def test_the_written_check_counts_each_tasks_own_samples_when_one_task_name_starts_another(tmp_path):
    """smol_math and smol_math_json: a glob samples_smol_math_* took both files, and a whole row was refused."""
    from merging.harness.evaluate import _check_written

    date = "2026-12-03T20-40-08.475553"
    (tmp_path / f"results_{date}.json").write_text("{}")
    (tmp_path / f"samples_smol_math_{date}.jsonl").write_text('{"a": 1}\n' * 3)
    (tmp_path / f"samples_smol_math_json_{date}.jsonl").write_text('{"a": 1}\n' * 2)
    _check_written(tmp_path, tmp_path / "row", {"smol_math": 3, "smol_math_json": 2})
    with pytest.raises(OSError, match=r"samples of smol_math_json: 2 of 5 records"):
        _check_written(tmp_path, tmp_path / "row", {"smol_math": 3, "smol_math_json": 5})
