"""Data larger than memory: any data set's splits written once as LitData shards (`make shards data=...`),
then streamed (`data=shards data.path=...`) a chunk at a time from the files.

LitData (Lightning's own streaming format) was chosen over WebDataset by measurement and by what each
does for us (docs/data.md): on the same 20,000 CIFAR-sized samples it read 25,200 samples/s on one CPU
process against WebDataset's 1,840 (tar members decoded one by one); its loader keeps its position in a
`state_dict` of plain values, so a run killed mid-epoch continues with the very next batch (WebDataset's
iterators keep none); and it deals chunks to ranks and workers itself (disjoint under DDP).

Samples are stored as the in-memory DataModule holds them after `setup`: uint8 images as bytes (scaled on
the device by the statistics kept in `meta.json`), float inputs already standardised.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset, default_collate

from lightspeed.core.config import ConfigError
from lightspeed.core.files import crc32, readable
from lightspeed.data.base import SPLITS, ArrayDataModule
from lightspeed.data.host_loader import WholeBatches, whole_batch

META = "meta.json"
IDS = "ids.pt"
CHECKSUMS = "chunk_crc32"  # meta.json: {split: {chunk file: CRC-32}}, checked as each chunk is first read


def _litdata() -> Any:
    try:
        import litdata
    except ImportError:
        raise ConfigError(
            "data=shards and make shards need LitData: make install EXTRAS=dev,streaming (with a CPU build "
            "of torch, install torchvision from the index torch came from first)"
        ) from None
    return litdata


# radon C: refusals, then a loop over splits and samples, then the meta's optional entries
def write_shards(dm: ArrayDataModule, out: Path, chunk_bytes: int | str = "64MB") -> Path:
    """Every split of `dm` into `out/<split>/` (LitData chunks of at most `chunk_bytes`, and the samples'
    ids), and `out/meta.json` (shape, classes, the device-side scaling). Written into a temporary folder
    beside `out`, renamed when whole: an interrupted conversion leaves nothing that a run would read."""
    _litdata()
    from litdata.streaming.writer import BinaryWriter

    if out.exists() and not out.is_dir():
        raise ConfigError(f"shards.out={out} is a file: name a folder to write the shards into")
    if out.exists() and any(out.iterdir()):
        what = "shards already" if (out / META).is_file() else "other files"
        raise ConfigError(f"shards.out={out} holds {what}: delete it, or write to another folder")
    dm.prepare_data()
    dm.setup()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        counts = {}
        for split in SPLITS:
            dataset = dm.splits[split]
            batches = WholeBatches(dataset) if isinstance(dataset, TensorDataset) else dataset
            loader = DataLoader(batches, batch_size=256, num_workers=dm.num_workers, collate_fn=whole_batch)
            writer = BinaryWriter(str(tmp / split), chunk_bytes=chunk_bytes)
            index = 0
            for x, y in loader:
                for sample, label in zip(x.numpy(), y.tolist(), strict=True):
                    writer[index] = {"x": sample, "y": label}
                    index += 1
            writer.done()
            writer.merge()
            torch.save(dm.sample_ids[split].clone(), tmp / split / IDS)
            counts[split] = index
        targets = dm.splits["train"].tensors[1] if isinstance(dm.splits["train"], TensorDataset) else None
        meta = {
            "declares": declared(dm),  # its attributes: input_shape, num_classes, class_names, ...
            "model_args": dm.model_args(),  # what a model is built from, as the source data set says
            "target_stats": list(dm._target_stats())
            if targets is not None and targets.is_floating_point()
            else None,
            "input_scale": list(dm.input_scale) if dm.input_scale is not None else None,
            "samples": counts,
            "source": type(dm).__name__,
            CHECKSUMS: {split: _checksums(tmp / split) for split in SPLITS},
        }
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
        readable(tmp)
        try:
            if out.exists():
                out.rmdir()  # empty (checked above)
            os.replace(tmp, out)  # whole or not at all
        except OSError:  # another `make shards` wrote it meanwhile: theirs stays, whole
            raise ConfigError(
                f"shards.out={out} was written by another `make shards` meanwhile: use those, or write to "
                "another folder"
            ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _checksums(split: Path) -> dict[str, int]:
    index = json.loads((split / "index.json").read_text())
    return {c["filename"]: crc32(split / c["filename"]) for c in index["chunks"]}


def _numbers(value: Any, n: int | None = None) -> bool:
    return (
        isinstance(value, list)
        and (n is None or len(value) == n)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    )


#: meta.json's fields and the shape `write_shards` gives each (None: shards written before it was kept).
_META_FIELDS: dict[str, Any] = {
    "samples": lambda v: (
        isinstance(v, dict)
        and all(isinstance(v.get(s), int) and not isinstance(v[s], bool) and v[s] >= 0 for s in SPLITS)
    ),
    "declares": lambda v: v is None or isinstance(v, dict),
    "model_args": lambda v: v is None or isinstance(v, dict),
    "target_stats": lambda v: v is None or (isinstance(v, list) and len(v) == 2 and all(map(_numbers, v))),
    "input_scale": lambda v: v is None or _numbers(v, 2),
    CHECKSUMS: lambda v: (
        v is None or (isinstance(v, dict) and all(isinstance(v.get(s), dict) for s in SPLITS))
    ),
    "input_shape": lambda v: v is None or _numbers(v),
}


def _readable_shards(path: Path) -> dict[str, Any]:
    """meta.json, after checking that it and each split's index and chunk files are there and readable:
    one line naming what is wrong, where LitData would fail with a traceback in the middle of a run."""
    try:
        meta = json.loads((path / META).read_text())
        if not isinstance(meta, dict):
            raise ValueError("not the meta.json make shards writes")
        wrong = next((k for k, fits in _META_FIELDS.items() if not fits(meta.get(k))), None)
        if wrong is not None:
            raise ValueError(f"its {wrong} is not what make shards writes")
        for split in SPLITS:
            index = json.loads((path / split / "index.json").read_text())
            missing = [c["filename"] for c in index["chunks"] if not (path / split / c["filename"]).is_file()]
            if missing:
                raise ValueError(f"{split}/{missing[0]} is missing")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        raise ConfigError(
            f"data.path={path} holds broken shards ({err}): write them again with `make shards`"
        ) from None
    return meta


class _Bare(ArrayDataModule):
    def load_arrays(self) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


def declared(dm: ArrayDataModule) -> dict[str, Any]:
    """The plain values a DataModule holds beyond ArrayDataModule's own settings and state: what it declares
    for its model (input_shape, num_classes or num_targets, vocab_size, class_names, ...) and its own
    arguments. Kept in meta.json, so that the shards build the models the data set itself builds."""
    own = set(vars(_Bare()))
    mro = type(dm).__mro__
    names = {n for cls in mro[: mro.index(ArrayDataModule)] for n in vars(cls)} | set(vars(dm))
    found = {}
    for name in sorted(names - own):
        static = inspect.getattr_static(dm, name)
        if (
            name.startswith("_")
            or callable(static)
            or isinstance(static, (property, classmethod, staticmethod))
        ):
            continue
        value = list(static) if isinstance(static, tuple) else static
        try:
            found[name] = json.loads(json.dumps(value))  # plain data only (a Path, a listing: left out)
        except (TypeError, ValueError):
            continue
    return found


def pair(samples: list[dict[str, Any]]) -> list[Tensor]:
    """The collate_fn of the shards' loaders: LitData's samples (dicts) as an (inputs, labels) batch."""
    batch = default_collate(samples)
    return [batch["x"], batch["y"]]


@functools.cache
def _loader_class(litdata: Any) -> type:
    """LitData's StreamingDataLoader, made to start each epoch afresh after a resumed one.

    A loader restored from a checkpoint (`restore`) clears that flag only when an epoch's iteration runs to
    its end; Lightning stops at the epoch's last batch (or at `limit_train_batches`) without asking for one
    more, so the flag would stay set and the next epoch would continue the restored one: no batches at all
    (LitData 0.2.76, Lightning 2.6). Here the epoch after the one that began restored begins afresh."""

    class EpochLoader(litdata.StreamingDataLoader):
        _began_restored = False

        def __iter__(self) -> Any:
            if self._began_restored:
                self.restore = False
            self._began_restored = self.restore
            yield from super().__iter__()

    return EpochLoader


class ShardsDataModule(ArrayDataModule):
    """Streams the shards `write_shards` wrote: a chunk of each split in memory at a time (per loader
    worker), LitData's loaders with pinned memory and workers, scaling and augmentation on the device (as
    every in-memory data set). The training loader's position is kept in checkpoints (exact resume);
    under DDP each rank reads its own chunks."""

    # radon C: refusals, old shards
    def __init__(self, path: str | None = None, **loader_args: Any) -> None:
        super().__init__(**loader_args)
        if path is None:
            raise ConfigError(
                "data.path is not set: data=shards needs data.path=<folder that `make shards` wrote>"
            )
        self.path = Path(path).expanduser()
        if not (self.path / META).is_file():
            raise ConfigError(
                f"data.path={self.path} holds no shards ({META} missing): write them with "
                f"`make shards data=<name> shards.out={self.path}`"
            )
        meta = _readable_shards(self.path)
        # what the source data set declared (shards written before 2026-12-01: its shape and classes)
        declares = meta.get("declares") or {
            k: meta[k] for k in ("input_shape", "num_classes", "class_names") if meta.get(k) is not None
        }
        for name, value in declares.items():
            if not hasattr(self, name):  # never one of this class's own
                setattr(self, name, tuple(value) if name == "input_shape" else value)
        self._stats = meta.get("target_stats")
        self._model_args: dict[str, Any] | None = meta.get("model_args")
        self.input_scale = tuple(meta["input_scale"]) if meta.get("input_scale") is not None else None
        self.samples: dict[str, int] = meta["samples"]
        self._checksums: dict[str, dict[str, int]] | None = meta.get(CHECKSUMS)
        if self._checksums is None:
            rank_zero_info(
                f"data.path={self.path}: shards written before 2026-12-01 keep no chunk checksums, so "
                "changed bytes go unnoticed: write them again with `make shards` to have each chunk checked"
            )
        if isinstance(self.num_workers, int) and self.num_workers > 1:  # resolved (not `auto`)
            rank_zero_info(
                f"data.num_workers={self.num_workers}: LitData 0.2.76 makes each loader worker past the "
                "first wait ~0.1 s a batch for chunks on a local disk (docs/data.md); data.num_workers=1 "
                "may be faster"
            )

    def model_args(self) -> dict[str, Any]:
        """The source data set's, as `make shards` wrote them; shards written before they were kept give
        what the engine then passed to the shipped tasks' models, from the attributes they kept."""
        if self._model_args is not None:
            return dict(self._model_args)
        if hasattr(self, "vocab_size"):
            return {"vocab_size": self.vocab_size, "block_size": self.block_size}
        return super().model_args()

    def _target_stats(self) -> tuple[list[float], list[float]]:
        """The source's train split statistics, as written beside the shards (float targets only)."""
        if self._stats is None:
            raise ConfigError(
                f"data.path={self.path}: these shards hold class labels, not regression targets: train a "
                "model that takes their classes"
            )
        return self._stats[0], self._stats[1]

    def setup(self, stage: str | None = None) -> None:
        _litdata()
        # Lightning warns that an IterableDataset with a length may repeat samples across workers; LitData's
        # deals each worker its own chunks (said here, where the data set is known to be LitData's).
        warnings.filterwarnings("ignore", message=r"Your `IterableDataset` has `__len__` defined")
        if not self.sample_ids:
            self.sample_ids = {s: torch.load(self.path / s / IDS, weights_only=True) for s in SPLITS}
        per_rank = self.samples["train"] // self._ranks()[1]
        if stage in (None, "fit") and self.drop_last and self.batch_size > per_rank:
            raise ConfigError(
                f"data.batch_size={self.batch_size} is larger than the {per_rank} training samples of each "
                "rank: lower data.batch_size"
            )

    def uses_device_loader(self) -> bool:
        if self.on_device is True:
            raise ConfigError(
                "data.on_device=true needs the data set in memory; data=shards streams it: "
                "set data.on_device=auto or false"
            )
        return False

    def _streaming(self, split: str, shuffle: bool) -> Any:
        litdata = _litdata()
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))  # the run's seed, as for the in-memory loaders
        checked = None
        if self._checksums is not None:
            from lightspeed.data.checked_chunks import PyTreeLoader

            checked = PyTreeLoader(self.path / split, self._checksums[split])
        dataset = litdata.StreamingDataset(
            str(self.path / split),
            item_loader=checked,
            shuffle=shuffle,
            # training: every rank the same number of samples (DDP steps together); evaluation: all of them
            drop_last=shuffle,
            seed=seed,
        )
        workers = self.num_workers
        return _loader_class(litdata)(
            dataset,
            batch_size=self.batch_size,
            num_workers=workers,
            # Worker seeds from this generator, not from the global RNG, which each new iterator would
            # otherwise advance: a resumed run must draw the numbers an uninterrupted one draws.
            generator=torch.Generator().manual_seed(seed + self._ranks()[0]),
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers and workers > 0,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
            collate_fn=pair,
            drop_last=shuffle and self.drop_last,
        )

    def train_dataloader(self) -> Any:
        loader = self._streaming("train", shuffle=self.trainer is None or self.trainer.overfit_batches == 0)
        self._check_share(len(loader.dataset))
        if self._train_position is not None:
            try:
                loader.load_state_dict(self._train_position)
            except ValueError as err:  # LitData refuses a state saved for other shards
                raise ConfigError(
                    f"data.path={self.path}: the checkpoint's loader position is for other shards ({err}): "
                    "train on the shards it was saved with, or start a new run (run_name=...)"
                ) from None
            self._train_position = None
        self._train_loader = loader
        return loader

    def _check_share(self, served: int) -> None:
        """LitData deals whole chunks to ranks and workers and evens them out by dropping samples: with few
        chunks a rank can get far fewer than its share, or none (DDP would then wait forever)."""
        rank, world = self._ranks()
        share = self.samples["train"] // world
        evened = max(self.batch_size * max(1, self.num_workers), 0.05 * share)  # what drop_last may leave out
        if share - served > evened:
            raise ConfigError(
                f"data=shards: rank {rank} of {world} gets {served} of its {share} training samples "
                f"({len(self._chunks('train'))} chunks for {world} rank(s) x {max(1, self.num_workers)} "
                "loader worker(s)): write smaller chunks (make shards shards.chunk_bytes=...) or lower "
                "data.num_workers"
            )

    def _chunks(self, split: str) -> list[dict[str, Any]]:
        return json.loads((self.path / split / "index.json").read_text())["chunks"]

    def val_dataloader(self) -> Any:
        return self._streaming("val", shuffle=False)

    def test_dataloader(self) -> Any:
        return self._streaming("test", shuffle=False)

    def predict_dataloader(self) -> Any:
        return self._streaming("test", shuffle=False)
