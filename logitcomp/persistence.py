"""Building, saving and restoring a `ComposedModelForCausalLM` from folders.

A saved composition is a folder whose `composition.json` names the base, the experts and every
composition option, like peft's `adapter_config.json` names its base. LoRA adapters are copied
in; the base and full-model experts are referenced by path (they can be gigabytes): the base relative
to the folder (so a folder moved with its base still opens) and absolute (so one moved alone does too).
Beside it, what makes the folder a transformers model folder: `config.json` (`hf_config.ComposedConfig`),
the base's tokenizer files and the generation config. The model class is passed in (`cls`) so that this
module does not import it. A folder of peft's Arrow over LoRA adapters (`save_arrow`, what `logitcomp export`
writes for an arrow row) has the same layout with `"arrow"` (ArrowConfig's fields) in place of `"composition"`, and
opens into peft's Arrow model.
"""

from __future__ import annotations

import copy
import json
import os
import re
import tempfile
from pathlib import Path

from .config import CompositionConfig
from .hf_config import MODEL_TYPE, ComposedConfig
from .inputs import check_name, resolve
from .io import atomic_dir, atomic_write_bytes
from .loading import LoadOptions, attach_lora, check_same_vocabulary, load_model, refuse_unknown, save_adapter

FORMAT = "logitcomp.composition/1"
PUSH_KEYWORDS = ("repo_id", "private", "commit_message", "commit_description", "revision", "create_pr")  # save_pretrained(push_to_hub=True)
# transformers' loading keywords that say where a hub folder comes from (what AutoModelForCausalLM passes on): the folder is local
HUB_KEYWORDS = ("cache_dir", "force_download", "proxies", "revision", "token", "subfolder", "adapter_kwargs", "_from_auto", "low_cpu_mem_usage")
# transformers' loading keywords that callers such as lm-eval pass at their default None: accepted as that, refused otherwise
UNSET_KEYWORDS = ("gguf_file", "quantization_config", "max_memory", "offload_folder", "attn_implementation", "tp_plan", "use_safetensors")


def from_experts(cls, base_path, experts: dict, weights: dict | None, config: CompositionConfig | None, options: LoadOptions):
    """Check the folders (`inputs.resolve`), load the base with its LoRA experts and the full-model experts, compose.

    Raises:
        ValueError: naming the expert, weight or folder that cannot be composed.
    """
    config = copy.deepcopy(config or CompositionConfig())
    if weights is not None:
        config = config.with_weights(weights)
    hub_id = base_path if _is_hub_id(base_path) else None
    if hub_id:  # a hub id: its snapshot in the hub cache (downloaded unless offline)
        base_path = _snapshot(hub_id)
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
    sources = {"base": str(base_path), "full": full_paths, **({"base_id": hub_id} if hub_id else {})}
    return cls(model, [e.name for e in checked], full, config, sources)


def _is_hub_id(ref) -> bool:
    """A hub model id (`org/name`) that is no local path."""
    return isinstance(ref, str) and not Path(ref).expanduser().exists() and bool(re.fullmatch(r"[\w.-]+/[\w.-]+", ref))


