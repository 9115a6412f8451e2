"""`python -m lightspeed.train [overrides]`: fit, test the best checkpoint, summarise. Returns the score of
the run's one monitored metric (the best checkpoint's), so that Hydra sweepers can optimise it."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from omegaconf import DictConfig, OmegaConf, open_dict

from lightspeed.compat.trainer import spawned
from lightspeed.core import summary
from lightspeed.core.boundary import phase
from lightspeed.core.config import ConfigError, exit_on_config_error, validate_train, writing_run_folder
from lightspeed.core.failures import TrainingFailure, exit_on_failure, is_out_of_memory
from lightspeed.core.logs import silence_known_noise
from lightspeed.report.curves import CurvesLogger
from lightspeed.resilience import checkpoint, identity, lock, resume
from lightspeed.run import build, monitor, testable
from lightspeed.run.entry import hydra_entry, keep_hydra_files
from lightspeed.speed import accel


def refuse_multirun_with_ddp(cfg: DictConfig) -> None:
    """Lightning relaunches this script once per extra rank; under a Hydra sweep every rank would run its
    own sweep (seen to hang, or to train different configs on different ranks). A job whose ranks SLURM
    or torchrun started (hydra/launcher=slurm: each job an srun of its tasks) launches nothing: allowed."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    if SLURMEnvironment.detect() or TorchElasticEnvironment.detect():
        return
    # Whatever the strategy says, more than one device makes Lightning launch more processes.
    if cfg.trainer.get("devices", 1) != 1 or cfg.trainer.get("num_nodes", 1) != 1:
        raise ConfigError(
            "hydra multirun (-m) cannot drive a multi-process trainer.strategy here (ddp: trainer.devices or "
            "num_nodes above 1): each rank would run its own sweep; submit the sweep to SLURM "
            "(-m hydra/launcher=slurm hydra.launcher.tasks_per_node=<devices>), sweep on one device "
            "(trainer=cpu or trainer=gpu), or loop in the shell: "
            "`for lr in 1e-3 3e-3; do make train trainer=ddp model.optimizer.lr=$lr; done`"
        )


@contextmanager
def stop_other_ranks_on_failure(trainer: L.Trainer) -> Iterator[None]:
    """When the first rank fails, end the ranks Lightning started at once (else they wait in their next
    collective until the process-group timeout) and name the rank that failed first: a peer that died makes
    this rank fail too. A preemption or an agreed TrainingFailure ends every rank by itself."""
    try:
        yield
    except (Exception, KeyboardInterrupt) as err:
        from lightspeed.compat.ranks import kill_launched_ranks, launched_ranks

        procs = launched_ranks(trainer)
        if procs and not getattr(err, "agreed", False):  # agreed: each rank exits by itself
            from lightspeed.core.failure_lines import stop_ranks

            explained = isinstance(err, (ConfigError, TrainingFailure)) or is_out_of_memory(err)
            stop_ranks(procs, lambda: kill_launched_ranks(trainer), explained)
        raise


@dataclass
class TrainResult:
    trainer: L.Trainer
    model: L.LightningModule
    score: float | None  # the monitored metric's: the best checkpoint's, else the last validation's
    metrics: dict[str, float] = field(default_factory=dict)
    best_checkpoint: str | None = None
    monitor: str | None = None  # the metric the run was judged by: the config's, else the model's own


@dataclass(frozen=True)
class Plan:
    """What a run does, decided once before anything is built, and read by every step after. Hydra's `cfg`
    stays as composed; the run's own copy (`Run.cfg`, read-only once planned) has the config's `auto`s
    resolved and its monitor settled, but for what only later steps know, each decided there and not
    written back: `trainer.accelerator` and `strategy` (Lightning), `data.on_device` (the DataModule, by
    the data's size), `accel.channels_last` (the model's layers)."""

    ident: dict[str, Any]  # the run's identity: its config as composed, before the autos resolved
    run_dir: Path
    monitor: tuple[str, str] | None  # (metric, mode): the model's own where the config said null
    resume_from: str | None  # the checkpoint fit continues from (resume=auto or ckpt_path)
    resumed: dict[str, Any] | None  # that checkpoint's position and metrics, as read to choose it
    idle: tuple[str, ...]  # knobs set that cannot take effect on this device


