"""Lightning's RichProgressBar without its per-step metric read."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar


class ProgressBar(RichProgressBar):
    """Reads the logged metrics only on the steps it redraws (every `refresh_rate`).

    Lightning 2.6's RichProgressBar reads them after every training step, whatever its refresh rate,
    calling `.item()` on each: a host-device sync per step on a GPU, and ~0.1 ms of Python per step.
    """

    _skip_metrics = False

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = batch_idx + 1
        self._skip_metrics = step % max(1, self.refresh_rate) != 0 and step != self.total_train_batches
        try:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        finally:
            self._skip_metrics = False

    def _update_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._skip_metrics:
            super()._update_metrics(trainer, pl_module)
