"""The only place that instantiates objects from the config: data, model, callbacks, loggers, trainer."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import re
import typing
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate as _instantiate
from lightning.pytorch.callbacks import Callback, Checkpoint, EarlyStopping, LearningRateMonitor, ProgressBar
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_info
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lightspeed.compat import hooks
from lightspeed.compat.callbacks import ModelCheckpoint
from lightspeed.core.boundary import phase
from lightspeed.core.config import ConfigError, first_line, locate
from lightspeed.models import nets
from lightspeed.report.curves import CurvesLogger
from lightspeed.resilience import identity, resume
from lightspeed.resilience.checkpoint import AtomicCheckpointIO
from lightspeed.resilience.exact_resume import ExactResume
from lightspeed.resilience.nonfinite import NonFiniteGuard
from lightspeed.speed.accel import LOADER_KNOBS


def instantiate(node: Any, where: str, **kwargs: Any) -> Any:
    """Hydra's instantiate, with a refused setting in one line naming the config node `where` (and the key
    where the refusal names one); a ConfigError passes through, other errors keep their traceback. The
    node's values are checked against its constructor's annotations first (`check_arguments`)."""
    try:
        with phase(f"instantiate {where}"):
            if OmegaConf.is_config(node) and "_target_" in node:
                check_arguments(node, where)
            return _instantiate(node, **kwargs)
    except InstantiationException as err:
        from lightspeed.run.build_errors import refused_setting

        refused = refused_setting(err, node, where)
        if refused is None:
            raise
        raise refused from None


def where(node: DictConfig) -> str:
    """The dotted key of a node of a config (`model.net`), as its one-line errors name it."""
    return str(node._get_full_key(None)) or "the config"  # OmegaConf's own, not public


def check_arguments(node: DictConfig, where: str) -> None:
    """The node's values (and those of the `_target_` nodes in it) against the annotations of the
    parameters they go to, checked by OmegaConf as a structured config: the types live on the constructor.
    A value that does not fit is one line before anything is built; what OmegaConf cannot type is left to
    the constructor."""
    target = _import(node, where)
    for key, value in node.items():
        if OmegaConf.is_dict(value) and "_target_" in value:
            check_arguments(value, f"{where}.{key}")
    hints = _annotations(target)
    values = {str(k): node[k] for k in node if k in hints}
    misfit = _misfit(values, hints)
    if misfit is not None:
        key, why = misfit
        raise ConfigError(
            f"{where}.{key}={short(values.get(key))} is invalid: {node._target_} takes {key}: "
            f"{_said(hints.get(key))} ({why})"
        )


def _misfit(values: dict[str, Any], hints: dict[str, Any]) -> tuple[str, str] | None:
    """The first value that its hint refuses, and why: OmegaConf's check, and no string where only a number
    or true/false goes (OmegaConf would take "no" as false, but the constructor gets the string)."""
    fields = [(k, _typed(hints[k]), dataclasses.field(default=MISSING)) for k in values]
    try:
        OmegaConf.merge(OmegaConf.structured(dataclasses.make_dataclass("Args", fields)), values)
    except OmegaConfBaseException as err:
        return re.split(r"[.\[]", str(getattr(err, "full_key", "") or ""))[0], first_line(err)
    said = next((k for k, v in values.items() if isinstance(v, str) and _scalar(hints[k])), None)
    return None if said is None else (said, "a string where a number or true/false goes")


def _scalar(hint: Any) -> bool:
    """Whether `hint` takes only numbers and true/false (and null)."""
    kinds = [a for a in (typing.get_args(hint) or (hint,)) if a is not type(None)]
    return bool(kinds) and all(k in (bool, int, float) for k in kinds)


def _annotations(target: Any) -> dict[str, Any]:
    """The annotated parameters of a class's constructor or of a function (a `None` default makes one
    optional); none where they cannot be read (an annotation naming what is not importable, no signature)."""
    try:
        hints = typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
        params = inspect.signature(target).parameters
        return {
            k: hint if params[k].default is not None else typing.Optional[hint]  # noqa: UP045 (any hint)
            for k, hint in hints.items()
            if k in params
        }
    except Exception:  # whatever evaluating a module's annotations raises: left to the constructor
        return {}


def _typed(hint: Any) -> Any:
    """`hint` where OmegaConf can check a value against it as Python would, else Any: not a dataclass or an
    attrs class (a `_target_` node builds those), nor what OmegaConf cannot type. Found once per hint (a
    run checks ~60 arguments; finding it takes ~1 ms), unless the hint cannot be a key."""
    try:
        return _typed_once(hint)
    except TypeError:  # unhashable: Literal[[1, 2]]
        return _typed_once.__wrapped__(hint)


@functools.cache
def _typed_once(hint: Any) -> Any:
    parts = [hint]
    for part in parts:  # the hint and every type inside it
        parts += typing.get_args(part)
    if any(dataclasses.is_dataclass(p) or hasattr(p, "__attrs_attrs__") for p in parts):
        return Any
    try:
        OmegaConf.structured(
            dataclasses.make_dataclass("Hint", [("x", hint, dataclasses.field(default=MISSING))])
        )
    except OmegaConfBaseException:
        return Any
    return hint


def _said(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _node(cfg: DictConfig, group: str, kind: str) -> DictConfig:
    """The group's settings, which must be a mapping naming the class to build in `_target_`."""
    node = cfg.get(group)
    if not OmegaConf.is_dict(node) or "_target_" not in node:
        from lightspeed.run.build_errors import no_target

        raise ConfigError(no_target(node, group, kind))
    return node


