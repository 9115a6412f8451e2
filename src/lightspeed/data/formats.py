"""Readers of the standard data sets' published file formats, into uint8 tensors. Lightspeed's own, not
torchvision's: a few lines each, no extra dependency, and CIFAR-10's pickles are read by an unpickler
that can build numpy arrays and nothing else (a pickle can otherwise run any code it names)."""

from __future__ import annotations

import gzip
import io
import math
import pickle
import struct
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor


def read_idx(path: Path) -> Tensor:
    """An IDX file of unsigned bytes (MNIST's and Fashion-MNIST's format), gzip-compressed or not: two zero
    bytes, the type (0x08), the number of dimensions, each dimension as a big-endian uint32, the data."""
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = data[4 + 4 * ndim :]
    if len(body) != math.prod(dims):
        raise ValueError(f"{path} holds {len(body)} bytes of data where its header says {math.prod(dims)}")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(dims)


class _ArraysOnly(pickle.Unpickler):
    """Builds numpy arrays, and refuses every other class a pickle names."""

    ALLOWED: ClassVar[set[tuple[str, str]]] = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),  # how Python 3 writes bytes into a protocol-2 pickle: str -> bytes, no more
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing {module}.{name}: a CIFAR batch holds arrays only")
        return super().find_class(module, name)


def read_cifar_batch(path: Path) -> tuple[Tensor, Tensor]:
    """One batch file of the CIFAR-10 python version: images uint8 (N, 3, 32, 32), labels int64 (N,)."""
    batch = _ArraysOnly(io.BytesIO(path.read_bytes()), encoding="bytes").load()
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise ValueError(f"{path} is not a CIFAR-10 batch (no data and labels)")
    images = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    if len(images) != len(labels):
        raise ValueError(f"{path} holds {len(images)} images and {len(labels)} labels")
    return torch.from_numpy(images.copy()), torch.from_numpy(labels)
