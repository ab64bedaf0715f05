"""Does the overlap diagnostic predict composition failure? Toy worlds of graded factorisability.

    python experiments/claims/diagnostic_correlation.py                 # 3 worlds of seed 0, built first when missing
    python experiments/claims/diagnostic_correlation.py --noise 0 0.02 0.05 0.10 0.25 --seeds 0 1 2   # the README's 15

Factorisability is varied on purpose: toy worlds trained with a share of their fed-back answer
letters corrupted (--noise; by default 0, the entangled variant, 5% and 25%, the factorised variant),
built (or reused) under --worlds for every seed. On the pair (a2b+c2d) and triple
(a2b+c2d+e2f) tasks, 200 strings each, every world gives one point: composition error
(1 − greedy exact match of the composition, weights 1) against the diagnostics of `bridge.compare`
on the answer positions: `overlap` (share of tokens where more than one expert's
KL(p_i ‖ p_b) > 0.1 nats) and mean KL(p̂ ‖ p_merge) (the task-arithmetic merge, as one exact LoRA).
With --smol DIR the SmolLM2 math+code composition adds two points (its error there: the drop vs the
task's own expert, from the recipe run's results.json; shown, not in the correlation, which is over
the toy worlds). Prints the points, Spearman's rank correlation of error with each diagnostic and whether a threshold
on it tells exact compositions from failing ones; writes
OUT/diagnostic.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from peft import PeftModel  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from bridge import compare, merge_as_lora  # noqa: E402
from logitcomp import ComposedModelForCausalLM  # noqa: E402
from logitcomp.io import atomic_write_bytes  # noqa: E402
from merging.figures import figure_png  # noqa: E402
from merging.worlds.toy import TASKS, ToyBuildError, ToyConfig, ToyWorld, make_eval_set  # noqa: E402
from merging.worlds.toy.build import world_at  # noqa: E402
from merging.worlds.toy.diagnose import compare_on_docs  # noqa: E402
from merging.worlds.common import read_jsonl  # noqa: E402
from merging.worlds.smol.data import math_prompt  # noqa: E402
from merging.worlds.toy.evaluate import exact_match  # noqa: E402

TASK_EXPERTS = {"a2b_c2d": ("a2b", "c2d"), "a2b_c2d_e2f": ("a2b", "c2d", "e2f")}
SHIPPED = {0.0: "entangled", 0.25: "factorised"}  # noise levels that are the shipped variants
NOISE = [0.0, 0.05, 0.25]  # the default: 3 worlds, ≤ 15 min from scratch; the README's table adds 0.02, 0.10 and seeds 1, 2
SMOL_TASK_DIR = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "smol"
DIAGNOSTICS = {"overlap": "expert overlap (share of answer tokens)", "kl": "mean KL(p̂ ‖ p_merge), nats"}


def world_of(noise: float, seed: int) -> tuple[str, ToyConfig]:
    """(label, configuration) of the world trained with `noise`: the shipped variant's where there is one."""
    variant = SHIPPED.get(noise)
    if variant:
        return f"noise {noise:g} ({variant})", ToyConfig(seed=seed, variant=variant)
    return f"noise {noise:.2f}", ToyConfig(seed=seed, noise=noise)


def points_of(world: ToyWorld, threshold: float) -> list[dict]:
    """One point per task: composed and merged exact match, overlap and mean KL(p̂ ‖ p_merge)."""
    tokenizer = AutoTokenizer.from_pretrained(world.base)
    tasks = {t.name: t for t in TASKS}
    points = []
    for task, experts in TASK_EXPERTS.items():
        docs = make_eval_set(tasks[task])
        paths = {n: world.expert(n) for n in experts}
        composed = ComposedModelForCausalLM.from_experts(world.base, paths)
        with tempfile.TemporaryDirectory() as tmp:
            lora = merge_as_lora(world.base, paths, Path(tmp) / "merged")
            merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(world.base), lora).eval()
            comparison, _ = compare_on_docs(composed, merged, tokenizer, docs, world.config.layout, threshold)
            summary = comparison.summary()
            layout = world.config.layout
            points.append({"task": task, "composed": exact_match(composed, tokenizer, docs, layout),
                           "merged": exact_match(merged, tokenizer, docs, layout),
                           "overlap": summary["overlap"], "kl": summary["kl_composed_merged_mean"]})
    return points