def datamodule(cfg: DictConfig) -> L.LightningDataModule:
    return instantiate(data_node(cfg), "data", _convert_="all")


def data_node(cfg: DictConfig) -> DictConfig:
    """The configured DataModule's node, less the loader knobs it does not take (`untaken_knobs`)."""
    node, left = cfg.data, untaken_knobs(cfg)
    if not left:
        return node
    # resolved first: the rest may point elsewhere in the config (${paths.data_dir})
    kept = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k not in left}
    return OmegaConf.create({"data": kept}).data


def untaken_knobs(cfg: DictConfig) -> list[str]:
    """The loader knobs the accel preset sets under `data.` that the DataModule's constructor does not take
    (it builds its own loaders), said in one info line."""
    node = _node(cfg, "data", "LightningDataModule")
    target = _import(node, "data")
    params = inspect.signature(target).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return []
    left = [k for k in LOADER_KNOBS if k in node and k not in {p.name for p in params}]
    if left:
        name = getattr(target, "__name__", target)
        rank_zero_info(f"data: {name} takes no {', '.join(left)}: its own loaders decide them")
    return left


def model(
    cfg: DictConfig,
    dm: L.LightningDataModule,
    given: dict[str, Any] | None = None,
    node: DictConfig | None = None,
) -> L.LightningModule:
    """The configured LightningModule, instantiated as Hydra does (recursive unless its yaml says
    `_recursive_: false`, `_partial_`, factories), given what only the data knows (`from_data`); `node`:
    `model_node`'s, where the caller has it."""
    given = from_data(cfg, dm) if given is None else given
    node = model_node(cfg, given) if node is None else node
    check_model(cfg, dm, given, node)
    return instantiate(node, "model", _convert_="all")


def check_model(cfg: DictConfig, dm: L.LightningDataModule, given: dict[str, Any], node: DictConfig) -> None:
    """Before the module is built: a constructor needing what neither conf/model nor the data gives, and a
    net that cannot take the data's inputs (`check_inputs_fit`), each in one line naming both."""
    target = _import(node, "model")
    if not node.get("_partial_", False):
        missing = _missing(target, node)
        if missing:
            from lightspeed.run.build_errors import unfit

            raise ConfigError(unfit(missing, cfg, dm, given, target))
    check_inputs_fit(node, given)


