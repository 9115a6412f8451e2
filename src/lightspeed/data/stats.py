"""The statistics that uint8 images and regression targets are scaled by: imported only by data sets that
have them (a default run's digits are float inputs with class labels)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from torch import Tensor

from lightspeed.core.config import ConfigError
from lightspeed.data.base import _spread

if TYPE_CHECKING:
    from lightspeed.data.base import ArrayDataModule


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


def byte_scale(train_x: Tensor, normalize: bool | str) -> tuple[float, float]:
    """(mean, std) that uint8 inputs are scaled by on the device: the train split's, or 0 and 255."""
    if normalize == "per_feature":
        raise ConfigError(
            "data.normalize=per_feature is for float (tabular) inputs; these are uint8 images: use "
            "data.normalize=true (one mean and std) or false"
        )
    return mean_std(train_x) if normalize else (0.0, 255.0)


def target_stats(dm: ArrayDataModule) -> tuple[list[float], list[float]]:
    """Per target, the train split's mean and standard deviation (a regressor standardises by them)."""
    dm.prepare_data()  # asked before training (the model is built from them): the files first
    dm._load()
    y = dm.splits["train"].tensors[1].double()
    y = y.reshape(len(y), -1)
    return y.mean(dim=0).tolist(), _spread(y.std(dim=0)).tolist()
