"""Lightning's ModelCheckpoint and EarlyStopping, the same behaviour with less work per step.

Lightning dispatches every hook to every callback (~6 a training step) and names each call after the
callback's `state_key`, which these two rebuild from a dict repr every time. Their key's inputs are
fixed at construction, so it is built once; the class names stay Lightning's, so `state_key` and the
checkpoints they write are unchanged.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping as _EarlyStopping
from lightning.pytorch.callbacks import ModelCheckpoint as _ModelCheckpoint


class _StateKeyOnce:
    @property
    def state_key(self) -> str:
        key = self.__dict__.get("_state_key_once")
        if key is None:
            key = self.__dict__["_state_key_once"] = super().state_key  # type: ignore[misc]
        return key


class ModelCheckpoint(_StateKeyOnce, _ModelCheckpoint):
    """`on_train_batch_end` returns at once when neither `every_n_train_steps` nor
    `train_time_interval` is set, where Lightning's returns after checking the trainer's state."""

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._every_n_train_steps < 1 and self._train_time_interval is None:
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


class EarlyStopping(_StateKeyOnce, _EarlyStopping):
    pass
