"""The nets a model can use, by name: a file in this folder that decorates its class with
`@register("name")` is found automatically; `model.net.name=<name>` selects it. Each net says which
input shapes it is built for in a class attribute, `example_input_shapes` (e.g. `((1, 40),)` for one
channel of 40 samples): the tests build and run every registered net on each of them.

Nets are built from a name and plain keyword arguments, never from a `_target_` import path, so that
loading a checkpoint (whose hyperparameters name the net) cannot import or run arbitrary code.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from typing import Any

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


def build_net(spec: dict[str, Any], input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """`spec` is `{"name": ..., **kwargs}` as in `conf/model/*.yaml`'s `net:` block."""
    _discover()
    kwargs = dict(spec)
    name = kwargs.pop("name", None)
    if name not in NETS:
        raise ConfigError(f"model.net.name={name!r} is not a known net: use one of {', '.join(sorted(NETS))}")
    try:
        return NETS[name](input_shape=tuple(input_shape), num_classes=num_classes, **kwargs)
    except TypeError as err:
        raise ConfigError(f"model.net ({name}): {err}") from None
