"""One training run in a process of its own, timed in steady state: what `make bench`'s preset rows and
`make tune`'s measurements are made of."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from lightspeed.core.files import read_json
from lightspeed.speed.steady import MAX_WARMUP

# What every bench run shares: no validation, no checkpoints, no progress bar; it stops once the timed
# steps are done (min_epochs=0: at once, not at the epoch's end).
RUN = [
    "++trainer.max_epochs=-1",
    "++trainer.min_epochs=0",
    "++trainer.limit_val_batches=0",
    "trainer.num_sanity_val_steps=0",
    "logger=none",
    "curves=false",
    "test_after_fit=false",
    "++callbacks.model_checkpoint=null",
    "++callbacks.early_stopping=null",
    "++callbacks.rich_progress_bar=null",
    "++trainer.enable_progress_bar=false",
    "++trainer.enable_checkpointing=false",
    "++callbacks.speed_report._target_=lightspeed.callbacks.SpeedReport",
]


def train_command() -> list[str]:
    """The training a measured run is: a project's own train.py (its Makefile sets $LIGHTSPEED_TRAIN to
    `<name>.train`, whose callbacks and steps are part of what it trains), else the engine's."""
    return [sys.executable, "-m", os.environ.get("LIGHTSPEED_TRAIN") or "lightspeed.train"]


def measure(
    overrides: list[str], steps: int, warmup: str, run_dir: Path, timeout: float | None = None
) -> dict:
    """One training process in steady state, as a preset row of `make bench` runs and `make tune` measures:
    its speed.json and final loss, or {"error": its last line} (run_process's)."""
    length = steps + (MAX_WARMUP if warmup == "auto" else int(warmup))  # the span of its LR schedule
    cmd = [*train_command(), *overrides, *RUN, f"++trainer.max_steps={length}"]
    cmd += [f"hydra.run.dir={run_dir}", f"++callbacks.speed_report.warmup_steps={warmup}"]
    cmd += [f"++callbacks.speed_report.max_timed_steps={steps}"]
    error = run_process(cmd, run_dir, timeout)
    if error:
        return error
    speed, summary = (read_json(run_dir / name, within=run_dir) for name in ("speed.json", "summary.json"))
    if not isinstance(speed, dict) or not isinstance(summary, dict):
        return {"error": f"error: the run wrote no speed.json and summary.json: see {run_dir}.log", "exit": 3}
    speed["final_loss"] = (summary.get("metrics") or {}).get("train/loss")
    return speed


def run_process(cmd: list[str], run_dir: Path, timeout: float | None = None) -> dict:
    """Run one process into `run_dir`, its output kept beside it (<run_dir>.log): {} when it succeeded, else
    {"error": its last line, "exit": its exit code}, with "timed_out" when it was stopped at `timeout` s.
    It runs in a process group of its own, killed whole as this call ends: its loader workers and compile
    workers too, which would otherwise hold its output open (or run on) past a deadline or a Ctrl-C."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ended = signal.signal(signal.SIGTERM, _terminated)  # SIGTERM too ends it through `finally` below
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:  # Ctrl-C, SIGTERM, or any error here: not an orphan left running
            os.killpg(proc.pid, signal.SIGKILL)
        signal.signal(signal.SIGTERM, ended)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir.parent / f"{run_dir.name}.log").write_text(out + err)
    if timed_out:
        return {"error": f"error: stopped at its deadline, {timeout:.0f} s", "exit": 3, "timed_out": True}
    if proc.returncode != 0:
        return {"error": (err.strip().splitlines() or ["no output"])[-1], "exit": proc.returncode}
    return {}


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
