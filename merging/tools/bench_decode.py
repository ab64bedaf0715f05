"""Decode throughput and peak memory: single model vs composed vs peft mixed batch vs naive.

One run builds a random Llama and k random LoRA experts, saves them as safetensors, then measures
each setup in its own subprocess (so that peak memory is its own) with the same hand-written
greedy loop (prefill, then one cached forward per token, argmax of the composed distribution):

    single    the base alone (the reference for throughput and memory)
    composed  logitcomp.ComposedModelForCausalLM: one base, k+1 row groups, grouped LoRA
    peft      peft's mixed-adapter batch (adapter_names=[base, e1, ...]) + the same composition
    naive     k+1 separate models (experts merged), each with its own cache, one after the other

and prints steps/s, peak memory above the process's baseline, and their ratios, plus the share of
a composed step spent in the composition itself (log_softmax and combine).

    logitcomp bench decode                          # 58M-parameter Llama, k=2, r=16, CPU
    logitcomp bench decode --device cuda --dtype bfloat16 --hidden 2048 --layers 16
    logitcomp bench decode --setups composed --rule activity --rule union   # cost of each rule vs product
    logitcomp bench decode --base gemma_world/base --batch 16   # a real model folder (random LoRA experts)

`--setups single,composed,composed-plainhead --generate` also times the composition with the LM head as
transformers computes it (`F.linear`), the before of logitcomp/head.py's layout.

`--rule NAME` (repeatable) adds a `composed@NAME` setup per composition rule (default parameters),
reported beside the product rule's `composed`.

`--route SCORE` (repeatable: cosine, discriminant, max, held) adds a `composed~SCORE` setup: the product rule
routed per position (logitcomp/routing.py) by random centroids (and detectors; `max`: token-level detectors, `pool:
max`) that keep every expert's gate above 0, so each step pays for the routing (the base rows' hidden states,
the running means or maxima, the gates, the gated composition) and composes every expert; `held`: the setting of
the floors rows (token-level detectors, binary gates held from the prompt, `update: false`; floors are offsets of
the detectors and cost nothing) with the floors_sets rows' set weight (one set, matched at every position, so its
factor is computed at every step). Reported beside the unrouted `composed`.

`--routed 1,2,4` (with `--generate`) adds routed compositions of K installed experts in which each prompt keeps one
expert (prompt b keeps expert b mod K, by detectors solved on the prompts' mean hidden states: a batch of mixed
prompts; each child prints the kept sets), held from the prompt as the shipped routed rows hold them: `routed-kK`,
`routed-kK-dense` for the largest K (every expert computed for every input, the composition before gated-out experts
were skipped), beside `composed-k1` (the 1-expert composition) and `single`.

`--generate` measures the path users decode through instead: transformers' `generate` (greedy,
`min_new_tokens` = `max_new_tokens`, so every row decodes the same number of steps), as lm-eval
calls it; decode steps/s = (N − 1) / (t(N new tokens) − t(1 new token)), the prefill left out as in
the loop. Only `single` and `composed` have a generate path (peft's mixed batch and the naive
ensemble compose only in the hand-written loop). `--compile` (with `--generate`) adds a `SETUP+compile`
row per setup, decoding through a static cache and the compiled step (`generate(cache_implementation=
"static", compile_config=...)`, transformers' compile path, on any device; torch.compile's default
"reduce-overhead" mode, i.e. CUDA graphs on a GPU); the warm-up call compiles, the timed calls reuse it.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from .bench_child import child_args, emit, run_setups
from .bench_routed import report_routed, routed_ks, routed_model


def prepare_args(args: argparse.Namespace) -> argparse.Namespace:
    """The arguments checked, `--vocab` taken from `--base` when one is given."""
    if args.compile and not args.generate:
        raise ValueError("--compile: the compiled step is transformers' generate path; add --generate")
    if args.routed and not args.generate:
        raise ValueError("--routed: the routed setups are timed through generate; add --generate")
    if args.distilled and not (args.generate and args.base):
        raise ValueError("--distilled: a distilled adapter of --base is timed through generate; add --generate and --base")
    if args.base:
        from transformers import AutoConfig

        args.vocab = AutoConfig.from_pretrained(args.base).get_text_config().vocab_size
    return args


def base_of(args, root: Path) -> Path:
    return Path(args.base) if args.base else root / "base"


def build_world(args, root: Path) -> None:
    """Save a random base (unless --base) and k random LoRA adapters (non-zero B) of the base under `root`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if not args.base:
        config = LlamaConfig(
            vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
            num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads,
            max_position_embeddings=4096, tie_word_embeddings=False, eos_token_id=None, bos_token_id=None,
        )
        LlamaForCausalLM(config).save_pretrained(root / "base")
    for i in range(max([args.k, *routed_ks(args)])):
        base = AutoModelForCausalLM.from_pretrained(base_of(args, root))
        model = get_peft_model(base, LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=args.targets.split(",")))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02)
        model.save_pretrained(root / f"e{i}")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_bytes(device: str) -> int:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def load_generator(setup: str, root: Path, args):
    """The model whose `generate` a `--generate` run times: the base alone or the composition."""
    from transformers import AutoModelForCausalLM

    from logitcomp import ComposedModelForCausalLM

    dtype = getattr(torch, args.dtype)
    if setup == "single":
        return AutoModelForCausalLM.from_pretrained(base_of(args, root), dtype=dtype).to(args.device).eval()
    if setup == "distilled-merged":  # one model: the adapter merged into the base
        folder = Path(args.distilled)
        if (folder / "merged").is_dir():
            return AutoModelForCausalLM.from_pretrained(folder / "merged", dtype=dtype).to(args.device).eval()
        from peft import PeftModel

        return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(args.base, dtype=dtype), folder).merge_and_unload().to(args.device).eval()
    if setup.startswith("routed-k") or setup == "composed-k1":
        return routed_generator(setup, root, args)
    if setup.startswith("composed"):
        if setup.endswith("-plainhead"):  # the LM head as transformers computes it (F.linear): logitcomp/head.py's before
            import logitcomp.head

            logitcomp.head.MIN_VOCAB = sys.maxsize
        experts = {f"e{i}": root / f"e{i}" for i in range(args.k)}
        return ComposedModelForCausalLM.from_experts(base_of(args, root), experts, config=composition_of(setup, root, args),
                                                     dtype=dtype, device=args.device)
    sys.exit(f"bench_decode: --generate times single and composed only, not {setup}")