class Run:
    """One training run of `cfg`, as `train` below (and a project's `train.py`, docs/engine.md) builds it:
    the plan, what the Trainer and the module are built with, the fit and its summary. A bad setting in the
    block (a ConfigError) is one line and exit 2; the lock is held until the block ends."""

    def __init__(self, cfg: DictConfig) -> None:
        self.composed = cfg  # as Hydra composed it: left as it is (a sweep's next job, the caller's own use)
        self.cfg = copy.deepcopy(cfg)  # this run's: autos resolved, monitor settled, then read-only
        self._held = ExitStack()
        self._given: dict[str, Any] = {}
        self._tracked = False  # an MLflow or W&B logger: their runs continued (run/tracking.py)
        self._node: DictConfig | None = None
        self._loggers: list[Logger] | None = None
        self._fit_s = 0.0

    def __enter__(self) -> Run:
        self._held.enter_context(exit_on_config_error())
        try:
            self.plan = self._plan()
        except BaseException:
            self._held.close()  # the lock, if it was taken
            raise
        return self

    def _plan(self) -> Plan:
        cfg = self.cfg
        silence_known_noise()
        with exit_on_config_error():
            validate_train(cfg)
            ident = identity.of(cfg)  # what the run computes, as composed: before `accel` resolves
            with open_dict(cfg):
                cfg.run_name = str(cfg.run_name)  # its hash, as the folder has it, before the config changes
            monitor.settle(cfg)  # ... and before the model's monitor fills the config's
            refuse_multirun_with_ddp(cfg)
            run_dir = Path(cfg.paths.output_dir)
            with writing_run_folder():  # its lock and run.json
                self._held.enter_context(lock.held(run_dir))  # until the run ends, however
            idle = accel.resolve(cfg)
            self._tracked = build.tracks(cfg)
            if self._tracked:  # MLflow or W&B: their code, only then
                from lightspeed.run import tracking

                tracking.continue_runs(cfg)
            with writing_run_folder():
                resume_from, resumed = resume.start(cfg, ident)
            with open_dict(cfg):
                for knob in build.untaken_knobs(cfg):  # a DataModule that makes its own loaders
                    del cfg.data[knob]
            self.config = build.plain_config(cfg)
        OmegaConf.set_readonly(cfg, True)
        accel.apply_to_torch(cfg)
        L.seed_everything(cfg.seed, workers=True, verbose=False)
        metric = (cfg.monitor.metric, cfg.monitor.mode) if "monitor" in cfg else None
        return Plan(ident, run_dir, metric, resume_from, resumed, tuple(idle))

    def __exit__(self, *exc: Any) -> bool | None:
        return self._held.__exit__(*exc)  # a ConfigError in the block: one line, exit 2; the lock released

    def model_node(self, dm: L.LightningDataModule) -> DictConfig:
        """`run.cfg.model` with what the module takes of the data's `model_args()` added (its nested
        `_target_`s' too), checked against the data (the arguments it needs, the inputs its net takes):
        what the checkpoints keep as what rebuilds the module."""
        self._given = build.from_data(self.cfg, dm)
        self._node = build.model_node(self.cfg, self._given)
        build.check_model(self.cfg, dm, self._given, self._node)
        return self._node

    def callbacks(self, extra: Sequence[L.Callback] = ()) -> list[L.Callback]:
        """conf/callbacks' (with what every training run keeps: checkpoints, the non-finite guard and
        ExactResume, given the run's identity and the model's node), then `extra`."""
        has_logger = bool(self.loggers())
        ident, given = self.plan.ident, sorted(self._given)
        return [*build.callbacks(self.cfg, has_logger, ident, given, self._node), *extra]

    def loggers(self) -> list[Logger] | bool:
        """conf/logger's (MLflow's and W&B's continuing this folder's tracked run; `fit` gives each the
        resolved config as hyperparameters); False for none (Lightning's default logger stays off)."""
        if self._loggers is None:
            self._loggers = build.trainer_loggers(self.cfg)
        return self._loggers or False

    def _log_config(self, loggers: list[Logger]) -> None:
        """The resolved config as each logger's hyperparameters (a tracked run's continued, as it was)."""
        if self._tracked:
            from lightspeed.run import tracking

            tracking.log_config(self.config, loggers)
            tracking.remember(self.cfg, loggers)
        else:
            for logger in loggers:
                logger.log_hyperparams(self.config)

    def plugins(self) -> list[Any]:
        """The trainer's own plugins, and checkpoints written whole or not at all."""
        return build.plugins(self.cfg)

    def fit(self, trainer: L.Trainer, model: L.LightningModule, dm: L.LightningDataModule) -> None:
        """`trainer.fit`, from the checkpoint the plan resumes; first the accel preset applied to the module
        (channels_last, torch.compile) and the config printed and kept beside the run."""
        if self.cfg.get("test_after_fit", True):
            testable.check(model, dm)
            testable.probe(trainer, model, dm)
        accel.apply_to_model(self.cfg, model)
        accel.report_idle(list(self.plan.idle), accel.device_type(self.cfg))
        keep_hydra_files()  # started in its folder: a later one-line error does not put back the old ones
        summary.config_tree(self.config, self.plan.run_dir, show=self.cfg.get("print_config", True))
        self._log_config(trainer.loggers)
        start = time.perf_counter()
        try:  # weights_only: a checkpoint can only hold plain data; loading it never runs code
            with (
                exit_on_config_error(),
                exit_on_failure(self.cfg, trainer),
                stop_other_ranks_on_failure(trainer),
                checkpoint.loading(self.plan.resume_from),
                phase("fit"),
            ):
                trainer.fit(model, datamodule=dm, ckpt_path=self.plan.resume_from, weights_only=True)
        finally:  # a preempted or failed attempt's time counts too
            self._fit_s = identity.add_fit_seconds(self.plan.run_dir, time.perf_counter() - start)

    def finish(self, trainer: L.Trainer, model: L.LightningModule, dm: L.LightningDataModule) -> TrainResult:
        """The fit's figures and summary; with `test_after_fit`, the best checkpoint tested too."""
        plan, ckpt = self.plan, trainer.checkpoint_callback
        # Only a monitored checkpoint is a "best" one (Lightning's default checkpoint just keeps the last).
        best = ckpt.best_model_path if ckpt is not None and ckpt.monitor and ckpt.best_model_path else None
        metrics = self._fit_metrics(trainer, best)
        facts = self._facts(trainer, best)
        if self.cfg.get("test_after_fit", True):
            # The fit's summary first: a test that fails (a corrupt test image) loses nothing of the fit,
            # and `make eval ckpt_path=latest` finds its best checkpoint.
            summary.write(plan.run_dir, facts, metrics)
            metrics |= self._test(trainer, model, dm, best)
            facts["tested"] = "best checkpoint" if best else "weights in memory"
        curves = next((lg for lg in trainer.loggers if isinstance(lg, CurvesLogger)), None)
        facts["curves"] = curves.picture() if curves is not None else None
        score = self._score(ckpt, metrics)
        summary.report("Lightspeed: training finished", plan.run_dir, facts, metrics)
        return TrainResult(trainer, model, score, metrics, best, plan.monitor[0] if plan.monitor else None)

    def _facts(self, trainer: L.Trainer, best: str | None) -> dict[str, Any]:
        """What the summary says of the fit: where, judged by what, its checkpoints, how far, how long."""
        plan, last = self.plan, getattr(trainer.checkpoint_callback, "last_model_path", None)
        step, epochs = trainer.global_step, trainer.current_epoch
        last_ckpt = resume.checkpoint_dir(self.cfg) / "last.ckpt"
        if spawned(trainer) and last_ckpt.is_file():  # the children's: Lightning does not bring them back
            from lightspeed.compat.ranks import progress_saved

            step, epochs = progress_saved(
                torch.load(last_ckpt, map_location="cpu", weights_only=True, mmap=True)
            )
        return {
            "run_dir": plan.run_dir,
            "monitor": f"{plan.monitor[0]} ({plan.monitor[1]})" if plan.monitor else None,
            "best_checkpoint": best,
            "last_checkpoint": last or None,
            "global_step": step,
            "epochs": epochs,
            "fit_seconds": round(self._fit_s, 2),  # every attempt's: a resumed or rerun run adds to it
            "tested": None,
            "curves": None,
            "config": self.config,
        }

    def _test(
        self, trainer: L.Trainer, model: L.LightningModule, dm: L.LightningDataModule, best: str | None
    ) -> dict[str, float]:
        """The test metrics of the best checkpoint; without one (fast_dev_run, no checkpoint callback), of
        the weights in memory."""
        if spawned(trainer):
            from lightspeed.compat.ranks import fitted_in_children

            fitted_in_children(trainer)
        with (
            exit_on_config_error(),
            exit_on_failure(self.cfg, trainer),
            stop_other_ranks_on_failure(trainer),
            phase("test after the fit (its checkpoints are kept: make eval tests them again)"),
        ):
            results = trainer.test(model, datamodule=dm, ckpt_path="best" if best else None, verbose=False)
        return {k: float(v) for k, v in (results[0] if results else {}).items()}

    def _score(self, ckpt: Any, metrics: dict[str, float]) -> float | None:
        """The monitored metric's score: the best checkpoint's, else the last measured; where it was never
        logged (no callback watched it: callbacks=none), None and a warning."""
        if self.plan.monitor is None:
            return None
        name = self.plan.monitor[0]
        if getattr(ckpt, "monitor", None) == name and ckpt.best_model_score is not None:
            return float(ckpt.best_model_score)
        if name not in metrics:
            logged = ", ".join(sorted(metrics)) or "nothing"
            rank_zero_warn(f"monitor.metric={name} was never logged: the run has no score (logged: {logged})")
        return metrics.get(name)

    def _fit_metrics(self, trainer: L.Trainer, best: str | None) -> dict[str, float]:
        """The last validation's metrics (the run's, and last.ckpt's), the best checkpoint's beside them."""
        metrics = {
            k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("train/", "val/"))
        }
        start_info = self.plan.resumed
        if start_info is not None:
            # What the run last measured before the checkpoint, where this attempt has not measured it again
            # (a resumed stretch after the last logging step logs no loss): as an uninterrupted run reports.
            metrics = {**start_info["metrics"], **metrics}
            if trainer.global_step == start_info["global_step"]:
                rank_zero_info(
                    f"nothing left to train: {self.plan.resume_from} had already finished; testing its best "
                    "checkpoint again (run_name=<new name> trains a new run)"
                )
        best_metrics = getattr(trainer.checkpoint_callback, "best_metrics", {}) if best else {}
        return metrics | {f"{k}@best": v for k, v in best_metrics.items()}


