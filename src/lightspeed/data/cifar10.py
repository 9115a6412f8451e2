"""CIFAR-10: 50,000 training and 10,000 test images, 32x32 colour, 10 classes; the python version's archive
fetched once into `data_dir` (verified against the published MD5), extracted whole or not at all, and
kept as uint8. The test split is the data set's own; validation is drawn from the training images."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from lightspeed.data.download import DownloadedDataModule, Remote, extract
from lightspeed.data.formats import read_cifar_batch

FOLDER = "cifar-10-batches-py"  # the archive's top folder


class CIFAR10DataModule(DownloadedDataModule):
    input_shape = (3, 32, 32)
    num_classes = 10
    #: The archive, with the MD5 its publisher gives (torchvision checks the same).
    remotes: ClassVar[dict[str, tuple[Remote, ...]]] = {
        "archive": (
            Remote(
                "cifar-10-python.tar.gz",
                "c58f30108f718f92721af3b95e74349a",
                ("https://www.cs.toronto.edu/~kriz/",),
            ),
        )
    }
    batches: ClassVar[dict[str, list[str]]] = {
        "train": [f"data_batch_{i}" for i in range(1, 6)],
        "test": ["test_batch"],
    }

    def __init__(self, data_dir: str = "data/cifar10", **kwargs) -> None:
        super().__init__(data_dir, **kwargs)

    def prepare_data(self) -> None:
        self.load_folder()

    def load_folder(self) -> Path:
        # fetched again: verified (a tampered archive never trains), then the folder extracted from it
        return extract(self.fetched(self.remotes["archive"][0]), self.data_dir, FOLDER)

    def load_arrays(self) -> dict[str, tuple[Tensor, Tensor]]:
        folder = self.load_folder()
        splits = {}
        for name, files in self.batches.items():
            parts = [read_cifar_batch(folder / f) for f in files]
            splits[name] = (torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts]))
        return splits
