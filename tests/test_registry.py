"""Driven by what is registered, never by a list: every option in conf/, every registered net on the input
shapes it declares. A data set, model or experiment you add is composed, built and trained for one batch
here with nothing to edit, paired by task: with an option of the other group that it fits (the model is
built from what the data gives, and takes its inputs), and judged by the metric its model monitors
(tests/test_guide.py adds some in a copy of the project and runs this file)."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from hydra.utils import get_object
from omegaconf import OmegaConf

from conftest import data_dir_override
from fakes import fake_downloads, give_data_folder
from lightspeed import CONF_DIRS
from lightspeed.models.nets import NETS, _discover, build_net
from lightspeed.run.entry import compose_config
from lightspeed.testing import assert_device_agnostic, options, partner, trains_one_batch

_discover()

GROUPS = sorted({p.name for d in CONF_DIRS for p in d.iterdir() if p.is_dir() and any(p.glob("*.yaml"))})


def test_the_options_train_yaml_picks_come_first() -> None:
    """A data set is paired with the default model first (and a model with the default data): an added
    option is tried after them. (An `isinstance` of a DictConfig against dict never held.)"""
    import yaml

    from lightspeed import CONF_DIR
    from lightspeed.testing import defaults_first

    picked = {
        k: v
        for d in yaml.safe_load((CONF_DIR / "train.yaml").read_text())["defaults"]
        if isinstance(d, dict)
        for k, v in d.items()
    }
    assert [defaults_first(g)[0] for g in ("data", "model")] == [picked["data"], picked["model"]]


@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes(train_cfg, group: str, option: str) -> None:
    cfg = train_cfg(f"{group}={option}")
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    if group in ("data", "model", "trainer"):
        assert "_target_" in cfg[group]


@pytest.mark.parametrize("choice", [f"{g}={o}" for g in ("data", "model", "experiment") for o in options(g)])
def test_every_data_set_model_and_experiment_trains_one_batch(tmp_path, monkeypatch, choice: str) -> None:
    """A data set that downloads (it has `remotes`) fetches small fakes of its files from a local server; one
    that reads a folder gets a generated one."""
    if choice.startswith("data="):  # a data set that needs an extra not installed here skips
        give_data_folder(compose_config("train", [choice], tmp_path / "needs"), tmp_path / "needs")
    pair = partner(choice, tmp_path / "pair", give_data_folder)
    data_class = get_object(compose_config("train", [choice, *pair], tmp_path / "pair").data._target_)
    with fake_downloads(data_class, monkeypatch) if hasattr(data_class, "remotes") else nullcontext():
        trains_one_batch(
            choice, tmp_path / "logs", data_dir_override(tmp_path), prepare=give_data_folder, pair=pair
        )


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
