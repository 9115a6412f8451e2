"""A run's identity: the config that decides what it computes, kept in its folder and in every checkpoint.

The folder name holds its hash (`run_id`): the same command lands in the same folder, a changed setting in a
new one. The stored copy lets a rerun check that a reused folder (explicit `run_name`) and each checkpoint are
this run's, naming differing keys. The git commit is provenance, not identity: edited code continues a run."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn
from omegaconf import DictConfig, OmegaConf

from lightspeed import CONF_DIR, __version__
from lightspeed.core.config import ConfigError
from lightspeed.core.files import read_json, write_text_atomically
from lightspeed.core.schema import ORIGINAL, SCHEMA

RECORD_FILE = "run.json"

#: Where a checkpoint keeps the ids of the samples its run trained on (int64, one per sample; see
#: `lightspeed.data.base.sample_ids`), so that an evaluation can tell when its test set holds some.
TRAIN_SAMPLES_KEY = "train_samples"
#: What each label means, where the DataModule names its classes (`class_names`: an image folder's).
CLASS_NAMES_KEY = "class_names"
#: Where a checkpoint keeps the names of its model's arguments that its run took from the data (what
#: `make eval` checks the data it evaluates on against).
FROM_DATA_KEY = "from_data"
#: Where a checkpoint keeps what rebuilds its module: the run's model node as built (resolved, the data's
#: arguments in it), plain data, so eval and export need none of the objects `save_hyperparameters()` holds.
MODEL_CONFIG_KEY = "model_config"
#: Where a checkpoint keeps its run's data config as written (`${...}` unresolved, loader settings and
#: data folder included): what `make eval` evaluates on, resolved on its own machine.
DATA_CONFIG_KEY = "data_config"

#: Left out of a run's identity, from the one schema: keys that say where a run lives, how it starts, or how
#: it is watched and fed; and keys a release added, at the value that behaves as before (upgrading continues).
NOT_IDENTITY = tuple(k for k, key in SCHEMA.items() if not key.identity)
ADDED_KEYS = {k: key.added for k, key in SCHEMA.items() if key.added is not ORIGINAL}


def identity(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a config container (interpolations as written) that decides what the run computes."""
    config = json.loads(json.dumps(config, default=str))  # a deep copy, of plain data
    for key in NOT_IDENTITY:
        _pop(config, key)
    for key, value in ADDED_KEYS.items():
        if _lookup(config, key) == value:
            _pop(config, key)
    return config


def digest(ident: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:8]


def of(cfg: DictConfig) -> dict[str, Any]:
    """`identity` of a composed config."""
    container = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(container, dict)
    return identity(container)


def run_id(*, _root_: DictConfig) -> str:
    """`${lightspeed.run_id:}`: `<experiment or data-model>-<8 hex of the identity>`, hashed before
    interpolation, so it is known before Hydra makes the run folder and is the same in every DDP rank."""
    # Hydra hands the task its config without the `hydra` node: ask HydraConfig, then the node.
    hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else _root_.get("hydra")
    choices = OmegaConf.select(hydra_cfg, "runtime.choices", default=None) or {} if hydra_cfg else {}
    experiment = choices.get("experiment")
    name = experiment if experiment else "-".join(str(choices[g]) for g in ("data", "model") if g in choices)
    return f"{(name or 'run').replace('/', '-')}-{digest(of(_root_))}"


def register_resolver() -> None:
    """Make `${lightspeed.run_id:}` known to OmegaConf; needed before Hydra composes a config."""
    OmegaConf.register_new_resolver("lightspeed.run_id", run_id, replace=True)


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """The run's stored identity, or None for a run from before Lightspeed kept one (or a broken file)."""
    record = read_json(run_dir / RECORD_FILE, within=run_dir)
    return record if isinstance(record, dict) and isinstance(record.get("config"), dict) else None


