"""Checkpoints that are never half-written and never run code when loaded."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lightspeed.core.config import ConfigError
from lightspeed.core.failures import TrainingFailure


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write `<name>.tmp` beside the target, fsync it, `os.replace` it into place, fsync the folder.

    At every moment the target path holds either the previous complete checkpoint or the new one.
    Lightning 2.6's own writer makes its temporary file under $TMPDIR and moves it: across file
    systems that move is a copy, and a SIGKILL during it left a 0-byte last.ckpt.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if "://" in str(path) or storage_options is not None:  # remote (fsspec) paths: Lightning's writer
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        _refuse_non_finite(checkpoint, path)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(target.parent)


def _refuse_non_finite(checkpoint: dict[str, Any], path: Any) -> None:
    """The last line of defence (callbacks.nonfinite stops runs earlier): never write NaN or inf weights
    over a good checkpoint, whatever saved them."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in (checkpoint.get("state_dict") or {}).values():
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            by_device.setdefault(tensor.device, []).append(torch.isfinite(tensor).all())
    if not all(bool(torch.stack(flags).all()) for flags in by_device.values()):
        raise TrainingFailure(
            f"the weights to be saved in {path} are not finite (step {checkpoint.get('global_step')}): "
            "not written, the previous checkpoint is intact; try a lower model.optimizer.lr or "
            "trainer.gradient_clip_val=1.0"
        )


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def loading(path: Any) -> Iterator[None]:
    """Around any checkpoint load: a refused pickle payload, or an empty or truncated file, becomes one
    ConfigError line naming `ckpt_path`; every other error passes through unchanged."""
    try:
        yield
    except pickle.UnpicklingError:
        raise ConfigError(
            f"ckpt_path={path} holds Python objects, not plain data, and was not loaded (unpickling "
            "them could run code): use a checkpoint saved by Lightspeed, or re-save its tensors from a "
            "trusted copy"
        ) from None
    except (EOFError, RuntimeError) as err:
        # torch.load's errors for an empty file and for a truncated zip archive
        if isinstance(err, RuntimeError) and "PytorchStreamReader" not in str(err):
            raise
        raise ConfigError(
            f"ckpt_path={path} is not a readable checkpoint (empty or truncated? {type(err).__name__}): "
            "pass another one, e.g. the run's other .ckpt file"
        ) from None
