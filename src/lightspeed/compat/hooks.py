"""Per-batch hooks that do nothing are taken off Lightning's hot path.

Lightning 2.6 calls each callback, and the LightningModule, for each of ~6 hooks on every training
step, each call in a profiler context with a formatted name, whether or not the hook is implemented:
with the default callbacks that is ~60 calls and ~100 us a step on a CPU. Its dispatchers skip a hook
that is not callable (`_call_callback_hooks`, `_call_lightning_module_hook` in trainer/call.py), so an
instance whose hook is the base class's empty one gets that hook set to None on the instance.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

# Hooks that Lightning calls once per batch, through the callable check above, and whose base
# implementations (Callback, ModelHooks) are empty.
TRAINING = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
)
# Lightning reads the signatures of a LightningModule's own evaluation batch hooks (dataloader_idx), so
# on a module only the training ones are taken off.
EVALUATION = (
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)


def skip_empty(obj: Any, base: type, names: tuple[str, ...] = TRAINING + EVALUATION) -> list[str]:
    """Set the hooks in `names` that `obj` inherits unchanged from `base` to None; returns their names.

    A hook that the class (or any class between it and `base`) overrides is left alone, as is one
    already set on the instance.
    """
    skipped = []
    for name in names:
        if name not in vars(obj) and getattr(type(obj), name, None) is getattr(base, name):
            setattr(obj, name, None)
            skipped.append(name)
    return skipped


def switch_off(obj: Any, names: tuple[str, ...]) -> None:
    """Take the hooks in `names` off Lightning's hot path for this instance (it skips a hook set to None)."""
    for name in names:
        setattr(obj, name, None)


def speed_up_module(module: L.LightningModule) -> list[str]:
    """A LightningModule's per-step hook overhead, cut without touching its code: `skip_empty` for its
    training hooks (see EVALUATION), and `CheapHookNames` mixed into its class (the instance becomes one
    of a subclass of the same name, made once per class). Returns the hooks taken off."""
    cls = type(module)
    # a class of the user's with a __setattr__ of its own keeps it: the shortcut would bypass it
    own_setattr = any("__setattr__" in vars(c) for c in cls.__mro__[: cls.__mro__.index(torch.nn.Module)])
    if not issubclass(cls, CheapHookNames) and not own_setattr:
        if cls not in _CHEAP:
            names = {
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
                "__reduce_ex__": _as_base,
            }
            _CHEAP[cls] = type(cls.__name__, (CheapHookNames, cls), names)
        module.__class__ = _CHEAP[cls]
    return skip_empty(module, L.LightningModule, TRAINING)


def _as_base(self: Any, protocol: Any) -> Any:
    """Pickled (and deep-copied) as an instance of the user's own class, which pickle can find by name."""
    return _new, (type(self).__bases__[1],), self.__getstate__()


def _new(cls: type) -> Any:
    return cls.__new__(cls)


class CheapHookNames:
    """Sets Lightning's hook name on the module without `nn.Module.__setattr__`.

    Lightning names the running hook on the LightningModule (`_current_fx_name`, for `self.log`) before
    and after each module, callback and strategy hook it calls (trainer/call.py): ~28 sets a training step
    with the default callbacks, each through `nn.Module.__setattr__`, which checks the value against
    parameters, buffers and submodules (~2.5 us on this CPU). A name (a string, or None) is none of those,
    so it goes straight into the instance's dict, where `nn.Module` would put it too. Every other
    attribute, and any other value, takes `nn.Module`'s path as before.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_current_fx_name" and (value is None or type(value) is str):
            self.__dict__[name] = value
            return
        super().__setattr__(name, value)


_CHEAP: dict[type, type] = {}  # a module class -> its subclass with CheapHookNames first
