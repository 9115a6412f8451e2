"""`make train hparams_search=<name>`: an Optuna search over the run's config, driven from here (Optuna's
ask and tell around `train()`), not through a Hydra sweeper plugin: nothing between Optuna and the runs
to keep working across releases. The study lives in the search's run folder (SQLite), so the same
command, killed, continues it: a trial that was running when it died is run again with the same values,
and the sampler is seeded by the number of finished trials, so a continued search draws what an
uninterrupted one draws. Each trial is a whole run in `<search folder>/trials/<number>`; trials whose
validation metric falls behind are pruned (Optuna's pruner, told at every validation)."""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_info
from omegaconf import DictConfig, OmegaConf, open_dict

from lightspeed.core.boundary import boundary
from lightspeed.core.config import (
    CONFIG_ERROR_EXIT,
    ConfigError,
    exit_on_config_error,
    first_line,
    validate_train,
)
from lightspeed.core.failures import TRAINING_FAILURE_EXIT
from lightspeed.core.files import write_text_atomically
from lightspeed.resilience import lock
from lightspeed.run import monitor

SEARCH_FILE = "search.json"
#: Trials a search may ask for without a time budget (`timeout_s`): more is a search that never ends.
MAX_TRIALS_WITHOUT_BUDGET = 1000


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError(
            "hparams_search needs Optuna: make install EXTRAS=dev,search (pip install -e '.[search]')"
        ) from None
    return optuna


class PruneOnValidation(L.Callback):
    """Tells the trial the monitored metric after each validation (the sanity check left out) and stops
    training when the pruner says the trial falls behind; `pruned` then says so."""

    def __init__(self, trial: Any, metric: str) -> None:
        self.trial, self.metric, self.pruned = trial, metric, False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get(self.metric)
        if trainer.sanity_checking or value is None:
            return
        self.trial.report(float(value), step=trainer.current_epoch)
        if self.trial.should_prune():
            self.pruned = trainer.should_stop = True


def distribution(optuna: Any, key: str, spec: Any) -> Any:
    """A list: a choice of values; {low, high}: a range (log: true for a log scale; step: a grid), of
    integers where both ends are; one line naming the key where Optuna refuses it (low > high, say)."""
    why = ""
    try:
        if isinstance(spec, list) and spec:
            return optuna.distributions.CategoricalDistribution(spec)
        if isinstance(spec, dict) and {"low", "high"} <= set(spec):
            low, high, log, step = spec["low"], spec["high"], bool(spec.get("log", False)), spec.get("step")
            if isinstance(low, int) and isinstance(high, int) and not log:
                return optuna.distributions.IntDistribution(low, high, step=1 if step is None else step)
            return optuna.distributions.FloatDistribution(float(low), float(high), log=log, step=step)
    except (ValueError, TypeError) as err:
        why = f" ({first_line(err)})"
    raise ConfigError(
        f"hparams_search.params.{key}={spec!r} is invalid{why}: use a list of choices, or {{low: .., "
        "high: ..} (log: true for a log scale; step: a grid)"
    )


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{dotted key: its range or choice}: a list or a mapping with `low` ends a key, a mapping goes on."""
    found: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and "low" not in value and "high" not in value:
            found |= _leaves(value, f"{prefix}{key}.")
        else:
            found[f"{prefix}{key}"] = value
    return found


def run(cfg: DictConfig, train: Any) -> float | None:
    """Run (or continue) the search `cfg.hparams_search` describes, each trial `train(trial_cfg,
    callbacks)`; returns the best trial's score and writes `search.json` beside the study. One search
    a folder, as one run: a second would take the first's running trial for one cut short."""
    with exit_on_config_error():  # its settings, once before the first trial: not refused trial by trial
        validate_train(cfg)
        if cfg.trainer.get("devices", 1) != 1 or cfg.trainer.get("num_nodes", 1) != 1:
            raise ConfigError(
                "hparams_search cannot drive a multi-process trainer (trainer.devices or num_nodes above 1): "
                "Lightning relaunches this command for each rank, and each would run its own search; search "
                "on one device (trainer=cpu or trainer=gpu)"
            )
        monitor.settle(cfg)
        for key in ("sampler", "pruner"):  # Optuna's classes, or none
            node = cfg.hparams_search.get(key)
            if node is not None and not (OmegaConf.is_dict(node) and "_target_" in node):
                raise ConfigError(
                    f"hparams_search.{key}={node!r} is invalid: give a node naming the class in _target_ "
                    f"(optuna.{key}s.<Class>), or null for Optuna's default"
                )
        if cfg.get("ckpt_path") is not None:
            from lightspeed.resilience.resume_from import check_checkpoint_path

            check_checkpoint_path(Path(str(cfg.ckpt_path)), "or ckpt_path=null")
    folder = Path(cfg.paths.output_dir)
    with lock.held(folder):
        return _search(cfg, train, folder)


