"""`make bench` / `python -m lightspeed.bench`: the acceleration presets and single-knob ablations on
any experiment, a bounded number of steps each, side by side.

    python -m lightspeed.bench [--steps 60] [--warmup 10] [--configs all|NAME,...] [--out DIR] [overrides...]

Each configuration trains in its own process (`python -m lightspeed.train <overrides> <its knobs>`),
its speed report (`speed.json`) is collected, and `bench.md` (config, samples/s, speed-up against
`off`, data wait, peak memory, final loss) and `bench.png` (a bar chart) are written to --out
(default logs/bench/<timestamp>). On a CPU the GPU-only knobs are skipped, and listed as such.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

# name -> (overrides, needs a CUDA GPU). Ablations add one knob to the naive baseline.
CONFIGS: dict[str, tuple[list[str], bool]] = {
    "off": (["accel=off"], False),
    "default": (["accel=default"], False),
    "max": (["accel=max"], False),
    "off+bf16": (["accel=off", "trainer.precision=bf16-mixed"], False),
    "off+tf32": (["accel=off", "accel.matmul_precision=high"], True),
    "off+cudnn_benchmark": (["accel=off", "trainer.benchmark=true"], True),
    "off+pinned_async": (["accel=off", "data.pin_memory=true", "data.non_blocking=true"], True),
    "off+workers": (["accel=off", "data.num_workers=2", "data.persistent_workers=true"], False),
    "off+on_device": (["accel=off", "data.on_device=true"], False),
    "off+channels_last": (["accel=off", "accel.channels_last=true"], False),
    "off+fused": (["accel=off", "accel.optimizer_impl=fused"], False),
    # denormals appear after ~750 steps: a shorter bench shows the knob's cost, not its gain
    "off+flush_denormal": (["accel=off", "accel.flush_denormal=true"], False),
    "off+compile": (["accel=off", "accel.compile=true"], False),
}

# What every bench run shares: bounded steps, no validation, no checkpoints, no progress bar.
RUN = [
    "++trainer.max_epochs=-1",
    "++trainer.limit_val_batches=0",
    "trainer.num_sanity_val_steps=0",
    "logger=none",
    "test_after_fit=false",
    "++callbacks.model_checkpoint=null",
    "++callbacks.early_stopping=null",
    "++callbacks.rich_progress_bar=null",
    "++callbacks.lr_monitor=null",
    "++trainer.enable_progress_bar=false",
    "++trainer.enable_checkpointing=false",
    "++callbacks.speed_report._target_=lightspeed.callbacks.SpeedReport",
]


def run_config(name: str, overrides: list[str], user: list[str], steps: int, warmup: int, out: Path) -> dict:
    run_dir = out / "runs" / name
    cmd = [
        sys.executable,
        "-m",
        "lightspeed.train",
        *user,
        *overrides,
        *RUN,
        f"++trainer.max_steps={steps}",
        f"++callbacks.speed_report.warmup_steps={warmup}",
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "runs" / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"name": name, "overrides": overrides, "error": last}
    speed = json.loads((run_dir / "speed.json").read_text())
    metrics = json.loads((run_dir / "summary.json").read_text())["metrics"]
    return {"name": name, "overrides": overrides, **speed, "final_loss": metrics.get("train/loss")}


def write_markdown(rows: list[dict], skipped: list[str], header: str, path: Path) -> None:
    base = next((r["samples_per_s"] for r in rows if r["name"] == "off" and "error" not in r), None)
    lines = [
        f"# Lightspeed bench\n\n{header}\n",
        "| config | knobs | samples/s | vs off | data wait | peak memory | final loss |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        knobs = " ".join(f"`{o}`" for o in r["overrides"])
        if "error" in r:
            lines.append(f"| {r['name']} | {knobs} | failed: {r['error']} | | | | |")
            continue
        memory = (
            f"{r['peak_allocated_gib']:.2f} GiB on device"
            if r.get("peak_allocated_gib") is not None
            else f"{r['peak_rss_gib']:.2f} GiB RSS"
        )
        speedup = f"{r['samples_per_s'] / base:.2f}x" if base else "-"
        loss = f"{r['final_loss']:.4f}" if r["final_loss"] is not None else "-"
        lines.append(
            f"| {r['name']} | {knobs} | {r['samples_per_s']:,.0f} | {speedup} "
            f"| {r['data_wait_share']:.1%} | {memory} | {loss} |"
        )
    if skipped:
        lines.append(f"\nSkipped (they need a CUDA GPU): {', '.join(skipped)}.")
    path.write_text("\n".join(lines) + "\n")


def write_chart(rows: list[dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "error" not in r]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(ok) + 1.2))
    bars = ax.barh([r["name"] for r in ok][::-1], [r["samples_per_s"] for r in ok][::-1], color="#3b7dd8")
    ax.bar_label(bars, fmt="{:,.0f}", padding=3, fontsize=8)
    ax.margins(x=0.15)
    ax.set_xlabel("samples/s (higher is better)")
    ax.set_title(textwrap.fill(title, 90), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lightspeed-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps per configuration")
    parser.add_argument("--warmup", type=int, default=10, help="of which not timed")
    parser.add_argument("--configs", default="all", help=f"comma-separated, from: {', '.join(CONFIGS)}")
    parser.add_argument("--out", type=Path, help="default: logs/bench/<timestamp>")
    args, user = parser.parse_known_args(argv)
    names = list(CONFIGS) if args.configs == "all" else args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        print(
            f"error: --configs {','.join(unknown)}: unknown; use any of {', '.join(CONFIGS)}", file=sys.stderr
        )
        return 2
    if args.warmup >= args.steps:
        print(f"error: --warmup {args.warmup} leaves no timed step of --steps {args.steps}", file=sys.stderr)
        return 2
    out = args.out or Path("logs") / "bench" / time.strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    skipped = [n for n in names if CONFIGS[n][1] and not cuda]
    rows = []
    for name in names:
        if name in skipped:
            continue
        print(f"bench: {name} ...", flush=True)
        rows.append(run_config(name, CONFIGS[name][0], user, args.steps, args.warmup, out))
    device = next((r["device"] for r in rows if "device" in r), "unknown device")
    header = (
        f"{time.strftime('%Y-%m-%d')}, {device}, torch {torch.__version__}; {args.steps} steps per config, "
        f"the first {args.warmup} not timed; overrides: {' '.join(user) or '(none)'}"
    )
    write_markdown(rows, skipped, header, out / "bench.md")
    try:
        write_chart(rows, header, out / "bench.png")
    except ImportError:
        print("bench: no bench.png: matplotlib is missing (pip install -e '.[bench]')", file=sys.stderr)
    print((out / "bench.md").read_text())
    print(f"bench: wrote {out / 'bench.md'} and {out / 'bench.png'}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
