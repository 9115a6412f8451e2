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

from conftest import MACHINE_FILES, REPO

GUIDE = (REPO / "docs" / "guide.md").read_text()


def block(after: str, language: str) -> str:
    """The first ```language block after the line containing `after`."""
    rest = GUIDE[GUIDE.index(after) :]
    return re.search(rf"```{language}\n(.*?)```", rest, re.S)[1]


@pytest.mark.slow  # a copy of the project trained five ways and its whole registry suite: ~90 s
@pytest.mark.xdist_group("writes_conf")  # copies conf/, which test_nothing_lost's bad inputs write to
def test_the_guide_s_changes_train(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(REPO / "src", project / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    shutil.copytree(REPO / "conf", project / "conf", ignore=MACHINE_FILES)
    (project / "src/lightspeed/data/waves.py").write_text(block("## Add a data set", "python"))
    (project / "conf/data/waves.yaml").write_text(block("conf/data/waves.yaml", "yaml"))
    (project / "src/lightspeed/models/nets/conv1d.py").write_text(block("## Add a net", "python"))
    (project / "conf/model/conv1d.yaml").write_text(block("conf/model/conv1d.yaml", "yaml"))
    # a regression data set for the shipped regressor; a task of its own with a LightningModule of its own
    (project / "src/lightspeed/data/ripples.py").write_text(block("## A regression task", "python"))
    (project / "conf/data/ripples.yaml").write_text(block("conf/data/ripples.yaml", "yaml"))
    (project / "src/lightspeed/data/tags.py").write_text(block("## Bring your own LightningModule", "python"))
    (project / "src/lightspeed/models/tagger.py").write_text(
        block("src/lightspeed/models/tagger.py", "python")
    )
    (project / "conf/data/tags.yaml").write_text(block("conf/data/tags.yaml", "yaml"))
    tagger_yaml = GUIDE[GUIDE.index("conf/data/tags.yaml` and") :]
    (project / "conf/model/tagger.yaml").write_text(re.findall(r"```yaml\n(.*?)```", tagger_yaml, re.S)[1])
    added = ["src/lightspeed/data", "src/lightspeed/models", "conf"]  # nothing else of src/lightspeed
    (project / "conf/accel").mkdir(exist_ok=True)  # there after make tune (its tuned.yaml is not copied)
    (project / "conf/accel/bf16.yaml").write_text(block("conf/accel/bf16.yaml", "yaml"))
    for primary in (project / "conf/train.yaml", project / "conf/eval.yaml"):
        line = "  - accel: default"
        assert primary.read_text().count(line) == 1, f"the one line the guide changes in {primary.name}"
        primary.write_text(primary.read_text().replace(line, "  - accel: bf16"))

    shutil.copytree(REPO / "tests", project / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", project)  # the same pytest settings
    (project / "tests/test_the_guide_s_run.py").write_text(GUIDE_RUN)
    # Every registry-driven test, the shipped options' too: a model that fits only its own data set (the
    # tagger) must never turn a shipped data set's test red (it is "does not fit", not a failure).
    changed = subprocess.run(
        ["diff", "-rq", str(REPO / "src/lightspeed"), str(project / "src/lightspeed"), "-x", "__pycache__"],
        capture_output=True,
        text=True,
    ).stdout
    assert all(any(f"/{a}" in line for a in added) for line in changed.splitlines()), changed
    files = ["tests/test_registry.py", "tests/test_the_guide_s_run.py"]
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
    assert tests.returncode == 0, tests.stdout[-20000:]
    passed = tests.stdout
    registered = ("[data=waves]", "[model=conv1d]", "[data-waves]", "[model-conv1d]", "[conv1d-1x40]")
    registered += ("[data=ripples]", "[data-ripples]", "[data=tags]", "[model=tagger]", "[model-tagger]")
    for option in registered:
        assert re.search(rf"PASSED tests/test_registry.py::\w+{re.escape(option)}", passed), option
    assert re.search(r"PASSED tests/test_registry.py::\w+\[data=diabetes\]", passed)  # shipped ones too
    runs = ("waves_model_conv1d", "ripples_model_regressor", "tags_model_tagger_then_eval_and_predict")
    for run in (f"test_make_train_data_{r}" for r in runs):
        assert f"PASSED tests/test_the_guide_s_run.py::{run}" in passed, run


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


def test_make_train_data_ripples_model_regressor(tmp_path, capsys):
    # a regression data set trains with the shipped regressor; the default classifier is refused
    import pytest

    quiet = ["callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false"]
    with pytest.raises(SystemExit) as refused:  # the default classifier: one line naming what fits
        train(compose_config("train", ["data=ripples", *quiet], tmp_path / "refused"))
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "choose a model for this data (model=regressor)" in err
    run = ["data=ripples", "model=regressor", "trainer.max_epochs=15", *quiet]
    result = train(compose_config("train", run, tmp_path))
    assert result.metrics["test/r2"] > 0.9, result.metrics  # learnt, in the targets' own units
    assert json.loads((tmp_path / "train/runs/test/summary.json").read_text())["monitor"] == "val/mse (min)"


def test_make_train_data_tags_model_tagger_then_eval_and_predict(tmp_path):
    # a task of its own, with its own LightningModule: eval and predict need no extra option
    import csv

    from lightspeed.eval import run

    quiet = ["callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false"]
    overrides = ["data=tags", "model=tagger", "trainer.max_epochs=8", *quiet]
    result = train(compose_config("train", overrides, tmp_path))
    assert result.best_checkpoint and "-val_f1_0." in result.best_checkpoint  # named by its own monitor
    assert result.metrics["test/f1"] > 0.7 and result.score == result.metrics["val/f1@best"]
    tested = run(compose_config("eval", ["predict=true", "trainer.enable_progress_bar=false"], tmp_path))
    assert tested["test/f1"] == result.metrics["test/f1"]  # the best checkpoint, on the run's own test split
    rows = list(csv.DictReader((tmp_path / "eval/runs/test/predictions.csv").open()))
    assert len(rows) == 600 and list(rows[0]) == ["index", "target", "pred"]
    assert all(len(row["pred"].split()) == 5 for row in rows)  # five tags a sample
"""