def instantiate(node: DictConfig, **kwargs: Any) -> Any:
    """Hydra's `instantiate` of a node of the run's config, its containers passed as plain data; a setting
    its constructor refuses is one line naming the key (`build.instantiate`)."""
    return build.instantiate(node, build.where(node), _convert_="all", **kwargs)


def train(cfg: DictConfig, extra_callbacks: Sequence[L.Callback] = ()) -> TrainResult:
    """Train as `cfg` says, with `extra_callbacks` beside the configured ones (for programmatic use); the
    steps a project's train.py shows."""
    with Run(cfg) as run:
        dm = instantiate(run.cfg.data)
        model = instantiate(run.model_node(dm))
        trainer = instantiate(
            run.cfg.trainer,
            callbacks=run.callbacks(extra_callbacks),
            logger=run.loggers(),
            plugins=run.plugins(),
        )
        run.fit(trainer, model, dm)
        return run.finish(trainer, model, dm)


def train_or_search(
    cfg: DictConfig, run: Callable[[DictConfig, Sequence[L.Callback]], TrainResult] = train
) -> float | None:
    """`run(cfg, callbacks)` once, or with `hparams_search`, an Optuna search of such runs; the score Hydra's
    sweepers read. A project's train.py passes its own `train`."""
    if not cfg.get("hparams_search"):
        return run(cfg, ()).score
    from lightspeed.run import search  # Optuna's, only for a search

    return search.run(cfg, lambda trial_cfg, pruning: run(trial_cfg, pruning).score)


#: Console entry point: `lightspeed-train` and `python -m lightspeed.train`.
main = hydra_entry("train", train_or_search)

if __name__ == "__main__":
    main()
