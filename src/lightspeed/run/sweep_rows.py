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
import sys
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
    rows = [row for f in files if (row := _read_row(f, rows_dir)) is not None]
    shutil.rmtree(rows_dir, ignore_errors=True)
    if not rows:
        return
    from lightspeed.report.sweep_table import show  # only when a sweep ends

    show(rows, Path(str(config.paths.log_dir)) / str(config.task_name) / "sweeps")


def _row(run_dir: Path, job_return: JobReturn) -> dict[str, Any]:
    """A job's row: its overrides, run, status, score and the monitor that scored it (as the job settled it),
    and its validation and test metrics (none where its summary is missing)."""
    record = _mapping(read_json(run_dir / SUMMARY_FILE, within=run_dir))
    metrics = _mapping(record.get("metrics"))
    settled = _mapping(_mapping(record.get("config")).get("monitor"))
    failed = job_return.status != JobStatus.COMPLETED
    return {
        "overrides": list(job_return.overrides or []),
        "run": run_dir.name,
        "status": "failed" if failed else "done",
        "score": None if failed else job_return.return_value,
        "monitor": (settled.get("metric"), settled.get("mode")),
        "metrics": {k: v for k, v in metrics.items() if k.startswith(("val/", "test/")) and "@" not in k},
    }


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _strings(value: Any, length: int | None = None) -> bool:
    """A list of strings (None among them where `length` is given: the monitor's pair)."""
    ok = isinstance(value, list) and (length is None or len(value) == length)
    return ok and all(isinstance(v, str) or (length is not None and v is None) for v in value)


#: What `add` writes each key of a row as: a row of another shape is left out, with a line.
ROW = {
    "overrides": _strings,
    "run": lambda v: isinstance(v, str),
    "status": lambda v: isinstance(v, str),
    "score": lambda v: v is None or isinstance(v, (int, float)),
    "monitor": lambda v: _strings(v, 2),
    "metrics": lambda v: isinstance(v, dict),
}


def _read_row(path: Path, rows_dir: Path) -> dict[str, Any] | None:
    """A job's row as `add` wrote it; None, and a line naming it, for one that is not (torn, emptied, a FIFO,
    a link out of the sweep's folder, edited): the table shows the other jobs, and says it lacks this one."""
    row = read_json(path, within=rows_dir)
    if isinstance(row, dict) and ROW.keys() <= row.keys() and all(ok(row[k]) for k, ok in ROW.items()):
        return row
    print(f"sweep: {path} is no job's row as written (torn, edited, not a file): left out", file=sys.stderr)
    return None
