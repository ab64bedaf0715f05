"""A finished matplotlib figure as PNG bytes, for the callers' atomic writes."""

from __future__ import annotations

import io


def figure_png(fig, dpi: int = 110) -> bytes:
    """Lay out `fig`, render it to PNG and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()
