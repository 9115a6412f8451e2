"""A distinct random stream per DDP rank, after the model is identical everywhere."""

from __future__ import annotations

import lightning as L
from lightning.fabric.utilities.seed import seed_everything


class RankSeed(L.Callback):
    """Reseed each rank with `seed + global_rank` once fit starts.

    Everything built before that (weights, the data split) used the same seed on every rank, as it must.
    From here on, dropout masks and on-device augmentation must differ between ranks, or the ranks would
    draw the same noise for different samples. The distributed sampler keeps its own shared seed.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.world_size > 1:
            seed_everything(self.seed + trainer.global_rank, workers=True, verbose=False)
