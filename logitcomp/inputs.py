"""Checks of a base and its experts that need no model loaded: one clear error naming the expert,
weight or path. `validate`, `run`, `merge`, the lm-eval model, `from_experts` and every bridge
merge call `resolve`; nothing here imports torch.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from . import weightfiles
from .config import check_weights


# An expert's name becomes a folder name (saved compositions, recipe outputs): no separators, no leading dot
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_+-]*")  # no '.': a name is also a peft adapter name (a torch module key)


def check_name(name) -> str:
    """Return `name` when it is an identifier safe as a folder name. Raises ValueError otherwise."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"expert name {name!r}: expected letters, digits and _ + - (no '.' or '/': names are folder and adapter names)")
    return name


@dataclass(frozen=True)
class Expert:
    """One checked expert: absolute folder, `lora` or `full`, and its weight."""

    name: str
    path: Path
    kind: str
    weight: float


def expert_kind(name: str, path: Path) -> str:
    """`lora` or `full`. Raises ValueError naming the expert when the folder is neither."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"expert {name!r}: {path} is not a folder")
    if (path / "adapter_config.json").is_file():
        return "lora"
    if (path / "config.json").is_file():
        return "full"
    raise ValueError(f"expert {name!r}: {path} is neither a peft adapter (adapter_config.json) nor a model folder (config.json)")


def check_safetensors(label: str, path: Path, allow_pickle: bool) -> None:
    """Refuse a folder without safetensors weights (unless `allow_pickle`) or with an unreadable one."""
    if list(path.glob("*.safetensors")):
        weightfiles.shapes(label, path)  # every header parsed: empty, truncated or foreign files are named
        return
    if allow_pickle:
        return
    pickled = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
    what = f"only pickled weights ({', '.join(pickled)})" if pickled else "no .safetensors weights"
    raise ValueError(f"{label}: {path} has {what}; convert to safetensors or opt in with allow_pickle")


def _fingerprint(model_dir: Path, span: int = 1 << 20) -> tuple:
    """What identifies a local model folder cheaply: its config, and per weight file its size and
    a hash of its first and last MiB (two trainings of one architecture differ there; hashing
    whole multi-GB files on every load would not be cheap)."""
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("_name_or_path", None)
    files = []
    for path in sorted(model_dir.glob("*.safetensors")):
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(span)
            f.seek(max(0, size - span))
            digest = hashlib.sha256(head + f.read(span)).hexdigest()
        files.append((path.name, size, digest))
    return json.dumps(config, sort_keys=True), tuple(files)


def read_json_object(label: str, file: Path) -> dict:
    """A JSON file that must hold an object (config.json, adapter_config.json). Raises ValueError naming it."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{label}: {file} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{label}: {file} holds a JSON {type(data).__name__}; expected an object")
    return data


def vocab_size(label: str, model_dir: Path) -> int | None:
    """The vocabulary size in a model's config.json (a multimodal model's text_config), if stated."""
    config = read_json_object(label, Path(model_dir) / "config.json")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return text.get("vocab_size")


def check_adapter_config(label: str, adapter_dir: Path) -> dict:
    """adapter_config.json of a LoRA adapter: an object with peft_type LORA. Raises ValueError naming the file."""
    file = adapter_dir / "adapter_config.json"
    config = read_json_object(label, file)
    if config.get("peft_type") != "LORA":
        got = f"peft_type {config['peft_type']!r}" if "peft_type" in config else "no peft_type"
        raise ValueError(f"{label}: {file} has {got}; expected a LoRA adapter (peft_type LORA)")
    return config


@functools.lru_cache(maxsize=8)
def _base_shapes(base_dir: Path, stamp: tuple) -> dict[str, tuple[int, ...]]:
    """The base's tensor shapes, read once per state of its weight files (`stamp`: names, sizes, mtimes)
    however many experts are checked against it."""
    return weightfiles.shapes("base", base_dir)


