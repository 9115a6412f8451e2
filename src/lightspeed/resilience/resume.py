"""Run identity and auto-resume: the same command, rerun after a crash, continues where it stopped.

A run's folder is `logs/<task>/runs/<run_name>`. `run_name` defaults to the experiment (or data and
model) and a hash of the config as composed, so the same command lands in the same folder and a changed
setting starts a new one. `resume=auto` picks the newest checkpoint there that loads; `resume=never`
refuses to start over a folder that has one, so nothing is overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn
from omegaconf import DictConfig, OmegaConf

from lightspeed.core.config import ConfigError

#: Keys that say where a run lives, how it starts, or how it is watched and fed, not what it computes:
#: left out of the identity, so that changing them continues the same run. (Loader settings change
#: speed, not batches: both loaders serve the same order.)
NOT_IDENTITY = (
    "hydra",
    "paths",
    "run_name",
    "resume",
    "ckpt_path",
    "test_after_fit",
    "optimized_metric",
    "logger",
    "data.num_workers",
    "data.pin_memory",
    "data.persistent_workers",
    "data.prefetch_factor",
    "data.non_blocking",
    "data.on_device",
    "trainer.log_every_n_steps",
    "trainer.num_sanity_val_steps",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "callbacks.rich_progress_bar",
    "callbacks.model_summary",
    "callbacks.speed_report",
    "callbacks.lr_monitor",
    "callbacks.preemption",
    "callbacks.nonfinite.check_every_n_steps",
    "callbacks.model_checkpoint.every_n_train_steps",
)


def run_id(*, _root_: DictConfig) -> str:
    """`${lightspeed.run_id:}`: `<experiment or data-model>-<8 hex of the config>`.

    The hash covers the config before interpolation (`${...}` stay as written), so it is known before
    Hydra makes the run folder and is the same in every DDP rank.
    """
    config = OmegaConf.to_container(_root_, resolve=False)
    # Hydra hands the task its config without the `hydra` node: ask HydraConfig, then the node.
    hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else _root_.get("hydra")
    choices = OmegaConf.select(hydra_cfg, "runtime.choices", default=None) or {} if hydra_cfg else {}
    assert isinstance(config, dict)
    for key in NOT_IDENTITY:
        *parents, last = key.split(".")
        node = config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    digest = hashlib.sha1(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:8]
    experiment = choices.get("experiment")
    name = experiment if experiment else "-".join(str(choices[g]) for g in ("data", "model") if g in choices)
    return f"{(name or 'run').replace('/', '-')}-{digest}"


def register_resolver() -> None:
    """Make `${lightspeed.run_id:}` known to OmegaConf; needed before Hydra composes a config."""
    OmegaConf.register_new_resolver("lightspeed.run_id", run_id, replace=True)


def checkpoint_dir(cfg: DictConfig) -> Path:
    """Where this run's checkpoints go: the checkpoint callback's folder, else `<run dir>/checkpoints`."""
    folder = OmegaConf.select(cfg, "callbacks.model_checkpoint.dirpath", default=None)
    return Path(str(folder)) if folder else Path(str(cfg.paths.output_dir)) / "checkpoints"


def inspect(path: Path, warn: bool = True) -> dict[str, Any] | None:
    """The checkpoint's loop position and latest metrics if it loads as plain data, else None (with one
    warning line, unless `warn` is false)."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return {
            "global_step": int(ckpt["global_step"]),
            "epoch": int(ckpt["epoch"]),
            "metrics": dict(ckpt.get("metrics", {})),
        }
    except (pickle.UnpicklingError, EOFError, RuntimeError, KeyError, OSError, ValueError) as err:
        reason = "holds Python objects" if isinstance(err, pickle.UnpicklingError) else type(err).__name__
        if warn:
            rank_zero_warn(f"resume=auto: skipping {path}: not a loadable checkpoint ({reason})")
        return None


def latest(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """The loadable checkpoint furthest into training (then the newest file) in `folder`."""
    found = []
    for path in folder.glob("*.ckpt") if folder.is_dir() else ():
        info = inspect(path)
        if info is not None:
            found.append(((info["global_step"], path.stat().st_mtime), path, info))
    if not found:
        return None
    _, path, info = max(found, key=lambda f: f[0])
    return path, info


def resolve(cfg: DictConfig) -> str | None:
    """The checkpoint this run starts from: `ckpt_path` if given, else what `resume` finds."""
    return start(cfg)[0]


def start(cfg: DictConfig) -> tuple[str | None, dict[str, Any] | None]:
    """`resolve`, with the checkpoint's position and metrics as read while choosing it (None for an
    explicit `ckpt_path` that does not load: its load gives the one-line error)."""
    if cfg.get("ckpt_path"):
        return str(cfg.ckpt_path), inspect(Path(str(cfg.ckpt_path)), warn=False)
    mode = cfg.get("resume", "auto")
    folder = checkpoint_dir(cfg)
    found = latest(folder)
    if found is None:
        _point_at_siblings(folder)
        return None, None
    path, info = found
    if mode == "never":
        raise ConfigError(
            f"resume=never, but {folder} already holds checkpoints (newest: {path.name}, step "
            f"{info['global_step']}) that starting over would overwrite: use resume=auto to continue "
            "that run, or run_name=<new name> for a new one"
        )
    rank_zero_info(f"resume=auto: continuing from {path} (epoch {info['epoch']}, step {info['global_step']})")
    _bring_last_up_to_date(path, info)
    return str(path), info


def _point_at_siblings(folder: Path) -> None:
    """A new run: if runs of the same experiment with other settings have checkpoints, say how to
    continue the newest of them instead (a changed batch size, say, starts a new run)."""
    run = folder.parent
    prefix = run.name.rsplit("-", 1)[0]
    siblings = [
        p / "checkpoints" / "last.ckpt"
        for p in run.parent.glob(f"{prefix}-*")
        if p != run and (p / "checkpoints" / "last.ckpt").is_file()
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
    if path == last or not last.is_file():
        return
    behind = inspect(last, warn=False)
    if behind is None or behind["global_step"] < info["global_step"]:
        tmp = last.with_name(last.name + ".tmp")
        shutil.copyfile(path, tmp)
        os.replace(tmp, last)
