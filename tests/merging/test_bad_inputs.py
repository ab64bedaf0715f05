"""Bad input through the real command lines (`logitcomp` and `logitcomp-lm-eval`), one table:
exit 2, one line on stderr naming the file or field, no traceback, nothing written (issue 13)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks"
LM_EVAL = "from merging.harness.cli import lm_eval_main; lm_eval_main()"
LM_EVAL_LOG = re.compile(r"\d{4}-\d\d-\d\d:\d\d:\d\d:\d\d (INFO|WARNING) ")  # lm-eval's CLI logs its progress; those lines are not errors


def _recipe(case: Path, tiny, **changes) -> Path:
    data = {"name": "bad", "base": str(tiny.base), "experts": {"a": str(tiny.adapters["a"]), "b": str(tiny.adapters["b"])},
            "evaluate": {"tasks": ["toy_a2b_c2d"], "include_path": str(TASKS), "limit": 2, "batch_size": 2}, "output": "out"}
    for key, value in changes.items():
        if "." in key:  # evaluate.limit=...: one key of a section
            section, sub = key.split(".")
            data[section] = {**data.get(section, {}), sub: value}
        else:
            data[key] = value
    path = case / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _text(case: Path, text: str | bytes) -> Path:
    path = case / "recipe.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def _copy(src: Path, case: Path, name: str) -> Path:
    return Path(shutil.copytree(src, case / name))


def _weights(folder: Path, edit) -> Path:
    """Rewrite the folder's safetensors file through `edit(bytes) -> bytes`."""
    file = next(folder.glob("*.safetensors"))
    file.write_bytes(edit(file.read_bytes()))
    return folder


def _tensors(folder: Path, edit) -> Path:
    """Rewrite the folder's tensors through `edit(dict)`."""
    file = next(folder.glob("*.safetensors"))
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})
    return folder


def _json(file: Path, edit) -> None:
    file.write_text(json.dumps(edit(json.loads(file.read_text()))))


def _nan(tensors):
    key = next(k for k in tensors if "lora_B" in k)
    tensors[key][0, 0] = float("nan")


def _wider_a(tensors):
    key = next(k for k in tensors if "lora_A" in k)
    tensors[key] = torch.zeros(tensors[key].shape[0], tensors[key].shape[1] + 3)


def _adapter(case, tiny, prepare, pattern, command="validate"):
    """A recipe whose expert `a` is a copy of the tiny adapter changed by `prepare(folder)`."""
    def build(c):
        folder = _copy(tiny.adapters["a"], c, "adapter")
        prepare(folder)
        return [command, _recipe(c, tiny, experts={"a": str(folder)})]
    return build, pattern


def _base(tiny, prepare, pattern):
    def build(c):
        folder = _copy(tiny.base, c, "base")
        prepare(folder)
        return ["validate", _recipe(c, tiny, base=str(folder), experts={"f": str(tiny.full_expert)})]
    return build, pattern


def _lm_eval(tiny, model_args: str, pattern: str):
    def build(c):
        return ["--lm-eval", "--model", "logitcomp", "--model_args", model_args.format(base=tiny.base, a=tiny.adapters["a"]),
                "--tasks", "toy_a2b_c2d", "--limit", "1"]
    return build, pattern


def _r(pattern, command="validate", **changes):
    return (lambda c, tiny: [command, _recipe(c, tiny, **changes)]), pattern


def _t(text, pattern, command="validate"):
    return (lambda c, tiny: [command, _text(c, text)]), pattern


BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))

