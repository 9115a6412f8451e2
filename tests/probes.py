"""Callbacks that record what really happened inside a run, for tests (also in subprocesses: the CLI
tests put this folder on PYTHONPATH and add them with `+callbacks.<name>._target_=probes.<Class>`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch


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
            "dataset_size": len(trainer.train_dataloader.dataset),
        }
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(facts))
