"""`make compare RUNS="a b"`: several runs on one chart (the monitored metric and the losses against the
step, from each run's curves.json) and a table of what each ended with (from its summary.json). A run is
a folder, or a run name under logs/train/runs/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from lightspeed.core.boundary import bounded
from lightspeed.core.files import read_json
from lightspeed.core.summary import SUMMARY_FILE
from lightspeed.report import figures
from lightspeed.report.curves import load


def find(run: str, log_dir: Path) -> Path:
    """The run folder `run` names: a path, or a name under `log_dir/train/runs/` (or a sweep's folder)."""
    for candidate in (Path(run), log_dir / "train" / "runs" / run):
        if (candidate / SUMMARY_FILE).is_file():
            return candidate
    swept = sorted(log_dir.glob(f"train/multiruns/*/{run}/{SUMMARY_FILE}"))
    if swept:
        return swept[-1].parent
    raise SystemExit(
        f"error: RUNS: {run} is no finished run (no {SUMMARY_FILE} in {run} or {log_dir}/train/runs/{run})"
    )


def _summary(run_dir: Path) -> dict[str, Any]:
    found = read_json(run_dir / SUMMARY_FILE, within=run_dir)  # not through a link out of the run's folder
    if not isinstance(found, dict):
        raise SystemExit(f"error: RUNS: {run_dir}/{SUMMARY_FILE} cannot be read: rerun that run")
    return found


def table(runs: dict[str, dict[str, Any]]) -> Table:
    """One row a run: its monitored metric at the best checkpoint, its test metrics, steps and seconds."""
    names = {k for s in runs.values() for k in s.get("metrics", {})}
    metrics = sorted(k for k in names if k.startswith("test/") or k.endswith("@best"))
    out = Table(title="Lightspeed: runs compared", title_justify="left")
    for column in ("run", "monitor", *metrics, "steps", "fit s"):
        out.add_column(column, justify="left" if column in ("run", "monitor") else "right")
    for name, facts in runs.items():
        values = facts.get("metrics", {})
        cells = [_figure(values.get(m)) for m in metrics]
        out.add_row(
            name,
            str(facts.get("monitor")),
            *cells,
            str(facts.get("global_step", "-")),
            str(facts.get("fit_seconds", "-")),
        )
    return out


def _figure(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"


def chart(
    curves: dict[str, dict[str, list[list[float]]]], monitors: dict[str, str | None], out: Path
) -> Path | None:
    """Two panels: each run's monitored metric (validation), and each run's losses (training solid,
    validation dashed); one colour a run."""
    if (plt := figures.pyplot(out, lambda line: print(f"compare: {line}", file=sys.stderr))) is None:
        return None

    fig, (metric_ax, loss_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, (name, points) in enumerate(curves.items()):
        lines = [
            (metric_ax, monitors.get(name), {"marker": "o", "markersize": 3}),
            (loss_ax, "train/loss", {"linestyle": "-"}),
            (loss_ax, "val/loss", {"linestyle": "--"}),
        ]
        for ax, key, style in lines:
            if key in points:
                ax.plot(*zip(*points[key], strict=True), color=f"C{i % 10}", label=f"{name}: {key}", **style)
    for ax, title in ((metric_ax, "monitored metric"), (loss_ax, "loss")):
        figures.step_axis(ax, title, legend_size=7)
    fig.tight_layout()
    return figures.save(fig, out)


@bounded("compare")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="make compare", description=__doc__)
    parser.add_argument("runs", nargs="*", help="run folders or run names under logs/train/runs/")
    parser.add_argument(
        "--log-dir", type=Path, default=Path("logs"), help="where the runs are (paths.log_dir)"
    )
    parser.add_argument("--out", type=Path, default=None, help="the chart (default: <log dir>/compare.png)")
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        raise SystemExit('error: RUNS names fewer than two runs: make compare RUNS="<run> <run> ..."')
    folders = {Path(r).name: find(r, args.log_dir) for r in args.runs}
    summaries = {name: _summary(folder) for name, folder in folders.items()}
    monitors = {name: str(s.get("monitor") or "").split(" ")[0] or None for name, s in summaries.items()}
    curves = {n: load(f) for n, f in folders.items()}
    drawn = chart(curves, monitors, args.out or args.log_dir / "compare.png")
    Console().print(table(summaries))
    if drawn is not None:
        print(f"compare: {drawn}")


if __name__ == "__main__":
    main()
