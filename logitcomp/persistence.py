"""Building, saving and restoring a `ComposedModelForCausalLM` from folders.

A saved composition is a folder whose `composition.json` names the base, the experts and every
composition option, like peft's `adapter_config.json` names its base. LoRA adapters are copied
in; the base and full-model experts are referenced by absolute path (they can be gigabytes).
The model class is passed in (`cls`) so that this module does not import it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from .config import CompositionConfig
from .inputs import check_name, resolve
from .io import atomic_dir, atomic_write_bytes
from .loading import LoadOptions, attach_lora, check_same_vocabulary, load_model, save_adapter

FORMAT = "logitcomp.composition/1"


def from_experts(cls, base_path, experts: dict, weights: dict | None, config: CompositionConfig | None, options: LoadOptions):
    """Check the folders (`inputs.resolve`), load the base with its LoRA experts and the full-model experts, compose.

    Raises:
        ValueError: naming the expert, weight or folder that cannot be composed.
    """
    config = copy.deepcopy(config or CompositionConfig())
    if weights is not None:
        config = config.with_weights(weights)
    base_path, checked = resolve(base_path, experts, config.weights, allow_pickle=options.allow_pickle)
    model = load_model("base", base_path, options)
    full, full_paths = {}, {}
    for e in checked:
        if e.kind == "lora":
            model = attach_lora(model, e.name, e.path, base_path, options)
        else:
            full[e.name] = load_model(f"expert {e.name!r}", e.path, options)
            check_same_vocabulary(e.name, e.path, base_path, full[e.name], model)
            full_paths[e.name] = str(e.path)
    return cls(model, [e.name for e in checked], full, config, {"base": str(base_path), "full": full_paths})


def save(composed, save_directory) -> Path:
    """Write `composition.json` and the LoRA adapters (copied into `experts/`) into a folder.

    Like transformers and peft, it writes beside whatever the folder holds and deletes nothing it
    did not write: only an earlier composition's `experts/` and `composition.json` are replaced
    (the adapters first, atomically as one folder, then the JSON, atomically).

    Raises:
        ValueError: the composition was not built from a local base folder; an expert name that is
            not a safe folder name; the folder holds an `experts/` that no composition wrote.
    """
    out = Path(save_directory).resolve()
    base = composed.sources.get("base")  # absolute, recorded when the composition was built
    if not base or not Path(base).is_dir():
        raise ValueError(f"base: the composition does not know its base folder (got {base!r}); load it from a local folder")
    for name in composed.experts:
        check_name(name)
    if (out / "experts").exists() and not (out / "composition.json").is_file():
        raise ValueError(f"{out}: holds an experts/ folder that no composition wrote; choose another folder")
    experts = {}
    with atomic_dir(out / "experts") as tmp:
        for name in composed.experts:
            if name in composed.full_experts:
                experts[name] = {"kind": "full", "path": str(Path(composed.sources["full"][name]).resolve())}
                continue
            save_adapter(composed.model, name, tmp / name)
            experts[name] = {"kind": "lora", "path": f"experts/{name}"}
    meta = {"format": FORMAT, "base": str(Path(base).resolve()), "experts": experts, "composition": composed.composition.to_dict()}
    atomic_write_bytes(out / "composition.json", (json.dumps(meta, indent=2) + "\n").encode())
    return out


def load(cls, directory, options: LoadOptions):
    """Restore a composition written by `save`.

    Raises:
        ValueError: no composition.json, or one of another format.
    """
    directory = Path(directory)
    path = directory / "composition.json"
    if not path.is_file():
        raise ValueError(f"{directory}: no composition.json; expected a folder written by save_pretrained")
    meta = json.loads(path.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: format {meta.get('format')!r} is not {FORMAT!r}")
    paths = {n: (directory / e["path"]) if e["kind"] == "lora" else Path(e["path"]) for n, e in meta["experts"].items()}
    return from_experts(cls, meta["base"], paths, None, CompositionConfig(**meta["composition"]), options)
