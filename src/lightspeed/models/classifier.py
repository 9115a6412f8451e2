"""An image classifier: any net, cross-entropy, accuracy, optimizer and LR schedule from the config.
Plain Lightning: what exact resume and speed need lives in callbacks and `lightspeed.compat`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.classification import MulticlassConfusionMatrix

from lightspeed.models import optim
from lightspeed.models.metrics import Accuracy
from lightspeed.models.nets import build_net


class Classifier(L.LightningModule):
    """All arguments are plain containers, so `save_hyperparameters` stores only plain data and every
    checkpoint loads with `torch.load(..., weights_only=True)`. `num_classes` and `input_shape` come from
    the data (its DataModule's attributes of those names)."""

    #: What picks the best checkpoint and stops early, unless the config's `monitor` says otherwise: a
    #: classifier is judged by accuracy (val/loss can rise while accuracy still improves: overconfident
    #: mistakes), so the loss would pick an early checkpoint.
    monitor: ClassVar[dict[str, str]] = {"metric": "val/acc", "mode": "max"}

    def __init__(
        self,
        net: dict[str, Any],
        optimizer: dict[str, Any],
        scheduler: dict[str, Any] | None,
        num_classes: int,
        input_shape: Sequence[int],
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = build_net(net, input_shape=input_shape, num_outputs=num_classes)
        self.example_input_array = torch.zeros(2, *input_shape)  # lets ModelSummary show shapes and FLOPs
        self.train_acc, self.val_acc, self.test_acc = Accuracy(), Accuracy(), Accuracy()
        # testing only: rows the true class, columns the predicted one (`make eval` writes it out)
        self.test_confusion = MulticlassConfusionMatrix(num_classes, validate_args=False)
        self.confusion_matrix: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def loss(self, logits: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(logits, y)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = self.loss(logits, y)
        self.train_acc.update(logits, y)  # on the device; computed at the epoch's end
        # Logged where the logger writes (every log_every_n_steps optimizer steps), and at each epoch's
        # first and last batch (the accuracy is the epoch's, computed at its end): each self.log costs
        # Python time, though no device sync.
        trainer, every = self.trainer, self.trainer.log_every_n_steps
        if (
            batch_idx == 0
            or trainer.is_last_batch
            or (every and (trainer.global_step + 1) % every == 0)
            or trainer.should_stop
        ):
            self.log("train/loss", loss)  # not prog_bar: Lightning would read a bar metric every batch
            self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def _eval_step(self, batch: tuple[Tensor, Tensor], stage: str, acc: Accuracy) -> Tensor:
        x, y = batch
        logits = self(x)
        acc.update(logits, y)
        self.log(f"{stage}/loss", self.loss(logits, y), sync_dist=True)
        self.log(f"{stage}/acc", acc, prog_bar=True)
        return logits

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val", self.val_acc)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        logits = self._eval_step(batch, "test", self.test_acc)
        self.test_confusion.update(logits, batch[1])

    def on_test_epoch_end(self) -> None:
        self.confusion_matrix = self.test_confusion.compute()  # summed over DDP ranks
        self.test_confusion.reset()

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """One row a sample in predictions.csv: these columns (class names beside `pred` and `target`
        where the data names its classes)."""
        x, y = batch
        probs = self(x).softmax(dim=-1)
        return {"target": y, "pred": probs.argmax(dim=-1), "prob": probs.max(dim=-1).values}

    def configure_optimizers(self) -> Any:
        return optim.configure(self, self.hparams["optimizer"], self.hparams["scheduler"])
