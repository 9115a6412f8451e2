"""One failure boundary around every command (issue 48, item 1): an error that no closer handler explained
ends in one line naming the phase and the cause, exit 3 (2 for a file); its traceback goes to the run's
log file, and to the terminal only with LIGHTSPEED_DEBUG=1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TINY, command_line, run_module
from lightspeed.run.search import SEARCH_FILE
from lightspeed.train import train


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


def test_a_bug_in_the_fit_is_one_line_naming_the_fit_and_its_traceback_is_in_the_log(tmp_path: Path) -> None:
    """A real run whose callback raises at step 2, as a user runs it."""
    run = tmp_path / "run"
    fault = ["+callbacks.fault._target_=probes.Fault", "+callbacks.fault.kind=raise"]
    fault += ["+callbacks.fault.step=2"]
    proc = run_module("lightspeed.train", *TINY, *fault, f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr[-3000:]
    (line,) = _errors(proc.stderr)
    assert line.startswith("error: fit: RuntimeError: simulated failure on rank 0"), line
    assert str(run / "train.log") in line
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr, proc.stderr[-3000:]
    logged = (run / "train.log").read_text()
    assert "Traceback" in logged and "simulated failure on rank 0" in logged


def test_any_error_of_a_command_is_one_line_and_its_traceback_shows_with_lightspeed_debug(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    def bug(cfg) -> None:
        raise ZeroDivisionError("division by zero, in the task")

    with pytest.raises(SystemExit) as stop:
        command_line(["debug=fdr"], tmp_path / "a", task=bug)
    err = capsys.readouterr().err
    assert stop.value.code == 3 and "Traceback" not in err, err
    (line,) = _errors(err)
    assert line.startswith("error: train: ZeroDivisionError: division by zero, in the task"), line
    assert "LIGHTSPEED_DEBUG=1" in line  # no log file here (hydra/job_logging=none): where to see it
    monkeypatch.setenv("LIGHTSPEED_DEBUG", "1")
    with pytest.raises(SystemExit):
        command_line(["debug=fdr"], tmp_path / "b", task=bug)
    err = capsys.readouterr().err
    assert "Traceback" in err and "in bug" in err and len(_errors(err)) == 1


def test_an_error_that_names_a_file_exits_2(tmp_path: Path, capsys) -> None:
    def unreadable(cfg) -> None:
        (tmp_path / "nowhere" / "data.csv").read_text()

    with pytest.raises(SystemExit) as stop:
        command_line(["debug=fdr"], tmp_path / "logs", task=unreadable)
    (line,) = _errors(capsys.readouterr().err)
    assert stop.value.code == 2 and "FileNotFoundError" in line and "data.csv" in line, line


def test_a_constructors_bug_names_the_node_it_was_building(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        command_line([*TINY, "+model.net._target_=probes.BrokenNet"], tmp_path, task=train)
    (line,) = _errors(capsys.readouterr().err)
    assert stop.value.code == 3 and line.startswith("error: instantiate model"), line
    assert "KeyError" in line and "a bug in the constructor" in line, line


def test_a_trial_that_fails_unexpectedly_is_a_failed_trial_and_the_search_goes_on(tmp_path: Path) -> None:
    from lightspeed.run import search
    from test_search import _score, _search_cfg

    calls: list[int] = []

    def flaky(cfg, _) -> float:
        calls.append(1)
        if len(calls) % 2:
            raise ZeroDivisionError("a bug that only some trials hit")
        return _score(cfg)

    search.run(_search_cfg(tmp_path), flaky)
    found = json.loads((tmp_path / "search" / SEARCH_FILE).read_text())
    states = [(t["state"], t.get("failed")) for t in found["trials"]]
    assert states[0] == ("FAIL", "exit 3") and ("COMPLETE", None) in states, states
    assert len(states) == 5


def test_an_error_carrying_another_processs_traceback_is_named_by_its_cause() -> None:
    """A DataLoader worker's error, a spawned rank's: their message holds the other process's traceback."""
    from lightspeed.core.unexpected import _line

    worker = ValueError(
        "Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\nValueError: a corrupt image'
    )
    assert _line(worker) == "ValueError: a corrupt image"
    assert _line(ValueError("plain\nsecond line")) == "plain"
