"""Modules and data with one common mistake each, as users write them (tests/test_fuzz_modules.py)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from lightspeed.data import DigitsDataModule
from lightspeed.models.classifier import Classifier

BASE = L.LightningModule


class StepReturnsNone(Classifier):
    def training_step(self, batch: Any, batch_idx: int) -> None:
        super().training_step(batch, batch_idx)


class StepReturnsString(Classifier):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return "loss"


class StepReturnsDictWithoutLoss(Classifier):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return {"value": super().training_step(batch, batch_idx)}


class StepReturnsVector(Classifier):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return super().training_step(batch, batch_idx).expand(3)


class StepLogsString(Classifier):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("train/name", "abc")
        return super().training_step(batch, batch_idx)


class StepLogsVector(Classifier):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("train/vec", torch.ones(3))
        return super().training_step(batch, batch_idx)


class StepRaises(Classifier):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        raise IndexError("a bug in training_step")


class NoTrainingStep(Classifier):
    training_step = BASE.training_step


class NoValidationStep(Classifier):
    validation_step = BASE.validation_step


class ValidationRaises(Classifier):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        raise ValueError("a bug in validation_step")


class ValidationLogsString(Classifier):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/name", "abc")


class NoTestStep(Classifier):
    test_step = BASE.test_step


class TestRaises(Classifier):
    def test_step(self, batch: Any, batch_idx: int) -> None:
        raise ValueError("a bug in test_step")


class TestLogsString(Classifier):
    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test/name", "abc")


class NoOptimizers(Classifier):
    configure_optimizers = BASE.configure_optimizers


class OptimizersNone(Classifier):
    def configure_optimizers(self) -> Any:
        return None


class OptimizersString(Classifier):
    def configure_optimizers(self) -> Any:
        return "adam"


class ForwardRaises(Classifier):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("a bug in forward")


class NoValLoader(DigitsDataModule):
    val_dataloader = L.LightningDataModule.val_dataloader


class NoTestLoader(DigitsDataModule):
    test_dataloader = L.LightningDataModule.test_dataloader


class NoTrainLoader(DigitsDataModule):
    train_dataloader = L.LightningDataModule.train_dataloader


class EmptyTrainLoader(DigitsDataModule):
    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(0, 1, 8, 8)))


MODULES = [
    StepReturnsNone, StepReturnsString, StepReturnsDictWithoutLoss, StepReturnsVector, StepLogsString,
    StepLogsVector, StepRaises, NoTrainingStep, NoValidationStep, ValidationRaises, ValidationLogsString,
    NoTestStep, TestRaises, TestLogsString, NoOptimizers, OptimizersNone, OptimizersString, ForwardRaises,
]  # fmt: skip
DATA = [NoValLoader, NoTestLoader, NoTrainLoader, EmptyTrainLoader]
