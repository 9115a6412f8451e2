"""This project's own code: every data set, model and experiment of conf/ composed, built and trained
for one batch with a partner that fits it, and judged by the metric its model monitors (lightspeed.testing).
A file you add to conf/data, conf/model or conf/experiment is tested here with nothing to edit."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import get_object

from lightspeed.run.entry import compose_config
from lightspeed.testing import options, trains_one_batch

GROUPS = ("data", "model", "experiment")


@pytest.mark.parametrize("choice", [f"{g}={o}" for g in GROUPS for o in options(g)])
def test_trains_one_batch(tmp_path: Path, choice: str) -> None:
    data = compose_config("train", [choice], tmp_path / "logs").data
    if hasattr(get_object(data._target_), "remotes"):
        pytest.skip(f"{choice} downloads its data set: `make train {choice}` fetches it (tests stay offline)")
    trains_one_batch(choice, tmp_path / "logs", f"paths.data_dir={tmp_path / 'data'}")
