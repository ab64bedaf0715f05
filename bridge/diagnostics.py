"""Between the two spaces: how far the composed distribution is from a merge, and where experts act.

The paper argues that composition is correct when the experts' active regions are disjoint;
`Comparison.overlap` measures how often they are not (the share of tokens where more than one
expert's activity a_i(t) = KL(p_i ‖ p_b) exceeds a threshold).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from logitcomp.io import atomic_write_bytes
from logitcomp.model import position_ids
from logitcomp.ops import kl_divergence


@dataclass
class Comparison:
    """Per-token comparison of a composed model with a merged model on the same inputs.

    Tensors are (B, T) or (B, T, k), one value per position (the distribution of the next token); `valid` is False on
    the left padding of a row.
    """

    experts: list[str]
    kl_composed_merged: torch.Tensor  # (B, T) KL(p̂ ‖ p_merge)
    kl_merged_composed: torch.Tensor  # (B, T) KL(p_merge ‖ p̂)
    argmax_agree: torch.Tensor  # (B, T) bool
    activity: torch.Tensor  # (B, T, k) KL(p_i ‖ p_b)
    valid: torch.Tensor  # (B, T) bool
    threshold: float

    @property
    def overlap(self) -> float:
        """Share of valid tokens where more than one expert is active above `threshold` (0 = disjoint)."""
        active = (self.activity > self.threshold).sum(-1) > 1  # (B, T)
        return active[self.valid].float().mean().item()

    def summary(self) -> dict:
        v = self.valid
        return {
            "experts": self.experts,
            "tokens": int(v.sum()),
            "kl_composed_merged_mean": self.kl_composed_merged[v].mean().item(),
            "kl_composed_merged_max": self.kl_composed_merged[v].max().item(),
            "kl_merged_composed_mean": self.kl_merged_composed[v].mean().item(),
            "argmax_agreement": self.argmax_agree[v].float().mean().item(),
            "activity_mean": dict(zip(self.experts, self.activity[v].mean(0).tolist())),
            "threshold": self.threshold,
            "overlap": self.overlap,
        }

    def save_json(self, path) -> Path:
        """Write the summary and the per-token values (padding as null), atomically."""
        masked = lambda t: [[x if ok else None for x, ok in zip(r, m)] for r, m in zip(t.tolist(), self.valid.tolist())]  # noqa: E731
        data = {
            "summary": self.summary(),
            "kl_composed_merged": masked(self.kl_composed_merged),
            "kl_merged_composed": masked(self.kl_merged_composed),
            "argmax_agree": masked(self.argmax_agree),
            "activity": {e: masked(self.activity[..., i]) for i, e in enumerate(self.experts)},
        }
        return atomic_write_bytes(Path(path), (json.dumps(data, indent=1) + "\n").encode())

    def plot_activity(self, path, row: int = 0, tokens: list[str] | None = None) -> Path:
        """Heatmap PNG of each expert's activity over the tokens of one row."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        valid = self.valid[row]
        act = self.activity[row][valid].T.numpy()  # (k, T_valid)
        fig, ax = plt.subplots(figsize=(max(4, 0.35 * act.shape[1] + 2), 0.5 * act.shape[0] + 1.6))
        image = ax.imshow(act, aspect="auto", cmap="viridis")
        ax.set_yticks(range(len(self.experts)), self.experts)
        if tokens is not None:
            ax.set_xticks(range(act.shape[1]), [t for t, ok in zip(tokens, valid.tolist()) if ok], fontsize=7)
        ax.set_xlabel("position (the token it predicts from)")
        ax.set_title("expert activity KL(p_i || p_base), nats")
        fig.colorbar(image, ax=ax)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        return atomic_write_bytes(Path(path), buf.getvalue())


@torch.no_grad()
def compare(composed, merged, inputs, attention_mask: torch.Tensor | None = None, threshold: float = 0.1,
            score: torch.Tensor | None = None) -> Comparison:
    """Compare a `ComposedModelForCausalLM` with a merged causal LM on the same token sequences.

    Args:
        composed: the composed model.
        merged: any causal LM over the same vocabulary (a mergekit output, a PeftModel, ...).
        inputs: input ids (B, T), or a mapping with `input_ids` and `attention_mask`.
        attention_mask: (B, T), 0 on left padding.
        threshold: nats of KL(p_i ‖ p_b) above which an expert counts as active.
        score: (B, T) bool, the positions the summary counts (e.g. those that predict the answer);
            default every non-padding position.
    """
    if isinstance(inputs, Mapping):
        attention_mask = inputs.get("attention_mask", attention_mask)
        inputs = inputs["input_ids"]
    mask = torch.ones_like(inputs) if attention_mask is None else attention_mask
    out = composed(inputs, attention_mask=mask, use_cache=False, output_trace=True)
    positions = position_ids(mask)  # (B, T), as the composed model derives them
    merged_lp = torch.log_softmax(merged(input_ids=inputs, attention_mask=mask, position_ids=positions).logits.float(), -1)
    lc = out.logits  # (B, T, V)
    return Comparison(
        experts=list(out.trace.experts),
        kl_composed_merged=kl_divergence(lc, merged_lp),
        kl_merged_composed=kl_divergence(merged_lp, lc),
        argmax_agree=lc.argmax(-1) == merged_lp.argmax(-1),
        activity=out.trace.kl,
        valid=mask.bool() if score is None else mask.bool() & score.bool(),
        threshold=threshold,
    )
