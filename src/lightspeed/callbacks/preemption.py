"""Preemption: on SIGTERM or SIGUSR1, save a checkpoint at the next step and exit; the rerun continues."""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import LightningEnvironment

from lightspeed.failures import Preempted


class Preemption(L.Callback):
    """Clusters announce the end of a job with a signal (SLURM: SIGUSR1 with `--signal`, then SIGTERM;
    Kubernetes and most schedulers: SIGTERM) and kill it some seconds later.

    The handler only records the signal: no I/O, no collective (Lightning 2.6's own SIGTERM handler
    broadcasts from inside the handler, which can deadlock until the process-group timeout). After each
    optimizer step the flag is read; with several ranks, every `check_every_n_steps` steps the ranks
    agree with one small all-reduce, so that they all save the same step and stop together. Then the
    checkpoint goes to `<checkpoint dir>/last.ckpt` (written atomically) and the run exits with
    128 + the signal's number (143 for SIGTERM). The longest wait is one step (one process) or
    `check_every_n_steps` steps (DDP), plus the save.
    """

    def __init__(
        self, signals: Sequence[str] = ("SIGTERM", "SIGUSR1"), check_every_n_steps: int = 10
    ) -> None:
        self.signals = [signal.Signals[name] for name in signals]
        self.check_every_n_steps = check_every_n_steps
        self.received: int = 0
        self._previous: dict[int, Any] = {}
        self._step_at_start = 0

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.received = self.received or signum

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Installed after Lightning's own SIGTERM handler (registered after `on_fit_start`), replacing it;
        Lightning puts back the handlers from before fit when it tears down."""
        if threading.current_thread() is not threading.main_thread():
            return
        self.received = 0
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._record)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._record:
                signal.signal(signum, previous)
        self._previous = {}

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._step_at_start = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        step = trainer.global_step
        if step == self._step_at_start:
            return  # accumulating gradients: only whole optimizer steps are saved
        received = self.received
        if trainer.world_size > 1:
            if step % self.check_every_n_steps:
                return
            flag = torch.tensor(received, device=trainer.strategy.root_device)
            received = int(trainer.strategy.reduce(flag, reduce_op="max"))
        if not received:
            return
        path = str(_checkpoint_dir(trainer) / "last.ckpt")
        callback = trainer.checkpoint_callback
        if callback is not None and hasattr(callback, "last_model_path"):
            # its own record of last.ckpt, saved with it: after resuming it overwrites the file instead of
            # writing last-v1.ckpt beside it
            callback.last_model_path = path
        trainer.save_checkpoint(path, weights_only=False)  # on every rank: their random states are gathered
        raise Preempted(received, step, path, exit_code=_exit_code(trainer, received))


def _checkpoint_dir(trainer: L.Trainer) -> Path:
    """The checkpoint callback's folder, else `<run dir>/checkpoints`: where `resume=auto` looks."""
    callback = trainer.checkpoint_callback
    folder = getattr(callback, "dirpath", None)
    return Path(folder) if folder else Path(trainer.default_root_dir) / "checkpoints"


def _exit_code(trainer: L.Trainer, signum: int) -> int:
    """128 + the signal, as a shell reports a process that a signal ended. Ranks that Lightning started
    itself exit 0: Lightning's launcher SIGKILLs the first rank when another exits non-zero, and the
    first rank's code is the run's."""
    env = getattr(trainer.strategy, "cluster_environment", None)
    launched_by_lightning = isinstance(env, LightningEnvironment) and trainer.strategy.launcher is not None
    return 0 if trainer.global_rank != 0 and launched_by_lightning else 128 + signum
