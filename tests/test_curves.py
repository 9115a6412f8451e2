"""Every run draws curves.png from the values its loggers are given, keeps the points in curves.json, and a
resumed run's picture starts at step 0; curves=false draws nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TINY
from lightspeed.core.summary import SUMMARY_FILE
from lightspeed.report.curves import CURVES_FILE, PICTURE_FILE, load, panels
from lightspeed.train import train
from probes import Fault

LR = "callbacks=[default,lr_monitor]"  # the learning rate: an option beside the default callbacks

PNG = b"\x89PNG\r\n\x1a\n"


def test_a_run_preempted_and_resumed_draws_one_curve_from_step_0(train_cfg, run_dir: Path) -> None:
    with pytest.raises(SystemExit):
        train(train_cfg(*TINY, "logger=none", "curves=true", LR), [Fault("sigterm", step=7)])
    first = load(run_dir)
    assert max(s for s, _ in first["train/loss"]) == 6  # logged every step until the signal
    train(
        train_cfg(*TINY, "logger=none", "curves=true", LR)
    )  # resumes at step 7 (no other logger: the picture still comes)
    points = load(run_dir)
    steps = [s for s, _ in points["train/loss"]]
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == 9  # each step once, 0 to 9
    assert points["train/loss"][:7] == first["train/loss"][:7]  # the first attempt's, kept
    assert len(points["val/acc"]) == 2 and "lr-AdamW" in points  # one validation an epoch; the LR
    picture = (run_dir / PICTURE_FILE).read_bytes()
    assert picture.startswith(PNG) and len(picture) > 10_000
    assert json.loads((run_dir / SUMMARY_FILE).read_text())["curves"] == str(run_dir / PICTURE_FILE)


def test_a_resume_from_a_checkpoint_older_than_the_last_points_drops_the_points_past_it(
    tmp_path: Path,
) -> None:
    """A run killed (SIGKILL: no save of its own) some steps after its last checkpoint logged points it will
    log again: the resumed attempt starts at the checkpoint's step and keeps only the earlier points."""
    from lightspeed.report.curves import CurvesLogger

    first = {"train/loss": [[s, 1.0 / (s + 1)] for s in range(13)], "val/acc": [[4, 0.5], [9, 0.7]]}
    (tmp_path / CURVES_FILE).write_text(json.dumps(first))
    resumed = CurvesLogger(tmp_path)
    for step in range(7, 10):  # the checkpoint was saved at step 7
        resumed.log_metrics({"train/loss": 0.25, "epoch": 1.0}, step=step)
    resumed.save()
    points = load(tmp_path)
    steps = [s for s, _ in points["train/loss"]]
    assert steps == list(range(10)) and points["train/loss"][:7] == first["train/loss"][:7]
    assert points["val/acc"] == [[4, 0.5]] and "epoch" not in points


def test_points_are_written_on_a_cadence_with_each_checkpoint_and_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning saves every logger after each logging step: the points go to disk at most every
    SAVE_EVERY_S then, and at once with a checkpoint (a resume from it finds them) and at the end."""
    from lightspeed.report import curves

    clock = [100.0]
    monkeypatch.setattr(curves.time, "monotonic", lambda: clock[0])
    logger = curves.CurvesLogger(tmp_path)

    def step(n: int) -> list[float]:
        logger.log_metrics({"train/loss": 1.0 / (n + 1)}, step=n)
        logger.save()
        clock[0] += 1.0
        return [s for s, _ in load(tmp_path).get("train/loss", [])]

    assert step(0) == [0]  # the first point at once
    assert step(1) == [0] and step(2) == [0]  # then not at each step
    logger.after_save_checkpoint(None)
    assert step(3) == [0, 1, 2]  # the checkpoint's points kept with it
    for n in range(4, 3 + int(curves.SAVE_EVERY_S)):
        assert step(n) == [0, 1, 2]
    assert step(3 + int(curves.SAVE_EVERY_S))[-1] == 3 + curves.SAVE_EVERY_S  # the cadence's write
    logger.log_metrics({"train/loss": 0.01}, step=99)
    logger.finalize("success")
    assert load(tmp_path)["train/loss"][-1] == [99.0, 0.01]


def test_curves_false_draws_nothing(train_cfg, run_dir: Path) -> None:
    train(train_cfg(*TINY, "trainer.max_epochs=1", "curves=false", "test_after_fit=false"))
    assert not (run_dir / CURVES_FILE).exists() and not (run_dir / PICTURE_FILE).exists()


def test_the_panels_follow_the_monitor_whatever_the_task() -> None:
    points = {k: [[0, 1.0]] for k in ("train/loss", "val/loss", "val/mae", "train/mae", "lr-SGD", "test/mae")}
    assert panels(points, "val/mae") == [
        ("loss", ["train/loss", "val/loss"]),
        ("mae", ["val/mae", "train/mae"]),
        ("learning rate", ["lr-SGD"]),
    ]
    assert panels(points, "val/loss") == [("loss", ["train/loss", "val/loss"]), ("learning rate", ["lr-SGD"])]


def test_a_torn_or_odd_curves_file_is_no_points(tmp_path: Path) -> None:
    (tmp_path / CURVES_FILE).write_text('{"train/loss": [[0, 1.0], [1, "x"]], "val/acc": [[0, 0.5]]')
    assert load(tmp_path) == {}
    (tmp_path / CURVES_FILE).write_text('{"train/loss": [[0, 1.0], [1, "x"]], "val/acc": [[0, 0.5]]}')
    assert load(tmp_path) == {"val/acc": [[0.0, 0.5]]}


def test_make_compare_draws_two_runs_on_one_chart_and_prints_their_table(tmp_path: Path, capsys) -> None:
    from lightspeed.compare import main as compare
    from lightspeed.run.entry import compose_config

    logs = tmp_path / "logs"
    for lr in ("0.003", "0.0003"):
        cfg = compose_config("train", [*TINY, f"model.optimizer.lr={lr}", "curves=true"], logs)
        cfg.paths.output_dir = str(logs / "train" / "runs" / f"lr{lr}")
        train(cfg)
    capsys.readouterr()
    compare(["lr0.003", str(logs / "train" / "runs" / "lr0.0003"), "--log-dir", str(logs)])
    out = capsys.readouterr().out
    assert "lr0.003" in out and "lr0.0003" in out and "test/acc" in out
    picture = (logs / "compare.png").read_bytes()
    assert picture.startswith(PNG) and len(picture) > 10_000
    with pytest.raises(SystemExit, match=r"^error: RUNS: nope is no finished run"):
        compare(["lr0.003", "nope", "--log-dir", str(logs)])
