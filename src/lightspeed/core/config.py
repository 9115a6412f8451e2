"""Validation of the composed config: one place, one line per mistake, before any work starts. Hydra rejects
unknown groups, options and keys (struct mode); this checks what it cannot know (types, ranges, what this
machine can run)."""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lightspeed import CONF_DIRS
from lightspeed.core.schema import FOLDER_NAME, SCHEMA, is_int, is_number

#: Exit code for a bad config (training failures exit 1, like any Python error).
CONFIG_ERROR_EXIT = 2


class ConfigError(ValueError):
    """A setting has a value Lightspeed cannot run with; the message names the key and the fix."""


def first_line(err: BaseException) -> str:
    """The first line of an error's message (its type's name if empty): what a one-line error quotes."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


@contextmanager
def exit_on_config_error() -> Iterator[None]:
    """Turn a ConfigError into one line on stderr and exit code 2, instead of a traceback."""
    try:
        yield
    except ConfigError as err:
        line = str(err).strip()
        if "\n" in line:  # raised in a DataLoader worker: the worker's traceback, then its own line
            line = re.sub(r"^[\w.]+Error: ", "", line.splitlines()[-1])
        print(f"error: {line}", file=sys.stderr)
        raise SystemExit(CONFIG_ERROR_EXIT) from None


@contextmanager
def writing_run_folder() -> Iterator[None]:
    """An OSError writing a run's own files (a read-only folder, a folder where a file goes) as one line."""
    try:
        yield
    except OSError as err:
        where = err.filename2 or err.filename or "the run folder"
        raise ConfigError(
            f"cannot write {where} ({err.strerror or err}): make it writable and move what is in its way, or "
            "run elsewhere (run_name=<new name> or paths.log_dir=<folder>)"
        ) from None


_ABSENT = object()


def locate(path: str) -> Any:
    """The object an import path names, found as Hydra's `get_object` does minus its ERROR log: a one-line
    ImportError names the missing module or name; a bug inside the module keeps its traceback."""
    names = path.split(".")
    for cut in range(len(names), 0, -1):
        module = ".".join(names[:cut])
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name is not None and (module == err.name or module.startswith(f"{err.name}.")):
                continue  # this prefix is no module: a shorter one may be, the rest its attributes
            raise ImportError(str(err)) from None  # a module that it imports is missing
        for name in names[cut:]:
            if not hasattr(found, name):
                raise ImportError(f"{module} has no {name}")
            found, module = getattr(found, name), f"{module}.{name}"
        return found
    raise ImportError(f"no module named {names[0]}")


def _get(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, default=None)


def plain(node: Any) -> Any:
    """A config node as plain containers (interpolations unresolved); any other value as it is."""
    return OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node


#: The views of `schema.SCHEMA` for the keys that name folders and the retired keys (what to use instead).
FOLDER_KEYS = tuple(k for k, key in SCHEMA.items() if key.folder)
RETIRED = {k: key.retired for k, key in SCHEMA.items() if key.retired is not None}
#: The shipped modules' own rules, which a module of the user's own is not held to.
MODEL_RULES = tuple(k for k in SCHEMA if k.startswith(("model.net.", "model.optimizer.", "model.scheduler.")))


def validate_train(cfg: DictConfig) -> None:
    """Raise ConfigError for the first value that cannot work, naming the key and what is allowed."""
    validate_common(cfg)
    low, high = _get(cfg, "trainer.min_epochs"), _get(cfg, "trainer.max_epochs")
    if is_int(low) and is_int(high) and high != -1 and low > high:
        raise ConfigError(
            f"trainer.min_epochs={low} is more than trainer.max_epochs={high}: lower trainer.min_epochs "
            "(the epochs early stopping waits for) or raise trainer.max_epochs"
        )
    nodes = _get(cfg, "trainer.num_nodes")
    if is_int(nodes) and nodes > 1 and not any(k in os.environ for k in CLUSTER_VARIABLES):
        raise ConfigError(
            f"trainer.num_nodes={nodes} needs each machine's processes started by torchrun or SLURM (none "
            f"started this one, and it would wait for the others): on each machine `torchrun --nnodes "
            f"{nodes} --node-rank <r> --rdzv-endpoint <host>:<port> -m lightspeed.train ...`, or `sbatch "
            "scripts/slurm/train.sbatch ...` (docs/scale.md)"
        )
    _refuse_fsdp_on_cpu(cfg)


def _refuse_fsdp_on_cpu(cfg: DictConfig) -> None:
    """FSDP's strategy node passes the Trainer's checks on a CPU and fails in the fit: refused first."""
    strategy = _get(cfg, "trainer.strategy")
    target = strategy.get("_target_") if isinstance(strategy, DictConfig) else strategy
    on_cpu = _get(cfg, "trainer.accelerator") == "cpu"
    if on_cpu and isinstance(target, str) and re.fullmatch(r"fsdp\w*|.*\.FSDPStrategy", target):
        raise ConfigError(
            "trainer=fsdp needs GPUs (Lightning 2.6 refuses FSDP on a CPU): on a CPU use trainer=ddp_cpu, "
            "with trainer.strategy._target_=lightspeed.resilience.sharded.DDPStrategy for sharded checkpoints"
        )


