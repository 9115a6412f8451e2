"""An Optuna search from the command line (`hparams_search=<name>`): each trial a whole run, the study
stored in the search's folder, so that a search killed midway and rerun ends as an uninterrupted one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TESTS, command_line, run_module
from lightspeed.run.search import SEARCH_FILE
from lightspeed.train import train_or_search

pytest.importorskip("optuna", reason="hparams_search needs the search extra (make install EXTRAS=dev,search)")

SEARCH = [
    "hparams_search=digits_optuna",
    "hparams_search.n_trials=4",
    "trainer.max_epochs=2",
    "++trainer.limit_train_batches=5",
    "++trainer.limit_val_batches=2",
    "test_after_fit=false",
    "callbacks.rich_progress_bar=null",
    "trainer.enable_progress_bar=false",
    "print_config=false",
    "run_name=search",
]


def _result(logs: Path) -> dict:
    return json.loads((logs / "train" / "runs" / "search" / SEARCH_FILE).read_text())


@pytest.mark.slow  # two searches of 4 small runs each (~1 min)
def test_a_search_killed_after_two_trials_and_rerun_ends_as_an_uninterrupted_one(tmp_path: Path) -> None:
    whole = run_module("lightspeed.train", *SEARCH, f"paths.log_dir={tmp_path / 'whole'}", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    expected = _result(tmp_path / "whole")
    assert [t["state"] for t in expected["trials"]] == ["COMPLETE"] * 4

    logs = tmp_path / "cut"
    env = {**os.environ, "PYTHONPATH": str(TESTS), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "lightspeed.train", *SEARCH, f"paths.log_dir={logs}"]
    first = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    third = logs / "train" / "runs" / "search" / "trials" / "2"  # two trials done, the third begun
    deadline = time.monotonic() + 300
    while not third.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.poll() is None, first.stderr.read().decode()[-3000:]
    first.send_signal(signal.SIGKILL)
    first.wait()
    rerun = run_module("lightspeed.train", *SEARCH, f"paths.log_dir={logs}", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "trial 2 was cut short: running its values again" in rerun.stderr + rerun.stdout
    found = _result(logs)
    states = [t["state"] for t in found["trials"]]
    assert states.count("COMPLETE") == 4 and states.count("FAIL") == 1  # the killed trial, run again
    assert found["best_params"] == expected["best_params"] and found["best_value"] == expected["best_value"]
    assert [t["params"] for t in found["trials"] if t["state"] == "COMPLETE"] == [
        t["params"] for t in expected["trials"]
    ]  # the same draws, in the same order
    best = Path(found["best_run_dir"])
    assert best.parent == logs / "train" / "runs" / "search" / "trials" and (best / "checkpoints").is_dir()
    again = run_module("lightspeed.train", *SEARCH, f"paths.log_dir={logs}", cwd=tmp_path)  # a finished one
    assert again.returncode == 0 and f"best trial {found['best_trial']}" in again.stdout
    assert len(_result(logs)["trials"]) == 5  # no trial added


def refused(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The one line (exit 2) that `python -m lightspeed.train <args>` ends in, run in process."""
    with pytest.raises(SystemExit) as stop:
        command_line(args, tmp_path, task=train_or_search)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    return err[0]


def test_a_search_space_entry_that_is_no_range_or_choice_is_one_line(tmp_path: Path, capsys) -> None:
    line = refused([*SEARCH, "hparams_search.params.model.optimizer.lr=0.1"], tmp_path, capsys)
    assert line.startswith("error: hparams_search.params.model.optimizer.lr=0.1 is invalid")


def test_a_search_over_a_multi_process_trainer_is_one_line(tmp_path: Path, capsys) -> None:
    """Lightning relaunches the command for each extra rank: each would run its own search."""
    line = refused([*SEARCH, "trainer=ddp_cpu"], tmp_path, capsys)
    assert line.startswith("error: hparams_search cannot drive a multi-process")
    assert not (tmp_path / "train" / "runs" / "search" / "trials").exists()


@pytest.mark.slow  # a search of two trials in a fresh process (~20 s)
def test_trials_that_fail_in_their_run_count_and_the_search_ends(tmp_path: Path) -> None:
    """A trial whose run ends in one line (here a batch larger than the training split) is a failed trial,
    counted: the search goes on to the next draw and ends, where it would draw the same values forever."""
    proc = run_module(
        "lightspeed.train",
        *SEARCH,
        "hparams_search.n_trials=2",
        "hparams_search.params={data: {batch_size: [4096]}}",
        f"paths.log_dir={tmp_path}",
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]  # every trial refused a setting: so is the search
    found = json.loads((tmp_path / "train" / "runs" / "search" / SEARCH_FILE).read_text())
    assert [(t["state"], t["failed"]) for t in found["trials"]] == [("FAIL", "exit 2")] * 2
    assert "error: hparams_search: every trial failed" in proc.stderr


