"""Whether a checkpoint on disk can be used, and what a failed load of one means, in one line: read where a
checkpoint is read (a rerun that resumes, eval, a refused load), never by a run that starts fresh."""

from __future__ import annotations

import json
import pickle
import re
import traceback
from pathlib import Path
from typing import Any

import torch

from lightspeed.core.config import ConfigError, flatten
from lightspeed.resilience.checkpoint import CHECKSUM_KEY, checksum, nonfinite_weights, tensors


def problem(path: Path) -> str | None:
    """Why the checkpoint at `path` must not be trained from (unreadable, Python objects, a tensor claiming
    more elements than stored, a checksum mismatch, non-finite weights), or None. Reads the whole file."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, EOFError, RuntimeError, OSError, ValueError) as err:
        return why(err, path)
    if not isinstance(ckpt, dict):
        return "not a Lightning checkpoint"
    for name, tensor in tensors(ckpt):  # before anything reads them whole
        if (
            tensor.layout == torch.strided
            and tensor.numel() * tensor.element_size() > tensor.untyped_storage().nbytes()
        ):
            return f"its tensor {name} claims {tensor.numel()} elements, more than its file holds (crafted?)"
    stored = ckpt.get(CHECKSUM_KEY)
    if stored is not None and stored != checksum(ckpt):
        return "its tensors no longer match their checksum (corrupted on disk?)"
    return nonfinite_weights(ckpt)


def why(err: BaseException, path: Any) -> str:
    """What a failed `torch.load(..., weights_only=True)` of `path` says about the file, in a few words."""
    file = Path(path)
    if file.is_dir():  # a sharded checkpoint (sharded.py) refuses what is not plain data as pickle does
        return "holds Python objects" if isinstance(err, pickle.UnpicklingError) else "a folder, not a file"
    if not file.exists():
        return "does not exist"
    if file.stat().st_size > 0 and not _is_zip(file):
        return "not a checkpoint file"  # torch.save writes a zip archive
    if isinstance(err, pickle.UnpicklingError):
        return "holds Python objects"
    return f"empty or truncated? {type(err).__name__}"


def _is_zip(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


#: Where a checkpoint is read or restored: torch.load, Lightning's checkpoint connector and loader.
_LOADING_FILES = (
    "torch/serialization.py",
    "connectors/checkpoint_connector.py",
    "core/saving.py",
    "lightspeed/resilience/sharded.py",
    "utilities/migration/utils.py",  # Lightning reads the version a checkpoint says it was saved with
)


def from_a_load(err: BaseException) -> bool:
    """The error was raised while a checkpoint was read or restored, not by training after it (a
    truncated data file in a resumed run is not the checkpoint's fault)."""
    return any(
        f.filename.endswith(_LOADING_FILES) or f.name == "load_state_dict"
        for f in traceback.extract_tb(err.__traceback__)
    )


# radon C: one line per known load failure
def explain_load_error(err: BaseException, path: Any) -> None:
    """Raise the one ConfigError line for a checkpoint that cannot be restored, where `err` is such."""
    if isinstance(err, pickle.UnpicklingError) and why(err, path) == "holds Python objects":
        raise ConfigError(
            f"ckpt_path={path} holds Python objects, not plain data, and was not loaded (unpickling "
            "them could run code): use a checkpoint saved by Lightspeed, or re-save its tensors from a "
            "trusted copy"
        ) from None
    if why(err, path) == "not a checkpoint file":
        raise ConfigError(
            f"ckpt_path={path} is not a checkpoint file: pass a .ckpt saved by Lightning"
        ) from None
    if isinstance(err, ValueError) and "to prevent arbitrary code execution" in str(err):
        raise ConfigError(
            f"ckpt_path={path} names code to run when it loads (an instantiator or class path in its "
            "hyperparameters), which was blocked: use a checkpoint saved by Lightspeed"
        ) from None
    if isinstance(err, RuntimeError) and "Error(s) in loading state_dict" in str(err):
        raise ConfigError(
            f"ckpt_path={path} does not fit the model ({_mismatches(str(err))}): the net's code or "
            "settings changed since it was saved; use run_name=<new name> to train anew, or the code "
            "and settings that wrote it"
        ) from None
    if type(err).__name__ == "InvalidVersion":  # packaging's, a ValueError
        raise ConfigError(
            f"ckpt_path={path} says it was saved by pytorch-lightning version {str(err).split(': ', 1)[-1]}, "
            "which is no version: pass a checkpoint saved by Lightning"
        ) from None
    # torch.load's errors for an empty file and for a truncated zip archive (read whole, or memory-mapped)
    unreadable = ("PytorchStreamReader", "mmap can only be used with files saved with")
    if isinstance(err, EOFError) or (
        isinstance(err, RuntimeError) and any(u in str(err) for u in unreadable)
    ):
        raise ConfigError(
            f"ckpt_path={path} is not a readable checkpoint (empty or truncated? {type(err).__name__}): "
            "pass another one, e.g. the run's other .ckpt file"
        ) from None


def _mismatches(message: str, most: int = 3) -> str:
    """`load_state_dict`'s error, shortened to the tensors it names."""
    found: list[str] = []
    for line in message.splitlines()[1:]:
        line = line.strip()
        size = re.match(
            r"size mismatch for (\S+): copying a param with shape (.+) from checkpoint, "
            r"the shape in current model is (.+)\.$",
            line,
        )
        if size:
            found.append(f"{size[1]}: {_shape(size[2])} saved, {_shape(size[3])} now")
        elif line.startswith(("Missing key(s)", "Unexpected key(s)")):
            kind = "missing" if line.startswith("Missing") else "unexpected"
            found += [f"{name} {kind}" for name in re.findall(r'"([^"]+)"', line)]
    return describe(found, most) if found else message.splitlines()[0]


def _shape(text: str) -> str:
    return "[" + ", ".join(re.findall(r"\d+", text)) + "]"


def differences(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: stored -> current` for every leaf that differs, sorted by key."""
    a, b = flatten(stored), flatten(current)
    missing = object()
    return [
        f"{key}: {_show(a.get(key, missing))} -> {_show(b.get(key, missing))}"
        for key in sorted(a.keys() | b.keys())
        if a.get(key, missing) != b.get(key, missing)
    ]


def describe(diffs: list[str], most: int = 3) -> str:
    more = f" and {len(diffs) - most} more" if len(diffs) > most else ""
    return "; ".join(diffs[:most]) + more


def _show(value: Any) -> str:
    return "(absent)" if type(value) is object else json.dumps(value, default=str)
