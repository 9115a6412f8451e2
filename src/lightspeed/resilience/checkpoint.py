"""Checkpoints that are never half-written, never run code when loaded, and say when their bytes changed.

Each holds a checksum of its tensors (torch does not check its archive's CRCs): inside the file, not beside
it, so that no crash between two writes can make a good checkpoint look corrupt.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lightspeed.core.failures import TrainingFailure
from lightspeed.resilience.rank_seed import KEY as RANK_RNG_KEY


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write a temporary file beside the target (one name per write: two writers never share one), fsync it,
    `os.replace` it into place, fsync the folder: the target always holds the previous complete checkpoint or
    the new one. Lightning 2.6's writer moves its file from $TMPDIR: across file systems that move is a copy,
    and a SIGKILL during it left a 0-byte last.ckpt."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if "://" in str(path) or storage_options is not None:  # remote (fsspec) paths: Lightning's writer
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if nonfinite_weights(checkpoint):  # the last line of defence (callbacks.nonfinite stops runs earlier)
            from lightspeed.resilience.incidents import not_written

            raise not_written(checkpoint, path)
        checkpoint[CHECKSUM_KEY] = checksum(checkpoint)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary(target)
        try:
            save_synced(checkpoint, tmp)
            os.replace(tmp, target)
        except (OSError, RuntimeError) as err:
            from lightspeed.resilience.incidents import out_of_space

            if (failure := out_of_space(err, checkpoint, target)) is None:
                raise
            raise failure from None
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(target.parent)

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return migrate(super().load_checkpoint(*args, **kwargs))


def temporary(target: Path) -> Path:
    """A temporary file beside `target`, of its own: two writers of one path never share one."""
    return target.with_name(f"{target.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


def save_synced(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def migrate(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """An earlier Lightspeed's checkpoint in today's layout, so that a run resumes across an upgrade. Before
    0.2 each rank's random states were `callbacks["RankSeed"]`, which no callback claims since
    (`ExactResume` keeps them), and Lightning warns about."""
    callbacks = checkpoint.get("callbacks")
    if isinstance(callbacks, dict) and "RankSeed" in callbacks:
        checkpoint.setdefault(RANK_RNG_KEY, callbacks.pop("RankSeed"))
    return checkpoint


CHECKSUM_KEY = "checksum"


def checksum(checkpoint: dict[str, Any]) -> str:
    """A CRC-32 of every tensor in the checkpoint (names, dtypes, shapes and bytes), in key order: it
    catches flipped bits (what it is for: not tampering) at ~3 GB/s, several times a cryptographic hash."""
    crc = 0
    for name, tensor in tensors({k: v for k, v in checkpoint.items() if k != CHECKSUM_KEY}):
        if tensor.layout != torch.strided:
            continue
        data = tensor.detach().cpu().contiguous().reshape(-1)
        crc = zlib.crc32(f"{name}|{data.dtype}|{tuple(tensor.shape)}|".encode(), crc)
        if data.numel():
            crc = zlib.crc32(data.view(torch.uint8).numpy(), crc)
    return f"crc32:{crc:08x}"


def nonfinite_weights(ckpt: dict[str, Any]) -> str | None:
    """Why a checkpoint's weights must not be used (NaN or inf), or None; one host sync per device."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in (ckpt.get("state_dict") or {}).values():
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            by_device.setdefault(tensor.device, []).append(torch.isfinite(tensor).all())
    if not all(bool(torch.stack(flags).all()) for flags in by_device.values()):
        return "its weights are not finite (NaN or inf)"
    return None


def tensors(node: Any, name: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(node, torch.Tensor):
        yield name, node
    elif isinstance(node, dict):
        for key in sorted(node, key=str):
            yield from tensors(node[key], f"{name}/{key}")
    elif isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            yield from tensors(item, f"{name}/{i}")


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where folders cannot be opened."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextmanager
def loading(path: Any) -> Iterator[None]:
    """Around any checkpoint load: a refused pickle, a non-checkpoint, an empty or truncated file, or weights
    that do not fit the model become one ConfigError naming `ckpt_path`; other errors pass through."""
    try:
        yield
    except (pickle.UnpicklingError, ValueError, EOFError, RuntimeError) as err:
        from lightspeed.resilience.verify import explain_load_error, from_a_load

        if path is None or isinstance(err, TrainingFailure) or not from_a_load(err):
            raise
        explain_load_error(err, path)
        raise
