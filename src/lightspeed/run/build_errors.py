"""What a constructor, Lightning's Trainer or a model's shapes refuse, in one line naming the key and the
fix: imported only when something is refused (`build.instantiate`, `build.check_model`), so a run whose
objects build never loads it."""

from __future__ import annotations

import os
import re
import traceback
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate as _instantiate
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, OmegaConf

from lightspeed import CONF_DIR
from lightspeed.core.config import ConfigError, first_line
from lightspeed.models import nets
from lightspeed.run.build import check_inputs_fit, model_node, short

#: What a TypeError says when a config's keys do not fit a constructor's arguments.
_BINDING = re.compile(
    r"unexpected keyword argument|invalid keyword argument|missing \d+ required|takes \d+ positional"
    r"|got multiple values"
)


def refused_setting(err: Exception, node: Any, where: str) -> ConfigError | None:
    """What Hydra's InstantiationException means: a ConfigError raised inside (ours, as it is), or the line
    for a constructor that refused its settings or for Hydra that refused the node (no constructor ran);
    None for an error of the code itself."""
    cause = err.__cause__
    while cause is not None and not isinstance(cause, ConfigError) and cause.__cause__ is not None:
        cause = cause.__cause__
    if isinstance(cause, ConfigError):
        return cause
    line = _setting_line(err, cause, node, where)
    return None if line is None else ConfigError(line)


def _setting_line(err: Exception, cause: BaseException | None, node: Any, where: str) -> str | None:
    if cause is None:
        return f"{where}: {first_line(err).rstrip('.')}"
    first = first_line(cause).rstrip(".")
    if isinstance(cause, TypeError) and _BINDING.search(str(cause)):  # keys the constructor does not take
        return f"{where}: {first} (a setting under {where} is invalid)"
    return _refusal(cause, first, node, where)


def _refusal(cause: BaseException, first: str, node: Any, where: str) -> str | None:
    """Lightning's or a class's own check, reworded here where it is raised: the key its line names (or
    whose value it quotes); where it names none, the node, for what Lightning's Trainer raises from its own
    code and a MisconfigurationException; else None (a bug: its traceback)."""
    if not isinstance(cause, (ValueError, TypeError, RuntimeError, MisconfigurationException, ImportError)):
        return None
    said = " ".join(str(cause).split())
    if where == "trainer" and re.search(r"requested \w+: .* only has", said):  # more GPUs than visible
        return f"trainer.devices={short(node.get('devices'))}: {said}: use at most the devices it has"
    key = _key_named(first, node)
    if key is not None:
        return f"{where}.{key}={short(node.get(key))}: {first}: {_fix(where, key, node)}"
    lightning = where == "trainer" and _raised_in_lightning(cause)
    if isinstance(cause, (MisconfigurationException, ImportError)) or lightning:
        return f"{where}: {first} (a setting under {where} is invalid)"
    return None


def _raised_in_lightning(err: BaseException) -> bool:
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and f"{os.sep}lightning{os.sep}" in frames[-1].filename


def _key_named(line: str, node: Any) -> str | None:
    """The key of `node` that a refusal names first (`strategy='x'`, "Precision 15 is invalid"), else the
    one whose value it quotes ("No supported gpu backend"); None where it names none."""
    keys = [str(k) for k in node if not str(k).startswith("_")] if OmegaConf.is_dict(node) else []
    named = sorted((m.start(), k) for k in keys if (m := _in_line(k, line)))
    quoted = [k for k in keys if _in_line(node.get(k), line)]
    return next(iter([k for _, k in named] + quoted), None)


def _in_line(word: Any, line: str) -> re.Match[str] | None:
    """Where `word`, a string of 2 characters or more, stands as a word of `line` (any case)."""
    if not isinstance(word, str) or len(word) < 2:
        return None
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])", line, re.IGNORECASE)


def _fix(where: str, key: str, node: Any) -> str:
    """What to do about a refused key: for a GPU that torch does not see, how to get one or run without."""
    asked_gpu = where == "trainer" and str(node.get("accelerator")) in ("gpu", "cuda")
    if asked_gpu and key in ("accelerator", "devices") and not torch.cuda.is_available():
        return (
            f"torch sees no CUDA GPU (torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}): "
            "check `nvidia-smi` and install a CUDA build of torch, or train on the CPU with trainer=cpu"
        )
    return f"change {where}.{key}"


