"""Tracked runs continue: a rerun of the same command (resume=auto) logs into the MLflow and W&B runs its
first attempt opened (ids kept in the run folder's `tracking.json`, set in the loggers' nodes before they are
built). W&B logs offline without a key (`offline: auto`; `wandb sync` later): never waits for a login."""

from __future__ import annotations

import contextlib
import json
import netrc
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger, MLFlowLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from omegaconf import DictConfig, open_dict

from lightspeed.core.config import ConfigError, exit_on_config_error, first_line, flatten, locate
from lightspeed.core.files import read_regular, write_text_atomically

TRACKING_FILE = "tracking.json"
#: MLflow's waits on a tracking server, where the environment does not set them: its own (7 retries,
#: backoff 2, 120 s a request) waited 4 minutes on a refused port, and 16 minutes on a server that never
#: answers, before a traceback. Here: at most 3 tries of 20 s and 3 s of backoff, then one line.
MLFLOW_WAITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}
#: MLflow's tries at opening a database store: its own 10 (no setting for it) slept 100 s on a SQLite file it
#: cannot open (`sqlite:////proc/x.db`) before a traceback; 3 sleep 0.4 s.
MLFLOW_DB_TRIES = 3
#: What a stored id may be (MLflow's are 32 hex digits, W&B's 8 letters and digits, or the user's own): never
#: an interpolation (`${...}`), a path or a glob.
RUN_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
#: W&B's modes (wandb's Settings.mode): another WANDB_MODE is a pydantic traceback at the logger's start.
WANDB_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")


def _kind(node: Any) -> type | None:
    """MLFlowLogger or WandbLogger, where the node builds one (or a subclass); else None."""
    if node is None or "_target_" not in node:
        return None
    try:
        cls = locate(str(node._target_))
    except (ImportError, ValueError, AttributeError):
        return None  # building it says why, in one line
    return next(
        (k for k in (MLFlowLogger, WandbLogger) if isinstance(cls, type) and issubclass(cls, k)), None
    )


def _stored(run_dir: Path, say: bool = False) -> dict[str, dict[str, str]]:
    """{logger name: {"id": the tracked run's id, "at": where it lives (MLflow's tracking URI, W&B's
    project)}}: data a run wrote for itself, taken only in the shape it was written in; anything else (torn,
    a FIFO, a folder, a link out of the run folder, an id that is no id) is no stored run, in one line."""
    path = run_dir / TRACKING_FILE
    if not os.path.lexists(path):
        return {}
    try:
        found = json.loads(read_regular(path, within=run_dir))
        if not isinstance(found, dict) or not all(map(_is_entry, found.values())):
            raise ValueError("not {logger: {id, at}}")
    except (ValueError, RecursionError) as err:  # RefusedFile is a ValueError
        if say:
            rank_zero_info(f"{path} is not a tracking file ({first_line(err)[:200]}): new tracked runs")
        return {}
    return found


def _is_entry(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and value.keys() == {"id", "at"}
        and isinstance(value["at"], str)
        and isinstance(value["id"], str)
        and RUN_ID.fullmatch(value["id"]) is not None
    )


def _where(node: Any, kind: type) -> str:
    return str(node.get("tracking_uri") if kind is MLFlowLogger else node.get("project"))


def _gone_from_local_store(name: str, node: Any, earlier: dict[str, str]) -> str | None:
    """Why the stored MLflow run cannot be continued, for a local SQLite store: deleted with logs/, deleted in
    the UI, or another run's (its name is not this one's: a copied run folder); None where it can, or for a
    server (asked at logger start: no wait here on one that is down). A store MLflow cannot open: one line."""
    uri = earlier["at"]
    if not uri.startswith("sqlite:"):
        return None
    try:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError:
        return None  # building the logger says, in one line, which extra to install

    with _store_answers(name, node, "MLflow"):
        try:
            run = MlflowClient(tracking_uri=uri).get_run(earlier["id"])
        except MlflowException as err:
            if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            return f"the run {earlier['id']} this run folder logged to is no longer in {uri}"
    if run.info.lifecycle_stage == "deleted":
        return f"the run {earlier['id']} this run folder logged to was deleted from {uri}"
    named = node.get("run_name")
    if named is not None and run.info.run_name != str(named):
        return f"the run {earlier['id']} in {uri} is {run.info.run_name}'s, not {named}'s"
    return None


def _not_this_folders_wandb_run(node: Any, earlier: dict[str, str]) -> str | None:
    """Why the stored W&B id is not this run folder's: no attempt of it under the logger's `save_dir` (W&B
    keeps each attempt in `wandb/*-<id>`: a copied tracking.json names another folder's run)."""
    folder = Path(str(node.get("save_dir") or ".")) / "wandb"
    if any(folder.glob(f"*-{earlier['id']}")):
        return None
    return f"the W&B run {earlier['id']} has no attempt in {folder}"


