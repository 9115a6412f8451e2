"""Modules and data with each common mistake (tests/mistakes.py), trained as `make train model._target_=...`
runs them (inside the command's failure boundary): each ends in a run or in one line naming the hook or
phase, exit 2 or 3, never a traceback or a hang; a missing or failing hook that only the test after the fit
runs is refused before the fit. A fixed-seed sample runs in the fast suite, every case in the slow one."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import mistakes
from conftest import TINY, command_line
from lightspeed.train import train

CASES = [f"model._target_=mistakes.{m.__name__}" for m in mistakes.MODULES]
CASES += [f"data._target_=mistakes.{d.__name__}" for d in mistakes.DATA]
#: What each case must name in its one line (a hook, or the phase it failed in); a run where absent.
NAMED = {
    "StepReturnsString": "training_step",
    "StepReturnsDictWithoutLoss": "loss",
    "StepReturnsVector": "fit",
    "StepLogsString": "self.log",
    "StepLogsVector": "self.log",
    "StepRaises": "training_step",
    "NoTrainingStep": "training_step",
    "NoValidationStep": "monitor.metric",
    "ValidationRaises": "validation_step",
    "ValidationLogsString": "self.log",
    "NoTestStep": "test_step",
    "TestRaises": "test_step",
    "TestLogsString": "self.log",
    "NoOptimizers": "configure_optimizers",
    "OptimizersString": "configure_optimizers",
    "ForwardRaises": "forward",
    "NoValLoader": "val/acc",  # Lightning's EarlyStopping line: it names the metrics there are
    "NoTestLoader": "test_dataloader",
    "NoTrainLoader": "train_dataloader",
}
#: Refused before the fit (nothing trained): what only the test after the fit would have found.
BEFORE_FIT = {"NoTestStep", "NoTestLoader", "TestRaises", "TestLogsString"}


def check(case: str, tmp_path: Path, capsys) -> str:
    """Train the case as the command line does; what happened: `ran`, or `line` (one line, as promised)."""
    name = case.rpartition(".")[2]
    try:
        command_line([*TINY, case], tmp_path / "logs", task=train)
    except SystemExit as stop:
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        assert stop.code in (2, 3) and len(lines) == 1 and "Traceback" not in err, (
            case,
            stop.code,
            err[-3000:],
        )
        assert NAMED.get(name, "<a run>") in lines[0], (case, lines[0])
        checkpoints = list((tmp_path / "logs").rglob("*.ckpt"))
        assert name not in BEFORE_FIT or not checkpoints, (case, "refused only after the fit")
        return "line"
    assert name not in NAMED, (case, "ran, where one line was promised")
    return "ran"


SAMPLE = random.Random(0).sample(CASES, 3)


@pytest.mark.parametrize("case", SAMPLE)
def test_a_sample_of_module_mistakes_ends_in_a_run_or_one_line(case: str, tmp_path: Path, capsys) -> None:
    check(case, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c not in SAMPLE])
def test_every_module_mistake_ends_in_a_run_or_one_line(case: str, tmp_path: Path, capsys) -> None:
    check(case, tmp_path, capsys)
