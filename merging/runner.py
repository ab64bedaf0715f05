"""Run a recipe: evaluate base, experts, composed and merged models with identical lm-eval task configs.

Output folder layout:
    recipe.yaml                 the recipe that made everything here (a different recipe is refused)
    variants/<variant>.json     one finished variant (a re-run skips it unless --force)
    lm_eval/<variant>/          lm-eval's own aggregated results and per-sample outputs
    models/merged, models/merged_lora
    results.json, report.md, report.png
"""

from __future__ import annotations

import difflib
import json
import logging
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from tqdm.auto import tqdm

from logitcomp.io import atomic_dir, atomic_write_bytes
from logitcomp.loading import LoadOptions, check_safetensors, check_adapter_base, expert_kind

from .recipe import Recipe, RecipeError, ResolvedPaths, load_recipe
from .report import markdown_table, write_reports

log = logging.getLogger(__name__)


class _DropWarnings(logging.Filter):
    """Drops lm-eval warnings about what the runner does on purpose: HFLM warns on every in-memory
    model (the runner loads each variant once), and every `custom_dataset` task (how the shipped
    tasks read their jsonl beside the YAML) advises `--metadata` at every load."""

    PREFIXES = ("`pretrained` model kwarg is not of type", "Passed an already-initialized model")

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith(self.PREFIXES) or "Custom kwargs can be passed to `--metadata`" in msg)


for _name in ("lm_eval.models.huggingface", "lm_eval.api.task"):
    logging.getLogger(_name).addFilter(_DropWarnings())


@dataclass(frozen=True)
class Variant:
    """One row of the comparison: `kind` is base, expert, composed, merged or merged_lora."""

    name: str
    kind: str


def plan(recipe: Recipe) -> list[Variant]:
    rows = []
    for v in recipe.variants:
        rows += [Variant(n, "expert") for n in recipe.experts] if v == "experts" else [Variant(v, v)]
    return rows


def check_inputs(recipe: Recipe, paths: ResolvedPaths, check_tasks: bool = True) -> None:
    """Everything that can be checked without loading a model. Raises RecipeError naming the field."""
    import bridge

    local_base = not isinstance(paths.base, str)
    if local_base and not (paths.base / "config.json").is_file():
        raise RecipeError(f"base: {paths.base} is not a model folder (no config.json)")
    try:
        if local_base:
            check_safetensors("base", paths.base, recipe.allow_pickle)
        for name, path in paths.experts.items():
            if isinstance(path, str):
                log.info("experts.%s: %s is a hub reference, not checked offline", name, path)
                continue
            if not path.exists():
                raise ValueError(f"experts.{name}: {path} does not exist")
            if expert_kind(name, path) == "lora" and local_base:
                check_adapter_base(name, path, paths.base)
            check_safetensors(f"experts.{name}", path, recipe.allow_pickle)
    except ValueError as exc:
        raise RecipeError(str(exc)) from None
    if any(v in recipe.variants for v in ("merged", "merged_lora")):
        methods = bridge.merge_methods()
        if recipe.merge.method not in methods:
            raise RecipeError(f"merge.method: unknown merge method {recipe.merge.method!r}; mergekit has {sorted(methods)}")
    if not check_tasks:
        return
    manager = task_manager(paths)
    known = set(manager.all_tasks)
    for task in recipe.evaluate.tasks:
        if task not in known:
            near = difflib.get_close_matches(task, sorted(known), n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise RecipeError(f"evaluate.tasks: unknown lm-eval task {task!r}{hint}")
    if recipe.evaluate.confirm_run_unsafe_code:
        from .smol.sandbox import check_opt_in

        try:
            check_opt_in()  # fail now, not after the first variant's generations
        except PermissionError as exc:
            raise RecipeError(f"evaluate.confirm_run_unsafe_code: {exc}") from None


def task_manager(paths: ResolvedPaths):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(paths.include_path) if paths.include_path else None)


def composition_config(recipe: Recipe):
    from logitcomp import CompositionConfig

    return CompositionConfig(weights={n: e.weight for n, e in recipe.experts.items()}, floor=recipe.compose.floor,
                             eos_policy=recipe.compose.eos_policy, masks=dict(recipe.compose.masks))


def load_composed(recipe: Recipe, paths: ResolvedPaths):
    """The recipe's composed model."""
    from logitcomp import ComposedModelForCausalLM

    ev = recipe.evaluate
    return ComposedModelForCausalLM.from_experts(paths.base, paths.experts, config=composition_config(recipe),
                                                 dtype=None if ev.dtype == "auto" else ev.dtype, device=ev.device,
                                                 allow_pickle=recipe.allow_pickle, trust_remote_code=recipe.trust_remote_code)


