"""What each piece of Lightspeed's per-step work costs, old way against new, on this machine.

    python scripts/bench_hotpath.py [--repeats 15] [--calls 400] [--device cpu|cuda]

Whole-run timings on a shared 2-core VM drift by +-15% within seconds, more than a feature costs, so
here each piece is timed on its own: the old and the new version of it alternate in short blocks
(--calls each), and the median per call over --repeats blocks is reported. The pieces:

- the training accuracy update: torchmetrics' MulticlassAccuracy (micro) against Lightspeed's
  two-counter Accuracy, on the small MLP's logits (batch 64, 10 classes);
- fetching a training batch of 64 from in-memory arrays: torch's per-sample fetch and collate against
  one indexing operation (`WholeBatches`);
- the non-finite loss watch: copying each loss into an on-device buffer against keeping a reference;
- the optimizer step of the small and wide MLPs: AdamW with torch's default kernels (on the CPU one
  parameter at a time, on CUDA foreach) against fused: on a GPU this decides `accel.optimizer_impl=auto`;
- Lightning's dispatch of the per-batch callback hooks with the default callbacks: every hook of every
  callback (Lightning's own way) against only the ones that do something (`lightspeed.hooks`);
- Lightning naming the running hook on the LightningModule (`_current_fx_name`, set and restored around
  each module, callback and strategy hook: 28 times a training step with the default callbacks, counted):
  `nn.Module.__setattr__` against the instance dict (`lightspeed.compat.hooks.CheapHookNames`);
- the CUDA check in every optimizer step: under Lightning's NVML-based check (which, with torch's CUDA
  build and no GPU, asks NVML each time) against torch's cached one (`device.skip_repeated_cuda_probe`);
- the wide MLP's fused AdamW step once most of its momentum has decayed into denormals (dead ReLU
  units, after ~750 steps): computed exactly against flushed to zero (`accel.flush_denormal`). One
  thread, since the mode belongs to each thread; both sides refill the momentum before each step.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer import call
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from lightspeed import device as device_facts
from lightspeed.compat import hooks
from lightspeed.data.device_loader import EpochOrder, WholeBatches, whole_batch
from lightspeed.entry import compose_config
from lightspeed.models.metrics import Accuracy
from lightspeed.models.nets import build_net
from lightspeed.noise import silence_known_noise


def per_call(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    """Seconds per call; on a GPU the queued kernels are waited for at the end of the block."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize()
    return (time.perf_counter() - start) / calls


def compare(
    name: str, old: Callable[[], object], new: Callable[[], object], args: argparse.Namespace
) -> None:
    device = torch.device(args.device)
    for fn in (old, new):  # warm up
        per_call(fn, 20, device)
    times: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(args.repeats):
        times["old"].append(per_call(old, args.calls, device))
        times["new"].append(per_call(new, args.calls, device))
    o, n = (statistics.median(times[k]) * 1e6 for k in ("old", "new"))
    print(f"| {name} | {o:.1f} | {n:.1f} | {o - n:+.1f} |")


def optimizer_step(hidden: list[int], device: torch.device, **kernels: bool) -> Callable[[], None]:
    net = build_net({"name": "mlp", "hidden": hidden, "dropout": 0.0}, [64], 10).to(device)
    x, y = torch.randn(64, 64, device=device), torch.randint(0, 10, (64,), device=device)
    F.cross_entropy(net(x), y).backward()
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=5e-4, **kernels)
    return opt.step


def cuda_check(nvml: str) -> Callable[[], object]:
    """`torch.cuda.is_available()` as torch's optimizers call it each step, with the NVML setting given."""

    def check() -> object:
        os.environ[device_facts.NVML_CHECK] = nvml
        return torch.cuda.is_available()

    return check


def denormal_momentum_step(flush: bool) -> Callable[[], None]:
    """A fused AdamW step of the wide MLP where 85% of the momentum is denormal, as measured after 1,600
    steps of training it (the 1024x1024 layer's dead units)."""
    net = build_net({"name": "mlp", "hidden": [1024, 1024], "dropout": 0.0}, [64], 10)
    F.cross_entropy(net(torch.randn(64, 64)), torch.randint(0, 10, (64,))).backward()
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, fused=True)
    opt.step()
    momenta = [opt.state[p]["exp_avg"] for p in net.parameters()]
    decayed = [device_facts.denormals(m.numel()).view_as(m) * (torch.rand_like(m) < 0.85) for m in momenta]

    def step() -> None:
        torch.set_flush_denormal(flush)
        for m, d in zip(momenta, decayed, strict=True):
            m.copy_(d)
        opt.step()

    return step


def empty_hook_calls() -> dict[str, int]:
    """Per training hook, how many of the default callbacks inherit it empty."""
    from lightspeed import build

    cfg = compose_config("train", [], Path(tempfile.gettempdir()) / "lightspeed-bench")
    defaults = build.callbacks(cfg, has_logger=True)
    return {
        h: sum(hooks.skip_empty(copy.copy(cb), Callback, (h,)) == [h] for cb in defaults)
        for h in hooks.TRAINING
    }


