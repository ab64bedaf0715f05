"""YAML recipes: one base, its experts, composition and merge settings, and the lm-eval tasks.

Paths in a recipe are relative to the recipe file. Unknown keys are refused with one line that
names the key and the allowed ones. `merging.recipe_file.load_recipe` reads a file into this schema.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_serializer, field_validator, model_validator

from logitcomp.config import CompositionConfig
from logitcomp.inputs import check_name

VARIANTS = ("base", "experts", "composed", "merged", "merged_lora")


class RecipeError(ValueError):
    """A recipe that cannot be used; the message is one line naming the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = [k for k in data if k not in cls.model_fields]
            if unknown:
                raise ValueError(f"unknown key {unknown[0]!r}; allowed keys: {', '.join(cls.model_fields)}")
        return data


def _not_a_number(value) -> str:
    """The message for a value that should be a number; YAML 1.1 reads `1.0e38` (no sign after e) as text."""
    try:
        float(value)
    except (TypeError, ValueError):
        return f"expected a number, got {value!r}"
    return f"expected a number, got the text {value!r} (YAML reads an exponent without a sign as text: write 1.0e+38)"


class ExpertSpec(_Strict):
    path: str
    weight: float = 1.0

    @field_validator("weight", mode="before")
    @classmethod
    def _number(cls, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(_not_a_number(value))
        return value


# `compose:` holds CompositionConfig's options; weights live with each expert, tracing is for `generate --trace`
COMPOSE_KEYS = tuple(f.name for f in fields(CompositionConfig) if f.name not in ("weights", "trace"))


def _composition(compose: dict, weights: dict | None = None) -> CompositionConfig:
    """The CompositionConfig of a recipe's `compose:` block: the runtime's own checks, not a copy of them."""
    unknown = [k for k in compose if k not in COMPOSE_KEYS]
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; allowed keys: {', '.join(COMPOSE_KEYS)}")
    if isinstance(compose.get("floor"), str):
        raise ValueError(f"floor: {_not_a_number(compose['floor'])}")
    return CompositionConfig(**compose, weights=dict(weights or {}))


class MergeOptionsSpec(_Strict):
    """mergekit's own options (its MergeOptions) for big models; the runner sets the device and caches."""

    low_cpu_memory: bool = False  # write each tensor as soon as it is merged
    lazy_unpickle: bool = False  # mergekit's lazy loader of pickled .bin weights (with allow_pickle)
    out_shard_size: int = Field(default=5_000_000_000, ge=1 << 20)  # bytes per output safetensors shard
    random_seed: int = 0  # randomised methods (dare_ties, della, ...) give the same merge at every run
    read_to_gpu: bool = False
    multi_gpu: bool = False


class MergeSpec(_Strict):
    method: str = "task_arithmetic"
    parameters: dict[str, Any] = Field(default_factory=dict)
    lora: bool = True  # also build merge-as-LoRA (the merged_lora variant)
    options: MergeOptionsSpec = MergeOptionsSpec()


DTYPES = ("auto", "float32", "float16", "bfloat16", "float64")
DEVICE = re.compile(r"cpu|(cuda|xpu|npu|hpu)(:\d+)?|mps")


def _unique(field: str, items: list) -> list:
    if not items:
        raise ValueError(f"expected at least one {field}")
    repeated = [x for i, x in enumerate(items) if x in items[:i]]
    if repeated:
        raise ValueError(f"{field} {repeated[0]!r} is listed twice")
    return items


class SelectSpec(_Strict):
    """The validation score that picks one value of every swept family (the argmax; ties: the first value)."""

    task: str
    metric: str  # lm-eval's metric key: `exact_match`, or with its filter `exact_match,strict-match`
    higher_is_better: bool = True


class EvaluateSpec(_Strict):
    tasks: Annotated[list[str], AfterValidator(lambda v: _unique("task", v))]
    include_path: str | None = None
    # lm-eval's limit: a count of examples per task (>= 1) or a fraction of them (0 < limit < 1)
    limit: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    num_fewshot: int | None = Field(default=None, ge=0)
    batch_size: int = Field(default=16, ge=1)
    device: str = "cpu"
    dtype: Literal[DTYPES] = "float32"  # type: ignore[valid-type]
    gen_kwargs: dict[str, Any] = Field(default_factory=dict)
    # lm-eval's own switch for tasks marked `unsafe_code` (they run model-written code); the
    # shipped smol_code task also needs HF_ALLOW_CODE_EVAL=1 for its sandbox.
    confirm_run_unsafe_code: bool = False
    select_on: SelectSpec | None = None

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not DEVICE.fullmatch(value):
            raise ValueError(f"expected cpu, cuda, cuda:N, mps, xpu:N, npu:N or hpu:N, got {value!r}")
        return value


SWEEP_KEY = "lambda"  # the sweep every kind takes: each expert's weight times λ (merged: mergekit's `lambda`)
OWN_KEYS = {"composed": ("compose", *COMPOSE_KEYS), "merged": ("method", "parameters"), "merged_lora": ()}


def _finite(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        raise ValueError(_not_a_number(value) if not isinstance(value, float) else f"expected a finite number, got {value!r}")
    return float(value)


class VariantSpec(BaseModel):
    """A named row with its own options, e.g. `{name: ties, kind: merged, method: ties, parameters: {density: 0.5}}`.

    composed: any `compose:` option (eos_policy, rule, rule_params, ...) over the recipe's block;
    merged: a mergekit `method` and its `parameters` (default: the recipe's `merge:`); merged_lora:
    task arithmetic as one LoRA. `sweep: {PARAM: [v1, v2, ...]}` expands the row into one per value;
    PARAM is `lambda` (every expert's weight times λ), a parameter of the composed row's rule or of
    the merged row's mergekit method.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    kind: Literal["composed", "merged", "merged_lora"]
    compose: dict[str, Any] = Field(default_factory=dict)
    method: str | None = None
    parameters: dict[str, Any] | None = None
    sweep: dict[str, list[float]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _keys_of_its_kind(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError(f"expected a variant name ({', '.join(VARIANTS)}) or a mapping with name and kind, got {data!r}")
        for key in ("name", "kind"):
            if key not in data:
                raise ValueError(f"expected a {key!r} key in {data!r}")
        kind = data["kind"]
        if kind not in OWN_KEYS:
            raise ValueError(f"kind: expected one of {', '.join(OWN_KEYS)}, got {kind!r}")
        allowed = ("name", "kind", "sweep", *OWN_KEYS[kind])
        unknown = [k for k in data if k not in allowed]
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r} for a {kind} variant; allowed keys: {', '.join(allowed)}")
        compose = {**(data.get("compose") or {}), **{k: v for k, v in data.items() if k in COMPOSE_KEYS}}
        return {k: v for k, v in data.items() if k not in COMPOSE_KEYS} | ({"compose": compose} if compose else {})

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        check_name(value)
        return value

    @field_validator("sweep", mode="before")
    @classmethod
    def _sweep(cls, value):
        if value is None:
            return value
        if not isinstance(value, dict) or len(value) != 1:
            raise ValueError(f"expected one parameter and its list of values, e.g. {{lambda: [0.5, 1.0]}}, got {value!r}")
        (key, values), = value.items()
        if not isinstance(values, list) or not values:
            raise ValueError(f"{key}: expected a non-empty list of numbers, got {values!r}")
        try:
            values = [_finite(v) for v in values]
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
        return {key: _unique(f"{key} value", values)}

    @model_validator(mode="after")
    def _sweep_of_its_kind(self):
        if self.sweep and self.kind == "merged_lora" and SWEEP_KEY not in self.sweep:
            raise ValueError(f"sweep: a merged_lora variant sweeps {SWEEP_KEY} only, got {next(iter(self.sweep))!r}")
        return self


class Recipe(_Strict):
    name: str
    base: str
    experts: dict[str, ExpertSpec]
    compose: dict[str, Any] = Field(default_factory=dict, validate_default=True)
    merge: MergeSpec = MergeSpec()
    evaluate: EvaluateSpec
    variants: list[Literal[VARIANTS] | VariantSpec] = list(VARIANTS)  # type: ignore[valid-type]
    output: str
    allow_pickle: bool = False
    trust_remote_code: bool = False

    @field_validator("experts", mode="before")
    @classmethod
    def _shorthand(cls, value):
        if isinstance(value, dict):  # `name: path` is short for `name: {path: path}`
            return {k: {"path": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @field_validator("variants", mode="before")
    @classmethod
    def _variants(cls, value):
        """Each item checked on its own: pydantic's union errors would name both alternatives."""
        if not isinstance(value, list):
            raise ValueError(f"expected a list of variants, got {value!r}")
        items = []
        for i, item in enumerate(value):
            if isinstance(item, str):
                if item not in VARIANTS:
                    raise ValueError(f"[{i}]: unknown variant {item!r}; expected one of {', '.join(VARIANTS)} or a mapping with name and kind")
                items.append(item)
                continue
            try:
                items.append(VariantSpec.model_validate(item))
            except ValidationError as exc:
                name = item.get("name") if isinstance(item, dict) else None
                where = f"[{i}]{f' ({name})' if isinstance(name, str) else ''}"
                raise ValueError(f"{where}: {_one_line(exc).removeprefix('recipe: ')}") from None
        _unique("variant", [v if isinstance(v, str) else v.name for v in items])
        return items

    @field_serializer("variants")
    def _dump_variants(self, value: list) -> list:
        return [v if isinstance(v, str) else v.model_dump(mode="json", exclude_defaults=True) for v in value]

    @field_validator("compose")
    @classmethod
    def _compose_options(cls, value: dict) -> dict:
        config = _composition(value).to_dict()  # every option, checked and normalised
        return {k: config[k] for k in COMPOSE_KEYS}

    @model_validator(mode="after")
    def _cross_fields(self):
        if not self.experts:
            raise ValueError("experts: expected at least one expert")
        for name in self.experts:  # names become file names under output/ and rows of the table
            try:
                check_name(name)
            except ValueError as exc:
                raise ValueError(f"experts: {exc}") from None
            if name in VARIANTS:
                raise ValueError(f"experts: expert name {name!r} is a variant name; the variants are {', '.join(VARIANTS)}")
        if "merged_lora" in self.variants and not self.merge.lora:
            raise ValueError("variants: merged_lora needs merge.lora: true")
        for spec in self.variants:
            if not isinstance(spec, str) and spec.name in self.experts:
                raise ValueError(f"variants: {spec.name!r} is also an expert's name (the experts variant gives each expert a row)")
        select = self.evaluate.select_on
        if select and select.task not in self.evaluate.tasks:
            raise ValueError(f"evaluate.select_on.task: {select.task!r} is not one of evaluate.tasks ({', '.join(self.evaluate.tasks)})")
        from .plan import plan  # (plan builds on this module) every row's options, swept values included

        plan(self)
        config = self.composition()  # the runtime's checks of the weights
        try:  # ... and of the masks' expert names (the weights name exactly the experts)
            config.check_experts(list(self.experts))
        except ValueError as exc:
            raise ValueError(f"compose.{exc}") from None
        return self

    def composition(self) -> CompositionConfig:
        """The composition this recipe evaluates: `compose:` with each expert's weight."""
        return _composition(self.compose, {n: e.weight for n, e in self.experts.items()})

    # ---- paths relative to the recipe file -------------------------------------------------
    def resolve(self, root: Path) -> ResolvedPaths:
        return ResolvedPaths(self, Path(root))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def fingerprint(self) -> str:
        return hashlib.sha256(self.to_yaml().encode()).hexdigest()[:16]


HUB = "hf://"  # `hf://org/name` names a Hugging Face Hub repository instead of a folder


class ResolvedPaths:
    """Absolute paths of a recipe, resolved against the folder of its file.

    Hub references (`hf://org/name`) stay strings until `fetch()` downloads them; offline checks
    (`validate`, `run --dry-run`) skip them.
    """

    def __init__(self, recipe: Recipe, root: Path):
        self.root = Path(root).resolve()
        at = lambda p: p if p.startswith(HUB) else (root / p).resolve()  # noqa: E731
        self.base = at(recipe.base)
        self.experts = {n: at(e.path) for n, e in recipe.experts.items()}
        self.output = (root / recipe.output).resolve()
        self.include_path = (root / recipe.evaluate.include_path).resolve() if recipe.evaluate.include_path else None

    def fetch(self) -> None:
        """Replace hub references by local snapshots (needs the hub, unless already cached)."""
        from huggingface_hub import snapshot_download

        def get(field: str, ref):
            if not isinstance(ref, str):
                return ref
            try:
                return Path(snapshot_download(ref[len(HUB):], allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
            except Exception as exc:  # offline, gated or missing: one line naming the reference
                raise RecipeError(f"{field}: cannot fetch {ref} ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None

        self.base = get("base", self.base)
        self.experts = {n: get(f"experts.{n}", p) for n, p in self.experts.items()}


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "recipe"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}"
