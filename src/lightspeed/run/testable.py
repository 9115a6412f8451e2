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
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities.seed import isolate_rng

from lightspeed.core.boundary import phase
from lightspeed.core.config import ConfigError

#: The phase a failing `test_step` is named by: the fix, and that `make eval` tests the same way.
PROBE = "test_step on one test batch before the fit, as make eval tests (fix it, or set test_after_fit=false)"


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
    and precision, no logger, no checkpoint, no callback, files it writes in a folder then deleted, the
    random state put back, the module left in the mode it was in. It runs under no_grad, not inference
    mode: a tensor made under inference mode and kept (a metric's state) could not be updated later where
    the test runs under no_grad (DDP over gloo). A module sharded across devices (FSDP, DeepSpeed) may not
    fit on one: it is not probed."""
    strategy = trainer.strategy
    if type(strategy) not in (SingleDeviceStrategy, DDPStrategy) or trainer.limit_test_batches == 0:
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
                logger=False,
                callbacks=[],
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                default_root_dir=folder,
            )
        with quiet("lightning.pytorch.accelerators"):  # "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES": the fit's
            tester.test(model, datamodule=dm, verbose=False)


@contextmanager
def quiet(name: str) -> Iterator[None]:
    """The logger `name` says only warnings in the block."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)
