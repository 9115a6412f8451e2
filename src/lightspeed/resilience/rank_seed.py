"""A distinct random stream per DDP rank, saved in checkpoints so that a resumed run draws the same."""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightspeed.resilience import rank_state

#: Where a checkpoint keeps every rank's random states (before 0.2: `checkpoint["callbacks"]["RankSeed"]`,
#: moved here when loaded: `lightspeed.resilience.checkpoint.migrate`).
KEY = "rank_rng"


class RankSeed(L.Callback):
    """Reseed torch, numpy and random with `seed + global_rank` once fit starts; save and restore every rank's
    generator states with each checkpoint (`checkpoint["rank_rng"]`).

    What is built before fit (weights, the data split) shares one seed, as it must; after it, dropout masks
    and on-device augmentation must differ between ranks, or they draw the same noise for different samples.
    The run's seed (PL_GLOBAL_SEED) is kept: the samplers derive the data order from it. States come back in
    `on_train_start` (after sanity checks and summaries, before the first batch is augmented), so a resumed
    run draws what the uninterrupted one would (Lightning skips `on_train_epoch_start` mid-epoch)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._pending: dict[str, Any] | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.world_size > 1:
            seed = self.seed + trainer.global_rank
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)  # all devices' generators too

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: Any) -> None:
        """Every rank's states (a collective: Lightning builds checkpoints on all ranks at once)."""
        checkpoint[KEY] = {"ranks": rank_state.gather(rank_state.capture())}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: Any) -> None:
        self._pending = checkpoint.get(KEY)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending is None:
            return
        ranks = self._pending["ranks"]
        self._pending = None
        if len(ranks) != trainer.world_size:
            rank_zero_warn(
                f"the checkpoint holds random states for {len(ranks)} processes, this run has "
                f"{trainer.world_size}: continuing with fresh seeds (the run is no longer bit-exact)"
            )
            return
        rank_state.restore(ranks[trainer.global_rank])
