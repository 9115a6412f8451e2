"""`python -m lightspeed.eval ckpt_path=...`: test a checkpoint on whatever device is here, and
optionally write predictions (computed under inference mode, without autograd)."""

from __future__ import annotations

import contextlib
import csv
import json
from pathlib import Path

import torch
from hydra.utils import get_class
from omegaconf import DictConfig

from lightspeed.compat import hooks
from lightspeed.core import summary
from lightspeed.core.config import ConfigError, check_checkpoint_path, exit_on_config_error, validate_common
from lightspeed.core.logs import silence_known_noise
from lightspeed.data.base import ArrayDataModule
from lightspeed.resilience import checkpoint
from lightspeed.run import build
from lightspeed.run.entry import hydra_entry
from lightspeed.speed import accel


def find_checkpoint(ckpt_path: str, log_dir: Path) -> Path:
    """`latest`: the best checkpoint of the newest training run under `log_dir/train` that has one;
    anything else is a path."""
    if ckpt_path != "latest":
        path = Path(ckpt_path)
        check_checkpoint_path(path)
        return path
    runs = sorted((log_dir / "train").glob(f"**/{summary.SUMMARY_FILE}"), key=lambda p: p.stat().st_mtime)
    for found in reversed(runs):  # newest first; runs without a best checkpoint (debug=fdr) are skipped
        record = json.loads(found.read_text())
        best = record.get("best_checkpoint")
        if not best:
            continue
        path = Path(best)
        if not path.is_file() and record.get("run_dir"):  # the run's folder was moved: the file in it
            with contextlib.suppress(ValueError):
                path = found.parent / path.relative_to(record["run_dir"])
        if path.is_file():
            return path
    raise ConfigError(
        f"ckpt_path=latest found no training run with a best checkpoint under {log_dir / 'train'}: "
        "run `make train` first, or pass ckpt_path=path/to/file.ckpt"
    )


def run(cfg: DictConfig) -> dict[str, float]:
    silence_known_noise()
    with exit_on_config_error():
        validate_common(cfg)
        if cfg.predict and cfg.trainer.get("devices", 1) != 1:
            raise ConfigError(
                "predict=true writes one predictions.csv from one process: add trainer.devices=1"
            )
        idle = accel.resolve(cfg)
        accel.apply_to_torch(cfg)
        ckpt = find_checkpoint(str(cfg.ckpt_path), Path(cfg.paths.log_dir))
        try:
            module_cls = get_class(cfg.module)
        except (ImportError, ValueError) as err:
            raise ConfigError(
                f"module={cfg.module} cannot be imported ({err}): use a LightningModule class"
            ) from None
        # map_location="cpu": a checkpoint saved on a GPU loads on any machine; the Trainer then moves
        # the model to whatever device this run uses. weights_only: loading never executes code.
        with checkpoint.loading(ckpt):
            model = module_cls.load_from_checkpoint(ckpt, map_location="cpu", weights_only=True)
        reason = checkpoint.problem(ckpt)  # it loads: is it sound? (a NaN model scores as if it were)
        if reason is not None:
            raise ConfigError(f"ckpt_path={ckpt} cannot be evaluated: {reason}; pass another checkpoint")
        hooks.speed_up_module(model)
        dm = build.datamodule(cfg)
        _check_fits(model.hparams, dm)
        accel.apply_to_model(cfg, model)
        trainer = build.trainer(cfg)
        accel.report_idle(idle, accel.device_type(cfg))

    results = trainer.test(model, datamodule=dm, verbose=False)
    metrics = {k: float(v) for k, v in (results[0] if results else {}).items()}
    run_dir = Path(cfg.paths.output_dir)
    predictions = None
    if cfg.predict:
        batches = trainer.predict(model, datamodule=dm)  # the Trainer predicts under torch.inference_mode
        predictions = _write_predictions(batches or [], run_dir / "predictions.csv")
    summary.report(
        "Lightspeed: evaluation",
        run_dir,
        {
            "checkpoint": ckpt,
            "run_dir": run_dir,
            "predictions": predictions,
            "config": build.plain_config(cfg),
        },
        metrics,
    )
    return metrics


def _check_fits(hparams: dict, dm: ArrayDataModule) -> None:
    shape, classes = list(hparams.get("input_shape", [])), hparams.get("num_classes")
    data_shape, data_classes = getattr(dm, "input_shape", None), getattr(dm, "num_classes", None)
    if data_shape is None or data_classes is None:
        raise ConfigError(
            f"data: {type(dm).__name__} has no input_shape or num_classes: set them as attributes of your "
            "DataModule, so that the checkpoint's model can be checked against it"
        )
    if shape != list(data_shape) or classes != data_classes:
        raise ConfigError(
            f"the checkpoint's model takes inputs {shape} with {classes} classes but data gives "
            f"{list(data_shape)} with {data_classes}: pass the data it was trained on (data=...)"
        )


def _write_predictions(batches: list[dict[str, torch.Tensor]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pred = torch.cat([b["pred"] for b in batches]).tolist()
    prob = torch.cat([b["prob"] for b in batches]).tolist()
    target = torch.cat([b["target"] for b in batches]).tolist()
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["index", "target", "pred", "prob"])
        writer.writerows(
            (i, t, p, f"{q:.6f}") for i, (t, p, q) in enumerate(zip(target, pred, prob, strict=True))
        )
    return path


#: Console entry point: `lightspeed-eval` and `python -m lightspeed.eval`.
main = hydra_entry("eval", run)

if __name__ == "__main__":
    main()