def has_wandb_key() -> bool:
    """A W&B key set for this user: WANDB_API_KEY, or the entry `wandb login` writes into ~/.netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def continue_runs(cfg: DictConfig) -> None:
    """Into each MLflow or W&B logger node whose id is unset, the id this run folder's earlier attempt
    stored; W&B's `offline: auto` resolved (offline without a key, unless WANDB_MODE says otherwise)."""
    nodes = cfg.get("logger") or {}
    kinds = {name: _kind(node) for name, node in nodes.items()}
    if MLFlowLogger in kinds.values():
        _bound_mlflow_waits()
    if WandbLogger in kinds.values():
        _check_wandb_mode()
    stored = _stored(Path(cfg.paths.output_dir), say=True)
    with open_dict(cfg):
        for name, node in nodes.items():
            if kinds[name] is not None:
                _settle(name, node, kinds[name], stored.get(name))


def _settle(name: str, node: Any, kind: type, earlier: dict[str, str] | None) -> None:
    if kind is MLFlowLogger:
        _open_store(name, node)
    if earlier is not None:
        _continue(name, node, kind, earlier)
    if kind is WandbLogger and node.get("offline") == "auto":
        _offline_unless_logged_in(name, node)


def _check_wandb_mode() -> None:
    mode = os.environ.get("WANDB_MODE")
    if mode is not None and mode not in WANDB_MODES:
        raise ConfigError(
            f"WANDB_MODE={mode} is not a W&B mode: set it to offline, online or disabled, or unset it"
        )


def _bound_mlflow_waits() -> None:
    """MLflow's waits on a server (MLFLOW_WAITS, where the environment does not set them: DDP's ranks inherit
    them) and its tries at opening a database store, bounded before its first request."""
    for name, value in MLFLOW_WAITS.items():
        os.environ.setdefault(name, value)
    with contextlib.suppress(ImportError):  # building the logger says which extra to install
        from mlflow.store.db import utils

        utils.MAX_RETRY_COUNT = min(getattr(utils, "MAX_RETRY_COUNT", MLFLOW_DB_TRIES), MLFLOW_DB_TRIES)


def _open_store(name: str, node: Any) -> None:
    """MLflow's store opened before the logger is built, so that one it cannot open (a SQLite file it cannot
    write, a scheme it does not know, a file store it refuses) is one line naming the setting, not a
    traceback from the logger's constructor; a server is not asked here."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        return  # building the logger says, in one line, which extra to install
    uri = node.get("tracking_uri") or f"file:{node.get('save_dir') or './mlruns'}"  # MLFlowLogger's fallback
    with _store_answers(name, node, "MLflow"):
        MlflowClient(tracking_uri=uri)


def _continue(name: str, node: Any, kind: type, earlier: dict[str, str]) -> None:
    """The earlier attempt's tracked run, where it lives where this node logs, still exists and is this
    folder's; else a new one there, in one line."""
    key = "run_id" if kind is MLFlowLogger else "id"
    if node.get(key) is not None:
        return
    if earlier["at"] != _where(node, kind):
        rank_zero_info(
            f"logger.{name}: this run's earlier attempts logged to {earlier['at']}, not "
            f"{_where(node, kind)}: a new tracked run there"
        )
        return
    if kind is MLFlowLogger:
        gone = _gone_from_local_store(name, node, earlier)
    else:
        gone = _not_this_folders_wandb_run(node, earlier)
    if gone:
        rank_zero_info(f"logger.{name}: {gone}: a new tracked run there")
        return
    node[key] = earlier["id"]


def _offline_unless_logged_in(name: str, node: Any) -> None:
    node.offline = not has_wandb_key() and os.environ.get("WANDB_MODE") is None
    if node.offline:
        rank_zero_info(
            f"logger.{name}: no W&B key (WANDB_API_KEY or `wandb login`): logging offline "
            f"under {node.get('save_dir')}/wandb; upload later: `wandb sync <that folder>`"
        )


@rank_zero_only
def remember(cfg: DictConfig, loggers: list[Logger]) -> None:
    """Store the ids of the MLflow and W&B runs the loggers opened (asking for an id opens the run) in
    `tracking.json`, whole or not at all, for the next attempt of this run."""
    nodes = {
        n: node for n, node in (cfg.get("logger") or {}).items() if node is not None and "_target_" in node
    }
    pairs = zip(nodes.items(), loggers, strict=False)  # built in this order
    found = {name: tracked for (name, node), logger in pairs if (tracked := _tracked_run(node, logger))}
    run_dir = Path(cfg.paths.output_dir)
    stored = _stored(run_dir)
    if found and stored != {**stored, **found}:
        _write(run_dir / TRACKING_FILE, {**stored, **found})


