"""Lightning's RichProgressBar, touched on a clock instead of on every step."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar


class ProgressBar(RichProgressBar):
    """Advances the bar and reads the logged metrics at most `refresh_rate` times a second.

    Lightning 2.6's RichProgressBar redraws in a background thread `refresh_rate` times a second, but
    after every training step it updates the task (a lock and a dict) and reads every metric with
    `.item()`: a host-device sync per step on a GPU. Here a step costs one clock read unless a redraw is
    due; the epoch's last step always updates, so the bar ends on the true count.
    """

    _last_update = float("-inf")

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.monotonic()
        due = now - self._last_update >= 1 / max(self.refresh_rate, 1e-9)
        if not due and batch_idx + 1 != self.total_train_batches:
            return
        self._last_update = now
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float]:
        """The logged metrics, without the logger's version number (each resumed attempt gets one)."""
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics
