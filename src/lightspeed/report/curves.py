"""Every run draws `curves.png`: losses, the monitored metric and the learning rate against the step. Points
come as a Lightning logger gets them (no device read of its own), kept in the run folder's `curves.json` (so a
resumed run's picture starts at step 0), drawn once the run is done (without matplotlib: one line, no png)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from lightspeed.core.files import read_json, write_text_atomically
from lightspeed.report import figures

CURVES_FILE = "curves.json"
PICTURE_FILE = "curves.png"
SAVE_EVERY_S = 10.0  # between writes at logging steps; each checkpoint and the end write at once


def load(run_dir: Path) -> dict[str, list[list[float]]]:
    """{metric: [[step, value], ...]} as a run folder keeps it; {} for none or a torn file (data: read with
    care, only numbers pass)."""
    found = read_json(run_dir / CURVES_FILE, within=run_dir)

    def pair(p: Any) -> bool:
        return isinstance(p, list) and len(p) == 2 and all(isinstance(x, (int, float)) for x in p)

    return {
        str(k): [[float(s), float(v)] for s, v in points]
        for k, points in (found.items() if isinstance(found, dict) else ())
        if isinstance(points, list) and all(map(pair, points))
    }


class CurvesLogger(Logger):
    """A logger of the run's scalars into `run_dir/curves.json`, drawn as `curves.png` by `finalize`;
    `monitor`: the metric the run is judged by (its panel)."""

    name, version = "curves", ""  # Logger's abstract properties, as plain values: one file, no versions

    def __init__(self, run_dir: str | Path, monitor: str | None = None) -> None:
        super().__init__()
        self.run_dir, self.monitor = Path(run_dir), monitor
        self.points: dict[str, list[list[float]]] = {}
        self._started, self._failed, self._written = False, False, float("-inf")

    @property
    def save_dir(self) -> str:
        return str(self.run_dir)

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Nothing: the config is in the run folder already."""

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if step is None:
            return
        if not self._started:  # an earlier attempt's points, up to where this one starts (the checkpoint)
            self._started = True
            self.points = {k: [p for p in v if p[0] < step] for k, v in load(self.run_dir).items()}
        for key, value in metrics.items():
            value = float(value)
            if key != "epoch" and math.isfinite(value):
                self.points.setdefault(key, []).append([step, value])

    @rank_zero_only
    def save(self) -> None:
        """Lightning calls this after each logging step: the points are written at most every
        SAVE_EVERY_S (a write each step was ~2% of a small model's fit). Points past the last checkpoint are
        dropped by a resume anyway; the ones a kill loses since the last write are the file's only loss."""
        if time.monotonic() - self._written >= SAVE_EVERY_S:
            self._write()

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """With each checkpoint: a resume from it finds every point up to its step."""
        self._write()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Lightning calls this when fit ends, fails or is stopped, and when test ends: the points are kept
        each time; the picture is drawn once, by `picture`, when the run is done."""
        self._write()

    def _write(self) -> None:
        """Keep the points, whole or not at all. A failed write (a full disk) is one warning, not the run's
        end: its checkpoint write fails too, with the error that matters."""
        if not self.points or self._failed:
            return
        try:
            write_text_atomically(self.run_dir / CURVES_FILE, json.dumps(self.points))
            self._written = time.monotonic()
        except OSError as err:
            self._fail(err)

    @rank_zero_only
    def picture(self) -> Path | None:
        """Draw `curves.png` from every point (~0.5 s here); None when nothing was logged or written."""
        if not self.points or self._failed:
            return None
        try:
            return draw(self.points, self.run_dir / PICTURE_FILE, self.monitor)
        except OSError as err:
            self._fail(err)
            return None

    def _fail(self, err: OSError) -> None:
        self._failed = True
        rank_zero_warn(f"curves: not written ({err.strerror or err}); the run goes on without them")


def panels(points: dict[str, Any], monitor: str | None) -> list[tuple[str, list[str]]]:
    """(title, metrics) of each panel: the losses, the monitored metric beside its training twin (when it
    is not a loss), the learning rates. Test metrics (one point) are left out."""
    keys = [k for k in points if not k.startswith("test/")]
    found = [
        ("loss", [k for k in keys if k.rsplit("/", 1)[-1] == "loss"]),
        _monitor_panel(monitor, points),
        ("learning rate", [k for k in keys if k.startswith("lr-")]),
    ]
    return [(title, names) for title, names in found if names]


def _monitor_panel(monitor: str | None, points: dict[str, Any]) -> tuple[str, list[str]]:
    """The monitored metric beside its training twin (val/acc with train/acc, where logged); none for a
    loss (the loss panel has it) or a metric never logged."""
    if not monitor or monitor not in points or monitor.rsplit("/", 1)[-1] == "loss":
        return "", []
    name = monitor.split("/", 1)[-1]
    twin = f"train/{name}"
    return name, [monitor, *([twin] if twin in points else [])]


def draw(points: dict[str, list[list[float]]], path: Path, monitor: str | None) -> Path | None:
    """The panels side by side, one line a metric (validation with markers: one point an epoch)."""
    if (plt := figures.pyplot(path)) is None:
        return None

    chosen = panels(points, monitor)
    if not chosen:
        return None
    fig, axes = plt.subplots(1, len(chosen), figsize=(4.2 * len(chosen), 3.2), squeeze=False)
    for ax, (title, names) in zip(axes[0], chosen, strict=True):
        for name in sorted(names, key=lambda n: not n.startswith("train/")):  # train first: the same colours
            steps, values = zip(*points[name], strict=True)
            ax.plot(steps, values, marker="o" if name.startswith("val/") else None, markersize=3, label=name)
        figures.step_axis(ax, title)
    fig.tight_layout()
    return figures.save(fig, path)
