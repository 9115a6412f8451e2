"""Lightning's RichProgressBar, touched on a clock, showing metrics read at logging steps only."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from torch import Tensor

from lightspeed.compat.callbacks import EpochOfNoLimit, PromptStop


class ProgressBar(PromptStop, EpochOfNoLimit, RichProgressBar):
    """Advances the bar at most `refresh_rate` times a second and shows the training metrics as of the last
    logging step (every `trainer.log_every_n_steps`), each epoch's first and last batch. Lightning 2.6's
    RichProgressBar updates every step and reads every metric with `.item()` (on a GPU, a wait for all queued
    work); here they are read on logging steps, where the logger has waited anyway. Step metrics logged with
    `prog_bar=False` (sparing Lightning's per-batch read) show too: every `train/*` value."""

    _last_update = float("-inf")
    _shown: dict[str, Any] | None = None  # what the bar shows during training, read at logging steps
    _read_at = -1  # the optimizer step they were read at (accumulated batches share one)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        last = batch_idx + 1 == self.total_train_batches
        logged = trainer.global_step % trainer.log_every_n_steps == 0 and trainer.global_step != self._read_at
        if batch_idx == 0 or last or logged:
            self._shown, self._read_at = self._read_metrics(trainer, pl_module), trainer.global_step
        now = time.monotonic()
        if now - self._last_update < 1 / max(self.refresh_rate, 1e-9) and not last:
            return
        self._last_update = now
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._shown = self._read_metrics(trainer, pl_module)  # the epoch's metrics, just computed
        super().on_train_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._shown = None  # read again when training goes on: the bar shows the new validation figures
        super().on_validation_end(trainer, pl_module)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float]:
        if not trainer.training:
            return self._read_metrics(trainer, pl_module)
        if self._shown is None:  # e.g. the first redraw after a mid-epoch resume: read once, keep it
            self._shown = self._read_metrics(trainer, pl_module)
        return self._shown

    def _read_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """The bar's metrics and every `train/*` value, as numbers, without the logger's version number
        (each resumed attempt gets one)."""
        metrics: dict[str, Any] = dict(super().get_metrics(trainer, pl_module))
        metrics.pop("v_num", None)
        for key, value in trainer.callback_metrics.items():
            if key.startswith("train/") and key not in metrics:
                metrics[key] = value.item() if isinstance(value, Tensor) else value
        return metrics
