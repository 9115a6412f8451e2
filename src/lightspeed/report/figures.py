"""Saving a matplotlib figure as a PNG whole or not at all: under a temporary name of its own, renamed
into place (a reader never sees half a picture); the figure is closed either way."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info


def pyplot(path: Path, say: Callable[[str], object] = rank_zero_info) -> Any:
    """matplotlib's pyplot drawing off screen, or None and a line saying `path` is skipped without it."""
    try:
        import matplotlib
    except ImportError:
        say(f"no {path.name}: matplotlib is missing (make install EXTRAS=dev)")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def step_axis(ax: Any, title: str, legend_size: int = 8) -> None:
    """A panel of metrics against the training step: its title, the axis name, a light grid, a legend."""
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)


def save(fig: Any, path: Path, dpi: int = 80) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    try:
        fig.savefig(tmp, dpi=dpi)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return path
