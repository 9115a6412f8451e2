"""Checks for your own nets, usable in any test suite.

`assert_device_agnostic(net, input_shape)` proves that a net creates no tensor on a fixed device:
it moves the net to PyTorch's `meta` device (tensors with shapes but no data) and runs a forward pass
there. A tensor made on the CPU or a GPU inside `forward` (`torch.ones(n)`, `device="cuda"`), or kept
as a plain attribute instead of a registered buffer, meets meta tensors and fails. Such a net would
fail the same way on a GPU, or when DDP or `map_location` puts it on another device.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn


class DeviceLeak(AssertionError):
    """The net uses a tensor that does not follow it to its device."""


def assert_device_agnostic(net: nn.Module, input_shape: Sequence[int], batch: int = 2) -> None:
    meta_net = copy.deepcopy(net).to("meta")
    x = torch.empty(batch, *input_shape, device="meta")
    try:
        out = meta_net(x)
    except (RuntimeError, NotImplementedError) as err:
        raise DeviceLeak(
            f"{type(net).__name__} creates or keeps a tensor on a fixed device: make it with "
            f"device=x.device inside forward, or register it with self.register_buffer(...) ({err})"
        ) from err
    for t in out if isinstance(out, (tuple, list)) else [out]:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            raise DeviceLeak(f"{type(net).__name__} returned a tensor on {t.device}, not on its input's")
