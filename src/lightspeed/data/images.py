"""Image files as uint8 tensors: a folder's listing (one subfolder per class), decoding with one resize
policy, and a Dataset that decodes a batch of files where the DataLoader runs it (in its workers)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor
from torch.utils.data import Dataset

from lightspeed.core.config import ConfigError

#: The files an image folder reads (case-insensitive); any other file is left out, and counted.
EXTENSIONS = (".jpg", ".jpeg", ".png")
#: Folder names that make a root's subfolders named splits instead of classes.
SPLIT_FOLDERS = ("train", "val", "test")
#: Raised when `decode` changes what it makes of a file: image-folder caches of an older version are
#: decoded again.
DECODE_VERSION = 2


def _hidden(path: Path) -> bool:
    """Hidden entries and archive leftovers (`.ipynb_checkpoints`, `__MACOSX`) are not data."""
    return path.name.startswith(".") or path.name == "__MACOSX"


def _folders(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not _hidden(p))


@dataclass
class Listing:
    """What a folder holds: the class names (sorted subfolder names: label i is `classes[i]`), every image
    file (relative to the root, sorted) with its label and split (None: drawn from `train`), and the
    number of other files left out."""

    classes: list[str]
    files: list[str]
    labels: Tensor
    splits: list[str | None]
    skipped: int


def _images(folder: Path) -> tuple[list[Path], int]:
    found = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(_hidden(q) for q in p.relative_to(folder).parents) and not _hidden(p)
    )
    images = [p for p in found if p.suffix.lower() in EXTENSIONS]
    return images, len(found) - len(images)


# radon C: one ConfigError per bad folder layout; flat vs train/val/test
def scan(root: Path) -> Listing:
    """`root/<class>/...` (validation and test drawn from the training images), or named splits
    `root/train/<class>/...` with `root/val/`, `root/test/` beside it where the data set has its own;
    every split's classes must be among train's. Images may sit deeper inside a class folder."""
    if not root.is_dir():
        raise ConfigError(
            f"data.root={root} is not a folder: point it at a folder with one subfolder of images per class"
        )
    subfolders = _folders(root)
    named = "train" in subfolders
    others = sorted(set(subfolders) - set(SPLIT_FOLDERS))
    if named and others:
        raise ConfigError(
            f"data.root={root} has train/ beside {', '.join(others)}: name the splits train/, val/, test/ "
            "(or, for one folder per class, rename the class called train)"
        )
    splits = {name: root / name for name in subfolders} if named else {None: root}
    train = splits["train"] if named else root
    classes = _folders(train)
    if not classes:
        raise ConfigError(f"data.root={root} has no class subfolders: put each class's images in its own")
    files: list[str] = []
    labels: list[int] = []
    split_of: list[str | None] = []
    skipped = 0
    for split, folder in splits.items():
        extra = [name for name in _folders(folder) if name not in classes]
        if extra:
            raise ConfigError(
                f"{folder} has classes that train has not ({', '.join(extra)}): give train/ a folder for each"
            )
        for label, name in enumerate(classes):
            if not (folder / name).is_dir():
                continue
            images, others = _images(folder / name)
            if not images and split in (None, "train"):
                raise ConfigError(
                    f"{folder / name} holds no .jpg, .jpeg or .png file: remove it or add images"
                )
            files += [p.relative_to(root).as_posix() for p in images]
            labels += [label] * len(images)
            split_of += [split] * len(images)
            skipped += others
    return Listing(classes, files, torch.tensor(labels, dtype=torch.int64), split_of, skipped)


def fingerprint(root: Path, files: list[str]) -> str:
    """Changes when any file is added, removed, resized or rewritten (its size and modification time)."""
    digest = hashlib.blake2b(digest_size=8)
    for name in files:
        stat = (root / name).stat()
        digest.update(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def file_ids(files: list[str]) -> Tensor:
    """A 64-bit id per file from its path under the root: a sample's identity in `sample_ids`, the same
    whether the images are decoded on the fly or from the cache."""
    return torch.tensor(
        [
            int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little", signed=True)
            for name in files
        ],
        dtype=torch.int64,
    )


#: What an image folder is read as, whatever a file's name says.
FORMATS = ("JPEG", "PNG")


def decode(path: Path, size: int, channels: int) -> Tensor:
    """The image as uint8 (channels, size, size). Resize policy: the shorter side is scaled to `size`
    (bilinear, antialiased), then the centre is cut to `size` x `size`; an image of that size already is
    kept as it is. The EXIF orientation is applied first; 16-bit grey is scaled to 8 bits. Colour images
    become grey with `channels=1`; grey, palette and alpha images become RGB with `channels=3` (alpha
    dropped)."""
    try:
        with Image.open(path, formats=FORMATS) as image:  # a GIF or TIFF named .png is refused
            image.draft("RGB" if channels == 3 else "L", (size, size))  # JPEG: decode at a reduced scale
            image = ImageOps.exif_transpose(image)  # as a viewer shows it (a phone's rotated photos)
            if image.mode.startswith("I"):  # 16- or 32-bit grey: to 8 bits by its range, not clipped
                wide = np.asarray(image, dtype=np.float64)
                top = 65535.0 if image.mode.startswith("I;16") else max(float(wide.max()), 1.0)
                image = Image.fromarray((wide.clip(0, top) * (255.0 / top)).round().astype(np.uint8))
            image = image.convert("RGB" if channels == 3 else "L")
            w, h = image.size
            if (w, h) != (size, size):
                scale = size / min(w, h)
                w, h = max(size, round(w * scale)), max(size, round(h * scale))
                image = image.resize((w, h), Image.Resampling.BILINEAR)
                left, top = (w - size) // 2, (h - size) // 2
                image = image.crop((left, top, left + size, top + size))
            pixels = np.asarray(image, dtype=np.uint8)
    except Image.DecompressionBombError as err:  # more pixels than PIL decodes (Image.MAX_IMAGE_PIXELS x 2)
        raise ConfigError(f"{path} is too large to decode ({err}): remove or shrink it") from None
    except UnidentifiedImageError:
        raise ConfigError(f"{path} is not a JPEG or PNG image: remove or convert it") from None
    except (OSError, ValueError) as err:  # truncated data; a text chunk too large to decompress
        raise ConfigError(f"{path} cannot be decoded as an image ({err}): remove or replace it") from None
    pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1).contiguous()


class ImageFiles(Dataset):
    """Image files and their labels; a batch is decoded where the DataLoader fetches it (in its workers
    when `num_workers` > 0) and comes out whole: uint8 (B, C, H, W) and int64 (B,), for the `whole_batch`
    collate_fn."""

    def __init__(self, root: Path, files: list[str], labels: Tensor, size: int, channels: int) -> None:
        self.root, self.files, self.labels = root, files, labels
        self.size, self.channels = size, channels

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return decode(self.root / self.files[index], self.size, self.channels), self.labels[index]

    def __getitems__(self, indices: list[int]) -> list[Tensor]:
        x = torch.stack([decode(self.root / self.files[i], self.size, self.channels) for i in indices])
        return [x, self.labels[torch.tensor(indices, dtype=torch.int64)]]
