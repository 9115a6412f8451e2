"""A DataModule for data sets that fit in host memory as tensors: splits, normalisation, loaders
(DataLoader with pinned memory and workers, or device-resident), transfer and on-device augmentation."""

from __future__ import annotations

import hashlib
import math
import os
from abc import abstractmethod
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightspeed.compat.trainer import UnrepeatedDistributedSampler
from lightspeed.core.config import ConfigError
from lightspeed.data.augment import random_crop, random_flip
from lightspeed.data.device_loader import (
    DeviceLoader,
    EpochOrder,
    Position,
    ResumableDataLoader,
    WholeBatches,
    whole_batch,
)

#: The splits of every data set; `load_arrays` may give any of them, the rest are drawn from `train`.
SPLITS = ("train", "val", "test")

#: (inputs, labels) of a split.
Arrays = tuple[Tensor, Tensor]


def sample_ids(x: Tensor) -> Tensor:
    """A 64-bit hash of each sample's raw input (int64 (N,)): which samples a run trained on, kept in its
    checkpoints, so that an evaluation can say when its test set holds some of them."""
    rows = x.detach().cpu().reshape(len(x), -1).contiguous().view(torch.uint8).numpy()  # any dtype's bytes
    return torch.tensor(
        [
            int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), "little", signed=True)
            for row in rows
        ],
        dtype=torch.int64,
    )


#: A label that is no class (a sample, or a position, not scored): torch's cross_entropy skips it by default.
IGNORE_INDEX = -100


def _spread(std: Tensor) -> Tensor:
    """A standard deviation to divide by: 1 where a feature does not vary in the train split (as
    scikit-learn's StandardScaler does), which would otherwise scale its values elsewhere by ~1e8."""
    return torch.where(std < 1e-6, torch.ones_like(std), std)


def mean_std(x: Tensor) -> tuple[float, float]:
    """Mean and standard deviation of all of `x`'s values, in float64 chunks: no float copy of a large
    uint8 data set."""
    n = x.numel()
    total = squares = 0.0
    for chunk in x.reshape(len(x), -1).split(4096):
        values = chunk.double()
        total += float(values.sum())
        squares += float((values * values).sum())
    mean = total / n
    variance = max(0.0, squares / n - mean * mean) * n / max(1, n - 1)
    return mean, max(math.sqrt(variance), 1e-8)


#: Device-resident data may take at most this share of the device's free memory: the rest is for
#: weights, optimizer state and activations.
ON_DEVICE_MAX_SHARE = 0.5


