"""A distinct random stream per DDP rank, saved in checkpoints so that a resumed run draws the same.

States are plain data (`weights_only=True` loads only tensors, numbers, strings and containers), gathered
from all ranks, as Lightning writes rank 0's checkpoint only."""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn

from lightspeed.compat.trainer import restarted_mid_epoch

#: Where a checkpoint keeps every rank's random states (before 0.2: `checkpoint["callbacks"]["RankSeed"]`,
#: moved here when loaded: `lightspeed.resilience.checkpoint.migrate`).
KEY = "rank_rng"


class RankSeed(L.Callback):
    """Reseed torch, numpy and random with `seed + global_rank` once fit starts (what is built before, the
    weights and the data split, shares one seed; dropout and augmentation must differ between ranks), and
    keep every rank's generator states in each checkpoint. The run's seed (PL_GLOBAL_SEED) is kept: the
    samplers derive the data order from it. States come back when fit starts, before the training loader's
    iterator is made, and for a mid-epoch resume again in `on_train_start`, before the first batch is
    augmented (Lightning skips `on_train_epoch_start` mid-epoch)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rng_pending: dict[str, Any] | None = None
        self._started = False

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        self._started = True
        if self._rng_pending is not None:  # restored: the states the checkpoint was saved with
            self._restore(trainer)
        elif trainer.world_size > 1:
            self._reseed(trainer)

    def _reseed(self, trainer: L.Trainer) -> None:
        seed = self.seed + trainer.global_rank
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)  # all devices' generators too

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: Any) -> None:
        """Every rank's states (a collective: Lightning builds checkpoints on all ranks at once)."""
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        checkpoint[KEY] = {"ranks": gather(capture())}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: Any) -> None:
        super().on_load_checkpoint(trainer, pl_module, checkpoint)
        self._rng_pending = checkpoint.get(KEY)
        if self._started and self._rng_pending is not None:  # a strategy that restores after fit starts
            self._restore(trainer)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Restored at fit start, the states drew the training loader's iterator, made before this hook, as
        an uninterrupted run draws its next epoch's (a plain shuffled DataLoader draws its order). Mid-epoch,
        the uninterrupted run's iterator was made long before the checkpoint: the states again."""
        super().on_train_start(trainer, pl_module)
        if self._rng_pending is not None and restarted_mid_epoch(trainer):
            self._restore(trainer)
        self._rng_pending = None

    def _restore(self, trainer: L.Trainer) -> None:
        ranks = self._rng_pending["ranks"] if self._rng_pending is not None else []
        if not restore_rng(ranks, trainer):
            self._rng_pending = None
            self._reseed(trainer)  # a stream of each rank's own, as a run that starts


def capture() -> dict[str, Any]:
    """This process's RNG states: torch (CPU), the current CUDA device if in use, numpy, random (numpy's
    and Python's tuples with arrays become tensors and numbers)."""
    _, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {
            "version": version,
            "state": torch.tensor(internal, dtype=torch.int64),
            "gauss": gauss_next,
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def gather(mine: Any) -> list[Any]:
    """Every rank's `mine`, in rank order (a collective: call it on all ranks at once, as Lightning does
    when it builds a checkpoint); `[mine]` in a single process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [mine]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out


def restore_rng(ranks: list[dict[str, Any]], trainer: L.Trainer) -> bool:
    """This rank's random states as the checkpoint saved them (`RankSeed`); False, having said so, when it
    holds another number of ranks' (the caller then seeds afresh)."""
    if len(ranks) != trainer.world_size:
        rank_zero_warn(
            f"the checkpoint holds random states for {len(ranks)} processes, this run has "
            f"{trainer.world_size}: continuing with fresh seeds (the run is no longer bit-exact)"
        )
        return False
    restore(ranks[trainer.global_rank])
    return True


def restore(state: dict[str, Any]) -> None:
    """Set the generators `rank_seed.capture` read; CUDA's only where this process uses CUDA too."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"].tolist()), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda"])
