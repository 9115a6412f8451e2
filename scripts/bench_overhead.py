"""What the training framework costs per step: a hand-written PyTorch loop against Lightspeed.

    python scripts/bench_overhead.py [--steps 300] [--warmup 50] [--repeats 5] [--models small,wide]
                                     [--variants 1,6]

On the CPU, whatever the machine has. The same model, optimizer (AdamW with the kernels Lightspeed's
accel preset picks on the CPU: fused), data (a DataLoader over in-memory tensors, batch 64, shuffled,
each batch fetched whole as Lightspeed's loader does) and number of steps, in one process,
alternating, median of --repeats; a second hand-loop row is plain torch (torch's default AdamW
kernels, a per-sample fetch and collate).
Only steady-state steps are timed (from the end of step --warmup to the end of the last step); setup
(building the Trainer, the first batches) is reported apart. The Lightning rows add one feature at a
time on top of the bare Trainer, ending with Lightspeed as `make train` runs it (metrics, logging,
progress bar, speed report, checkpointing); two more rows go below the bare Trainer while staying on
it (manual optimization, and Lightning's loop with the step done by hand inside it). Each row's
difference from the bare Trainer is also given paired: taken within each repeat, whose runs follow each
other, then the median over repeats (this VM's speed drifts by +-15% over seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from lightspeed.core import device
from lightspeed.core.logs import silence_known_noise
from lightspeed.data import SyntheticDataModule
from lightspeed.data.host_loader import WholeBatches, whole_batch
from lightspeed.models.classifier import Classifier
from lightspeed.run.entry import compose_config
from lightspeed.speed import accel
from lightspeed.train import train

MODELS = {"small": [256, 256], "wide": [1024, 1024]}  # MLP 64-h-h-10: ~1 ms and ~10 ms a step here


class StepClock(L.Callback):
    """Wall time from the end of step `warmup` to the end of the last step; setup time before it."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.created = warmup, time.perf_counter()
        self.setup_s = self.start = self.end = 0.0
        self.steps = 0

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.steps += 1
        now = time.perf_counter()
        if self.steps == 1:
            self.setup_s = now - self.created
        if self.steps == self.warmup:
            self.start = now
        self.end = now

    def per_step(self) -> float:
        return (self.end - self.start) / (self.steps - self.warmup)


class BareClassifier(Classifier):
    """Forward, loss, backward, step: nothing logged, no metric."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)


class MetricClassifier(Classifier):
    """+ the accuracy metric updated every step, nothing logged."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        self.train_acc.update(logits, y)
        return F.cross_entropy(logits, y)


class ManualClassifier(BareClassifier):
    """The bare step under Lightning's manual optimization: no closure, no zero-grad hooks, but Lightning's
    optimizer wrapper, backward and step hooks still run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss


class LoopOnlyClassifier(ManualClassifier):
    """Lightning's loop with the step done by hand inside it (torch's optimizer called directly, no
    Lightning hook around backward or step, global_step not advanced): what the Trainer's loop alone
    costs, a floor for any LightningModule. Not a way to train (no precision plugin, no DDP hooks)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt = self.trainer.strategy.optimizers[0]
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss


def hand_loop(
    model: torch.nn.Module, loader: DataLoader, steps: int, warmup: int, **opt_kwargs: Any
) -> tuple[float, float]:
    created = time.perf_counter()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, **opt_kwargs)
    done, start, setup = 0, 0.0, 0.0
    while done < steps:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done += 1
            if done == 1:
                setup = time.perf_counter() - created
            if done == warmup:
                start = time.perf_counter()
            if done == steps:
                break
    return (time.perf_counter() - start) / (steps - warmup), setup


