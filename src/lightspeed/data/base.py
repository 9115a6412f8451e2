"""A DataModule for data sets that fit in host memory as tensors: splits, normalisation, loaders."""

from __future__ import annotations

import os
from abc import abstractmethod

import lightning as L
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from lightspeed.config import ConfigError


def auto_num_workers(devices_per_node: int) -> int:
    """Loader workers per device: the CPUs this process may use, shared among devices, one kept for the
    training process itself, at most 8 (more rarely helps and costs memory and start-up time)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(8, cpus // max(1, devices_per_node) - 1))


class ArrayDataModule(L.LightningDataModule):
    """Subclasses say what the arrays are (`load_arrays`) and their shape; this class does the rest.

    The train/val/test split comes from `split_seed` alone, so it is the same on every rank and in every
    rerun; inputs are standardised with statistics of the train split only.
    """

    #: (C, H, W) of one input and the number of classes; subclasses set them (or compute them from
    #: their own arguments) so that the model can be built before any data is loaded.
    input_shape: tuple[int, ...]
    num_classes: int

    def __init__(
        self,
        batch_size: int = 64,
        num_workers: int | str = "auto",
        pin_memory: bool | str = "auto",
        persistent_workers: bool = True,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        normalize: bool = True,
    ) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.split_seed = split_seed
        self.normalize = normalize
        self.splits: dict[str, TensorDataset] = {}

    @abstractmethod
    def load_arrays(self) -> tuple[Tensor, Tensor]:
        """All samples as (inputs float32 (N, *input_shape), labels int64 (N,))."""

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        x, y = self.load_arrays()
        n = len(x)
        n_val, n_test = round(n * self.val_fraction), round(n * self.test_fraction)
        n_train = n - n_val - n_test
        if min(n_train, n_val, n_test) < 1:
            raise ConfigError(
                f"data.val_fraction={self.val_fraction} and data.test_fraction={self.test_fraction} leave an "
                f"empty split of {n} samples (train {n_train}, val {n_val}, test {n_test}): "
                "change the fractions"
            )
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.split_seed))
        parts = dict(zip(("train", "val", "test"), order.split([n_train, n_val, n_test]), strict=True))
        if self.normalize:
            train_x = x[parts["train"]]
            x = (x - train_x.mean()) / train_x.std().clamp_min(1e-8)
        self.splits = {name: TensorDataset(x[idx].contiguous(), y[idx]) for name, idx in parts.items()}

    def _resolved_num_workers(self) -> int:
        if self.num_workers != "auto":
            return int(self.num_workers)
        return auto_num_workers(self.trainer.num_devices if self.trainer is not None else 1)

    def _resolved_pin_memory(self) -> bool:
        """Pinned host memory only pays off when batches go to a CUDA device."""
        if self.pin_memory != "auto":
            return bool(self.pin_memory)
        return self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        workers = self._resolved_num_workers()
        sampler = None
        if not shuffle and self.trainer is not None and self.trainer.world_size > 1:
            # Evaluation under DDP: each sample on exactly one rank. Lightning's default sampler pads the
            # last batch with repeats, which would count some samples twice in val/test metrics.
            sampler = UnrepeatedDistributedSampler(
                self.splits[split],
                num_replicas=self.trainer.world_size,
                rank=self.trainer.global_rank,
                shuffle=False,
            )
        return DataLoader(
            self.splits[split],
            batch_size=self.batch_size,
            shuffle=shuffle,
            sampler=sampler,
            num_workers=workers,
            pin_memory=self._resolved_pin_memory(),
            persistent_workers=self.persistent_workers and workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)
