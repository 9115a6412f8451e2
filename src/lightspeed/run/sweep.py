"""The rows of the table a sweep (`-m`) ends with (`report/sweep_table.py` draws it): a row per job (its
overrides, its score: the best checkpoint's monitored metric, and the validation and test metrics it
logged). Hydra calls this callback (hydra/default.yaml). Jobs may run elsewhere (hydra/launcher=local or
slurm), so each writes its row to a folder of the sweep, which the command that launched the sweep reads
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

from lightspeed.core.files import read_json, write_text_atomically
from lightspeed.core.summary import SUMMARY_FILE


class SweepTable(Callback):
    def __init__(self) -> None:
        self.rows_dir: Path | None = None  # set when a sweep starts; a single run writes no row

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        folder = Path(str(config.paths.log_dir)).resolve() / str(config.task_name) / "sweeps"
        self.rows_dir = folder / f".rows-{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}-{os.getpid()}"
        self.rows_dir.mkdir(parents=True)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if self.rows_dir is None or rank_zero_only.rank != 0:  # a job of several ranks: its first says it
            return
        row = _row(Path(str(config.paths.output_dir)), job_return)
        write_text_atomically(self.rows_dir / f"{config.hydra.job.num}.json", json.dumps(row))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.rows_dir is None:
            return
        files = sorted(self.rows_dir.glob("[0-9]*.json"), key=lambda f: int(f.stem))
        rows = [json.loads(f.read_text()) for f in files]
        shutil.rmtree(self.rows_dir, ignore_errors=True)
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
