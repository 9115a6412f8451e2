"""`make doctor` / `python -m lightspeed.doctor`: what this machine can do for training, measured.

    python -m lightspeed.doctor [--json PATH] [--require-gpu] [--quick]

What it measures: docs/usage.md. JSON keys: python, platform, torch, lightning, cuda_build, cudnn, nccl,
driver, nvidia_device_present, cuda_available, container, gpus, cpu_cores, recommended_num_workers,
compile_backend_ok, compile_problem, h2d_gbps, matmul_tflops, warnings. Exits 0; 1 with --require-gpu and
no usable CUDA GPU."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning
import torch
from rich.console import Console
from rich.table import Table

from lightspeed.core.boundary import bounded
from lightspeed.core.device import cpu_count
from lightspeed.speed.accel import auto_num_workers
from lightspeed.speed.on_model import compile_problem

# Oldest Linux driver for each CUDA major version of torch's build (CUDA's minor-version compatibility).
MIN_DRIVER = {11: 450, 12: 525, 13: 580}


def _driver_version() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _container() -> dict[str, Any] | None:
    """Inside Docker (or Podman): which CUDA the image carries (NVIDIA's images say it in CUDA_VERSION;
    torch's wheel brings its own runtime, so the host's driver is what must be new enough). None outside."""
    if not (Path("/.dockerenv").exists() or Path("/run/.containerenv").exists()):
        return None
    return {"image_cuda": os.environ.get("CUDA_VERSION")}


def driver_verdict(f: dict[str, Any]) -> str:
    """Whether the driver here can run torch's CUDA build, in words."""
    if not f["cuda_build"]:
        return f["driver"] or "no nvidia-smi"
    need = MIN_DRIVER.get(int(f["cuda_build"].split(".")[0]))
    if not f["driver"]:
        where = "the host's NVIDIA driver is not visible here" if f.get("container") else "no nvidia-smi"
        return f"{where} (torch's CUDA {f['cuda_build']} build needs >= {need or '?'})"
    if need is None:
        return f"{f['driver']} (no minimum known for CUDA {f['cuda_build']})"
    can = "can" if int(f["driver"].split(".")[0]) >= need else "cannot"
    return f"{f['driver']}: {can} run torch's CUDA {f['cuda_build']} build (needs >= {need})"


def _gpu(index: int) -> dict[str, Any]:
    p = torch.cuda.get_device_properties(index)
    return {
        "name": p.name,
        "memory_gib": round(p.total_memory / 2**30, 1),
        "capability": f"{p.major}.{p.minor}",
        "multiprocessors": p.multi_processor_count,
        "bf16": p.major >= 8,  # bf16 tensor cores: Ampere and newer
        "tf32": p.major >= 8,
    }


def _best_seconds(fn: Any, repeats: int, sync: bool) -> float:
    best = float("inf")
    for _ in range(repeats):
        if sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def h2d_bandwidth(mib: int = 256) -> dict[str, float]:
    """GB/s of a host-to-device copy from pageable and from pinned memory (best of 5)."""
    pageable = torch.empty(mib * 2**20, dtype=torch.uint8)
    pinned = pageable.pin_memory()
    dest = torch.empty_like(pageable, device="cuda")
    out = {}
    for label, src in (("pageable", pageable), ("pinned", pinned)):
        dest.copy_(src, non_blocking=True)  # warm-up
        seconds = _best_seconds(lambda src=src: dest.copy_(src, non_blocking=True), 5, sync=True)
        out[label] = round(src.numel() / seconds / 1e9, 1)
    return out


def matmul_tflops(device: str, quick: bool) -> dict[str, float | None]:
    """TFLOP/s of a square matmul (n=8192 on a GPU, 1024 on a CPU), fp32 and bf16, best of 5."""
    n = (4096 if quick else 8192) if device == "cuda" else 1024
    out: dict[str, float | None] = {}
    for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        try:
            a = torch.randn(n, n, device=device, dtype=dtype)
            b = torch.randn(n, n, device=device, dtype=dtype)
            a @ b  # warm-up
            seconds = _best_seconds(lambda a=a, b=b: a @ b, 3 if quick else 5, sync=device == "cuda")
            out[label] = round(2 * n**3 / seconds / 1e12, 2)
        except RuntimeError:  # e.g. bf16 matmul unsupported on this device
            out[label] = None
    return out


def collect(quick: bool = False) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    gpus = [_gpu(i) for i in range(torch.cuda.device_count())] if cuda else []
    cpus = cpu_count()
    device = "cuda" if cuda else "cpu"
    problem = compile_problem("inductor", device)
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "cuda_build": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "driver": _driver_version(),
        "nvidia_device_present": Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None,
        "cuda_available": cuda,
        "container": _container(),
        "gpus": gpus,
        "cpu_cores": cpus,
        "recommended_num_workers": auto_num_workers(max(1, len(gpus)), device),
        "compile_backend_ok": problem is None,
        "compile_problem": problem,
        "h2d_gbps": h2d_bandwidth(64 if quick else 256) if cuda else None,
        "matmul_tflops": matmul_tflops(device, quick),
    }
    facts["warnings"] = diagnose(facts)
    return facts