def on_device_choice(on_device: bool | str, nbytes: int, device: torch.device) -> tuple[bool, str | None]:
    """Whether an in-memory data set of `nbytes` is served from the training device (sliced there, no
    DataLoader), and the line that says why (None: nothing to say). `auto`: yes when it fits within
    `ON_DEVICE_MAX_SHARE` of a GPU's free memory, or when it is in host memory already (CPU, and MPS's
    unified memory); workers asked for by number turn `auto` off before (`speed.accel.resolve`). `true`
    where it does not fit is a ConfigError."""
    if on_device is False:
        return False, None
    gib = 2**30
    size = f"{nbytes / gib:.2f} GiB" if nbytes >= gib / 10 else f"{nbytes / 2**20:.1f} MiB"
    if device.type != "cuda":
        where = "host memory" if device.type == "cpu" else f"{device.type} (unified memory)"
        note = f"data.on_device=auto: the data set ({size}) is sliced in {where}, no DataLoader"
        return True, note if on_device == "auto" else None
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
        self._check_batch_size(stage)

    # radon C: once; split-name check; bytes vs float normalisation (per feature)
    def _load(self) -> None:
        """The splits, normalised; once."""
        if self.splits:
            return
        loaded = self.load_arrays()
        given = dict(loaded) if isinstance(loaded, dict) else {"train": loaded}
        unknown = set(given) - set(SPLITS)
        if "train" not in given or unknown:
            raise ValueError(
                f"{type(self).__name__}.load_arrays returned splits {sorted(given)}: name them "
                f"{', '.join(SPLITS)} (train is required)"
            )
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
        if self.normalize == "per_feature":
            raise ConfigError(
                "data.normalize=per_feature is for float (tabular) inputs; these are uint8 images: use "
                "data.normalize=true (one mean and std) or false"
            )
        return mean_std(train_x) if self.normalize else (0.0, 255.0)

    def _check_labels(self, parts: dict[str, Arrays]) -> None:
        """A data set that declares `num_classes` gives integer labels from 0 to num_classes - 1: one line
        before any training, where a classifier's loss would fail with a traceback (float targets) or on
        a GPU with a device-side assert (a label out of range)."""
        classes = getattr(self, "num_classes", None)
        if classes is None:
            return
        name = type(self).__name__
        for split, (_, y) in parts.items():
            if y.is_floating_point() or y.dtype == torch.bool:
                raise ConfigError(
                    f"data: {name} declares num_classes={classes}, but its {split} labels are {y.dtype}: "
                    f"give int64 class labels 0..{classes - 1}; for other targets (continuous, multi-hot) "
                    "declare what your model is built from instead, e.g. num_targets for model=regressor"
                )
            scored = y[y != IGNORE_INDEX]  # cross_entropy's default ignore_index: not a class
            if len(scored) == 0:
                continue
            low, high = int(scored.min()), int(scored.max())
            if low < 0 or high >= classes:
                raise ConfigError(
                    f"data: {name}'s {split} labels range over {low}..{high}, outside 0..{classes - 1} for "
                    f"num_classes={classes}: set num_classes to the number of classes, or fix the labels"
                )

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
        self.prepare_data()  # asked before training (the model is built from them): the files first
        self._load()
        y = self.splits["train"].tensors[1].double()
        y = y.reshape(len(y), -1)
        return y.mean(dim=0).tolist(), _spread(y.std(dim=0)).tolist()

    def _check_batch_size(self, stage: str | None) -> None:
        per_rank = len(self.splits["train"]) // self._ranks()[1]
        overfit = self.trainer is not None and self.trainer.overfit_batches > 0  # unshuffled: nothing dropped
        if stage in (None, "fit") and self.drop_last and not overfit and self.batch_size > per_rank:
            raise ConfigError(
                f"data.batch_size={self.batch_size} is larger than the {per_rank} training samples of each "
                "rank: with data.drop_last=true not one batch would train; lower data.batch_size, or set "
                "data.drop_last=false"
            )

    # radon C: given vs drawn splits, each refused when empty; filters over split names
    def _draw_missing_splits(self, given: dict[str, Arrays]) -> dict[str, Arrays]:
        """`val` and `test` where `load_arrays` did not give them: drawn from `train` by `split_seed` alone,
        so they are the same on every rank and in every rerun."""
        missing = [name for name in ("val", "test") if name not in given]
        x, y = given["train"]
        n = len(x)
        fractions = {"val": self.val_fraction, "test": self.test_fraction}
        sizes = {name: round(n * fractions[name]) for name in missing}
        n_train = n - sum(sizes.values())
        counts = {"train": n_train, **sizes, **{k: len(v[0]) for k, v in given.items() if k != "train"}}
        empty = [name for name, (inputs, _) in given.items() if len(inputs) < 1]
        if empty:
            raise ValueError(f"{type(self).__name__}.load_arrays returned an empty {empty[0]} split")
        if min(counts.values()) < 1:
            drawn = " and ".join(f"data.{name}_fraction={fractions[name]}" for name in missing)
            raise ConfigError(
                f"{drawn} leave an empty split of {n} samples "
                f"({', '.join(f'{k} {v}' for k, v in counts.items())}): change the fractions"
            )
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.split_seed))
        drawn_idx = dict(zip(("train", *missing), order.split([n_train, *sizes.values()]), strict=True))
        parts = {name: (x[idx], y[idx]) for name, idx in drawn_idx.items()}
        return {name: parts[name] if name in parts else given[name] for name in SPLITS}

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
            if self.on_device is True:
                raise ConfigError(
                    f"data.on_device=true needs the data set in memory; {type(self).__name__} reads it "
                    "from files: set data.on_device=auto or false"
                )
            return False
        need = sum(t.numel() * t.element_size() for ds in self.splits.values() for t in ds.tensors)
        decision, note = on_device_choice(self.on_device, need, self._device)
        if note:
            rank_zero_info(note)
        return decision

    def _loader(self, split: str, shuffle: bool) -> DataLoader | DeviceLoader:
        rank, world = self._ranks()
        # The data order is the run's seed's, as for Lightning's DistributedSampler: equal on all ranks.
        order = EpochOrder(
            len(self.splits[split]), shuffle, int(os.environ.get("PL_GLOBAL_SEED", 0)), rank, world
        )
        if self.uses_device_loader():
            if split not in self._device_splits:
                self._device_splits[split] = tuple(t.to(self._device) for t in self.splits[split].tensors)
            x, y = self._device_splits[split]
            return DeviceLoader(x, y, self.batch_size, order, drop_last=shuffle and self.drop_last)
        options = self._loader_options(order.seed + rank)
        # A batch is fetched whole (`__getitems__`): in-memory arrays with one indexing operation, not
        # sample by sample; files decoded together in one worker.
        dataset = self.splits[split]
        batches = WholeBatches(dataset) if isinstance(dataset, TensorDataset) else dataset
        if shuffle:
            return ResumableDataLoader(
                batches, sampler=order, collate_fn=whole_batch, drop_last=self.drop_last, **options
            )
        # Evaluation (and overfit_batches) under DDP: each sample on exactly one rank. Lightning's default
        # sampler pads the last batch with repeats, which would count some samples twice in the metrics.
        sampler = UnrepeatedDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
        whole = whole_batch if hasattr(batches, "__getitems__") else None  # else: your Dataset, per sample
        return DataLoader(batches, sampler=sampler if world > 1 else None, collate_fn=whole, **options)

    def _loader_options(self, seed: int) -> dict[str, Any]:
        """A DataLoader's settings: the loader knobs, and the generator its workers are seeded from (not the
        global RNG, which creating an iterator would otherwise advance: a resumed run must draw the same
        numbers as an uninterrupted one)."""
        workers = self.num_workers
        return {
            "batch_size": self.batch_size,
            "num_workers": workers,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers and workers > 0,
            "prefetch_factor": self.prefetch_factor if workers > 0 else None,
            "generator": torch.Generator().manual_seed(seed),
        }

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
        if self.trainer is not None and self.trainer.training and x.dim() == 4:
            if self.augment["crop_padding"]:
                x = random_crop(x, int(self.augment["crop_padding"]))
            if self.augment["flip"]:
                x = random_flip(x)
        return x, y