# The Lightning variants: (label, module class, overrides). Each adds one feature to the previous one.
OFF = [
    "callbacks=none",
    "logger=none",
    "curves=false",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "trainer.enable_checkpointing=false",
]
VARIANTS: list[tuple[str, type[Classifier], list[str]]] = [
    ("bare Trainer", BareClassifier, OFF),
    ("+ metrics", MetricClassifier, OFF),
    (
        "+ logging",
        Classifier,
        [
            "callbacks=none",
            "logger=csv",
            "trainer.enable_progress_bar=false",
            "trainer.enable_model_summary=false",
            "trainer.enable_checkpointing=false",
        ],
    ),
    (
        "+ progress bar",
        Classifier,
        [
            "callbacks=default",
            "logger=csv",
            "callbacks.speed_report=null",
            "callbacks.model_checkpoint=null",
            "callbacks.early_stopping=null",
            "trainer.enable_checkpointing=false",
        ],
    ),
    (
        "+ speed report",
        Classifier,
        [
            "callbacks=default",
            "logger=csv",
            "callbacks.model_checkpoint=null",
            "callbacks.early_stopping=null",
            "trainer.enable_checkpointing=false",
        ],
    ),
    ("Lightspeed default (+ checkpoints)", Classifier, ["callbacks=default", "logger=csv"]),
    # Below the bare Trainer, still on it: how far a LightningModule could go.
    ("bare, manual optimization", ManualClassifier, OFF),
    ("bare, Lightning's loop only (step by hand in training_step)", LoopOnlyClassifier, OFF),
]


def hand_inputs(hidden: list[int], steps: int, whole: bool) -> tuple[torch.nn.Module, DataLoader]:
    """The same net and data the Lightning runs get: the MLP and the DataModule's train split."""
    dm = SyntheticDataModule(
        num_samples=64 * steps * 2, shape=[64], batch_size=64, val_fraction=0.01, test_fraction=0.01
    )
    dm.setup()
    if whole:  # as Lightspeed's training loader fetches: one indexing operation a batch
        loader = DataLoader(
            WholeBatches(dm.splits["train"]), batch_size=64, shuffle=True, collate_fn=whole_batch
        )
    else:
        loader = DataLoader(dm.splits["train"], batch_size=64, shuffle=True)
    net = Classifier(
        {"name": "mlp", "hidden": hidden, "dropout": 0.0},
        {"name": "AdamW", "lr": 2e-3},
        {"name": "none"},
        10,
        [64],
    ).net
    return net, loader


def optimizer_kernels(logs: Path) -> dict[str, Any]:
    """The kernel choice (fused, foreach) that Lightspeed's accel preset makes here, for the hand loop."""
    cfg = compose_config("train", ["model=mlp", "trainer.accelerator=cpu"], logs)
    accel.resolve(cfg)
    return {k: v for k, v in cfg.model.optimizer.items() if k in ("fused", "foreach")}