def prompt_ids(args) -> torch.Tensor:
    """The (B, prompt) random prompts every setup decodes from (the same in each process)."""
    return torch.randint(0, args.vocab, (args.batch, args.prompt), generator=torch.Generator().manual_seed(1)).to(args.device)


def routed_generator(setup: str, root: Path, args):
    """`composed-k1` or `routed-kK[-dense]` (`routed_model`) on the prompts `generate` decodes from."""
    return routed_model(setup, base_of(args, root), root, prompt_ids(args), getattr(torch, args.dtype), args.device)


@torch.no_grad()
def decode_generate(model, args, compiled: bool) -> tuple[float, float]:
    """Decode steps per second through `generate` (N new tokens minus 1 new token: the prefill), and the
    seconds of the first, warm-up call (with `compiled`, the one that compiles)."""
    ids = prompt_ids(args)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    options = {}
    if compiled:  # transformers compiles off GPUs only when told to (CompileConfig._compile_all_devices)
        from transformers import CompileConfig

        config = CompileConfig()
        config._compile_all_devices = True
        # one cache length for every timed call: the compiled step's shapes stay the same
        options = dict(cache_implementation="static", compile_config=config, max_cache_len=args.prompt + args.new)

    def timed(new: int) -> float:
        sync()
        start = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, pad_token_id=0, **options)
        sync()
        return time.perf_counter() - start

    first = timed(2)  # warm-up
    return (args.new - 1) / (timed(args.new) - timed(1)), first


def composition_of(setup: str, root: Path, args):
    """The CompositionConfig of composed, composed@RULE or composed~SCORE (the product rule routed by random
    centroids, and for `discriminant`, `max` (token-level) and `held` (token-level, binary gates held from the prompt)
    detectors that detect every expert: every gate above 0)."""
    from transformers import AutoConfig

    from logitcomp import CompositionConfig

    name = setup.removesuffix("-plainhead")
    config = CompositionConfig(rule=name.partition("@")[2] or "product")
    score = name.partition("~")[2]
    if not score:
        return config
    hidden = AutoConfig.from_pretrained(base_of(args, root)).hidden_size
    gen = torch.Generator().manual_seed(0)
    names = [f"e{i}" for i in range(args.k)]
    routing = {"centroids": {n: torch.randn(hidden, generator=gen).tolist() for n in names}, "tau": 1.0, "threshold": 0.0}
    if score in ("discriminant", "max", "held"):  # z = 1 for every expert at every position
        routing["detectors"] = {n: {"direction": [0.0] * hidden, "offset": -1.0} for n in names}
        routing["pool"] = "mean" if score == "discriminant" else "max"
    if score == "held":  # with a set weight that every position's kept set (all experts) matches: the factor is applied
        routing.update(gates="binary", update=False, set_weights=[{"experts": names, "weight": 1.0}])
    return config.with_routing(routing)


