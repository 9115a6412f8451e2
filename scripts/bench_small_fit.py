"""A small model's whole fit with validation every epoch: Lightspeed against a plain PyTorch loop doing the
same work.

    python scripts/bench_small_fit.py [--epochs 20] [--repeats 3] [overrides ...]

Both train the net `make train <overrides>` builds (same seed, same DataModule and its loaders, the same
batch transfer and scaling, the optimizer and schedule the accel preset resolved) for --epochs epochs,
and validate after each. The plain loop computes the validation loss and accuracy and keeps the best
weights in memory (a copy of the state dict when the accuracy improves): what a hand-written script does.
Lightspeed runs as `make train` does (checkpoints, logs, curves, progress bar, speed report), early stopping
off so both train every epoch, and no test after the fit. Timed: the fit (Lightspeed's `trainer.fit`, the
plain loop's epochs), and the wall time from composing the config to the end; runs alternate, the medians
of --repeats are printed with their ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lightspeed.core.logs import silence_known_noise
from lightspeed.models.optim import build_optimizer, build_scheduler
from lightspeed.run import build
from lightspeed.run.entry import compose_config
from lightspeed.speed import accel
from lightspeed.train import train


def _overrides(epochs: int, extra: list[str]) -> list[str]:
    return [f"trainer.max_epochs={epochs}", "~callbacks.early_stopping", "test_after_fit=false", *extra]


def lightspeed(epochs: int, extra: list[str], folder: Path) -> tuple[float, float]:
    start = time.perf_counter()
    cfg = compose_config("train", [*_overrides(epochs, extra), "print_config=false"], folder)
    with contextlib.redirect_stdout(io.StringIO()):  # its tables: the same work, not shown here
        result = train(cfg)
    wall = time.perf_counter() - start
    assert result.trainer.current_epoch == epochs, result.trainer.current_epoch
    facts = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    return float(facts["fit_seconds"]), wall


def plain(epochs: int, extra: list[str], folder: Path) -> tuple[float, float]:
    start = time.perf_counter()
    cfg = compose_config("train", _overrides(epochs, extra), folder)
    accel.resolve(cfg)
    accel.apply_to_torch(cfg)
    torch.manual_seed(cfg.seed)
    dm = build.datamodule(cfg)
    net = build.model(cfg, dm)
    fit_start = time.perf_counter()
    dm.setup("fit")
    train_loader, val_loader = dm.train_dataloader(), dm.val_dataloader()
    optimizer = build_optimizer(net.parameters(), dict(cfg.model.optimizer))
    schedule = dict(cfg.model.get("scheduler") or {})
    scheduler, _ = build_scheduler(optimizer, schedule, epochs * len(train_loader), optimizer.defaults["lr"])
    device = torch.device("cpu")
    best, best_weights = -1.0, None
    for epoch in range(epochs):
        train_loader.sampler.set_epoch(epoch)  # a new order each epoch, as with any distributed sampler
        net.train()
        for batch in train_loader:
            x, y = dm.on_after_batch_transfer(dm.transfer_batch_to_device(batch, device, 0), 0)
            loss = net.loss(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
        net.eval()
        total, correct, summed = 0, torch.zeros(()), torch.zeros(())
        with torch.inference_mode():
            for batch in val_loader:
                x, y = dm.on_after_batch_transfer(dm.transfer_batch_to_device(batch, device, 0), 0)
                out = net(x)
                summed += F.cross_entropy(out, y, reduction="sum")
                correct += (out.argmax(1) == y).sum()
                total += len(y)
        accuracy = float(correct) / total
        if accuracy > best:
            best, best_weights = accuracy, {k: v.detach().clone() for k, v in net.state_dict().items()}
    end = time.perf_counter()
    assert best_weights is not None
    return end - fit_start, end - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args, extra = parser.parse_known_args()
    silence_known_noise()
    runs: dict[str, list[tuple[float, float]]] = {"lightspeed": [], "plain": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats + 1):  # the first round warms the caches and imports: not counted
            for name, fit in (("plain", plain), ("lightspeed", lightspeed)):
                measured = fit(args.epochs, extra, Path(tmp) / f"{name}{i}")
                if i:
                    runs[name].append(measured)
    fits = {k: statistics.median(f for f, _ in v) for k, v in runs.items()}
    walls = {k: statistics.median(w for _, w in v) for k, v in runs.items()}
    said = " ".join(extra) or "the defaults"
    print(f"{args.epochs} epochs, validation after each, median of {args.repeats} runs ({said})")
    for name in runs:
        print(f"  {name:<10} fit {fits[name]:6.2f} s   wall {walls[name]:6.2f} s")
    ratio = fits["lightspeed"] / fits["plain"]
    print(f"  ratio      fit {ratio:6.2f}x   wall {walls['lightspeed'] / walls['plain']:6.2f}x")


if __name__ == "__main__":
    main()
