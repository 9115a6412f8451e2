"""docs/guide.md, performed: its recipes copied out of the guide into a temporary copy of the project; there,
the registry-driven tests (they must stay green and train the additions) and one run with the new data
set, the new net and the changed precision."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

GUIDE = (REPO / "docs" / "guide.md").read_text()


def block(after: str, language: str) -> str:
    """The first ```language block after the line containing `after`."""
    rest = GUIDE[GUIDE.index(after) :]
    return re.search(rf"```{language}\n(.*?)```", rest, re.S)[1]


@pytest.mark.xdist_group("writes_conf")  # copies conf/, which test_nothing_lost's bad inputs write to
def test_the_guide_s_changes_train(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(REPO / "src", project / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    shutil.copytree(REPO / "conf", project / "conf")
    (project / "src/lightspeed/data/waves.py").write_text(block("## Add a data set", "python"))
    (project / "conf/data/waves.yaml").write_text(block("conf/data/waves.yaml", "yaml"))
    (project / "src/lightspeed/models/nets/conv1d.py").write_text(block("## Add a net", "python"))
    (project / "conf/model/conv1d.yaml").write_text(block("conf/model/conv1d.yaml", "yaml"))
    preset = project / "conf/accel/default.yaml"
    line = "  precision: auto "
    assert preset.read_text().count(line) == 1, "the one line the guide changes"
    preset.write_text(preset.read_text().replace(line, "  precision: bf16-mixed "))

    shutil.copytree(REPO / "tests", project / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", project)  # the same pytest settings
    (project / "tests/test_the_guide_s_run.py").write_text(GUIDE_RUN)
    # The registry-driven tests of what the guide added (the others run in this suite, on the same code).
    files = ["tests/test_registry.py", "tests/test_the_guide_s_run.py", "-k", "waves or conv1d"]
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", *files, "-q", "-rA", "-p", "no:cacheprovider"],
        cwd=project,
        env={
            "PATH": "/usr/bin:/bin",
            "OMP_NUM_THREADS": "1",
            "HOME": str(tmp_path),
            "PYTHONPATH": f"{project / 'src'}:{project / 'tests'}",  # the copy's code first
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tests.returncode == 0, tests.stdout[-6000:]
    passed = tests.stdout
    for added in ("[data=waves]", "[model=conv1d]", "[data-waves]", "[model-conv1d]", "[conv1d-1x40]"):
        assert re.search(rf"PASSED tests/test_registry.py::\w+{re.escape(added)}", passed), added
    assert "PASSED tests/test_the_guide_s_run.py::test_make_train_data_waves_model_conv1d" in passed


#: `make train data=waves model=conv1d` in the copy, in process: the new data set and net, bf16-mixed.
GUIDE_RUN = """
import json

from lightspeed.run.entry import compose_config
from lightspeed.train import train


def test_make_train_data_waves_model_conv1d(tmp_path):
    quiet = ["callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false"]
    result = train(compose_config("train", ["data=waves", "model=conv1d", "debug=limit", *quiet], tmp_path))
    run = tmp_path / "train" / "runs" / "test"
    assert json.loads((run / "speed.json").read_text())["precision"] == "bf16-mixed"  # what the Trainer ran
    assert result.model.hparams["net"]["name"] == "conv1d" and "test/acc" in result.metrics
    assert len(result.trainer.datamodule.splits["test"]) == 200  # the data set's own test split
"""
