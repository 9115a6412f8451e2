"""Driven by what is registered, never by a list: every option in conf/, every registered net on the input
shapes it declares. A data set, model or experiment you add is composed, built and trained for one batch
here with nothing to edit, paired by task: with an option of the other group that it fits (the model is
built from what the data gives, and takes its inputs), and judged by the metric its model monitors
(tests/test_guide.py adds some in a copy of the project and runs this file)."""

from __future__ import annotations

import math
from contextlib import nullcontext

import pytest
import torch
from hydra.utils import get_object
from omegaconf import OmegaConf

from conftest import TINY
from fakes import fake_downloads, give_data_folder
from lightspeed import CONF_DIR, CONF_DIRS
from lightspeed.core.config import ConfigError
from lightspeed.models.nets import NETS, _discover, build_net
from lightspeed.run import build
from lightspeed.run.entry import compose_config
from lightspeed.testing import assert_device_agnostic
from lightspeed.train import train

_discover()

GROUPS = sorted({p.name for d in CONF_DIRS for p in d.iterdir() if p.is_dir() and any(p.glob("*.yaml"))})
QUIET = [o for o in TINY if "batches" not in o and "max_epochs" not in o]


def options(group: str) -> list[str]:
    return sorted({p.stem for d in CONF_DIRS for p in (d / group).glob("*.yaml")})


def defaults_first(group: str) -> list[str]:
    """The group's options, the one `conf/train.yaml` picks first."""
    default = OmegaConf.load(CONF_DIR / "train.yaml").defaults
    chosen = [d[group] for d in default if isinstance(d, dict) and group in d]
    return sorted(options(group), key=lambda o: o not in chosen)


@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes(train_cfg, group: str, option: str) -> None:
    cfg = train_cfg(f"{group}={option}")
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    if group in ("data", "model", "trainer"):
        assert "_target_" in cfg[group]


def fits(tmp_path, data: str, model: str) -> bool:
    """Whether the model option fits the data option: built from what the data gives (a classifier from
    num_classes, a regressor from num_targets) and taking its inputs (a forward pass on the meta device),
    as `make train` checks before training."""
    cfg = compose_config("train", [f"data={data}", f"model={model}"], tmp_path)
    try:
        give_data_folder(cfg, tmp_path)
    except pytest.skip.Exception:  # a data set that needs an extra not installed here: no partner
        return False
    try:
        build.check_inputs_fit(cfg, build.from_data(cfg, build.datamodule(cfg)))
    except ConfigError:
        return False
    return True


def partner(tmp_path, group: str, option: str) -> list[str]:
    """What a data or model option trains with: the first option of the other group that fits it (a
    regression data set with a regressor, a 1D data set with a 1D net), the default first."""
    if group == "experiment":
        return []  # an experiment names its own
    other = "model" if group == "data" else "data"
    pairs = ((option, o) if group == "data" else (o, option) for o in defaults_first(other))
    found = next((pair for pair in pairs if fits(tmp_path, *pair)), None)
    assert found is not None, f"no {other} option fits {group}={option}: add one that takes its input shape"
    return [f"data={found[0]}", f"model={found[1]}"]


@pytest.mark.parametrize("choice", [f"{g}={o}" for g in ("data", "model", "experiment") for o in options(g)])
def test_every_data_set_model_and_experiment_trains_one_batch(
    train_cfg, tmp_path, monkeypatch, choice: str
) -> None:
    """A data set that downloads (it has `remotes`) fetches small fakes of its files from a local server; one
    that reads a folder gets a generated one."""
    group, option = choice.split("=")
    if group == "data":  # a data set that needs an extra not installed here skips
        give_data_folder(compose_config("train", [choice], tmp_path / "needs"), tmp_path / "needs")
    cfg = train_cfg(choice, *partner(tmp_path / "pair", group, option), "debug=fdr", *QUIET)
    give_data_folder(cfg, tmp_path)
    if "batch_size" in cfg.data:  # one small batch: the code path is the same, the compute a fraction
        cfg.data.batch_size = min(int(cfg.data.batch_size), 16)
    data_class = get_object(cfg.data._target_)
    with fake_downloads(data_class, monkeypatch) if hasattr(data_class, "remotes") else nullcontext():
        result = train(cfg)
    assert result.trainer.global_step == 1  # fast_dev_run: one optimizer step
    assert result.best_checkpoint is None  # ... and no checkpoints
    monitored = cfg.monitor.metric  # the task's own: what its model declares (val/acc, val/mse, ...)
    assert math.isfinite(result.metrics[monitored]) and result.score == result.metrics[monitored]
    tested = {k: v for k, v in result.metrics.items() if k.startswith("test/")}
    assert monitored.replace("val/", "test/", 1) in tested and all(map(math.isfinite, tested.values()))
    assert all(torch.isfinite(p).all() for p in result.model.parameters())


def declared(name: str) -> list[tuple[int, ...] | None]:
    return list(getattr(NETS[name], "example_input_shapes", None) or [None])


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        pytest.param(n, s, id=f"{n}-{'x'.join(map(str, s or ['undeclared']))}")
        for n in sorted(NETS)
        for s in declared(n)
    ],
)
def test_every_net_maps_its_declared_inputs_to_its_outputs_on_any_device(name: str, shape) -> None:
    """A registered net takes `input_shape` and `num_outputs` (class scores, or regression targets)."""
    assert shape is not None, f"net {name!r}: declare example_input_shapes, the input shapes it is built for"
    net = build_net({"name": name}, input_shape=shape, num_outputs=7)
    assert net(torch.randn(5, *shape)).shape == (5, 7)
    assert_device_agnostic(build_net({"name": name}, input_shape=shape, num_outputs=7), shape)
