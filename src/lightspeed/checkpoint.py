"""Checkpoints that are never half-written and never run code when loaded."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lightspeed.config import ConfigError


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write `<name>.tmp` beside the target, fsync it, `os.replace` it into place, fsync the folder.

    At every moment the target path holds either the previous complete checkpoint or the new one.
    Lightning 2.6's own writer makes its temporary file under $TMPDIR and moves it: across file
    systems that move is a copy, and a SIGKILL during it left a 0-byte last.ckpt.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO.save_checkpoint takes no storage_options")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)  # serialise first: a failure here leaves no file at all
        tmp = target.with_name(target.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(buffer.getbuffer())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(target.parent)


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


def explain_unsafe(path: Any, err: Exception) -> ConfigError:
    """The one-line error for a checkpoint that `weights_only` loading refused."""
    return ConfigError(
        f"ckpt_path={path} holds Python objects, not plain data, and was not loaded (unpickling them could "
        f"run code): use a checkpoint saved by Lightspeed, or re-save its tensors from a trusted copy "
        f"({type(err).__name__})"
    )


UNSAFE_LOAD_ERRORS = (pickle.UnpicklingError,)
