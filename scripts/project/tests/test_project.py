"""This project's own code: every data set, model and experiment of conf/ composed, built and trained
for one batch with a partner that fits it (lightspeed.testing), and every option of every group composes.
A file you add to conf/data, conf/model or conf/experiment is tested here with nothing to edit."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lightspeed.run.entry import compose_config
from lightspeed.testing import options, trains_one_batch

GROUPS = ("data", "model", "experiment")


@pytest.mark.parametrize("choice", [f"{g}={o}" for g in GROUPS for o in options(g)])
def test_trains_one_batch(tmp_path: Path, choice: str) -> None:
    trains_one_batch(choice, tmp_path / "logs", f"paths.data_dir={tmp_path / 'data'}")


@pytest.mark.parametrize("choice", [f"{g}={o}" for g in GROUPS for o in options(g)])
def test_composes_and_resolves(tmp_path: Path, choice: str) -> None:
    cfg = compose_config("train", [choice], tmp_path / "logs")
    OmegaConf.to_container(cfg, resolve=True)
    assert cfg.model._target_.startswith("myproject.") and cfg.data._target_.startswith("myproject.")