def make_step(setup: str, root: Path, args):
    """Load one setup; return step(ids, mask, cache) -> (next-token ids (B,), cache)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from logitcomp import ComposedModelForCausalLM, compose_logprobs
    from logitcomp.model import position_ids

    dtype, device = getattr(torch, args.dtype), args.device
    experts = {f"e{i}": root / f"e{i}" for i in range(args.k)}
    load = lambda p: AutoModelForCausalLM.from_pretrained(p, dtype=dtype).to(device).eval()  # noqa: E731

    if setup == "single":
        model = load(base_of(args, root))

        def step(ids, mask, cache):
            out = model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True, logits_to_keep=1)
            return out.logits[:, -1].argmax(-1), out.cache
        return step

    if setup.startswith("composed"):  # composed (the product rule), composed@RULE or composed~SCORE
        model = ComposedModelForCausalLM.from_experts(base_of(args, root), experts, config=composition_of(setup, root, args),
                                                      dtype=dtype, device=device)

        def step(ids, mask, cache):
            out = model(ids, attention_mask=mask, cache=cache, use_cache=True, logits_to_keep=1)
            return out.logits[:, -1].argmax(-1), out.cache
        return step

    groups = args.k + 1
    if setup == "peft":
        model = PeftModel.from_pretrained(load(base_of(args, root)), experts["e0"], adapter_name="e0")
        for name in list(experts)[1:]:
            model.load_adapter(experts[name], adapter_name=name)
        model.eval()

        def step(ids, mask, cache):
            b = ids.shape[0]
            names = [n for n in ["__base__", *experts] for _ in range(b)]
            pos = position_ids(mask)[:, -ids.shape[1]:]
            out = model(input_ids=ids.repeat(groups, 1), attention_mask=mask.repeat(groups, 1), position_ids=pos.repeat(groups, 1),
                        cache=cache, use_cache=True, adapter_names=names, logits_to_keep=1)
            lp = out.logits[:, -1].view(groups, b, -1)  # (G, B, V)
            return compose_logprobs(lp[0], list(lp[1:])).argmax(-1), out.cache
        return step

    # naive: k+1 full models, experts merged into their own copy of the base
    models = [load(base_of(args, root))] + [
        PeftModel.from_pretrained(load(base_of(args, root)), path).merge_and_unload().eval() for path in experts.values()
    ]

    def step(ids, mask, caches):
        caches = caches or [None] * len(models)
        outs = [m(input_ids=ids, attention_mask=mask, cache=c, use_cache=True, logits_to_keep=1) for m, c in zip(models, caches)]
        lp = [o.logits[:, -1] for o in outs]
        return compose_logprobs(lp[0], lp[1:]).argmax(-1), [o.cache for o in outs]
    return step


@torch.no_grad()
def decode(step, args) -> float:
    """Greedy decode `args.new` tokens after a prefill; returns decode steps per second."""
    ids = prompt_ids(args)
    mask = torch.ones_like(ids)
    nxt, cache = step(ids, mask, None)  # prefill (not timed)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(args.new):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        nxt, cache = step(nxt[:, None], mask, cache)
    sync()
    return args.new / (time.perf_counter() - start)


@torch.no_grad()
def composition_seconds(args, rule: str = "product") -> float:
    """Time of compose_logprobs on one step's log-probs (k+1 rows of (B, V))."""
    from logitcomp import apply_eos_policy, compose_logprobs

    dtype = getattr(torch, args.dtype)
    logits = torch.randn(args.k + 1, args.batch, args.vocab, dtype=dtype, device=args.device)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(20):
            out = compose_logprobs(logits[0], list(logits[1:]), rule=rule)
            apply_eos_policy(out, logits[0], list(logits[1:]), [], "compose")
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / 20)
    return best


