"""`make export`: a checkpoint's model as ONNX and as a torch.export program, each giving the module's own
outputs on inputs of a batch size it was not exported with (checked here again, independently of the
command's own check)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import TINY
from lightspeed.core.config import ConfigError
from lightspeed.export import example_inputs
from lightspeed.export import run as export
from lightspeed.run.entry import compose_config
from lightspeed.run.restore import load_module
from lightspeed.train import train


@pytest.mark.slow  # two small runs and two exports through torch's ONNX exporter (~30 s)
@pytest.mark.parametrize("model", ["cnn", "mlp"])
def test_an_exported_model_gives_the_checkpoint_s_outputs_in_onnxruntime_and_torch_export(
    tmp_path: Path, model: str
) -> None:
    onnxruntime = pytest.importorskip("onnxruntime", reason="make export needs the export extra")
    logs = tmp_path / "logs"
    train(compose_config("train", [*TINY, f"model={model}", "print_config=false"], logs))
    cfg = compose_config("export", [], logs)
    facts = export(cfg)
    _, _, module = load_module(cfg)
    module.eval()
    x = torch.randn(7, 1, 8, 8)  # digits' shape, a batch size neither the export nor its check used
    with torch.inference_mode():
        want = module(x)
    session = onnxruntime.InferenceSession(str(facts["onnx"]["file"]), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    assert torch.allclose(torch.from_numpy(got), want, atol=1e-5)
    program = torch.export.load(facts["torch_export"]["file"]).module()
    assert torch.allclose(program(x), want, atol=1e-6)


def test_a_module_without_an_example_input_is_one_line() -> None:
    class Bare(torch.nn.Module):
        example_input_array = None

    with pytest.raises(ConfigError, match=r"^Bare has no example_input_array: set one in its __init__"):
        example_inputs(Bare(), 3)


class Tiny(torch.nn.Module):
    example_input_array = torch.zeros(2, 4)

    def __init__(self, branch: bool = False) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.branch = branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.branch and x.sum() > 0:  # data-dependent control flow: torch.export cannot trace it
            return -self.linear(x)
        return self.linear(x)


def test_an_export_that_fails_its_check_leaves_no_file(tmp_path: Path) -> None:
    from lightspeed.export import export as write

    facts = write(Tiny(), tmp_path / "ok", ["torch_export"], batch=5, tolerance=1e-6)
    assert [p.name for p in (tmp_path / "ok").iterdir()] == ["model.pt2"] and facts["torch_export"][
        "file"
    ].is_file()
    with pytest.raises(ConfigError, match=r"^model\.pt2: its outputs differ from the checkpoint's model by"):
        write(Tiny(), tmp_path / "bad", ["torch_export"], batch=5, tolerance=-1.0)  # no output passes
    assert list((tmp_path / "bad").iterdir()) == []


def test_the_onnx_file_is_checked_against_the_module_and_takes_any_batch(tmp_path: Path, monkeypatch) -> None:
    """Fast, on a small module (the slow test exports trained checkpoints): the ONNX file runs in onnxruntime
    on a batch size neither the export nor its check used, and gives the module's outputs; and the command
    compares what onnxruntime computes with the module (an ONNX file that computed otherwise is refused)."""
    onnxruntime = pytest.importorskip("onnxruntime", reason="make export needs the export extra")
    from lightspeed.export import export as write

    module = Tiny().eval()
    facts = write(module, tmp_path / "ok", ["onnx"], batch=5, tolerance=1e-5)
    session = onnxruntime.InferenceSession(str(facts["onnx"]["file"]), providers=["CPUExecutionProvider"])
    x = torch.randn(7, 4)
    with torch.inference_mode():
        assert torch.allclose(torch.from_numpy(session.run(None, {"x": x.numpy()})[0]), module(x), atol=1e-5)

    run = onnxruntime.InferenceSession.run
    monkeypatch.setattr(onnxruntime.InferenceSession, "run", lambda *a, **k: [o + 0.5 for o in run(*a, **k)])
    with pytest.raises(
        ConfigError, match=r"^model\.onnx: its outputs differ from the checkpoint's model by 0\.5"
    ):
        write(module, tmp_path / "bad", ["onnx"], batch=5, tolerance=1e-5)
    assert list((tmp_path / "bad").iterdir()) == []


def test_a_model_the_exporter_cannot_trace_is_one_line(tmp_path: Path) -> None:
    from lightspeed.export import export as write

    with pytest.raises(
        ConfigError, match=r"^torch\.export could not export Tiny: \w+: .+formats=\.\.\. leaves"
    ):
        write(Tiny(branch=True), tmp_path / "out", ["torch_export"], batch=5, tolerance=1e-6)
    assert list((tmp_path / "out").iterdir()) == []
