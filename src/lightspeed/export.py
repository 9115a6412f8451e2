"""`make export ckpt_path=...`: the model a checkpoint holds, for serving without Lightspeed or Python's
training stack: ONNX (torch's exporter; then run by onnxruntime on fresh inputs and compared with the
module's own outputs, or the export fails in one line) and a `torch.export` program (`model.pt2`,
loaded back and compared the same way). The batch dimension stays free in both. The inputs are shaped
like the module's `example_input_array` (what ModelSummary uses), else like its run's data's first test
batch; a module with neither is one line."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from lightspeed.core import summary
from lightspeed.core.boundary import phase
from lightspeed.core.config import ConfigError, exit_on_config_error, first_line, validate_common
from lightspeed.core.logs import silence_known_noise
from lightspeed.resilience.identity import DATA_CONFIG_KEY
from lightspeed.run import build
from lightspeed.run.entry import hydra_entry
from lightspeed.run.restore import check_stored_data, load_module

FORMATS = ("onnx", "torch_export")


def example_inputs(model: L.LightningModule, batch: int) -> tuple[torch.Tensor, ...]:
    """Random inputs shaped like the module's example, `batch` of them: floats from a normal
    distribution, integer ids (a token model's) below the largest id the example holds, or its vocabulary."""
    example = model.example_input_array
    if example is None:
        raise ConfigError(
            f"{type(model).__name__} has no example_input_array: set one in its __init__ (a batch of inputs "
            "of the right shape and dtype) to export it"
        )
    examples = example if isinstance(example, tuple) else (example,)
    generator = torch.Generator().manual_seed(0)

    def fresh(t: torch.Tensor) -> torch.Tensor:
        shape = (batch, *t.shape[1:])
        if t.is_floating_point():
            return torch.randn(shape, generator=generator, dtype=t.dtype)
        high = int(model.hparams.get("vocab_size") or int(t.max()) + 1)
        return torch.randint(0, max(high, 1), shape, generator=generator, dtype=t.dtype)

    return tuple(fresh(t) for t in examples)


def _dynamic(inputs: tuple[torch.Tensor, ...]) -> tuple[dict[int, Any], ...]:
    batch = torch.export.Dim("batch", min=1, max=65536)
    return tuple({0: batch} for _ in inputs)


def _compare(name: str, got: torch.Tensor, want: torch.Tensor, tolerance: float) -> float:
    worst = float((got.float() - want.float()).abs().max())
    if not worst <= tolerance * max(1.0, float(want.float().abs().max())):
        raise ConfigError(
            f"{name}: its outputs differ from the checkpoint's model by {worst:.3g} (tolerance={tolerance}): "
            "export with another opset or check the model for data-dependent control flow"
        )
    return worst


def export(
    model: L.LightningModule, out: Path, formats: list[str], batch: int, tolerance: float
) -> dict[str, Any]:
    """Write each format into `out`, check it on `batch` fresh inputs; returns what was written and how close.
    Each leaves its hidden folder only once checked: a failed export leaves no good-looking file."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ConfigError(f"formats={formats} is invalid: use a list of {', '.join(FORMATS)}")
    model = model.cpu().eval()
    inputs, fresh = example_inputs(model, 2), example_inputs(model, batch)
    with torch.inference_mode():
        want = model(*fresh)
    out.mkdir(parents=True, exist_ok=True)
    facts: dict[str, Any] = {}
    for name in formats:
        partial = Path(tempfile.mkdtemp(prefix=f".partial-{name}-", dir=out))
        try:
            written, difference = (_torch_export if name == "torch_export" else _onnx)(
                model, inputs, fresh, want, partial, tolerance
            )
            for path in sorted(partial.iterdir()):  # the ONNX file and its external data, if any
                os.replace(path, out / path.name)
            facts[name] = {"file": out / written.name, "max_difference": difference}
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return facts


def _exported(what: str, model: L.LightningModule, build: Callable[[], Any]) -> Any:
    """An exporter's failure (a model it cannot trace) as one line naming the model and the cause."""
    try:
        return build()
    except Exception as err:  # any exporter error: one line; the cause is chained
        cause = first_line(err)
        raise ConfigError(
            f"{what} could not export {type(model).__name__}: {type(err).__name__}: {cause[:300]} "
            "(formats=... leaves that format out)"
        ) from err


def _torch_export(
    model: L.LightningModule, inputs: tuple, fresh: tuple, want: torch.Tensor, folder: Path, tolerance: float
) -> tuple[Path, float]:
    path = folder / "model.pt2"
    program = _exported(
        "torch.export", model, lambda: torch.export.export(model, inputs, dynamic_shapes=_dynamic(inputs))
    )
    torch.export.save(program, path)
    loaded = torch.export.load(path).module()
    with torch.inference_mode():
        return path, _compare("model.pt2", loaded(*fresh), want, tolerance)


def _onnx(
    model: L.LightningModule, inputs: tuple, fresh: tuple, want: torch.Tensor, folder: Path, tolerance: float
) -> tuple[Path, float]:
    try:
        import onnxruntime
    except ImportError:
        raise ConfigError(
            "formats=[onnx] needs onnx, onnxscript and onnxruntime: make install EXTRAS=dev,export"
        ) from None
    path = folder / "model.onnx"
    program = _exported(
        "torch.onnx",
        model,
        lambda: torch.onnx.export(model, inputs, dynamo=True, dynamic_shapes=_dynamic(inputs), verbose=False),
    )
    program.save(str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), fresh, strict=True)}
    got = torch.from_numpy(session.run(None, feed)[0])
    return path, _compare("model.onnx", got, want, tolerance)


def run(cfg: DictConfig) -> dict[str, Any]:
    silence_known_noise()
    with exit_on_config_error():
        validate_common(cfg)  # check_batch and tolerance among them
        ckpt, stored, model = load_module(cfg)
        if model.example_input_array is None:
            model.example_input_array = _first_test_inputs(cfg, stored.get(DATA_CONFIG_KEY), ckpt)
        run_dir = Path(cfg.paths.output_dir)
        with phase("export"):
            facts = export(model, run_dir, list(cfg.formats), int(cfg.check_batch), float(cfg.tolerance))
    rows = {"checkpoint": ckpt, "run_dir": run_dir}
    for name, f in facts.items():
        rows[name] = f"{f['file']} (outputs within {f['max_difference']:.2g} of the checkpoint's model)"
    summary.report("Lightspeed: export", run_dir, rows, {})
    return facts


def _first_test_inputs(cfg: DictConfig, node: Any, ckpt: Path) -> torch.Tensor | None:
    """The inputs of the first test batch of the data the checkpoint's run trained on (its stored data node,
    a data file: only classes that conf/ or its run's command line names), or None without one."""
    if not isinstance(node, dict):
        return None
    check_stored_data(node, ckpt, [])  # as eval's: conf/'s classes, plain values, this machine's folders
    node = {k: v for k, v in node.items() if k != "mirrors"}  # no server the checkpoint names
    dm = build.datamodule(OmegaConf.create({"data": node, "paths": OmegaConf.to_container(cfg.paths)}))
    dm.prepare_data()
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()))
    inputs = batch[0] if isinstance(batch, (list, tuple)) else batch
    return inputs if isinstance(inputs, torch.Tensor) else None


#: `make export` / `python -m lightspeed.export`.
main = hydra_entry("export", run)

if __name__ == "__main__":
    main()
