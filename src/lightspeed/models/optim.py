"""The optimizer and LR schedule from their config: plain torch, shared by the LightningModule and the
bench's plain PyTorch loop, so that both train with the same update."""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from lightspeed.core.config import ConfigError

SCHEDULERS = ("none", "cosine", "onecycle")


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: dict[str, Any]) -> torch.optim.Optimizer:
    """`cfg`: `name` (a class in torch.optim), the other keys its arguments."""
    kwargs = _settings(cfg, "optimizer")
    name = kwargs.pop("name", None)
    opt_cls = getattr(torch.optim, name, None) if isinstance(name, str) else None
    if not (isinstance(opt_cls, type) and issubclass(opt_cls, torch.optim.Optimizer)):
        raise ConfigError(
            f"model.optimizer.name={name!r} is not an optimizer in torch.optim (e.g. AdamW, SGD)"
        )
    try:
        return opt_cls(params, **kwargs)
    except TypeError as err:
        raise ConfigError(f"model.optimizer (torch.optim.{name}): {err}: remove or rename that key") from None
    except (ValueError, IndexError, RuntimeError) as err:  # torch's checks of the values (lr=-1, lr=[1])
        raise ConfigError(
            f"model.optimizer (torch.optim.{name}): {err or type(err).__name__}: {kwargs}"
        ) from None


def _settings(cfg: Any, what: str) -> dict[str, Any]:
    """A copy of model.<what>, which must be a mapping of settings (a yaml file may have made it anything)."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(
            f"model.{what}={cfg!r} is no mapping of settings: give it name: ... and its arguments"
        )
    return dict(cfg)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: dict[str, Any], steps: int, lr: float
) -> tuple[torch.optim.lr_scheduler.LRScheduler | None, list[str]]:
    """A schedule stepped once per optimizer step over `steps` steps (`lr`: the peak for onecycle), or
    None for `name: none`; with the keys of `cfg` that this schedule does not take (to be reported)."""
    kwargs = _settings(cfg, "scheduler")
    kind = kwargs.pop("name", "none")
    if kind == "none":
        return None, []
    if kind not in SCHEDULERS:
        raise ConfigError(f"model.scheduler.name={kind!r} is unknown: use one of {', '.join(SCHEDULERS)}")
    if kind == "cosine":
        cls, fixed = torch.optim.lr_scheduler.CosineAnnealingLR, {"T_max": steps}
    else:  # OneCycleLR divides by each phase's length in steps - 1: in tiny runs (debug=fdr) both phases
        # stay at least 2 steps long, and the run simply ends before the schedule does
        pct = float(kwargs.get("pct_start", 0.3))
        length = max(steps, math.ceil(2 / min(pct, 1 - pct)) + 1)
        cls, fixed = torch.optim.lr_scheduler.OneCycleLR, {"max_lr": lr, "total_steps": length}
    # Keys meant for another schedule (`pct_start` when switching to cosine) are left out.
    accepted = inspect.signature(cls).parameters
    unused = sorted(k for k in kwargs if k not in accepted)
    try:
        return cls(optimizer, **fixed, **{k: v for k, v in kwargs.items() if k in accepted}), unused
    except (TypeError, ValueError, ZeroDivisionError) as err:  # torch's checks of the values
        raise ConfigError(f"model.scheduler (name={kind}): {err or type(err).__name__}: {kwargs}") from None


def configure(module: L.LightningModule, optimizer_cfg: dict[str, Any], scheduler_cfg: dict[str, Any]) -> Any:
    """What a LightningModule's `configure_optimizers` returns: the optimizer over its parameters and a
    schedule stepped once per optimizer step, over the run's length as the Trainer estimates it."""
    optimizer = build_optimizer(module.parameters(), optimizer_cfg)
    kind = _settings(scheduler_cfg, "scheduler").get("name", "none")
    if kind == "none":
        return optimizer
    steps = module.trainer.estimated_stepping_batches
    if not math.isfinite(steps):
        raise ConfigError(
            f"model.scheduler.name={kind} needs a known length, but trainer.max_epochs=-1 sets none: "
            "set trainer.max_steps, or model.scheduler.name=none"
        )
    scheduler, unused = build_scheduler(optimizer, scheduler_cfg, int(steps), optimizer.param_groups[0]["lr"])
    if unused:
        rank_zero_info(f"model.scheduler.name={kind}: ignoring {', '.join(unused)} (not its arguments)")
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
