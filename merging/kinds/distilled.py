"""The `distilled` rows: a composed or routed row of the same recipe (the teacher) distilled into one LoRA adapter
of the base (`bridge.distill`), evaluated as a temporary adapter of the run's shared PeftModel, written to
OUTPUT/models/NAME (a plain peft adapter folder; with `merged: true` also the merged full model in its `merged/`).

    - {name: distilled, kind: distilled, teacher: composed, prompts: [experts, ../pool.jsonl], steps: 300}

`teacher`: a composed or routed row (a swept one by its row name, e.g. `composed[lambda=1.25]`). `prompts`: where
the unlabeled prompts come from, each item `experts` (each of the teacher's experts' example prompts, as a routed
row reads them), a JSONL file of {"prompt": ...} lines, or {task: NAME} (that task's documents: never a test task);
the first `limit` of each. The model folder is reused while the teacher row, the prompts (their text), the
settings and the base's and experts' files are unchanged; the teacher's targets alone while only the student's
settings changed. A row sweeps `lr`, `steps` or `rank` (choose with `select_on`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from .composed import ComposedKind, TaskPrompts, expert_prompts
from .kind import Kind, Options, Variant

EXPERTS = "experts"  # a `prompts:` item: each of the teacher's experts' example prompts
SWEEPS = ("lr", "steps", "rank")
TEACHER_KINDS = ("composed", "routed")  # rows that ComposedKind's model, input_files and tasks serve (routed subclasses it)
TEACHER = ComposedKind()
TEACHER_KEYS = ("max_new_tokens", "top_k", "sampled", "temperature", "teacher_batch_size", "seed")
STUDENT_KEYS = ("rank", "steps", "batch_size", "lr", "loss", "seed")

PromptItem = Annotated[str, Field(min_length=1)] | TaskPrompts


class DistilledOptions(Options):
    teacher: str
    prompts: list[PromptItem] = Field(default_factory=lambda: [EXPERTS], min_length=1)
    limit: int = Field(default=200, ge=1)  # the first `limit` prompts of each item
    max_new_tokens: int = Field(default=96, ge=1)
    top_k: int = Field(default=64, ge=1)  # teacher log-probs kept per position; the rest of the vocabulary is one bucket
    sampled: int = Field(default=0, ge=0)  # sampled completions per prompt besides the greedy one
    temperature: float = Field(default=1.0, gt=0, le=10, allow_inf_nan=False)
    teacher_batch_size: int = Field(default=8, ge=1)
    loss: Literal["kl", "ce"] = "kl"
    rank: int | None = Field(default=None, ge=1)  # default: Σ of the teacher's LoRA experts' ranks (merge-as-LoRA's rank)
    steps: int = Field(default=200, ge=1)
    batch_size: int = Field(default=8, ge=1)
    lr: float = Field(default=5e-4, gt=0, le=1, allow_inf_nan=False)
    seed: int = 0
    merged: bool = False  # also write the adapter merged into the base (models/NAME/merged)


class DistilledKind(Kind):
    name = "distilled"
    options = DistilledOptions

    def check_sweep(self, key: str) -> str | None:
        return None if key in SWEEPS else f"sweep: a distilled variant sweeps {', '.join(SWEEPS)}, got {key!r}"

    def row(self, row: Variant, spec, recipe) -> Variant:
        o = spec.options.model_dump()
        if row.swept:
            key, value = row.swept
            o[key] = int(value) if key in ("steps", "rank") else value
            if key in ("steps", "rank") and (value != int(value) or value < 1):
                raise ValueError(f"sweep: {key} takes whole numbers of at least 1, got {value:g}")
        teacher = _teacher(o["teacher"], spec, recipe)
        return replace(row, experts=teacher.experts, weights={}, parameters={
            "teacher": teacher, "prompts": [p if isinstance(p, str) else dict(p) for p in o["prompts"]], "limit": o["limit"],
            "teacher_settings": {k: o[k] for k in TEACHER_KEYS}, "student": {k: o[k] for k in STUDENT_KEYS}, "merged": o["merged"]})

    def check(self, rows: list[Variant], recipe, paths) -> None:
        from logitcomp.inputs import expert_kind
        from logitcomp.prompts import read_prompts

        for row in rows:
            teacher = row.parameters["teacher"]
            if not any(expert_kind(n, paths.experts[n]) == "lora" for n in teacher.experts):
                raise ValueError(f"variants: {row.family or row.name}: teacher: {teacher.name!r} composes no LoRA expert; "
                                 "the student is a LoRA adapter on their target modules")
            for field, path in self.input_files(row, paths).items():
                read_prompts(f"variants: {row.family or row.name}: {field}", path)

    def input_files(self, row: Variant, paths) -> dict[str, Path]:
        files = {}
        for label, source in _sources(row, paths):
            if isinstance(source, Path):
                files[f"prompts: {label}"] = source
        return files | _teacher_kind(row).input_files(row.parameters["teacher"], paths)

    def tasks(self, row: Variant) -> list[str]:
        own = [p["task"] for p in row.parameters["prompts"] if isinstance(p, dict)]
        return [*_teacher_kind(row).tasks(row.parameters["teacher"]), *own]

    # ---- models -------------------------------------------------------------------------------
    @contextmanager
    def model(self, row: Variant, pool):
        from logitcomp.weightfiles import check_finite

        folder = self.trained(row, pool)
        check_finite(row.name, folder)
        with pool.adapter(row.name, folder) as peft:
            yield peft

    def export(self, row: Variant, pool, out: Path, self_contained: bool = False) -> None:
        folder = self.trained(row, pool)
        for item in folder.iterdir():
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, out / item.name)

    def describe(self, row: Variant, model, pool, outputs: Path) -> dict:
        record = json.loads((pool.paths.output / "models" / row.name / "distill.json").read_text())
        keep = ("teacher", "prompts", "sequences", "completion_tokens", "ended", "kept_mass", "train_loss", "teacher_seconds", "train_seconds", "peak_rss_mib")
        return {"distilled": {k: record[k] for k in keep if k in record}}

    def trained(self, row: Variant, pool) -> Path:
        """OUTPUT/models/NAME, distilled now unless its record says it was made from these inputs."""
        from bridge.distill import RECORD_FILE, TARGETS_FILE, StudentSettings, TeacherSettings, TeacherTargets, distill

        p, paths = row.parameters, pool.paths
        teacher = p["teacher"]
        folder = paths.output / "models" / row.name
        prompts = [q for label, source in _sources(row, paths) for q in pool.example_prompts(f"prompts: {label}", source, p["limit"])]
        files = {"base": pool.state(paths.base), **{n: pool.state(Path(paths.experts[n])) for n in teacher.experts}}
        made_from = {"teacher": repr(teacher), "prompts": hashlib.sha256(json.dumps(prompts).encode()).hexdigest(),
                     "teacher_settings": p["teacher_settings"], "files": files}
        inputs = {**made_from, "student": p["student"], "merged": p["merged"]}
        record = json.loads((folder / RECORD_FILE).read_text()) if (folder / RECORD_FILE).exists() else {}
        if record.get("inputs") == inputs:
            return folder
        key = json.dumps(made_from, sort_keys=True)
        if key not in pool.targets and record.get("made_from") == made_from and (folder / "teacher" / TARGETS_FILE).exists():
            pool.targets[key] = TeacherTargets.load(folder / "teacher" / TARGETS_FILE)
        ts = {**p["teacher_settings"]}
        ts["batch_size"] = ts.pop("teacher_batch_size")
        lora = [Path(paths.experts[n]) for n in teacher.experts if n in pool.lora]  # check() refused a teacher without one
        student = {**p["student"], "rank": p["student"]["rank"] or sum(json.loads((f / "adapter_config.json").read_text())["r"] for f in lora)}
        with _teacher_kind(row).model(teacher, pool) if key not in pool.targets else nullcontext() as model:
            distill(model, pool.tokenizer(), paths.base, prompts, lora, folder, TeacherSettings(**ts), StudentSettings(**student),
                    p["merged"], pool.targets.get(key), {"teacher": teacher.name, "inputs": inputs, "made_from": made_from})
        if key not in pool.targets:
            pool.targets[key] = TeacherTargets.load(folder / "teacher" / TARGETS_FILE)
        return folder


def _teacher_kind(row: Variant) -> ComposedKind:
    """What builds a teacher row's model, its inputs and tasks: the composed kind's (a routed row's route is in the row)."""
    return TEACHER


def _teacher(name: str, spec, recipe) -> Variant:
    """The recipe's composed or routed row named `name` (planned by its own kind)."""
    found = []
    for item in recipe.variants:
        other = type(spec).shorthand(item) if isinstance(item, str) else item
        if other.kind == DistilledKind.name:
            continue
        for planned in other.rows(recipe):
            if planned.name == name:
                found.append(planned)
            elif planned.family == name:
                raise ValueError(f"teacher: {name!r} is a swept family; name one of its rows, e.g. {planned.name!r}")
    if not found:
        raise ValueError(f"teacher: expected a composed or routed row of this recipe, got {name!r}")
    if found[0].kind not in TEACHER_KINDS:
        raise ValueError(f"teacher: {name!r} is a {found[0].kind} row; a teacher is a composed or routed row")
    return found[0]


def _sources(row: Variant, paths) -> list[tuple[str, object]]:
    """(label, source) of each prompt source: a file's Path, a list, or {"task": NAME}."""
    out = []
    for item in row.parameters["prompts"]:
        if item == EXPERTS:
            out += [(f"experts ({name})", source) for name, source in expert_prompts(row.experts, paths).items()]
        elif isinstance(item, str):
            out.append((item, (paths.root / item).resolve()))
        else:
            out.append((f"task {item['task']}", item))
    return out
