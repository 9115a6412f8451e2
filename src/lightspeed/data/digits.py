"""scikit-learn's bundled handwritten digits: 1797 8x8 grey images, 10 classes, no download."""

from __future__ import annotations

import torch
from torch import Tensor

from lightspeed.data.base import ArrayDataModule


class DigitsDataModule(ArrayDataModule):
    input_shape = (1, 8, 8)
    num_classes = 10

    def load_arrays(self) -> tuple[Tensor, Tensor]:
        from sklearn.datasets import load_digits  # imported here: scikit-learn is slow to import

        images, labels = load_digits(return_X_y=True)
        x = torch.as_tensor(images, dtype=torch.float32).reshape(-1, *self.input_shape) / 16.0  # pixels 0..16
        return x, torch.as_tensor(labels, dtype=torch.int64)
