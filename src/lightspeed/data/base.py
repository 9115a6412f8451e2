"""A DataModule for data sets that fit in host memory as tensors: splits, normalisation, loaders
(DataLoader with pinned memory and workers, or device-resident), transfer and on-device augmentation."""

from __future__ import annotations

import hashlib
import os
from abc import abstractmethod
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightspeed.data.device_loader import DeviceLoader, EpochOrder, Position

#: The splits of every data set; `load_arrays` may give any of them, the rest are drawn from `train`.
SPLITS = ("train", "val", "test")

#: (inputs, labels) of a split.
Arrays = tuple[Tensor, Tensor]


def sample_ids(x: Tensor) -> Tensor:
    """A 64-bit hash of each sample's raw input (int64 (N,)): which samples a run trained on, kept in its
    checkpoints, so that an evaluation can say when its test set holds some of them."""
    rows = x.detach().cpu().reshape(len(x), -1).contiguous().view(torch.uint8).numpy()  # any dtype's bytes
    digests = [hashlib.blake2b(row.tobytes(), digest_size=8).digest() for row in rows]
    return torch.tensor([int.from_bytes(d, "little", signed=True) for d in digests], dtype=torch.int64)


#: A label that is no class (a sample, or a position, not scored): torch's cross_entropy skips it by default.
IGNORE_INDEX = -100


def _spread(std: Tensor) -> Tensor:
    """A standard deviation to divide by: 1 where a feature does not vary in the train split (as
    scikit-learn's StandardScaler does), which would otherwise scale its values elsewhere by ~1e8."""
    return torch.where(std < 1e-6, torch.ones_like(std), std)


def on_device_choice(on_device: bool | str, nbytes: int, device: torch.device) -> tuple[bool, str | None]:
    """Whether an in-memory data set of `nbytes` is served from the training device (sliced there, no
    DataLoader), and the line that says why (None: nothing to say). `auto`: yes when it fits within
    `host_loader.ON_DEVICE_MAX_SHARE` of a GPU's free memory, or when it is in host memory already (CPU,
    and MPS's unified memory); workers asked for by number turn `auto` off before (`speed.accel.resolve`).
    `true` where it does not fit is a ConfigError."""
    if on_device is False:
        return False, None
    size = f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 / 10 else f"{nbytes / 2**20:.1f} MiB"
    if device.type == "cuda":
        from lightspeed.data.host_loader import on_cuda_choice

        return on_cuda_choice(on_device, nbytes, device, size)
    where = "host memory" if device.type == "cpu" else f"{device.type} (unified memory)"
    note = f"data.on_device=auto: the data set ({size}) is sliced in {where}, no DataLoader"
    return True, note if on_device == "auto" else None


