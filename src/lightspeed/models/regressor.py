"""A regressor: any net, mean squared error on standardised targets, MAE, MSE and R² in the targets' own
units (torchmetrics), optimizer and LR schedule from the config. Plain Lightning, as the classifier."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.regression import MeanAbsoluteError, MeanSquaredError, R2Score

from lightspeed.models import optim
from lightspeed.models.nets import build_net


class Regressor(L.LightningModule):
    """`input_shape`, `num_targets` and the train split's `target_mean` and `target_std` (one per target)
    come from the data. The net learns standardised targets (unit scale: one learning rate fits targets in
    any units); the statistics are hyperparameters, kept in every checkpoint, so that metrics and
    predictions are in the targets' own units wherever the checkpoint is loaded."""

    #: What picks the best checkpoint and stops early, unless the config's `monitor` says otherwise.
    monitor: ClassVar[dict[str, str]] = {"metric": "val/mse", "mode": "min"}

    def __init__(
        self,
        net: dict[str, Any],
        optimizer: dict[str, Any],
        scheduler: dict[str, Any] | None,
        input_shape: Sequence[int],
        num_targets: int,
        target_mean: Sequence[float],
        target_std: Sequence[float],
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = build_net(net, input_shape=input_shape, num_outputs=num_targets)
        self.register_buffer("y_mean", torch.tensor(target_mean, dtype=torch.float32), persistent=False)
        self.register_buffer("y_std", torch.tensor(target_std, dtype=torch.float32), persistent=False)
        self.example_input_array = torch.zeros(2, *input_shape)
        metrics = MetricCollection({"mae": MeanAbsoluteError(), "mse": MeanSquaredError(), "r2": R2Score()})
        self.val_metrics, self.test_metrics = metrics.clone(prefix="val/"), metrics.clone(prefix="test/")

    def forward(self, x: Tensor) -> Tensor:  # (B, *input_shape) -> (B, num_targets), standardised
        return self.net(x)

    def loss(self, out: Tensor, y: Tensor) -> Tensor:
        return F.mse_loss(out, (y.reshape(out.shape) - self.y_mean) / self.y_std)

    def predict(self, out: Tensor, y: Tensor) -> Tensor:
        """The net's output in the targets' own units, shaped as the targets are."""
        return (out * self.y_std + self.y_mean).reshape(y.shape)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = self.loss(self(x), y)
        self.log("train/loss", loss)
        return loss

    def _eval_step(self, batch: tuple[Tensor, Tensor], stage: str, metrics: MetricCollection) -> None:
        x, y = batch
        out = self(x)
        metrics.update(self.predict(out, y), y)
        self.log(f"{stage}/loss", self.loss(out, y), sync_dist=True)
        self.log_dict(metrics, prog_bar=stage == "val")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val", self.val_metrics)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test", self.test_metrics)

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """One row a sample in predictions.csv: the target and the prediction, in the targets' units."""
        x, y = batch
        return {"target": y, "pred": self.predict(self(x), y)}

    def configure_optimizers(self) -> Any:
        return optim.configure(self, self.hparams["optimizer"], self.hparams["scheduler"])
