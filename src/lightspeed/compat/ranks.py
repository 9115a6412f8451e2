"""What Lightspeed reads of Lightning's launcher and of the processes of its ranks (`trainer=ddp`, ddp_spawn,
ddp_fork): loaded only where a run has such ranks, or one failed."""

from __future__ import annotations

import csv
import signal
import threading
from pathlib import Path
from subprocess import Popen
from typing import Any

import lightning as L
from lightning.pytorch.loggers import CSVLogger

from lightspeed.compat.trainer import spawned


def launched_ranks(trainer: L.Trainer) -> list[Popen]:
    """The processes Lightning's launcher started for the other ranks (`trainer=ddp` on one machine);
    empty in those ranks, without a launcher, and for ddp_spawn/ddp_fork (whose every rank is a child that
    has ended once fit returns)."""
    procs = getattr(trainer.strategy.launcher, "procs", None) or []
    return [p for p in procs if isinstance(p, Popen)]


def progress_saved(checkpoint: dict[str, Any]) -> tuple[int, int]:
    """The global step and the epochs completed, as a Lightning checkpoint keeps them."""
    epochs = checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"]
    return int(checkpoint["global_step"]), int(epochs)


def fitted_in_children(trainer: L.Trainer) -> None:
    """After ddp_spawn/ddp_fork fitted in child processes, give this process's CSV loggers the columns the
    children wrote into metrics.csv: the test's children copy this process's writer, and one that knows no
    columns rewrote the file with the test's alone (a ValueError over the fit's rows)."""
    if not spawned(trainer):
        return
    for logger in trainer.loggers:
        path = Path(logger.log_dir) / "metrics.csv" if isinstance(logger, CSVLogger) else None
        if path is not None and path.is_file():
            with path.open(newline="") as f:
                logger.experiment.metrics_keys = next(csv.reader(f), [])


def kill_launched_ranks(trainer: L.Trainer) -> None:
    """SIGKILL the ranks Lightning's launcher started (its `kill`), after disarming the launcher's
    child-process observer: that thread wakes every 5 s and, finding a rank that exited non-zero,
    SIGKILLs this process too; it did, in CI, before this process had printed why it stopped."""
    disarm_child_observer()
    trainer.strategy.launcher.kill(signal.SIGKILL)


def disarm_child_observer() -> None:
    """Leave Lightning's `_ChildProcessObserver` (fabric's launchers/subprocess_script) nothing to watch: its
    next look finds no rank and ends."""
    for thread in threading.enumerate():
        if thread.name == "child-process-observer" and hasattr(thread, "_child_processes"):
            thread._child_processes = []