def _snapshot(hub_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(hub_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    except Exception as exc:  # offline and not cached, gated, missing: one line naming the id
        raise ValueError(f"base: cannot fetch {hub_id} from the hub ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


def save(composed, save_directory, self_contained: bool = False) -> Path:
    """Write `composition.json` and the LoRA adapters (copied into `experts/`) into a folder; `self_contained` also
    puts the base (into `base/`) and the full-model experts (into `experts/NAME`) in it, hard-linked where the disk
    allows, else copied, so that the folder opens on its own wherever it is moved.

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
    _check_folder(out, self_contained)
    experts = {}
    with atomic_dir(out / "experts") as tmp:
        for name in composed.experts:
            if name in composed.full_experts:
                full = Path(composed.sources["full"][name]).resolve()
                if self_contained:
                    link_tree(full, tmp / name)
                experts[name] = {"kind": "full", "path": f"experts/{name}" if self_contained else str(full)}
                continue
            save_adapter(composed.model, name, tmp / name)
            experts[name] = {"kind": "lora", "path": f"experts/{name}"}
    _save_tokenizer_and_generation_config(composed.generation_config, Path(base), out)
    _write_meta(out, Path(base), experts, {"composition": composed.composition.to_dict()}, self_contained, composed.sources.get("base_id"))
    return out


def save_arrow(save_directory, base, adapters: dict, arrow: dict, self_contained: bool = False) -> Path:
    """peft's Arrow routing over LoRA adapters of `base` (`peft.create_arrow_model` with `ArrowConfig(**arrow)`) as a
    folder that opens as a composition folder does (`from_pretrained`, the Auto classes, lm-eval), into peft's Arrow
    model: the adapters copied into `experts/`, the base referenced (or with `self_contained`, put in `base/`)."""
    from transformers import GenerationConfig

    out = Path(save_directory).resolve()
    for name in adapters:
        check_name(name)
    _check_folder(out, self_contained)
    with atomic_dir(out / "experts") as tmp:
        for name, path in adapters.items():
            link_tree(Path(path), tmp / name)
    base = Path(base).resolve()
    generation = GenerationConfig.from_pretrained(base) if (base / "generation_config.json").is_file() else GenerationConfig()
    _save_tokenizer_and_generation_config(generation, base, out)
    experts = {name: {"kind": "lora", "path": f"experts/{name}"} for name in adapters}
    _write_meta(out, base, experts, {"arrow": dict(arrow)}, self_contained)
    return out


def _check_folder(out: Path, self_contained: bool) -> None:
    """Refuse a folder whose experts/ (or base/) or config.json another writer left: `save` replaces only its own."""
    for folder in ("experts", *(("base",) if self_contained else ())):
        if (out / folder).exists() and not (out / "composition.json").is_file():
            raise ValueError(f"{out}: holds {'an' if folder == 'experts' else 'a'} {folder}/ folder that no composition wrote; choose another folder")
    config_file = out / "config.json"
    if config_file.is_file() and _model_type(config_file) != MODEL_TYPE:
        raise ValueError(f"{config_file}: the config.json of another model ({_model_type(config_file)!r}); choose another folder")


def _write_meta(out: Path, base: Path, experts: dict, body: dict, self_contained: bool, hub_id: str | None = None) -> None:
    """composition.json (the base, the experts, `body`) and config.json, each atomically, the base put in first if
    `self_contained`."""
    base = base.resolve()
    if self_contained:
        with atomic_dir(out / "base") as tmp:
            link_tree(base, tmp)
        base, hub_id = out / "base", None
    # a hub base is kept as its id (unless copied in); a local one relative to the folder, and absolute
    meta = {"format": FORMAT, "base": hub_id or os.path.relpath(base, out), "experts": experts,
            **({} if self_contained else {"base_absolute": str(base)}), **body}
    hf = ComposedConfig(base=meta["base"], experts=experts, composition=body.get("composition", {}), architectures=["ComposedModelForCausalLM"])
    atomic_write_bytes(out / "config.json", hf.to_json_string().encode())
    atomic_write_bytes(out / "composition.json", (json.dumps(meta, indent=2) + "\n").encode())


def save_pretrained(composed, save_directory, is_main_process: bool = True, push_to_hub: bool = False, max_shard_size="50GB",
                    token=None, safe_serialization: bool = True, state_dict=None, variant=None, save_peft_format: bool = True,
                    self_contained: bool = False, **kwargs) -> Path:
    """`save` (`self_contained`: the base inside the folder) with transformers' `save_pretrained` keywords: `is_main_process=False` writes nothing; `max_shard_size`
    is accepted (adapters are written whole); `push_to_hub=True` uploads the folder once written (`repo_id`, default the
    folder's name, `private`, `commit_message`, `commit_description`, `revision`, `create_pr`, with `token`). Refused by
    name before anything is written: `state_dict`, `variant`, `safe_serialization=False` (safetensors only),
    `save_peft_format=False`, push keywords without `push_to_hub`, and any other keyword."""
    push_options = {k: kwargs.pop(k) for k in PUSH_KEYWORDS if k in kwargs}
    refuse_unknown("save_pretrained", kwargs)
    for name, value, allowed in (("state_dict", state_dict, None), ("variant", variant, None), ("safe_serialization", safe_serialization, True),
                                 ("save_peft_format", save_peft_format, True)):
        if value is not allowed:
            raise ValueError(f"{name}: a composition folder is written as peft adapters in safetensors; {name}={value!r} is not supported")
    if push_options and not push_to_hub:
        raise ValueError(f"{next(iter(push_options))}: a push keyword needs push_to_hub=True")
    if not is_main_process:
        return Path(save_directory)
    out = save(composed, save_directory, self_contained)
    if push_to_hub:
        push(out, push_options.pop("repo_id", out.name), token, **push_options)
    return out


def push_to_hub(composed, repo_id: str, *, commit_message=None, commit_description=None, private=None, token=None, revision=None,
                create_pr: bool = False, max_shard_size="50GB", tags=None) -> str:
    """transformers' `push_to_hub`: the composition written into a temporary folder, then `push`ed. Returns the commit's URL."""
    if tags is not None:
        raise ValueError("tags: a composition's model card is not written; push without tags")
    with tempfile.TemporaryDirectory() as tmp:
        out = save(composed, Path(tmp) / repo_id.split("/")[-1])
        return push(out, repo_id, token, commit_message=commit_message, commit_description=commit_description, private=private,
                    revision=revision, create_pr=create_pr)


def from_pretrained(cls, directory, *, config=None, **kwargs):
    """`load` with `from_experts`' loading keywords (`LoadOptions.of`) and what `AutoModelForCausalLM` passes on: its
    hub keywords (accepted: the folder is local; `subfolder` must be empty) and `config`, the folder's own ComposedConfig."""
    hub = {k: kwargs.pop(k) for k in HUB_KEYWORDS if k in kwargs}
    if hub.get("subfolder"):
        raise ValueError(f"subfolder: a composition folder is opened as a whole, got {hub['subfolder']!r}")
    if config is not None and not isinstance(config, ComposedConfig):
        raise ValueError(f"config: expected the composition folder's own ComposedConfig, got {type(config).__name__}")
    for key in UNSET_KEYWORDS:
        if kwargs.get(key, None) is not None:
            raise ValueError(f"{key}: not supported when opening a composition folder (got {kwargs[key]!r})")
        kwargs.pop(key, None)
    loading = {k: kwargs.pop(k) for k in ("dtype", "device", "allow_pickle", "trust_remote_code", "torch_dtype", "device_map",
                                          "local_files_only") if k in kwargs}
    refuse_unknown("from_pretrained", kwargs)
    return load(cls, directory, LoadOptions.of(**loading))


def push(folder: Path, repo_id: str, token=None, *, private=None, commit_message=None, commit_description=None, revision=None,
         create_pr: bool = False) -> str:
    """Upload a written composition folder to the hub repo `repo_id` (created if needed, after the folder is complete).
    Returns the commit's URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    commit = api.upload_folder(folder_path=folder, repo_id=repo_id, commit_message=commit_message or "Upload composition",
                               commit_description=commit_description, revision=revision, create_pr=create_pr)
    return str(commit)


def link_tree(source: Path, target: Path) -> None:
    """Every file under `source` at the same place under `target`: hard-linked where the disk allows, else copied."""
    import shutil

    for path in sorted(Path(source).rglob("*")):
        if path.is_file():
            dest = target / path.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                dest.hardlink_to(path)
            except OSError:
                shutil.copy2(path, dest)


def _model_type(config_file: Path):
    try:
        return json.loads(config_file.read_text()).get("model_type")
    except (ValueError, OSError, AttributeError):
        return None


def _save_tokenizer_and_generation_config(generation_config, base: Path, out: Path) -> None:
    """The base's tokenizer files and the model's generation config, each file moved in atomically."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix=".partial-", dir=out) as tmp:
        AutoTokenizer.from_pretrained(base).save_pretrained(tmp)
        generation_config.save_pretrained(tmp)
        for name in os.listdir(tmp):
            os.replace(Path(tmp) / name, out / name)


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
    base = (directory / meta["base"]).resolve()  # relative to the folder (an absolute path stays as it is)
    if _is_hub_id(meta["base"]) and not base.is_dir():
        base = meta["base"]  # a hub id, resolved through the hub cache
    elif not base.is_dir() and meta.get("base_absolute"):
        base = Path(meta["base_absolute"])  # the folder was moved without its base
    if "arrow" in meta:
        return load_arrow(base, paths, meta["arrow"], options)
    return from_experts(cls, base, paths, None, CompositionConfig(**meta["composition"]), options)


def load_arrow(base, adapters: dict, arrow: dict, options: LoadOptions):
    """peft's Arrow model of a folder `save_arrow` wrote: `create_arrow_model` over its adapters, in eval mode."""
    from peft import ArrowConfig, create_arrow_model

    return create_arrow_model(load_model("base", base, options), [str(p) for p in adapters.values()], ArrowConfig(**arrow)).eval()