@rank_zero_only
def write_record(run_dir: Path, ident: dict[str, Any], adopted: bool = False) -> None:
    """Write or extend `<run dir>/run.json`: the identity once, each attempt's start, version and commit (what
    code trained which stretch). `adopted`: a pre-identity run, whose checkpoints count as its own."""
    record = read_record(run_dir) or {"identity": digest(ident), "config": ident, "adopted": adopted}
    record["identity"], record["config"] = digest(ident), ident
    attempt = {"started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    attempt |= {"lightspeed": __version__, **code_commit(), "pid": os.getpid()}
    record.setdefault("attempts", []).append(attempt)
    write_text_atomically(run_dir / RECORD_FILE, json.dumps(record, indent=2, default=str) + "\n")


def add_fit_seconds(run_dir: Path, seconds: float) -> float:
    """Keep this attempt's fit time in run.json (rank 0 writes) and return the run's total over its
    attempts: a resumed or rerun run adds to its time, never replaces it. A run that adds no attempt (a
    debug run saves no checkpoint) leaves the others' alone."""
    record = read_record(run_dir) or {}
    found = record.get("attempts")
    attempts = [a for a in found if isinstance(a, dict)] if isinstance(found, list) else []
    if not attempts or attempts[-1].get("pid") != os.getpid() or "fit_seconds" in attempts[-1]:
        return seconds
    attempts[-1]["fit_seconds"] = round(seconds, 2)
    _keep(run_dir, record)
    return sum(t for a in attempts if isinstance(t := a.get("fit_seconds"), (int, float)))


@rank_zero_only
def _keep(run_dir: Path, record: dict[str, Any]) -> None:
    try:
        write_text_atomically(run_dir / RECORD_FILE, json.dumps(record, indent=2, default=str) + "\n")
    except OSError as err:  # the run's own exit (a preemption's 143) matters more than this record
        rank_zero_warn(f"{RECORD_FILE}: this attempt's fit time not kept ({err.strerror or err})")


def code_commit() -> dict[str, Any]:
    """The git commit of the code and whether it had uncommitted changes; empty outside a git checkout."""
    repo = CONF_DIR.parent

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {}
    return {"commit": commit, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def is_plain(value: Any) -> bool:
    """Data that `torch.load(..., weights_only=True)` reads back: no object it would have to import."""
    if isinstance(value, (dict, list, tuple)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return type(value) in (dict, list, tuple) and all(is_plain(k) and is_plain(v) for k, v in items)
    return value is None or isinstance(value, (str, int, float, bool, torch.Tensor, torch.dtype, torch.Size))


def keep_plain_hyperparameters(checkpoint: dict[str, Any]) -> None:
    """Leave out of the module's and the DataModule's hyperparameters what is not plain data (a net, a
    `functools.partial`): the checkpoint keeps the node that rebuilds them instead."""
    for key in (L.LightningModule.CHECKPOINT_HYPER_PARAMS_KEY, "datamodule_hyper_parameters"):
        if isinstance(checkpoint.get(key), dict):
            checkpoint[key] = {k: v for k, v in checkpoint[key].items() if is_plain(v)}


class RunIdentity(L.Callback):
    """Stores the run's identity in every checkpoint (`checkpoint["identity"]`): auto-resume takes only this
    run's checkpoints, and each names the settings (data config included), samples (`TRAIN_SAMPLES_KEY`, from
    `sample_ids`), class names (`CLASS_NAMES_KEY`), model arguments from the data (`FROM_DATA_KEY`) and the
    model node that rebuilds the module (`MODEL_CONFIG_KEY`). Hyperparameters that are not plain data (a
    net or a `functools.partial` that Hydra built) are left out: every checkpoint loads with weights_only."""

    def __init__(self) -> None:
        self.ident: dict[str, Any] | None = None  # none given: the checkpoints are not labelled
        self.data: dict[str, Any] | None = None
        self.from_data: list[str] | None = None
        self.model: dict[str, Any] | None = None

    def identify(
        self,
        ident: dict[str, Any],
        data: dict[str, Any] | None = None,
        from_data: list[str] | None = None,
        model: dict[str, Any] | None = None,
    ) -> None:
        """The run's facts, known once its model is built: its identity, data node, the model's arguments
        from the data and the model node."""
        self.ident, self.data, self.from_data, self.model = ident, data, from_data, model

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        super().on_load_checkpoint(trainer, pl_module, checkpoint)
        # the run's own folder only: a new run (another run_name) may fine-tune on changed data
        path = trainer.ckpt_path
        if (
            self.ident is not None
            and path
            and Path(path).resolve().is_relative_to(Path(trainer.default_root_dir).resolve())
        ):
            check_same_samples(checkpoint, self.ident, trainer.datamodule, "this run's checkpoint")

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        keep_plain_hyperparameters(checkpoint)
        if self.ident is None:
            return
        checkpoint["identity"] = {"digest": digest(self.ident), "config": self.ident}
        if self.data is not None:
            checkpoint[DATA_CONFIG_KEY] = self.data
        if self.from_data is not None:
            checkpoint[FROM_DATA_KEY] = list(self.from_data)
        if self.model is not None:
            checkpoint[MODEL_CONFIG_KEY] = self.model
        ids = getattr(trainer.datamodule, "sample_ids", None)
        if isinstance(ids, dict) and ids.get("train") is not None:
            checkpoint[TRAIN_SAMPLES_KEY] = ids["train"]
        names = getattr(trainer.datamodule, "class_names", None)
        if names is not None:
            checkpoint[CLASS_NAMES_KEY] = [str(n) for n in names]  # plain strings, whatever the type


def _lookup(config: dict[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _pop(config: dict[str, Any], key: str) -> None:
    parent, _, last = key.rpartition(".")
    node = _lookup(config, parent) if parent else config
    if isinstance(node, dict):
        node.pop(last, None)


def check_same_samples(checkpoint: dict[str, Any], ident: dict[str, Any], datamodule: Any, name: str) -> None:
    """Resuming a run's own checkpoint on data whose training split has other samples (an image added: every
    split drawn anew, test images among the training ones) is a ConfigError naming the change; another run's
    is not checked."""
    trained, ids = checkpoint.get(TRAIN_SAMPLES_KEY), getattr(datamodule, "sample_ids", None)
    own = (checkpoint.get("identity") or {}).get("digest") == digest(ident)
    if not own or trained is None or not isinstance(ids, dict) or ids.get("train") is None:
        return
    now = ids["train"]
    added, removed = int((~torch.isin(now, trained)).sum()), int((~torch.isin(trained, now)).sum())
    if added or removed:
        raise ConfigError(
            f"the data changed since {name}: its training split now has {added} sample(s) it did not "
            f"have and lacks {removed} it had (files added to or removed from the data set?), so every "
            "split would be drawn anew and test samples trained on: restore the data, or train anew with "
            "run_name=<new name>"
        )
