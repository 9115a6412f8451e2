"""RunGuard: the engine's parts of a run, one callback to Lightning, each part's hooks in the given order."""

from __future__ import annotations

import pickle
from typing import Any

import lightning as L
import pytest
from lightning.pytorch.callbacks import Callback

from lightspeed.compat.hooks import skip_empty
from lightspeed.resilience.guard import RunGuard
from lightspeed.resilience.nonfinite import NonFiniteGuard


class Part(L.Callback):
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.calls.append(f"{self.name}.on_train_start")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        self.calls.append(f"{self.name}.on_train_batch_end")


class Other(Part):
    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        raise AssertionError("switched off: never called")

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.calls.append(f"{self.name}.on_fit_end")


def test_each_hook_calls_the_parts_that_implement_it_in_order_and_nothing_else() -> None:
    calls: list[str] = []
    other = Other("b", calls)
    other.on_train_batch_end = None  # as NonFiniteGuard switches off the hooks its action does not need
    guard = RunGuard(Part("a", calls), other, Part("c", calls))
    guard.on_train_start(None, None)
    guard.on_train_batch_end(None, None, None, None, 0)
    guard.on_fit_end(None, None)
    assert calls == [
        "a.on_train_start",
        "b.on_train_start",
        "c.on_train_start",
        "a.on_train_batch_end",
        "c.on_train_batch_end",
        "b.on_fit_end",
    ]
    # a per-batch hook that no part implements is left as Callback's, so that the engine takes it off
    # Lightning's path like any of its callbacks' empty hooks
    assert "on_before_backward" in skip_empty(guard, Callback)
    assert "on_train_batch_end" not in skip_empty(guard, Callback)


def test_the_guard_pickles_with_its_parts() -> None:
    """Strategies that start their processes by spawning send the trainer, callbacks included."""
    guard = pickle.loads(pickle.dumps(RunGuard(Part("a", []), Part("b", []), NonFiniteGuard())))
    guard.on_train_start(None, None)
    assert guard.parts[0].calls == ["a.on_train_start"] and guard.parts[1].calls == ["b.on_train_start"]


def test_a_part_with_callback_state_is_refused() -> None:
    """Lightning would save it under RunGuard's name; a part saves into the checkpoint itself."""

    class Stateful(L.Callback):
        def state_dict(self) -> dict[str, Any]:
            return {"n": 1}

    with pytest.raises(TypeError, match="Stateful has a state_dict"):
        RunGuard(Stateful())