SMOL_TASKS = {  # task -> (shipped jsonl, prompt, the answer the experts were trained to write, metric, its expert)
    "smol_math": ("math.jsonl", lambda d: math_prompt(d["question"]), lambda d: " " + d["answer"], "exact_match,strict-match", "math"),
    "smol_code": ("code.jsonl", lambda d: d["prompt"], lambda d: d["solution"], "pass@1,none", "code"),
}
SMOL_DOCS = 40


def smol_points(root: Path, results: Path, threshold: float) -> list[dict]:
    """The SmolLM2 math+code composition on its two tasks: overlap and mean KL(p̂ ‖ p_merge) on the reference
    answers of the first SMOL_DOCS test problems, and its relative drop vs the task's own expert,
    1 − composed / expert, read from a recipe run's results.json (recipes/smol-math-code.yaml; merged: its
    merged_lora row, task arithmetic with weights 1, the merge compared with)."""
    scores = json.loads(results.read_text())["results"]
    tokenizer = AutoTokenizer.from_pretrained(root / "base")
    paths = {n: root / "experts" / n for n in ("math", "code")}
    composed = ComposedModelForCausalLM.from_experts(root / "base", paths)
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        lora = merge_as_lora(root / "base", paths, Path(tmp) / "merged")
        merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(root / "base"), lora).eval()
        for task, (file, prompt, answer, metric, expert) in SMOL_TASKS.items():
            docs = read_jsonl(SMOL_TASK_DIR / file)[:SMOL_DOCS]
            batch, score = _answer_batch(tokenizer, [(prompt(d), answer(d)) for d in docs])
            summary = compare(composed, merged, batch, threshold=threshold, score=score).summary()
            own, comp = scores[expert][task][metric], scores["composed"][task][metric]
            points.append({"world": "SmolLM2 math+code", "task": task, "expert": own, "composed": comp,
                           "merged": scores["merged_lora"][task][metric], "drop": 1 - comp / own,
                           "overlap": summary["overlap"], "kl": summary["kl_composed_merged_mean"]})
    return points


def _answer_batch(tokenizer, pairs: list[tuple[str, str]]):
    """Left-padded prompt + answer rows and the (B, T) bool of the positions that predict the answer."""
    rows = [(tokenizer(p, add_special_tokens=False).input_ids, tokenizer(a, add_special_tokens=False).input_ids) for p, a in pairs]
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), tokenizer.eos_token_id)  # (B, T)
    mask, score = torch.zeros_like(ids), torch.zeros_like(ids, dtype=torch.bool)
    for i, (p, a) in enumerate(rows):
        n = len(p) + len(a)
        ids[i, width - n:] = torch.tensor(p + a)
        mask[i, width - n:] = 1
        score[i, width - len(a) - 1:width - 1] = True  # the positions whose next token is an answer token
    return {"input_ids": ids, "attention_mask": mask}, score


def correlations(points: list[dict]) -> dict[str, dict]:
    """diagnostic -> Spearman's rho and p-value of composition error against it."""
    error = [1 - p["composed"] for p in points]
    out = {}
    for key in DIAGNOSTICS:
        rho, pvalue = spearmanr(error, [p[key] for p in points])
        out[key] = {"rho": float(rho), "p": float(pvalue), "n": len(points)}
    return out


def separation(points: list[dict]) -> dict[str, dict]:
    """diagnostic -> the largest value among exact compositions and the smallest among failing ones: where the
    first is below the second, any threshold between them tells every exact point from every failing one."""
    out = {}
    for key in DIAGNOSTICS:
        exact = [p[key] for p in points if p["composed"] == 1.0]
        failing = [p[key] for p in points if p["composed"] < 1.0]
        top, bottom = max(exact, default=float("nan")), min(failing, default=float("nan"))
        out[key] = {"max_exact": top, "min_failing": bottom, "separates": bool(top < bottom)}
    return out


