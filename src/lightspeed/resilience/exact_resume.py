"""ExactResume: a run stopped by a preemption signal, a crash or Ctrl-C continues exactly where it stopped,
whatever the LightningModule, which knows nothing of it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from torchmetrics import Metric

from lightspeed.compat.trainer import batches_done_in_epoch
from lightspeed.resilience.identity import RunIdentity
from lightspeed.resilience.preemption import Preemption
from lightspeed.resilience.rank_seed import RankSeed, gather


class MetricState(L.Callback):
    """Saves with every checkpoint, and restores when training starts, every torchmetrics `Metric` the module
    holds on every rank (so a run resumed mid-epoch reports the epoch's metrics over all its batches) and the
    latest `train/*` and `val/*` figures (reported where the resumed run does not measure them again).
    Refuses, in one line, a resume whose LR schedule spans another number of steps (the restored state would
    keep the old length)."""

    def __init__(self) -> None:
        self._metric_pending: dict[str, Any] | None = None  # metric states restored, not yet applied
        self._latest: dict[str, float] = {}  # the checkpoint's figures, until measured again
        self._schedules: list[dict[str, Any]] = []  # the checkpoint's LR schedules
        self._legacy = False  # the checkpoint keeps the epoch's accuracy the old way
        self._batch_size: int | None = None  # the checkpoint's data.batch_size

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: Any) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._metric_pending is not None:  # saved right after a restore, before on_train_start applied it
            checkpoint["metric_state"] = self._metric_pending
        else:
            cpu = torch.device("cpu")
            mine = {
                n: {"updates": m.update_count, "state": _moved(m.metric_state, cpu)}
                for n, m in _metrics(pl_module)
            }
            checkpoint["metric_state"] = {"epoch": trainer.current_epoch, "ranks": gather(mine)}
        logged = trainer.callback_metrics.items()
        self._latest.update({k: float(v) for k, v in logged if k.startswith(("train/", "val/"))})
        checkpoint["metrics"] = dict(self._latest)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: Any) -> None:
        super().on_load_checkpoint(trainer, pl_module, checkpoint)
        self._metric_pending = checkpoint.get("metric_state")
        self._legacy = "metric_state" not in checkpoint and "train_acc" in checkpoint  # Lightspeed < 12-2026
        self._latest = dict(checkpoint.get("metrics", {}))
        self._schedules = checkpoint.get("lr_schedulers") or []
        saved_config = (checkpoint.get("identity") or {}).get("config") or {}
        self._batch_size = (saved_config.get("data") or {}).get("batch_size")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The schedules are made (configure_optimizers) and not yet restored: compare their lengths."""
        super().on_fit_start(trainer, pl_module)
        if self._schedules:
            from lightspeed.resilience.resumed import check_schedules

            check_schedules(self._schedules, trainer)
        self._schedules = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Lightning skips on_train_epoch_start when it resumes mid-epoch: restore here."""
        super().on_train_start(trainer, pl_module)
        restored, self._metric_pending = self._metric_pending, None
        if restored is not None or 0 < batches_done_in_epoch(trainer) < trainer.num_training_batches:
            from lightspeed.resilience.resumed import restore_metrics

            restore_metrics(trainer, pl_module, restored, self._batch_size, self._legacy)
        self._batch_size, self._legacy = None, False


class ExactResume(MetricState, Preemption, RankSeed, RunIdentity):
    """What lets a rerun of the same command continue this run exactly (docs/resilience.md), one callback:
    - each checkpoint holds the run's identity (auto-resume takes only this run's), every rank's random
      states (`seed + rank` from fit start: dropout and augmentation differ between ranks) and the epoch's
      metric states (`RunIdentity`, `RankSeed`, `MetricState`);
    - a preemption signal saves `last.ckpt` at the next optimizer step and exits 128 + the signal (the
      ranks Lightning launched: 0)
      (`Preemption`: `signals`, and under DDP the ranks agree every `check_every_n_steps` steps).
    Each part is a callback of its own too; every hook here calls each part's in that order."""

    def __init__(
        self, seed: int, signals: Sequence[str] = ("SIGTERM", "SIGUSR1"), check_every_n_steps: int = 10
    ) -> None:
        MetricState.__init__(self)
        Preemption.__init__(self, signals, check_every_n_steps)
        RankSeed.__init__(self, seed)
        RunIdentity.__init__(self)


def _metrics(module: L.LightningModule) -> list[tuple[str, Metric]]:
    return [(name, m) for name, m in module.named_modules() if isinstance(m, Metric)]


def _moved(state: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Metric states (tensors, or lists of tensors for metrics that keep every value) on `device`."""
    return {
        k: [t.detach().to(device) for t in v] if isinstance(v, list) else v.detach().to(device)
        for k, v in state.items()
    }
