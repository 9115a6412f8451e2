"""Sharded checkpoints: every rank writes its own part (`torch.distributed.checkpoint`, DCP), so a model
too big to gather on one device (trainer=fsdp) is saved without gathering it, with the promises of one-file
checkpoints. A folder named as the file would be (`last.ckpt/`): DCP's files and `meta.pt` (the rest of
Lightning's checkpoint and a CRC-32 of each DCP file), written last by rank 0; docs/scale.md has the rest.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import sys
import warnings
import zlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from lightning.pytorch.strategies import DDPStrategy as _DDPStrategy
from lightning.pytorch.strategies import FSDPStrategy as _FSDPStrategy
from lightning.pytorch.utilities import rank_zero_warn
from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_optimizer_state_dict,
    get_state_dict,
    set_optimizer_state_dict,
)

from lightspeed.resilience import checkpoint as one_file
from lightspeed.resilience import verify
from lightspeed.resilience.rank_seed import gather

META = "meta.pt"
FILES_KEY = "sharded_files"  # in meta.pt: {file name: crc32} of the DCP files
LOADED_KEY = "sharded_loaded"  # in the dict load_checkpoint returns: weights and optimizer already restored


def is_sharded(path: Any) -> bool:
    """A folder that holds (or was meant to hold) a sharded checkpoint."""
    return Path(path).is_dir() and ((Path(path) / META).exists() or (Path(path) / ".metadata").exists())


class ShardedCheckpoints:
    """Put ahead of a Lightning strategy (`class S(ShardedCheckpoints, DDPStrategy)`): its checkpoints are
    sharded folders, and Lightning's own gathering of the state is skipped. Restored before the strategy's
    setup, as under DDP, so callbacks have their state back before `on_fit_start` (FSDP's order would not)."""

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return False

    @property
    def lightning_restore_optimizer(self) -> bool:
        return True  # FSDP's is False (it restores them itself, after setup): here load_optimizer_state_dict

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return {}

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        return {}

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        with_optimizers = "optimizer_states" in checkpoint  # absent: save_weights_only
        checkpoint.pop("state_dict", None)
        checkpoint.pop("optimizer_states", None)
        save(self, checkpoint, Path(self.broadcast(str(filepath))), with_optimizers)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(self.broadcast(str(checkpoint_path)))
        if not is_sharded(path):  # a one-file checkpoint (fine-tuning from another run's)
            return self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        meta = one_file.migrate(read_meta(path))
        # every rank reads the whole weights into the model before it is wrapped (it holds them whole then)
        state = {"model": self.lightning_module.state_dict()}
        _load(state, path, no_dist=True)
        self.lightning_module.load_state_dict(state["model"])
        meta[LOADED_KEY] = str(path)
        meta.setdefault("optimizer_states", [])  # restored in load_optimizer_state_dict; Lightning wants it
        return meta

    def load_model_state_dict(self, checkpoint: dict[str, Any], strict: bool = True) -> None:
        if not checkpoint.get(LOADED_KEY):  # before setup: the unwrapped module, under FSDP too
            self.lightning_module.load_state_dict(checkpoint["state_dict"], strict=strict)

    def load_optimizer_state_dict(self, checkpoint: dict[str, Any]) -> None:
        if checkpoint.get(LOADED_KEY):
            folder = Path(checkpoint[LOADED_KEY])
            if self.optimizers and "optimizer" in _stored_keys(folder):  # each rank its own part
                state = {"optimizer": get_optimizer_state_dict(self.model, self.optimizers)}
                _load(state, folder)
                set_optimizer_state_dict(self.model, self.optimizers, state["optimizer"])
        elif isinstance(self, _FSDPStrategy):
            if checkpoint.get("optimizer_states"):
                rank_zero_warn(
                    "a one-file checkpoint's optimizer states (keyed for an unsharded model) are not "
                    "loaded under FSDP: training continues from its weights with fresh optimizer states"
                )
        else:
            super().load_optimizer_state_dict(checkpoint)

    def remove_checkpoint(self, filepath: Any) -> None:
        if self.is_global_zero and Path(filepath).is_dir():
            shutil.rmtree(filepath, ignore_errors=True)
        else:
            super().remove_checkpoint(filepath)


class DDPStrategy(ShardedCheckpoints, _DDPStrategy):
    """Lightning's DDP, checkpoints written as sharded folders (each rank writes its part of the state)."""


class FSDPStrategy(ShardedCheckpoints, _FSDPStrategy):
    """Lightning's FSDP, checkpoints written as sharded folders: no rank ever holds the whole model."""


# radon C: rank 0's steps beside every rank's, with or without optimizer states
def save(strategy: Any, checkpoint: dict[str, Any], folder: Path, with_optimizers: bool = True) -> None:
    """Every rank: write the model's (and optimizers') state with DCP into `.<name>.partial` beside
    `folder`, then rank 0 adds meta.pt and renames it to `folder` (the previous one is removed after)."""
    partial = folder.with_name(f".{folder.name}.partial")
    if strategy.is_global_zero:
        shutil.rmtree(partial, ignore_errors=True)
    strategy.barrier("sharded_save_start")
    optimizers = strategy.optimizers if with_optimizers else []
    model_state, optim_state = get_state_dict(strategy.model, optimizers)
    state = {"model": model_state, **({"optimizer": optim_state} if with_optimizers else {})}
    # returns once every rank's files and .metadata are written. A tensor every rank holds (DDP's weights,
    # buffers) is written once, by the lowest rank: buffers such as BatchNorm's statistics are rank 0's,
    # as in a one-file checkpoint (DDP sends rank 0's to the others at each forward)
    dcp.save(state, checkpoint_id=partial, planner=DefaultSavePlanner(dedup_save_to_lowest_rank=True))
    # each rank checksums and fsyncs the files it wrote (`__<rank>_<n>.distcp`; rank 0 also .metadata)
    own = {
        f.name: _crc32(f, sync=True)
        for f in sorted(partial.iterdir())
        if f.name.startswith(f"__{strategy.global_rank}_")
        or (strategy.is_global_zero and f.name == ".metadata")
    }
    every = gather(own)
    if strategy.is_global_zero:
        meta = dict(checkpoint)
        meta[FILES_KEY] = dict(sorted(kv for part in every for kv in part.items()))
        meta[one_file.CHECKSUM_KEY] = one_file.checksum(meta)
        one_file.save_synced(meta, partial / META)
        one_file._fsync_dir(partial)
        swap_into_place(partial, folder)
    strategy.barrier("sharded_save_end")


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's planner, loading what it stores as bytes (optimizer hyperparameters, extra state) as plain data:
    DCP's own uses `weights_only=False`, which would run code that a crafted file names."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def _load(state: dict[str, Any], folder: Path, **kwargs: Any) -> None:
    """`dcp.load` from `folder` with the safe reader and planner; a refused value is an UnpicklingError
    (DCP wraps every rank's error in its CheckpointException, a BaseException)."""
    with warnings.catch_warnings():  # no_dist: "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
        try:
            dcp.load(state, storage_reader=SafeReader(folder), planner=SafeLoadPlanner(), **kwargs)
        except CheckpointException as err:
            refused = [e for e, _ in err.failures.values() if isinstance(e, pickle.UnpicklingError)]
            if refused:
                raise pickle.UnpicklingError(
                    f"{folder} holds a value that is not plain data (refused, not run): {refused[0]}"
                ) from None
            raise


def read_meta(folder: Path) -> dict[str, Any]:
    return torch.load(folder / META, map_location="cpu", weights_only=True)


# radon C: one return per defect: unfinished, meta, files, checksums
def problem(folder: Path) -> str | None:
    """Why the sharded checkpoint `folder` must not be trained from (no meta.pt: never finished; a file
    missing, added or changed since it was written; DCP metadata that is not plain data), or None."""
    try:
        meta = read_meta(folder)
    except FileNotFoundError:
        return "a sharded checkpoint that was never finished (no meta.pt)"
    except (pickle.UnpicklingError, EOFError, RuntimeError, OSError, ValueError) as err:
        return f"its meta.pt: {verify.why(err, folder / META)}"
    if not isinstance(meta, dict) or not isinstance(meta.get(FILES_KEY), dict):
        return "not a sharded checkpoint written by Lightspeed (meta.pt lists no files)"
    if meta.get(one_file.CHECKSUM_KEY) != one_file.checksum(meta):
        return "its meta.pt no longer matches its checksum (corrupted on disk?)"
    listed = meta[FILES_KEY]
    present = {f.name for f in folder.iterdir()} - {META}
    if present != set(listed):
        return f"its files changed since it was written (missing or added: {sorted(present ^ set(listed))})"
    for name, crc in listed.items():
        if not (folder / name).is_file() or _crc32(folder / name) != crc:  # a folder in its place too
            return f"its file {name} no longer matches its checksum (corrupted on disk?)"
    try:
        _stored_keys(folder)
    except pickle.UnpicklingError as err:
        return f"its .metadata {err}"
    return None


def any_problem(path: Path) -> str | None:
    """`problem` for a sharded checkpoint (a folder), `verify.problem` for a one-file one."""
    return problem(path) if path.is_dir() else verify.problem(path)


def to_one_file(folder: Path) -> dict[str, Any]:
    """The sharded checkpoint as one Lightning checkpoint dict (whole weights, on the CPU, no optimizer
    states), in one process, no process group: what `eval` loads, or `python -m` this module writes."""
    model: dict[str, Any] = {}
    for key, item in read_dcp_metadata(folder).state_dict_metadata.items():
        if key.startswith("model."):  # whole tensors to read every rank's parts into
            whole = isinstance(item, TensorStorageMetadata)
            model[key[6:]] = torch.empty(item.size, dtype=item.properties.dtype) if whole else None
    state = {"model": model}
    _load(state, folder, no_dist=True)
    meta = read_meta(folder)
    for key in (FILES_KEY, one_file.CHECKSUM_KEY, "optimizer_states", "lr_schedulers"):
        meta.pop(key, None)
    return {**meta, "state_dict": state["model"]}


def one_file_bytes(folder: Path) -> io.BytesIO:
    """`to_one_file`, serialised as `torch.save` would write it to a file (for `load_from_checkpoint`)."""
    buffer = io.BytesIO()
    torch.save(to_one_file(folder), buffer)
    buffer.seek(0)
    return buffer


class SafeReader(FileSystemReader):
    """DCP's reader, with its `.metadata` (a pickle) read by an unpickler that builds only DCP's metadata
    classes, torch sizes and dtypes: loading a sharded checkpoint runs no code it names."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        metadata = read_dcp_metadata(Path(str(self.path)))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


_METADATA_CLASSES = (
    "Metadata TensorStorageMetadata BytesStorageMetadata ChunkStorageMetadata TensorProperties"
)
_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (*_METADATA_CLASSES.split(), "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and "." not in name and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"names {module}.{name}, which is not DCP metadata (refused)")


def read_dcp_metadata(folder: Path) -> Any:
    with open(folder / ".metadata", "rb") as f:
        return _MetadataUnpickler(f).load()


def _stored_keys(folder: Path) -> set[str]:
    """The top-level keys of the state DCP stored (`model`, `optimizer`)."""
    return {key.split(".", 1)[0] for key in read_dcp_metadata(folder).state_dict_metadata}


def swap_into_place(partial: Path, folder: Path) -> None:
    """Rename the finished `partial` to `folder`. A folder cannot replace another in one rename: the old
    one is renamed aside first and removed after; `recover` puts it back if a crash fell between."""
    old = folder.with_name(f".{folder.name}.old")
    _remove(old)
    if folder.exists():  # a folder, or a one-file checkpoint of the same name
        os.rename(folder, old)
    os.rename(partial, folder)
    one_file._fsync_dir(folder.parent)
    _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def recover(checkpoints: Path) -> None:
    """A save that crashed between its two renames left the previous checkpoint as `.<name>.old` and
    none under its name: rename it back (the finished `.partial`, if any, is dropped)."""
    for old in checkpoints.glob(".*.ckpt.old") if checkpoints.is_dir() else ():
        target = old.with_name(old.name[1 : -len(".old")])
        if not target.exists() and any_problem(old) is None:
            os.rename(old, target)


def _crc32(path: Path, sync: bool = False) -> str:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
        if sync:
            os.fsync(f.fileno())
    return f"crc32:{crc:08x}"


def main(argv: list[str]) -> int:
    """`python -m lightspeed.resilience.sharded <folder> <file.ckpt>`: one file for eval on one device."""
    if len(argv) != 2:
        print("usage: python -m lightspeed.resilience.sharded <sharded checkpoint folder> <out.ckpt>")
        return 2
    folder, out = Path(argv[0]), Path(argv[1])
    reason = problem(folder) if is_sharded(folder) else "not a sharded checkpoint folder"
    if reason is not None:
        print(f"error: {folder}: {reason}", file=sys.stderr)
        return 1
    one_file.AtomicCheckpointIO().save_checkpoint(to_one_file(folder), out)
    print(f"wrote {out}: `make eval ckpt_path={out}` loads it on any one device")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