def check_adapter_fits(label: str, adapter_dir: Path, base_dir: Path, fan_in_fan_out: bool = False) -> None:
    """Refuse LoRA factors whose shapes do not fit the base weights they update (read from the headers).
    A module whose weight the base files do not name as peft does (renamed checkpoints) is left to the load.
    `fan_in_fan_out`: the base stores the weights it updates as (in, out) (GPT-2's Conv1D), B·A fits their transpose."""
    files = sorted(Path(base_dir).glob("*.safetensors"))
    base = _base_shapes(Path(base_dir), tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    adapter = weightfiles.shapes(label, adapter_dir)
    for key, a_shape in adapter.items():
        if not key.endswith(".lora_A.weight") or key.replace(".lora_A.", ".lora_B.") not in adapter:
            continue
        module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
        b_shape, w_shape = adapter[key.replace(".lora_A.", ".lora_B.")], base.get(f"{module}.weight")
        if w_shape is None or len(w_shape) != 2:
            continue
        w_shape = tuple(reversed(w_shape)) if fan_in_fan_out else tuple(w_shape)  # (out, in)
        if (b_shape[0], a_shape[1]) != w_shape or b_shape[1] != a_shape[0]:
            raise ValueError(f"{label}: {adapter_dir} does not fit the base {base_dir}: {module} is {w_shape[0]}x{w_shape[1]}, "
                             f"the adapter's B·A is {b_shape[0]}x{b_shape[1]} · {a_shape[0]}x{a_shape[1]}")


def check_adapter_base(name: str, adapter_dir: Path, base_dir: Path, config: dict) -> None:
    """Refuse an adapter whose recorded base (`config`: its checked adapter_config.json) is another local model than `base_dir`."""
    recorded = config.get("base_model_name_or_path")
    if not recorded or not Path(recorded).is_dir() or Path(recorded).resolve() == Path(base_dir).resolve():
        return
    if (Path(recorded) / "config.json").is_file() and _fingerprint(Path(recorded)) == _fingerprint(Path(base_dir)):
        return  # a copy of the same base
    raise ValueError(f"expert {name!r}: {adapter_dir} is an adapter of {recorded}, not of the base {base_dir}")


def check_base(base, allow_pickle: bool = False) -> Path:
    """The absolute base folder. Raises ValueError when it is no model folder or holds only pickles."""
    base = Path(base).expanduser().resolve()
    if not (base / "config.json").is_file():
        raise ValueError(f"base: {base} is not a model folder (no config.json)")
    read_json_object("base", base / "config.json")
    check_safetensors("base", base, allow_pickle)
    return base


def check_expert(name: str, path, base: Path | None, weight: float = 1.0, allow_pickle: bool = False,
                 label: str | None = None) -> Expert:
    """One expert folder, checked against `base` when it is a local folder (None: a hub reference).

    Args:
        label: how messages name the expert (a recipe says `experts.NAME`); default `expert 'NAME'`.
    """
    check_name(name)
    path = Path(path).expanduser().resolve()
    label = label or f"expert {name!r}"
    if not path.exists():
        raise ValueError(f"{label}: {path} does not exist")
    kind = expert_kind(name, path)
    check_safetensors(label, path, allow_pickle)
    if kind == "lora":
        config = check_adapter_config(label, path)
        weightfiles.check_finite(label, path)  # adapters are small: NaN/inf is refused before any model loads
        if base is not None:
            check_adapter_base(name, path, base, config)
            check_adapter_fits(label, path, base, bool(config.get("fan_in_fan_out")))
    elif base is not None:
        theirs, ours = vocab_size(label, path), vocab_size("base", base)
        if theirs != ours:
            raise ValueError(f"{label}: {path} has a vocabulary of {theirs} tokens, the base {ours}")
    return Expert(name, path, kind, weight)


def resolve(base, experts: dict, weights: dict | None = None, *, allow_pickle: bool = False) -> tuple[Path, list[Expert]]:
    """Absolute base folder and checked experts, in the given order.

    Raises:
        ValueError: a missing folder, a folder that is neither adapter nor model, pickled weights
            without `allow_pickle`, an adapter of another base, weights naming unknown experts or
            not finite.
    """
    base = check_base(base, allow_pickle)
    if not experts:
        raise ValueError("experts: expected at least one expert")
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(experts))
    if unknown:
        raise ValueError(f"weights: unknown expert {unknown[0]!r}; the experts are {list(experts)}")
    values = check_weights([weights.get(n, 1.0) for n in experts], list(experts))
    return base, [check_expert(n, p, base, w, allow_pickle) for (n, p), w in zip(experts.items(), values)]
