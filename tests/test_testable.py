"""`test_after_fit` runs `test_step` on one test batch before the fit, as `make eval` tests
(lightspeed.run.testable): a bug there is one line before anything is trained, and the probe changes nothing
of the run: not its weights, not its files, not what its test measures."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torchmetrics import Metric

from conftest import TINY, command_line
from lightspeed.models.classifier import Classifier
from lightspeed.run import testable
from lightspeed.train import train

SEES = "model._target_=test_testable.SeesTest"


class SeesTest(Classifier):
    """Notes how each `test_step` sees its Trainer; draws a random number (as MC dropout would) and writes
    a line in the Trainer's folder at each test's end."""

    calls: ClassVar[list[tuple[Any, ...]]] = []
    inference_states: ClassVar[list[bool]] = []

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        torch.rand(1)
        trainer = self.trainer
        assert self.logger.experiment is not None  # as a TensorBoard image would be logged
        SeesTest.calls.append(
            (
                type(trainer.logger).__name__,
                trainer.precision,
                self.training,
                torch.is_inference_mode_enabled(),
            )
        )
        return super().test_step(batch, batch_idx)

    def on_fit_start(self) -> None:  # after the probe: can the fit and the test still update the metrics?
        SeesTest.inference_states = [
            getattr(metric, state).is_inference()
            for metric in self.modules()
            if isinstance(metric, Metric)
            for state in metric._defaults
        ]

    def on_test_epoch_end(self) -> None:
        with open(Path(self.trainer.default_root_dir) / "tested.txt", "a") as out:
            out.write(f"{len(SeesTest.calls)}\n")


@pytest.fixture
def sees() -> list[tuple[Any, ...]]:
    SeesTest.calls.clear()
    return SeesTest.calls


def test_test_step_runs_once_before_the_fit_as_eval_tests_and_its_files_are_not_kept(
    train_cfg, run_dir: Path, sees: list[tuple[Any, ...]], tmp_path: Path, monkeypatch, caplog
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    train(train_cfg(*TINY, SEES, "trainer.precision=bf16-mixed"))
    probe, *tested = sees
    # a logger that keeps nothing; the fit's precision; eval mode; no_grad
    assert probe == ("DummyLogger", "bf16-mixed", False, False)
    assert len(tested) == 2 and "DummyLogger" not in {call[0] for call in tested}  # the test after the fit
    assert (run_dir / "tested.txt").read_text() == "3\n"  # the probe's line went with its folder
    assert not list((tmp_path / "tmp").iterdir())
    assert caplog.text.count("GPU available") == 1  # the fit's Trainer says it; the probe's does not
    # a metric state left as an inference tensor: the test after a DDP fit over gloo (no_grad) failed on it
    assert SeesTest.inference_states and not any(SeesTest.inference_states)


def test_the_probe_changes_nothing_of_the_run(train_cfg, tmp_path: Path, sees, monkeypatch) -> None:
    probed = train(train_cfg(*TINY, SEES, f"paths.output_dir={tmp_path / 'probed'}"))
    monkeypatch.setattr(testable, "probe", lambda *args: None)
    plain = train(train_cfg(*TINY, SEES, f"paths.output_dir={tmp_path / 'plain'}"))
    assert probed.metrics == plain.metrics
    for key, value in plain.model.state_dict().items():
        assert torch.equal(value, probed.model.state_dict()[key]), key


def test_no_probe_without_the_test_after_the_fit(train_cfg, sees: list[tuple[Any, ...]]) -> None:
    train(train_cfg(*TINY, SEES, "test_after_fit=false"))
    assert sees == []


def test_a_bug_in_test_step_is_one_line_before_the_fit(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        command_line([*TINY, "model._target_=mistakes.TestRaises"], tmp_path / "logs", task=train)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert stop.value.code == 3 and len(lines) == 1
    assert "test_step" in lines[0] and "test_after_fit=false" in lines[0] and "a bug in test_step" in lines[0]
    assert not list((tmp_path / "logs").rglob("*.ckpt"))  # nothing trained
