"""CIFAR-10: 50,000 training and 10,000 test images, 32x32 colour, 10 classes; the python version's archive
fetched once into `data_dir` (verified against the published MD5), extracted whole or not at all, each
batch file verified against its own MD5 whenever it is read, and kept as uint8. The test split is the
data set's own; validation is drawn from the training images."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from lightspeed.data.download import DownloadedDataModule, DownloadError, Remote, extract, md5_of
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
                size=170_498_071,
            ),
        )
    }
    #: The archive's batch files of each split, with the MD5s torchvision checks.
    batches: ClassVar[dict[str, tuple[tuple[str, str], ...]]] = {
        "train": (
            ("data_batch_1", "c99cafc152244af753f735de768cd75f"),
            ("data_batch_2", "d4bba439e000b95fd0a9bffe97cbabec"),
            ("data_batch_3", "54ebc095f3ab1f0389bbae665268c751"),
            ("data_batch_4", "634d18415352ddfa80567beed471001a"),
            ("data_batch_5", "482c414d41f54cd18b22e5b47cb7c3cb"),
        ),
        "test": (("test_batch", "40351d587109b95175f43aff81a1287e"),),
    }

    def __init__(self, data_dir: str = "data/cifar10", **kwargs) -> None:
        super().__init__(data_dir, **kwargs)

    def prepare_data(self) -> None:
        self.verified_folder()

    def verified_folder(self) -> Path:
        """The extracted folder, each batch file checked against its MD5; extracted again from the
        (verified, fetched if missing) archive when a file is missing or changed."""
        folder = self.data_dir / FOLDER
        files = [(folder / name, md5) for split in self.batches.values() for name, md5 in split]
        if all(path.is_file() and md5_of(path) == md5 for path, md5 in files):
            return folder
        folder = extract(self.fetched(self.remotes["archive"][0]), self.data_dir, FOLDER)
        changed = [path.name for path, md5 in files if not path.is_file() or md5_of(path) != md5]
        if changed:
            raise DownloadError(
                f"{', '.join(changed)} in {self.remotes['archive'][0].filename} do not match their "
                "published MD5s: delete the archive to download it again"
            )
        return folder

    def load_arrays(self) -> dict[str, tuple[Tensor, Tensor]]:
        folder = self.verified_folder()
        splits = {}
        for name, files in self.batches.items():
            parts = [read_cifar_batch(folder / f) for f, _ in files]
            splits[name] = (torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts]))
        return splits
