"""A torch.profiler trace of steady-state training steps: where a step's time goes, kernel by kernel,
and where the device sits idle between them (what to attach when a bench target is missed).

    python scripts/profile_steps.py [--out DIR] [--skip 30] [--steps 5] [overrides...]

Trains as `python -m lightspeed.train <overrides>` would, as `make bench` runs it (no validation, no
checkpoints, no progress bar), profiles
`--steps` training steps after `--skip` untimed ones, and writes `trace.json` (open it in Perfetto or
chrome://tracing) and `ops.txt` (the operators by total device time, else CPU time) to --out.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from lightspeed.run.entry import compose_config
from lightspeed.speed.measure import RUN
from lightspeed.train import train


class StepProfiler(L.Callback):
    """Steps the profiler's schedule once per training batch."""

    def __init__(self, prof: profile) -> None:
        self.prof = prof

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.prof.step()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("logs/profile"))
    parser.add_argument("--skip", type=int, default=30, help="steps before the profiled ones")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps")
    args, overrides = parser.parse_known_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    total = args.skip + args.steps + 1
    cfg = compose_config(
        "train", [*overrides, *RUN, f"++trainer.max_steps={total}"], Path(tempfile.mkdtemp())
    )
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(
        activities=activities, schedule=schedule(wait=args.skip - 1, warmup=1, active=args.steps)
    ) as prof:
        train(cfg, [StepProfiler(prof)])
    prof.export_chrome_trace(str(args.out / "trace.json"))
    sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=40)
    (args.out / "ops.txt").write_text(table + "\n")
    print(table)
    print(f"profile_steps: wrote {args.out / 'trace.json'} and {args.out / 'ops.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