def _search_cfg(folder: Path, *overrides: str):
    """The search's config as train.py hands it to search.run: composed (search.run settles its monitor)."""
    from lightspeed.run.entry import compose_config

    cfg = compose_config("train", [*SEARCH, "hparams_search.n_trials=5", *overrides], folder)
    cfg.paths.output_dir = str(folder / "search")
    return cfg


QMC = [
    "hparams_search.sampler._target_=optuna.samplers.QMCSampler",
    "~hparams_search.sampler.n_startup_trials",
]


def _score(trial_cfg) -> float:
    """A made-up score of the trial's values (the search needs a number, not a training run)."""
    return float(trial_cfg.model.optimizer.lr) * 100 + float(trial_cfg.model.net.dropout)


def _lrs(folder: Path) -> list[float]:
    found = json.loads((folder / "search" / SEARCH_FILE).read_text())
    return [t["params"]["model.optimizer.lr"] for t in found["trials"] if t["state"] == "COMPLETE"]


def test_a_continued_search_draws_what_an_uninterrupted_one_draws_and_reruns_the_cut_trial(
    tmp_path: Path,
) -> None:
    """In process, with Optuna's real study in SQLite and a made-up score for each trial: the seeded sampler
    gives the same draws, a trial the search was stopped in runs again with its values, and the continued
    search ends with the uninterrupted one's trials (the slow test kills a real search)."""
    from lightspeed.run import search

    search.run(_search_cfg(tmp_path / "whole"), lambda cfg, _: _score(cfg))
    other = tmp_path / "other"
    search.run(_search_cfg(other, "hparams_search.seed=1"), lambda cfg, _: _score(cfg))
    assert _lrs(other) != _lrs(tmp_path / "whole")  # the seed decides the draws

    for sampler in ([], QMC):  # QMC's draw follows the study's trial count: only the rerun repeats it
        seen, rerun = _stopped_in_the_third_trial_and_rerun(tmp_path / f"cut{len(sampler)}", sampler)
        assert rerun[0] == seen[2], sampler  # the cut trial's values first
    assert _lrs(tmp_path / "cut0") == _lrs(tmp_path / "whole")


def _stopped_in_the_third_trial_and_rerun(
    folder: Path, sampler: list[str]
) -> tuple[list[float], list[float]]:
    """The learning rates each run of the search tried: the first stopped inside its third trial (which
    stays running in the study, as when the process is killed), the second continuing it."""
    from lightspeed.run import search

    seen: list[float] = []
    rerun: list[float] = []

    def stopped(cfg, _) -> float:
        seen.append(float(cfg.model.optimizer.lr))
        if len(seen) == 3:
            raise KeyboardInterrupt
        return _score(cfg)

    with pytest.raises(KeyboardInterrupt):
        search.run(_search_cfg(folder, *sampler), stopped)
    search.run(
        _search_cfg(folder, *sampler),
        lambda cfg, _: rerun.append(float(cfg.model.optimizer.lr)) or _score(cfg),
    )
    return seen, rerun


def test_failed_trials_count_toward_n_trials_in_process(tmp_path: Path) -> None:
    """A trial whose run ends in one line (exit 2 or 3) is counted: the search ends after n_trials of them,
    where it would otherwise draw forever."""
    from lightspeed.run import search

    calls: list[int] = []

    def fails(cfg, _) -> float:
        calls.append(1)
        assert len(calls) <= 10, "the search did not count its failed trials"
        raise SystemExit(2 if len(calls) % 2 else 3)

    with pytest.raises(SystemExit) as stop:  # every trial failed: so did the search
        search.run(_search_cfg(tmp_path), fails)
    assert stop.value.code == 3
    found = json.loads((tmp_path / "search" / SEARCH_FILE).read_text())
    assert [(t["state"], t["failed"]) for t in found["trials"]] == [
        ("FAIL", "exit 2"),
        ("FAIL", "exit 3"),
        ("FAIL", "exit 2"),
        ("FAIL", "exit 3"),
        ("FAIL", "exit 2"),
    ]


