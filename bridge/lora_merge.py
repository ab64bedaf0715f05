"""Task arithmetic of LoRA experts written as one exact peft LoRA adapter.

peft's `add_weighted_adapter(combination_type="cat")` concatenates ranks: A = [w_i s_i A_i],
B = [B_i], so ΔW = Σ_i w_i s_i B_i A_i exactly (rank Σ r_i). It copies the first adapter's
config for the result; when that one uses rsLoRA the result's scale would be sqrt(Σr) instead of 1,
so the scale is reset here (the scales are already folded into A). peft unites the experts' target
modules and cannot unite a list with a regex, so each expert's target set is first written out as the
full names of the modules it holds LoRA on (what it targeted, whichever way it was written).
"""

from __future__ import annotations

import json
from pathlib import Path

from peft import PeftConfig, PeftModel
from peft.tuners.lora import LoraLayer
from transformers import AutoModelForCausalLM

from logitcomp.inputs import resolve
from logitcomp.io import atomic_dir
from logitcomp.loading import save_adapter


MERGED = "merged"


def _check_exact(name: str, path: Path) -> None:
    cfg = PeftConfig.from_pretrained(path)
    if getattr(cfg, "peft_type", None) is None or str(cfg.peft_type.value if hasattr(cfg.peft_type, "value") else cfg.peft_type) != "LORA":
        raise ValueError(f"expert {name!r}: {path} is a {cfg.peft_type} adapter; only LoRA merges exactly")
    for field, bad in (("use_dora", bool(getattr(cfg, "use_dora", False))), ("modules_to_save", bool(cfg.modules_to_save)),
                       ("bias", getattr(cfg, "bias", "none") != "none"), ("lora_bias", bool(getattr(cfg, "lora_bias", False)))):
        if bad:
            raise ValueError(f"expert {name!r}: {path} uses {field}={getattr(cfg, field)!r}, which a merged LoRA adapter cannot hold exactly")


def merge_as_lora(base, experts: dict, out_dir, weights: dict | None = None) -> Path:
    """Write Σ_i w_i ΔW_i of LoRA experts as one peft LoRA adapter of `base`.

    Loads with `PeftModel.from_pretrained(base_model, out_dir)`.

    Raises:
        ValueError: an expert that is not a LoRA adapter of `base`, or uses DoRA,
            `modules_to_save` or bias training.
    """
    base_path, resolved = resolve(base, experts, weights)
    for e in resolved:
        if e.kind != "lora":
            raise ValueError(f"expert {e.name!r}: {e.path} is a full model; merge_as_lora needs LoRA adapters (use task_arithmetic)")
        _check_exact(e.name, e.path)
    model = AutoModelForCausalLM.from_pretrained(base_path, use_safetensors=True)
    model = PeftModel.from_pretrained(model, resolved[0].path, adapter_name=resolved[0].name)
    for e in resolved[1:]:
        model.load_adapter(e.path, adapter_name=e.name)
    for e in resolved:  # explicit module names: a list and a regex unite exactly
        model.peft_config[e.name].target_modules = {name for name, module in model.base_model.model.named_modules()
                                                    if isinstance(module, LoraLayer) and e.name in module.lora_A}
    model.add_weighted_adapter([e.name for e in resolved], [e.weight for e in resolved], MERGED, combination_type="cat")
    model.peft_config[MERGED].use_rslora = False
    for module in model.modules():
        if isinstance(module, LoraLayer) and MERGED in module.scaling:
            module.scaling[MERGED] = 1.0  # lora_alpha = r: the weights and scales live in A
    out = Path(out_dir).expanduser().resolve()
    with atomic_dir(out) as tmp:
        save_adapter(model, MERGED, tmp, base=base_path)
        (tmp / "merge.json").write_text(json.dumps(
            {"method": "task_arithmetic (peft add_weighted_adapter, cat)", "base": str(base_path),
             "experts": {e.name: {"path": str(e.path), "weight": e.weight} for e in resolved}}, indent=2) + "\n")
    return out