# id -> (case folder, tiny) -> argv, and the pattern the one line must match
CASES = {
    # the recipe file and its YAML
    "missing recipe": ((lambda c, tiny: ["run", c / "absent.yaml"]), r"absent\.yaml: no such recipe file"),
    "recipe not UTF-8": _t(b"name: caf\xe9\n", r"recipe\.yaml: not UTF-8 text \(byte 0xe9 at offset 9\)"),
    "recipe over 1 MiB": _t("# " + "x" * (1 << 20) + "\nname: x\n", r"recipe\.yaml: \d+ bytes; a recipe may hold at most 1048576 bytes", "run"),
    "YAML alias bomb": _t(BOMB + "name: x\n", r"aliases expand to more than 100000 YAML nodes", "run"),
    "recursive alias": _t("name: x\ngen: &g [1, *g]\n", r"a recursive alias"),
    "YAML syntax": _t("name: [x\n", r"recipe\.yaml \(line \d+\): "),
    "deeply nested YAML": _t("name: " + "[" * 20000 + "]" * 20000 + "\n", r"recipe\.yaml: nested too deeply"),
    "top level list": _t("- name: x\n", r"expected a mapping of recipe keys"),
    "unknown key": _r(r"recipe: unknown key 'colour'; allowed keys: name, base", colour="blue"),
    "duplicate key": _t("name: x\nname: y\n", r"line 2\): duplicate key 'name'", "run"),
    "python object tag": _t("name: !!python/object/apply:os.system [echo hi]\n", r"could not determine a constructor for the tag"),
    "name missing": _t("base: x\n", r"name: Field required"),
    # experts and the composition
    "no experts": _r(r"experts: expected at least one expert", experts={}),
    "expert name is a path": _r(r"experts: expert name 'a/b': expected letters", experts={"a/b": "x"}),
    "expert name is a variant": _r(r"expert name 'composed' is a variant name", experts={"composed": "x"}),
    "weight NaN": _t("", ""),  # filled below (needs the tiny paths)
    "weight inf": _t("", ""),
    "weight text": _t("", ""),
    "weight 1.0e38 as text": _t("", ""),
    "weight too large": _t("", ""),
    "floor zero": _r(r"compose: floor: expected a negative number >= -1e9, got 0", "run", compose={"floor": 0}),
    "floor NaN": _r(r"compose: floor: expected a negative number >= -1e9, got nan", compose={"floor": float("nan")}),
    "floor as text": _r(r"compose: floor: expected a number, got the text '-1.0e4' \(YAML reads an exponent", compose={"floor": "-1.0e4"}),
    "eos policy": _r(r"compose: eos_policy: expected one of \['compose', 'base', 'any', 'all', 'all_experts', 'top'\], got 'first'", compose={"eos_policy": "first"}),
    "negative mask id": _r(r"compose: masks\['a'\]: expected a list of non-negative token ids", compose={"masks": {"a": [3, -1]}}),
    "mask of an unknown expert": _r(r"compose\.masks: unknown expert 'z'", compose={"masks": {"z": [3]}}),
    "mask id past the vocabulary": _r(r"compose\.masks\['a'\]: token id 500 is outside the base's vocabulary of 99", "run", compose={"masks": {"a": [3, 500]}}),
    "unknown rule": _r(r"compose: rule: expected one of \['product', 'tempered', 'activity', 'confident', 'union', 'plausible', 'mixture'\], got 'blend'", compose={"rule": "blend"}),
    "rule parameter out of range": _r(r"compose: rule_params\.alpha: expected a number in \[0, 1\], got 3", compose={"rule": "plausible", "rule_params": {"alpha": 3}}),
    "compose weights key": _r(r"compose: unknown key 'weights'; allowed keys: floor, eos_policy, masks", compose={"weights": {"a": 2.0}}),
    # evaluate, variants, merge
    "limit 0": _r(r"evaluate\.limit: Input should be greater than 0", "run", **{"evaluate.limit": 0}),
    "limit negative": _r(r"evaluate\.limit: Input should be greater than 0", **{"evaluate.limit": -1}),
    "limit NaN": _r(r"evaluate\.limit: Input should be a finite number", **{"evaluate.limit": float("nan")}),
    "no tasks": _r(r"evaluate\.tasks: expected at least one task", "run", **{"evaluate.tasks": []}),
    "task twice": _r(r"evaluate\.tasks: task 'toy_a2b_c2d' is listed twice", **{"evaluate.tasks": ["toy_a2b_c2d", "toy_a2b_c2d"]}),
    "unknown task": _r(r"unknown lm-eval task 'toy_a2b_c3d'; did you mean toy_a2b_c2d", "run", **{"evaluate.tasks": ["toy_a2b_c3d"]}),
    "missing include_path": _r(r"evaluate\.include_path: .*no_tasks_here is not a folder", **{"evaluate.include_path": "no_tasks_here"}),
    "batch size 0": _r(r"evaluate\.batch_size: Input should be greater than or equal to 1", **{"evaluate.batch_size": 0}),
    "negative few-shot": _r(r"evaluate\.num_fewshot: Input should be greater than or equal to 0", **{"evaluate.num_fewshot": -1}),
    "bad device": _r(r"evaluate\.device: expected cpu, cuda, cuda:N, .* got 'quantum'", **{"evaluate.device": "quantum"}),
    "device absent here": _r(r"evaluate\.device: cuda:3 is not available here", "run", **{"evaluate.device": "cuda:3"}),
    "bad dtype": _r(r"evaluate\.dtype: Input should be 'auto', 'float32'", **{"evaluate.dtype": "float33"}),
    "no variants": _r(r"variants: expected at least one variant", "run", variants=[]),
    "variant twice": _r(r"variants: variant 'base' is listed twice", variants=["base", "composed", "base"]),
    "unknown variant": _r(r"variants: \[0\]: unknown variant 'ensemble'; expected one of base, experts, composed", variants=["ensemble"]),
    "variant of an unknown kind": _r(r"variants: x: kind: expected one of experts, composed, routed, merged, merged_lora, arrow, distilled, oracle, got 'ensemble'",
                                     variants=["base", {"name": "x", "kind": "ensemble"}]),
    "option of another kind": _r(r"variants: x: unknown key 'method' for a composed variant; allowed keys: name, kind, sweep",
                                 variants=[{"name": "x", "kind": "composed", "method": "ties"}]),
    "empty sweep": _r(r"variants: ta: sweep: lambda: expected a non-empty list of numbers, got \[\]",
                      variants=[{"name": "ta", "kind": "merged", "sweep": {"lambda": []}}]),
    "sweep value twice": _r(r"variants: ta: sweep: lambda value 1\.0 is listed twice", variants=[{"name": "ta", "kind": "merged", "sweep": {"lambda": [1, 1.0]}}]),
    "sweep of two parameters": _r(r"sweep: expected one parameter and its list of values", variants=[{"name": "ta", "kind": "merged", "sweep": {"lambda": [1], "density": [1]}}]),
    "sweep of an unknown method parameter": _r(r"variants: ta\.sweep: mergekit's task_arithmetic takes .*density.*, got 'densty'",
                                               variants=[{"name": "ta", "kind": "merged", "method": "task_arithmetic", "sweep": {"densty": [0.5]}}]),
    "unknown method parameter": _r(r"variants: ties\.parameters: mergekit's ties takes .*, got 'dnsity'",
                                   variants=[{"name": "ties", "kind": "merged", "method": "ties", "parameters": {"dnsity": 0.5}}]),
    "lambda of a method without one": _r(r"variants: avg\.sweep: mergekit's linear takes normalize, got 'lambda'",
                                         variants=[{"name": "avg", "kind": "merged", "method": "linear", "sweep": {"lambda": [0.5, 1]}}]),
    "sweep of a parameter the rule lacks": _r(r"variants: x: sweep: a composed variant sweeps lambda or a parameter of its rule product \(no parameters\), got 'gamma'",
                                              variants=[{"name": "x", "kind": "composed", "sweep": {"gamma": [1, 2]}}]),
    "swept rule parameter out of range": _r(r"variants: x: rule_params\.alpha: expected a number in \[0, 1\], got 2\.0",
                                            variants=[{"name": "x", "kind": "composed", "rule": "plausible", "sweep": {"alpha": [0.5, 2]}}]),
    "variant named as an expert": _r(r"variants: 'a' is also an expert's name", variants=[{"name": "a", "kind": "composed"}]),
    "sweep values that name one row": _r(r"variants: ta: sweep: lambda: values 0\.3 and 0\.30000000000000004 would both name the row "
                                         r"\[lambda=0\.3\]", variants=[{"name": "ta", "kind": "merged", "sweep": {"lambda": [0.3, 0.30000000000000004]}}]),
    # issue 30.9: what `run` refused only after spending compute
    "a 300-character expert name": _r(r"variants: the row a{40}\.\.\. has a 300-byte name; row names .* hold at most 200 bytes",
                                      experts={"a" * 300: "x"}, variants=["experts"]),
    "a swept name over the limit": _r(r"variants: the row v{40}\.\.\. has a 209-byte name",
                                      variants=[{"name": "v" * 197, "kind": "composed", "sweep": {"lambda": [0.5]}}]),
    "one adapter under two names": ((lambda c, tiny: ["validate", _recipe(c, tiny, experts={"a": str(tiny.adapters["a"]), "b": str(tiny.adapters["a"])})]),
                                    r"experts: a and b are the same folder .*; list each expert once"),
    "output is a file": ((lambda c, tiny: (c / "taken").write_text("x") and ["validate", _recipe(c, tiny, output="taken")]),
                         r"output: .*taken is not a folder; choose an empty or new folder"),
    "arrow over experts of two ranks": _r(r"variants: arrow: peft's Arrow needs LoRA experts of one rank and one set of target modules; "
                                          r"a has r=2 on \('q_proj', 'v_proj'\), b r=4", variants=["arrow"]),
    "arrow over a full expert": ((lambda c, tiny: ["validate", _recipe(c, tiny, experts={"a": str(tiny.adapters["a"]), "f": str(tiny.full_expert)},
                                                                      variants=[{"name": "ar", "kind": "arrow"}])]),
                                 r"variants: ar: peft's Arrow routes LoRA experts only; f is a full model"),
    "arrow top_k above the experts": _r(r"variants: ar: top_k: 3 is more than the 2 experts Arrow routes between",
                                        variants=[{"name": "ar", "kind": "arrow", "top_k": 3}]),
    "arrow sweep of lambda": _r(r"variants: ar: sweep: an arrow variant sweeps top_k or router_temperature, got 'lambda'",
                                variants=[{"name": "ar", "kind": "arrow", "sweep": {"lambda": [1]}}]),
    "arrow temperature 0": _r(r"variants: ar: router_temperature: Input should be greater than 0",
                              variants=[{"name": "ar", "kind": "arrow", "router_temperature": 0}]),
    "select_on task not evaluated": _r(r"evaluate\.select_on\.task: 'toy_a2b_c2d_val' is not one of evaluate\.tasks \(toy_a2b_c2d\)",
                                       **{"evaluate.select_on": {"task": "toy_a2b_c2d_val", "metric": "exact_match"}}),
    "swept chosen without a choice": _r(r"evaluate\.swept: chosen needs a family that chooses: evaluate\.select_on, or a swept row's select_on",
                                        **{"evaluate.swept": "chosen"}),
    "swept neither all nor chosen": _r(r"evaluate\.swept: Input should be 'all' or 'chosen'", **{"evaluate.swept": "some"}),
    "unknown merge method": _r(r"merge\.method: unknown merge method 'avg'; mergekit has", merge={"method": "avg"}),
    "merged_lora without lora": _r(r"variants: merged_lora needs merge\.lora: true", merge={"lora": False}),
    "unsafe code without opt-in": _r(r"evaluate\.confirm_run_unsafe_code: HF_ALLOW_CODE_EVAL: .*set HF_ALLOW_CODE_EVAL=1",
                                     **{"evaluate.confirm_run_unsafe_code": True}),
    # model and adapter folders
    "base missing": _r(r"base: .*nobase is not a model folder", "run", base="nobase"),
    "expert missing": _r(r"experts\.x: .*missing does not exist", experts={"x": "missing"}),
    "expert folder is neither": _r(r"expert 'x': .* is neither a peft adapter", experts={"x": "."}),
    "output is the root": _r(r"output: / is a system root or the home folder", "run", output="/"),
}
CASES.update({
    "weight NaN": _r(r"weight of expert 'a': expected a finite number, got nan", experts={"a": {"path": "x", "weight": float("nan")}}),
    "weight inf": _r(r"weight of expert 'a': expected a finite number, got inf", "run", experts={"a": {"path": "x", "weight": float("inf")}}),
    "weight text": _r(r"experts\.a\.weight: expected a number, got 'heavy'$", experts={"a": {"path": "x", "weight": "heavy"}}),
    "weight 1.0e38 as text": _r(r"experts\.a\.weight: expected a number, got the text '1\.0e38' \(YAML reads an exponent without a sign as text: write 1\.0e\+38\)",
                                experts={"a": {"path": "x", "weight": "1.0e38"}}),
    "weight too large": _r(r"weight of expert 'a': expected a number in \[-1e6, 1e6\], got 1e\+38", experts={"a": {"path": "x", "weight": 1e38}}),
})


