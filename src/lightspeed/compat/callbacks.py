"""Lightning's ModelCheckpoint and EarlyStopping: less work per step, and aware of resumed runs.

Lightning dispatches every hook to every callback (~6 a training step), naming each call by `state_key`, which
these two rebuild from a dict repr every time; its inputs are fixed at construction, so it is built once. The
class names stay Lightning's, so `state_key` and the checkpoints they write are unchanged."""

from __future__ import annotations

import math
import re
import time
from functools import cached_property
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping as _EarlyStopping
from lightning.pytorch.callbacks import ModelCheckpoint as _ModelCheckpoint
from lightning.pytorch.callbacks.progress import rich_progress

from lightspeed.compat.trainer import is_last_batch


class _StateKeyOnce:
    @cached_property
    def state_key(self) -> str:
        return super().state_key  # type: ignore[misc]


class ModelCheckpoint(_StateKeyOnce, _ModelCheckpoint):
    """Without a `filename`, each file is named by its epoch and the monitored metric's value
    (`epoch005-val_acc_0.9944.ckpt`).

    `on_train_batch_end` returns at once when neither `every_n_train_steps` nor
    `train_time_interval` is set, where Lightning's returns after checking the trainer's state.

    A step save (`every_n_train_steps`) that falls on an epoch's last batch waits for the validation that
    follows it. Lightning 2.6 saves it before that validation and then skips the epoch-end save (same
    step): the last epoch's validation never reaches a checkpoint, the saved metrics are the previous
    epoch's, and a run resumed from that file skips the validation altogether.

    With `save_last`, `last.ckpt` is written at every epoch end (as `every_n_epochs` says), not only when
    a new best is saved as in Lightning 2.6: otherwise a run that stops improving keeps an old
    last.ckpt, and a resumed or rerun run goes back to it and trains those epochs again.
    """

    _save_after_validation = False

    def __init__(
        self,
        *args: Any,
        filename: str | None = None,
        monitor: str | None = None,
        last_every_s: float = 0,
        **kwargs: Any,
    ) -> None:
        if filename is None and monitor:  # epoch005-val_acc_0.9944.ckpt: the name says what picked it
            slug = re.sub(r"[^\w.-]", "_", monitor)
            filename = f"epoch{{epoch:03d}}-{slug}_{{{monitor}:.4f}}"
            kwargs["auto_insert_metric_name"] = False  # Lightning would insert `val/acc=`: a sub-folder
        super().__init__(*args, filename=filename, monitor=monitor, **kwargs)
        #: The validation metrics (`val/...`) of the best checkpoint, as it was saved: a summary can show
        #: the best checkpoint's accuracy and loss beside the last one's, whichever metric picked it.
        self.best_metrics: dict[str, float] = {}
        self.last_every_s = last_every_s
        self._last_written = (-1, -math.inf)  # (global step, time.monotonic()) last.ckpt was written at

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        if self.monitor and filepath == self.best_model_path:  # Lightning names the new best, then saves it
            metrics = trainer.callback_metrics.items()
            self.best_metrics = {k: float(v) for k, v in metrics if k.startswith("val/")}
        super()._save_checkpoint(trainer, filepath)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best_metrics": self.best_metrics}

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._every_n_train_steps < 1 and self._train_time_interval is None:
            return
        steps = self._every_n_train_steps
        if steps >= 1 and trainer.global_step % steps == 0 and validation_follows(trainer):
            self._save_after_validation = True
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._save_after_validation:
            self._save_after_validation = False
            if not self._should_skip_saving_checkpoint(trainer):
                candidates = self._monitor_candidates(trainer)
                self._save_topk_checkpoint(trainer, candidates)
                self._save_last_checkpoint(trainer, candidates)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_at_epoch_end(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_at_epoch_end(trainer)

    def _save_last_at_epoch_end(self, trainer: L.Trainer) -> None:
        every = self._every_n_epochs
        due = every >= 1 and (trainer.current_epoch + 1) % every == 0
        if self.save_last and due and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def _save_last_checkpoint(
        self, trainer: L.Trainer, candidates: dict[str, Any], final: bool = False
    ) -> None:
        """last.ckpt at most once every `last_every_s` seconds, and at the end of the fit: a small model's
        epoch can take less time than writing it (a preemption saves it at once, `Preemption`)."""
        step, written = self._last_written
        due = final or time.monotonic() - written >= self.last_every_s
        if self.save_last and not final and self.last_every_s > 0 and trainer.world_size > 1:
            due = trainer.strategy.broadcast(due)  # a save is collective: rank 0's clock decides for all
        if step == trainer.global_step or not due:
            return
        super()._save_last_checkpoint(trainer, candidates)
        self._last_written = (trainer.global_step, time.monotonic())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        if self.save_last and not trainer.fast_dev_run:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer), final=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A resumed run does not save its starting step again: that checkpoint is the one it resumed from.
        (Lightning forgets which step it saved last; finishing a resumed epoch would rewrite last.ckpt.)"""
        super().on_train_start(trainer, pl_module)
        if trainer.global_step > 0:
            self._last_global_step_saved = trainer.global_step
            self._last_written = (trainer.global_step, time.monotonic())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A run's files are its own wherever its folder now is: paths saved before it was moved or copied
        name this folder's files. Lightning would keep the old absolute paths (testing the old best, or
        failing on it, gone, and writing last-v1.ckpt beside last.ckpt)."""
        from lightspeed.compat.checkpoint_paths import here

        super().load_state_dict(here(state_dict, self.dirpath))
        self.best_metrics = dict(state_dict.get("best_metrics") or {})

    def _ModelCheckpoint__warn_if_dir_not_empty(self, dirpath: Any) -> None:
        """Lightning warns when the folder holds checkpoints; a run's own folder does whenever it resumes
        (`resume=never` refuses to start over one, see lightspeed.resilience.resume)."""


