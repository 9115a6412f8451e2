"""The nets a model can use. By short name: a file in this folder that decorates its class with
`@register("name")` is found automatically; `model.net.name=<name>` selects it. Each registered net takes
`input_shape` and `num_outputs` (classes for a classifier, targets for a regressor) and says which input
shapes it is built for in a class attribute, `example_input_shapes` (e.g. `((1, 40),)` for one channel of
40 samples): the tests build and run every registered net on each of them.

Or any `nn.Module` class, or function making one, by import path, as Hydra names it:
`model.net._target_=mypackage.MyNet` or `timm.create_model` (its own keyword arguments beside it), yours or
a library's, with no wrapper file. Either way the net gets what the model passes from the data
(`input_shape`, `num_outputs`, `vocab_size`, ...) where its constructor names them. A checkpoint names its
net: `make eval` lets a checkpoint name only classes that conf/ names (`run.restore.check_data_targets`).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from lightspeed.core.config import ConfigError

NETS: dict[str, type[nn.Module]] = {}


def register(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """A class decorator: the net is `model.net.name=<name>` (one class a name)."""

    def add(cls: type[nn.Module]) -> type[nn.Module]:
        if NETS.setdefault(name, cls) is not cls:
            raise ValueError(
                f"two nets are registered as {name!r}: {NETS[name].__qualname__} and {cls.__qualname__}"
            )
        return cls

    return add


def _discover(name: Any = None) -> None:
    """Import the file of this folder named `name` (where a net is registered under its file's name), else
    every file: a run imports only the net it uses."""
    files = [info.name for info in pkgutil.iter_modules(__path__)]
    if isinstance(name, str) and name in files:
        importlib.import_module(f"{__name__}.{name}")
    if not isinstance(name, str) or name not in NETS:  # registered under another name, or unknown: every file
        for file in files:
            importlib.import_module(f"{__name__}.{file}")


def find(name: Any) -> type[nn.Module] | None:
    """The net registered as `name`, or None."""
    _discover(name)
    return NETS.get(name) if isinstance(name, str) else None


def build_net(spec: dict[str, Any], **given: Any) -> nn.Module:
    """`spec` is the `net:` block of `conf/model/*.yaml`: `{"name": ..., **kwargs}` for a registered net,
    or `{"_target_": ..., **kwargs}` for any nn.Module class or function making one (`timm.create_model`).
    `given`: what the model knows from the data, passed where the constructor takes it by name (a key set
    in `spec` wins)."""
    if isinstance(spec, nn.Module):  # built by Hydra already (a yaml without `_recursive_: false`)
        return spec
    if not isinstance(spec, Mapping) or "_target_" in spec or find(spec.get("name")) is None:
        from lightspeed.models.net_target import build_other  # by import path, or the line refusing it

        return build_other(spec, given)
    kwargs = dict(spec)
    name = kwargs.pop("name")
    offered = takes(NETS[name], given)
    try:
        return NETS[name](**offered, **kwargs)
    except TypeError as err:
        raise ConfigError(f"model.net ({name}): {err}") from None


def widths(key: str, value: Any, example: str) -> list[int]:
    """A shipped net's layer widths (`model.net.<key>`): a non-empty list of integers >= 1, else one line.
    The net's own rule, where it is built: a net of yours may give the key another meaning."""
    ok = isinstance(value, (list, tuple)) and len(value) > 0
    if not ok or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise ConfigError(
            f"model.net.{key}={value!r} is invalid: use a non-empty list of integers >= 1, e.g. {example}"
        )
    return list(value)


def takes(fn: Callable[..., Any], offered: dict[str, Any], through_kwargs: bool = True) -> dict[str, Any]:
    """The entries of `offered` that `fn` (a class or a function) accepts as keyword arguments: by name, or
    all of them where it has **kwargs and `through_kwargs` (not for a factory, which passes them on)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): offer nothing
        return {}
    if through_kwargs and any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(offered)
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {k: v for k, v in offered.items() if k in params and params[k].kind in keyword}
