"""Checks for your own code, usable in any test suite (a project's tests/test_project.py calls them): each
config option trains for a batch (`trains_one_batch`); a net runs on any device (`assert_device_agnostic`)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from lightspeed import CONF_DIR, CONF_DIRS

if TYPE_CHECKING:
    from torch import nn

#: What a test run of one batch leaves out: the bar, the summary tree, the curves picture.
QUIET = [
    "trainer.num_sanity_val_steps=0",
    "callbacks.rich_progress_bar=null",
    "callbacks.speed_report.summary_depth=0",
    "trainer.enable_progress_bar=false",
    "curves=false",  # a picture a run (~0.5 s on 2 CPU cores; tests/test_curves.py draws them)
    "print_config=false",  # the tree is still kept in the run folder
]
Prepare = Callable[[DictConfig, Path], None]


class DeviceLeak(AssertionError):
    """The net uses a tensor that does not follow it to its device."""


def assert_device_agnostic(net: nn.Module, input_shape: Sequence[int], batch: int = 2) -> None:
    """A forward pass on the `meta` device: a tensor `forward` makes on a fixed device (`torch.ones(n)`,
    `device="cuda"`), or keeps as a plain attribute, not a buffer, fails there, as it would on a GPU or when
    DDP or `map_location` moves the net."""
    import torch

    meta_net = copy.deepcopy(net).to("meta")
    x = torch.empty(batch, *input_shape, device="meta")
    try:
        out = meta_net(x)
    except (RuntimeError, NotImplementedError) as err:
        raise DeviceLeak(
            f"{type(net).__name__} creates or keeps a tensor on a fixed device: make it with "
            f"device=x.device inside forward, or register it with self.register_buffer(...) ({err})"
        ) from err
    for t in out if isinstance(out, (tuple, list)) else [out]:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            raise DeviceLeak(f"{type(net).__name__} returned a tensor on {t.device}, not on its input's")


def options(group: str) -> list[str]:
    """The group's options: conf/<group>/*.yaml of the project and of the engine, by name."""
    return sorted({p.stem for d in CONF_DIRS for p in (d / group).glob("*.yaml")})


def defaults_first(group: str) -> list[str]:
    """The group's options, the one `conf/train.yaml` picks first."""
    default = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "train.yaml").defaults)  # dicts are dicts
    chosen = [d[group] for d in default if isinstance(d, dict) and group in d]
    return sorted(options(group), key=lambda o: o not in chosen)


def fits(data: str, model: str, log_dir: Path, prepare: Prepare | None = None) -> bool:
    """Whether the model option fits the data option, built as `make train` builds it (from the data's
    `model_args()`) and taking its inputs (a meta forward); `prepare(cfg, folder)` readies the data."""
    from hydra.errors import InstantiationException

    from lightspeed.core.config import ConfigError
    from lightspeed.run import build
    from lightspeed.run.entry import compose_config
    from lightspeed.speed import accel

    cfg = compose_config("train", [f"data={data}", f"model={model}"], log_dir)
    if prepare is not None:
        import pytest

        try:
            prepare(cfg, log_dir)
        except pytest.skip.Exception:  # a data set that needs an extra not installed here: no partner
            return False
    accel.resolve(cfg)  # the loader's autos, as a run resolves them before building
    try:
        build.model(cfg, build.datamodule(cfg))
    except (ConfigError, InstantiationException):  # not for this data: its constructor says why
        return False
    return True


def partner(choice: str, log_dir: Path, prepare: Prepare | None = None) -> list[str]:
    """What `group=option` trains with: the first option of the other group that fits it (a regression
    data set with a regressor, a 1D data set with a 1D net), the default first; an experiment names its
    own."""
    group, option = choice.split("=", 1)
    if group == "experiment":
        return []
    other = "model" if group == "data" else "data"
    pairs = ((option, o) if group == "data" else (o, option) for o in defaults_first(other))
    found = next((pair for pair in pairs if fits(*pair, log_dir, prepare)), None)
    assert found is not None, f"no {other} option fits {choice}: add one that takes its input shape"
    return [f"data={found[0]}", f"model={found[1]}"]


def trains_one_batch(
    choice: str,
    log_dir: Path,
    *overrides: str,
    prepare: Prepare | None = None,
    pair: Sequence[str] | None = None,
):
    """Train `choice` (`data=<name>`, `model=<name>` or `experiment=<name>`) with its partner (`pair`, else
    found) for one batch (debug=fdr) under `log_dir`; check one optimizer step, a finite monitored metric, its
    test twin and finite weights; return the run (lightspeed.train.TrainResult)."""
    from lightspeed.run.entry import compose_config
    from lightspeed.train import train

    pair = partner(choice, log_dir / "pair", prepare) if pair is None else pair
    cfg = compose_config("train", [choice, *pair, "debug=fdr", *QUIET, *overrides], log_dir)
    if prepare is not None:
        prepare(cfg, log_dir)
    if "batch_size" in cfg.data:  # one small batch: the code path is the same, the compute a fraction
        cfg.data.batch_size = min(int(cfg.data.batch_size), 16)
    result = train(cfg)
    _assert_one_finite_step(result)
    return result


def _assert_one_finite_step(result: Any) -> None:
    """One optimizer step and no checkpoint (fast_dev_run); the task's own monitored metric (what its model
    declares: val/acc, val/mse, ...) and its test twin finite, and the weights."""
    assert result.trainer.global_step == 1 and result.best_checkpoint is None
    monitored = result.monitor
    assert math.isfinite(result.metrics[monitored]) and result.score == result.metrics[monitored]
    tested = {k: v for k, v in result.metrics.items() if k.startswith("test/")}
    assert monitored.replace("val/", "test/", 1) in tested and all(map(math.isfinite, tested.values()))
    assert all(p.isfinite().all() for p in result.model.parameters())
