"""YAML recipes: one base, its experts, composition and merge settings, and the lm-eval tasks.

Paths in a recipe are relative to the recipe file. Unknown keys are refused with one line that
names the key and the allowed ones. `merging.recipe_file.load_recipe` reads a file into this schema.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_serializer, field_validator, model_validator

from logitcomp.config import CompositionConfig
from logitcomp.inputs import check_name

from .errors import RecipeError, not_a_number, unknown_key
from .kinds import KINDS
from .kinds.composed import COMPOSE_KEYS, PromptSource, composition_config
from .kinds.routed import RoutedRoute
from .kinds.kind import Options, known_keys


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        return known_keys(cls, data)


class ExpertSpec(_Strict):
    path: str
    weight: float = 1.0
    # its example prompts, what routing is fitted on: a JSONL file (relative to the recipe), a list, or {task: NAME};
    # default: the prompts.jsonl in its folder
    prompts: PromptSource | None = None

    @field_validator("weight", mode="before")
    @classmethod
    def _number(cls, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(not_a_number(value))
        return value


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
    include_path: str | list[str] | None = None  # one folder of task YAMLs or a list of them (lm-eval's TaskManager)
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
    # the rows of a family that chooses on validation (its select_on): every task for every value ("all"), or its
    # validation task for every value and every task for the chosen value only ("chosen": test tasks cost one row)
    swept: Literal["all", "chosen"] = "all"

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not DEVICE.fullmatch(value):
            raise ValueError(f"expected cpu, cuda, cuda:N, mps, xpu:N, npu:N or hpu:N, got {value!r}")
        return value


def _finite(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        raise ValueError(not_a_number(value) if not isinstance(value, float) else f"expected a finite number, got {value!r}")
    return float(value)


def _scalar(value):
    if not isinstance(value, (str, int, float, bool)):
        raise ValueError(f"expected text or a number, got {value!r}")
    return value


def _named_kinds() -> list[str]:
    return [name for name, kind in KINDS.items() if kind.options is not None]


class VariantSpec(BaseModel):
    """A named row with its own options, e.g. `{name: ties, kind: merged, method: ties, parameters: {density: 0.5}}`.

    `kind` is a name of `merging.kinds.KINDS` that takes named rows; the other keys are that kind's
    options (its module says which). `sweep: {PARAM: [v1, v2, ...]}` expands the row into one per
    value; PARAM is `lambda` (every expert's weight times λ) or a parameter the kind sweeps. A row of a
    kind that combines experts may name the ones it combines (`experts: [math, shout]`; default: all),
    and a swept row may choose its value on its own validation task (`select_on:`, as evaluate.select_on).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    kind: str
    options: Options = Options()
    sweep: dict[str, list[float]] | None = None
    experts: list[str] | None = None
    select_on: SelectSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _options_of_its_kind(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError(f"expected a variant name ({', '.join(KINDS)}) or a mapping with name and kind, got {data!r}")
        if "options" in data and isinstance(data["options"], Options):  # already validated (a copy of a spec)
            return data
        for key in ("name", "kind"):
            if key not in data:
                raise ValueError(f"expected a {key!r} key in {data!r}")
        kind = KINDS.get(data["kind"]) if isinstance(data["kind"], str) else None
        if kind is None or kind.options is None:
            raise ValueError(f"kind: expected one of {', '.join(_named_kinds())}, got {data['kind']!r}")
        data = kind.normalise(dict(data))
        common = ("name", "kind", "sweep", "select_on", *(("experts",) if kind.combines else ()))
        allowed = (*common, *kind.options.model_fields)
        unknown = [k for k in data if k not in allowed]
        if unknown:
            raise ValueError(unknown_key(unknown[0], allowed, of=f" for a {kind.name} variant"))
        own = {k: v for k, v in data.items() if k not in common}
        return {k: v for k, v in data.items() if k in common} | {"options": kind.options.model_validate(own)}

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
        values = _unique(f"{key} value", values)
        names = [f"{v:g}" for v in values]  # a swept row is named NAME[KEY=VALUE:g]
        twin = next((i for i, name in enumerate(names) if name in names[:i]), None)
        if twin is not None:
            first = values[names.index(names[twin])]
            raise ValueError(f"{key}: values {first!r} and {values[twin]!r} would both name the row [{key}={names[twin]}]; "
                             "give values that differ in their first 6 significant digits")
        return {key: values}

    @field_validator("experts")
    @classmethod
    def _experts(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("experts: expected a non-empty list of the recipe's expert names (or no `experts:` for all)")
        return value if value is None else _unique("expert", value)

    @model_validator(mode="after")
    def _sweep_of_its_kind(self):
        problem = KINDS[self.kind].check_sweep(next(iter(self.sweep))) if self.sweep else None
        if problem:
            raise ValueError(problem)
        if self.select_on and not self.sweep:
            raise ValueError("select_on: only a swept row chooses a value; this row has no sweep")
        return self

    def dump(self) -> dict:
        """The mapping a recipe file holds for this row (its options flat, defaults left out)."""
        options = self.options.model_dump(mode="json", exclude_defaults=True)
        own = {"experts": self.experts} if self.experts else {}
        own |= {"select_on": self.select_on.model_dump(mode="json")} if self.select_on else {}
        return {"name": self.name, "kind": self.kind, **options, **({"sweep": self.sweep} if self.sweep else {}), **own}

    @classmethod
    def shorthand(cls, kind: str) -> VariantSpec:
        """The row that `variants: [KIND]` stands for: named after its kind, with its default options."""
        options = KINDS[kind].options
        return cls(name=kind, kind=kind, options=options() if options is not None else Options())

    def rows(self, recipe) -> list:
        """The rows this item expands into, planned by its kind (ValueError naming what does not hold)."""
        return KINDS[self.kind].rows(self, recipe)


class Recipe(_Strict):
    name: str
    base: str
    experts: dict[str, ExpertSpec]
    compose: dict[str, Any] = Field(default_factory=dict, validate_default=True)
    route: RoutedRoute = RoutedRoute()  # what the `routed` rows fit their routing on, and its settings
    merge: MergeSpec = MergeSpec()
    evaluate: EvaluateSpec
    variants: list[str | VariantSpec] = Field(default_factory=lambda: [n for n, k in KINDS.items() if k.default])
    output: str
    allow_pickle: bool = False
    trust_remote_code: bool = False
    # the values of the recipe's variables (`${NAME}` in its text, `--set NAME=VALUE`), already substituted
    vars: dict[str, Annotated[Any, AfterValidator(_scalar)]] = Field(default_factory=dict)

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
                if item not in KINDS:
                    raise ValueError(f"[{i}]: unknown variant {item!r}; expected one of {', '.join(KINDS)} or a mapping with name and kind")
                items.append(item)
                continue
            try:
                items.append(VariantSpec.model_validate(item))
            except ValidationError as exc:
                name = item.get("name") if isinstance(item, dict) else None
                where = name if isinstance(name, str) else f"[{i}]"  # the row's name, as every later message names it
                raise ValueError(f"{where}: {load_error(exc).removeprefix('recipe: ')}") from None
        _unique("variant", [v if isinstance(v, str) else v.name for v in items])
        return items

    @field_serializer("variants")
    def _dump_variants(self, value: list) -> list:
        return [v if isinstance(v, str) else v.dump() for v in value]

    @field_validator("compose")
    @classmethod
    def _compose_options(cls, value: dict) -> dict:
        config = composition_config(value).to_dict()  # every option, checked and normalised
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
            if name in KINDS:
                raise ValueError(f"experts: expert name {name!r} is a variant name; the variants are {', '.join(KINDS)}")
        for problem in (KINDS[v].unavailable(self) for v in self.variants if isinstance(v, str)):
            if problem:
                raise ValueError(problem)
        for spec in self.variants:
            if isinstance(spec, str):
                continue
            if spec.name in self.experts:
                raise ValueError(f"variants: {spec.name!r} is also an expert's name (the experts variant gives each expert a row)")
            unknown = [n for n in spec.experts or [] if n not in self.experts]
            if unknown:
                raise ValueError(f"variants: {spec.name}: experts: {unknown[0]!r} is not an expert of the recipe ({', '.join(self.experts)})")
            if spec.select_on and spec.select_on.task not in self.evaluate.tasks:
                raise ValueError(f"variants: {spec.name}: select_on.task: {spec.select_on.task!r} is not one of evaluate.tasks "
                                 f"({', '.join(self.evaluate.tasks)})")
        select = self.evaluate.select_on
        if select and select.task not in self.evaluate.tasks:
            raise ValueError(f"evaluate.select_on.task: {select.task!r} is not one of evaluate.tasks ({', '.join(self.evaluate.tasks)})")
        if self.evaluate.swept == "chosen" and not select and not any(isinstance(v, VariantSpec) and v.sweep and v.select_on for v in self.variants):
            raise ValueError("evaluate.swept: chosen needs a family that chooses: evaluate.select_on, or a swept row's select_on")
        config = self.composition()  # the runtime's checks of the weights
        try:  # ... and of the masks' expert names (the weights name exactly the experts)
            config.check_experts(list(self.experts))
        except ValueError as exc:
            raise ValueError(f"compose.{exc}") from None
        return self

    def composition(self) -> CompositionConfig:
        """The composition this recipe evaluates: `compose:` with each expert's weight."""
        return composition_config(self.compose, {n: e.weight for n, e in self.experts.items()})

    # ---- paths relative to the recipe file -------------------------------------------------
    def resolve(self, root: Path) -> ResolvedPaths:
        return ResolvedPaths(self, Path(root))

    def dump(self) -> dict:
        """The recipe as the mapping its file would hold (`vars:`, `route:` and an expert's `prompts:` only where given)."""
        data = self.model_dump(mode="json", exclude=None if self.vars else {"vars"})
        if self.route == RoutedRoute():
            del data["route"]
        for expert in data["experts"].values():
            if expert["prompts"] is None:
                del expert["prompts"]
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.dump(), sort_keys=False)

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
        include = recipe.evaluate.include_path
        self.include_paths = [(root / p).resolve() for p in ([include] if isinstance(include, str) else include or [])]
        # expert -> its example prompts as the recipe gives them: a file's resolved Path, a list, or {"task": NAME}
        self.prompts = {n: (root / e.prompts).resolve() if isinstance(e.prompts, str) else
                        e.prompts if isinstance(e.prompts, list) else e.prompts.model_dump()
                        for n, e in recipe.experts.items() if e.prompts is not None}

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


def _union_tag(part) -> bool:
    """Whether a part of a pydantic error location names a member of a union type (`dict[str,float]`,
    `constrained-float`, `literal['fit']`) rather than a field or key."""
    return isinstance(part, str) and ("[" in part or re.fullmatch(r"(constrained|function|lax|strict)-[a-z-]+", part) is not None)


def load_error(exc: ValidationError) -> str:
    """A pydantic ValidationError as one line: `field.path: message` of its first error."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not _union_tag(p)) or "recipe"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":  # pydantic's "Extra inputs are not permitted", in the words of every other key
        loc, _, key = loc.rpartition(".")
        loc, msg = loc or "recipe", f"unknown key {key!r}"
    return f"{loc}: {msg}"