def _write(path: Path, entries: dict[str, dict[str, str]]) -> None:
    try:
        write_text_atomically(path, json.dumps(entries, indent=2) + "\n")
    except OSError as err:  # a folder of that name, a full disk
        raise ConfigError(
            f"{path} cannot be written ({err.strerror or err}): remove it or free the space; without it a "
            "rerun opens new tracked runs"
        ) from None


def _tracked_run(node: Any, logger: Logger) -> dict[str, str] | None:
    """{"id": the run the MLflow or W&B logger opened, "at": where it lives}; None for other loggers."""
    if isinstance(logger, MLFlowLogger) and logger.run_id:
        return {"id": str(logger.run_id), "at": _where(node, MLFlowLogger)}
    if isinstance(logger, WandbLogger) and logger.version:
        return {"id": str(logger.version), "at": _where(node, WandbLogger)}
    return None


@rank_zero_only
def log_config(config: dict[str, Any], loggers: list[Logger]) -> None:
    """The resolved config into every logger, minus the tracked runs' ids; a continued MLflow run keeps its
    first params (MLflow refuses to change one): only new keys are added, and changed ones named."""
    config = {**config, "logger": {n: _as_logged(node) for n, node in (config.get("logger") or {}).items()}}
    nodes = [
        (n, node) for n, node in config["logger"].items() if isinstance(node, dict) and "_target_" in node
    ]
    for (name, node), logger in zip(nodes, loggers, strict=False):  # built in this order
        if isinstance(logger, MLFlowLogger):
            _log_new_params(name, node, logger, config)
            continue
        reaching = (
            _store_answers(name, node, "W&B") if isinstance(logger, WandbLogger) else contextlib.nullcontext()
        )
        with exit_on_config_error(), reaching:  # W&B's first request: before training
            logger.log_hyperparams(config)


def _log_new_params(name: str, node: dict[str, Any], logger: MLFlowLogger, config: dict[str, Any]) -> None:
    """Into a (continued) MLflow run, the keys it has not logged; the changed ones named."""
    with exit_on_config_error(), _store_answers(name, node, "MLflow"):  # its first request: before training
        kept = logger.experiment.get_run(logger.run_id).data.params
    flat = flatten(config, "/")  # as Lightning's loggers flatten it
    changed = sorted(k for k, v in flat.items() if k in kept and kept[k] != str(v)[:250])
    if changed:
        rank_zero_info(
            f"MLflow keeps the first attempt's values of {', '.join(changed[:5])}"
            f"{' ...' if len(changed) > 5 else ''} (it does not change a logged param); this attempt's "
            "are in the run folder's .hydra/config.yaml"
        )
    logger.log_hyperparams({k: v for k, v in flat.items() if k not in kept})


#: Where MLflow's and W&B's errors at reaching their store come from (a SQLite file: sqlalchemy's).
_THEIRS = ("mlflow", "wandb", "requests", "urllib3", "sqlalchemy", "sqlite3")


@contextlib.contextmanager
def _store_answers(name: str, node: dict[str, Any], kind: str) -> Iterator[None]:
    """MLflow's or W&B's failure to reach or use its store (a server that is down or never answers, a
    `databricks` URI without credentials) as one line, after the waits MLFLOW_WAITS bounds (W&B's own
    init_timeout, 90 s, bounds its)."""
    try:
        yield
    except Exception as err:
        if type(err).__module__.split(".")[0] not in _THEIRS:
            raise
        said = str(err).strip()
        # the reason inside the text of requests' and urllib3's nested errors
        reason = re.search(r"\[Errno -?\d+\] [^'\")]*|Read timed out|timed out", said)
        cause = reason.group(0) if reason else first_line(err)[:200]
        if kind == "W&B":
            raise ConfigError(
                f"logger.{name}: W&B cannot log ({cause}): check the network and WANDB_BASE_URL, or log "
                f"offline (logger.{name}.offline=true; `wandb sync` later), or logger=csv"
            ) from None
        uri = node.get("tracking_uri")
        raise ConfigError(
            f"logger.{name}.tracking_uri={uri}: MLflow cannot log there ({cause}): start that server, set "
            f"logger.{name}.tracking_uri (or MLFLOW_TRACKING_URI) to one that answers, or log locally: "
            "logger=csv, or logger=mlflow without a tracking_uri (logs/mlflow.db)"
        ) from None


def _as_logged(node: Any) -> Any:
    """A logger's node as logged: no tracked run's id, and no password of a tracking URI
    (`https://user:secret@host` is logged as `https://***@host`)."""
    if not isinstance(node, dict):
        return node
    node = {k: v for k, v in node.items() if k not in ("run_id", "id")}
    if isinstance(node.get("tracking_uri"), str):
        node["tracking_uri"] = re.sub(r"^([a-z][\w+.-]*://)[^/@]*@", r"\1***@", node["tracking_uri"])
    return node
