"""Facts about the device a run trains on (name, memory, capability, dense peak FLOP/s, how the CPU threads
compute denormal numbers), read by doctor, the speed report and the data loaders' `auto` settings."""

from __future__ import annotations

import os

import torch

# Dense (not 2:4 sparse) peak FLOP/s from NVIDIA's data sheets, by (model, form factor) and math mode.
# Kept over Lightning's `get_available_flops`: it has no "NVIDIA H200" as the driver spells it, and 2:4-sparse
# figures for the H200 SXM (tests/test_speed.py fails when that changes).
_PEAKS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494.7e12, "fp32": 66.9e12},
    "H100 SXM": {"bf16": 989e12, "fp16": 989e12, "tf32": 494.7e12, "fp32": 66.9e12},
    "H100 NVL": {"bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12, "fp32": 60e12},
    "H100 PCIe": {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51.2e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
}


def gpu_model(name: str) -> str | None:
    """The `_PEAKS` key for a device name as the driver reports it ("NVIDIA H200", "NVIDIA H100 80GB
    HBM3", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", ...), or None for a GPU we have no figures for."""
    upper = name.upper()
    if "H100" in upper:
        return "H100 NVL" if "NVL" in upper else "H100 PCIe" if "PCIE" in upper else "H100 SXM"
    return next((model for model in ("H200", "A100") if model in upper), None)


def math_mode(precision: str, matmul_precision: str) -> str:
    """Which peak applies: what the matmuls of a run with this precision setting compute in."""
    if precision.startswith("bf16"):
        return "bf16"
    if precision.startswith("16"):
        return "fp16"
    return "fp32" if matmul_precision == "highest" else "tf32"


def peak_flops(name: str, mode: str) -> float | None:
    """Dense peak FLOP/s of one device for a math mode, None where unknown (CPUs, other GPUs)."""
    model = gpu_model(name)
    return _PEAKS[model][mode] if model else None


def cpu_count() -> int:
    """CPUs this process may use (its affinity mask), not all the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({torch.get_num_threads()} threads)"


NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def skip_repeated_cuda_probe() -> None:
    """Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1 (asking must not initialise CUDA, which a forked process
    could not use), so torch asks NVML at every question, and most optimizers ask every step
    (docs/performance.md): without a GPU, torch's own check is used instead; with one, nothing changes."""
    probes_nvml = os.environ.get(NVML_CHECK) == "1" and torch.backends.cuda.is_built()
    if probes_nvml and torch.cuda.device_count() == 0:
        os.environ[NVML_CHECK] = "0"


def can_flush() -> bool:
    """Whether this CPU can flush denormals: torch's setter, given the calling thread's mode as it is,
    changes nothing and says."""
    return torch.set_flush_denormal(count_denormals(denormals(1) * 2.0) == 0)


def thread_modes() -> str:
    """`flushed` or `exact` when all of torch's CPU pool threads compute denormals alike, else `mixed`:
    measured on a product split across threads (ATen grains of 32768 elements), denormals counted by bits."""
    n = 32768 * 2 * torch.get_num_threads()
    kept = count_denormals(denormals(n) * 2.0)
    return "flushed" if kept == 0 else "exact" if kept == n else "mixed"


def denormals(n: int) -> torch.Tensor:
    """n float32 denormals (1.5e-39), made from their bits: converting 1e-39 to float32 in a thread
    that flushes would already give 0."""
    return torch.full((n,), 1 << 20, dtype=torch.int32).view(torch.float32)


def count_denormals(t: torch.Tensor) -> int:
    """Denormal float32 values in `t`, read from their bits (exponent 0, mantissa not): a comparison
    such as `t != 0` would itself treat them as 0 in a thread that flushes."""
    bits = t.view(torch.int32)
    return int((((bits & 0x7F800000) == 0) & ((bits & 0x007FFFFF) != 0)).sum())
