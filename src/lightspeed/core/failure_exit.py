"""How a failed or stopped fit ends: its stderr line and exit code (`failures.exit_on_failure`), loaded only
when it ends so."""

from __future__ import annotations

import signal
import sys
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from lightspeed.core.failures import TRAINING_FAILURE_EXIT, Preempted, TrainingFailure


def exit_code(err: BaseException, cfg: Any, trainer: L.Trainer, launched: bool) -> int | None:
    """Say what ended the fit and return the exit code it ends with; None for an error to pass on (its
    traceback). `launched`: a rank that Lightning's launcher started exits 0 on an end every rank agrees on
    (else Lightning SIGKILLs the first rank); the first rank says the agreed ones (Preemption,
    TrainingFailure), each rank its own out-of-memory (named under DDP)."""
    if isinstance(err, Preempted):
        _say(preempted_line(err))
        return 0 if launched else 128 + err.signum
    if isinstance(err, SystemExit):
        # Lightning's exit after a KeyboardInterrupt (trainer.interrupted alone is true after any error)
        if not isinstance(err.__context__, KeyboardInterrupt) or err.code != 1:
            return None
        from lightspeed.core.failure_lines import newest_saved

        _say(f"interrupted by SIGINT (Ctrl-C) at step {trainer.global_step}: {newest_saved(trainer)}")
        return 128 + signal.SIGINT
    if isinstance(err, TrainingFailure):
        _say(f"error: {err}")
        return 0 if launched else TRAINING_FAILURE_EXIT
    from lightspeed.core.failure_lines import explained

    line = explained(err, cfg, trainer) if isinstance(err, RuntimeError) else None  # torch's OOM is one
    if line is None:
        return None
    print(f"error: {line}", file=sys.stderr)
    return TRAINING_FAILURE_EXIT


def preempted_line(stop: Preempted) -> str:
    name = signal.Signals(stop.signum).name
    if stop.path is None:
        return f"preempted by {name} at step {stop.step}: nothing saved (trainer.enable_checkpointing=false)"
    return (
        f"preempted by {name}: saved {stop.path} at step {stop.step}; rerun the same command to continue "
        "(resume=auto)"
    )


@rank_zero_only
def _say(message: str) -> None:
    """A line said once, by the first rank (an end every rank agrees on)."""
    print(message, file=sys.stderr)
