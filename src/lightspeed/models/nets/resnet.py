"""A small ResNet for 32x32 images (ResNet-8/20 style, He et al. 2016): a stem, three stages of basic
residual blocks that halve the resolution and double the width, global pooling, a linear head."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from lightspeed.models.nets import register


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = (
            nn.Identity()
            if stride == 1 and c_in == c_out
            else nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))
        )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:  # (B, C_in, H, W) -> (B, C_out, H/stride, W/stride)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


@register("resnet")
class ResNet(nn.Module):
    #: Input shapes it is built for (C, H, W): the tests build and run it on each.
    example_input_shapes = ((3, 32, 32), (1, 8, 8))

    def __init__(
        self,
        input_shape: Sequence[int],
        num_outputs: int,
        widths: Sequence[int] = (32, 64, 128),
        blocks_per_stage: int = 1,
    ) -> None:
        super().__init__()
        c = widths[0]
        self.stem = nn.Sequential(
            nn.Conv2d(input_shape[0], c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU()
        )
        stages: list[nn.Module] = []
        for i, width in enumerate(widths):
            for j in range(blocks_per_stage):
                stages.append(BasicBlock(c, width, stride=2 if i > 0 and j == 0 else 1))
                c = width
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_outputs))

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, num_outputs)
        return self.head(self.stages(self.stem(x)))