def markdown(points: list[dict], corr: dict, sep: dict, smol: list[dict] = ()) -> str:
    lines = ["| world | seed | task | composed | merged | overlap | mean KL(p̂‖p_merge) |", "|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p['world']} | {p['seed']} | {p['task']} | {p['composed']:.1%} | {p['merged']:.1%} | "
                     f"{p['overlap']:.2%} | {p['kl']:.4f} |")
    lines.append("")
    for key, c in corr.items():
        lines.append(f"Spearman ρ(composition error, {key}) = {c['rho']:.3f} (p = {c['p']:.2g}, n = {c['n']})")
        t = sep[key]
        verdict = "separates them" if t["separates"] else "does not separate them"
        lines.append(f"  {key}: largest among exact compositions {t['max_exact']:.4g}, smallest among failing ones "
                     f"{t['min_failing']:.4g}: a threshold {verdict}")
    if smol:
        lines += ["", "| SmolLM2 task | expert alone | composed | merged | drop vs expert | overlap | mean KL(p̂‖p_merge) |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {p['task']} | {p['expert']:.3f} | {p['composed']:.3f} | {p['merged']:.3f} | {p['drop']:.1%} | "
                  f"{p['overlap']:.2%} | {p['kl']:.4f} |" for p in smol]
    return "\n".join(lines) + "\n"


def plot(points: list[dict], corr: dict, smol: list[dict] = ()) -> bytes:
    fig, axes = plt.subplots(1, len(DIAGNOSTICS), figsize=(12, 4.5), squeeze=False)
    labels = list(dict.fromkeys(p["world"] for p in points))
    for ax, (key, title) in zip(axes[0], DIAGNOSTICS.items()):
        for i, label in enumerate(labels):
            for task, marker in zip(TASK_EXPERTS, "os"):
                sel = [p for p in points if p["world"] == label and p["task"] == task]
                ax.scatter([p[key] for p in sel], [1 - p["composed"] for p in sel], color=f"C{i}", marker=marker,
                           label=f"{label}, {task}" if sel else None)
        for p in smol:  # another error: the drop vs the task's own expert; not in the correlation
            ax.scatter([p[key]], [p["drop"]], color="k", marker="*", s=80, label=f"SmolLM2, {p['task']} (drop vs expert)")
        ax.set(xlabel=title, ylabel="composition error (1 − exact match)",
               title=f"Spearman ρ = {corr[key]['rho']:.2f} (n = {corr[key]['n']})")
        ax.set_xscale("symlog", linthresh=1e-3)
    axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return figure_png(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=Path, default=Path("runs/toy-worlds"), help="where worlds are built or reused")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--noise", type=float, nargs="+", default=NOISE, help="shares of fed-back answer letters corrupted in training")
    parser.add_argument("--threshold", type=float, default=0.1, help="activity threshold in nats")
    parser.add_argument("--out", type=Path, default=Path("runs/diagnostic"))
    parser.add_argument("--smol", type=Path, help="also the SmolLM2 world (logitcomp smol build/train) ...")
    parser.add_argument("--smol-results", type=Path, default=Path("runs/smol-math-code/results.json"),
                        help="... with the scores of its recipe run (recipes/smol-math-code.yaml)")
    args = parser.parse_args()
    start, points, failed = time.perf_counter(), [], []
    for noise in args.noise:
        for seed in args.seeds:
            label, config = world_of(noise, seed)
            try:
                world = world_at(args.worlds.resolve(), config)
            except ToyBuildError as exc:  # a world below its bar is listed, not scored
                failed.append(f"{label} seed {seed}: {exc}")
                print(failed[-1], flush=True)
                continue
            for p in points_of(world, args.threshold):
                points.append({"world": label, "seed": seed, **p})
                print(json.dumps(points[-1]), flush=True)
    smol = smol_points(args.smol, args.smol_results, args.threshold) if args.smol else []
    corr, sep = correlations(points), separation(points)
    text = markdown(points, corr, sep, smol) + "".join(f"\nbuild failed: {f}\n" for f in failed)
    seconds = round(time.perf_counter() - start, 1)
    result = {"points": points, "smol": smol, "spearman": corr, "separation": sep, "failed": failed, "threshold": args.threshold, "seconds": seconds}
    atomic_write_bytes(args.out / "diagnostic.json", (json.dumps(result, indent=2) + "\n").encode())
    atomic_write_bytes(args.out / "diagnostic.md", text.encode())
    atomic_write_bytes(args.out / "diagnostic.png", plot(points, corr, smol))
    print(text + f"\n{seconds:.0f} s in all; {args.out / 'diagnostic.png'}")


if __name__ == "__main__":
    main()