def child(args) -> None:
    torch.set_num_threads(args.threads)
    root = Path(args.workdir)
    if args.device.startswith("cuda"):
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats()
    baseline = 0 if args.device.startswith("cuda") else rss_bytes()
    if args.generate:
        model = load_generator(args.child.removesuffix("+compile"), root, args)
        runs = [decode_generate(model, args, args.child.endswith("+compile")) for _ in range(args.repeats)]
        rates, first_call = [rate for rate, _ in runs], runs[0][1]
    else:
        step = make_step(args.child, root, args)
        rates = [decode(step, args) for _ in range(args.repeats)]
    result = {"setup": args.child, "steps_per_s": max(rates), "peak_bytes": peak_bytes(args.device) - baseline}
    if args.generate:
        result["first_call_s"] = first_call
    if args.child.startswith("composed") and not args.child.endswith("+compile"):
        result["compose_s"] = composition_seconds(args, args.child.partition("@")[2] or "product")
    emit(result)


def run(args: argparse.Namespace) -> int:
    """`logitcomp bench decode`: measure every setup, print the table."""
    report(args, measure(prepare_args(args)))
    return 0


def measure(args) -> dict:
    """Every setup measured in its own process (the same command line with `--child SETUP`): setup -> result."""
    with tempfile.TemporaryDirectory() as tmp:
        build_world(args, Path(tmp))
        setups = args.setups.split(",") + [f"composed@{rule}" for rule in args.rule] + [f"composed~{score}" for score in args.route]
        setups += ["distilled-merged"] if args.distilled else []
        if args.routed:
            ks = routed_ks(args)
            setups += ["composed-k1", *(f"routed-k{k}" for k in ks), f"routed-k{max(ks)}-dense"]
        setups += [f"{s}+compile" for s in setups] if args.compile else []
        return run_setups([sys.executable, "-m", __spec__.name], args, setups, tmp)


def report(args, results: dict) -> None:
    n_params = args.vocab * args.hidden * 2 + args.layers * (4 * args.hidden**2 + 3 * args.hidden * args.intermediate)
    model = f"{args.base} (vocab {args.vocab})" if args.base else f"Llama {n_params / 1e6:.0f}M params (hidden {args.hidden}, {args.layers} layers)"
    print(f"model: {model}, k={args.k} experts, "
          f"LoRA r={args.rank} on {args.targets}, batch {args.batch}, prompt {args.prompt}, {args.new} new tokens, "
          f"{args.dtype} on {args.device}, {args.threads} threads, {'generate' if args.generate else 'hand-written loop'}")
    single = results.get("single")
    print(f"{'setup':<16} {'steps/s':>9} {'x single':>9} {'peak MiB':>9} {'x single':>9}")
    for name, r in results.items():
        speed = f"{r['steps_per_s'] / single['steps_per_s']:.2f}" if single else "-"
        mem = f"{r['peak_bytes'] / single['peak_bytes']:.2f}" if single else "-"
        print(f"{name:<16} {r['steps_per_s']:>9.1f} {speed:>9} {r['peak_bytes'] / 2**20:>9.0f} {mem:>9}")
    for name in [n for n in results if n.endswith("+compile")]:
        eager = results.get(name.removesuffix("+compile"))
        if eager:
            print(f"{name}: {results[name]['steps_per_s'] / eager['steps_per_s']:.2f}x the steps/s of {name.removesuffix('+compile')}; "
                  f"first call {results[name]['first_call_s']:.1f} s (compiles) vs {eager['first_call_s']:.2f} s")
    report_routed(args, results)
    comp = results.get("composed")
    if comp:
        for other in ("peft", "naive"):
            if other in results:
                print(f"composed / {other}: {comp['steps_per_s'] / results[other]['steps_per_s']:.2f}x steps/s")
        share = comp["compose_s"] * comp["steps_per_s"]
        print(f"composition (log_softmax + combine): {comp['compose_s'] * 1e3:.2f} ms = {share:.1%} of a composed step")
        for rule in args.rule:
            r = results[f"composed@{rule}"]
            print(f"rule {rule}: {r['steps_per_s']:.1f} steps/s = {r['steps_per_s'] / comp['steps_per_s']:.2f}x the product rule's; "
                  f"composition {r['compose_s'] * 1e3:.2f} ms vs {comp['compose_s'] * 1e3:.2f} ms")
        for score in args.route:
            r = results[f"composed~{score}"]
            print(f"routed ({score}): {r['steps_per_s']:.1f} steps/s = {r['steps_per_s'] / comp['steps_per_s']:.2f}x the product rule's "
                  f"(every expert kept: the routing's cost alone)")


if __name__ == "__main__":
    child(child_args(sys.argv[1:]))