def _model_cases(tiny) -> dict:
    truncate = lambda data: data[:-7]  # noqa: E731
    return {
        "base safetensors empty": _base(tiny, lambda f: _weights(f, lambda d: b""), r"base: .*model\.safetensors is not a readable safetensors file \(empty\)"),
        "base safetensors truncated": _base(tiny, lambda f: _weights(f, truncate), r"base: .*model\.safetensors is not a readable safetensors file \(truncated"),
        "base safetensors garbage": _base(tiny, lambda f: _weights(f, lambda d: b"\x05" * 64), r"base: .* is not a readable safetensors file"),
        "base config not JSON": _base(tiny, lambda f: (f / "config.json").write_text("{oops"), r"base: .*config\.json is not valid JSON"),
        "base only pickled": _base(tiny, lambda f: [p.rename(p.with_suffix(".bin")) for p in f.glob("*.safetensors")],
                                   r"base: .* has only pickled weights \(model\.bin\); convert to safetensors or opt in with allow_pickle"),
        "adapter safetensors empty": _adapter(None, tiny, lambda f: _weights(f, lambda d: b""), r"experts\.a: .*adapter_model\.safetensors is not a readable safetensors file \(empty\)", "run"),
        "adapter safetensors truncated": _adapter(None, tiny, lambda f: _weights(f, truncate), r"experts\.a: .* is not a readable safetensors file \(truncated"),
        "adapter config a list": _adapter(None, tiny, lambda f: (f / "adapter_config.json").write_text("[1, 2]"),
                                          r"experts\.a: .*adapter_config\.json holds a JSON list; expected an object", "run"),
        "adapter config without peft_type": _adapter(None, tiny, lambda f: _json(f / "adapter_config.json", lambda d: {k: v for k, v in d.items() if k != "peft_type"}),
                                                     r"experts\.a: .*adapter_config\.json has no peft_type; expected a LoRA adapter"),
        "adapter of another peft type": _adapter(None, tiny, lambda f: _json(f / "adapter_config.json", lambda d: {**d, "peft_type": "IA3"}),
                                                 r"experts\.a: .*has peft_type 'IA3'; expected a LoRA adapter"),
        "adapter config not JSON": _adapter(None, tiny, lambda f: (f / "adapter_config.json").write_text("peft"), r"experts\.a: .*adapter_config\.json is not valid JSON"),
        "adapter NaN weights": _adapter(None, tiny, lambda f: _tensors(f, _nan), r"experts\.a: .*adapter has NaN or inf in .*lora_B", "run"),
        "merge of a NaN adapter": _adapter(None, tiny, lambda f: _tensors(f, _nan), r"experts\.a: .*adapter has NaN or inf in .*lora_B", "merge"),
        "adapter shapes do not fit": _adapter(None, tiny, lambda f: _tensors(f, _wider_a), r"experts\.a: .* does not fit the base .*: .* is 16x16, the adapter's B·A is", "run"),
        "adapter of another base": _adapter(None, tiny, lambda f: _json(f / "adapter_config.json", lambda d: {**d, "base_model_name_or_path": str(tiny.full_expert)}),
                                            r"expert 'a': .* is an adapter of .*full, not of the base"),
        "adapter only pickled": _adapter(None, tiny, lambda f: (f / "adapter_model.safetensors").rename(f / "adapter_model.bin"),
                                         r"experts\.a: .* has only pickled weights \(adapter_model\.bin\)"),
        "full expert of another vocabulary": ((lambda c: ["validate", _recipe(c, tiny, experts={"f": str(_vocab(c, tiny))})]),
                                              r"experts\.f: .* has a vocabulary of 120 tokens, the base 99"),
        "output is the base": ((lambda c: ["run", _recipe(c, tiny, output=str(tiny.base))]), r"output: .* is a model folder"),
        "generate: prompt not UTF-8": ((lambda c: ["generate", "--recipe", _recipe(c, tiny), "--prompt", b"caf\xe9"]), r"--prompt: not UTF-8 text"),
        "generate: no new tokens": ((lambda c: ["generate", "--recipe", _recipe(c, tiny), "--prompt", "AB>", "--max-new-tokens", "0"]),
                                    r"argument --max-new-tokens: expected a whole number >= 1, got '0' \(see logitcomp generate --help\)"),
        "generate: bad rule parameter": ((lambda c: ["generate", "--recipe", _recipe(c, tiny), "--prompt", "AB>", "--rule", "activity", "--rule-param", "gamma"]),
                                         r"--rule-param: expected NAME=NUMBER, got 'gamma'"),
        "generate: unknown rule": ((lambda c: ["generate", "--recipe", _recipe(c, tiny), "--prompt", "AB>", "--rule", "blend"]), r"rule: expected one of"),
        "unknown command": ((lambda c: ["evaluate", "x.yaml"]), r"argument COMMAND: invalid choice: 'evaluate'"),
        "lm-eval: weight not a number": _lm_eval(tiny, "base={base},experts=a:{a},weights=a:abc", r"^logitcomp-lm-eval: error: weights\.a: expected a number, got 'abc'$"),
        "lm-eval: NaN adapter": ((lambda c: _lm_eval(tiny, f"base={{base}},experts=a:{_tensors(_copy(tiny.adapters['a'], c, 'nan'), _nan)}", "")[0](c)),
                                 r"expert 'a': .*nan has NaN or inf in"),
    }