def unfit(
    names: list[str], cfg: DictConfig, dm: L.LightningDataModule, given: dict[str, Any], target: Any
) -> str:
    """A model constructor needing `names`, which the data does not give, in one line naming both."""
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    model_, data_ = _named(choices, "model", target), _named(choices, "data", type(dm))
    said = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
    return (
        f"{model_} is built from {said}, which {data_} does not give ({_data_gives(dm, given)}): choose a "
        f"model for this data ({_other_models(given, choices)}), or have your DataModule's model_args() "
        f"return {'them' if len(names) > 1 else 'it'}"
    )


def _data_gives(dm: L.LightningDataModule, given: dict[str, Any]) -> str:
    if given or hasattr(dm, "model_args"):
        return f"its model_args() gives {', '.join(given) or 'none'}"
    return "it has no model_args()"


def _other_models(given: dict[str, Any], choices: dict[str, Any]) -> str:
    """`model=<option>` for each other option of conf/model/ built from what the data gives."""
    return (
        ", ".join(f"model={m}" for m in _models_built_from(given) if m != choices.get("model")) or "model=..."
    )


def _models_built_from(given: dict[str, Any]) -> list[str]:
    """The options of conf/model/ whose model is built from `given` and takes the data's inputs: built and
    run on the meta device (no memory), as `check_inputs_fit` does before training."""
    fit = []
    for path in sorted((CONF_DIR / "model").glob("*.yaml")):
        cfg = OmegaConf.create({"model": OmegaConf.load(path)})
        try:
            node = model_node(cfg, given)  # the data's arguments where the yaml sets none
            with torch.device("meta"):
                _instantiate(node, _convert_="all")
            check_inputs_fit(node, given)
        except Exception:  # not for this data, or not on the meta device: not named
            continue
        fit.append(path.stem)
    return fit


def _named(choices: dict[str, Any], group: str, cls: Any) -> str:
    """`model=cnn (Classifier)`, or `model Classifier` where the group's option is not a file of conf/."""
    name = getattr(cls, "__name__", str(cls))
    return f"{group}={choices[group]} ({name})" if choices.get(group) else f"{group} {name}"


#: What torch says when a tensor's shape does not fit a layer.
_SHAPE_ERROR = re.compile(r"shape|size|dim|[Ee]xpected .*input", re.IGNORECASE)


def refuse_declared(err: Exception, node: DictConfig, shape: list[int] | None) -> None:
    """A registered net that could not be built for the data's `input_shape` (`err`) and declares shapes of
    another rank (`example_input_shapes`): one line naming both."""
    if isinstance(err.__cause__, TypeError) and _BINDING.search(str(err.__cause__)):
        return  # not built from what the data gives: building it for real says so (`_unfit`)
    net = OmegaConf.select(node, "net.name", default=None)
    declared = getattr(nets.find(net), "example_input_shapes", None)
    if shape is not None and declared and all(len(d) != len(shape) for d in declared):
        _refuse(shape, f"model.net {net} is built for inputs like {', '.join(map(str, declared))}")


def refuse_shape(err: Exception, shape: list[int]) -> None:
    """A forward pass of the model's example input that failed for its shape (not for an op the meta device
    lacks: training will tell): one line naming the model and the data."""
    first = first_line(err)
    if isinstance(err, RuntimeError) and _SHAPE_ERROR.search(first):
        _refuse(shape, first)


def _refuse(shape: list[int], why: str) -> None:
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    model, data = choices.get("model", "the model"), choices.get("data", "the data")
    raise ConfigError(
        f"model={model} cannot take the inputs of data={data} (shape {shape}): {why}; choose a model "
        "for this data (model=...), or a net that takes its input_shape"
    ) from None


def no_target(node: Any, group: str, kind: str) -> str:
    """The line for a group whose settings name no class to build (`build._node`)."""
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    option = f" ({group}={choices[group]})" if choices.get(group) else ""
    shape = "a list" if OmegaConf.is_list(node) else "nothing" if node is None else repr(node)[:40]
    got = "a mapping without one" if OmegaConf.is_dict(node) else shape
    return (
        f"{group}{option} names no {kind} to build in _target_ ({got}): its yaml must be a mapping with "
        f"_target_: <module.Class>, as conf/{group}/*.yaml are"
    )