# radon C: killed trials rerun; pruned/failed/scored
# radon C: one study, its cut trials, then ask/train/tell until n_trials
def _search(cfg: DictConfig, train: Any, folder: Path) -> float | None:
    optuna = _optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    search = cfg.hparams_search
    metric, mode = cfg.monitor.metric, cfg.monitor.mode
    deadline = _deadline(search.n_trials, search.get("timeout_s"))
    space = {k: distribution(optuna, k, v) for k, v in _leaves(OmegaConf.to_container(search.params)).items()}
    direction = "maximize" if mode == "max" else "minimize"
    with _study_file(folder):
        study = optuna.create_study(
            study_name=str(search.get("study_name") or folder.name),
            storage=f"sqlite:///{folder.resolve() / 'study.db'}",
            direction=direction,
            pruner=instantiate(search.pruner) if search.get("pruner") else optuna.pruners.NopPruner(),
            load_if_exists=True,
        )
        if [d.name.lower() for d in study.directions] != [direction]:
            raise ValueError(f"its directions are {[d.name for d in study.directions]}, not [{direction}]")
        for trial in study.get_trials(states=(optuna.trial.TrialState.RUNNING,)):  # killed with the search
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            study.enqueue_trial(trial.params)
            rank_zero_info(f"hparams_search: trial {trial.number} was cut short: running its values again")
    while True:
        with _study_file(folder):
            done = len(_finished(optuna, study))
        if done >= search.n_trials:
            break
        if time.monotonic() >= deadline:
            rank_zero_info(
                f"hparams_search: timeout_s={search.timeout_s} is spent after {done} finished trials of "
                f"{search.n_trials}: the same command continues the search"
            )
            break
        seed = int(search.get("seed", 0)) + done  # optional keys as Optuna's defaults: TPE
        sampler = search.get("sampler")
        study.sampler = instantiate(sampler, seed=seed) if sampler else optuna.samplers.TPESampler(seed=seed)
        with _study_file(folder):
            trial = study.ask(space)
        trial_cfg = _trial_config(cfg, trial.params, folder / "trials" / str(trial.number))
        prune = PruneOnValidation(trial, metric)
        try:
            with boundary(f"hparams_search trial {trial.number}"):
                score = train(trial_cfg, [prune])
        except SystemExit as stop:  # its one line is printed; a bad setting (2) or a training failure (3)
            if stop.code not in (CONFIG_ERROR_EXIT, TRAINING_FAILURE_EXIT):
                raise  # preempted, interrupted: the trial stays running, and a rerun runs it again
            score, failed = None, f"exit {stop.code}"
        else:
            failed = None if score is not None or prune.pruned else "no score (no validation?)"
        with _study_file(folder):
            _tell(optuna, study, trial, score, failed, prune.pruned)
        said = "pruned" if prune.pruned else f"failed ({failed})" if failed else score
        rank_zero_info(f"hparams_search: trial {trial.number} {said}: {trial.params}")
    with _study_file(folder):
        return _report(study, folder)


def _deadline(n_trials: Any, timeout_s: Any) -> float:
    """When this invocation starts no more trials: `timeout_s` from now (a rerun gets its own), else never;
    a count of trials that is no count, or too large to end without a budget, is one line."""
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise ConfigError(
            f"hparams_search.n_trials={n_trials!r} is invalid: a whole number of trials, at least 1"
        )
    if timeout_s is None:
        if n_trials > MAX_TRIALS_WITHOUT_BUDGET:
            raise ConfigError(
                f"hparams_search.n_trials={n_trials} has no time budget: set hparams_search.timeout_s="
                "<seconds> (no trial starts after it; the same command continues), or at most "
                f"{MAX_TRIALS_WITHOUT_BUDGET} trials"
            )
        return float("inf")
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not 0 < timeout_s < float("inf")
    ):
        raise ConfigError(
            f"hparams_search.timeout_s={timeout_s!r} is invalid: seconds (> 0), or null for none"
        )
    return time.monotonic() + timeout_s


