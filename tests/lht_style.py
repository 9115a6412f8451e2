"""A module, a net and a DataModule written in lightning-hydra-template's idiom (our own code, not a copy of
its files): the net and a `_partial_` optimizer and scheduler arrive built by Hydra and are kept by
`save_hyperparameters(logger=False)`; the DataModule makes its own loaders. Nothing here knows Lightspeed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset, random_split
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification.accuracy import Accuracy


class DenseNet(nn.Module):
    """Flatten, then three Linear-BatchNorm-ReLU blocks."""

    def __init__(self, input_size: int = 64, lin1_size: int = 64, lin2_size: int = 64, output_size: int = 10):
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(input_size, lin1_size),
            nn.BatchNorm1d(lin1_size),
            nn.ReLU(),
            nn.Linear(lin1_size, lin2_size),
            nn.BatchNorm1d(lin2_size),
            nn.ReLU(),
            nn.Linear(lin2_size, output_size),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 1, 8, 8) -> (B, 10)
        return self.model(x.flatten(1))


class DigitsLitModule(L.LightningModule):
    def __init__(
        self,
        net: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any] | None,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)  # the net and two partials: objects, not plain data
        self.net = net
        self.criterion = nn.CrossEntropyLoss()
        self.train_acc = Accuracy(task="multiclass", num_classes=10)
        self.val_acc = Accuracy(task="multiclass", num_classes=10)
        self.test_acc = Accuracy(task="multiclass", num_classes=10)
        self.train_loss, self.val_loss, self.test_loss = MeanMetric(), MeanMetric(), MeanMetric()
        self.val_acc_best = MaxMetric()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def on_train_start(self) -> None:
        self.val_loss.reset()
        self.val_acc.reset()
        self.val_acc_best.reset()

    def model_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        x, y = batch
        logits = self.forward(x)
        return self.criterion(logits, y), logits.argmax(dim=1), y

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, preds, targets = self.model_step(batch)
        self.train_loss(loss)
        self.train_acc(preds, targets)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, preds, targets = self.model_step(batch)
        self.val_loss(loss)
        self.val_acc(preds, targets)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, preds, targets = self.model_step(batch)
        self.test_loss(loss)
        self.test_acc(preds, targets)
        self.log("test/loss", self.test_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("test/acc", self.test_acc, on_step=False, on_epoch=True, prog_bar=True)

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> dict[str, Any]:
        x, y = batch
        return {"target": y, "pred": self.forward(x).argmax(dim=1)}

    def setup(self, stage: str) -> None:
        if self.hparams.compile and stage == "fit":
            self.net = torch.compile(self.net)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = self.hparams.optimizer(params=self.trainer.model.parameters())
        if self.hparams.scheduler is None:
            return {"optimizer": optimizer}
        scheduler = self.hparams.scheduler(optimizer=optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {
                "scheduler": scheduler,
                "monitor": "val/loss",
                "interval": "epoch",
                "frequency": 1,
            },
        }


class WithoutValidation(DigitsLitModule):
    """The same module with no validation: it logs train/loss and train/acc alone."""

    validation_step = L.LightningModule.validation_step
    on_validation_epoch_end = L.LightningModule.on_validation_epoch_end


class DigitsDataModule(L.LightningDataModule):
    """scikit-learn's bundled digits (no download) as (1, 8, 8) images, split once with a fixed seed."""

    def __init__(
        self,
        data_dir: str = "data/",
        train_val_test_split: tuple[int, int, int] = (1257, 180, 360),
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.data_train: Dataset | None = None
        self.data_val: Dataset | None = None
        self.data_test: Dataset | None = None
        self.batch_size_per_device = batch_size

    def setup(self, stage: str | None = None) -> None:
        if self.trainer is not None:
            self.batch_size_per_device = self.hparams.batch_size // self.trainer.world_size
        if self.data_train is None:
            x, y = load_digits(return_X_y=True)
            dataset = TensorDataset(
                torch.tensor(x, dtype=torch.float32).view(-1, 1, 8, 8) / 16, torch.tensor(y)
            )
            self.data_train, self.data_val, self.data_test = random_split(
                dataset, self.hparams.train_val_test_split, generator=torch.Generator().manual_seed(42)
            )

    def _loader(self, data: Dataset | None, shuffle: bool) -> DataLoader:
        return DataLoader(
            data,
            batch_size=self.batch_size_per_device,
            num_workers=self.hparams.num_workers,
            pin_memory=self.hparams.pin_memory,
            shuffle=shuffle,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.data_train, True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.data_val, False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.data_test, False)


#: The model's and data's yaml, as lightning-hydra-template writes them (mnist.yaml's shape).
MODEL_YAML = """\
_target_: lht_style.DigitsLitModule
optimizer:
  _target_: torch.optim.Adam
  _partial_: true
  lr: 0.001
  weight_decay: 0.0
scheduler:
  _target_: torch.optim.lr_scheduler.ReduceLROnPlateau
  _partial_: true
  mode: min
  factor: 0.1
  patience: 10
net:
  _target_: lht_style.DenseNet
  input_size: 64
  lin1_size: 64
  lin2_size: 128
  output_size: 10
compile: false
"""

DATA_YAML = """\
_target_: lht_style.DigitsDataModule
data_dir: ${paths.data_dir}
batch_size: 128
train_val_test_split: [1257, 180, 360]
num_workers: 0
pin_memory: false
"""