class ArrayDataModule(L.LightningDataModule):
    """Subclasses say what the arrays are (`load_arrays`) and their shape; this class does the rest.

    The train/val/test split comes from `split_seed` alone, so it is the same on every rank and in every
    rerun; inputs are standardised with statistics of the train split only. Training batches all have
    `batch_size` samples (`drop_last`: a compiled model would recompile for a smaller last batch, and
    the epoch's order moves the left-out few each epoch); evaluation sees every sample.

    Loader settings arrive as concrete values: a run's `auto`s are resolved once, by `lightspeed.speed.accel`.
    `on_device="auto"` is decided here, where the data set's size is known (`on_device_choice`).
    """

    #: What the model is built from (`model_args`): the shape of one input, and the number of classes (a
    #: classifier's) or of targets (a regressor's). Subclasses set those of their task (or compute them
    #: from their own arguments), so that the model can be built before any data is loaded. A data set
    #: that declares `num_classes` has its labels checked.
    input_shape: tuple[int, ...]
    num_classes: int
    num_targets: int

    def __init__(
        self,
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = True,
        prefetch_factor: int | None = None,
        non_blocking: bool = False,
        on_device: bool | str = False,
        drop_last: bool = True,
        augment: dict[str, Any] | None = None,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        normalize: bool | str = True,
    ) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self.non_blocking = non_blocking
        self.on_device = on_device
        self.drop_last = drop_last
        self.augment = {"crop_padding": 0, "flip": False, **(augment or {})}
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.split_seed = split_seed
        self.normalize = normalize
        #: Per split: a TensorDataset, or a Dataset whose `__getitems__` gives a whole batch (`whole_batch`).
        self.splits: dict[str, Dataset] = {}
        self.sample_ids: dict[str, Tensor] = {}  # per split, see `sample_ids`
        #: (mean, std) that uint8 inputs are scaled by on the device; None for float inputs, standardised
        #: once in `setup`.
        self.input_scale: tuple[float, float] | None = None
        self._device_splits: dict[str, tuple[Tensor, Tensor]] = {}
        self._train_loader: Position | None = None  # its position is saved in checkpoints
        self._train_position: dict[str, Any] | None = None  # restored from a checkpoint
        self._on_device_decision: bool | None = None

    @abstractmethod
    def load_arrays(self) -> Arrays | dict[str, Arrays]:
        """The samples as (inputs (N, ...), targets (N, ...)). Inputs are float32 (standardised as
        `normalize` says), uint8 (images as published: kept as bytes, scaled on the device by the train
        split's mean and std) or other integers (tokens: left as they are). Targets are what the task
        needs: int64 class labels, float regression targets, token sequences. All samples, split here at
        random; or named splits kept as given, `{"train": ..., "test": ...}` (an official test split),
        where a missing `val` or `test` is drawn at random from `train` (`val_fraction`, `test_fraction`
        of its samples)."""

    def setup(self, stage: str | None = None) -> None:
        self._load()
        per_rank = len(self.splits["train"]) // self._ranks()[1]
        overfit = self.trainer is not None and self.trainer.overfit_batches > 0  # unshuffled: nothing dropped
        if stage in (None, "fit") and self.drop_last and not overfit and self.batch_size > per_rank:
            from lightspeed.data.refusals import batch_too_large

            raise batch_too_large(self.batch_size, per_rank)

    # radon C: once; split-name check; bytes vs float normalisation (per feature)
    def _load(self) -> None:
        """The splits, normalised; once."""
        if self.splits:
            return
        loaded = self.load_arrays()
        given = dict(loaded) if isinstance(loaded, dict) else {"train": loaded}
        if "train" not in given or set(given) - set(SPLITS):
            from lightspeed.data.refusals import bad_split_names

            raise bad_split_names(self, given)
        parts = self._draw_missing_splits(given)
        self._check_labels(parts)
        # Before normalisation: a sample's identity is its raw input, whatever the statistics.
        self.sample_ids = {name: sample_ids(x) for name, (x, _) in parts.items()}
        train_x = parts["train"][0]
        if train_x.dtype == torch.uint8:
            # Kept and moved as bytes (a quarter of float32's memory and copy time), scaled on the device.
            self.input_scale = self._byte_scale(train_x)
        elif train_x.is_floating_point() and self.normalize:
            # per_feature: each input feature by its own statistics (tabular columns in unrelated units)
            dims = 0 if self.normalize == "per_feature" else None
            mean, std = train_x.mean(dim=dims), _spread(train_x.std(dim=dims))
            parts = {name: ((x - mean) / std, y) for name, (x, y) in parts.items()}
        self.splits = {name: TensorDataset(x.contiguous(), y) for name, (x, y) in parts.items()}

    def _byte_scale(self, train_x: Tensor) -> tuple[float, float]:
        """(mean, std) that uint8 inputs are scaled by on the device: the train split's, or 0 and 255."""
        from lightspeed.data.stats import byte_scale

        return byte_scale(train_x, self.normalize)

    def _check_labels(self, parts: dict[str, Arrays]) -> None:
        """A data set that declares `num_classes` gives integer labels from 0 to num_classes - 1: one line
        before any training, where a classifier's loss would fail with a traceback (float targets) or on
        a GPU with a device-side assert (a label out of range)."""
        classes = getattr(self, "num_classes", None)
        for split, (_, y) in parts.items() if classes is not None else ():
            scored = y[y != IGNORE_INDEX]  # cross_entropy's default ignore_index: not a class
            not_int = y.is_floating_point() or y.dtype == torch.bool
            if not_int or (len(scored) > 0 and (scored.min() < 0 or scored.max() >= classes)):
                from lightspeed.data.refusals import bad_labels

                raise bad_labels(self, split, y, classes)

    def model_args(self) -> dict[str, Any]:
        """What a model for this data is built from: the engine passes each to the model's constructor
        where conf/model leaves it unset. The shape of one input, and the number of classes (class
        labels) or of targets, with the train split's target statistics (a regressor standardises its
        targets by them; this loads the data). A data set whose models need other things says so by
        overriding it (`sort.py`: `vocab_size`, `block_size`)."""
        args: dict[str, Any] = {"input_shape": list(self.input_shape)} if hasattr(self, "input_shape") else {}
        if hasattr(self, "num_classes"):
            args["num_classes"] = self.num_classes
        if hasattr(self, "num_targets"):
            mean, std = self._target_stats()
            args |= {"num_targets": self.num_targets, "target_mean": mean, "target_std": std}
        return args

    def _target_stats(self) -> tuple[list[float], list[float]]:
        from lightspeed.data.stats import target_stats  # regression targets only

        return target_stats(self)

    def _draw_missing_splits(self, given: dict[str, Arrays]) -> dict[str, Arrays]:
        """`val` and `test` where `load_arrays` did not give them: drawn from `train` by `split_seed` alone,
        so they are the same on every rank and in every rerun."""
        missing = [name for name in ("val", "test") if name not in given]
        x, y = given["train"]
        sizes = [round(len(x) * getattr(self, f"{name}_fraction")) for name in missing]
        n_train = len(x) - sum(sizes)
        if min(n_train, *sizes, *(len(inputs) for inputs, _ in given.values())) < 1:
            from lightspeed.data.refusals import empty_split

            raise empty_split(self, given, missing)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(self.split_seed))
        drawn = dict(zip(("train", *missing), order.split([n_train, *sizes]), strict=True))
        parts = given | {name: (x[idx], y[idx]) for name, idx in drawn.items()}
        return {name: parts[name] for name in SPLITS}

    # --- where the batches come from -------------------------------------------------------------

    @property
    def _device(self) -> torch.device:
        return self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")

    def _ranks(self) -> tuple[int, int]:
        return (self.trainer.global_rank, self.trainer.world_size) if self.trainer is not None else (0, 1)

    def uses_device_loader(self) -> bool:
        """`on_device`: true, false, or auto (true when the whole data set fits on the device). Decided
        once, before any split is moved, so that all splits take the same path."""
        if self._on_device_decision is None:
            self._on_device_decision = self._decide_on_device()
        return self._on_device_decision

    def _decide_on_device(self) -> bool:
        if not all(isinstance(ds, TensorDataset) for ds in self.splits.values()):
            from lightspeed.data.host_loader import files_on_device

            return files_on_device(self)
        need = sum(t.numel() * t.element_size() for ds in self.splits.values() for t in ds.tensors)
        decision, note = on_device_choice(self.on_device, need, self._device)
        if note:
            rank_zero_info(note)
        return decision

    def _loader(self, split: str, shuffle: bool) -> DataLoader | DeviceLoader:
        # The data order is the run's seed's, as for Lightning's DistributedSampler: equal on all ranks.
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        order = EpochOrder(len(self.splits[split]), shuffle, seed, *self._ranks())
        if self.uses_device_loader():
            if split not in self._device_splits:
                self._device_splits[split] = tuple(t.to(self._device) for t in self.splits[split].tensors)
            x, y = self._device_splits[split]
            return DeviceLoader(x, y, self.batch_size, order, drop_last=shuffle and self.drop_last)
        from lightspeed.data.host_loader import dataloader  # workers, pinned memory, files

        return dataloader(self, split, order)

    def train_dataloader(self) -> DataLoader | DeviceLoader:
        # overfit_batches: the same batches every epoch
        overfit = self.trainer is not None and self.trainer.overfit_batches > 0
        loader = self._loader("train", shuffle=not overfit)
        if isinstance(loader, Position):
            if self._train_position is not None:
                loader.load_state_dict(self._train_position)
            self._train_loader = loader
        return loader

    # The training loader's position travels in the checkpoint through the DataModule's state, which
    # Lightning restores before it builds the loaders. The loader's own state_dict would be lost whenever
    # `trainer.estimated_stepping_batches` builds the loader before the restore (Lightning #20550).
    def state_dict(self) -> dict[str, Any]:
        return {"train_position": self._train_loader.state_dict()} if self._train_loader is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._train_position = state_dict.get("train_position")

    def val_dataloader(self) -> DataLoader | DeviceLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader | DeviceLoader:
        return self._loader("test", shuffle=False)

    def predict_dataloader(self) -> DataLoader | DeviceLoader:
        return self._loader("test", shuffle=False)

    # --- what happens to a batch on its way to the model -----------------------------------------

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Host-to-device copies, asynchronous when `non_blocking` (they overlap compute only from
        pinned memory). Batches of the device loader are already there: `.to` returns them as they are."""
        return apply_to_collection(batch, Tensor, lambda t: t.to(device, non_blocking=self.non_blocking))

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Scale uint8 inputs and augment training batches on the device, where it is cheap."""
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            return batch  # not an (inputs, labels) batch: e.g. the model summary's example input
        x, y = batch
        if x.dtype == torch.uint8 and self.input_scale is not None:
            mean, std = self.input_scale
            x = (x.float() - mean) / std
        if self.trainer is not None and self.trainer.training and x.dim() == 4 and any(self.augment.values()):
            from lightspeed.data.augment import augment  # only where data.augment asks for some

            x = augment(x, self.augment["crop_padding"], self.augment["flip"])
        return x, y
