"""The confusion matrix a module computed in testing (its `confusion_matrix` attribute: a (C, C) tensor,
rows the true class, columns the predicted one; the classifier sets it), written by `make eval` as
`confusion_matrix.csv` and `confusion_matrix.png`, with the data's class names where it has them."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_only

from lightspeed.core.files import write_text_atomically
from lightspeed.report import figures

CSV_FILE = "confusion_matrix.csv"
PICTURE_FILE = "confusion_matrix.png"


@rank_zero_only
def write(matrix: torch.Tensor, run_dir: Path, class_names: Sequence[str] | None = None) -> Path | None:
    """The CSV (a header of predicted classes, one row a true class) and, with matplotlib, the picture
    (counts in each cell, shaded by the share of its row). Returns the CSV's path."""
    counts = matrix.detach().cpu().long()
    n = counts.shape[0]
    names = (
        list(class_names) if class_names is not None and len(class_names) == n else [str(i) for i in range(n)]
    )
    text = io.StringIO()
    writer = csv.writer(text)  # csv's own line ends (\r\n), as predictions.csv has them
    writer.writerow(["true \\ predicted", *names])
    writer.writerows([name, *row] for name, row in zip(names, counts.tolist(), strict=True))
    out = run_dir / CSV_FILE
    write_text_atomically(out, text.getvalue())
    _draw(counts, names, run_dir / PICTURE_FILE)
    return out


def _draw(counts: torch.Tensor, names: list[str], path: Path) -> None:
    if (plt := figures.pyplot(path)) is None:
        return None

    share = counts.float() / counts.sum(dim=1, keepdim=True).clamp(min=1)
    size = min(12.0, 2.0 + 0.45 * len(names))
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(share.numpy(), cmap="Blues", vmin=0, vmax=1)
    if len(names) <= 30:
        for i, j in torch.cartesian_prod(torch.arange(len(names)), torch.arange(len(names))).tolist():
            colour = "white" if share[i, j] > 0.5 else "black"
            ax.text(j, i, str(counts[i, j].item()), ha="center", va="center", fontsize=7, color=colour)
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
        ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title("confusion matrix (test)")
    fig.tight_layout()
    figures.save(fig, path)
