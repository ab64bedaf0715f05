"""Compose a recipe's experts and decode one prompt (the `logitcomp generate` command)."""

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
                         rule_params: dict | None = None, sets: dict | None = None) -> Generation:
    """Greedy decoding of `prompt` by the recipe's composed model (`rule`/`rule_params` override the recipe's;
    `sets`: the values of the recipe's variables)."""
    import torch
    from transformers import AutoTokenizer

    from logitcomp import ComposedModelForCausalLM

    p = prepare(path, check_tasks=False, sets=sets)
    recipe, paths = p.recipe, p.paths
    check_device(recipe.evaluate.device)
    paths.fetch()
    config = recipe.composition()
    if rule is not None or rule_params is not None:
        config = dataclasses.replace(config, rule=rule or config.rule,
                                     rule_params=rule_params if rule_params is not None else ({} if rule else config.rule_params))
    ev = recipe.evaluate
    composed = ComposedModelForCausalLM.from_experts(paths.base, paths.experts, config=config, dtype=None if ev.dtype == "auto" else ev.dtype,
                                                     device=ev.device, allow_pickle=recipe.allow_pickle,
                                                     trust_remote_code=recipe.trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(paths.base)
    batch = tokenizer([prompt], return_tensors="pt").to(composed.device)
    with torch.no_grad():
        out = composed.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False)  # (1, T + new)
    new = out[0, batch.input_ids.shape[1]:]
    rows = []
    if trace:
        steps = composed.trace(out)  # position t scores token t + 1
        start = batch.input_ids.shape[1] - 1
        for i, token in enumerate(tokenizer.convert_ids_to_tokens(new.tolist())):
            rows.append((token, steps.kl[0, start + i].tolist(), steps.entropy[0, start + i].item()))
    return Generation(tokenizer.decode(new, skip_special_tokens=True), list(composed.experts), rows)
