"""The sample order of every epoch, and two loaders that can stop mid-epoch and continue there.

`DeviceLoader` serves data sets that fit in device memory: no workers, no per-sample collate, no
copies. The fastest training code (airbench, nanoGPT) keeps the whole data set on the GPU and slices
batches out of it with an on-device permutation; on a CPU the same code is the in-memory fast path.
`ResumableDataLoader` is torch's DataLoader (workers, pinned memory) over the same order; over a
`WholeBatches` view it fetches each batch with one indexing operation. Those two live in `host_loader`,
imported only where a DataLoader is used.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils.data.distributed import DistributedSampler


class EpochOrder(DistributedSampler):
    """The sample order of one rank in one epoch, a pure function of (seed, epoch, rank).

    Shuffled: a permutation drawn from `seed + epoch`, the same on every rank, cut to a multiple of the
    world size and dealt out round-robin, so the ranks get disjoint shards of equal length (DDP needs the
    same number of steps on every rank; at most world_size - 1 samples sit out an epoch, a different few
    each time). Not shuffled (evaluation): every sample exactly once, shards off by at most one.
    Lightning calls `set_epoch` at each epoch start. It is a `DistributedSampler`, so that Lightning
    (`use_distributed_sampler=true`, its default) keeps it instead of putting its own in the loader.
    """

    def __init__(self, n: int, shuffle: bool, seed: int, rank: int = 0, world_size: int = 1) -> None:
        super().__init__(range(n), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed)
        self.n, self.world_size = n, world_size
        self.num_samples = len(self)  # DistributedSampler's own fields, as this order deals them
        self.total_size = self.num_samples * world_size if shuffle else n
        self.drop_last = shuffle
        self.start = 0  # as a sampler: samples of this epoch to leave out (already trained on)

    def __len__(self) -> int:
        if self.shuffle:
            return self.n // self.world_size
        return len(range(self.rank, self.n, self.world_size))

    def __iter__(self) -> Iterator[int]:
        """This epoch's indices from `start` on, as a sampler gives them."""
        return iter(self.indices(torch.device("cpu"))[self.start :].tolist())

    def indices(self, device: torch.device) -> Tensor:
        if not self.shuffle:
            return torch.arange(self.rank, self.n, self.world_size, device=device)
        # Drawn on the CPU from its own generator: the same order on any device, whatever the global RNG.
        perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        perm = perm[: len(self) * self.world_size]
        return perm[self.rank :: self.world_size].to(device, non_blocking=True)


class Position:
    """Which epoch a loader is in and how many of its batches it has handed out, so that a loader
    restored from a checkpoint continues the epoch where it stopped (training loaders, shuffled).
    Unshuffled loaders (evaluation) serve every batch on every pass. Lightning calls `set_epoch` on
    `sampler` at each epoch start; the `len` stays the epoch's full length, as Lightning counts on."""

    sampler: EpochOrder
    batch_size: int

    def _begin_epoch(self) -> int:
        """Called as an epoch's iteration starts: the number of batches to leave out."""
        if self._served_epoch != self.sampler.epoch or not self.sampler.shuffle:
            self._served, self._served_epoch = 0, self.sampler.epoch
        return self._served

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._served_epoch, "batches_served": self._served}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._served_epoch, self._served = int(state["epoch"]), int(state["batches_served"])
        self.sampler.set_epoch(self._served_epoch)


class DeviceLoader(Position):
    """Batches sliced from tensors that already live on the training device; `drop_last` leaves out an
    epoch's last, partial batch (as DataLoader's option does)."""

    def __init__(
        self, x: Tensor, y: Tensor, batch_size: int, order: EpochOrder, drop_last: bool = False
    ) -> None:
        self.x, self.y, self.batch_size, self.drop_last = x, y, batch_size, drop_last
        self.sampler = order  # the attribute Lightning looks for to call set_epoch
        self.batch_sampler = None  # Lightning reads it wherever there is a sampler
        self._served = 0  # batches of the current epoch already served
        self._served_epoch = order.epoch

    def __len__(self) -> int:
        n, size = len(self.sampler), self.batch_size
        return n // size if self.drop_last else -(-n // size)  # the last, partial batch dropped or kept

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        idx = self.sampler.indices(self.x.device)
        end = len(self) * self.batch_size if self.drop_last else len(idx)
        for start in range(self._begin_epoch() * self.batch_size, end, self.batch_size):
            batch = idx[start : start + self.batch_size]
            self._served += 1
            # index_select, not x[batch]: on a CPU advanced indexing of rows is ~20x slower (144 vs 7 us
            # for 64 rows of 64 floats)
            yield self.x.index_select(0, batch), self.y.index_select(0, batch)
