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
from lightspeed.core.files import read_json, write_text_atomically

TRACKING_FILE = "tracking.json"
#: MLflow's waits on a tracking server, where the environment does not set them: its own (7 retries,
#: backoff 2, 120 s a request) waited 4 minutes on a refused port, and 16 minutes on a server that never
#: answers, before a traceback. Here: at most 3 tries of 20 s and 3 s of backoff, then one line.
MLFLOW_WAITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}


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


def _stored(run_dir: Path) -> dict[str, dict[str, str]]:
    """{logger name: {"id": the tracked run's id, "at": where it lives (MLflow's tracking URI, W&B's
    project)}}: data a run wrote for itself, read with care (anything else is no stored run)."""
    found = read_json(run_dir / TRACKING_FILE)
    if not isinstance(found, dict):
        return {}
    return {
        k: {"id": v["id"], "at": v["at"]}
        for k, v in found.items()
        if isinstance(v, dict) and isinstance(v.get("id"), str) and isinstance(v.get("at"), str)
    }


def _where(node: Any, kind: type) -> str:
    return str(node.get("tracking_uri") if kind is MLFlowLogger else node.get("project"))


def _gone_from_local_store(earlier: dict[str, str]) -> str | None:
    """Why the stored MLflow run cannot be continued, for a local SQLite store (deleted with logs/, say); None
    where it can, or for a server (asked at logger start: no wait here on one that is down)."""
    uri = earlier["at"]
    if not uri.startswith("sqlite:"):
        return None
    try:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError:
        return None  # building the logger says, in one line, which extra to install

    try:
        run = MlflowClient(tracking_uri=uri).get_run(earlier["id"])
    except MlflowException:
        return f"the run {earlier['id']} this run folder logged to is no longer in {uri}"
    if run.info.lifecycle_stage == "deleted":
        return f"the run {earlier['id']} this run folder logged to was deleted from {uri}"
    return None


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
    stored = _stored(Path(cfg.paths.output_dir))
    if any(_kind(node) is MLFlowLogger for node in nodes.values()):
        for name, value in MLFLOW_WAITS.items():  # before any request; DDP's ranks inherit them
            os.environ.setdefault(name, value)
    with open_dict(cfg):
        for name, node in nodes.items():
            kind = _kind(node)
            if kind is not None and stored.get(name) is not None:
                _continue(name, node, kind, stored[name])
            if kind is WandbLogger and node.get("offline") == "auto":
                _offline_unless_logged_in(name, node)


def _continue(name: str, node: Any, kind: type, earlier: dict[str, str]) -> None:
    """The earlier attempt's tracked run, where it lives where this node logs and still exists; else a new
    one there, in one line."""
    key = "run_id" if kind is MLFlowLogger else "id"
    if node.get(key) is not None:
        return
    if earlier["at"] != _where(node, kind):
        rank_zero_info(
            f"logger.{name}: this run's earlier attempts logged to {earlier['at']}, not "
            f"{_where(node, kind)}: a new tracked run there"
        )
        return
    gone = _gone_from_local_store(earlier) if kind is MLFlowLogger else None
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
        write_text_atomically(run_dir / TRACKING_FILE, json.dumps({**stored, **found}, indent=2) + "\n")


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


@contextlib.contextmanager
def _store_answers(name: str, node: dict[str, Any], kind: str) -> Iterator[None]:
    """MLflow's or W&B's failure to reach or use its store (a server that is down or never answers, a
    `databricks` URI without credentials) as one line, after the waits MLFLOW_WAITS bounds (W&B's own
    init_timeout, 90 s, bounds its)."""
    try:
        yield
    except Exception as err:
        if type(err).__module__.split(".")[0] not in ("mlflow", "wandb", "requests", "urllib3"):
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
