"""Auto-resume: the same command, rerun after a crash, continues where it stopped (the same command lands in
the same folder: `identity.py`). `resume=auto` picks the checkpoint furthest into training that this run
wrote and that checks out; `resume=never` refuses to start over one. docs/resilience.md has the details.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn
from omegaconf import DictConfig, OmegaConf

from lightspeed.core.config import ConfigError
from lightspeed.resilience import checkpoint, identity


def checkpoint_dir(cfg: DictConfig) -> Path:
    """Where this run's checkpoints go: the checkpoint callback's folder, else `<run dir>/checkpoints`."""
    folder = OmegaConf.select(cfg, "callbacks.model_checkpoint.dirpath", default=None)
    return Path(str(folder)) if folder else Path(str(cfg.paths.output_dir)) / "checkpoints"


def inspect(path: Path, warn: bool = True) -> dict[str, Any] | None:
    """The checkpoint's loop position, latest metrics and run identity if it loads as plain data, else
    None (with one warning line, unless `warn` is false)."""
    try:
        if path.is_dir():  # a sharded checkpoint (resilience/sharded.py): its meta.pt says the same
            from lightspeed.resilience import sharded  # only where there is one: it loads DCP

            ckpt = sharded.read_meta(path)
        else:
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return {
            "global_step": int(ckpt["global_step"]),
            "epoch": int(ckpt["epoch"]),
            "metrics": dict(ckpt.get("metrics", {})),
            "identity": ckpt.get("identity"),
        }
    except (pickle.UnpicklingError, EOFError, RuntimeError, KeyError, OSError, ValueError, TypeError) as err:
        if warn:
            from lightspeed.resilience.verify import why as why_not

            why = problem(path) if path.is_dir() else why_not(err, path)
            rank_zero_warn(f"resume=auto: skipping {path}: not a loadable checkpoint ({why})")
        return None


def problem(path: Path) -> str | None:
    """`verify.problem`, for a sharded checkpoint (a folder) too."""
    if not path.is_dir():
        from lightspeed.resilience import verify

        return verify.problem(path)
    from lightspeed.resilience import sharded

    return sharded.problem(path)


def foreign(info: dict[str, Any], ident: dict[str, Any], adopted: bool) -> str | None:
    """Why a checkpoint was not written by the run with identity `ident`, or None. `adopted`: the run
    predates stored identities, and its checkpoints without one are its own."""
    stored = info.get("identity")
    if not isinstance(stored, dict):
        return None if adopted else "it holds no run identity: not written by this run"
    diffs = identity.differences(stored.get("config") or {}, ident)
    return f"written by another run ({identity.describe(diffs)})" if diffs else None


def latest(folder: Path, ident: dict[str, Any], adopted: bool = False) -> tuple[Path, dict[str, Any]] | None:
    """This run's checkpoint furthest into training (then the newest file) in `folder` that checks out
    (`verify.problem`); each one passed over is named in a warning line."""
    found = []
    if folder.is_dir() and any(folder.glob(".*.ckpt.old")):  # a save cut between its two renames
        from lightspeed.resilience import sharded

        with contextlib.suppress(OSError):  # another rank may be putting it back at the same moment
            sharded.recover(folder)
    for path in folder.glob("*.ckpt") if folder.is_dir() else ():
        info = inspect(path)
        if info is None:
            continue
        reason = foreign(info, ident, adopted)
        if reason is not None:
            rank_zero_warn(f"resume=auto: skipping {path}: {reason}")
            continue
        try:
            mtime = path.stat().st_mtime
        except OSError:  # renamed away since (another rank's sharded.recover, a save's swap)
            continue
        found.append(((info["global_step"], mtime), path, info))
    for _, path, info in sorted(found, key=lambda f: f[0], reverse=True):
        reason = problem(path)
        if reason is None:
            return path, info
        rank_zero_warn(f"resume=auto: skipping {path}: {reason}")
    return None


def resolve(cfg: DictConfig) -> str | None:
    """The checkpoint this run starts from: `ckpt_path` if given, else what `resume` finds."""
    return start(cfg)[0]


def start(cfg: DictConfig, ident: dict[str, Any] | None = None) -> tuple[str | None, dict[str, Any] | None]:
    """`resolve`, with the checkpoint's position and metrics as read while choosing it, and the run's
    identity (`ident`, else that of `cfg`) recorded in its folder (`run.json`)."""
    run_dir = Path(str(cfg.paths.output_dir))
    ident = ident if ident is not None else identity.of(cfg)
    if cfg.get("ckpt_path"):
        return _given(cfg, run_dir, ident)
    folder = checkpoint_dir(cfg)
    has_checkpoints = folder.is_dir() and any(folder.glob("*.ckpt"))
    if cfg.trainer.get("enable_checkpointing", True) is False or cfg.trainer.get("fast_dev_run"):
        if has_checkpoints:  # its summary.json and curves would be replaced
            raise ConfigError(
                f"run_name={run_dir.name} holds a trained run (checkpoints in {folder}), and this run writes "
                "no checkpoints (debug=..., trainer.enable_checkpointing=false): its summary would replace "
                "that run's; use run_name=<new name>"
            )
        return None, None  # a run that writes no checkpoints (debug=*) resumes none either
    adopted = _adopted(run_dir, folder, ident, has_checkpoints)
    found = latest(folder, ident, adopted)
    if found is None:
        _point_at_siblings(folder)
        identity.write_record(run_dir, ident, adopted)
        return None, None
    path, info = found
    _check_strategy_loads(cfg, path, "resume=auto found")
    if cfg.get("resume", "auto") == "never":
        raise ConfigError(
            f"resume=never, but {folder} already holds checkpoints (newest: {path.name}, step "
            f"{info['global_step']}) that starting over would overwrite: use resume=auto to continue "
            "that run, or run_name=<new name> for a new one"
        )
    identity.write_record(run_dir, ident, adopted)
    rank_zero_info(f"resume=auto: continuing from {path} (epoch {info['epoch']}, step {info['global_step']})")
    _bring_last_up_to_date(path, info)
    return str(path), info


def _given(cfg: DictConfig, run_dir: Path, ident: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """`ckpt_path`: trained from as given, where it can be."""
    path = Path(str(cfg.ckpt_path))
    _check_strategy_loads(cfg, path, "ckpt_path")
    info = inspect(path, warn=False)  # one that does not load: its load gives the one-line error
    reason = problem(path) if info is not None else None
    if reason is not None:
        raise ConfigError(f"ckpt_path={path} cannot be trained from: {reason}; pass another checkpoint")
    identity.write_record(run_dir, ident)
    return str(path), info


def _adopted(run_dir: Path, folder: Path, ident: dict[str, Any], has_checkpoints: bool) -> bool:
    """Whether the folder's checkpoints are taken as this run's without their identity (an older
    Lightspeed's run); one line where the folder holds a run with other settings."""
    record = identity.read_record(run_dir)
    if record is None:
        if has_checkpoints:
            rank_zero_warn(
                f"resume=auto: {run_dir} stores no run identity (a run from an older Lightspeed): its "
                "checkpoints are taken as this run's"
            )
        return has_checkpoints
    diffs = identity.differences(record["config"], ident) if has_checkpoints else []
    if diffs:
        raise ConfigError(
            f"run_name={run_dir.name} holds a run with other settings ({identity.describe(diffs)}): "
            f"use run_name=<new name> for a new run, and add ckpt_path={folder / 'last.ckpt'} to "
            "fine-tune from it"
        )
    return bool(record.get("adopted"))


def _check_strategy_loads(cfg: DictConfig, path: Path, what: str) -> None:
    """A sharded checkpoint (a folder) loads only through a strategy that writes them: one line otherwise."""
    if not path.is_dir():
        return
    from lightspeed.resilience import sharded

    target = OmegaConf.select(cfg, "trainer.strategy._target_", default=None)
    try:
        ok = target is not None and issubclass(get_class(str(target)), sharded.ShardedCheckpoints)
    except (ImportError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(
            f"{what} {path}, a sharded checkpoint: continue it with the strategy that wrote it "
            "(trainer=fsdp, or trainer.strategy._target_=lightspeed.resilience.sharded.DDPStrategy), or make "
            f"it one file for other uses: python -m lightspeed.resilience.sharded {path} <file.ckpt>"
        )


def _point_at_siblings(folder: Path) -> None:
    """A new run: if runs of the same experiment with other settings have checkpoints, say how to
    continue the newest of them instead (a changed batch size, say, starts a new run)."""
    run = folder.parent
    prefix = run.name.rsplit("-", 1)[0]
    siblings = [
        p / "checkpoints" / "last.ckpt"
        for p in run.parent.glob(f"{prefix}-*")
        if p != run and (p / "checkpoints" / "last.ckpt").exists()  # a file, or a sharded folder
    ]
    if siblings:
        newest = max(siblings, key=lambda p: p.stat().st_mtime)
        rank_zero_info(
            f"a new run ({run.name}): its settings differ from earlier runs'; to continue the newest of "
            f"them under these settings instead: ckpt_path={newest}"
        )


@rank_zero_only
def _bring_last_up_to_date(path: Path, info: dict[str, Any]) -> None:
    """A run killed between writing its best and its last checkpoint of a step resumes from the best
    one; last.ckpt, which users and `eval` take for the newest state, is made a copy of it (written
    atomically), or a run that has nothing left to train would leave it behind for good."""
    last = path.with_name("last.ckpt")
    if path == last or not last.exists():
        return
    behind = inspect(last, warn=False)
    if behind is None or behind["global_step"] < info["global_step"] or problem(last) is not None:
        if path.is_dir():  # sharded: a copy of the folder, renamed into place as a save does
            from lightspeed.resilience import sharded

            partial = last.with_name(f".{last.name}.partial")
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(path, partial)
            sharded.swap_into_place(partial, last)
            return
        tmp = checkpoint.temporary(last)
        shutil.copyfile(path, tmp)
        os.replace(tmp, last)