#: What a launcher of several machines sets (torchrun, SLURM, LSF, Kubeflow, or by hand as Lightning's
#: docs show: MASTER_ADDR and NODE_RANK on each machine).
CLUSTER_VARIABLES = (
    "TORCHELASTIC_RUN_ID",
    "SLURM_NTASKS",
    "LSB_JOBID",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
)


def _select(cfg: DictConfig, key: str) -> Any:
    """The key's value, or _ABSENT; one line where a node on its path is no mapping (a yaml file made
    `model` a list, say) or its value's `${...}` cannot be resolved, where OmegaConf would raise its own."""
    try:
        return OmegaConf.select(cfg, key, default=_ABSENT)
    except (OmegaConfBaseException, ValueError) as err:
        node, path = OmegaConf.to_container(cfg, resolve=False), []
        for part in key.split(".")[:-1]:
            if not isinstance(node, dict) or part not in node:
                break
            node, path = node[part], [*path, part]
        if path and not isinstance(node, dict):
            where = ".".join(path)
            raise ConfigError(
                f"{where}={str(node)[:60]} is no mapping of settings ({type(node).__name__}), but {key} "
                f"belongs in it: a yaml file or a value gave {where} another shape; give it its settings as "
                "key: value lines"
            ) from None
        first = first_line(err)
        raise ConfigError(
            f"{key} cannot be read ({first}): fix the ${{...}} in its value, or set it"
        ) from None


def validate_common(cfg: DictConfig) -> None:
    """The checks that train, eval and shards share. The rules under `model.` are the shipped modules'
    (`lightspeed.models`): a module of the user's own has its constructor's annotations checked instead."""
    skipped = () if str(_get(cfg, "model._target_")).startswith("lightspeed.models.") else MODEL_RULES
    for key, rule in SCHEMA.items():
        value = _select(cfg, key) if rule.check is not None and key not in skipped else _ABSENT
        if value is not _ABSENT and not rule.check(value):  # type: ignore[misc]
            raise ConfigError(f"{key}={value!r} is invalid: use {rule.allowed}")
    val, test = _get(cfg, "data.val_fraction"), _get(cfg, "data.test_fraction")
    if is_number(val) and is_number(test) and val + test >= 1:
        raise ConfigError(
            f"data.val_fraction={val} + data.test_fraction={test} leaves no training data: "
            "keep their sum below 1"
        )
    validate_writable(cfg)


def validate_writable(cfg: DictConfig, run_dir: Path | None = None) -> None:
    """Fail before training, not at the first checkpoint an hour later: `paths.log_dir` and, where given
    (before Hydra makes it), the run's folder are folders this process can write; the run's folder is no
    link (a run name linked to another run's folder: Hydra's files and the run's would go into that one)."""
    folder = Path(str(OmegaConf.select(cfg, "paths.log_dir", default="logs")))
    if run_dir is not None and run_dir.is_symlink():
        raise ConfigError(
            f"the run folder {run_dir} is a link (to {run_dir.resolve()}): a run writes only in its own "
            "folder; remove the link (the files it leads to are kept), or run_name=<new name>"
        )
    for path in (folder, run_dir) if run_dir is not None else (folder,):
        existing = next((p for p in (path, *path.resolve().parents) if p.exists()), None)
        if existing is not None and not (existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)):
            raise ConfigError(
                f"paths.log_dir={folder} cannot be written ({existing} is not a writable folder): make it "
                "writable, or choose a folder you can write to, e.g. paths.log_dir=$HOME/lightspeed-logs"
            )


def flatten(node: Any, sep: str = ".", prefix: str = "") -> dict[str, Any]:
    """Each leaf of a config container by its keys joined with `sep` (an empty mapping is a leaf)."""
    if isinstance(node, dict) and node:
        return {
            k: v for key, value in node.items() for k, v in flatten(value, sep, f"{prefix}{key}{sep}").items()
        }
    return {prefix[: -len(sep)] if prefix else prefix: node}


def check_retired(cfg: DictConfig) -> None:
    """A retired key set in the config; not one beside a `_target_`: that is an argument of an object of
    the user's own (their ModelSummary in a callbacks group of theirs), not our setting."""
    for key, instead in RETIRED.items():
        parent = OmegaConf.select(cfg, key.rpartition(".")[0]) if "." in key else None
        if OmegaConf.select(cfg, key, default=_ABSENT) is not _ABSENT and "_target_" not in (parent or {}):
            raise ConfigError(f"{key} {instead}")


def known_groups() -> set[str]:
    """The folders of conf/ and the engine's groups (not Python's `__pycache__` beside the engine's)."""
    return {g.name for d in CONF_DIRS if d.is_dir() for g in d.iterdir() if g.is_dir() and g.name[0] != "_"}


def check_folder_names(cfg: DictConfig) -> None:
    """Each of FOLDER_KEYS, as resolved (with Hydra's node), is one folder's name: no separator, not `.`
    or `..`. (`hydra.output_subdir` may be null: no .hydra folder.)"""
    ok, allowed = FOLDER_NAME
    for key in FOLDER_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None and not ok(value):
            said = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
            raise ConfigError(f"{key}={said!r} (as resolved) is invalid: use {allowed}")