def _tell(optuna: Any, study: Any, trial: Any, score: float | None, failed: str | None, pruned: bool) -> None:
    """The trial's end into the study; a score it does not keep (a study changed by hand) is an error, where
    the search would run trials forever."""
    if pruned:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    elif failed is not None:  # counted as finished: the next trial draws anew, never the same again
        trial.set_user_attr("failed", failed)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    elif study.tell(trial, score).state != optuna.trial.TrialState.COMPLETE:
        raise ValueError(f"it did not keep trial {trial.number}'s score {score}")


@contextlib.contextmanager
def _study_file(folder: Path) -> Iterator[None]:
    """Optuna's errors reading or writing a study its file no longer holds as Optuna wrote it (torn, edited,
    another program's) as one line; a search's own trials run outside."""
    try:
        yield
    except Exception as err:  # SQLAlchemy's, Optuna's, and what its decoding of edited rows raises
        if isinstance(err, ConfigError):
            raise
        cause = first_line(err)[:200]
        if "database is locked" in cause:  # another program has it open: a viewer, a search of its own
            raise ConfigError(
                f"hparams_search: {folder / 'study.db'} is locked by another program ({cause}): close it, "
                "or run_name=<new name>"
            ) from None
        raise ConfigError(
            f"hparams_search: {folder / 'study.db'} is not a study this search can continue ({cause}): move "
            "it away to start the search anew, or run_name=<new name>"
        ) from None


def _finished(optuna: Any, study: Any) -> list[Any]:
    """Trials that count toward `n_trials`: complete, pruned, or failed in their run (not those the search
    was killed in, which run again)."""
    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return [t for t in study.trials if t.state in done or "failed" in t.user_attrs]


def _trial_config(cfg: DictConfig, params: dict[str, Any], out: Path) -> DictConfig:
    """The search's config with the trial's values, no search of its own, and its own run folder."""
    trial = copy.deepcopy(cfg)
    with open_dict(trial):
        trial.hparams_search = None
        for key, value in params.items():
            OmegaConf.update(trial, key, value, force_add=True)
        trial.paths.output_dir = str(out)
        trial.run_name = f"{cfg.run_name}-trial{out.name}"
    return trial


def _report(study: Any, folder: Path) -> float | None:
    """search.json (every trial, and the best with its run folder) and a line naming the best."""
    trials = [
        {"number": t.number, "state": t.state.name, "value": t.value, "params": t.params, **t.user_attrs}
        for t in study.trials
    ]
    complete = [t for t in study.trials if t.value is not None]
    best = study.best_trial if complete else None
    facts: dict[str, Any] = {"trials": trials}
    if best is not None:
        facts |= {
            "best_trial": best.number,
            "best_value": best.value,
            "best_params": best.params,
            "best_run_dir": str(folder / "trials" / str(best.number)),
        }
    write_text_atomically(folder / SEARCH_FILE, json.dumps(facts, indent=2) + "\n")
    if best is None:
        return _none_scored(study)
    run_dir = facts["best_run_dir"]
    print(f"hparams_search: best trial {best.number} ({best.value:.4f}) {best.params}; its run: {run_dir}")
    return float(best.value)


def _none_scored(study: Any) -> None:
    """No trial scored: where each of them failed, the search failed too (exit 2 where every trial was
    refused a setting, else 3); else (pruned, or none finished before `timeout_s`) a line and no score."""
    failed = [t.user_attrs.get("failed") for t in study.trials if t.state.name == "FAIL"]
    if not failed or len(failed) < len(study.trials):
        print("hparams_search: no trial finished with a score (pruned, or cut short by timeout_s)")
        return None
    print("error: hparams_search: every trial failed (each trial's own line says why)", file=sys.stderr)
    raise SystemExit(
        CONFIG_ERROR_EXIT if set(failed) == {f"exit {CONFIG_ERROR_EXIT}"} else TRAINING_FAILURE_EXIT
    )
