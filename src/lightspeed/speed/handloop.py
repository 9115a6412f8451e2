"""The honest baseline, `make bench`'s `hand` rows: the training that a Lightspeed preset does, written as a
plain PyTorch loop (no Trainer, no metric updates, no logging), with the module's forward and its
`loss(output, target)` and the preset's data path and knobs. Timed as the speed report times."""

from __future__ import annotations

import itertools
import resource
import statistics
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from lightspeed.data.augment import random_crop, random_flip
from lightspeed.data.host_loader import WholeBatches, whole_batch
from lightspeed.models.optim import build_optimizer, build_scheduler
from lightspeed.speed.steady import settled

AUTOCAST = {"32-true": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


@dataclass
class Settings:
    """What a preset resolved to for this run (`lightspeed.speed.accel.resolve`), field for field."""

    device: str
    batch_size: int
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    schedule_steps: int  # the length the preset's schedule spans
    steps: int = 100  # timed steps
    warmup: int | str = "auto"  # untimed steps, or auto: until the step time settles
    precision: str = "32-true"
    channels_last: bool = False
    compile: bool = False
    compile_mode: str = "default"
    compile_backend: str = "inductor"
    benchmark: bool = False  # cudnn.benchmark
    on_device: bool = True  # the data set on the device, batches sliced there; else a DataLoader
    pin_memory: bool = False
    num_workers: int = 0
    non_blocking: bool = False
    drop_last: bool = True
    gradient_clip_val: float | None = None
    augment: dict[str, Any] = field(default_factory=dict)
    input_scale: tuple[float, float] | None = None  # (mean, std) of uint8 inputs, applied on the device
    seed: int = 0


def batches(x: Tensor, y: Tensor, s: Settings) -> Iterator[tuple[Tensor, Tensor]]:
    """Training batches on the device, epoch after epoch, each epoch in a new random order (drawn as
    Lightspeed's loaders draw it: from `seed + epoch`)."""
    device = torch.device(s.device)
    if s.on_device:
        x, y = x.to(device), y.to(device)
        for epoch in itertools.count():
            order = torch.randperm(len(x), generator=torch.Generator().manual_seed(s.seed + epoch))
            order = order.to(device, non_blocking=True)
            end = len(x) // s.batch_size * s.batch_size if s.drop_last else len(x)
            for start in range(0, end, s.batch_size):
                idx = order[start : start + s.batch_size]
                yield x.index_select(0, idx), y.index_select(0, idx)
    generator = torch.Generator().manual_seed(s.seed)
    loader = DataLoader(
        WholeBatches(TensorDataset(x, y)),  # a batch at once, as Lightspeed's loaders fetch in-memory data
        batch_size=s.batch_size,
        sampler=RandomSampler(x, generator=generator),
        drop_last=s.drop_last,
        collate_fn=whole_batch,
        num_workers=s.num_workers,
        pin_memory=s.pin_memory and device.type == "cuda",
        persistent_workers=s.num_workers > 0,
    )
    while True:
        for xb, yb in loader:
            yield xb.to(device, non_blocking=s.non_blocking), yb.to(device, non_blocking=s.non_blocking)


def train(net: nn.Module, x: Tensor, y: Tensor, s: Settings) -> dict[str, Any]:
    """Train `net` (a module with a `loss(output, target)` method, a LightningModule of Lightspeed's) on
    (x, y) for `warmup` + `steps` steps; return the speed figures and the last loss."""
    if s.precision not in AUTOCAST:
        raise ValueError(f"the plain loop runs precision {', '.join(AUTOCAST)}, not {s.precision}")
    torch.manual_seed(s.seed)
    device = torch.device(s.device)
    torch.backends.cudnn.benchmark = s.benchmark
    net = net.to(device, memory_format=torch.channels_last if s.channels_last else torch.preserve_format)
    optimizer = build_optimizer(net.parameters(), s.optimizer)
    scheduler, _ = build_scheduler(optimizer, s.scheduler, s.schedule_steps, s.optimizer["lr"])
    scaler = torch.amp.GradScaler(device.type, enabled=s.precision == "16-mixed")
    if s.compile:
        net.compile(mode=None if s.compile_mode == "default" else s.compile_mode, backend=s.compile_backend)
    net.train()
    data = batches(x, y, s)

    def step() -> tuple[Tensor, int]:
        xb, yb = next(data)
        if s.input_scale is not None and xb.dtype == torch.uint8:
            xb = (xb.float() - s.input_scale[0]) / s.input_scale[1]
        if s.augment.get("crop_padding") and xb.dim() == 4:  # images only, as the DataModule does
            xb = random_crop(xb, int(s.augment["crop_padding"]))
        if s.augment.get("flip") and xb.dim() == 4:
            xb = random_flip(xb)
        if s.channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        dtype = AUTOCAST[s.precision]
        with torch.autocast(device.type, dtype=dtype) if dtype else nullcontext():
            loss = net.loss(net(xb), yb)
        scaler.scale(loss).backward()
        if s.gradient_clip_val:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(net.parameters(), s.gradient_clip_val)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        return loss.detach(), len(yb)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    warm_times: list[float] = []
    begin = time.perf_counter()
    while not (len(warm_times) >= s.warmup if isinstance(s.warmup, int) else settled(warm_times)):
        t = time.perf_counter()
        step()
        warm_times.append(time.perf_counter() - t)
    sync()
    warmup_s = time.perf_counter() - begin
    compiles = counters["frames"]["total"]
    times: list[float] = []
    samples = 0
    start = prev = time.perf_counter()
    for _ in range(s.steps):
        loss, n = step()
        samples += n
        now = time.perf_counter()
        times.append(now - prev)
        prev = now
    sync()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {
        "peak_allocated_gib": peak,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "samples_per_s": samples / seconds,
        "step_ms_mean": 1e3 * seconds / s.steps,
        "step_ms_median": 1e3 * statistics.median(times),
        "timed_steps": s.steps,
        "warmup_steps": len(warm_times),
        "warmup_seconds": warmup_s,
        "recompiles": counters["frames"]["total"] - compiles,
        "final_loss": float(loss),
    }
