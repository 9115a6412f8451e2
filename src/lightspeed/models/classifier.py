"""An image classifier: any registered net, cross-entropy, torchmetrics accuracy, optimizer and LR
schedule from the config."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from lightspeed import ranks
from lightspeed.compat.hooks import CheapHookNames
from lightspeed.compat.trainer import logs_this_step, mark_updated
from lightspeed.config import ConfigError
from lightspeed.models.metrics import Accuracy
from lightspeed.models.nets import build_net
from lightspeed.models.optim import build_optimizer, build_scheduler, schedule_length


class Classifier(CheapHookNames, L.LightningModule):
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
        self._logged_epoch = -1  # the last epoch whose accuracy was registered with self.log

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    # The epoch's training accuracy so far travels with a mid-epoch checkpoint, so that a resumed epoch
    # reports the accuracy over all its batches, as an uninterrupted one does. The latest metrics travel
    # too: a resumed run reports them where it has not measured them again (after its training had
    # finished, or resumed past the last logging step), as an uninterrupted run would.
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        pending = getattr(self, "_restored_train_acc", None)
        if pending is not None:  # saved right after a restore, before on_train_start applied it
            checkpoint["train_acc"] = pending
        else:
            state = {k: v.detach().cpu() for k, v in self.train_acc.metric_state.items()}
            # each rank counts its own batches: all ranks' counts, each restored to its rank
            checkpoint["train_acc"] = {"epoch": self.current_epoch, "ranks": ranks.gather(state)}
        logged = self.trainer.callback_metrics.items()
        metrics = dict(getattr(self, "_restored_metrics", {}))  # the latest known, until measured again
        metrics.update({k: float(v) for k, v in logged if k.startswith(("train/", "val/"))})
        if self.train_acc.update_count:  # the epoch's accuracy so far, as its end will log it
            metrics["train/acc"] = float(self.train_acc.compute())
        checkpoint["metrics"] = metrics

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._restored_train_acc = checkpoint.get("train_acc")
        self._restored_metrics = dict(checkpoint.get("metrics", {}))
        schedules = checkpoint.get("lr_schedulers") or [{}]
        self._restored_schedule_steps = schedules[0].get("total_steps", schedules[0].get("T_max"))

    def on_train_start(self) -> None:  # Lightning skips on_train_epoch_start when it resumes mid-epoch
        self._logged_epoch = -1  # each fit registers its first epoch's accuracy again
        restored, self._restored_train_acc = getattr(self, "_restored_train_acc", None), None
        if restored is None or restored["epoch"] != self.current_epoch:
            return
        if len(restored["ranks"]) != self.trainer.world_size:
            rank_zero_info(
                "the epoch's training accuracy restarts: the checkpoint has another number of ranks"
            )
            return
        state = restored["ranks"][self.global_rank]
        if state.keys() != self.train_acc.metric_state.keys():
            rank_zero_info("the epoch's training accuracy restarts: the checkpoint counts it another way")
            return
        for name, value in state.items():
            setattr(self.train_acc, name, value.to(self.device))
        mark_updated(self.train_acc)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.train_acc.update(logits, y)  # on the device, every step; computed once, at epoch end
        # self.log costs ~0.1-0.5 ms of Python per call: the loss is logged only when the logger will write
        # (every trainer.log_every_n_steps; Lightning's own test of that) and on each epoch's first batch
        # (the bar shows it from the start), so at the same steps whether or not the run was resumed in
        # between. Not prog_bar=True: Lightning would read a bar metric back from the device after every
        # batch until the epoch ends (a sync a step on a GPU); the bar shows it from the logging steps. The
        # accuracy, a Metric that Lightning computes, logs and resets at the epoch's end, is
        # registered once an epoch, on the first step the epoch trains here (its first batch, or the
        # first after a mid-epoch resume).
        if self._logged_epoch != self.current_epoch:
            self._logged_epoch = self.current_epoch
            self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        if batch_idx == 0 or logs_this_step(self.trainer):
            self.log("train/loss", loss)
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
        sched_cfg = self.hparams["scheduler"]
        kind = sched_cfg.get("name", "none")
        if kind == "none":
            return optimizer
        steps = self.trainer.estimated_stepping_batches
        if not math.isfinite(steps):
            raise ConfigError(
                f"model.scheduler.name={kind} needs a known length, but trainer.max_epochs=-1 sets none: "
                "set trainer.max_steps, or model.scheduler.name=none"
            )
        length = schedule_length(sched_cfg, int(steps))
        restored = getattr(self, "_restored_schedule_steps", None)
        if restored is not None and restored != length:
            raise ConfigError(
                f"model.scheduler.name={kind}: the checkpoint's schedule spans {restored} steps, this run "
                f"{length} (trainer.max_epochs or max_steps changed?); a schedule cannot be stretched: "
                "keep the length it was started with, or start a new run"
            )
        scheduler, unused = build_scheduler(optimizer, sched_cfg, int(steps), self.hparams["optimizer"]["lr"])
        if unused:
            rank_zero_info(
                f"model.scheduler.name={kind}: ignoring {', '.join(unused)} "
                f"(not {type(scheduler).__name__} arguments)"
            )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