def _vocab(case: Path, tiny) -> Path:
    folder = _copy(tiny.full_expert, case, "full")
    _json(folder / "config.json", lambda d: {**d, "vocab_size": 120})
    return folder


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def _run_case(build, case: Path) -> tuple[subprocess.CompletedProcess, dict, dict]:
    case.mkdir()
    argv = build(case)
    before = _tree(case)
    time.sleep(0.01)  # distinct mtimes for anything written after
    if argv[0] == "--lm-eval":
        command = [sys.executable, "-c", LM_EVAL, *map(str, argv[1:])]
    else:
        command = [sys.executable, "-m", "merging.cli", *[a if isinstance(a, bytes) else str(a) for a in argv]]
    env = {k: v for k, v in os.environ.items() if k != "HF_ALLOW_CODE_EVAL"}
    proc = subprocess.run(command, capture_output=True, cwd=case, env=env, timeout=300)
    return proc, before, _tree(case)


def test_every_bad_input_is_one_line_exit_2_and_writes_nothing(tiny, tmp_path):
    cases = {**CASES, **{k: ((lambda b: lambda c, tiny: b(c))(b), p) for k, (b, p) in _model_cases(tiny).items()}}
    assert len(cases) >= 40
    with ThreadPoolExecutor(2) as pool:  # two CLI processes at a time (2 cores); each is mostly start-up
        futures = {name: pool.submit(_run_case, lambda c, b=build: b(c, tiny), tmp_path / f"case{i:02d}")
                   for i, (name, (build, _)) in enumerate(cases.items())}
    failures = []
    for name, future in futures.items():
        proc, before, after = future.result()
        stderr = proc.stderr.decode(errors="replace")
        lines = [line for line in stderr.splitlines() if line.strip() and not LM_EVAL_LOG.match(line)]
        pattern = cases[name][1]
        if proc.returncode != 2 or len(lines) != 1 or "Traceback" in stderr or not re.search(pattern, lines[0]):
            failures.append(f"{name}: exit {proc.returncode}, stderr {stderr[-600:]!r}")
        elif after != before:
            failures.append(f"{name}: wrote {sorted(set(after.items()) - set(before.items()))}")
    print(f"{len(cases)} bad inputs checked")
    assert not failures, "\n".join(failures)


