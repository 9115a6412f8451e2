"""The rows of the table a sweep (`-m`) ends with (`report/sweep_table.py` draws it): a row per job (its
overrides, its score: the best checkpoint's monitored metric, and the validation and test metrics it
logged). Jobs may run elsewhere (hydra/launcher=local or slurm), so each writes its row to a folder of the
sweep, which the command that launched the sweep reads once every job has ended. Loaded only in a sweep
(`run/sweep.py`'s callback)."""

from __future__ import annotations

import datetime
import json
import os
import shutil
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from lightspeed.core.files import read_json, write_text_atomically
from lightspeed.core.summary import SUMMARY_FILE


def start(config: DictConfig) -> Path:
    """The folder the sweep's jobs write their rows to, made."""
    folder = Path(str(config.paths.log_dir)).resolve() / str(config.task_name) / "sweeps"
    rows_dir = folder / f".rows-{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}-{os.getpid()}"
    rows_dir.mkdir(parents=True)
    return rows_dir


def add(rows_dir: Path, config: DictConfig, job_return: JobReturn) -> None:
    """The ended job's row, written to `rows_dir`."""
    if rank_zero_only.rank != 0:  # a job of several ranks: its first says it
        return
    row = _row(Path(str(config.paths.output_dir)), job_return)
    write_text_atomically(rows_dir / f"{config.hydra.job.num}.json", json.dumps(row))


def end(rows_dir: Path, config: DictConfig) -> None:
    """The jobs' rows read (and their folder removed), and shown as the sweep's table."""
    files = sorted(rows_dir.glob("[0-9]*.json"), key=lambda f: int(f.stem))
    rows = [json.loads(f.read_text()) for f in files]
    shutil.rmtree(rows_dir, ignore_errors=True)
    if not rows:
        return
    from lightspeed.report.sweep_table import show  # only when a sweep ends

    show(rows, Path(str(config.paths.log_dir)) / str(config.task_name) / "sweeps")


def _row(run_dir: Path, job_return: JobReturn) -> dict[str, Any]:
    """A job's row: its overrides, run, status, score and the monitor that scored it (as the job settled it),
    and its validation and test metrics (none where its summary is missing)."""
    record = read_json(run_dir / SUMMARY_FILE) or {}
    metrics = record.get("metrics", {})
    settled = (record.get("config") or {}).get("monitor") or {}
    failed = job_return.status != JobStatus.COMPLETED
    return {
        "overrides": list(job_return.overrides or []),
        "run": run_dir.name,
        "status": "failed" if failed else "done",
        "score": None if failed else job_return.return_value,
        "monitor": (settled.get("metric"), settled.get("mode")),
        "metrics": {k: v for k, v in metrics.items() if k.startswith(("val/", "test/")) and "@" not in k},
    }