def lightning_run(
    cls: type[Classifier], overrides: list[str], hidden: list[int], steps: int, warmup: int, logs: Path
) -> tuple[float, float]:
    cfg = compose_config(
        "train",
        [
            "trainer.accelerator=cpu",  # the hand loop runs on the CPU too, whatever the machine has
            "data=synthetic",
            "data.shape=[64]",
            f"data.num_samples={64 * steps * 2}",
            "data.batch_size=64",
            "data.on_device=false",  # a DataLoader over in-memory tensors, as the hand loop has
            "data.val_fraction=0.01",
            "data.test_fraction=0.01",
            "data.augment.crop_padding=0",
            "data.augment.flip=false",
            "model=mlp",
            f"model.net.hidden=[{','.join(map(str, hidden))}]",
            "model.net.dropout=0.0",
            "model.scheduler.name=none",
            "trainer.max_epochs=1",
            f"trainer.limit_train_batches={steps}",
            "trainer.limit_val_batches=1",
            "trainer.num_sanity_val_steps=0",
            "test_after_fit=false",
            *overrides,
        ],
        logs,
    )
    cfg.model._target_ = f"{cls.__module__}.{cls.__qualname__}"
    clock = StepClock(warmup)
    with (
        open(os.devnull, "w") as devnull,
        contextlib.redirect_stdout(devnull),
    ):  # bars and tables still render
        train(cfg, [clock])
    return clock.per_step(), clock.setup_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default="small,wide")
    parser.add_argument(
        "--variants",
        help="comma-separated row numbers to run (1 = bare Trainer ... 6 = Lightspeed default, 7 = manual "
        "optimization, 8 = Lightning's loop only); default all",
    )
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    # As Lightspeed's command line starts a run: flushing denormals before any torch work (so in every
    # CPU thread), and torch's cached CUDA check instead of an NVML query in each optimizer step. The
    # hand loop gets the same process, as plain torch (which asks no NVML) would.
    torch.set_flush_denormal(True)
    device.skip_repeated_cuda_probe()
    silence_known_noise()
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # Lightning sets INFO on it
    torch.manual_seed(0)
    variants = VARIANTS
    if args.variants:
        variants = [VARIANTS[int(i) - 1] for i in args.variants.split(",")]
        if variants[0] is not VARIANTS[0]:
            variants.insert(0, VARIANTS[0])  # every row is compared with the bare Trainer
    for model_name in args.models.split(","):
        hidden = MODELS[model_name]
        times: dict[str, list[float]] = {}
        setups: dict[str, list[float]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            kernels = optimizer_kernels(Path(tmp) / "compose")
            # the first with Lightspeed's optimizer kernels and batch fetch: the framework alone differs
            hand_rows = {
                "hand-written loop": (kernels, True),
                "hand-written loop, plain torch (default AdamW kernels, per-sample fetch)": ({}, False),
            }
            for repeat in range(args.repeats):
                for label, (opt_kwargs, whole) in hand_rows.items():
                    per_step, setup = hand_loop(
                        *hand_inputs(hidden, args.steps, whole), args.steps, args.warmup, **opt_kwargs
                    )
                    times.setdefault(label, []).append(per_step)
                    setups.setdefault(label, []).append(setup)
                for label, cls, overrides in variants:
                    per_step, setup = lightning_run(
                        cls,
                        overrides,
                        hidden,
                        args.steps,
                        args.warmup,
                        Path(tmp) / f"{repeat}-{VARIANTS.index((label, cls, overrides))}",
                    )
                    times.setdefault(label, []).append(per_step)
                    setups.setdefault(label, []).append(setup)
        report(model_name, hidden, times, setups, args)


def report(model_name: str, hidden: list[int], times: dict, setups: dict, args: argparse.Namespace) -> None:
    """Medians per row, and each row's difference from the bare Trainer taken within each repeat (the
    runs of one repeat follow each other, so a slow spell of the machine shifts them alike)."""
    med = {k: statistics.median(v) for k, v in times.items()}
    hand, bare = med["hand-written loop"], med["bare Trainer"]
    print(
        f"\nMLP 64-{'-'.join(map(str, hidden))}-10 ({model_name}), batch 64, "
        f"{args.steps - args.warmup} timed steps after {args.warmup}, median of {args.repeats}, "
        f"torch {torch.__version__}, lightning {L.__version__}, {torch.get_num_threads()} threads\n"
    )
    print(
        "| run | ms/step | vs hand loop (us/step) | vs bare Trainer (us/step) | vs bare, paired (us/step) "
        "| vs bare, paired | throughput vs hand loop | setup (s) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, t in med.items():
        paired = [a - b for a, b in zip(times[label], times["bare Trainer"], strict=True)]
        ratios = [a / b - 1 for a, b in zip(times[label], times["bare Trainer"], strict=True)]
        print(
            f"| {label} | {t * 1e3:.3f} | {(t - hand) * 1e6:+.0f} | {(t - bare) * 1e6:+.0f} "
            f"| {statistics.median(paired) * 1e6:+.0f} | {statistics.median(ratios):+.1%} "
            f"| {hand / t:.2f}x | {statistics.median(setups[label]):.2f} |"
        )


if __name__ == "__main__":
    main()
