"""The paths a ModelCheckpoint's saved state names, made this run folder's: loaded only when one is restored
(`lightspeed.compat.callbacks.ModelCheckpoint.load_state_dict`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def here(state: dict[str, Any], dirpath: str | None) -> dict[str, Any]:
    """`state` with its paths moved into `dirpath` when the run folder was moved or copied, less those that
    lie outside it."""
    return _inside(_moved(state, dirpath), dirpath)


def _moved(state: dict[str, Any], dirpath: str | None) -> dict[str, Any]:
    """`state` with every path under its saved `dirpath` moved under `dirpath`, when the files are there
    (the folder was moved or copied)."""
    old = state.get("dirpath")
    if not old or not dirpath or Path(old) == Path(dirpath):
        return state

    def here(path: Any) -> Any:
        if not isinstance(path, str) or not path:
            return path
        try:
            return str(Path(dirpath) / Path(path).relative_to(old))
        except ValueError:  # not a file of the run's folder: left as it was
            return path

    found = [here(state.get(k)) for k in ("best_model_path", "last_model_path")]
    if not any(isinstance(f, str) and f and Path(f).exists() for f in found):  # a file, or a sharded folder
        return state  # not this folder's files (a new run fine-tuning from another's): Lightning's rules
    return _with_paths(dict(state, dirpath=dirpath), here)


def _with_paths(state: dict[str, Any], change: Any) -> dict[str, Any]:
    """`state` with `change` applied to each path it names (its best, k-th best and last, the top k's)."""
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in state:
            state[key] = change(state[key])
    if isinstance(state.get("best_k_models"), dict):
        state["best_k_models"] = {change(k): v for k, v in state["best_k_models"].items()}
    return state


def _inside(state: dict[str, Any], dirpath: str | None) -> dict[str, Any]:
    """`state` minus the paths outside `dirpath` once resolved: Lightning would delete a "previous best" or
    "last" that a checkpoint (data) names, judging by the path's text alone (`<dir>/../../x` passes)."""
    if not dirpath:
        return state
    root = Path(dirpath).resolve()

    def ours(path: Any) -> bool:
        return isinstance(path, str) and bool(path) and Path(path).resolve().is_relative_to(root)

    state = dict(state)
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in state and state[key] and not ours(state[key]):
            state[key] = ""
    if isinstance(state.get("best_k_models"), dict):
        state["best_k_models"] = {k: v for k, v in state["best_k_models"].items() if ours(k)}
    return state
