"""What Lightspeed reads of a running Trainer beyond its public API."""

from __future__ import annotations

import signal
import threading
from subprocess import Popen

import lightning as L
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler  # noqa: F401 (re-exported)
from torchmetrics import Metric


def is_last_batch(trainer: L.Trainer) -> bool:
    """Whether the training batch now running is its epoch's last."""
    return bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def batches_done_in_epoch(trainer: L.Trainer) -> int:
    """Training batches of the current epoch already done (after a restore: as the checkpoint says)."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)


def launched_ranks(trainer: L.Trainer) -> list[Popen]:
    """The processes Lightning's launcher started for the other ranks (`trainer=ddp` on one machine);
    empty in those ranks and without a launcher."""
    return list(getattr(trainer.strategy.launcher, "procs", None) or [])


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


def mark_updated(metric: Metric) -> None:
    """Tell a torchmetrics Metric whose state was set by hand that it holds updates, so that `compute`
    neither warns nor returns its default."""
    metric._update_count += 1
