"""Per-batch hooks that do nothing are taken off Lightning's hot path.

Lightning 2.6 calls each callback for each of ~6 hooks on every training step, each call in a profiler
context with a formatted name, whether or not the hook is implemented: with the default callbacks that is
~60 calls and ~100 us a step on a CPU. Its dispatcher skips a hook that is not callable
(`_call_callback_hooks` in trainer/call.py), so one of the engine's callbacks whose hook is the base
class's empty one gets that hook set to None on the instance. The user's LightningModule and their own
callbacks are left as written.
"""

from __future__ import annotations

from typing import Any

# Hooks that Lightning calls once per batch, through the callable check above, and whose base
# implementations (Callback's) are empty.
TRAINING = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
)
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
