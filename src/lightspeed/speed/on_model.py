"""The accel knobs that change the module itself: its weights and the forward's inputs in channels_last,
its forward compiled. Loaded only where one of them is on."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from omegaconf import DictConfig

from lightspeed.core.config import first_line


def apply(model: L.LightningModule, channels_last: bool, compile_: DictConfig | None, device: str) -> None:
    """channels_last (weights, and a pre-hook for the inputs), then torch.compile of the forward as the
    `accel` node `compile_` says (None: not compiled)."""
    if compile_ is not None:
        model.example_input_array = None  # the summary's batch of 2 would compile a second, dynamic graph
    if channels_last:
        model.to(memory_format=torch.channels_last)
        model.register_forward_pre_hook(inputs_channels_last, with_kwargs=True)
    if compile_ is None:
        return
    backend = str(compile_.get("compile_backend", "inductor"))
    problem = compile_problem(backend, device)
    if problem:
        rank_zero_warn(
            f"accel.compile=true: torch.compile's {backend} backend fails here ({problem}); "
            "training uncompiled"
        )
        return
    # The module's forward, compiled on the instance: the state dict keeps its keys (no `_orig_mod.`
    # prefix), so checkpoints load into compiled and uncompiled models alike; and the steps around it
    # stay eager (under DDP Lightning calls the whole module, step, self.log and metric updates
    # included, whose changing values would recompile every step).
    mode = None if compile_.get("compile_mode", "default") == "default" else compile_.compile_mode
    model.forward = torch.compile(model.forward, mode=mode, backend=backend)


def inputs_channels_last(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A forward pre-hook: 4-D tensor arguments in channels_last (those already so pass unchanged)."""

    def convert(a: Any) -> Any:
        four_d = isinstance(a, torch.Tensor) and a.dim() == 4
        return a.contiguous(memory_format=torch.channels_last) if four_d else a

    return tuple(convert(a) for a in args), {k: convert(v) for k, v in kwargs.items()}


def compile_problem(backend: str, device: str) -> str | None:
    """Compile and run a two-op function: a missing compiler or Triton shows up here, in seconds,
    rather than at the first training step. Returns the error's first line, or None."""
    target = "cuda" if device == "cuda" else "cpu"
    try:
        fn = torch.compile(lambda x: torch.relu(x) * 2, backend=backend)
        fn(torch.ones(8, device=target))
    except Exception as err:  # any failure means: do not compile
        return first_line(err)[:200]
    return None
