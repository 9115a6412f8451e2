"""The checkpoint a rerun continues from (`resume.start`): the furthest into training that this run wrote and
that checks out, or the one `ckpt_path` gives. Loaded only where a run's folder holds checkpoints or
`ckpt_path` is set: a run that starts fresh reads none."""

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
from lightspeed.resilience import checkpoint, identity, verify


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
    diffs = verify.differences(stored.get("config") or {}, ident)
    return f"written by another run ({verify.describe(diffs)})" if diffs else None


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


def continued(
    cfg: DictConfig, folder: Path, ident: dict[str, Any], adopted: bool
) -> tuple[str, dict[str, Any]] | None:
    """The checkpoint `resume=auto` continues from (`latest`), its position and metrics; None where none
    checks out. One line where `resume=never` would start over it or its strategy cannot load it."""
    found = latest(folder, ident, adopted)
    if found is None:
        return None
    path, info = found
    check_strategy_loads(cfg, path, "resume=auto found")
    if cfg.get("resume", "auto") == "never":
        raise ConfigError(
            f"resume=never, but {folder} already holds checkpoints (newest: {path.name}, step "
            f"{info['global_step']}) that starting over would overwrite: use resume=auto to continue "
            "that run, or run_name=<new name> for a new one"
        )
    identity.write_record(Path(str(cfg.paths.output_dir)), ident, adopted)
    rank_zero_info(f"resume=auto: continuing from {path} (epoch {info['epoch']}, step {info['global_step']})")
    bring_last_up_to_date(path, info)
    return str(path), info


def given(cfg: DictConfig, run_dir: Path, ident: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """`ckpt_path`: trained from as given, where it can be."""
    path = Path(str(cfg.ckpt_path))
    check_checkpoint_path(path, "or ckpt_path=null")
    check_strategy_loads(cfg, path, "ckpt_path")
    info = inspect(path, warn=False)  # one that does not load: its load gives the one-line error
    reason = problem(path) if info is not None else None
    if reason is not None:
        raise ConfigError(f"ckpt_path={path} cannot be trained from: {reason}; pass another checkpoint")
    identity.write_record(run_dir, ident)
    return str(path), info


def check_strategy_loads(cfg: DictConfig, path: Path, what: str) -> None:
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


@rank_zero_only
def bring_last_up_to_date(path: Path, info: dict[str, Any]) -> None:
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


def check_checkpoint_path(path: Path, other: str = "") -> None:
    """A `ckpt_path` that is a file or a sharded checkpoint's folder; else one line saying what it is."""
    other = f", {other}" if other else ""
    if path.is_dir():
        _check_checkpoint_folder(path, other)
    elif path.exists() and not path.is_file():
        raise ConfigError(
            f"ckpt_path={path} is not a regular file (a fifo, a device): pass the path of a .ckpt file{other}"
        )
    elif not path.is_file():
        raise ConfigError(f"ckpt_path={path} does not exist: pass the path of a .ckpt file{other}")


def _check_checkpoint_folder(path: Path, other: str) -> None:
    """A sharded checkpoint's folder (resilience/sharded.py), not a folder of .ckpt files."""
    if (path / "meta.pt").is_file() or (path / ".metadata").is_file():
        return
    found = sorted(p.name for p in path.glob("*.ckpt"))[:3]
    hint = f" (it holds {', '.join(found)})" if found else ""
    raise ConfigError(f"ckpt_path={path} is a folder{hint}: pass the .ckpt file itself{other}")
