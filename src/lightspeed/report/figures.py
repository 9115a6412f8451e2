"""Saving a matplotlib figure as a PNG whole or not at all: under a temporary name of its own, renamed
into place (a reader never sees half a picture); the figure is closed either way."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


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
