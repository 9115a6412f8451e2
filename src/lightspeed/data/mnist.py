"""MNIST and Fashion-MNIST: 60,000 training and 10,000 test images, 28x28 grey, 10 classes, fetched once
into `data_dir` (verified against the published MD5s) and kept as uint8. The test split is the data
set's own; validation is drawn from the training images."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from torch import Tensor

from lightspeed.data.download import DownloadedDataModule, Remote
from lightspeed.data.formats import read_idx

IMAGES, LABELS = "{}-images-idx3-ubyte.gz", "{}-labels-idx1-ubyte.gz"


def idx_remotes(mirrors: Sequence[str], md5s: dict[str, tuple[str, str]]) -> dict[str, tuple[Remote, ...]]:
    """(images, labels) of each split, from `{split: (images MD5, labels MD5)}` as the publisher gives
    them (torchvision checks the same values)."""
    prefix = {"train": "train", "test": "t10k"}
    return {
        split: (
            Remote(IMAGES.format(prefix[split]), images, tuple(mirrors)),
            Remote(LABELS.format(prefix[split]), labels, tuple(mirrors)),
        )
        for split, (images, labels) in md5s.items()
    }


class MNISTDataModule(DownloadedDataModule):
    input_shape = (1, 28, 28)
    num_classes = 10
    remotes: ClassVar[dict[str, tuple[Remote, ...]]] = idx_remotes(
        (
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
        ),
        {
            "train": ("f68b3c2dcbeaaa9fbdd348bbdeb94873", "d53e105ee54ea40749a09fcbcd1e9432"),
            "test": ("9fb629c4189551a2d022fa330f9573f3", "ec29112dd5afa0611ce80d1b7f02629c"),
        },
    )

    def __init__(self, data_dir: str = "data/mnist", **kwargs) -> None:
        super().__init__(data_dir, **kwargs)

    def load_arrays(self) -> dict[str, tuple[Tensor, Tensor]]:
        splits = {}
        for name, (images, labels) in self.remotes.items():
            x, y = read_idx(self.fetched(images)), read_idx(self.fetched(labels))
            splits[name] = (x.unsqueeze(1), y.long())  # uint8 (N, 1, 28, 28), int64 (N,)
        return splits


class FashionMNISTDataModule(MNISTDataModule):
    remotes: ClassVar[dict[str, tuple[Remote, ...]]] = idx_remotes(
        (
            "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
            "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
        ),
        {
            "train": ("8d4fb7e6c68d591d4c3dfef9ec88bf0d", "25c81989df183df01b3e8a0aad5dffbe"),
            "test": ("bef4ecab320f06d8554ea6380940ec79", "bb300cfdad3c16e7a12a480ee83cd310"),
        },
    )

    def __init__(self, data_dir: str = "data/fashion_mnist", **kwargs) -> None:
        super().__init__(data_dir, **kwargs)
