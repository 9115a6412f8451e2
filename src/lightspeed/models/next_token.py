"""A sequence model: tokens in, next-token cross-entropy, exact-match accuracy of the scored tokens
(torchmetrics), any net that maps (B, T) tokens to (B, T, vocab) logits (models/gpt.py). Plain Lightning,
as the classifier."""

from __future__ import annotations

from typing import Any, ClassVar

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.classification import MulticlassExactMatch

from lightspeed.models import optim
from lightspeed.models.nets import build_net

#: Target positions that are not scored (a prompt): cross_entropy's default ignore_index.
IGNORE = -100


class NextTokenModel(L.LightningModule):
    """`vocab_size` and `block_size` (the sequence length) come from the data. A sequence counts as
    right when every scored token is (targets set to IGNORE are not scored): with teacher forcing this is
    exactly whether greedy decoding would write the whole answer."""

    #: What picks the best checkpoint and stops early, unless the config's `monitor` says otherwise.
    monitor: ClassVar[dict[str, str]] = {"metric": "val/exact_match", "mode": "max"}

    def __init__(
        self,
        net: dict[str, Any],
        optimizer: dict[str, Any],
        scheduler: dict[str, Any] | None,
        vocab_size: int,
        block_size: int,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = build_net(net, vocab_size=vocab_size, block_size=block_size)
        self.example_input_array = torch.zeros(2, block_size, dtype=torch.long)
        exact = MulticlassExactMatch(num_classes=vocab_size, ignore_index=IGNORE)
        self.val_exact, self.test_exact = exact.clone(), exact.clone()

    def forward(self, tokens: Tensor) -> Tensor:  # (B, T) -> (B, T, vocab_size)
        return self.net(tokens)

    def loss(self, logits: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = self.loss(self(x), y)
        self.log("train/loss", loss)
        return loss

    def _eval_step(self, batch: tuple[Tensor, Tensor], stage: str, exact: MulticlassExactMatch) -> None:
        x, y = batch
        logits = self(x)
        exact.update(logits.argmax(dim=-1), y)
        self.log(f"{stage}/loss", self.loss(logits, y), sync_dist=True)
        self.log(f"{stage}/exact_match", exact, prog_bar=True)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val", self.val_exact)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test", self.test_exact)

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """One row a sample in predictions.csv: the scored tokens (the answer), target and predicted, and
        whether all of them are right."""
        x, y = batch
        pred = self(x).argmax(dim=-1)
        scored = (y != IGNORE).any(dim=0)  # the answer's positions (the same in every row of a task)
        exact = ((pred == y) | (y == IGNORE)).all(dim=-1)
        return {"target": y[:, scored], "pred": pred[:, scored], "exact": exact}

    def configure_optimizers(self) -> Any:
        return optim.configure(self, self.hparams["optimizer"], self.hparams["scheduler"])
