"""A distinct random stream per DDP rank, after the model is identical everywhere."""

from __future__ import annotations

import random

import lightning as L
import numpy as np
import torch


class RankSeed(L.Callback):
    """Reseed torch, numpy and random with `seed + global_rank` once fit starts.

    Everything built before that (weights, the data split) used the same seed on every rank, as it must.
    From here on, dropout masks and on-device augmentation must differ between ranks, or the ranks would
    draw the same noise for different samples. The run's seed (PL_GLOBAL_SEED) stays as it was: the
    distributed samplers and loader workers derive their seeds from it, and samplers must agree.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.world_size > 1:
            seed = self.seed + trainer.global_rank
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)  # all devices' generators too
