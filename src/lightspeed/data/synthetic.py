"""Random tensors of any shape, for throughput work: no I/O, no decoding, still learnable."""

from __future__ import annotations

import torch
from torch import Tensor

from lightspeed.core.config import ConfigError
from lightspeed.data.base import ArrayDataModule


class SyntheticDataModule(ArrayDataModule):
    """Each class has a fixed random prototype; a sample is its class prototype plus noise, so the loss
    falls and accuracy means something, while the data costs nothing to make."""

    def __init__(
        self,
        num_samples: int = 4096,
        shape: tuple[int, ...] | list[int] = (3, 32, 32),
        num_classes: int = 10,
        noise: float = 1.0,
        data_seed: int = 0,
        **loader_args,
    ) -> None:
        super().__init__(**loader_args)
        self.num_samples = num_samples
        if not isinstance(shape, list | tuple) or not all(isinstance(d, int) and d > 0 for d in shape):
            raise ConfigError(f"data.shape={shape!r} is invalid: a list of sizes, e.g. [3, 32, 32]")
        self.input_shape = tuple(shape)
        self.num_classes = num_classes
        self.noise = noise
        self.data_seed = data_seed

    def load_arrays(self) -> tuple[Tensor, Tensor]:
        g = torch.Generator().manual_seed(self.data_seed)
        prototypes = torch.randn(self.num_classes, *self.input_shape, generator=g)
        y = torch.randint(0, self.num_classes, (self.num_samples,), generator=g)
        x = prototypes[y] + self.noise * torch.randn(self.num_samples, *self.input_shape, generator=g)
        return x, y
