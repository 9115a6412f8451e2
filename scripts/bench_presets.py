"""Each acceleration preset on CIFAR-shaped synthetic data with the small ResNet: samples/s and peak
memory. Meant for a GPU (`scripts/gpu_check.sh`); runs on a CPU too, slowly.

    python scripts/bench_presets.py [--steps 300] [--warmup 50] [--presets off,default,max] [overrides...]

Steady state only: the first `--warmup` steps (compilation, cuDNN autotuning, worker start-up) are not
timed. Each preset runs in its own process, so that one's global state cannot help another.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

BASE = [
    "data=synthetic",
    "model=resnet",
    "data.num_samples=50000",
    "data.batch_size=512",
    "logger=none",
    "callbacks=none",
    "+trainer.enable_progress_bar=false",
    "+trainer.enable_model_summary=false",
    "+trainer.enable_checkpointing=false",
    "trainer.num_sanity_val_steps=0",
    "+trainer.limit_val_batches=0",
    "test_after_fit=false",
    "trainer.max_epochs=-1",
]


class Timer(L.Callback):
    """Wall time of steps warmup..end, with one device sync at each end of the window (none between)."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.samples, self.seconds = warmup, 0.0, 0, 0.0

    def _sync(self, trainer: L.Trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int
    ) -> None:
        if trainer.global_step == self.warmup:
            self._sync(trainer)
            if trainer.strategy.root_device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            self.start = time.perf_counter()
        if trainer.global_step >= self.warmup:
            self.samples += len(batch[0])

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync(trainer)
        self.seconds = time.perf_counter() - self.start


def run_one(preset: str, steps: int, warmup: int, overrides: list[str], out: Path) -> None:
    from lightspeed.entry import compose_config
    from lightspeed.train import train

    timer = Timer(warmup)
    with tempfile.TemporaryDirectory() as logs:
        cfg = compose_config(
            "train", [*BASE, f"accel={preset}", f"+trainer.max_steps={steps}", *overrides], Path(logs)
        )
        result = train(cfg, [timer])
    cuda = result.trainer.strategy.root_device.type == "cuda"
    facts = {
        "preset": preset,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "precision": str(cfg.trainer.precision),
        "steps_timed": steps - warmup,
        "samples_per_s": timer.samples / timer.seconds,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "loader": type(result.trainer.train_dataloader).__name__,
    }
    out.write_text(json.dumps(facts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--presets", default="off,default,max")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one preset, write JSON here
    args, overrides = parser.parse_known_args()
    if args.one:
        run_one(args.presets, args.steps, args.warmup, overrides, Path(args.one))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            out = Path(tmp) / f"{preset}.json"
            cmd = [
                sys.executable,
                __file__,
                "--one",
                str(out),
                "--presets",
                preset,
                "--steps",
                str(args.steps),
                "--warmup",
                str(args.warmup),
                *overrides,
            ]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            rows.append(json.loads(out.read_text()))
    base = rows[0]["samples_per_s"]
    print(
        f"{rows[0]['device']}, torch {torch.__version__}, resnet on 3x32x32 synthetic, "
        f"{args.steps - args.warmup} timed steps after {args.warmup}\n"
    )
    print(
        "| preset | precision | loader | samples/s | vs first "
        "| peak allocated GiB | peak reserved GiB | peak RSS GiB |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        alloc = f"{r['peak_allocated_gib']:.2f}" if r["peak_allocated_gib"] is not None else "-"
        reserved = f"{r['peak_reserved_gib']:.2f}" if r["peak_reserved_gib"] is not None else "-"
        print(
            f"| {r['preset']} | {r['precision']} | {r['loader']} | {r['samples_per_s']:,.0f} "
            f"| {r['samples_per_s'] / base:.2f}x | {alloc} | {reserved} | {r['peak_rss_gib']:.2f} |"
        )


if __name__ == "__main__":
    main()
