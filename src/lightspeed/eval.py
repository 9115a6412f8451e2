"""`python -m lightspeed.eval ckpt_path=...`: test a checkpoint on whatever device is here, on the data its
run was trained with, and optionally write predictions (computed under inference mode, without autograd)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from omegaconf import DictConfig, OmegaConf, open_dict

from lightspeed.core import summary
from lightspeed.core.boundary import phase
from lightspeed.core.config import ConfigError, exit_on_config_error, validate_common
from lightspeed.core.failures import exit_on_failure
from lightspeed.core.files import write_text_atomically
from lightspeed.core.logs import silence_known_noise
from lightspeed.core.schema import SCHEMA
from lightspeed.data.base import ArrayDataModule
from lightspeed.report import confusion_matrix, figures, viz
from lightspeed.resilience import identity, verify
from lightspeed.resilience.identity import CLASS_NAMES_KEY, DATA_CONFIG_KEY, FROM_DATA_KEY, TRAIN_SAMPLES_KEY
from lightspeed.run import build, tracking
from lightspeed.run.entry import hydra_entry
from lightspeed.run.restore import check_stored_data, load_module
from lightspeed.speed import accel
from lightspeed.speed.accel import LOADER_KNOBS


def run(cfg: DictConfig) -> dict[str, float]:
    silence_known_noise()
    with exit_on_config_error():
        validate_common(cfg)
        if (cfg.predict or cfg.get("viz")) and cfg.trainer.get("devices", 1) != 1:
            raise ConfigError(
                "predict=true and viz=true write their files from one process: add trainer.devices=1"
            )
        idle = accel.resolve(cfg)
        accel.apply_to_torch(cfg)
        ckpt, stored, model = load_module(cfg)
        given = use_run_data(cfg, stored, ckpt)
        dm = build.datamodule(cfg)
        _check_fits(model, stored.get(FROM_DATA_KEY), dm)
        class_names = _check_classes(stored.get(CLASS_NAMES_KEY), dm)
        seen = seen_in_training(dm, stored.get(TRAIN_SAMPLES_KEY), given)
        accel.apply_to_model(cfg, model)
        tracking.continue_runs(cfg)
        trainer = build.trainer(cfg)
        accel.report_idle(idle, accel.device_type(cfg))

    run_dir = Path(cfg.paths.output_dir)
    summary.config_tree(build.plain_config(cfg), run_dir, show=cfg.get("print_config", True))
    with exit_on_config_error(), exit_on_failure(cfg, trainer), phase("test"):  # each phase ends in one line
        results = trainer.test(model, datamodule=dm, verbose=False)
    metrics = {k: float(v) for k, v in (results[0] if results else {}).items()}
    matrix = getattr(model, "confusion_matrix", None)  # a classifier's, computed in testing
    confusion = confusion_matrix.write(matrix, run_dir, class_names) if torch.is_tensor(matrix) else None
    predictions, pictures = _predict(cfg, trainer, model, dm, class_names)
    summary.report(
        "Lightspeed: evaluation",
        run_dir,
        {
            "checkpoint": ckpt,
            "run_dir": run_dir,
            "predictions": predictions,
            "confusion_matrix": confusion,
            "pictures": pictures,
            "test_samples_seen_in_training": seen,
            "config": build.plain_config(cfg),
        },
        metrics,
    )
    return metrics


def _predict(
    cfg: DictConfig,
    trainer: L.Trainer,
    model: L.LightningModule,
    dm: L.LightningDataModule,
    class_names: list[str] | None,
) -> tuple[str | None, str | None]:
    """predict=true: predictions.csv; viz=true: the pictures (what each wrote, else None). On the test set
    where the DataModule has no predict_dataloader; nothing, in one line, where the module has no
    predict_step (Lightning's own calls the module on the whole batch, targets too: a traceback)."""
    if not _predicts(cfg, model):
        return None, None
    predict, found = bool(cfg.predict), viz.Intermediates() if cfg.get("viz") else None
    if found is not None:
        trainer.callbacks.append(found)
    with exit_on_config_error(), exit_on_failure(cfg, trainer), phase("predict"):  # under inference_mode
        if type(dm).predict_dataloader is L.LightningDataModule.predict_dataloader:  # the test set's
            batches = trainer.predict(model, dm.test_dataloader(), return_predictions=predict)
        else:
            batches = trainer.predict(model, datamodule=dm, return_predictions=predict)
    run_dir = Path(cfg.paths.output_dir)
    predictions = (
        _write_predictions(batches or [], run_dir / "predictions.csv", class_names) if predict else None
    )
    pictures = _pictures(found, run_dir, class_names, type(model).__name__) if found is not None else None
    return predictions, pictures


def _predicts(cfg: DictConfig, model: L.LightningModule) -> bool:
    """Whether predict=true or viz=true asks for predictions that the module can make (a predict_step)."""
    asked = " and ".join(f"{k}=true" for k in ("predict", "viz") if cfg.get(k))
    if asked and type(model).predict_step is L.LightningModule.predict_step:
        rank_zero_info(
            f"{asked}: {type(model).__name__} has no predict_step, so nothing is predicted (no "
            "predictions.csv or pictures): give it one returning a dict of tensors (docs/guide.md)"
        )
        return False
    return bool(asked)


_NO_GALLERY = "predict_step gives no target, pred and prob"


def _pictures(found: viz.Intermediates, run_dir: Path, class_names: list[str] | None, name: str) -> str:
    """viz=true: feature_maps.png and predictions.png, whichever the model has something for; one line
    when it has neither (no convolution layers, no predict_step giving target, pred and prob)."""
    with exit_on_config_error(), phase("viz"):
        if figures.pyplot(run_dir, lambda line: None) is None:
            raise ConfigError("viz=true needs matplotlib: make install EXTRAS=dev")
        maps = viz.feature_maps(found, run_dir / viz.FEATURE_MAPS_FILE)
        gallery = viz.gallery(found, run_dir / viz.GALLERY_FILE, class_names)
        if maps is None and gallery is None:
            raise ConfigError(
                f"viz=true: nothing to show for {name}: it has no convolution layers (feature maps) and its "
                f"{_NO_GALLERY} (a gallery of predictions)"
            )
        if maps is None or gallery is None:  # one of the two: say why the other is missing
            why = f"{name} has no convolution layers" if maps is None else f"{name}'s {_NO_GALLERY}"
            rank_zero_info(f"viz=true: only {(maps or gallery).name}: {why}")
    return ", ".join(str(p) for p in (maps, gallery) if p is not None)


#: Data keys that say where and how a data set is read, not what it is (outside a run's identity, in the one
#: schema): this machine's, or the command line's, whichever data is evaluated.
PLACE_KEYS = tuple(
    k.removeprefix("data.") for k, key in SCHEMA.items() if k.startswith("data.") and not key.identity
)


def use_run_data(cfg: DictConfig, stored: dict[str, Any], ckpt: Path) -> bool:
    """Evaluate on the data the run was trained with: its data config, as saved in the checkpoint (as
    written: `${paths.data_dir}` resolves on this machine), with this machine's loader settings and any
    `data.data_dir` or `data.mirrors` given on the command line. Data given on the command line
    (`data=...`, `data.split_seed=...`) wins, with a line naming what differs from the run's; conf/data
    edited since the run changes nothing (a changed split would put training samples into the test set,
    and inflate the figures). Returns whether the data was given on the command line."""
    run_data = stored.get(DATA_CONFIG_KEY) or ((stored.get("identity") or {}).get("config") or {}).get("data")
    given = _data_overrides()
    if not isinstance(run_data, dict):
        rank_zero_warn(
            f"{ckpt} holds no data config (saved before Lightspeed kept one): evaluating on the data as "
            "composed; pass the data it was trained on (data=...)"
        )
        return True
    if _say_which(cfg, run_data, given, ckpt):
        return True
    check_stored_data(run_data, ckpt, given)
    run_data = {k: v for k, v in run_data.items() if k != "mirrors"}
    with open_dict(cfg):
        cfg.data = OmegaConf.merge(OmegaConf.create(run_data), _machine_s(cfg.data, given))
    validate_common(cfg)
    return False


def _machine_s(data: DictConfig, given: list[str]) -> dict[str, Any]:
    """What of the data node is this machine's: the loader settings (the accel preset's), and where the data
    is (`data.data_dir`, `data.mirrors`) where the command line gives it."""
    keep = {k: data[k] for k in LOADER_KNOBS if k in data}
    return keep | {
        k: data[k] for k in PLACE_KEYS if k not in LOADER_KNOBS and f"data.{k}" in given and k in data
    }


def _say_which(cfg: DictConfig, run_data: dict[str, Any], given: list[str], ckpt: Path) -> bool:
    """Whether the command line gives the data (not only where it is); either way, a line naming how the
    data evaluated on differs from the run's."""
    what = [k for k in given if k == "data" or k.split(".")[1] not in PLACE_KEYS]
    diffs = verify.differences(identity.identity({"data": run_data}), identity.of(cfg))
    diffs = [d for d in diffs if d.startswith("data.")]
    if what and diffs:
        rank_zero_info(f"data: as given, not the run's ({verify.describe(diffs)})")
    elif diffs and run_data.get("_target_") == cfg.data.get("_target_"):
        rank_zero_info(
            f"data: the run's own, as saved in {ckpt.name} (conf/data differs: {verify.describe(diffs)}); "
            "pass data=... to evaluate on other data"
        )
    return bool(what)


def _data_overrides() -> list[str]:
    """The keys the command line set under `data` (`data` itself for `data=<option>`)."""
    if not HydraConfig.initialized():
        return []
    keys = [o.lstrip("+~").split("=")[0] for o in HydraConfig.get().overrides.task]
    return [k for k in keys if k == "data" or k.startswith("data.")]


def seen_in_training(dm: L.LightningDataModule, trained_on: torch.Tensor | None, given: bool) -> int | None:
    """How many test samples the checkpoint was trained on (warned about: its figures are inflated), from
    the sample ids it keeps; None when the checkpoint or the DataModule has none."""
    if trained_on is None or not isinstance(dm, ArrayDataModule):
        return None
    dm.prepare_data()
    dm.setup("test")
    test = dm.sample_ids["test"]
    seen = int(torch.isin(test, trained_on).sum())
    if seen:
        fix = (
            "evaluate on the run's own data (drop the data overrides)"
            if given
            else "the run's own test split holds samples of its training split (duplicates in the data set?)"
        )
        rank_zero_warn(
            f"{seen} of the {len(test)} test samples ({seen / len(test):.1%}) are among the "
            f"{len(trained_on)} the checkpoint was trained on: its test figures are inflated; {fix}"
        )
    return seen


def _check_fits(model: L.LightningModule, from_data: list[str] | None, dm: L.LightningDataModule) -> None:
    """The data gives what the checkpoint's model was built from (the arguments it names; from before they
    were named: `num_classes` and `input_shape`), alike where a structure (a shape, count, vocabulary size,
    names); a statistic (a float, such as a regressor's target mean) may differ: the model keeps its own."""
    names = from_data if from_data is not None else ["num_classes", "input_shape"]
    names = [k for k in names if k in model.hparams]
    given = build.model_args(dm)
    missing = [k for k in names if k not in given]
    if missing:
        raise ConfigError(
            f"data: {type(dm).__name__} gives no {', '.join(missing)} (its model_args()), which the "
            f"checkpoint's model ({type(model).__name__}) was built from: pass the data it was trained on "
            "(data=...)"
        )
    said = _structure_differences(model.hparams, given, names)
    if said:
        raise ConfigError(
            f"the checkpoint's model does not fit data {type(dm).__name__} ({said}): pass the data it was "
            "trained on (data=...)"
        )


def _structure_differences(trained: Any, given: dict[str, Any], names: list[str]) -> str:
    """`<name> <in training> in training, <here> here` for each structural argument that differs."""
    pairs = [(k, trained[k], build.plain(given[k])) for k in names if _structural(trained[k])]
    return "; ".join(f"{k} {was} in training, {now} here" for k, was, now in pairs if was != now)


def _structural(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_structural(v) for v in value)
    return isinstance(value, (int, str, bool))


def _check_classes(trained: list[str] | None, dm: L.LightningDataModule) -> list[str] | None:
    """The class names, where the checkpoint keeps them: the data's must be the same, in the same order
    (label i must mean the class it meant in training)."""
    names = getattr(dm, "class_names", None)
    if trained is not None and names is not None and list(names) != list(trained):
        first = next((i for i, (a, b) in enumerate(zip(trained, names, strict=False)) if a != b), None)
        differs = (
            f"label {first} is {trained[first]!r} in training, {names[first]!r} here"
            if first is not None
            else f"{len(trained)} classes in training, {len(names)} here"
        )
        raise ConfigError(
            f"the checkpoint's classes are not the data's ({differs}): evaluate on data with the same "
            "class folders"
        )
    return list(trained) if trained is not None else None


def _write_predictions(batches: list[Any], path: Path, class_names: list[str] | None = None) -> Path:
    """One row per sample, a column per entry of what `predict_step` returns (a dict of tensors, or one
    tensor: `pred`), in order; a row of numbers (a sequence's tokens) is one column of space-separated values.
    `target` and `pred` get the class names beside them where the run's data named its classes."""
    columns = _columns(batches, class_names is not None)
    rows = len(next(iter(columns.values()))) if columns else 0
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(["index", *columns])
    writer.writerows([i, *(_cell(k, v[i], class_names) for k, v in columns.items())] for i in range(rows))
    write_text_atomically(path, text.getvalue())  # in place of a link or a FIFO there, never through it
    return path


def _columns(batches: list[Any], named: bool) -> dict[str, torch.Tensor]:
    """Each entry of the batches' predictions over all samples, a row a sample; with class names (`named`),
    `target_class` and `pred_class` beside the class indices."""
    parts = [b if isinstance(b, dict) else {"pred": b} for b in batches]
    columns = {k: torch.cat([p[k].reshape(len(p[k]), -1).cpu() for p in parts]) for k in (parts or [{}])[0]}
    if named:
        columns |= {f"{key}_class": columns[key] for key in ("target", "pred") if _labels(columns.get(key))}
    return columns


def _labels(column: torch.Tensor | None) -> bool:
    """A column of one integer a sample: class indices, which the class names can say."""
    return column is not None and column.shape[1] == 1 and not column.is_floating_point()


def _cell(key: str, values: torch.Tensor, class_names: list[str] | None) -> str:
    if key.endswith("_class") and class_names is not None:
        return class_names[int(values[0])]
    return " ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in values.tolist())


#: Console entry point: `lightspeed-eval` and `python -m lightspeed.eval`.
main = hydra_entry("eval", run)

if __name__ == "__main__":
    main()