def hook_dispatch(empty: dict[str, int], prune: bool) -> Callable[[], None]:
    """Lightning's six per-batch training hooks dispatched as with the default callbacks, counting only
    the calls that `lightspeed.hooks` removes (hooks a default callback inherits empty): the old way
    makes them, the new way does not. The hooks that do work are called either way and left out."""
    trainer = Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.strategy._lightning_module = _Module()  # Lightning sets the hook's name on the module
    per_hook = {h: [] if prune else [Callback() for _ in range(n)] for h, n in empty.items()}
    loss, opt = torch.zeros(()), torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    args = {
        "on_train_batch_start": (None, 0),
        "on_before_backward": (loss,),
        "on_after_backward": (),
        "on_before_optimizer_step": (opt,),
        "on_before_zero_grad": (opt,),
        "on_train_batch_end": (None, None, 0),
    }

    def step() -> None:
        for hook, callbacks in per_hook.items():
            trainer.callbacks = callbacks
            call._call_callback_hooks(trainer, hook, *args[hook])

    return step


def next_batch(whole: bool) -> Callable[[], object]:
    """The next batch of 64 from a DataLoader over the small MLP's data (64 features), epoch after epoch."""
    gen = torch.Generator().manual_seed(0)
    split = TensorDataset(
        torch.randn(50_000, 64, generator=gen), torch.randint(0, 10, (50_000,), generator=gen)
    )
    order = EpochOrder(len(split), shuffle=True, seed=0)
    if whole:
        loader = DataLoader(WholeBatches(split), batch_size=64, sampler=order, collate_fn=whole_batch)
    else:
        loader = DataLoader(split, batch_size=64, sampler=order)
    batches = iter(loader)

    def step() -> object:
        nonlocal batches
        try:
            return next(batches)
        except StopIteration:
            batches = iter(loader)
            return next(batches)

    return step


class _Module(torch.nn.Module):
    _current_fx_name: str | None = None


FX_NAME_SETS = 28  # a training step, default callbacks, small MLP: 14 hooks named, each name restored


def hook_names(cheap: bool) -> Callable[[], None]:
    """A training step's worth of hook names set on a LightningModule, and restored, as Lightning does."""
    module = type("Cheap", (hooks.CheapHookNames, LightningModule), {})() if cheap else LightningModule()

    def step() -> None:
        for _ in range(FX_NAME_SETS // 2):
            module._current_fx_name = "training_step"
            module._current_fx_name = None

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--device", default="cpu", help="where the tensors live: cpu or cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    silence_known_noise()
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # Lightning sets INFO on it
    torch.manual_seed(0)
    logits, target = torch.randn(64, 10, device=device), torch.randint(0, 10, (64,), device=device)
    theirs = MulticlassAccuracy(10, average="micro", validate_args=False).to(device)
    ours = Accuracy().to(device)
    buffer, kept = torch.zeros(50, device=device), []
    loss = torch.tensor(2.3, device=device)

    def copy_loss() -> None:
        buffer[len(kept) % 50].copy_(loss.detach(), non_blocking=True)

    def keep_loss() -> None:
        kept.append(loss.detach())
        if len(kept) == 50:
            kept.clear()

    where = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    )
    print(f"torch {torch.__version__}, {args.device} ({where}); median us per call\n")
    print("| piece | old (us) | new (us) | saved (us/step) |")
    print("|---|---:|---:|---:|")
    compare(
        "accuracy update (MulticlassAccuracy -> Accuracy)",
        lambda: theirs.update(logits, target),
        lambda: ours.update(logits, target),
        args,
    )
    compare(
        "training batch fetch (per sample + collate -> one index)", next_batch(False), next_batch(True), args
    )
    compare("non-finite watch (buffer copy -> reference)", copy_loss, keep_loss, args)
    compare(
        "AdamW step, small MLP (torch default -> fused)",
        optimizer_step([256, 256], device),
        optimizer_step([256, 256], device, fused=True),
        args,
    )
    compare(
        "AdamW step, wide MLP (torch default -> fused)",
        optimizer_step([1024, 1024], device),
        optimizer_step([1024, 1024], device, fused=True),
        args,
    )
    empty = empty_hook_calls()
    compare(
        f"callback hooks inherited empty: {sum(empty.values())} calls a step (Lightning's way -> none)",
        hook_dispatch(empty, prune=False),
        hook_dispatch(empty, prune=True),
        args,
    )
    compare(
        f"hook name on the module, {FX_NAME_SETS} sets a step with the default callbacks "
        "(nn.Module.__setattr__ -> instance dict)",
        hook_names(cheap=False),
        hook_names(cheap=True),
        args,
    )
    nvml = os.environ.get(device_facts.NVML_CHECK)
    compare("CUDA check in each optimizer step (NVML -> cached)", cuda_check("1"), cuda_check("0"), args)
    os.environ.pop(device_facts.NVML_CHECK)
    if nvml is not None:  # as it was
        os.environ[device_facts.NVML_CHECK] = nvml
    if device.type == "cpu":
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        compare(
            "AdamW step, wide MLP, 85% of momentum denormal, 1 thread (exact -> flushed)",
            denormal_momentum_step(False),
            denormal_momentum_step(True),
            args,
        )
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)


if __name__ == "__main__":
    main()
