"""An image classifier: any registered net, cross-entropy, accuracy, optimizer and LR schedule from the
config. Plain Lightning: what exact resume and speed need lives in callbacks and `lightspeed.compat`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from lightspeed.compat.trainer import is_last_batch, logs_this_step
from lightspeed.core.config import ConfigError
from lightspeed.models.metrics import Accuracy
from lightspeed.models.nets import build_net
from lightspeed.models.optim import build_optimizer, build_scheduler


class Classifier(L.LightningModule):
    """All arguments are plain containers, so `save_hyperparameters` stores only plain data and every
    checkpoint loads with `torch.load(..., weights_only=True)`."""

    def __init__(
        self,
        net: dict[str, Any],
        optimizer: dict[str, Any],
        scheduler: dict[str, Any],
        num_classes: int,
        input_shape: Sequence[int],
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = build_net(net, input_shape, num_classes)
        self.example_input_array = torch.zeros(2, *input_shape)  # lets ModelSummary show shapes and FLOPs
        self.train_acc, self.val_acc, self.test_acc = Accuracy(), Accuracy(), Accuracy()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.train_acc.update(logits, y)  # on the device; computed at the epoch's end
        # Logged where the logger writes, and at each epoch's first and last batch (the accuracy is the
        # epoch's, computed at its end): each self.log costs Python time, though no device sync.
        if batch_idx == 0 or logs_this_step(self.trainer) or is_last_batch(self.trainer):
            self.log("train/loss", loss)  # not prog_bar: Lightning would read a bar metric every batch
            self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def _eval_step(self, batch: tuple[Tensor, Tensor], stage: str, acc: Accuracy) -> None:
        x, y = batch
        logits = self(x)
        acc.update(logits, y)
        self.log(f"{stage}/loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log(f"{stage}/acc", acc, prog_bar=True)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val", self.val_acc)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test", self.test_acc)

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        x, y = batch
        probs = self(x).softmax(dim=-1)
        return {"pred": probs.argmax(dim=-1), "prob": probs.max(dim=-1).values, "target": y}

    def configure_optimizers(self) -> Any:
        optimizer = build_optimizer(self.parameters(), self.hparams["optimizer"])
        kind = self.hparams["scheduler"].get("name", "none")
        if kind == "none":
            return optimizer
        steps = self.trainer.estimated_stepping_batches
        if not math.isfinite(steps):
            raise ConfigError(
                f"model.scheduler.name={kind} needs a known length, but trainer.max_epochs=-1 sets none: "
                "set trainer.max_steps, or model.scheduler.name=none"
            )
        lr = self.hparams["optimizer"]["lr"]
        scheduler, unused = build_scheduler(optimizer, self.hparams["scheduler"], int(steps), lr)
        if unused:
            rank_zero_info(f"model.scheduler.name={kind}: ignoring {', '.join(unused)} (not its arguments)")
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
