"""The engine's parts of every training run, registered with Lightning as one callback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L

#: Every hook of a Lightning callback.
HOOKS = tuple(name for name in vars(L.Callback) if name.startswith("on_") or name in ("setup", "teardown"))


class RunGuard(L.Callback):
    """What every training run gets whatever `callbacks=` says (docs/engine.md): its parts, each a callback
    that works alone, run in the order given (the monitor is checked before EarlyStopping reads it; a
    non-finite loss stops the run before preemption would save its weights), each hook dispatched once. A
    part saves into the checkpoint itself: a `state_dict` would be saved under this callback's name."""

    def __init__(self, *parts: L.Callback) -> None:
        self.parts = parts
        for part in parts:
            if _implements(part, "state_dict"):
                raise TypeError(f"{type(part).__name__} has a state_dict: save into the checkpoint instead")
        for name in HOOKS:
            calls = [getattr(part, name) for part in parts if _implements(part, name)]
            if calls:
                setattr(self, name, calls[0] if len(calls) == 1 else _Chain(calls))


def _implements(part: L.Callback, name: str) -> bool:
    """`part` does something in hook `name`: a method of its own (not set to None on the instance)."""
    if name in vars(part):
        return vars(part)[name] is not None
    return getattr(type(part), name) is not getattr(L.Callback, name)


class _Chain:
    """The parts' own methods for one hook, called in order (a class, not a closure: it pickles, for
    strategies that send the trainer to their processes)."""

    def __init__(self, calls: list[Callable[..., Any]]) -> None:
        self.calls = calls

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        for call in self.calls:
            call(*args, **kwargs)