def build_merges(recipe: Recipe, paths: ResolvedPaths, kinds=("merged", "merged_lora")) -> dict[str, Path]:
    """Build the recipe's parameter-space models into OUTPUT/models (mergekit and merge-as-LoRA)."""
    import bridge

    weights = {n: e.weight for n, e in recipe.experts.items()}
    built = {}
    if "merged" in kinds:
        built["merged"] = bridge.task_arithmetic(paths.base, paths.experts, paths.output / "models" / "merged", weights,
                                                 recipe.merge.method, recipe.merge.parameters, device=recipe.evaluate.device)
    if "merged_lora" in kinds and recipe.merge.lora:
        built["merged_lora"] = bridge.merge_as_lora(paths.base, paths.experts, paths.output / "models" / "merged_lora", weights)
    return built


def _lm(variant: Variant, recipe: Recipe, paths: ResolvedPaths):
    """The lm-eval model of one variant."""
    from lm_eval.models.huggingface import HFLM
    from peft import PeftModel
    from transformers import AutoTokenizer

    from logitcomp.loading import load_model

    from .harness import LogitcompLM

    ev = recipe.evaluate
    options = LoadOptions(None if ev.dtype == "auto" else ev.dtype, ev.device, recipe.allow_pickle, recipe.trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(paths.base, trust_remote_code=recipe.trust_remote_code)
    if variant.kind == "composed":
        return LogitcompLM(pretrained=load_composed(recipe, paths), tokenizer=tokenizer, batch_size=ev.batch_size)
    if variant.kind == "base":
        model = load_model("base", paths.base, options)
    elif variant.kind == "expert":
        path = paths.experts[variant.name]
        if expert_kind(variant.name, path) == "lora":
            model = PeftModel.from_pretrained(load_model("base", paths.base, options), path)
        else:
            model = load_model(f"experts.{variant.name}", path, options)
    elif variant.kind == "merged":
        model = load_model("merged", build_merges(recipe, paths, ("merged",))["merged"], options)
    else:
        out = build_merges(recipe, paths, ("merged_lora",))["merged_lora"]
        model = PeftModel.from_pretrained(load_model("base", paths.base, options), out)
    return HFLM(pretrained=model.eval(), tokenizer=tokenizer, batch_size=ev.batch_size)


def evaluate_variant(variant: Variant, recipe: Recipe, paths: ResolvedPaths) -> dict:
    """Run lm-eval on one variant; write lm-eval's outputs; return {task: metrics}."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    ev = recipe.evaluate
    start = time.perf_counter()
    lm = _lm(variant, recipe, paths)
    results = simple_evaluate(model=lm, tasks=list(ev.tasks), task_manager=task_manager(paths), limit=ev.limit,
                              num_fewshot=ev.num_fewshot, gen_kwargs=dict(ev.gen_kwargs) or None, log_samples=True,
                              confirm_run_unsafe_code=ev.confirm_run_unsafe_code)
    samples = results.pop("samples")
    with atomic_dir(paths.output / "lm_eval" / variant.name) as tmp:  # replaces an earlier run's outputs whole
        tracker = EvaluationTracker(output_path=str(tmp))
        tracker.save_results_aggregated(results=results, samples=samples)
        for task in results["configs"]:
            tracker.save_results_samples(task_name=task, samples=samples[task])
    metrics = {t: {k: v for k, v in m.items() if k != "alias"} for t, m in results["results"].items()}
    return {"metrics": metrics, "seconds": round(time.perf_counter() - start, 1)}


def run_recipe(recipe_path, force: bool = False, dry_run: bool = False, echo=print) -> dict | None:
    """Evaluate every variant of a recipe and write the reports. Returns the results (None on a dry run)."""
    recipe, paths = load_recipe(recipe_path)
    out = paths.output
    recorded = out / "recipe.yaml"
    if recorded.exists() and recorded.read_text() != recipe.to_yaml() and not force:
        raise RecipeError(f"output: {out} holds results of a different recipe; choose another output or pass --force")
    check_inputs(recipe, paths)
    variants = plan(recipe)
    if dry_run:
        echo(f"recipe {recipe.name}: {len(variants)} variants x {len(recipe.evaluate.tasks)} tasks -> {out}")
        for v in variants:
            done = (out / "variants" / f"{v.name}.json").exists() and not force
            echo(f"  {v.name:<14} {v.kind:<12} {'done, skipped' if done else 'to run'}")
        return None
    paths.fetch()
    atomic_write_bytes(recorded, recipe.to_yaml().encode())
    results, timings = {}, {}
    for v in tqdm(variants, desc=f"recipe {recipe.name}", unit="variant"):
        done = out / "variants" / f"{v.name}.json"
        if done.exists() and not force:
            record = json.loads(done.read_text())
        else:
            record = evaluate_variant(v, recipe, paths)
            atomic_write_bytes(done, (json.dumps(record, indent=2) + "\n").encode())
        results[v.name], timings[v.name] = record["metrics"], record["seconds"]
    packages = {p: version(p) for p in ("logitcomp", "torch", "transformers", "peft", "mergekit", "lm_eval")}
    meta = {"recipe": recipe.model_dump(mode="json"), "versions": packages, "seconds": timings}
    write_reports(out, recipe.name, results, list(recipe.evaluate.tasks), meta)
    echo(markdown_table(results, list(recipe.evaluate.tasks)))
    return results
