"""Matplotlib without a display, and how every analysis picture is written."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """`matplotlib.pyplot` on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write as PNG (creating the folder) and close `fig`; returns the path."""
    plt = pyplot()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
