"""A checkpoint back into its LightningModule, for eval and export: which file (`latest`: the newest run's
best), which class (the trust boundary: a class the checkpoint names must be one conf/ names, or the
command line's `module=`), and its weights, on the CPU and loaded without running code."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from lightspeed import CONF_DIRS
from lightspeed.core import summary
from lightspeed.core.config import ConfigError, locate, plain
from lightspeed.core.files import read_json, read_regular
from lightspeed.resilience import checkpoint, verify
from lightspeed.resilience.identity import MODEL_CONFIG_KEY
from lightspeed.resilience.resume_from import check_checkpoint_path
from lightspeed.run import build

# The trust boundary (docs/resilience.md): the command line and conf/ are code the user runs; data (a
# checkpoint from elsewhere) never chooses what code runs: it may name only a class that conf/ names.


def conf_targets(group: str | None = None) -> frozenset[str]:
    """Every class named by `_target_` in the project's `conf/` or the engine's groups (exact names, block or
    flow style): what data (a checkpoint) may name beside the repository's own models and data sets. With
    `group`, only what conf/ names for that node (its option files, and its node in others: an experiment's
    `data:`): a checkpoint's data config may not name a logger that conf/logger names."""
    import yaml

    found: set[str] = set()
    for folder, path in ((d, p) for d in CONF_DIRS for p in d.rglob("*.yaml")):
        try:
            tree = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue
        inside = group is None or path.relative_to(folder).parts[0] == group
        found |= {t for key, t in _targets(tree, "") if inside or f"{key}.".startswith(f"{group}.")}
    return frozenset(t for t in found if isinstance(t, str) and not t.startswith("${"))


def user_packages(targets: frozenset[str]) -> tuple[str, ...]:
    """The `<package>.models.` and `<package>.data.` prefixes of the user's part: this repository's own
    (lightspeed) and that of each package whose models or data sets conf/ names (a project's own)."""
    found = {"lightspeed"} | {t.split(".")[0] for t in targets if re.match(r"\w+\.(models|data)\.", t)}
    return tuple(f"{package}.{part}." for package in sorted(found) for part in ("models", "data"))


def _repository_class(target: str, prefixes: tuple[str, ...]) -> bool:
    """A class of the user's own `models/` or `data/` (`prefixes`: an nn.Module, a LightningModule or a
    LightningDataModule defined there), which data may name too."""
    import lightning as L

    if not target.startswith(prefixes):
        return False
    try:
        found = locate(target)
    except Exception:
        return False
    home = f"{getattr(found, '__module__', '') or ''}."
    return (
        isinstance(found, type)
        and home.startswith(prefixes)
        and issubclass(found, (torch.nn.Module, L.LightningDataModule))
    )


def check_data_targets(node: dict[str, Any], where: str, command_line: str = "") -> None:
    """Refuse, in one line, a `_target_` in data (`where`: a checkpoint's config or hyperparameters; `node`:
    {"model" or "data": its node}) that no conf/ yaml names for that node, nor the `command_line` of the run
    that wrote it, and that is no model, net or data set of the repository's own `models/` and `data/`."""
    group = next(iter(node))
    known = conf_targets(group) | set(re.findall(r"_target_['\"]?\s*[=:]\s*['\"]?([\w.]+)", command_line))
    prefixes = user_packages(known)
    for key, target in _targets(plain(node), ""):
        if not isinstance(target, str) or not (target in known or _repository_class(target, prefixes)):
            raise ConfigError(
                f"{where} names {key}._target_={target}, a class that no yaml file of conf/ names for "
                f"{group}: data cannot choose what code runs; name it in conf/ (a conf/model/ or conf/data/ "
                "option), or on the command line (module=...), if you trust it"
            )


def _targets(node: Any, path: str) -> list[tuple[str, Any]]:
    """(the node's dotted path, the value) of every `_target_` in a container."""
    has = isinstance(node, dict) and "_target_" in node
    found: list[tuple[str, Any]] = [(path.rstrip(".") or "<root>", node["_target_"])] if has else []
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in children:
        found += _targets(value, f"{path}{key}.")
    return found


def find_checkpoint(ckpt_path: str, log_dir: Path) -> Path:
    """`latest`: the best checkpoint of the newest training run under `log_dir/train` that has one;
    anything else is a path."""
    if ckpt_path != "latest":
        path = Path(ckpt_path)
        check_checkpoint_path(path)
        return path
    files = [p for p in (log_dir / "train").glob(f"**/{summary.SUMMARY_FILE}") if p.is_file()]  # not a fifo
    runs = sorted(files, key=lambda p: p.stat().st_mtime)
    for found in reversed(runs):  # newest first; runs without a best checkpoint (debug=fdr) are skipped
        path = _best_of(found)
        if path is not None and (path.is_file() or _sharded(path)):
            return path
    raise ConfigError(
        f"ckpt_path=latest found no training run with a best checkpoint under {log_dir / 'train'}: "
        "run `make train` first, or pass ckpt_path=path/to/file.ckpt"
    )


