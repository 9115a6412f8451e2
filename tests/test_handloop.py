"""The bench's plain PyTorch loop: free of Lightning, trains with the knobs of the preset it mirrors."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest
import torch

from lightspeed import bench
from lightspeed.models.classifier import Classifier
from lightspeed.models.next_token import NextTokenModel
from lightspeed.speed import handloop


def classifier(shape: list[int]) -> Classifier:
    """What the hand rows train: the module's forward and its loss."""
    return Classifier(
        {"name": "mlp", "hidden": [32]}, {"name": "AdamW", "lr": 0.01}, {"name": "none"}, 4, shape
    )


def test_the_hand_loop_imports_no_lightning() -> None:
    tree = ast.parse(Path(handloop.__file__).read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert not {m for m in imported if m.split(".")[0] in ("lightning", "pytorch_lightning")}
    assert not {
        m
        for m in imported
        if m.startswith(("lightspeed.models.classifier", "lightspeed.callbacks", "lightspeed.speed.report"))
    }
    assert "lightspeed.data.augment" in imported  # the same on-device augmentation as the presets


@pytest.mark.parametrize(("on_device", "shape"), [(True, (1, 8, 8)), (False, (1, 8, 8)), (True, (1, 40))])
def test_the_hand_loop_trains_and_reports_its_timing(on_device: bool, shape: tuple[int, ...]) -> None:
    """Images and a 1D signal (the image augmentation is for images only, as in the DataModule)."""
    torch.manual_seed(0)
    x, y = torch.randn(200, *shape), torch.randint(0, 4, (200,))
    x += y.view(-1, *[1] * len(shape)).float()  # learnable
    settings = handloop.Settings(
        device="cpu",
        batch_size=32,
        optimizer={"name": "AdamW", "lr": 0.01},
        scheduler={"name": "onecycle", "pct_start": 0.25},
        schedule_steps=40,
        steps=30,
        warmup=4,
        on_device=on_device,
        augment={"crop_padding": 1, "flip": True},
    )
    net = classifier(list(shape))
    first = torch.nn.functional.cross_entropy(net(x), y).item()
    r = handloop.train(net, x, y, settings)
    assert r["timed_steps"] == 30 and r["warmup_steps"] == 4 and r["recompiles"] == 0
    assert r["samples_per_s"] == pytest.approx(30 * 32 / (r["step_ms_mean"] / 1e3 * 30))
    assert math.isfinite(r["final_loss"]) and r["final_loss"] < first


def test_the_hand_loop_scales_uint8_inputs_as_the_datamodule_does() -> None:
    torch.manual_seed(0)
    y = torch.randint(0, 4, (200,))
    x = (torch.rand(200, 1, 8, 8) * 100 + y.view(-1, 1, 1, 1) * 40).to(torch.uint8)  # learnable bytes
    settings = handloop.Settings(
        device="cpu",
        batch_size=32,
        optimizer={"name": "AdamW", "lr": 0.01},
        scheduler={"name": "none"},
        schedule_steps=40,
        steps=30,
        warmup=4,
        input_scale=(float(x.float().mean()), float(x.float().std())),
    )
    r = handloop.train(classifier([1, 8, 8]), x, y, settings)
    assert math.isfinite(r["final_loss"]) and r["final_loss"] < 1.0  # scaled to floats on the way: it learns


def test_the_hand_loop_trains_a_sequence_model_with_its_own_loss() -> None:
    """Token inputs, a loss over every position but the ignored ones: whatever the module's task is."""
    from lightspeed.data.sort import SortDataModule

    dm = SortDataModule(num_samples=512, length=5, num_digits=4)
    dm.setup("fit")
    x, y = dm.splits["train"].tensors
    net = NextTokenModel(
        {"_target_": "lightspeed.models.gpt.GPT", "n_layer": 1, "n_embd": 32},
        {"name": "AdamW", "lr": 0.01},
        {"name": "none"},
        dm.vocab_size,
        dm.block_size,
    )
    with torch.no_grad():
        first = float(net.loss(net(x), y))
    settings = handloop.Settings(
        device="cpu",
        batch_size=32,
        optimizer={"name": "AdamW", "lr": 0.01},
        scheduler={"name": "none"},
        schedule_steps=60,
        steps=50,
        warmup=4,
    )
    r = handloop.train(net, x, y, settings)
    assert math.isfinite(r["final_loss"]) and r["final_loss"] < 0.7 * first


def test_a_hand_row_mirrors_its_preset(tmp_path: Path, monkeypatch) -> None:
    seen = {}
    real = handloop.train

    def spy(net, x, y, settings):
        seen["settings"], seen["n"] = settings, len(x)
        return real(net, x, y, settings)

    monkeypatch.setattr(handloop, "train", spy)
    overrides = ["trainer.accelerator=cpu", "accel=max", "accel.compile_backend=eager", "model=cnn"]
    overrides += ["++trainer.max_steps=12"]
    assert bench.main(["--hand-run", str(tmp_path), "--steps", "4", "--warmup", "2", *overrides]) == 0
    s = seen["settings"]
    assert seen["n"] == 1258 and s.batch_size == 64 and s.schedule_steps == 12
    assert (s.compile, s.compile_backend, s.channels_last, s.on_device, s.drop_last) == (
        True,
        "eager",
        True,
        True,
        True,
    )
    assert s.optimizer["fused"] is True and s.precision == "32-true"  # resolved as the preset's run is
    report = json.loads((tmp_path / "speed.json").read_text())
    assert report["timed_steps"] == 4 and report["device"].startswith("cpu")


def test_a_hand_row_of_a_module_without_a_scheduler_trains_with_a_constant_rate(tmp_path: Path) -> None:
    """The contract asks a module for `loss` and `model.optimizer` only: no `scheduler:` block is no
    schedule, as in its own run (was: 'Input cfg is not an OmegaConf config object')."""
    overrides = ["trainer.accelerator=cpu", "model.scheduler=null", "++trainer.max_steps=4"]
    assert bench.main(["--hand-run", str(tmp_path), "--steps", "2", "--warmup", "1", *overrides]) == 0
    assert json.loads((tmp_path / "speed.json").read_text())["timed_steps"] == 2
