"""Auto-resume: the same command, rerun after a crash, continues where it stopped (the same command lands in
the same folder: `identity.py`). `resume=auto` picks the checkpoint furthest into training that this run
wrote and that checks out; `resume=never` refuses to start over one. docs/resilience.md has the details.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from omegaconf import DictConfig, OmegaConf

from lightspeed.core.config import ConfigError
from lightspeed.resilience import identity


def checkpoint_dir(cfg: DictConfig) -> Path:
    """Where this run's checkpoints go: the checkpoint callback's folder, else `<run dir>/checkpoints`."""
    folder = OmegaConf.select(cfg, "callbacks.model_checkpoint.dirpath", default=None)
    return Path(str(folder)) if folder else Path(str(cfg.paths.output_dir)) / "checkpoints"


def resolve(cfg: DictConfig) -> str | None:
    """The checkpoint this run starts from: `ckpt_path` if given, else what `resume` finds."""
    return start(cfg)[0]


def start(cfg: DictConfig, ident: dict[str, Any] | None = None) -> tuple[str | None, dict[str, Any] | None]:
    """`resolve`, with the checkpoint's position and metrics as read while choosing it, and the run's
    identity (`ident`, else that of `cfg`) recorded in its folder (`run.json`)."""
    run_dir = Path(str(cfg.paths.output_dir))
    ident = ident if ident is not None else identity.of(cfg)
    if cfg.get("ckpt_path") is not None:  # one that is empty or false is refused too
        from lightspeed.resilience import resume_from

        return resume_from.given(cfg, run_dir, ident)
    folder = checkpoint_dir(cfg)
    has_checkpoints = folder.is_dir() and any(folder.glob("*.ckpt"))
    if _writes_none(cfg, run_dir, folder, has_checkpoints):
        return None, None  # a run that writes no checkpoints (debug=*) resumes none either
    adopted = _adopted(run_dir, folder, ident, has_checkpoints)
    if has_checkpoints or (folder.is_dir() and any(folder.glob(".*.ckpt.old"))):  # .old: a save cut short
        from lightspeed.resilience import resume_from

        found = resume_from.continued(cfg, folder, ident, adopted)
        if found is not None:
            return found
    _point_at_siblings(folder)
    identity.write_record(run_dir, ident, adopted)
    return None, None


def _writes_none(cfg: DictConfig, run_dir: Path, folder: Path, has_checkpoints: bool) -> bool:
    """Whether the run writes no checkpoints (debug=*); one line where its folder holds a trained run's, whose
    summary.json and curves it would replace."""
    if cfg.trainer.get("enable_checkpointing", True) is not False and not cfg.trainer.get("fast_dev_run"):
        return False
    if has_checkpoints:
        raise ConfigError(
            f"run_name={run_dir.name} holds a trained run (checkpoints in {folder}), and this run writes "
            "no checkpoints (debug=..., trainer.enable_checkpointing=false): its summary would replace "
            "that run's; use run_name=<new name>"
        )
    return True


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
    if not has_checkpoints:
        return bool(record.get("adopted"))
    from lightspeed.resilience.verify import describe, differences  # a rerun: it has checkpoints

    diffs = differences(record["config"], ident)
    if diffs:
        raise ConfigError(
            f"run_name={run_dir.name} holds a run with other settings ({describe(diffs)}): "
            f"use run_name=<new name> for a new run, and add ckpt_path={folder / 'last.ckpt'} to "
            "fine-tune from it"
        )
    return bool(record.get("adopted"))


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