def _best_of(summary_file: Path) -> Path | None:
    """The best checkpoint a run's summary names, in the folder the summary is in now (a moved run)."""
    record = read_json(summary_file, within=summary_file.parent)  # None: torn, not JSON, a link out...
    best = record.get("best_checkpoint") if isinstance(record, dict) else None
    if not isinstance(best, str) or not best:
        return None
    path = Path(best)
    if not path.exists() and isinstance(record.get("run_dir"), str):  # the run's folder was moved
        with contextlib.suppress(ValueError):
            path = summary_file.parent / path.relative_to(record["run_dir"])
    return path


def load_module(cfg: DictConfig) -> tuple[Path, dict[str, Any], L.LightningModule]:
    """The checkpoint `cfg.ckpt_path` names (`latest`: the newest run's best), its stored dict, and the
    LightningModule that trained it with its weights, on the CPU; one line if it cannot be, or is unsound."""
    ckpt = find_checkpoint(str(cfg.ckpt_path), Path(cfg.paths.log_dir))
    # map_location="cpu": a checkpoint saved on a GPU loads on any machine; the Trainer then moves
    # the model to whatever device this run uses. weights_only: loading never executes code.
    sharded: Any = None
    if ckpt.is_dir():  # sharded (trainer=fsdp): gathered into one checkpoint in memory, on the CPU
        from lightspeed.resilience import sharded  # only for one: it loads DCP

        reason = sharded.problem(ckpt)
        if reason is not None:
            raise ConfigError(f"ckpt_path={ckpt} cannot be evaluated: {reason}; pass another checkpoint")
    with checkpoint.loading(ckpt):
        source = sharded.one_file_bytes(ckpt) if sharded is not None else ckpt
        stored = torch.load(source, map_location="cpu", weights_only=True, mmap=not ckpt.is_dir())
        node = _module_node(cfg, stored, ckpt)
        try:
            model = build.instantiate(OmegaConf.create(node), "model", _convert_="all")
        except ConfigError as err:  # its node or hyperparameters are not the class's arguments
            raise ConfigError(
                f"ckpt_path={ckpt}: its model does not rebuild ({err}): pass another checkpoint, or "
                "module=<the class that trained it>"
            ) from None
        if not isinstance(model, L.LightningModule):  # a `_partial_` at its top, say
            raise ConfigError(
                f"ckpt_path={ckpt}: its model node builds a {type(model).__name__}, not a module"
            )
        weights = stored.get("state_dict")
        if not isinstance(weights, dict):
            raise ConfigError(
                f"ckpt_path={ckpt} holds no weights (its state_dict is {type(weights).__name__}, not a "
                "mapping of tensors): pass another checkpoint"
            )
        model.on_load_checkpoint(stored)
        model.load_state_dict(weights)
    # it loads: is it sound? (a NaN model scores as if it were; a folder's files were checked above)
    reason = checkpoint.nonfinite_weights(stored) if ckpt.is_dir() else verify.problem(ckpt)
    if reason is not None:
        raise ConfigError(f"ckpt_path={ckpt} cannot be evaluated: {reason}; pass another checkpoint")
    return ckpt, stored, model


def _module_node(cfg: DictConfig, stored: dict[str, Any], ckpt: Path) -> dict[str, Any]:
    """What rebuilds the module that trained the checkpoint: its run's model node (`MODEL_CONFIG_KEY`; from
    before it was kept: the class its run's config names with its hyperparameters), the class replaced by
    `module` when given (the command line, code the user runs). The node is data: each `_target_` in it must
    be one that conf/ names, or its run's command line (`.hydra/overrides.yaml` beside its checkpoints)."""
    node, command_line = stored.get(MODEL_CONFIG_KEY), ran(ckpt, Path(cfg.paths.log_dir))  # read once
    if not isinstance(node, dict):  # an older checkpoint: its class, with its plain hyperparameters
        node = _legacy_node(stored, ckpt, command_line)
    name = cfg.get("module") or node.get("_target_")
    where = "module" if cfg.get("module") else f"{ckpt.name}: model"
    if not name:
        raise ConfigError(
            f"ckpt_path={ckpt} names no LightningModule class (saved outside Lightspeed): pass "
            "module=<its class>, e.g. module=lightspeed.models.classifier.Classifier"
        )
    # the command line's class is the user's; what the checkpoint names is checked, and holds plain values
    # (built as resolved: a resolver such as ${oc.create:...} would build objects no check has seen)
    named = {k: v for k, v in node.items() if k != "_target_" or not cfg.get("module")}
    check_plain(named, f"{ckpt.name}'s model", "pass another checkpoint")
    check_data_targets({"model": named}, ckpt.name, command_line)
    node = {**node, "_target_": str(name)}
    _check_module_class(str(name), where)
    return node


