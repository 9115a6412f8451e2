"""Checkpoints and nets that work on any device: compiled <-> uncompiled, channels_last, meta device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import TINY
from lightspeed.models.classifier import Classifier
from lightspeed.models.nets import _discover
from lightspeed.testing import DeviceLeak, assert_device_agnostic
from lightspeed.train import train

FIT_ONLY = [*TINY, "trainer.max_epochs=1", "test_after_fit=false"]
RGB = ["data=synthetic", "data.num_samples=256", "data.shape=[3,16,16]", "data.batch_size=32"]
_discover()


def fresh(path: Path) -> Classifier:
    """An uncompiled, contiguous model from a checkpoint, as on another machine."""
    return Classifier.load_from_checkpoint(path, map_location="cpu", weights_only=True)


def test_a_compiled_run_loads_into_an_uncompiled_model(train_cfg, run_dir: Path) -> None:
    result = train(train_cfg(*FIT_ONLY, "accel.compile=true", "accel.compile_backend=eager"))
    last = run_dir / "checkpoints" / "last.ckpt"
    state = torch.load(last, weights_only=True)["state_dict"]
    assert not [k for k in state if "_orig_mod" in k]
    model = fresh(last)
    assert model.net._compiled_call_impl is None
    for key, value in result.model.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


def test_an_uncompiled_checkpoint_loads_into_a_compiled_model(train_cfg, run_dir: Path) -> None:
    train(train_cfg(*FIT_ONLY))
    model = fresh(run_dir / "checkpoints" / "last.ckpt")
    compiled = fresh(run_dir / "checkpoints" / "last.ckpt")
    compiled.net.compile(backend="eager")
    compiled.load_state_dict(model.state_dict())  # same keys either way
    x = torch.randn(4, 1, 8, 8)
    model.eval(), compiled.eval()
    assert torch.allclose(model(x), compiled(x))


def test_channels_last_weights_load_anywhere(train_cfg, run_dir: Path) -> None:
    result = train(train_cfg(*FIT_ONLY, *RGB, "model=resnet", "accel.channels_last=true"))
    conv = result.model.net.stem[0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    model = fresh(run_dir / "checkpoints" / "last.ckpt")
    assert model.net.stem[0].weight.is_contiguous()  # an ordinary model takes them as they are
    x = torch.randn(4, 3, 16, 16)
    result.model.eval(), model.eval()
    assert torch.allclose(result.model(x.contiguous(memory_format=torch.channels_last)), model(x), atol=1e-5)


class FixedDeviceConstant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.offset = torch.ones(4)  # a plain attribute: stays behind when the module moves

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.offset


class TensorMadeInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * torch.arange(4).float()  # on the CPU, whatever x is on


class BufferedConstant(FixedDeviceConstant):
    def __init__(self) -> None:
        super().__init__()
        del self.offset
        self.register_buffer("offset", torch.ones(4))


@pytest.mark.parametrize("net", [FixedDeviceConstant, TensorMadeInForward])
def test_the_device_check_catches_nets_tied_to_a_device(net: type[nn.Module]) -> None:
    with pytest.raises(DeviceLeak, match="register_buffer"):
        assert_device_agnostic(net(), (4,))


def test_the_device_check_passes_buffers() -> None:
    assert_device_agnostic(BufferedConstant(), (4,))
