"""The one metric a run is judged by (`monitor: {metric, mode}`): best checkpoint, early stop, checkpoint
names, a sweep's score. Consumers read it from there (`${monitor.metric}` in the callbacks group); a module
may declare its default (a class attribute `monitor = {"metric": "val/mse", "mode": "min"}`)."""

from __future__ import annotations

import re
from typing import Any, NoReturn

import lightning as L
from lightning.pytorch.utilities.model_helpers import is_overridden
from omegaconf import DictConfig, OmegaConf, open_dict

from lightspeed.core.config import locate

#: Without a config value and without the module's own default: Lightning's convention.
FALLBACK = {"metric": "val/loss", "mode": "min"}

#: Words in a metric's name that say which way is better.
LOWER_IS_BETTER = (
    "loss error err mse mae rmse msle mape smape nll perplexity ppl wer cer ter bpd bpc distance dist "
    "divergence kl fid regret latency eer fpr fnr hamming"
)
HIGHER_IS_BETTER = (
    "acc accuracy r2 f1 fbeta auc auroc auprc ap map precision recall iou jaccard dice bleu rouge meteor "
    "exact match psnr ssim kappa mcc corr pearson spearman reward tpr specificity sensitivity top1 top5"
)

#: Words that turn a name's sense around or make it a change (val/neg_mse, val/loss_improvement): the
#: name then says nothing sure.
REVERSING = "neg negative inverse inv improvement gain reduction decrease increase delta diff change drop"


def direction(metric: str) -> str | None:
    """`min` or `max` when the metric's name says which way is better (val/mae: min, val/acc: max), else
    None (no word, words of both kinds, or a word that turns the sense around: val/neg_mse)."""
    words = set(re.split(r"[^a-z0-9]+", metric.lower().rpartition("/")[2])) - {""}
    if words & set(REVERSING.split()):
        return None
    lower, higher = bool(words & set(LOWER_IS_BETTER.split())), bool(words & set(HIGHER_IS_BETTER.split()))
    return "min" if lower and not higher else "max" if higher and not lower else None


def declared(cfg: DictConfig) -> dict[str, Any] | None:
    """The model class's own `monitor` (`{"metric": ..., "mode": ...}`), or None."""
    node = cfg.get("model")
    if not OmegaConf.is_dict(node) or "_target_" not in node:
        return None  # building the model says why, in its own line
    try:
        found = getattr(locate(str(node._target_)), "monitor", None)
    except (ImportError, ValueError, AttributeError):
        return None  # building the model says why, in its own line
    return dict(found) if isinstance(found, dict) and {"metric", "mode"} <= set(found) else None


def settle(cfg: DictConfig) -> None:
    """Fill `monitor.metric` and `monitor.mode` (null: the model's default); refuse in one line a mode
    contradicting the metric's name (unless `monitor.check_mode=false`) or a consumer monitoring another."""
    if "monitor" not in cfg:
        return
    metric, mode = settled(cfg)
    if (cfg.monitor.get("metric"), cfg.monitor.get("mode")) != (metric, mode):  # settled once: left as is
        with open_dict(cfg):
            cfg.monitor.metric, cfg.monitor.mode = metric, mode
    for key, node in consumers(cfg).items():
        if node.monitor is None:  # this one watches nothing (a checkpoint every N steps, say)
            continue
        for field, own in (("monitor", "metric"), ("mode", "mode")):
            if field in node and node[field] != cfg.monitor[own]:
                _refuse("differs", key=key, field=field, value=node[field], own=own, want=cfg.monitor[own])


def settled(cfg: DictConfig) -> tuple[str, str]:
    """The run's (metric, mode): the config's, the model's own where it says null, a mode from the metric's
    name where neither says one; one line where the mode cannot be known or contradicts the name."""
    own = declared(cfg) or FALLBACK
    metric, mode = cfg.monitor.get("metric"), cfg.monitor.get("mode")
    metric = own["metric"] if metric is None else str(metric)
    if mode is None:
        mode = own["mode"] if metric == own["metric"] else direction(metric)
        if mode is None:
            _refuse("mode_unknown", metric=metric)
    if mode not in ("min", "max"):
        _refuse("mode_invalid", mode=mode)
    if cfg.monitor.get("check_mode", True) and direction(metric) not in (None, mode):
        _refuse("mode_contradicts", metric=metric, mode=mode)  # val/mae with max
    return metric, str(mode)


def _refuse(why: str, **facts: Any) -> NoReturn:
    """Raise the line refusing the run's monitor, worded by `run/monitor_errors.py` (loaded only then)."""
    from lightspeed.run import monitor_errors

    raise getattr(monitor_errors, why)(**facts)


def consumers(cfg: DictConfig) -> dict[str, Any]:
    """The configured callbacks that take a metric to monitor, by config key (`monitor: null` on one of them:
    it watches nothing)."""
    found = cfg.get("callbacks") or {}
    return {
        f"callbacks.{name}": node for name, node in found.items() if node is not None and "monitor" in node
    }


class ChecksMonitor:
    """For EarlyStopping and ModelCheckpoint: their monitor, checked once there is something logged to find it
    in (after the sanity check; a training metric, or a module without a validation_step, at the first
    epoch's end), before the callback reads it: one line naming monitor.metric and what the module logs.
    Lightning's own checks come at the first save, an epoch in, as a traceback, or not at all."""

    monitor: str | None
    mode: str

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.monitor and not self.monitor.startswith("train"):
            self._check_logged(trainer)
        super().on_sanity_check_end(trainer, pl_module)  # type: ignore[misc]

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Without a sanity check (trainer.num_sanity_val_steps=0): at the first validation."""
        if self.monitor and not trainer.sanity_checking and not self.monitor.startswith("train"):
            self._check_logged(trainer)
        super().on_validation_end(trainer, pl_module)  # type: ignore[misc]

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.monitor and (
            self.monitor.startswith("train") or not is_overridden("validation_step", pl_module)
        ):
            self._check_logged(trainer)
        super().on_train_epoch_end(trainer, pl_module)  # type: ignore[misc]

    def _check_logged(self, trainer: L.Trainer) -> None:
        logged = sorted({*trainer.callback_metrics, "epoch", "step"})  # Lightning adds the last two
        if self.monitor not in logged:
            _refuse("not_logged", callback=self, logged=logged)
