"""`make bench` / `python -m lightspeed.bench`: the acceleration presets, single-knob ablations and
plain PyTorch loops on any experiment, in steady state, side by side.

    python -m lightspeed.bench [--steps 200] [--warmup auto] [--repeats 3] [--configs NAME,...|all]
                               [--out DIR] [overrides...]

Each configuration trains in its own process, `--repeats` times, in rounds (so that a drifting machine
affects every row alike): the presets as `python -m lightspeed.train`, whose `speed.json` is collected;
the `hand` rows as `lightspeed.speed.handloop`. What `bench.md` and `bench.png` show: docs/usage.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from lightspeed import CONF_DIR
from lightspeed.core import device as device_facts
from lightspeed.core.boundary import bounded
from lightspeed.report import figures
from lightspeed.speed.measure import RUN, measure, run_process
from lightspeed.speed.steady import MAX_WARMUP

# name -> (overrides, needs a CUDA GPU). Ablations add one knob to the naive baseline.
CONFIGS: dict[str, tuple[list[str], bool]] = {
    "hand+off": (["accel=off"], False),
    "hand": (["accel=default"], False),
    "hand+max": (["accel=max"], False),
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
    "tuned": (["accel=tuned"], False),  # what `make tune` wrote: conf/accel/tuned.yaml (skipped without it)
}
#: the plain loop that mirrors each preset
HAND_OF = {"off": "hand+off", "default": "hand", "max": "hand+max"}


def run_config(name: str, user: list[str], steps: int, warmup: str, run_dir: Path) -> dict:
    overrides = CONFIGS[name][0]
    if not name.startswith("hand"):
        return {"name": name, "overrides": overrides, **measure([*user, *overrides], steps, warmup, run_dir)}
    # the run's length, which its LR schedule spans: the timed steps after the longest warm-up
    length = steps + (MAX_WARMUP if warmup == "auto" else int(warmup))
    cmd = [sys.executable, "-m", "lightspeed.bench", "--hand-run", str(run_dir), "--steps", str(steps)]
    cmd += ["--warmup", warmup, *user, *overrides, *RUN, f"++trainer.max_steps={length}"]
    error = run_process(cmd, run_dir)
    speed = error or json.loads((run_dir / "speed.json").read_text())
    return {"name": name, "overrides": overrides, **speed}


# radon C: refuses what the plain loop cannot mirror (accumulation, file data), then sets each resolved knob
def hand_run(run_dir: Path, steps: int, warmup: str, overrides: list[str]) -> int:
    """One `hand` row: the config as `lightspeed.train` resolves it, then train the same net on the same
    arrays with `lightspeed.speed.handloop` (Lightning only for the DataModule's split arrays)."""
    from omegaconf import OmegaConf

    from lightspeed.data.base import on_device_choice
    from lightspeed.run import build
    from lightspeed.run.entry import compose_config
    from lightspeed.speed import accel, handloop, on_model

    cfg = compose_config("train", overrides, run_dir / "logs")
    if int(cfg.trainer.get("accumulate_grad_batches", 1)) != 1:
        return _error("the hand rows do not mirror trainer.accumulate_grad_batches: bench without it")
    accel.resolve(cfg)
    accel.apply_to_torch(cfg)  # the same process settings: matmul precision, denormals
    torch.manual_seed(cfg.seed)
    dm = build.datamodule(cfg)
    dm.setup("fit")
    if not isinstance(getattr(dm, "splits", {}).get("train"), TensorDataset):
        return _error(
            f"the hand rows slice a data set held in memory; {type(dm).__name__} reads files: bench "
            "with data.cache=true (an image folder), or with the data set the shards were made from"
        )
    x, y = dm.splits["train"].tensors
    device = accel.device_type(cfg)
    data = OmegaConf.to_container(cfg.data, resolve=True)
    need = sum(t.numel() * t.element_size() for split in dm.splits.values() for t in split.tensors)
    on_device, _ = on_device_choice(data["on_device"], need, torch.device(device))
    knobs = cfg.accel
    net = build.model(cfg, dm)
    has = {"loss": callable(getattr(net, "loss", None)), "model.optimizer": "optimizer" in cfg.model}
    lacks = [what for what, ok in has.items() if not ok]
    if lacks:
        return _error(
            "the hand rows train the module's forward with its loss(output, target) method and an "
            f"optimizer from model.optimizer; {type(net).__name__} lacks {' and '.join(lacks)}: give it "
            "that, or bench the presets alone (--configs off,default,max)"
        )
    schedule = cfg.model.get("scheduler")
    settings = handloop.Settings(
        device=device,
        batch_size=int(cfg.data.batch_size),
        optimizer=OmegaConf.to_container(cfg.model.optimizer, resolve=True),
        scheduler=OmegaConf.to_container(schedule, resolve=True) if schedule else {},  # none: a constant rate
        schedule_steps=int(cfg.trainer.max_steps),
        steps=steps,
        warmup=warmup if warmup == "auto" else int(warmup),
        precision=str(cfg.trainer.precision),
        channels_last=accel.resolve_channels_last(cfg, net),
        # as the preset does: uncompiled where the backend cannot work here
        compile=bool(knobs.compile) and on_model.compile_problem(str(knobs.compile_backend), device) is None,
        compile_mode=str(knobs.compile_mode),
        compile_backend=str(knobs.compile_backend),
        benchmark=bool(cfg.trainer.benchmark),
        on_device=on_device,
        pin_memory=bool(data["pin_memory"]),
        num_workers=int(data["num_workers"]),
        non_blocking=bool(data["non_blocking"]),
        drop_last=bool(data.get("drop_last", True)),
        gradient_clip_val=cfg.trainer.get("gradient_clip_val"),
        augment=data.get("augment") or {},
        input_scale=getattr(dm, "input_scale", None),
        seed=int(cfg.seed),
    )
    result = handloop.train(net, x, y, settings)
    result.update(
        device=device_facts.name(torch.device(device)), precision=settings.precision, data_wait_share=None
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "speed.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def summarise(runs: list[dict]) -> dict:
    """The median run by samples/s (the lower middle one of an even count: every column from one run),
    with the spread over the repeats."""
    ok = sorted((r for r in runs if "error" not in r), key=lambda r: r["samples_per_s"])
    if not ok:
        return runs[0]
    return {
        **ok[(len(ok) - 1) // 2],
        "repeats": len(ok),
        "spread": (ok[0]["samples_per_s"], ok[-1]["samples_per_s"]),
    }


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def _memory_and_warmup(r: dict[str, Any]) -> tuple[str, str]:
    """A row's peak memory (the device's where measured, else the process's) and its warm-up, in words."""
    if r.get("peak_allocated_gib") is not None:
        memory = f"{r['peak_allocated_gib']:.2f} GiB on device"
    else:
        memory = _fmt(r.get("peak_rss_gib"), ".2f", " GiB RSS")
    seconds = f", {r['warmup_seconds']:.1f} s" if r.get("warmup_seconds") is not None else ""
    return memory, f"{r['warmup_steps']} steps{seconds}"


def write_markdown(rows: list[dict], skipped: list[str], header: str, path: Path) -> None:
    by_name = {r["name"]: r for r in rows if "error" not in r}
    base = by_name.get("off", {}).get("samples_per_s")
    lines = [
        f"# Lightspeed bench\n\n{header}\n",
        "| config | knobs | samples/s (median) | spread | vs off | vs hand loop | step median / mean "
        "| warm-up | recompiles | data wait | peak memory | final loss |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        knobs = " ".join(f"`{o}`" for o in r["overrides"])
        if "error" in r:
            lines.append(f"| {r['name']} | {knobs} | failed: {r['error']} |" + " |" * 9)
            continue
        sps = r["samples_per_s"]
        hand = by_name.get(HAND_OF.get(r["name"], ""), {}).get("samples_per_s")
        memory, warm = _memory_and_warmup(r)
        lo, hi = r.get("spread", (sps, sps))
        lines.append(
            f"| {r['name']} | {knobs} | {sps:,.0f} | {lo:,.0f}-{hi:,.0f} ({r.get('repeats', 1)}x) "
            f"| {_fmt(sps / base if base else None, '.2f', 'x')} "
            f"| {_fmt(sps / hand if hand else None, '.2f', 'x')} "
            f"| {_fmt(r.get('step_ms_median'), '.2f')} / {_fmt(r.get('step_ms_mean'), '.2f')} ms | {warm} "
            f"| {r.get('recompiles', '-')} | {_fmt(r.get('data_wait_share'), '.1%')} | {memory} "
            f"| {_fmt(r.get('final_loss'), '.4f')} |"
        )
    lines.append(
        "\n`vs hand loop`: against the plain PyTorch loop with the same knobs and data path "
        "(`hand` for default, `hand+off`, `hand+max`). Step times are the host's cadence; samples/s is "
        "exact (the device is synchronised where the timed window starts and ends)."
    )
    if skipped:
        lines.append(f"\nSkipped: {', '.join(skipped)}.")
    path.write_text("\n".join(lines) + "\n")


def write_chart(rows: list[dict], title: str, path: Path) -> None:
    if (plt := figures.pyplot(path, print)) is None:
        return
    ok = [r for r in rows if "error" not in r]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(ok) + 1.2))
    names = [r["name"] for r in ok][::-1]
    values = [r["samples_per_s"] for r in ok][::-1]
    colors = ["#999999" if n.startswith("hand") else "#3b7dd8" for n in names]
    bars = ax.barh(names, values, color=colors)
    ax.bar_label(bars, fmt="{:,.0f}", padding=3, fontsize=8)
    ax.margins(x=0.15)
    ax.set_xlabel("samples/s, median of the repeats (higher is better; grey: plain PyTorch loops)")
    ax.set_title(textwrap.fill(title, 90), fontsize=8)
    fig.tight_layout()
    figures.save(fig, path, dpi=120)


def _arguments(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="lightspeed-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed training steps per run")
    parser.add_argument(
        "--warmup", default="auto", help="untimed steps first, or auto: until the step time settles"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration")
    parser.add_argument("--configs", default="all", help=f"comma-separated, from: {', '.join(CONFIGS)}")
    parser.add_argument("--out", type=Path, help="default: logs/bench/<timestamp>")
    parser.add_argument("--hand-run", type=Path, help=argparse.SUPPRESS)  # one hand row, in its process
    return parser.parse_known_args(argv)


def _refused(args: argparse.Namespace, names: list[str]) -> str | None:
    """What is wrong with the arguments, in one line, or None."""
    if args.warmup != "auto" and not args.warmup.isdigit():
        return f"--warmup {args.warmup}: use auto or a number of steps"
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        return f"--configs {','.join(unknown)}: unknown; use any of {', '.join(CONFIGS)}"
    if args.steps < 1 or args.repeats < 1:
        return "--steps and --repeats must be at least 1"
    return None


# radon C: rounds x configs; GPU-only skips; warm-up/override wording
def _rounds(
    args: argparse.Namespace, names: list[str], user: list[str], out: Path
) -> tuple[list[dict[str, Any]], str]:
    """`args.repeats` rounds of every configuration this machine can run; the table is rewritten after
    every configuration's run, so that a bench stopped early (a GPU lease's time limit) still leaves every
    run finished so far. Returns its rows and header."""
    why = {n: "needs a CUDA GPU" for n in names if CONFIGS[n][1] and not torch.cuda.is_available()}
    if "tuned" in names and not (CONF_DIR / "accel" / "tuned.yaml").is_file():
        why["tuned"] = "no conf/accel/tuned.yaml: make tune writes it"
    skipped = [f"{n} ({reason})" for n, reason in why.items()]
    todo = [n for n in names if n not in why]
    runs: dict[str, list[dict]] = {n: [] for n in todo}
    warm = "auto (until the step time settles)" if args.warmup == "auto" else args.warmup
    rows: list[dict[str, Any]] = []
    header = ""
    for repeat in range(args.repeats):
        for name in todo:
            print(f"bench: {name} ({repeat + 1}/{args.repeats}) ...", end=" ", flush=True)
            start = time.perf_counter()
            runs[name].append(
                run_config(name, user, args.steps, args.warmup, out / "runs" / f"{name}-{repeat}")
            )
            print(f"{time.perf_counter() - start:.0f} s", flush=True)
            rows = [summarise(runs[n]) for n in todo if runs[n]]
            device = next((r["device"] for r in rows if "device" in r), "unknown device")
            header = (
                f"{time.strftime('%Y-%m-%d')}, {device}, torch {torch.__version__}; {args.steps} timed steps "
                f"per run after a warm-up of {warm} steps, round {repeat + 1} of {args.repeats}; "
                f"overrides: {' '.join(user) or '(none)'}"
            )
            write_markdown(rows, skipped, header, out / "bench.md")
    return rows, header


@bounded("bench")
def main(argv: list[str] | None = None) -> int:
    args, user = _arguments(argv)
    names = list(CONFIGS) if args.configs == "all" else args.configs.split(",")
    refused = _refused(args, names if args.hand_run is None else [])
    if refused:
        return _error(refused)
    if args.hand_run is not None:
        return hand_run(args.hand_run, args.steps, args.warmup, user)
    out = args.out or Path("logs") / "bench" / time.strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    rows, header = _rounds(args, names, user, out)
    try:
        write_chart(rows, header, out / "bench.png")
    except ImportError:
        print("bench: no bench.png: matplotlib is missing (pip install -e '.[bench]')", file=sys.stderr)
    print((out / "bench.md").read_text())
    print(f"bench: wrote {out / 'bench.md'} and {out / 'bench.png'}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
