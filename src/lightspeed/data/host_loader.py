"""torch's DataLoader (workers, pinned memory) over the epoch order of `device_loader`, and the choices that
lead to it: data read from files, or too large for a GPU's free memory. Imported only where a DataLoader
may be used: a default run slices its in-memory data set on the device (`DeviceLoader`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from lightspeed.compat.trainer import UnrepeatedDistributedSampler
from lightspeed.core.config import ConfigError
from lightspeed.data.device_loader import EpochOrder, Position

if TYPE_CHECKING:
    from lightspeed.data.base import ArrayDataModule

#: Device-resident data may take at most this share of the device's free memory: the rest is for
#: weights, optimizer state and activations.
ON_DEVICE_MAX_SHARE = 0.5


def on_cuda_choice(
    on_device: bool | str, nbytes: int, device: torch.device, size: str
) -> tuple[bool, str | None]:
    """`base.on_device_choice` on a CUDA device: on it when the data set (`size`) fits within
    `ON_DEVICE_MAX_SHARE` of its free memory; `true` where it does not fit is a ConfigError."""
    gib = 2**30
    free, _ = torch.cuda.mem_get_info(device)
    fits = nbytes <= ON_DEVICE_MAX_SHARE * free
    message = (
        f"data.on_device={on_device}: the data set needs {size}, "
        f"{'within' if fits else 'more than'} {ON_DEVICE_MAX_SHARE:.0%} of the {free / gib:.1f} GiB "
        f"free on {device}"
    )
    if fits:
        return (
            True,
            f"{message}: it lives there, batches are sliced on the device" if on_device == "auto" else None,
        )
    if on_device is True:
        raise ConfigError(f"{message}: set data.on_device=auto or false")
    return False, f"{message}: using a DataLoader (workers, pinned memory)"


def files_on_device(dm: ArrayDataModule) -> bool:
    """Whether a data set read from files (not TensorDatasets) is served from the device: no, it takes a
    DataLoader; `on_device=true` is refused."""
    if dm.on_device is True:
        raise ConfigError(
            f"data.on_device=true needs the data set in memory; {type(dm).__name__} reads it "
            "from files: set data.on_device=auto or false"
        )
    return False


def dataloader(dm: ArrayDataModule, split: str, order: EpochOrder) -> DataLoader:
    """The loader of `split` with `dm`'s loader settings; its workers are seeded from a generator of their own
    (not the global RNG, which creating an iterator would otherwise advance: a resumed run must draw the
    same numbers as an uninterrupted one)."""
    workers = dm.num_workers
    options = {
        "batch_size": dm.batch_size,
        "num_workers": workers,
        "pin_memory": dm.pin_memory,
        "persistent_workers": dm.persistent_workers and workers > 0,
        "prefetch_factor": dm.prefetch_factor if workers > 0 else None,
        "generator": torch.Generator().manual_seed(order.seed + order.rank),
    }
    # A batch is fetched whole (`__getitems__`): in-memory arrays with one indexing operation, not
    # sample by sample; files decoded together in one worker.
    dataset = dm.splits[split]
    batches = WholeBatches(dataset) if isinstance(dataset, TensorDataset) else dataset
    if order.shuffle:
        return ResumableDataLoader(
            batches, sampler=order, collate_fn=whole_batch, drop_last=dm.drop_last, **options
        )
    # Evaluation (and overfit_batches) under DDP: each sample on exactly one rank. Lightning's default
    # sampler pads the last batch with repeats, which would count some samples twice in the metrics.
    world = order.num_replicas
    sampler = UnrepeatedDistributedSampler(dataset, num_replicas=world, rank=order.rank, shuffle=False)
    whole = whole_batch if hasattr(batches, "__getitems__") else None  # else: your Dataset, per sample
    return DataLoader(batches, sampler=sampler if world > 1 else None, collate_fn=whole, **options)


class ResumableDataLoader(Position, DataLoader):
    """torch's DataLoader over an `EpochOrder` sampler. Batches are counted as they reach the training
    loop, not as the sampler hands out indices: workers fetch ahead of what was trained on."""

    def __init__(self, *args: Any, sampler: EpochOrder, **kwargs: Any) -> None:
        super().__init__(*args, sampler=sampler, **kwargs)
        self._served = 0
        self._served_epoch = sampler.epoch

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self.sampler.start = self._begin_epoch() * self.batch_size
        try:
            for batch in super().__iter__():
                self._served += 1
                yield batch
        finally:
            self.sampler.start = 0


class WholeBatches(TensorDataset):
    """In-memory arrays that a DataLoader fetches a batch at a time: `__getitems__` indexes every tensor
    once with the batch's indices, where torch's default fetches each sample with `__getitem__` and
    `default_collate` stacks them (~0.5 ms for 64 small samples on a CPU, most of a small model's step).
    The batch comes out whole, so the loader's `collate_fn` must be `whole_batch`; the values are the
    same as the stacked samples."""

    def __init__(self, split: TensorDataset) -> None:
        super().__init__(*split.tensors)

    def __getitems__(self, indices: list[int]) -> list[Tensor]:
        idx = torch.tensor(indices)  # converted once for all the tensors
        return [t.index_select(0, idx) for t in self.tensors]


def whole_batch(batch: list[Tensor]) -> list[Tensor]:
    """The collate_fn for `WholeBatches`: the batch is already made (module level: workers pickle it)."""
    return batch
