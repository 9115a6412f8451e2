"""`test_after_fit` tests once the whole fit is done: what would fail there fails before the fit instead.

Lightning runs `configure_optimizers` and `training_step` at the first step and `validation_step` in its
sanity check; `test_step` would first run after the fit. So a module without `test_step`, data without a
test loader, or a `test_step` that fails on a batch is one line before the fit, not an error after an hour."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import lightning as L
from lightning.pytorch.loggers.logger import DummyLogger
from lightning.pytorch.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities.seed import isolate_rng

from lightspeed.compat.trainer import spawned
from lightspeed.core.boundary import phase
from lightspeed.core.config import ConfigError

#: The phase a failure of the probe is named by (its data's test setup too): the fix, and that `make eval`
#: tests the same way.
PROBE = (
    "test before the fit: one batch through test_step, as make eval tests "
    "(fix it, or set test_after_fit=false)"
)
#: The precisions that `Trainer(precision=...)` builds: a plugin of the user's own is not rebuilt by name.
STANDARD_PRECISION = (Precision, MixedPrecision, HalfPrecision, DoublePrecision)


def check(model: L.LightningModule, dm: L.LightningDataModule) -> None:
    """A module without `test_step`, or data without a test loader, is one line naming the hook."""
    hooks = ((model, "test_step", L.LightningModule), (dm, "test_dataloader", L.LightningDataModule))
    for owner, hook, base in hooks:
        if getattr(getattr(owner, hook, None), "__func__", None) is getattr(base, hook):
            raise ConfigError(
                f"test_after_fit=true tests the best checkpoint after the fit, but {type(owner).__name__} "
                f"has no {hook}: give it one, or set test_after_fit=false"
            )


def probe(trainer: L.Trainer, model: L.LightningModule, dm: L.LightningDataModule) -> None:
    """One test batch through `test_step` on a Trainer of its own, as `make eval` tests: the fit's device
    and precision, a logger that keeps nothing, no checkpoint, files it writes in a folder then deleted, the
    random state put back, the module left in the mode it was in and attached to no Trainer. It runs under
    no_grad, not inference mode: a tensor made under inference mode and kept (a metric's state) could not be
    updated later where the test runs under no_grad (DDP over gloo). Not probed: a module sharded across
    devices (FSDP, DeepSpeed: it may not fit on one), ranks started from this process (ddp_spawn, ddp_fork:
    a forked rank cannot use a GPU this process used), a precision plugin of the user's own."""
    strategy = trainer.strategy
    if (
        type(strategy) not in (SingleDeviceStrategy, DDPStrategy)
        or spawned(trainer)
        or type(trainer.precision_plugin) not in STANDARD_PRECISION
        or trainer.limit_test_batches == 0
    ):
        return
    device = strategy.root_device
    with tempfile.TemporaryDirectory(prefix="lightspeed-probe-") as folder, isolate_rng(), phase(PROBE):
        with quiet("lightning.pytorch.utilities.rank_zero"):  # its "GPU available": the fit's Trainer says it
            tester = L.Trainer(
                accelerator=device.type,
                devices=1 if device.index is None else [device.index],
                precision=trainer.precision,
                inference_mode=False,  # no_grad: what it leaves (a reset metric) is no inference tensor
                limit_test_batches=1,
                logger=DummyLogger(),  # `self.logger.experiment` in test_step works, and keeps nothing
                callbacks=[],
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                default_root_dir=folder,
            )
        try:
            with quiet("lightning.pytorch.accelerators"), quiet("lightning.fabric.utilities.rank_zero"):
                tester.test(model, datamodule=dm, verbose=False)  # (its device lines: the fit says them)
        finally:
            model.trainer, dm.trainer = None, None  # as before: the fit attaches its own


@contextmanager
def quiet(name: str) -> Iterator[None]:
    """The logger `name` says at most warnings in the block."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(max(log.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        log.setLevel(level)