class EarlyStopping(_StateKeyOnce, _EarlyStopping):
    """A run that early stopping ended stays ended when resumed: Lightning's would train another epoch
    before its next check."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.stopped_epoch > 0:
            trainer.should_stop = True


class EpochOfNoLimit:
    """For a RichProgressBar: `trainer.max_epochs=-1` (no limit) shows `Epoch 93`, where Lightning 2.6
    shows `Epoch 93/-2`."""

    def _get_train_description(self, current_epoch: int) -> str:
        description = super()._get_train_description(current_epoch)  # type: ignore[misc]
        if self.trainer.max_epochs is not None and self.trainer.max_epochs < 0:  # type: ignore[attr-defined]
            description = description.replace(f"/{self.trainer.max_epochs - 1}", "", 1)  # type: ignore[attr-defined]
        return description


class PromptStop:
    """For a RichProgressBar: stopping the bar (each fit's, test's and eval's end) returns at once. Lightning
    2.6's refresh thread sleeps `1 / refresh_rate` s between refreshes, not waking when told to stop, and the
    bar's stop joins it: up to 0.25 s at the end of every fit at 4 refreshes a second. Here the thread it
    starts is replaced by one that waits on its stop event instead (the same refreshes otherwise)."""

    def _init_progress(self, trainer: L.Trainer) -> None:
        super()._init_progress(trainer)  # type: ignore[misc]
        live = getattr(self.progress, "live", None)  # type: ignore[attr-defined]
        thread = getattr(live, "_refresh_thread", None)
        if type(thread) is rich_progress._RefreshThread:  # just started by Lightning: ours takes its place
            thread.stop()  # Lightning's ends after its current sleep, unjoined (a daemon)
            live._refresh_thread = _WakingRefresh(live, live.refresh_per_second)
            live._refresh_thread.start()


class _WakingRefresh(rich_progress._RefreshThread):  # rich is a dependency: Lightning defines the class
    def run(self) -> None:
        while not self.done.wait(1 / self.refresh_per_second):
            if self.refresh_cond:
                with self.live._lock:
                    self.live.refresh()
                self.refresh_cond = False


def validation_follows(trainer: L.Trainer) -> bool:
    """This is the epoch's last batch and a validation runs right after it."""
    if not is_last_batch(trainer) or not trainer.enable_validation:
        return False
    batches = trainer.num_val_batches
    every = trainer.check_val_every_n_epoch
    return bool(sum(batches) if isinstance(batches, list) else batches) and (
        every is None or (trainer.current_epoch + 1) % every == 0
    )
