"""Parameter-space merges with mergekit, in-process, never asking the hub.

Pitfalls handled here (measured with mergekit 0.1.5): every path is absolute (a relative or missing path
makes mergekit look on the hub); a `+` inside a path would break mergekit's `base+adapter` syntax;
LoRA experts need a LoRA merge cache, and mergekit's process-wide loader cache returns stale
weights when an adapter changes at the same path, so each call gets a fresh cache folder and the
loader cache is cleared.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from pathlib import Path

import yaml

from logitcomp.inputs import resolve
from logitcomp.io import atomic_dir
from logitcomp.weightfiles import check_finite


log = logging.getLogger(__name__)
CONFIG_NAME = "mergekit_config.yml"
COMMAND_NAME = "mergekit_command.sh"  # the `mergekit-yaml` command that rebuilds a merged folder from its config


class _DropTorchDtypeDeprecation(logging.Filter):
    """mergekit 0.1.5 sets `config.torch_dtype` on the merged model's config, which transformers 5 reports
    as deprecated at every merge; the line names nothing a user of this package can change."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("`torch_dtype` is deprecated")



def merge_methods() -> dict:
    """mergekit's registered merge methods by name."""
    from mergekit.merge_methods.registry import registered_methods

    return {m.spec.name: m for m in registered_methods()}


def mergekit_config(base, experts: dict, weights: dict | None = None, method: str = "task_arithmetic",
                    parameters: dict | None = None, dtype: str = "float32") -> dict:
    """The mergekit configuration of a merge, as a dict a user can save and give to `mergekit-yaml`.

    Args:
        base: the base model folder.
        experts: name -> folder of a peft LoRA adapter of the base (referenced as `base+adapter`)
            or of a full fine-tune.
        weights: name -> weight (1.0 for every expert left out), given to methods that take one.
        method: a mergekit merge method name.
        parameters: method-level parameters (e.g. `normalize`, `density`, `lambda`).
        dtype: mergekit's output dtype.

    Methods whose mergekit contract ignores the base (`linear`, `karcher`, `passthrough`) merge
    the experts alone; the others get `base_model`.

    Run it with `mergekit-yaml config.yml OUT --lora-merge-cache CACHE_DIR`: mergekit 0.1.5 refuses
    `base+adapter` references without a LoRA merge cache ("Need to specify cache dir to merge
    adapters"). The weights equal `task_arithmetic`'s (tested through the real CLI).

    Raises:
        ValueError: an unknown method (the valid names are listed), a bad path or weight.
    """
    methods = merge_methods()
    if method not in methods:
        raise ValueError(f"method: unknown merge method {method!r}; mergekit has {sorted(methods)}")
    base_path, resolved = resolve(base, experts, weights)
    for path in [base_path, *(e.path for e in resolved)]:
        if "+" in str(path):
            raise ValueError(f"{path}: mergekit cannot read a path holding '+'; move or link the folder")
    takes_weight = any(p.name == "weight" for p in methods[method].spec.parameters)
    models = []
    for e in resolved:
        entry = {"model": f"{base_path}+{e.path}" if e.kind == "lora" else str(e.path)}
        if takes_weight:
            entry["parameters"] = {"weight": e.weight}
        models.append(entry)
    config = {"merge_method": method, "models": models, "dtype": dtype}
    if methods[method].spec.contract.base.value != "ignored":  # e.g. linear averages the models alone
        config["base_model"] = str(base_path)
    if parameters:
        config["parameters"] = dict(parameters)
    return config


def mergekit_command(config: dict, random_seed: int = 0) -> str:
    """A shell script that rebuilds a merge with mergekit's own `mergekit-yaml` from the `mergekit_config.yml` beside
    it: `sh mergekit_command.sh OUT` (LoRA experts get the merge cache mergekit needs for them, beside OUT)."""
    lora = any("+" in m["model"] for m in config["models"])
    cache = ' --lora-merge-cache "$1.lora-cache"' if lora else ""
    return ("#!/bin/sh\n# Rebuild this merge with mergekit's own command: sh mergekit_command.sh OUT\n"
            f'set -e\n: "${{1:?usage: sh $0 OUT}}"\n'
            f'mergekit-yaml "$(dirname "$0")/{CONFIG_NAME}" "$1"{cache} --random-seed {random_seed} --no-write-model-card\n')


def task_arithmetic(base, experts: dict, out_dir, weights: dict | None = None, method: str = "task_arithmetic",
                    parameters: dict | None = None, *, device: str = "cpu", dtype: str = "float32", lora_cache=None,
                    options: dict | None = None) -> Path:
    """Merge experts into their base with mergekit and write a Hugging Face model folder.

    With the default method, θ = θ_b + Σ_i w_i · Δθ_i (for LoRA experts Δθ_i = s_i B_i A_i).
    The folder holds safetensors weights, config, tokenizer, `mergekit_config.yml` and `mergekit_command.sh` (the
    `mergekit-yaml` command that rebuilds it from that config).
    `lora_cache`: a folder where mergekit keeps each LoRA expert merged into the base, shared by
    several merges of the same, unchanged experts (a sweep); by default a fresh one per call.
    `options`: more of mergekit's MergeOptions (low_cpu_memory, out_shard_size, ...); `random_seed`
    defaults to 0, so that randomised methods (dare_ties) merge the same way at every call.

    Returns:
        The output folder (absolute).
    """
    from mergekit.config import MergeConfiguration
    from mergekit.io.tasks import LoaderCache
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    config = mergekit_config(base, experts, weights, method, parameters, dtype)
    try:
        merge_config = MergeConfiguration.model_validate(config)
    except Exception as exc:  # pydantic's message names the field
        raise ValueError(f"mergekit rejected the configuration: {str(exc).splitlines()[0]}") from exc
    out = Path(out_dir).expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    # the LoRA cache is a `.partial-` sibling of the output, like atomic_dir's own folder: a killed run's
    # leftovers lie beside the output (swept by the recipe runner's lock) rather than in /tmp forever
    fresh = tempfile.TemporaryDirectory(prefix=f".{out.name}.partial-lora-cache-", dir=out.parent) if lora_cache is None else None
    with atomic_dir(out) as tmp, fresh or contextlib.nullcontext(str(lora_cache)) as cache:
        LoaderCache().loaders.clear()  # a changed adapter at the same path must not be served stale
        settings = MergeOptions(**{"random_seed": 0, **(options or {}), "lora_merge_cache": cache, "write_model_card": False,
                                   "copy_tokenizer": True, "cuda": device.startswith("cuda"), "device": device, "quiet": True})
        transformers_config_log = logging.getLogger("transformers.configuration_utils")
        quiet = _DropTorchDtypeDeprecation()
        transformers_config_log.addFilter(quiet)
        try:
            run_merge(merge_config, str(tmp), settings)
        finally:
            transformers_config_log.removeFilter(quiet)
        LoaderCache().loaders.clear()
        try:  # NaN/inf in the base or a full expert shows up in the result (reading it back once is cheap)
            check_finite("merged", tmp)
        except ValueError as exc:
            raise ValueError(f"{exc.args[0].replace(str(tmp), str(out))} after merging; an input holds NaN or inf weights") from None
        (tmp / CONFIG_NAME).write_text(yaml.safe_dump(config, sort_keys=False))
        (tmp / COMMAND_NAME).write_text(mergekit_command(config, settings.random_seed))
    log.info("merged %d experts with %s into %s", len(experts), method, out)
    return out
