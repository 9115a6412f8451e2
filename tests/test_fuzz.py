"""Every key a user can set, given wrong types, extremes and unicode: each case ends as a run (exit 0), or in
one line (exit 2 for a setting, 3 for a training failure it explains), never in a traceback. As the command
line runs it, in process: Hydra's composition and the checks (`conftest.command_line`), then `train` on one
batch.

The fast suite runs a sample of the cases drawn with a fixed seed (the same cases on every run, so a red
run reproduces; FUZZ_SEED=<n> draws another); the slow suite runs the rest, so the two run every case once."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import TINY, command_line
from lightspeed.core.config import exit_on_config_error
from lightspeed.run.compose_errors import flat_keys
from lightspeed.run.entry import compose_config
from lightspeed.train import train

#: What a careless hand, a script or an attacker might type for any value.
VALUES = ["abc", "true", "-5", "0", "1.5", "1e30", "[1]", "{a: 1}", "null", "'日本語'", "''"]
#: Where the run lives, not what it does: their own tests cover them (a value here would write elsewhere).
SKIP = ("paths.", "hydra.")
QUIET = [o for o in TINY if "batches" not in o and "max_epochs" not in o]


def keys() -> list[str]:
    """Every leaf of the default composition: what `make train key=value` can set."""
    with tempfile.TemporaryDirectory(prefix="lightspeed-fuzz-") as scratch:
        container = OmegaConf.to_container(compose_config("train", [], Path(scratch)), resolve=False)

    def leaf(key: str) -> bool:
        node = container
        for part in key.split("."):
            node = node[part]
        return not isinstance(node, dict)

    return sorted(k for k in flat_keys(container) if leaf(k) and not k.startswith(SKIP))


CASES = [f"{k}={v}" for k in keys() for v in VALUES]


def run_case(override: str, train_cfg, capsys, log_dir) -> tuple[int, list[str]]:
    """The exit code and stderr lines of `make train debug=fdr <override>`."""
    try:
        with exit_on_config_error():
            command_line(["debug=fdr", *QUIET, override], log_dir)
        train(train_cfg("debug=fdr", *QUIET, override))
    except SystemExit as stop:
        return int(stop.code or 0), capsys.readouterr().err.strip().splitlines()
    return 0, []


def check(override: str, train_cfg, capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)  # a relative path a value makes lands here
    code, err = run_case(override, train_cfg, capsys, tmp_path / "checks")
    assert code in (0, 2, 3), (override, code, err)
    if code:
        lines = [line for line in err if line.startswith("error: ")]
        assert lines and "Traceback" not in "\n".join(err), (override, err[-5:])


SAMPLE = random.Random(int(os.environ.get("FUZZ_SEED", "0"))).sample(CASES, 20)


@pytest.mark.parametrize("override", SAMPLE)
def test_a_sample_of_wrong_values_ends_in_a_run_or_one_line(
    override: str, train_cfg, capsys, monkeypatch, tmp_path
) -> None:
    check(override, train_cfg, capsys, monkeypatch, tmp_path)


@pytest.mark.slow  # the cases the sample above did not run (CI runs both)
@pytest.mark.parametrize("override", [c for c in CASES if c not in SAMPLE])
def test_every_other_wrong_value_ends_in_a_run_or_one_line(
    override: str, train_cfg, capsys, monkeypatch, tmp_path
) -> None:
    check(override, train_cfg, capsys, monkeypatch, tmp_path)
