"""Callbacks that record what really happened inside a run, for tests (also in subprocesses: the CLI
tests put this folder on PYTHONPATH and add them with `+callbacks.<name>._target_=probes.<Class>`)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from lightspeed.data import DigitsDataModule


class AutocastProbe(L.Callback):
    """Records whether autocast is on, and its dtype, inside the first training step."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int
    ) -> None:
        if not self.seen:
            with trainer.precision_plugin.forward_context():
                self.seen = {
                    "enabled": torch.is_autocast_enabled("cpu"),
                    "dtype": torch.get_autocast_dtype("cpu"),
                    "logits_dtype": pl_module(batch[0]).dtype,
                }


class RankProbe(L.Callback):
    """Writes `<out>/rank<R>.json`: the rank's torch seed after fit starts and the sample indices its
    sampler gave it in the first epoch."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch != 0:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        facts = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "initial_seed": torch.initial_seed(),
            "indices": list(iter(trainer.train_dataloader.sampler)),
            "dataset_size": len(trainer.datamodule.splits["train"]),
            "loader": type(trainer.train_dataloader).__name__,
        }
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(facts))


class BatchProbe(L.Callback):
    """Records, for every training step, the memory formats of the batch and the first conv weight,
    a fingerprint of the batch (to compare sample orders between runs), and the gradient norm after
    clipping."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int
    ) -> None:
        x, y = batch
        conv = next((m for m in pl_module.modules() if isinstance(m, torch.nn.Conv2d)), None)
        self.steps.append(
            {
                "input_channels_last": x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last),
                "weight_channels_last": conv is not None
                and conv.weight.is_contiguous(memory_format=torch.channels_last),
                "fingerprint": (y.tolist(), round(float(x.double().sum()), 6)),
            }
        )

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        grads = [p.grad.norm() for p in pl_module.parameters() if p.grad is not None]  # clipped, stepped
        if grads:
            self.steps[-1]["grad_norm"] = float(torch.stack(grads).norm())


class SlowLoader:
    """Wraps a loader and sleeps before each batch, as a slow disk or decoder would."""

    def __init__(self, loader: Any, seconds: float) -> None:
        self.loader, self.seconds = loader, seconds

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Any:
        for batch in self.loader:
            time.sleep(self.seconds)
            yield batch


class SlowDigits(DigitsDataModule):
    """Digits whose training batches take `delay` seconds each to arrive."""

    def __init__(self, delay: float = 0.02, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay = delay

    def train_dataloader(self) -> Any:
        return SlowLoader(super().train_dataloader(), self.delay)


class Fault(L.Callback):
    """Injects one fault at a training step (`global_step` before the step), on one rank or all:
    `nan` poisons the batch's inputs, `oom` raises torch's out-of-memory error, `raise` a RuntimeError,
    `sigterm`/`sigusr1` sends the signal to this process, `exit` ends the process at once."""

    def __init__(self, kind: str, step: int, rank: int | None = None) -> None:
        self.kind, self.step, self.rank = kind, step, rank

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int
    ) -> None:
        if trainer.global_step != self.step or (self.rank is not None and trainer.global_rank != self.rank):
            return
        if self.kind == "nan":
            batch[0][0] = float("nan")
        elif self.kind == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        elif self.kind == "raise":
            raise RuntimeError(f"simulated failure on rank {trainer.global_rank}")
        elif self.kind in ("sigterm", "sigusr1"):
            os.kill(os.getpid(), getattr(signal, self.kind.upper()))
        elif self.kind == "exit":
            os._exit(9)


class Snapshot(L.Callback):
    """The weights and the optimizer's step count before and after the training step at `step`."""

    def __init__(self, step: int) -> None:
        self.step, self.before, self.after = step, {}, {}

    def _take(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        state = next(iter(trainer.optimizers[0].state.values()), {})
        return {
            "weights": {k: v.clone() for k, v in pl_module.state_dict().items()},
            "opt_step": state.get("step"),
        }

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.before = self._take(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step == self.step + 1:
            self.after = self._take(trainer, pl_module)
