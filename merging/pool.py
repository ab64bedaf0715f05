"""`ModelPool`: the models a run's rows are built from, the base loaded once per run.

The pool holds the run's base model and wraps it, at the first LoRA row, in one PeftModel that
holds every LoRA expert; temporary adapters (a merged_lora row's) join it for one row. Each kind
(`merging.kinds`) builds its rows' models from these pieces. Full-model experts and merged models
are loaded per row and dropped after it. Nothing here imports torch until a model is built.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path

from logitcomp.inputs import expert_kind
from logitcomp.io import free_mib

from .harness.distributed import broadcast, local_device, world
from .kinds import Kind, Variant


class ModelPool:
    """The models of one run's rows. Its inputs are those `checks.check_inputs` has checked (adapter
    files scanned for NaN/inf included); `lora_cache` is the folder mergekit keeps LoRA experts merged
    into the base in, shared by the run's merges."""

    def __init__(self, recipe, paths, lora_cache: Path | None = None):
        from logitcomp.loading import LoadOptions

        self.recipe, self.paths, self.lora_cache = recipe, paths, lora_cache
        ev = recipe.evaluate
        self.options = LoadOptions(None if ev.dtype == "auto" else ev.dtype, local_device(ev.device), recipe.allow_pickle,
                                   recipe.trust_remote_code)
        self.lora = [n for n, p in paths.experts.items() if expert_kind(n, p) == "lora"]  # LoRA experts by name
        self._base = self._peft = None
        self._prompt_states = {}  # (prompt sources, limit, pool) -> each expert's routing prompts' hidden states
        self._task_states = {}  # validation task -> its prompts' token states
        self._tokenizer = None
        self.fits = {}  # row name -> what its routing fitted in this run (logitcomp.routing_fit.fit), or None
        self.targets = {}  # a distilled row's teacher inputs -> the teacher's targets (bridge.distill.TeacherTargets)

    def base(self):
        """The base model (loaded at the first call)."""
        if self._base is None:
            self._base = self.load("base", self.paths.base)
        return self._base

    def peft(self):
        """The PeftModel holding every LoRA expert (None when the recipe has none and no temporary adapter came yet)."""
        for name in self.lora:
            if self._peft is None or name not in self._peft.peft_config:
                self._attach(name, self.paths.experts[name], f"experts.{name}")
        return self._peft

    def full_expert(self, name: str):
        """A full-model expert, loaded for the caller, its vocabulary checked against the base's."""
        from logitcomp.loading import check_same_vocabulary

        model = self.load(f"experts.{name}", self.paths.experts[name])
        check_same_vocabulary(name, self.paths.experts[name], self.paths.base, model, self.base())
        return model

    def prompt_states(self, sources: dict, limit: int, pool: str = "mean") -> dict:
        """Expert -> what its routing is fitted on (`logitcomp.routing.expert_prompt_states` of the base: the first
        `limit` of its example prompts, their mean hidden states or with `pool` "max" their tokens'), computed once
        per run for each set of sources (`merging.kinds.composed.prompt_sources`)."""
        from logitcomp.routing import expert_prompt_states

        key = (repr(sorted(sources.items())), limit, pool)
        if key not in self._prompt_states:
            prompts = {n: self.example_prompts(f"the example prompts of {n}", s, limit) for n, s in sources.items()}
            with self._base_only():
                self._prompt_states[key] = expert_prompt_states(self.base(), self.tokenizer(), prompts, self.recipe.evaluate.batch_size, pool)
        return self._prompt_states[key]

    def example_prompts(self, label: str, source, limit: int) -> list[str]:
        """An expert's example prompts from a source: a JSONL file, a list, or {"task": NAME} (its documents' prompts)."""
        from logitcomp.prompts import as_prompts

        from .harness.evaluate import task_prompts

        if isinstance(source, dict):
            return task_prompts(source["task"], self.paths.include_paths, ("training", "validation", "test"))[:limit]
        return as_prompts(label, source, limit)

    def task_states(self, task: str) -> list:
        """The token states (a list of (T_i, d)) of a validation task's prompts (lm-eval's contexts) under the base."""
        from logitcomp.routing import prompt_tokens

        from .harness.evaluate import task_prompts

        if task not in self._task_states:
            prompts = task_prompts(task, self.paths.include_paths, ("validation", "test"))
            with self._base_only():
                self._task_states[task] = prompt_tokens(self.base(), self.tokenizer(), prompts, self.recipe.evaluate.batch_size)
        return self._task_states[task]

    def kept_sets(self, routing: dict, experts: list[str], contexts: list[str]) -> dict[str, float]:
        """The share of these prompts (lm-eval's contexts) whose gates keep each set of experts (`a+b`; `none`)."""
        from collections import Counter

        from logitcomp.routing import prompt_tokens
        from logitcomp.routing_fit import prompt_gates

        with self._base_only():
            tokens = prompt_tokens(self.base(), self.tokenizer(), contexts, self.recipe.evaluate.batch_size)
        kept = prompt_gates(routing, experts, tokens) > 0  # (n, k)
        counts = Counter("+".join(e for e, k in zip(experts, row) if k) or "none" for row in kept.tolist())
        return {name: round(count / len(contexts), 4) for name, count in counts.most_common()}

    def state(self, folder: Path) -> dict:
        """Every file's size and mtime under `folder` (`output.folder_state`): what a model built from it was made from."""
        from .output import folder_state

        return folder_state(Path(folder))

    def tokenizer(self):
        from transformers import AutoTokenizer

        if self._tokenizer is None:
            self._tokenizer = AutoTokenizer.from_pretrained(self.paths.base, trust_remote_code=self.recipe.trust_remote_code)
        return self._tokenizer

    @contextlib.contextmanager
    def _base_only(self):
        """The base's own hidden states: the shared PeftModel's adapters disabled, for this context."""
        import torch

        with self._peft.disable_adapter() if self._peft is not None else contextlib.nullcontext(), torch.no_grad():
            yield

    def load(self, label: str, path: Path):
        """A model folder loaded with the run's dtype, device and opt-ins (`label` names it in errors)."""
        from logitcomp.loading import load_model

        return load_model(label, path, self.options)

    def merge(self, kind: Kind, row: Variant) -> Path:
        """The row's model folder built by its kind; by rank 0 alone under a launcher (the others wait for its folder)."""
        return broadcast(build_row(kind, row, self.recipe, self.paths, self.lora_cache) if world()[0] == 0 else None)

    @contextlib.contextmanager
    def adapter(self, label: str, path: Path) -> Iterator:
        """The shared PeftModel with the adapter at `path` active, for this context only."""
        adapter = f"row_{len(self._peft.peft_config) if self._peft else 0}"  # peft names cannot hold '.' or '['
        self._attach(adapter, path, label)
        try:
            self._peft.set_adapter(adapter)
            yield self._peft
        finally:  # (peft warns when the active adapter is deleted: activate another first)
            others = [a for a in self._peft.peft_config if a != adapter]
            if others:
                self._peft.set_adapter(others[0])
                self._peft.delete_adapter(adapter)

    def _attach(self, adapter: str, path: Path, label: str) -> None:
        """Load one adapter into the shared PeftModel (made around the base at the first one)."""
        from logitcomp.loading import attach_lora

        try:
            self._peft = attach_lora(self._peft or self.base(), adapter, path, self.paths.base, self.options)
        except ValueError as exc:
            raise ValueError(f"{label}: {exc}") from None


def build_row(kind: Kind, row: Variant, recipe, paths, lora_cache: Path | None = None) -> Path:
    """`kind.build`, with a full disk as one line. mergekit and safetensors report it in their own ways
    (safetensors: an `IoError(Os { code: 28 ... })` inside its SafetensorError); the folder is written
    through `atomic_dir`, so nothing half-written is left.

    Raises:
        OSError: naming the row, the folder and the space left, when the disk (or a quota) is full.
    """
    try:
        return kind.build(row, recipe, paths, lora_cache)
    except Exception as exc:
        if not _no_space(exc):
            raise
        folder = paths.output / "models" / row.name
        raise OSError(f"variants: {row.name}: the disk is full writing its merged model into {folder} ({free_mib(folder):.0f} MiB free); "
                      "nothing was kept; free some space and run again") from None


def _no_space(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it came from, is a full disk or quota."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc) or "StorageFull" in str(exc) or "Disk quota exceeded" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
