"""Variant kinds added through the registry alone: peft's Arrow routing as recipe rows (one module,
`merging/kinds/arrow.py`, and one registry line), checked against peft's `create_arrow_model` loaded
on its own and scored through lm-eval."""

from __future__ import annotations

import math

import yaml

from common import TASKS, bits_per_byte, count_planning, make_tiny_lora


def test_arrow_rows_equal_peft_arrow_loaded_on_its_own(tiny, tmp_path, monkeypatch):
    from peft import ArrowConfig, create_arrow_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from merging.runner import run_recipe

    # Arrow routes adapters of one rank and one set of target modules
    experts = {n: make_tiny_lora(tiny.base, tmp_path / n, seed=s, r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "up_proj"])
               for n, s in (("x", 21), ("y", 22), ("z", 23))}
    recipe = {"name": "arrow", "base": str(tiny.base), "experts": {n: str(p) for n, p in experts.items()},
              "evaluate": {"tasks": ["smol_text"], "include_path": str(TASKS), "limit": 4, "batch_size": 4},
              "variants": ["base", "arrow", {"name": "hot", "kind": "arrow", "sweep": {"router_temperature": [0.25, 4.0]}},
                           {"name": "one", "kind": "arrow", "top_k": 1}],
              "output": "out"}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    planned = count_planning(monkeypatch)
    results = run_recipe(path, echo=lambda *_: None)
    assert planned == ["base", "arrow", "hot", "one"]
    monkeypatch.undo()
    got = {name: r["smol_text"]["bits_per_byte,none"] for name, r in results.items()}

    tok = AutoTokenizer.from_pretrained(tiny.base)
    paths = [str(p) for p in experts.values()]

    def arrow(**config):
        model = create_arrow_model(AutoModelForCausalLM.from_pretrained(tiny.base), paths, ArrowConfig(rng_seed=0, **config))
        return bits_per_byte(model, tok)

    reference = {"base": bits_per_byte(AutoModelForCausalLM.from_pretrained(tiny.base), tok),
                 "arrow": arrow(top_k=3, router_temperature=1.0),  # the defaults: peft's top_k 3 (here every expert)
                 "hot[router_temperature=0.25]": arrow(top_k=3, router_temperature=0.25),
                 "hot[router_temperature=4]": arrow(top_k=3, router_temperature=4.0),
                 "one": arrow(top_k=1, router_temperature=1.0)}
    for name, expected in reference.items():
        assert math.isclose(got[name], expected, rel_tol=1e-6), (name, got[name], expected)
    assert len({round(v, 6) for v in got.values()}) == len(got)  # routing settings change the model
