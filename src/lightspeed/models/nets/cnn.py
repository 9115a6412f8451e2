"""A small VGG-style CNN: conv-BN-ReLU stages, pooling between them, global average pool, linear head.

Global pooling makes it work for any input size (8x8 digits, 32x32 CIFAR-shaped data).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from lightspeed.models.nets import register, widths


def conv_bn(c_in: int, c_out: int) -> nn.Sequential:
    # bias=False: BatchNorm's shift makes a conv bias redundant.
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)
    )


@register("cnn")
class CNN(nn.Module):
    #: Input shapes it is built for (C, H, W), any size: the tests build and run it on each.
    example_input_shapes = ((1, 8, 8), (3, 32, 32))

    def __init__(
        self,
        input_shape: Sequence[int],
        num_outputs: int,
        channels: Sequence[int] = (32, 64, 128),
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        stages: list[nn.Module] = []
        c_in = input_shape[0]
        for i, c_out in enumerate(widths("channels", channels, "[32, 64]")):
            if i > 0:
                stages.append(nn.MaxPool2d(2))  # halve H and W between stages
            stages.append(conv_bn(c_in, c_out))
            c_in = c_out
        self.features = nn.Sequential(*stages)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(c_in, num_outputs)
        )

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, num_outputs)
        return self.head(self.features(x))
