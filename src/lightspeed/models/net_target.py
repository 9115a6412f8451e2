"""`model.net` by import path (`_target_`: any nn.Module class, or function making one, as Hydra names it),
and the line refusing a `model.net` that names no net: loaded only for those (`nets.build_net`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from lightspeed.core.config import ConfigError, locate
from lightspeed.models import nets


def build_other(spec: Any, given: dict[str, Any]) -> nn.Module:
    """The net `spec` names by `_target_`, given what it takes of `given`; else one line saying why `spec`
    names no net."""
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"model.net={spec!r} is no mapping: give it name: <a net> (or _target_) and its settings"
        )
    kwargs = dict(spec)
    if "_target_" not in kwargs:
        nets._discover()  # registered under another name than its file's, or unknown
        known = ", ".join(sorted(nets.NETS))
        raise ConfigError(
            f"model.net.name={kwargs.get('name')!r} is not a known net: use one of {known}, or "
            "model.net._target_=<an nn.Module class or a function making one>"
        )
    target = kwargs.pop("_target_")
    try:
        cls = locate(str(target))
    except (ImportError, ValueError, AttributeError) as err:
        raise ConfigError(f"model.net._target_={target} cannot be imported ({err})") from None
    # a function's **kwargs go on to a constructor (timm's): it gets what it names, a class all it takes
    offered = nets.takes(cls, given, through_kwargs=isinstance(cls, type))
    try:
        net = cls(**offered, **kwargs)
    except TypeError as err:
        raise ConfigError(f"model.net ({target}): {err}") from None
    if not isinstance(net, nn.Module):  # a net, not whatever else the callable makes
        raise ConfigError(
            f"model.net._target_={target} made a {type(net).__name__}, not an nn.Module: name a net's class "
            "or a function making one (timm.create_model)"
        )
    return net
