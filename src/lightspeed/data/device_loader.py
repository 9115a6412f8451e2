"""A loader for data sets that fit in device memory: no workers, no per-sample collate, no copies.

The fastest training code (airbench, nanoGPT) keeps the whole data set on the GPU and slices batches
out of it with an on-device permutation. On a CPU the same code is the in-memory fast path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor


class EpochOrder:
    """The sample order of one rank in one epoch, a pure function of (seed, epoch, rank).

    Shuffled: a permutation drawn from `seed + epoch`, the same on every rank, cut to a multiple of the
    world size and dealt out round-robin, so the ranks get disjoint shards of equal length (DDP needs the
    same number of steps on every rank; at most world_size - 1 samples sit out an epoch, a different few
    each time). Not shuffled (evaluation): every sample exactly once, shards off by at most one.
    Lightning calls `set_epoch` at each epoch start, as it does for a DistributedSampler.
    """

    def __init__(self, n: int, shuffle: bool, seed: int, rank: int = 0, world_size: int = 1) -> None:
        self.n, self.shuffle, self.seed, self.rank, self.world_size = n, shuffle, seed, rank, world_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        if self.shuffle:
            return self.n // self.world_size
        return len(range(self.rank, self.n, self.world_size))

    def __iter__(self) -> Iterator[int]:
        """This epoch's indices, as a sampler gives them."""
        return iter(self.indices(torch.device("cpu")).tolist())

    def indices(self, device: torch.device) -> Tensor:
        if not self.shuffle:
            return torch.arange(self.rank, self.n, self.world_size, device=device)
        # Drawn on the CPU from its own generator: the same order on any device, whatever the global RNG.
        perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        perm = perm[: len(self) * self.world_size]
        return perm[self.rank :: self.world_size].to(device, non_blocking=True)


class DeviceLoader:
    """Batches sliced from tensors that already live on the training device.

    Resumable when shuffled (training): `state_dict` holds the epoch and how many of its batches were
    served; Lightning saves it in checkpoints and restores it because this class has `state_dict` and
    `load_state_dict`, and a restored loader continues the epoch where it stopped. Unshuffled loaders
    (evaluation) serve every batch on every pass.
    """

    def __init__(self, x: Tensor, y: Tensor, batch_size: int, order: EpochOrder) -> None:
        self.x, self.y, self.batch_size = x, y, batch_size
        self.sampler = order  # the attribute Lightning looks for to call set_epoch
        self.batch_sampler = None  # Lightning reads it wherever there is a sampler
        self._served = 0  # batches of the current epoch already served
        self._served_epoch = order.epoch

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        if self._served_epoch != self.sampler.epoch or not self.sampler.shuffle:  # start from the first batch
            self._served, self._served_epoch = 0, self.sampler.epoch
        idx = self.sampler.indices(self.x.device)
        for start in range(self._served * self.batch_size, len(idx), self.batch_size):
            batch = idx[start : start + self.batch_size]
            self._served += 1
            yield self.x[batch], self.y[batch]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._served_epoch, "batches_served": self._served}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._served_epoch, self._served = int(state["epoch"]), int(state["batches_served"])
        self.sampler.set_epoch(self._served_epoch)