def _missing(target: Any, node: DictConfig) -> list[str]:
    """The required parameters of `target` that `node` does not give (by name, or in `_args_`)."""
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return []
    required = [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    positional = len(node.get("_args_") or [])
    return [
        p.name
        for i, p in enumerate(required)
        if p.name not in node and not (i < positional and p.kind is not p.KEYWORD_ONLY)
    ]


def model_node(cfg: DictConfig, given: dict[str, Any]) -> DictConfig:
    """`cfg.model` resolved, with the data's arguments (`given`) added to each node Hydra will build that
    takes them and does not set them: the module's, and with recursion its nested `_target_`s' (by name
    only: a factory's **kwargs goes on to a constructor that may not take them). Plain data: the checkpoint
    keeps it as what rebuilds the module."""
    node = OmegaConf.to_container(_node(cfg, "model", "LightningModule"), resolve=True)
    assert isinstance(node, dict)

    def add(sub: Any, top: bool) -> None:
        children = sub if isinstance(sub, list) else sub.values() if isinstance(sub, dict) else ()
        if isinstance(sub, dict) and isinstance(sub.get("_target_"), str):
            with contextlib.suppress(Exception):  # not importable: instantiating it says why, in one line
                takes = nets.takes(locate(sub["_target_"]), given, through_kwargs=top)
                sub.update({k: v for k, v in takes.items() if k not in sub})
            if top and sub.get("_recursive_", True) is False:
                return
        for child in list(children):
            add(child, False)

    add(node, True)
    return OmegaConf.create({"model": node}).model  # its errors name it model


def from_data(cfg: DictConfig, dm: L.LightningDataModule) -> dict[str, Any]:
    """What only the data knows that the model is built from (the DataModule's `model_args()`: `num_classes`,
    `input_shape`, `vocab_size`, a regressor's target statistics), minus what conf/model sets itself. Passed
    at run time, never via globals; without `model_args()`, nothing."""
    own = _node(cfg, "model", "LightningModule")  # what conf/model sets itself
    given = {k: plain(v) for k, v in model_args(dm).items() if k not in own}
    if given:
        rank_zero_info(f"model: from the data, {', '.join(f'{k}={short(v)}' for k, v in given.items())}")
    return given


def model_args(dm: L.LightningDataModule) -> dict[str, Any]:
    """The DataModule's `model_args()`, or nothing where it has none."""
    method = getattr(dm, "model_args", None)
    return dict(method()) if callable(method) else {}


def short(value: Any, most: int = 40) -> str:
    text = str(value)
    return text if len(text) <= most else text[: most - 3] + "..."


def _import(node: Any, where: str) -> Any:
    """The class (or function that makes one) that the node's `_target_` names, or one line saying why not."""
    target = node.get("_target_")
    if not isinstance(target, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", target):
        raise ConfigError(f"{where}._target_={target!r} is not an import path: use module.Class")
    try:
        found = locate(target)
    except (ImportError, ValueError, AttributeError) as err:
        raise ConfigError(f"{where}._target_={target} cannot be imported ({err})") from None
    if not callable(found) or inspect.ismodule(found):
        raise ConfigError(f"{where}._target_={target} is not a class or a function: name one")
    return found


def plain(value: Any) -> Any:
    """Tuples, tensors and arrays as lists: hyperparameters stay plain data (weights_only checkpoints)."""
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    return value.tolist() if hasattr(value, "tolist") else value


def check_inputs_fit(node: DictConfig, given: dict[str, Any]) -> None:
    """A forward pass on the meta device (shapes only) of the model's `example_input_array`: a net that cannot
    take the data's inputs (1D data, the 2D default CNN) is one line naming both, not a traceback from the
    first step; a registered net not even buildable for `input_shape` is named by its `example_input_shapes`.
    A model without an example input is not checked. `node`: `model_node`'s, the data's arguments in it."""
    shape = given.get("input_shape")
    try:
        with torch.device("meta"):
            probe = _instantiate(node, _convert_="all")
    except Exception as err:  # not for this shape, or not on the meta device (it loads weights, say)
        from lightspeed.run.build_errors import refuse_declared

        refuse_declared(err, node, shape)
        return  # unchecked: building it for real will tell
    example = getattr(probe, "example_input_array", None)
    if not isinstance(example, torch.Tensor):
        return
    try:
        with torch.no_grad():
            probe.eval()(example.to("meta"))
    except Exception as err:  # one not about shapes (an op the meta device lacks): training will tell
        from lightspeed.run.build_errors import refuse_shape

        refuse_shape(err, shape if shape is not None else list(example.shape[1:]))


def _group(cfg: DictConfig | None, group: str) -> list[Any]:
    """Instantiate each `_target_` entry of a callbacks/logger group; `null` entries are switched off."""
    if not cfg:
        return []
    return [
        instantiate(node, f"{group}.{name}", _convert_="all")
        for name, node in cfg.items()
        if node is not None and "_target_" in node
    ]


def tracks(cfg: DictConfig) -> bool:
    """Whether a logger is MLflow's or W&B's (or a subclass): a rerun continues their tracked runs
    (`run/tracking.py`, imported only then)."""
    from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

    for node in (cfg.get("logger") or {}).values():
        with contextlib.suppress(Exception):  # not importable: building it says why, in one line
            found = locate(str(node._target_))
            if isinstance(found, type) and issubclass(found, (MLFlowLogger, WandbLogger)):
                return True
    return False


def loggers(cfg: DictConfig) -> list[Logger]:
    """The configured loggers (an MLflow or W&B one continues the tracked run of this folder's earlier
    attempt where `tracking.continue_runs` has put its id into `cfg`)."""
    return _group(cfg.get("logger"), "logger")


def callbacks(
    cfg: DictConfig,
    has_logger: bool,
    ident: dict[str, Any] | None = None,
    from_data: Sequence[str] = (),
    model: DictConfig | None = None,
) -> list[Callback]:
    """The callbacks the config lists (conf/callbacks), with what every training run keeps whatever
    `callbacks=` says, added where a callbacks group of the user's own leaves it out: checkpoints where
    `resume=auto` looks (unless `trainer.enable_checkpointing=false`), the non-finite guard and ExactResume,
    which is given the run's identity (`ident`, taken from the config as composed, before `accel` resolved
    it), its data node, the model's arguments from the data and the model node, for each checkpoint."""
    found = _without_bar(_group(cfg.get("callbacks"), "callbacks"), cfg)
    if "seed" in cfg:  # train (eval's keeps none of these)
        found = _with_guards(_without_idle(_with_checkpoints(found, cfg), cfg, has_logger), cfg)
        data = OmegaConf.to_container(cfg.data, resolve=False) if "data" in cfg else None
        facts = (ident or identity.of(cfg), data, list(from_data), plain_config(model) if model else None)
        for resume_ in (cb for cb in found if isinstance(cb, ExactResume)):
            resume_.identify(*facts)
    for callback in found:  # Lightning calls every hook of every callback: the empty ones are skipped
        hooks.skip_empty(callback, Callback)
    return found


def _with_guards(found: list[Callback], cfg: DictConfig) -> list[Callback]:
    """The non-finite guard and ExactResume, where the callbacks group leaves them out."""
    return found + [g for g in (NonFiniteGuard(), ExactResume(cfg.seed)) if not _has(found, type(g))]


def _without_bar(found: list[Callback], cfg: DictConfig) -> list[Callback]:
    """Less the progress bar where `trainer.enable_progress_bar=false` (Lightning refuses a bar it was told
    not to show)."""
    if cfg.trainer.get("enable_progress_bar") is False:
        return _without(found, ProgressBar, "trainer.enable_progress_bar=false: the progress bar")
    return found


def _has(found: list[Callback], kind: type) -> bool:
    return any(isinstance(cb, kind) for cb in found)


def _without_idle(found: list[Callback], cfg: DictConfig, has_logger: bool) -> list[Callback]:
    """Less what would have nothing to do in this run: an LR monitor without a logger, early stopping
    without validation."""
    if not has_logger:
        found = _without(
            found, LearningRateMonitor, "logger=none: LearningRateMonitor has nowhere to write, so it"
        )
    if cfg.trainer.get("limit_val_batches") == 0:
        found = _without(found, EarlyStopping, "trainer.limit_val_batches=0: no validation, so EarlyStopping")
    return found


def _with_checkpoints(found: list[Callback], cfg: DictConfig) -> list[Callback]:
    """A checkpoint where `resume=auto` looks, unless the run saves none (a debug run)."""
    if cfg.trainer.get("enable_checkpointing", True) is False or cfg.trainer.get("fast_dev_run"):
        return _without(found, Checkpoint)
    if any(isinstance(cb, Checkpoint) for cb in found):
        return found
    return [*found, ModelCheckpoint(dirpath=resume.checkpoint_dir(cfg), save_top_k=0, save_last=True)]


def _without(found: list[Callback], kind: type | tuple[type, ...], why: str = "") -> list[Callback]:
    """`found` less the callbacks of `kind`; `why` (what goes, and why) is said when there were some."""
    kept = [cb for cb in found if not isinstance(cb, kind)]
    if why and len(kept) < len(found):
        rank_zero_info(f"{why} is left out")
    return kept


def trainer(cfg: DictConfig) -> L.Trainer:
    """The Trainer with its loggers, callbacks and plugins, as eval builds it (training: `train.Run`)."""
    loggers_ = trainer_loggers(cfg)
    return instantiate(
        cfg.trainer,
        "trainer",
        callbacks=callbacks(cfg, bool(loggers_)),
        logger=loggers_ or False,
        plugins=plugins(cfg),
        _convert_="all",
    )


def trainer_loggers(cfg: DictConfig) -> list[Logger]:
    """The configured loggers, and in training (`curves`) the run's picture drawn from what they are given."""
    found = loggers(cfg)
    if cfg.get("curves", False):
        found.append(CurvesLogger(cfg.paths.output_dir, cfg.monitor.metric))
    return found


def plugins(cfg: DictConfig) -> list[Any]:
    """The trainer's own plugins, and checkpoints written whole or not at all."""
    return [*(cfg.trainer.get("plugins") or []), AtomicCheckpointIO()]


def plain_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain containers: what is logged and saved beside a run."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)  # type: ignore[return-value]