def _legacy_node(stored: dict[str, Any], ckpt: Path, command_line: str) -> dict[str, Any]:
    """An older checkpoint's module: the class its run's config names, with its hyperparameters (each of
    Lightning's older names for them merged, each checked as data)."""
    hparams: dict[str, Any] = {}
    for key in ("module_arguments", "hparams", "hyper_parameters"):
        if not isinstance(stored.get(key) or {}, dict):
            raise ConfigError(
                f"ckpt_path={ckpt}: its {key} is a {type(stored[key]).__name__}, not the module's "
                "arguments: pass another checkpoint"
            )
        check_data_targets({"model": stored.get(key) or {}}, ckpt.name, command_line)
        hparams.update(stored.get(key) or {})
    return {**hparams, "_target_": _run_target(stored), "_recursive_": False}


def _check_module_class(name: str, where: str) -> None:
    try:
        found = locate(name)
    except (ImportError, ValueError) as err:
        raise ConfigError(f"{where}: {name} cannot be imported ({err}): pass module=<its class>") from None
    if not (isinstance(found, type) and issubclass(found, L.LightningModule)):
        raise ConfigError(f"{where}: {name} is not a LightningModule class: pass module=<its class>")


def ran(ckpt: Path, log_dir: Path) -> str:
    """The command line of the run whose checkpoint this is, whose `_target_`s the user named: Hydra's
    `.hydra/overrides.yaml` in the run's folder, for a run under this machine's `paths.log_dir` (the
    overrides alone, as a list of strings); empty for a checkpoint from elsewhere."""
    import yaml

    folder = ckpt.resolve().parent.parent
    overrides = folder / ".hydra" / "overrides.yaml"
    if not folder.is_relative_to(log_dir.resolve()):
        return ""
    try:  # a regular file in the run's folder, a few kB at most: not a FIFO, a device or a link out
        found = yaml.safe_load(read_regular(overrides, within=folder, most=65536).decode())
    except (ValueError, yaml.YAMLError):  # RefusedFile, UnicodeDecodeError
        return ""
    return "\n".join(o for o in found if isinstance(o, str)) if isinstance(found, list) else ""


def check_stored_data(run_data: dict[str, Any], ckpt: Path, given: list[str]) -> None:
    """A checkpoint's data config is data: it names only classes conf/ names, holds plain values, and
    chooses neither the folder eval writes into (only one under this machine's paths.*) nor a server."""
    check_data_targets({"data": run_data}, f"{ckpt.name}'s data config")
    check_plain(run_data, f"{ckpt.name}'s data config")
    folder = run_data.get("data_dir")
    if folder is not None and not str(folder).startswith("${paths.") and "data.data_dir" not in given:
        raise ConfigError(
            f"{ckpt.name}'s data config keeps its data at a fixed path ({folder}): a checkpoint does not "
            "choose where eval writes; pass ++data.data_dir=<where the data is> on the command line"
        )


#: The one interpolation a stored data config may hold: a path of this machine's (`${paths.data_dir}`).
_PLAIN_INTERPOLATION = re.compile(r"\$\{paths\.[A-Za-z_]\w*\}")


def check_plain(node: Any, where: str, fix: str = "pass the data on the command line (data=...)") -> None:
    """Data holds plain values: an interpolation other than `${paths.<key>}` (a resolver such as
    `${oc.create:...}` builds and can call objects; chained ones grow without bound) is refused."""
    if isinstance(node, (dict, list)):
        for value in node.values() if isinstance(node, dict) else node:
            check_plain(value, where, fix)
    elif isinstance(node, str) and "${" in _PLAIN_INTERPOLATION.sub("", node):
        raise ConfigError(
            f"{where} holds an interpolation ({node[:60]}): a checkpoint is data, its config plain values "
            f"(and ${{paths.*}}) only; {fix}"
        )


def _sharded(path: Path) -> bool:
    if not path.is_dir():
        return False
    from lightspeed.resilience import sharded

    return sharded.is_sharded(path)


def _run_target(stored: dict[str, Any]) -> Any:
    """The `model._target_` of the config that trained the checkpoint (None for one saved elsewhere)."""
    found: Any = stored
    for key in ("identity", "config", "model", "_target_"):
        found = found.get(key) if isinstance(found, dict) else None
    return found
