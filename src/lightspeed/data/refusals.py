"""What an `ArrayDataModule` refuses, in one line naming the setting and the fix: imported only when
something is refused, so a run whose data set loads never reads it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from lightspeed.core.config import ConfigError
from lightspeed.data.base import IGNORE_INDEX, SPLITS, Arrays

if TYPE_CHECKING:
    from lightspeed.data.base import ArrayDataModule


def bad_split_names(dm: ArrayDataModule, given: dict[str, Arrays]) -> ValueError:
    return ValueError(
        f"{type(dm).__name__}.load_arrays returned splits {sorted(given)}: name them "
        f"{', '.join(SPLITS)} (train is required)"
    )


def empty_split(dm: ArrayDataModule, given: dict[str, Arrays], missing: list[str]) -> Exception:
    """An empty split that `load_arrays` gave (its fault), or that the fractions would draw (the config's)."""
    empty = [name for name, (inputs, _) in given.items() if len(inputs) < 1]
    if empty:
        return ValueError(f"{type(dm).__name__}.load_arrays returned an empty {empty[0]} split")
    n = len(given["train"][0])
    fractions = {name: getattr(dm, f"{name}_fraction") for name in missing}
    sizes = {name: round(n * fraction) for name, fraction in fractions.items()}
    counts = {
        "train": n - sum(sizes.values()),
        **sizes,
        **{k: len(v[0]) for k, v in given.items() if k != "train"},
    }
    drawn = " and ".join(f"data.{name}_fraction={fraction}" for name, fraction in fractions.items())
    return ConfigError(
        f"{drawn} leave an empty split of {n} samples "
        f"({', '.join(f'{k} {v}' for k, v in counts.items())}): change the fractions"
    )


def bad_labels(dm: ArrayDataModule, split: str, y: Tensor, classes: int) -> ConfigError:
    """Labels of a data set that declares `num_classes` that are not integers from 0 to num_classes - 1."""
    name = type(dm).__name__
    if y.is_floating_point() or y.dtype == torch.bool:
        return ConfigError(
            f"data: {name} declares num_classes={classes}, but its {split} labels are {y.dtype}: "
            f"give int64 class labels 0..{classes - 1}; for other targets (continuous, multi-hot) "
            "declare what your model is built from instead, e.g. num_targets for model=regressor"
        )
    scored = y[y != IGNORE_INDEX]
    return ConfigError(
        f"data: {name}'s {split} labels range over {int(scored.min())}..{int(scored.max())}, outside "
        f"0..{classes - 1} for num_classes={classes}: set num_classes to the number of classes, or fix the "
        "labels"
    )


def batch_too_large(batch_size: int, per_rank: int) -> ConfigError:
    return ConfigError(
        f"data.batch_size={batch_size} is larger than the {per_rank} training samples of each "
        "rank: with data.drop_last=true not one batch would train; lower data.batch_size, or set "
        "data.drop_last=false"
    )
