"""The README's own commands: its first change trains as it says, and its overrides compose."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from conftest import MACHINE_FILES
from lightspeed import CONF_DIR
from test_engine import lightspeed

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= 200


def test_the_first_change_is_an_experiment_that_composes_as_written(tmp_path: Path) -> None:
    yaml = re.search(r"`conf/experiment/digits_wide\.yaml`:\n\n```yaml\n(.*?)```", README, re.S)[1]
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf, ignore=MACHINE_FILES)
    (conf / "experiment" / "digits_wide.yaml").write_text(yaml)
    assert "make train experiment=digits_wide" in README
    proc = lightspeed("train", "experiment=digits_wide", "--cfg", "job", cwd=tmp_path, conf=conf)
    assert proc.returncode == 0, proc.stderr
    assert "    hidden:\n    - 512\n    - 512\n" in proc.stdout and "  max_epochs: 20\n" in proc.stdout
    assert "name: mlp" in proc.stdout


def table_overrides() -> list[str]:
    """Each override of the table: a `make train ...` command, or a bare `group=option` beside one."""
    found = []
    for row in re.findall(r"^\| [^|]+ \| (.+) \|$", README.split("## The ten most used overrides")[1], re.M):
        for item in re.findall(r"`([^`]+)`", row):
            if item.startswith("make train ") and "ARGS=" not in item:
                found.append(item.removeprefix("make train "))
            elif re.fullmatch(r"[\w./]+=\S+", item):
                found.append(item)
    return found


OVERRIDES = table_overrides()


def test_the_table_has_ten_rows_of_commands() -> None:
    table = README.split("## The ten most used overrides")[1].split("\n\n")[1]
    assert len(table.splitlines()) == 2 + 10 and len(OVERRIDES) >= 10


@pytest.mark.parametrize("command", OVERRIDES)
def test_each_override_in_the_table_composes(train_cfg, command: str) -> None:
    train_cfg(*command.split())
