"""A folder of JPEG and PNG images, one subfolder per class (`data=image_folder data.root=...`).

Two paths. By default the images stay files: the DataLoader's workers decode each batch, into pinned
memory, and it is copied to the device without blocking (the path for data that does not fit in memory).
With `cache=true` every image is decoded once into a uint8 tensor file under `data_dir` (the first run
pays; a later one, or a change of any file, is a fresh decode), and the data set is served from memory as
any in-memory one (device-resident when it fits). Either way images travel as uint8 and are scaled and
augmented on the device. The class names (sorted subfolder names) are kept in each checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from lightspeed.core.config import ConfigError
from lightspeed.core.files import readable
from lightspeed.data.base import ArrayDataModule
from lightspeed.data.host_loader import whole_batch
from lightspeed.data.images import DECODE_VERSION, ImageFiles, Listing, file_ids, fingerprint, scan

#: Training images decoded in `setup` to estimate the mean and standard deviation when they are not
#: cached (spread evenly over the training split): a few seconds, not a pass over the whole folder.
STATISTICS_SAMPLE = 1024


class ImageFolderDataModule(ArrayDataModule):
    def __init__(
        self,
        root: str | None = None,
        image_size: int = 64,
        channels: int = 3,
        cache: bool = False,
        data_dir: str = "data",
        **loader_args: Any,
    ) -> None:
        super().__init__(**loader_args)
        if root is None:
            raise ConfigError(
                "data.root is not set: data=image_folder needs data.root=/path/to/images "
                "(one subfolder of .jpg/.png images per class)"
            )
        if channels not in (1, 3):
            raise ConfigError(f"data.channels={channels} is invalid: use 3 (RGB) or 1 (grey)")
        if image_size < 1:
            raise ConfigError(f"data.image_size={image_size} is invalid: use a side length in pixels (>= 1)")
        self.root = Path(root).expanduser()
        self.image_size, self.channels, self.cache = image_size, channels, cache
        self.cache_dir = Path(data_dir) / "image_folder"
        self.listing: Listing = scan(self.root)  # the model is built from the class count before setup
        self.class_names = self.listing.classes
        self.input_shape = (channels, image_size, image_size)
        self.num_classes = len(self.class_names)

    def prepare_data(self) -> None:
        if self.cache:
            self._cached_pixels()

    # radon C: named vs drawn splits, cached vs files, and a note for each
    def _load(self) -> None:
        if self.splits:
            return
        listing = self.listing
        if listing.skipped:
            rank_zero_info(f"data.root: left out {listing.skipped} file(s) that are not .jpg, .jpeg or .png")
        index = torch.arange(len(listing.files))
        named = {s for s in listing.splits if s is not None}
        if named:
            given = {}
            for split in sorted(named):
                rows = torch.tensor(
                    [i for i, s in enumerate(listing.splits) if s == split], dtype=torch.int64
                )
                given[split] = (index[rows], listing.labels[rows])
        else:
            given = {"train": (index, listing.labels)}
        parts = self._draw_missing_splits(given)  # sample indices into the listing, per split
        ids = file_ids(listing.files)
        self.sample_ids = {name: ids[rows] for name, (rows, _) in parts.items()}
        drawn = [s for s in ("val", "test") if s not in given]
        if named and drawn:
            rank_zero_info(f"data.root: no images in {', '.join(drawn)}/: drawn from train/")
        # The statistics from the same images whether cached or not: data.cache changes how, not what.
        rows = parts["train"][0]
        sample = rows[torch.linspace(0, len(rows) - 1, min(len(rows), STATISTICS_SAMPLE)).long()]
        if self.cache:
            pixels = self._cached_pixels()
            self.splits = {name: TensorDataset(pixels[rows], y) for name, (rows, y) in parts.items()}
            train_x = pixels[sample]
        else:
            self.splits = {name: self._files(rows, y) for name, (rows, y) in parts.items()}
            train_x = self._files(sample, listing.labels[sample]).__getitems__(list(range(len(sample))))[0]
        self.input_scale = self._byte_scale(train_x)

    def _files(self, rows: Tensor, labels: Tensor) -> ImageFiles:
        files = [self.listing.files[i] for i in rows.tolist()]
        return ImageFiles(self.root, files, labels, self.image_size, self.channels)

    def _cached_pixels(self) -> Tensor:
        """Every image of the listing decoded, uint8 (N, C, H, W): from the cache file when it is there for
        this folder's current files and settings, else decoded (in the loader's workers) and written
        atomically, replacing the folder's older caches. Loaded memory-mapped and as plain tensors only;
        a cache that does not load or does not match is decoded again."""
        where = hashlib.blake2b(str(self.root.resolve()).encode(), digest_size=4).hexdigest()
        stem = f"{self.root.name}-{where}-{self.image_size}px-{self.channels}ch-v{DECODE_VERSION}"
        path = self.cache_dir / f"{stem}-{fingerprint(self.root, self.listing.files)}.pt"
        n = len(self.listing.files)
        if path.is_file():
            try:
                cached = torch.load(path, mmap=True, weights_only=True)
                if cached["files"] == self.listing.files and cached["pixels"].shape == (n, *self.input_shape):
                    return cached["pixels"]
            except Exception as err:  # a file cut short or not ours: decoded again
                rank_zero_info(
                    f"data.cache=true: {path} does not load ({type(err).__name__}): decoding again"
                )
        rank_zero_info(f"data.cache=true: decoding {n} images of {self.root} once into {path}")
        pixels = torch.empty((n, *self.input_shape), dtype=torch.uint8)
        everything = self._files(torch.arange(n), self.listing.labels)
        loader = DataLoader(everything, batch_size=256, num_workers=self.num_workers, collate_fn=whole_batch)
        start = 0
        for x, _ in loader:
            pixels[start : start + len(x)] = x
            start += len(x)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save({"pixels": pixels, "files": self.listing.files}, f)
                f.flush()
                os.fsync(f.fileno())
            readable(Path(tmp))
            os.replace(tmp, path)  # whole or not at all: a run stopped while writing leaves no cache
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        for old in self.cache_dir.glob(f"{stem}-*.pt"):  # this folder's caches of files since changed
            if old != path:
                old.unlink(missing_ok=True)
        return pixels
