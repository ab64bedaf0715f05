"""Load a base and its experts from folders checked by `logitcomp.inputs`.

An expert folder is either a peft LoRA adapter (`adapter_config.json`) of the base, loaded into
the base's PeftModel, or a full model (`config.json`) that shares the base's vocabulary.
Weights load from safetensors; pickled weights and remote code need an explicit opt-in.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from .inputs import check_safetensors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadOptions:
    """How models are read from disk."""

    dtype: torch.dtype | None = None
    device: str | torch.device | None = None
    allow_pickle: bool = False
    trust_remote_code: bool = False
    device_map: str | dict | None = None  # accelerate's placement ("auto": across the GPUs, then the CPU)

    @classmethod
    def of(cls, *, dtype=None, device=None, allow_pickle: bool = False, trust_remote_code: bool = False, torch_dtype=None,
           device_map=None, local_files_only: bool = False) -> LoadOptions:
        """The loading keywords `from_experts` and `from_pretrained` take (`torch_dtype`: transformers' older name of
        `dtype`; `local_files_only`: every folder here is local). Raises ValueError on a contradiction."""
        if dtype is not None and torch_dtype is not None and dtype != torch_dtype:
            raise ValueError(f"dtype: got dtype={dtype} and torch_dtype={torch_dtype}; pass one")
        if device_map is not None and device is not None:
            raise ValueError(f"device: pass device={device!r} or device_map, not both")
        return cls(dtype if dtype is not None else torch_dtype, device, allow_pickle, trust_remote_code, device_map)


def refuse_unknown(method: str, kwargs: dict) -> None:
    """Raise TypeError naming the first keyword a composed model's `method` does not take."""
    if kwargs:
        raise TypeError(f"{method}: unsupported argument {next(iter(kwargs))!r} for a composed model")


def load_model(label: str, path: Path, options: LoadOptions):
    """A causal LM from a folder, safetensors unless `allow_pickle`."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"{label}: {path} is not a model folder (no config.json)")
    check_safetensors(label, path, options.allow_pickle)
    model = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=options.dtype,
        use_safetensors=None if options.allow_pickle else True,
        trust_remote_code=options.trust_remote_code,
        device_map=options.device_map,
    )
    check_finite_parameters(label, path, model)
    return model.to(options.device) if options.device is not None and options.device_map is None else model


@torch.no_grad()
def check_finite_parameters(label: str, path: Path, model) -> None:
    """Refuse a loaded model holding NaN or ±inf: it composes or merges into garbage without any error.
    (Adapter files are scanned before loading: `weightfiles.check_finite`.)"""
    for name, tensor in model.named_parameters():
        # in chunks: isfinite builds temporaries of the tensor's size (a 256k x 2304 embedding: GBs)
        chunks = tensor.detach().reshape(-1).split(1 << 20) if tensor.is_floating_point() else ()
        if not all(torch.isfinite(chunk).all() for chunk in chunks):
            raise ValueError(f"{label}: {path} has NaN or inf in {name}")


def attach_lora(model, name: str, adapter_dir: Path, base_dir: Path, options: LoadOptions):
    """Load adapter `name` (checked by `inputs.resolve`) into `model` (a PeftModel after the first). Returns the PeftModel."""
    try:
        if isinstance(model, PeftModel):
            model.load_adapter(adapter_dir, adapter_name=name, is_trainable=False)
            return model
        return PeftModel.from_pretrained(model, adapter_dir, adapter_name=name, is_trainable=False)
    except RuntimeError as exc:  # torch's "size mismatch for ..." when the shapes disagree
        first = str(exc).strip().splitlines()
        raise ValueError(f"expert {name!r}: {adapter_dir} does not fit the base {base_dir} ({first[-1] if first else exc})") from exc


def check_same_vocabulary(name: str, expert_dir: Path, base_dir: Path, expert_model, base_model) -> None:
    """Refuse a full-model expert whose vocabulary differs from the base's."""
    v_expert, v_base = expert_model.config.get_text_config().vocab_size, base_model.config.get_text_config().vocab_size
    if v_expert != v_base:
        raise ValueError(f"expert {name!r}: {expert_dir} has a vocabulary of {v_expert} tokens, the base {v_base}")
    if (expert_dir / "tokenizer.json").is_file() or (expert_dir / "tokenizer_config.json").is_file():
        if AutoTokenizer.from_pretrained(expert_dir).get_vocab() != AutoTokenizer.from_pretrained(base_dir).get_vocab():
            raise ValueError(f"expert {name!r}: {expert_dir} has another tokenizer vocabulary than the base {base_dir}")


def save_adapter(model: PeftModel, adapter: str, dest: Path, base: Path | None = None) -> Path:
    """Write one adapter of a PeftModel as a plain adapter folder `dest` (files at its top level).

    peft writes a non-default adapter into a subfolder named after it; this hides that. With
    `base`, adapter_config.json records that folder as the base (peft records wherever the base
    was loaded from, e.g. a build's temporary folder).
    """
    dest = Path(dest)
    with tempfile.TemporaryDirectory(dir=dest.parent if dest.parent.exists() else None) as tmp:
        model.save_pretrained(tmp, selected_adapters=[adapter])
        saved = Path(tmp) / adapter if adapter != "default" else Path(tmp)
        dest.mkdir(parents=True, exist_ok=True)
        for item in saved.iterdir():
            if item.is_file():
                shutil.move(str(item), dest / item.name)
    if base is not None:
        cfg_path = dest / "adapter_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["base_model_name_or_path"] = str(Path(base).resolve())
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return dest
