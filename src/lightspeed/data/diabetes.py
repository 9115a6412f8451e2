"""scikit-learn's bundled diabetes data: 442 patients, 10 features in their own units (age, sex, body mass
index, blood pressure, six blood serum measurements), one target: a measure of disease progression a year
later (25 to 346). No download. A regression task: `experiment=diabetes_mlp`."""

from __future__ import annotations

import torch
from torch import Tensor

from lightspeed.data.base import ArrayDataModule


class DiabetesDataModule(ArrayDataModule):
    input_shape = (10,)
    num_targets = 1

    def load_arrays(self) -> tuple[Tensor, Tensor]:
        from sklearn.datasets import load_diabetes  # imported here: scikit-learn is slow to import

        # As measured (scaled=False): features in unrelated units, standardised per feature by the config
        x, y = load_diabetes(return_X_y=True, scaled=False)
        return torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
