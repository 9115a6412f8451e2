"""A multilayer perceptron: flatten, then Linear-ReLU-Dropout blocks."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor, nn

from lightspeed.models.nets import register, widths


@register("mlp")
class MLP(nn.Module):
    #: Input shapes it is built for (any: it flattens): the tests build and run it on each.
    example_input_shapes = ((1, 8, 8), (3, 32, 32), (1, 40))

    def __init__(
        self,
        input_shape: Sequence[int],
        num_outputs: int,
        hidden: Sequence[int] = (256, 256),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for h in widths("hidden", hidden, "[256, 128]"):
            layers += [nn.Linear(width, h), nn.ReLU(inplace=True), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, num_outputs))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:  # (B, *input_shape) -> (B, num_outputs)
        return self.layers(x)
