"""Build the toy world: a base that copies strings and LoRA experts that each replace a letter.

Layout written by `build_toy_world(DIR)`:
    DIR/base/                 Llama model + tokenizer (safetensors)
    DIR/experts/<rule>/       peft LoRA adapter of DIR/base
    DIR/toy.json              variant, seeds, sizes, build time, accuracies, checksums
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from peft import PeftModel
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from logitcomp.io import atomic_dir
from logitcomp.loading import save_adapter

from .data import LAYOUTS, PADDED_WIDTH, RULES, TASKS, make_eval_set
from .evaluate import exact_match, teacher_forced_exact
from .tokenizer import make_tokenizer
from .train import TrainSettings, make_base_model, make_batch, train_base, train_expert, write_expert_prompts

log = logging.getLogger(__name__)
VARIANTS = {"factorised": 0.25, "entangled": 0.0}  # variant -> share of answer letters corrupted
ARCHITECTURES = ("llama", "gpt2")
ACCURACY_BAR = 0.99
VALIDATION_SEED = 4321  # held-out check during training; the reported figures use data.EVAL_SEED


class ToyBuildError(RuntimeError):
    """A model of the toy world missed its bar: the build writes nothing."""


@dataclass(frozen=True)
class ToyConfig:
    """Everything that determines the toy world's weights.

    Args:
        variant: `factorised` trains base and experts to copy by position, robust to changed
            letters in the prefix (a share of the fed-back answer letters is randomised while
            the targets stay clean); `entangled` uses plain teacher forcing.
        seed: seeds model init and data; the same seed on the same machine gives the same weights.
        validation_target: a model trains (after its scheduled steps, in at most `extra_rounds`
            rounds of half as many steps) until its held-out check reaches this: greedy exact
            match on `validation_size` strings of its own task and, in the factorised variant,
            teacher-forced exact match with corrupted fed-back letters. Extra rounds peak at
            `extra_lr` × the scheduled learning rate (0.1: the end of the first round's cosine;
            0.3 stalled at 1-2 errors in 256 on a seed tried, 0.1 and 0.03 reached 0).
        bar: the build fails when a model's exact match on the reported evaluation set is below it.
        layout: `copy` (x>y) or `padded` (x padded to a fixed width, so that the task is a fixed
            local rule that can length-generalise; see data.LAYOUTS).
        noise: the share of fed-back answer letters corrupted in training; None takes the variant's
            (factorised 0.25, entangled 0). Worlds between the two measure how factorisable skills must be.
        architecture: `llama` (rotary positions) or `gpt2` (learned absolute positions, the paper's notebook).
        full_experts: experts fine-tune every weight of the base and are saved as full models (no LoRA).
    """

    variant: str = "factorised"
    seed: int = 0
    experts: tuple[str, ...] = ("a2b", "c2d", "e2f")
    hidden_size: int = 128
    num_layers: int = 2
    base_steps: int = 2000
    expert_steps: int = 400
    batch_size: int = 64
    base_lr: float = 3e-3
    expert_lr: float = 2e-3
    lora_rank: int = 8
    eval_size: int = 200
    validation_size: int = 256
    validation_target: float = 1.0
    extra_rounds: int = 6
    extra_lr: float = 0.1
    bar: float = ACCURACY_BAR
    layout: str = "copy"
    noise: float | None = None
    architecture: str = "llama"
    full_experts: bool = False

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"variant: expected one of {sorted(VARIANTS)}, got {self.variant!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture: expected one of {', '.join(ARCHITECTURES)}, got {self.architecture!r}")
        if self.noise is not None and not 0.0 <= self.noise < 1.0:
            raise ValueError(f"noise: expected a share in [0, 1), got {self.noise!r}")
        unknown = [e for e in self.experts if e not in RULES]
        if unknown or not self.experts:
            raise ValueError(f"experts: expected a non-empty subset of {sorted(RULES)}, got {list(self.experts)}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("validation_target", "bar"):
                if not 0.0 <= value <= 1.0:
                    raise ValueError(f"{f.name}: expected a share in [0, 1], got {value!r}")
            elif f.name in ("seed", "extra_rounds"):
                if value < 0:
                    raise ValueError(f"{f.name}: expected a non-negative integer, got {value!r}")
            elif f.type in ("int", "float") and not value > 0:
                raise ValueError(f"{f.name}: expected a positive number, got {value!r}")

    @classmethod
    def fast(cls, **overrides) -> ToyConfig:
        """A seconds-long build for tests: same files, untrained-quality models, no bars."""
        small = dict(hidden_size=32, num_layers=1, base_steps=20, expert_steps=5, batch_size=8, eval_size=16,
                     validation_size=16, validation_target=0.0, extra_rounds=0, bar=0.0)
        return cls(**{**small, **overrides})

    @property
    def corrupt(self) -> float:
        """The share of fed-back answer letters corrupted in training."""
        return VARIANTS[self.variant] if self.noise is None else self.noise

    @property
    def positions(self) -> int:
        """The models' max_position_embeddings: the longest evaluated sequence fits."""
        return 64 if self.layout == "copy" else 2 * PADDED_WIDTH + 4

    def expert_seed(self, rule: str) -> int:
        """The seed of expert `rule`'s training and routing prompts (the base's is `seed`)."""
        return self.seed + 1 + self.experts.index(rule)


@dataclass
class ToyWorld:
    """What a build produced (the parsed toy.json)."""

    root: Path
    config: ToyConfig
    accuracy: dict[str, float]
    checksums: dict[str, str]
    build_seconds: float
    extra: dict = field(default_factory=dict)

    @property
    def base(self) -> Path:
        return self.root / "base"

    def expert(self, name: str) -> Path:
        return self.root / "experts" / name

    @classmethod
    def load(cls, root: Path) -> ToyWorld:
        """Read DIR/toy.json. Raises FileNotFoundError when DIR holds no toy world."""
        meta = json.loads((Path(root) / "toy.json").read_text())
        config = ToyConfig(**{**meta["config"], "experts": tuple(meta["config"]["experts"])})
        return cls(Path(root), config, meta["accuracy"], meta["checksums"], meta["build_seconds"], meta)


def tensor_checksum(path: Path) -> str:
    """sha256 over a safetensors file's tensors (names and bytes, sorted by name)."""
    h = hashlib.sha256()
    with safe_open(str(path), framework="pt") as f:
        for name in sorted(f.keys()):
            h.update(name.encode())
            h.update(f.get_tensor(name).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _own_task(model_name: str) -> str:
    return "identity" if model_name == "base" else model_name


def _evaluate(tmp: Path, config: ToyConfig) -> dict[str, float]:
    """Reload every saved model from disk and score it on its own task."""
    tasks = {t.name: t for t in TASKS}
    tokenizer = AutoTokenizer.from_pretrained(tmp / "base")
    accuracy = {}
    for name in ("base", *config.experts):
        if name != "base" and config.full_experts:
            model = AutoModelForCausalLM.from_pretrained(tmp / "experts" / name)
        else:
            model = AutoModelForCausalLM.from_pretrained(tmp / "base")
            model = model if name == "base" else PeftModel.from_pretrained(model, tmp / "experts" / name)
        docs = make_eval_set(tasks[_own_task(name)], size=config.eval_size)
        accuracy[name] = exact_match(model.eval(), tokenizer, docs, config.layout)
        log.info("%s: exact match %.4f on %s", name, accuracy[name], _own_task(name))
    return accuracy


def _checker(tokenizer, config: ToyConfig, rules: tuple[str, ...]) -> Callable[[object], float]:
    """The held-out check of a model trained on `rules`: the lower of its greedy exact match and,
    when the variant corrupts fed-back letters, its teacher-forced exact match under corruption
    (the copy-by-position skill that composition relies on)."""
    task = "_".join(rules) or "identity"
    docs = make_eval_set(next(t for t in TASKS if t.name == task), config.validation_size, seed=VALIDATION_SEED)
    corrupt = config.corrupt
    settings = TrainSettings(0, config.validation_size, 0.0, corrupt)
    rng = random.Random(f"{VALIDATION_SEED}:{task}")
    batch = make_batch(tokenizer, rng, rules, settings, config.layout) if corrupt else None

    def check(model) -> float:
        score = exact_match(model, tokenizer, docs, config.layout)
        return min(score, teacher_forced_exact(model, *batch)) if batch is not None else score

    return check


def _train_all(tmp: Path, config: ToyConfig, final_base: Path) -> dict[str, dict]:
    """Train and save base and experts. Returns each model's `Fit` as a dict."""
    corrupt = config.corrupt
    tokenizer = make_tokenizer()
    torch.manual_seed(config.seed)
    base = make_base_model(tokenizer, config.hidden_size, config.num_layers, config.positions, config.architecture)
    target = config.validation_target
    base_settings = TrainSettings(config.base_steps, config.batch_size, config.base_lr, corrupt, config.extra_rounds, config.extra_lr)
    check = _checker(tokenizer, config, ())
    fits = {"base": train_base(base, tokenizer, base_settings, config.seed, lambda: check(base), target, config.layout)}
    base.save_pretrained(tmp / "base")
    tokenizer.save_pretrained(tmp / "base")
    settings = TrainSettings(config.expert_steps, config.batch_size, config.expert_lr, corrupt, config.extra_rounds, config.extra_lr)
    for rule in config.experts:
        fresh = AutoModelForCausalLM.from_pretrained(tmp / "base")
        check = _checker(tokenizer, config, (rule,))
        rank = 0 if config.full_experts else config.lora_rank
        expert, fits[rule] = train_expert(fresh, tokenizer, rule, settings, config.expert_seed(rule), rank, check, target, config.layout)
        if config.full_experts:
            expert.save_pretrained(tmp / "experts" / rule)
            tokenizer.save_pretrained(tmp / "experts" / rule)
        else:
            save_adapter(expert, "default", tmp / "experts" / rule, base=final_base)  # the base's final place
        write_expert_prompts(tmp / "experts" / rule, rule, config.expert_seed(rule), config.layout)
    return {name: asdict(fit) for name, fit in fits.items()}


def _check_bars(config: ToyConfig, fits: dict[str, dict], accuracy: dict[str, float]) -> None:
    missed = [f"{name} {acc:.3f} on {_own_task(name)} after {fits[name]['steps']} steps"
              for name, acc in accuracy.items() if acc < config.bar]
    if missed:
        raise ToyBuildError(f"toy world ({config.variant}, seed {config.seed}) below the {config.bar:.0%} bar: "
                            f"{'; '.join(missed)}; nothing was written (raise extra_rounds or base_steps)")


def build_toy_world(root: Path, config: ToyConfig = ToyConfig(), force: bool = False) -> ToyWorld:
    """Train and save the toy world into `root`, atomically.

    Everything is built in a temporary sibling folder and renamed into place at the end, so an
    interrupted or failed build leaves nothing half-written.

    Raises:
        FileExistsError: `root` is a non-empty folder and `force` is False.
        ToyBuildError: a model's exact match on its evaluation set is below `config.bar`.
    """
    root = Path(root).resolve()
    if root.exists() and any(root.iterdir()) and not force:
        raise FileExistsError(f"{root}: folder is not empty; choose another DIR or pass --force to replace it")
    start = time.perf_counter()
    with atomic_dir(root) as tmp:
        fits = _train_all(tmp, config, root / "base")
        accuracy = _evaluate(tmp, config)
        _check_bars(config, fits, accuracy)
        checksums = {"base": tensor_checksum(tmp / "base" / "model.safetensors")}
        for rule in config.experts:
            checksums[rule] = tensor_checksum(tmp / "experts" / rule / _weights_file(config))
        checksums["world"] = hashlib.sha256("".join(checksums.values()).encode()).hexdigest()
        meta = {
            "variant": config.variant,
            "config": asdict(config),
            "seeds": {"base": config.seed, **{r: config.expert_seed(r) for r in config.experts}},
            "sizes": _sizes(tmp, config),
            "accuracy": accuracy,
            "accuracy_tasks": {m: _own_task(m) for m in accuracy},
            "training": fits,
            "checksums": checksums,
            "build_seconds": round(time.perf_counter() - start, 1),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        }
        (tmp / "toy.json").write_text(json.dumps(meta, indent=2) + "\n")
    return ToyWorld.load(root)


def ensure_toy_world(root: Path, config: ToyConfig, force: bool = False, if_missing: bool = False) -> tuple[ToyWorld, bool]:
    """Build the toy world into `root`, or with `if_missing` reuse the one already there.

    Returns:
        (the world, whether it was reused).

    Raises:
        ValueError: with `if_missing`, `root` holds a world of another configuration.
    """
    root = Path(root)
    if if_missing and not force and (root / "toy.json").exists():
        world = ToyWorld.load(root)
        if world.config != config:
            raise ValueError(f"{root / 'toy.json'}: holds a toy world built with another configuration "
                             f"({world.config.variant}, seed {world.config.seed}); pass --force to rebuild it")
        for rule in config.experts:  # a world built before experts carried their routing prompts
            if not (root / "experts" / rule / "prompts.jsonl").exists():
                write_expert_prompts(root / "experts" / rule, rule, config.expert_seed(rule), config.layout)
        return world, True
    return build_toy_world(root, config, force=force), False


def world_name(config: ToyConfig) -> str:
    """A folder name that tells worlds of different variant, layout, noise and seed apart."""
    parts = [config.variant] if config.noise is None else [f"noise{config.noise:g}"]
    if config.layout != "copy":
        parts.insert(0, config.layout)
    if config.architecture != "llama" or config.full_experts:
        parts.insert(0, config.architecture + ("-full" if config.full_experts else ""))
    return "-".join(parts) + f"-seed{config.seed}"


def world_at(root: Path, config: ToyConfig) -> ToyWorld:
    """The world of `config` in `root / world_name(config)`: reused when built with this configuration, else
    (re)built. Raises ToyBuildError when a model misses its bar."""
    folder = Path(root) / world_name(config)
    if (folder / "toy.json").exists():
        world = ToyWorld.load(folder)
        if world.config == config:
            return world
    return build_toy_world(folder, config, force=True)


def _sizes(tmp: Path, config: ToyConfig) -> dict:
    base = AutoModelForCausalLM.from_pretrained(tmp / "base")
    sizes = {"base_parameters": sum(p.numel() for p in base.parameters()), "vocab_size": base.config.vocab_size}
    for rule in config.experts:
        with safe_open(str(tmp / "experts" / rule / _weights_file(config)), framework="pt") as f:
            kind = "parameters" if config.full_experts else "lora_parameters"
            sizes[f"{rule}_{kind}"] = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    return sizes


def _weights_file(config: ToyConfig) -> str:
    return "model.safetensors" if config.full_experts else "adapter_model.safetensors"
