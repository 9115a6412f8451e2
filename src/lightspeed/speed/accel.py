"""The acceleration knobs: `auto` values resolved for the device this run trains on (those under `trainer.`
and `data.` too, where their library reads them), then the `accel.` ones applied to torch and the model.
A knob that cannot help on this device becomes a no-op, and one info line lists every such knob."""

from __future__ import annotations

import inspect

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from omegaconf import DictConfig, OmegaConf, open_dict

from lightspeed.compat.trainer import unified_precision
from lightspeed.core.config import ConfigError, first_line
from lightspeed.core.device import can_flush, cpu_count, skip_repeated_cuda_probe, thread_modes
from lightspeed.core.schema import SCHEMA

#: The loader settings an accel preset sets under `data.` (where the DataModule's constructor reads them).
LOADER_KNOBS = tuple(k.removeprefix("data.") for k, key in SCHEMA.items() if key.loader)


def auto_num_workers(devices_per_node: int, device_type: str = "cuda") -> int:
    """Loader workers per device: on a GPU the usable CPUs shared among devices, one kept for training, at
    most 8; on a CPU none (they would take the computation's cores; slicing in-memory tensors is cheap)."""
    if device_type != "cuda":
        return 0
    return max(0, min(8, cpu_count() // max(1, devices_per_node) - 1))


def devices_per_node(cfg: DictConfig) -> int:
    """The processes this run starts on each machine: `trainer.devices` as a count, a list, or -1/auto
    (every visible GPU)."""
    devices = cfg.trainer.get("devices", 1)
    if isinstance(devices, int) and devices > 0:
        return devices
    if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices):
        return len(devices)
    return max(1, torch.cuda.device_count()) if device_type(cfg) == "cuda" else 1


def device_type(cfg: DictConfig) -> str:
    """`cuda`, `mps` or `cpu`: where `trainer.accelerator` will put this run."""
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return "cuda"
    if accelerator == "mps" or (accelerator == "auto" and torch.backends.mps.is_available()):
        return "mps"
    return "cpu"


def auto_precision(device: str) -> str:
    """bf16 autocast where the GPU has bf16 units (Ampere and newer), else fp16 autocast with loss
    scaling; fp32 elsewhere (CPU autocast is rarely faster, and has no loss scaling)."""
    if device == "cuda":
        # including_emulation=False: pre-Ampere GPUs emulate bf16, slowly
        return "bf16-mixed" if torch.cuda.is_bf16_supported(including_emulation=False) else "16-mixed"
    return "32-true"


def resolve(cfg: DictConfig) -> list[str]:
    """Replace every `auto` knob in `cfg` by its value for this device, in place. Return the knobs that
    were set explicitly but cannot take effect here (they are switched off, or left harmlessly set)."""
    device = device_type(cfg)
    with open_dict(cfg):
        idle = _resolve_trainer(cfg.trainer, device) + _resolve_loader(cfg, device)
        idle += _resolve_optimizer_impl(cfg, device)
        idle += _resolve_flush_denormal(cfg, device)
    return idle


def _resolve_trainer(trainer: DictConfig, device: str) -> list[str]:
    """`trainer.precision` (auto: the device's best; Lightning's legacy names as its unified ones) and
    `trainer.benchmark` (auto: on CUDA unless deterministic; autotuning picks kernels by timing)."""
    if trainer.get("precision") == "auto":
        trainer.precision = auto_precision(device)
    elif trainer.get("precision") is not None:  # Lightning's legacy 16, 32, "bf16": its own names
        try:
            trainer.precision = unified_precision(trainer.precision)
        except ValueError as err:  # Lightning's refusal, which lists the names it takes
            raise ConfigError(f"trainer.precision={trainer.precision!r}: {first_line(err)}") from None
    if trainer.get("benchmark") == "auto":
        trainer.benchmark = device == "cuda" and not trainer.get("deterministic")
    elif trainer.get("benchmark") is True and device != "cuda":
        return ["trainer.benchmark=true"]  # only sets a cuDNN flag: harmless, kept
    return []


def _resolve_loader(cfg: DictConfig, device: str) -> list[str]:
    """The DataLoader knobs under `data.`: workers for this machine, pinned memory and non-blocking copies
    on CUDA only."""
    data, cuda, idle = cfg.data, device == "cuda", []
    if data.get("num_workers") == "auto":
        data.num_workers = auto_num_workers(devices_per_node(cfg), device)
    elif data.get("on_device") == "auto" and int(data.get("num_workers") or 0) > 0:
        # decided here, where workers asked for by number still differ from the ones `auto` picks
        data.on_device = False
        rank_zero_info(f"data.on_device=auto: data.num_workers={data.num_workers} asks for a DataLoader")
    for key in ("pin_memory", "non_blocking"):
        if data.get(key) == "auto":
            data[key] = cuda
        elif data.get(key) is True and not cuda:
            idle.append(f"data.{key}=true")
            data[key] = False  # pinning without CUDA only earns a warning from the DataLoader
    return idle


def _resolve_flush_denormal(cfg: DictConfig, device: str) -> list[str]:
    """`accel.flush_denormal`: auto is on for CPU runs where the CPU can flush; true where it cannot
    is switched off with a note."""
    knobs = cfg.get("accel")
    wanted = None if knobs is None else knobs.get("flush_denormal")
    if wanted == "auto":
        knobs.flush_denormal = device == "cpu" and can_flush()
    elif wanted is True and not can_flush():
        knobs.flush_denormal = False
        return ["accel.flush_denormal=true (this CPU cannot flush denormals)"]
    return []


def _resolve_optimizer_impl(cfg: DictConfig, device: str) -> list[str]:
    """`accel.optimizer_impl`: fused, foreach, loop, torch (foreach on CUDA, loop on the CPU) or auto: fused
    on the CPU, where torch's loop spends most of a small model's optimizer step in Python (3-7x slower,
    docs/performance.md), torch elsewhere."""
    impl = str(cfg.get("accel", {}).get("optimizer_impl", "torch"))
    opt = _named_optimizer(cfg)
    if impl == "torch" or opt is None:
        unasked = impl in ("torch", "auto") or "model" not in cfg  # eval builds no optimizer
        return (
            [] if unasked else [f"accel.optimizer_impl={impl} (model.optimizer names no torch.optim class)"]
        )
    opt_cls = getattr(torch.optim, str(opt.name), None)
    params = set(inspect.signature(opt_cls).parameters) if isinstance(opt_cls, type) else set()
    if impl != "auto":
        return _set_optimizer_impl(opt, impl, params, cfg.trainer, explicit=True)
    if device != "cpu" or "fused" not in params or {"fused", "foreach"} & set(opt):
        return []  # the config's own fused/foreach keys win over auto
    return _set_optimizer_impl(opt, "fused", params, cfg.trainer, explicit=False)


def _named_optimizer(cfg: DictConfig) -> DictConfig | None:
    """The model's optimizer node where it names a torch.optim class (`name:`); a module of your own may
    make its own."""
    model = cfg.get("model")
    opt = model.get("optimizer") if OmegaConf.is_dict(model) else None
    return opt if OmegaConf.is_dict(opt) and "name" in opt else None


def _set_optimizer_impl(
    opt: DictConfig, impl: str, params: set[str], trainer: DictConfig, explicit: bool
) -> list[str]:
    """The optimizer node's `fused`/`foreach` flag for `impl`, where its class takes it (`params`)."""
    flag = "fused" if impl == "fused" else "foreach"
    if flag not in params:
        return [f"accel.optimizer_impl={impl} (torch.optim.{opt.name} has no {flag} option)"]
    if impl == "fused" and trainer.get("gradient_clip_val") and "mixed" in str(trainer.precision):
        # Lightning cannot unscale gradients for clipping inside a fused step: use foreach instead
        opt["foreach"] = True
        note = f"accel.optimizer_impl=fused (with gradient clipping and {trainer.precision}: foreach)"
        return [note] if explicit else []
    opt[flag] = impl != "loop"
    return []


def report_idle(idle: list[str], device: str) -> None:
    if idle:
        rank_zero_info(f"{device} run: no effect here, so left off: {'; '.join(idle)}")


def apply_to_torch(cfg: DictConfig) -> None:
    """Process-wide settings: float32 matmul precision ("high" lets CUDA use TF32 tensor cores), torch's
    CPU threads, the CPU's denormal mode, and no NVML query per optimizer step where there is no GPU."""
    knobs = cfg.get("accel", {})
    torch.set_float32_matmul_precision(str(knobs.get("matmul_precision", "highest")))
    if knobs.get("threads", "auto") != "auto":
        torch.set_num_threads(int(knobs.threads))
    skip_repeated_cuda_probe()
    _flush_denormal(bool(knobs.get("flush_denormal", False)))


def _flush_denormal(flush: bool) -> None:
    """`accel.flush_denormal`: compute values below 1.2e-38 as zero on the CPU, which computes them many times
    slower (docs/usage.md). The mode is per thread, copied by torch's pool threads at their start: if they
    started earlier with the other mode (a notebook, a hydra -m sweep), the run keeps theirs, and says so."""
    torch.set_flush_denormal(flush)  # `resolve` turned true off where the CPU cannot flush
    if thread_modes() == ("flushed" if flush else "exact"):
        return
    torch.set_flush_denormal(not flush)
    rank_zero_info(
        f"accel.flush_denormal={str(flush).lower()} cannot take effect in this process: torch's CPU threads "
        f"started earlier with denormals {'computed exactly' if flush else 'flushed'}, and this run keeps "
        "that; start it in a fresh process (a hydra -m sweep runs its jobs in one)"
        + (", or call torch.set_flush_denormal(True) before any torch work" if flush else "")
    )


def resolve_channels_last(cfg: DictConfig, model: torch.nn.Module) -> bool:
    """`accel.channels_last`, `auto` resolved for this model (not written back: the config is read-only once
    the model is built): on for a CUDA run of a net with 2-D convolutions (cuDNN's NHWC kernels use the tensor
    cores, docs/acceleration.md); off elsewhere (a CPU's NCHW kernels are the tuned ones; an MLP would only
    pay a layout copy per batch)."""
    accel = cfg.get("accel")
    wanted = accel.get("channels_last", False) if accel is not None else False
    if wanted == "auto":
        convs = any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
        wanted = device_type(cfg) == "cuda" and convs
        if wanted:
            rank_zero_info("accel.channels_last=auto: on (a CUDA run of a net with 2-D convolutions)")
    return bool(wanted)


def apply_to_model(cfg: DictConfig, model: L.LightningModule) -> None:
    """channels_last for the weights and the forward's inputs; torch.compile of the forward. Asks nothing of
    the module but that its steps call it (`self(x)`), and nothing of the DataModule."""
    knobs = cfg.get("accel", {})
    channels_last, compile_ = resolve_channels_last(cfg, model), bool(knobs.get("compile", False))
    if channels_last or compile_:
        from lightspeed.speed import on_model  # only where a knob changes the module

        on_model.apply(model, channels_last, knobs if compile_ else None, device_type(cfg))


def compiled_frames() -> int:
    """Frames torch.compile has compiled in this process, recompiles included (dynamo's own counter): the
    difference around steady-state steps is the number of recompiles, each seconds of lost time."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])
