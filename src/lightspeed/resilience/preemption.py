"""Preemption: on SIGTERM or SIGUSR1, save a checkpoint at the next step and exit; the rerun continues."""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

import lightning as L
import torch

from lightspeed.compat.callbacks import validation_follows


class Preemption(L.Callback):
    """Clusters announce the end of a job with a signal (SLURM: SIGUSR1 with `--signal`, then SIGTERM) and
    kill it seconds later. The handler only records it: no I/O, no collective (Lightning 2.6's broadcasts
    from inside its handler, which can deadlock). After each optimizer step (DDP: every `check_every_n_steps`
    steps, one all-reduce) every rank saves `last.ckpt` and the run exits 128 + the signal; under SLURM's
    auto-requeue, after SIGUSR1 only, the first rank requeues the job. docs/resilience.md has the rest."""

    def __init__(
        self, signals: Sequence[str] = ("SIGTERM", "SIGUSR1"), check_every_n_steps: int = 10
    ) -> None:
        self.signals = [signal.Signals[name] for name in signals]
        self.check_every_n_steps = check_every_n_steps
        self.received: int = 0
        self._previous: dict[int, Any] = {}
        self._step_at_start = 0
        self._agreed = 0  # a signal the ranks agreed on at an epoch's last batch: stop at the next step

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.received = self.received or signum

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Installed after Lightning's own SIGTERM handler (registered after `on_fit_start`), replacing it;
        Lightning puts back the handlers from before fit when it tears down."""
        super().on_train_start(trainer, pl_module)
        if threading.current_thread() is not threading.main_thread():
            return
        # a SIGTERM during set-up or the sanity check reached Lightning's handler: honour it here
        self.received = signal.SIGTERM if trainer.received_sigterm else 0
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._record)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._record:
                signal.signal(signum, previous)
        self._previous = {}

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_batch_start(trainer, *args)
        self._step_at_start = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_batch_end(trainer, *args)
        step = trainer.global_step
        if step == self._step_at_start:
            return  # accumulating gradients: only whole optimizer steps are saved
        received = self._agreed
        if not received:
            received = self.received
            if trainer.world_size > 1:
                if step % self.check_every_n_steps:
                    return
                flag = torch.tensor(received, device=trainer.strategy.root_device)
                received = int(trainer.strategy.reduce(flag, reduce_op="max"))
        if not received:
            return
        if validation_follows(trainer):
            # Saved now, the checkpoint would precede this epoch's validation, and a run resumed from it
            # would skip that validation (Lightning 2.6): stop after the next step instead.
            self._agreed = received
            return
        self._save_and_stop(trainer, received)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        if self._agreed:  # that was the last epoch's last step: what is left is testing
            self._save_and_stop(trainer, self._agreed)

    def _save_and_stop(self, trainer: L.Trainer, received: int) -> None:
        from lightspeed.resilience.incidents import save_and_stop

        self._agreed = 0
        save_and_stop(trainer, received)
