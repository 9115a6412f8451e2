"""Per-batch hooks that do nothing are taken off Lightning's hot path.

Lightning 2.6 calls each callback for each of ~6 hooks every training step, in a profiler context with a
formatted name, implemented or not: ~60 calls and ~100 us a step on a CPU with the default callbacks. Its
dispatcher skips a hook that is not callable (`_call_callback_hooks` in trainer/call.py), so an engine
callback's hook that is the base class's empty one is set to None on the instance; user code is left alone."""

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
    """Set the hooks in `names` that `obj` inherits unchanged from `base` to None; returns their names. One
    that a class up to `base` overrides, or one already set on the instance, is left alone."""
    skipped = [n for n in names if n not in vars(obj) and getattr(type(obj), n, None) is getattr(base, n)]
    switch_off(obj, tuple(skipped))
    return skipped


def switch_off(obj: Any, names: tuple[str, ...]) -> None:
    """Take the hooks in `names` off Lightning's hot path for this instance (it skips a hook set to None)."""
    for name in names:
        setattr(obj, name, None)