# Model-argument errors of the lm-eval model, raised where lm-eval's CLI creates it (`create_from_arg_string`) and
# checked in this process: each lm-eval CLI start indexes lm-eval's ~15,000 task files first (10 s), so the table
# above runs three of them end to end (a model argument, a NaN adapter, an unknown task) through the same wrapper.
LM_EVAL_MODEL_ARGS = [
    ("rule parameter not a number", "base={base},experts=a:{a},rule=activity,rule_params=gamma:x", r"rule_params\.gamma: expected a number, got 'x'"),
    ("unknown model arg", "base={base},experts=a:{a},colour=blue", r"model_args: unknown argument 'colour' for the logitcomp model"),
    ("experts without names", "base={base},experts={a}", r"experts: expected name:value items joined by '\|'"),
    ("floor not a number", "base={base},experts=a:{a},floor=abc", r"floor: expected a number, got 'abc'"),
    ("no model", "max_length=64", r"model_args: expected pretrained=<composed folder>, or base=<folder>"),
    ("missing composition", "pretrained=/nonexistent/composition", r"/nonexistent/composition: no composition\.json"),
    ("bad flag", "base={base},experts=a:{a},allow_pickle=perhaps", r"allow_pickle: expected true or false, got 'perhaps'"),
    ("bad dtype", "base={base},experts=a:{a},dtype=float33", r"dtype: expected auto, float32, float16, bfloat16 or float64, got 'float33'"),
]


