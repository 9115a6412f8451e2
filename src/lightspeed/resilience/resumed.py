"""What ExactResume does only when a run resumes from a checkpoint, loaded then: the epoch's metrics and
every rank's random states put back, the LR schedule's length checked, and what a mid-epoch resume cannot
continue exactly said."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightspeed.compat.trainer import batches_done_in_epoch, mark_updated
from lightspeed.core.config import ConfigError
from lightspeed.resilience.exact_resume import _metrics, _moved

# the attribute that holds a schedule's length, for the schedules whose length is fixed when made
_LENGTH = ("total_steps", "T_max")


def check_schedules(saved: list[dict[str, Any]], trainer: L.Trainer) -> None:
    """Refuse, in one line, schedules made (configure_optimizers) to span another number of steps than the
    checkpoint's: the restored state would keep the old length."""
    made = [_length(config.scheduler.state_dict()) for config in trainer.lr_scheduler_configs]
    for restored, length in zip((_length(s) for s in saved), made, strict=False):
        if None not in (restored, length) and restored != length:
            raise ConfigError(
                f"the checkpoint's LR schedule spans {restored} steps, this run's {length} "
                "(trainer.max_epochs or max_steps changed?); a schedule cannot be stretched: keep the "
                "length it was started with, or start a new run"
            )


def _length(state: dict[str, Any]) -> int | None:
    return next((int(state[k]) for k in _LENGTH if k in state), None)


def restore_metrics(
    trainer: L.Trainer,
    pl_module: L.LightningModule,
    restored: dict[str, Any] | None,
    batch_size: int | None,
    legacy: bool,
) -> None:
    """At training start (`MetricState`): the epoch's metric states the checkpoint saved, on this rank, and
    what a resume mid-epoch cannot continue exactly (`batch_size`: the checkpoint's; `legacy`: its metrics
    are kept the old way)."""
    done, total = batches_done_in_epoch(trainer), trainer.num_training_batches
    if 0 < done < total:
        _say_mid_epoch(trainer, done, total, batch_size, legacy)
    if restored is None or restored.get("epoch") != trainer.current_epoch:
        return
    if len(restored["ranks"]) != trainer.world_size:
        rank_zero_info("the epoch's metrics restart: the checkpoint has another number of ranks")
        return
    saved = restored["ranks"][trainer.global_rank]
    for name, metric in _metrics(pl_module):
        mine = saved.get(name)
        if mine is None or mine["state"].keys() != metric.metric_state.keys():
            rank_zero_info(f"the epoch's {name} restarts: the checkpoint counts it another way")
            continue
        if mine["updates"]:
            for key, value in _moved(mine["state"], pl_module.device).items():
                setattr(metric, key, value)
            mark_updated(metric)


def _say_mid_epoch(trainer: L.Trainer, done: int, total: int, batch_size: int | None, legacy: bool) -> None:
    """What a resume at batch `done` of `total` cannot continue exactly: a loader without state_dict
    replays the epoch, another batch size counts other samples, an earlier release's metrics restart."""
    epoch = trainer.current_epoch
    if not hasattr(trainer.train_dataloader, "state_dict"):
        rank_zero_info(
            f"resumed at batch {done} of {total} in epoch {epoch}, but the training loader has no "
            "state_dict: the rest of the epoch replays its first batches (a loader with "
            "state_dict/load_state_dict, e.g. torchdata's StatefulDataLoader, resumes exactly)"
        )
    now = getattr(getattr(trainer, "datamodule", None), "batch_size", None)
    if None not in (batch_size, now) and batch_size != now:
        rank_zero_warn(
            f"resumed at batch {done} of epoch {epoch} with data.batch_size={now}, but the checkpoint "
            f"counted batches of {batch_size}: the rest of this epoch is not the samples the run "
            "had left (resume from an epoch-end checkpoint, or keep the batch size)"
        )
    if legacy:
        rank_zero_info("the epoch's metrics restart: the checkpoint is from an earlier Lightspeed")
