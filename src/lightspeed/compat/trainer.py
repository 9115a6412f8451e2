"""What Lightspeed reads of a running Trainer beyond its public API."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler  # noqa: F401 (re-exported)
from torchmetrics import Metric


def unified_precision(value: str | int) -> str:
    """Lightning's own name for a precision it accepts (16: 16-mixed, "bf16": bf16-mixed, 32: 32-true)."""
    from lightning.fabric.connector import _convert_precision_to_unified_args

    return str(_convert_precision_to_unified_args(value))


def is_last_batch(trainer: L.Trainer) -> bool:
    """Whether the training batch now running is its epoch's last."""
    return bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def batches_done_in_epoch(trainer: L.Trainer) -> int:
    """Training batches of the current epoch already done (after a restore: as the checkpoint says)."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)


def restarted_mid_epoch(trainer: L.Trainer) -> bool:
    """Whether fit resumed from a checkpoint saved inside an epoch (not at its end)."""
    return bool(trainer.fit_loop.restarted_mid_epoch)


def spawned(trainer: L.Trainer) -> bool:
    """Whether the ranks ran in child processes of this one (ddp_spawn, ddp_fork): what they changed of the
    Trainer stays there, but for the weights, metrics and best checkpoint Lightning brings back."""
    return getattr(trainer.strategy, "_start_method", "popen") != "popen"


def mark_updated(metric: Metric) -> None:
    """Tell a torchmetrics Metric whose state was set by hand that it holds updates, so that `compute`
    neither warns nor returns its default."""
    metric._update_count += 1
