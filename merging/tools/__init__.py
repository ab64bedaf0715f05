"""The `logitcomp` tools: benchmarks, comparing two rows' texts, pooling seeds, the routing report.

Each tool's arguments are declared here (torch-free, so that building the command line imports no torch);
its work is `run(args)` of its own module, imported only when the tool runs. `python -m merging.tools.NAME`
runs a tool with the same arguments (the benchmarks start their measured children that way).
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from logitcomp.config import ROUTING_SCORES

DECODE_SETUPS = ("single", "composed", "peft", "naive")
# `bench memory --shape`: name -> (transformers config class, its arguments): the real models' shapes, random weights
MEMORY_SHAPES = {
    "tiny": ("LlamaConfig", dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2)),
    "gemma3-270m": ("Gemma3TextConfig", dict(vocab_size=262_144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                                             num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                                             query_pre_attn_scalar=256, tie_word_embeddings=True)),
    "gemma2-2b": ("Gemma2Config", dict(vocab_size=256_000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                                       num_attention_heads=8, num_key_value_heads=4, head_dim=256, sliding_window=4096,
                                       query_pre_attn_scalar=256, final_logit_softcapping=30.0, attn_logit_softcapping=50.0)),
}


def _bench_decode(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hidden", type=int, default=512, help="hidden size of the random Llama")
    p.add_argument("--layers", type=int, default=8, help="layers of the random Llama")
    p.add_argument("--intermediate", type=int, default=1376, help="MLP size of the random Llama")
    p.add_argument("--heads", type=int, default=8, help="attention heads of the random Llama")
    p.add_argument("--vocab", type=int, default=32000, help="vocabulary of the random Llama")
    p.add_argument("--k", type=int, default=2, help="number of experts")
    p.add_argument("--rank", type=int, default=16, help="LoRA rank of the random experts")
    p.add_argument("--targets", default="q_proj,v_proj,gate_proj,up_proj,down_proj", help="the LoRA target modules")
    p.add_argument("--batch", type=int, default=1, help="rows decoded together")
    p.add_argument("--prompt", type=int, default=32, help="prompt length in tokens")
    p.add_argument("--new", type=int, default=64, help="decoded tokens per measurement")
    p.add_argument("--repeats", type=int, default=3, help="measurements per setup (the best is kept)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights' dtype")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, ...")
    p.add_argument("--threads", type=int, default=2, help="torch threads of each measured process")
    p.add_argument("--setups", default=",".join(DECODE_SETUPS), help=f"comma-separated, from {', '.join(DECODE_SETUPS)}, composed-plainhead")
    p.add_argument("--rule", action="append", default=[], help="also time the composed model under this rule (repeatable)")
    p.add_argument("--route", action="append", default=[], choices=(*ROUTING_SCORES, "max", "held"),
                   help="also time the composed model routed with this score (repeatable)")
    p.add_argument("--routed", metavar="K,K", help="with --generate: also time routed compositions of K installed experts with one "
                   "kept per prompt (prompt b keeps expert b mod K) beside the 1-expert composition, e.g. 1,2,4")
    p.add_argument("--generate", action="store_true", help="time model.generate (single, composed) instead of the hand-written loop")
    p.add_argument("--compile", action="store_true", help="with --generate: also time each setup with a static cache and the compiled step")
    p.add_argument("--base", help="a real base model folder instead of the random Llama (its vocabulary replaces --vocab)")
    p.add_argument("--distilled", help="with --generate and --base: also time this distilled adapter folder of the base (a "
                   "`distilled` row's models/NAME), merged into the base (its merged/ when written)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)


def _bench_memory(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", choices=sorted(MEMORY_SHAPES), default="gemma3-270m", help="the random model's shape")
    p.add_argument("--base", help="a real model folder instead of a random model of --shape")
    p.add_argument("--experts", default="2,3", help="comma-separated numbers of experts")
    p.add_argument("--routed", metavar="K,K", help="also routed compositions of K installed experts, the decode keeping one, e.g. 1,2,4")
    p.add_argument("--batch", type=int, default=16, help="rows of the log-likelihood batch")
    p.add_argument("--length", type=int, default=128, help="tokens per scored row")
    p.add_argument("--dtype", default="float32", help="weights' dtype")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, ...")
    p.add_argument("--threads", type=int, default=2, help="torch threads of each measured process")
    p.add_argument("--workdir", type=Path, help="where the random model and experts are kept (default: runs/bench-memory/SHAPE)")
    p.add_argument("--child", help=argparse.SUPPRESS)


def _compare_texts(p: argparse.ArgumentParser) -> None:
    p.add_argument("first", type=Path, help="RUN/ROW: a run folder and a row name (its samples under RUN/lm_eval/ROW/)")
    p.add_argument("second", type=Path, help="RUN/ROW of the other row")


def _pool_seeds(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", help="the test task, e.g. smol_math_polite")
    p.add_argument("metric", help="its metric, e.g. flexible (or exact_match,strict-match)")
    p.add_argument("runs", type=Path, nargs="+", help="one recipe run folder per seed (each holds results.json)")
    p.add_argument("--also", action="append", default=[], metavar="TASK:METRIC",
                   help="another task's score pooled alike, as one more column (repeatable; a single-skill task)")
    p.add_argument("--row", help="the row compared with the others (default: the recipe's first composed row)")


def _routing_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("world", type=Path, help="a world folder: WORLD/base and WORLD/experts/NAME/prompts.jsonl")
    p.add_argument("--experts", required=True, help="comma-separated expert names (folders under WORLD/experts)")
    p.add_argument("--tasks", required=True, help="TASK=EXPERT[+EXPERT],...: each task and the experts its prompts need")
    p.add_argument("--include-path", type=Path, help="a folder of lm-eval task YAMLs (default: the shipped recipes/tasks)")
    p.add_argument("--score", choices=ROUTING_SCORES, default="cosine", help="centroids' cosine posteriors or per-expert detectors")
    p.add_argument("--tau", type=float, nargs="+", default=[0.05, 0.1, 0.2], help="cosine posteriors' temperatures")
    p.add_argument("--shrinkage", type=float, nargs="+", default=[1.0], help="the discriminant's covariance shrinkage λ")
    p.add_argument("--threshold", type=float, nargs="+", default=[0.3], help="θ: gates below θ · the top one's are 0")
    p.add_argument("--evidence", action="store_true", help="print the detectors' scores z per task (--score discriminant)")
    p.add_argument("--fit-floors", action="store_true", help="choose each expert's floor on these (validation) tasks (--score discriminant)")
    p.add_argument("--pool", choices=("mean", "last", "max"), default="mean",
                   help="a prompt's mean hidden state, its last token's (a probe), or token-level detectors' maximum")


# command words -> (help, arguments, module under merging.tools)
TOOLS = {
    ("bench", "decode"): ("decode throughput and peak memory: single vs composed vs peft vs naive, each in its own process",
                          _bench_decode, "bench_decode"),
    ("bench", "memory"): ("peak memory of scoring and decoding: single vs composed with k experts", _bench_memory, "bench_memory"),
    ("compare-texts",): ("whether two rows of recipe runs wrote the same generations, per task", _compare_texts, "same_text"),
    ("pool-seeds",): ("one family's rows pooled over seeds' runs, each at its validated value, with standard errors",
                      _pool_seeds, "pool_seeds"),
    ("routing-report",): ("how hidden-state routing gates each task's prompts (top, exact kept set, mean gates; --fit-floors)",
                          _routing_report, "routing_report"),
}


def _call(module: str):
    return lambda args: importlib.import_module(f"{__name__}.{module}").run(args)


def add_tool_commands(sub) -> None:
    """Add every tool as a `logitcomp` subcommand (two-word tools under their group, e.g. `bench decode`)."""
    groups = {}
    for words, (help_text, add_arguments, module) in TOOLS.items():
        parent = sub
        if len(words) == 2:
            if words[0] not in groups:
                group = sub.add_parser(words[0], help=f"{words[0]} tools: " + ", ".join(w[1] for w in TOOLS if w[0] == words[0]))
                groups[words[0]] = group.add_subparsers(dest=f"{words[0]}_command", required=True, metavar="TOOL")
            parent = groups[words[0]]
        tool = parent.add_parser(words[-1], help=help_text, description=help_text)
        add_arguments(tool)
        tool.set_defaults(func=_call(module))


def parse_args(module: str, argv=None) -> argparse.Namespace:
    """A tool's arguments parsed as `python -m merging.tools.MODULE` gets them."""
    words, (help_text, add_arguments, _) = next((w, t) for w, t in TOOLS.items() if t[2] == module)
    parser = argparse.ArgumentParser(prog=f"logitcomp {' '.join(words)}", description=help_text,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(parser)
    return parser.parse_args(argv)