def test_a_time_budget_ends_the_search_and_a_count_without_one_is_bounded(
    tmp_path: Path, monkeypatch
) -> None:
    """timeout_s: no trial starts after it (each trial here takes 10 s of a clock the test controls), and
    the same command continues; a count of trials that is none, or too large to end without a budget, is
    one line before any trial."""
    from lightspeed.core.config import ConfigError
    from lightspeed.run import search

    clock = [0.0]
    monkeypatch.setattr(search.time, "monotonic", lambda: clock[0])

    def ten_seconds(cfg, _) -> float:
        clock[0] += 10
        return _score(cfg)

    search.run(_search_cfg(tmp_path, "hparams_search.timeout_s=25"), ten_seconds)
    assert len(json.loads((tmp_path / "search" / SEARCH_FILE).read_text())["trials"]) == 3  # at 0, 10, 20 s
    search.run(_search_cfg(tmp_path, "hparams_search.timeout_s=25"), ten_seconds)
    assert len(json.loads((tmp_path / "search" / SEARCH_FILE).read_text())["trials"]) == 5  # n_trials=5

    for overrides, said in [
        (["hparams_search.n_trials=100000"], r"^hparams_search\.n_trials=100000 has no time budget: set "),
        (["hparams_search.n_trials=0"], r"^hparams_search\.n_trials=0 is invalid: a whole number"),
        (["hparams_search.timeout_s=-1"], r"^hparams_search\.timeout_s=-1 is invalid: seconds"),
    ]:
        with pytest.raises(ConfigError, match=said):
            search.run(_search_cfg(tmp_path / "bad", *overrides), lambda *_: pytest.fail("a trial ran"))
    search.run(
        _search_cfg(tmp_path / "big", "hparams_search.n_trials=100000", "hparams_search.timeout_s=15"),
        ten_seconds,
    )
    assert len(json.loads((tmp_path / "big" / "search" / SEARCH_FILE).read_text())["trials"]) == 2


HOLD = """
import sqlite3, sys, time
from pathlib import Path
folder = Path(sys.argv[2])
if sys.argv[1] == "folder":  # a search of the same command, as it holds its folder
    from lightspeed.resilience import lock
    held = lock.acquire(folder)
else:  # another program with the study open in a write transaction
    db = sqlite3.connect(folder / "study.db", isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.slow  # a process that holds the folder or the study (~8-12 s each)
@pytest.mark.parametrize(
    ("what", "said"),
    [
        ("folder", r"search is in use by another run \(pid \d+ on .*\): wait for it to end"),
        ("study", r"^hparams_search: .*study.db is locked by another program \(.*database is locked"),
    ],
)
def test_a_search_whose_folder_or_study_another_process_holds_is_one_line(
    tmp_path: Path, what: str, said: str
) -> None:
    """Two copies of one search command: the second is refused before it touches the study, where it
    would have taken the first's running trial for one cut short and run it again beside it. A study
    another program holds open (a viewer) is named as such, not as a file that is no study."""
    from lightspeed.core.config import ConfigError
    from lightspeed.run import search

    cfg = _search_cfg(tmp_path, "hparams_search.n_trials=2")
    if what == "study":
        search.run(cfg, lambda trial_cfg, _: _score(trial_cfg))  # a study to hold
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, what, str(tmp_path / "search")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=said):
            search.run(_search_cfg(tmp_path, "hparams_search.n_trials=3"), lambda c, _: _score(c))
    finally:
        holder.kill()
        holder.wait()
    if what == "folder":
        assert not (tmp_path / "search" / "study.db").exists()  # refused before it opened a study
    else:
        assert len(json.loads((tmp_path / "search" / SEARCH_FILE).read_text())["trials"]) == 2


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("hparams_search.params.model.optimizer.lr.low=0.1", "hparams_search.params.model.optimizer.lr"),
        ("hparams_search.params.model.optimizer.lr.low=0", "hparams_search.params.model.optimizer.lr"),
        ("+hparams_search.params.model.net.dropout.step=0", "hparams_search.params.model.net.dropout"),
        ("hparams_search.sampler=5", "hparams_search.sampler"),
        ("hparams_search.pruner=median", "hparams_search.pruner"),
    ],
)
def test_a_search_space_or_sampler_optuna_refuses_is_one_line_naming_the_key(
    tmp_path: Path, capsys, override: str, key: str
) -> None:
    """low > high, log with low <= 0, step 0 (Optuna's ValueErrors), a sampler or pruner that is no node."""
    from lightspeed.core.config import exit_on_config_error
    from lightspeed.run import search

    with pytest.raises(SystemExit) as stop, exit_on_config_error():
        search.run(_search_cfg(tmp_path, override), lambda *_: pytest.fail("a trial ran"))
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and re.match(rf"error: {re.escape(key)}=.* is invalid", line), line