# radon C: note per problem: CUDA/driver/pinning/compile/bf16
def diagnose(f: dict[str, Any]) -> list[str]:
    """Problems a person can fix, each with the fix."""
    notes = []
    if f["nvidia_device_present"] and not f["cuda_available"]:
        if f["cuda_build"] is None:
            notes.append(
                f"an NVIDIA device is present but torch {f['torch']} is a CPU build: reinstall torch "
                "with CUDA (`rm -rf .venv && make install`, TORCH=torch)"
            )
        else:
            notes.append(
                f"an NVIDIA device is present but CUDA is unavailable to torch (CUDA {f['cuda_build']} "
                f"build, driver {f['driver'] or 'unknown'}): check `nvidia-smi`, CUDA_VISIBLE_DEVICES, "
                "and that the driver is loaded"
            )
    if f["driver"] and f["cuda_build"]:
        need = MIN_DRIVER.get(int(f["cuda_build"].split(".")[0]))
        have = int(f["driver"].split(".")[0])
        if need and have < need:
            notes.append(
                f"driver {f['driver']} is too old for torch's CUDA {f['cuda_build']} build (needs >= "
                f"{need}): update the NVIDIA driver, or install a torch built for an older CUDA"
            )
    if f.get("container") is not None and f["cuda_build"] and not f["driver"]:
        notes.append(
            "in a container without the host's NVIDIA driver: start it with `--gpus all` on a host with the "
            "NVIDIA Container Toolkit (make docker-train does where Docker lists NVIDIA's runtime) to train "
            "on the GPU; without it the container sees no GPU"
        )
    bw = f.get("h2d_gbps")
    if bw and bw["pinned"] < 1.1 * bw["pageable"]:
        notes.append(
            f"pinned host-to-device copies ({bw['pinned']} GB/s) are no faster than pageable ones "
            f"({bw['pageable']} GB/s): data.pin_memory gains nothing here; keep the data on the device "
            "(data.on_device=auto) if it fits"
        )
    if not f["compile_backend_ok"]:
        notes.append(
            f"torch.compile does not work here ({f['compile_problem']}): accel.compile=true will train "
            "uncompiled; install a C++ compiler (CPU) or Triton (GPU)"
        )
    mm = f["matmul_tflops"]
    if not f["cuda_available"] and mm["bf16"] and mm["fp32"] and mm["bf16"] < mm["fp32"]:
        notes.append(
            f"bf16 matmuls run at {mm['bf16'] / mm['fp32']:.0%} of fp32 speed on this CPU: keep "
            "trainer.precision=32-true here (precision=auto does)"
        )
    for gpu in f["gpus"]:
        if not gpu["bf16"]:
            notes.append(
                f"{gpu['name']} has no bf16 tensor cores: precision=auto picks 16-mixed (loss scaling)"
            )
    return notes


# radon C: optional rows: GPUs, bandwidth, warnings
def render(f: dict[str, Any], console: Console) -> None:
    table = Table(title="Lightspeed doctor", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    table.add_row("python / torch / lightning", f"{f['python']} / {f['torch']} / {f['lightning']}")
    table.add_row(
        "CUDA build / cuDNN / NCCL",
        f"{f['cuda_build'] or 'none (CPU build)'} / {f['cudnn'] or '-'} / {f['nccl'] or '-'}",
    )
    table.add_row("driver", driver_verdict(f))
    if f.get("container") is not None:
        cuda = f["container"]["image_cuda"]
        table.add_row(
            "container", f"yes; the image carries CUDA {cuda}" if cuda else "yes; no CUDA in the image"
        )
    for i, g in enumerate(f["gpus"]):
        table.add_row(
            f"GPU {i}",
            f"{g['name']}, {g['memory_gib']} GiB, compute capability {g['capability']}, "
            f"{g['multiprocessors']} SMs, bf16 {'yes' if g['bf16'] else 'no'}, "
            f"TF32 {'yes' if g['tf32'] else 'no'}",
        )
    if not f["gpus"]:
        table.add_row("GPU", "none usable: training runs on the CPU, and the GPU knobs are no-ops")
    table.add_row(
        "CPU", f"{f['cpu_cores']} cores; data.num_workers=auto picks {f['recommended_num_workers']}"
    )
    table.add_row("torch.compile", "works" if f["compile_backend_ok"] else f"fails: {f['compile_problem']}")
    if f["h2d_gbps"]:
        table.add_row(
            "host -> device",
            f"{f['h2d_gbps']['pageable']} GB/s pageable, {f['h2d_gbps']['pinned']} GB/s pinned",
        )
    mm = f["matmul_tflops"]
    table.add_row("matmul", f"fp32 {mm['fp32']} TFLOP/s, bf16 {mm['bf16']} TFLOP/s")
    console.print(table)
    for note in f["warnings"]:
        console.print(f"[yellow]warning:[/] {note}")
    if not f["warnings"]:
        console.print("no problems found")


@bounded("doctor")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lightspeed-doctor", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--json", type=Path, help="also write the facts as JSON to this file ('-': stdout only)"
    )
    parser.add_argument("--require-gpu", action="store_true", help="exit 1 when no CUDA GPU is usable")
    parser.add_argument("--quick", action="store_true", help="smaller measurements")
    args = parser.parse_args(argv)
    facts = collect(args.quick)
    if str(args.json) == "-":
        print(json.dumps(facts, indent=2))
    else:
        render(facts, Console())
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(facts, indent=2) + "\n")
    if args.require_gpu and not facts["cuda_available"]:
        print("error: --require-gpu: torch sees no CUDA GPU (see the warnings above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
