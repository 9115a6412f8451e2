"""The nets a model can use. By short name: a file in this folder that decorates its class with
`@register("name")` is found automatically; `model.net.name=<name>` selects it. Each registered net takes
`input_shape` and `num_outputs` (classes for a classifier, targets for a regressor) and says which input
shapes it is built for in a class attribute, `example_input_shapes` (e.g. `((1, 40),)` for one channel of
40 samples): the tests build and run every registered net on each of them.

Or any `nn.Module` class by import path, as Hydra names it: `model.net._target_=mypackage.MyNet` (its
own keyword arguments beside it), yours or a library's, with no wrapper file. Either way the net gets what
the model passes from the data (`input_shape`, `num_outputs`, `vocab_size`, ...) where its constructor
takes them. It must be an nn.Module class. A checkpoint's hyperparameters name its net: `make eval` lets
a checkpoint name only classes that conf/ names (`lightspeed.core.config.check_data_targets`).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from hydra.utils import get_object
from torch import nn

from lightspeed.core.config import ConfigError

NETS: dict[str, type[nn.Module]] = {}


def register(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    def add(cls: type[nn.Module]) -> type[nn.Module]:
        if name in NETS and NETS[name] is not cls:
            raise ValueError(
                f"two nets are registered as {name!r}: {NETS[name].__qualname__} and {cls.__qualname__}"
            )
        NETS[name] = cls
        return cls

    return add


def _discover() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def find(name: Any) -> type[nn.Module] | None:
    """The net registered as `name`, or None."""
    _discover()
    return NETS.get(name) if isinstance(name, str) else None


def build_net(spec: dict[str, Any], **given: Any) -> nn.Module:
    """`spec` is the `net:` block of `conf/model/*.yaml`: `{"name": ..., **kwargs}` for a registered net,
    or `{"_target_": ..., **kwargs}` for any nn.Module class. `given`: what the model knows from the data,
    passed where the constructor takes it (a key set in `spec` wins)."""
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"model.net={spec!r} is no mapping: give it name: <a net> (or _target_) and its settings"
        )
    kwargs = dict(spec)
    if "_target_" in kwargs:
        target = kwargs.pop("_target_")
        try:
            cls = get_object(str(target))
        except (ImportError, ValueError, AttributeError) as err:
            raise ConfigError(f"model.net._target_={target} cannot be imported ({err})") from None
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):  # a net, not any callable it names
            raise ConfigError(f"model.net._target_={target} is not an nn.Module class: name a net's class")
        name = str(target)
    else:
        _discover()
        name = kwargs.pop("name", None)
        if name not in NETS:
            known = ", ".join(sorted(NETS))
            raise ConfigError(
                f"model.net.name={name!r} is not a known net: use one of {known}, or model.net._target_="
                "<an nn.Module class>"
            )
        cls = NETS[name]
    try:
        return cls(**takes(cls, given), **kwargs)
    except TypeError as err:
        raise ConfigError(f"model.net ({name}): {err}") from None


def takes(fn: Callable[..., Any], offered: dict[str, Any]) -> dict[str, Any]:
    """The entries of `offered` that `fn` (a class or a function) accepts as keyword arguments."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): offer nothing
        return {}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(offered)
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {k: v for k, v in offered.items() if k in params and params[k].kind in keyword}
