"""The table a sweep (`-m`) ends with, also as Markdown under `<log dir>/<task>/sweeps/`: a row per job (its
overrides, its score: the best checkpoint's monitored metric, and the validation and test metrics it logged),
the best marked. Hydra calls this callback (hydra/default.yaml). Jobs may run elsewhere (hydra/launcher=local
or slurm), so each writes its row to a folder of the sweep, which the command that launched the sweep reads
once every job has ended."""

from __future__ import annotations

import datetime
import json
import os
import shutil
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from lightspeed.core.files import read_json, write_text_atomically
from lightspeed.core.summary import SUMMARY_FILE


class SweepTable(Callback):
    def __init__(self) -> None:
        self.rows_dir: Path | None = None  # set when a sweep starts; a single run writes no row

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        folder = Path(str(config.paths.log_dir)).resolve() / str(config.task_name) / "sweeps"
        self.rows_dir = folder / f".rows-{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}-{os.getpid()}"
        self.rows_dir.mkdir(parents=True)

    # radon C: a job of several ranks, a missing summary, a failed job: defaults for each
    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if self.rows_dir is None or rank_zero_only.rank != 0:  # a job of several ranks: its first says it
            return
        run_dir = Path(str(config.paths.output_dir))
        record = read_json(run_dir / SUMMARY_FILE) or {}
        metrics = record.get("metrics", {})
        settled = (record.get("config") or {}).get("monitor") or {}  # as the job settled it
        failed = job_return.status != JobStatus.COMPLETED
        row = {
            "overrides": list(job_return.overrides or []),
            "run": run_dir.name,
            "status": "failed" if failed else "done",
            "score": None if failed else job_return.return_value,
            "monitor": (settled.get("metric"), settled.get("mode")),
            "metrics": {k: v for k, v in metrics.items() if k.startswith(("val/", "test/")) and "@" not in k},
        }
        write_text_atomically(self.rows_dir / f"{config.hydra.job.num}.json", json.dumps(row))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.rows_dir is None:
            return
        files = sorted(self.rows_dir.glob("[0-9]*.json"), key=lambda f: int(f.stem))
        rows = [json.loads(f.read_text()) for f in files]
        shutil.rmtree(self.rows_dir, ignore_errors=True)
        if not rows:
            return
        title, names, cells = tabulate(rows)
        table = Table(title=title, title_justify="left")
        for name in names:
            table.add_column(name)
        for row in cells:
            table.add_row(*row)
        console = Console()
        (console if console.is_terminal else Console(width=160)).print(table)  # a log file: no wrapping
        folder = Path(str(config.paths.log_dir)) / str(config.task_name) / "sweeps"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}.md"
        lines = [f"{title}\n", "| " + " | ".join(names) + " |", "|" + " --- |" * len(names)]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        path.write_text("\n".join(lines) + "\n")
        print(f"sweep table: {path}")


# radon C: optional columns (monitor, metrics, failed jobs), each a filter
def tabulate(rows: list[dict[str, Any]]) -> tuple[str, list[str], list[list[str]]]:
    """The sweep's title (what all rows share), columns and cells: each row's varied overrides, its score (the
    best marked where every job has the same monitor) and every validation and test metric any job logged."""
    metric, mode, best = _judge(rows)
    shared = [o for o in rows[0]["overrides"] if all(o in row["overrides"] for row in rows)]
    logged = sorted({k for row in rows for k in row["metrics"]}, key=lambda k: (k.startswith("test/"), k))
    score = f"{metric} ({mode}, best ckpt)" if metric else "score (its monitor, best ckpt)"
    cells = [
        [
            " ".join(o for o in row["overrides"] if o not in shared) or "-",
            row["run"],
            row["status"],
            _score(row, best, metric),
            *(_cell(row["metrics"].get(k)) for k in logged),
        ]
        for row in rows
    ]
    title = f"Lightspeed: sweep of {len(rows)} runs"
    title += (f", all with {' '.join(shared)}" if shared else "") + (
        " (* the best)" if best is not None else ""
    )
    return title, ["overrides", "run", "status", score, *logged], cells


def _judge(rows: list[dict[str, Any]]) -> tuple[str | None, str | None, float | None]:
    """The jobs' one monitor (metric, mode) and the best score, where every job has the same monitor."""
    monitors = {tuple(row["monitor"]) for row in rows if row["monitor"][0] is not None}
    (metric, mode) = monitors.pop() if len(monitors) == 1 else (None, None)
    scores = [row["score"] for row in rows if isinstance(row["score"], (int, float))]
    return metric, mode, (min if mode == "min" else max)(scores) if scores and mode else None


def _score(row: dict[str, Any], best: float | None, metric: str | None) -> str:
    """The row's score, `*` if the best; where jobs have monitors of their own, the row's named."""
    mark = " *" if best is not None and row["score"] == best else ""
    own = "" if metric or row["monitor"][0] is None else f" ({row['monitor'][0]})"
    return _cell(row["score"]) + mark + own


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)