@pytest.mark.parametrize(("model_args", "pattern"), [c[1:] for c in LM_EVAL_MODEL_ARGS], ids=[c[0] for c in LM_EVAL_MODEL_ARGS])
def test_lm_eval_model_arguments_fail_with_one_line_naming_the_argument(tiny, model_args, pattern):
    from merging.errors import one_line
    from merging.harness.model import LogitcompLM

    args = model_args.format(base=tiny.base, a=tiny.adapters["a"])
    with pytest.raises((ValueError, OSError, RuntimeError, TypeError)) as raised:  # what the wrapper turns into exit 2
        LogitcompLM.create_from_arg_string(args, {"batch_size": 1, "max_batch_size": None, "device": None})
    assert re.search(pattern, one_line(raised.value)), one_line(raised.value)


@pytest.mark.parametrize(("signame", "code", "line"), [
    ("SIGINT", 130, "logitcomp: interrupted; finished outputs are kept and nothing is half-written"),
    ("SIGTERM", 143, "logitcomp: terminated (SIGTERM); finished outputs are kept and nothing is half-written"),  # issue 30.11
])
def test_ctrl_c_ends_with_one_line_and_leaves_nothing_half_written(tiny, tmp_path, signame, code, line):
    import signal

    recipe = _recipe(tmp_path, tiny, **{"evaluate.limit": 200})
    env = {k: v for k, v in os.environ.items() if k != "HF_ALLOW_CODE_EVAL"}
    proc = subprocess.Popen([sys.executable, "-m", "merging.cli", "-q", "run", str(recipe)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = tmp_path / "out" / "variants" / "base.json"
    deadline = time.monotonic() + 240
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    for _ in range(2):  # while the second variant is being evaluated; a second Ctrl-C if a library swallowed the first
        proc.send_signal(getattr(signal, signame))
        try:
            _, stderr = proc.communicate(timeout=30)
            break
        except subprocess.TimeoutExpired:
            continue
    else:
        proc.kill()
        raise AssertionError("the run did not end after two Ctrl-C")
    assert proc.returncode == code and "Traceback" not in stderr, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == line
    out = tmp_path / "out"
    assert json.loads(first.read_text())["metrics"]  # the finished variant is kept whole
    assert not (out / "results.json").exists() and not list(out.rglob("*.json.*")), sorted(out.rglob("*"))  # no half-written file
    from merging.output import output_lock

    with output_lock(out):  # the next run takes the lock and sweeps any leftover
        assert not list(out.rglob("*partial*"))
