"""Compose a recipe's experts, or build one of its rows, and decode one prompt (the `logitcomp generate` command)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .checks import check_device
from .plan import prepare


@dataclass(frozen=True)
class Generation:
    """A greedy continuation and, when traced, per new token: (token, KL(p_i ‖ p_b) per expert, composed entropy)."""

    text: str
    experts: list[str]
    trace: list[tuple[str, list[float], float]]


def generate_from_recipe(path, prompt: str, max_new_tokens: int = 32, trace: bool = False, rule: str | None = None,
                         rule_params: dict | None = None, sets: dict | None = None, row: str | None = None) -> Generation:
    """Greedy decoding of `prompt` by the recipe's composed model (`rule`/`rule_params` override the recipe's;
    `sets`: the values of the recipe's variables), or by its row `row` as the run builds it (a routed row fitted,
    a swept family's chosen row)."""
    from transformers import AutoTokenizer

    from logitcomp import ComposedModelForCausalLM

    p = prepare(path, check_tasks=row is not None, sets=sets)
    recipe, paths = p.recipe, p.paths
    check_device(recipe.evaluate.device)
    paths.fetch()
    if row is not None:
        if rule is not None or rule_params is not None:
            raise ValueError("--rule: a row composes by its own rule; give --rule without --row")
        return _generate_row(p, row, prompt, max_new_tokens, trace)
    config = recipe.composition()
    if rule is not None or rule_params is not None:
        config = dataclasses.replace(config, rule=rule or config.rule,
                                     rule_params=rule_params if rule_params is not None else ({} if rule else config.rule_params))
    ev = recipe.evaluate
    composed = ComposedModelForCausalLM.from_experts(paths.base, paths.experts, config=config, dtype=None if ev.dtype == "auto" else ev.dtype,
                                                     device=ev.device, allow_pickle=recipe.allow_pickle,
                                                     trust_remote_code=recipe.trust_remote_code)
    return _decode(composed, AutoTokenizer.from_pretrained(paths.base), prompt, max_new_tokens, trace)


def _generate_row(p, name: str, prompt: str, max_new_tokens: int, trace: bool) -> Generation:
    from transformers import AutoTokenizer

    from .export import pick_row
    from .kinds import KINDS
    from .pool import ModelPool

    variant = pick_row(p, name)
    with KINDS[variant.kind].model(variant, ModelPool(p.recipe, p.paths)) as model:
        if trace and not hasattr(model, "trace"):
            raise ValueError(f"--trace: {variant.name} is a {variant.kind} row; only a composition is traced")
        return _decode(model, AutoTokenizer.from_pretrained(p.paths.base), prompt, max_new_tokens, trace)


def _decode(model, tokenizer, prompt: str, max_new_tokens: int, trace: bool) -> Generation:
    """Greedy decoding of `prompt`; with `trace`, each new token's experts' activity (a composition)."""
    import torch

    batch = tokenizer([prompt], return_tensors="pt").to(model.device)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False)  # (1, T + new)
    new = out[0, batch.input_ids.shape[1]:]
    rows = []
    if trace:
        steps = model.trace(out)  # position t scores token t + 1
        start = batch.input_ids.shape[1] - 1
        for i, token in enumerate(tokenizer.convert_ids_to_tokens(new.tolist())):
            rows.append((token, steps.kl[0, start + i].tolist(), steps.entropy[0, start + i].item()))
    return Generation(tokenizer.decode(new, skip_special_tokens=True), list(getattr(model, "experts", [])), rows)
