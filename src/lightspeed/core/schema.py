"""The config's one schema: a record per key that Lightspeed knows more of than a type says (docs/engine.md);
every consumer reads its facts from here, no key is named in a second table. A value that goes to a
constructor is also checked against its parameter's annotation (`build.check_arguments`); what Lightning
itself checks as its Trainer is built has no record here (its error is reworded where it is raised).

Why records of our own, not Hydra structured configs or pydantic: the config's groups are open (a
project's models and data sets bring keys the engine cannot type), a range or a choice is more than a
type, and whether a key is part of a run's identity is a fact of the key, not of its type.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: `Key.added`'s default: the key was there from the first release.
ORIGINAL = object()


@dataclass(frozen=True)
class Key:
    """What Lightspeed knows of one key. A key (or a whole subtree) absent from a config is not checked."""

    check: Callable[[Any], bool] | None = None  # None: any value (its constructor's annotation allows)
    allowed: str = ""  # what `check` accepts, in words: the fix the one-line error names
    identity: bool = True  # False: where a run lives, how it starts, is watched or fed, not what it computes
    added: Any = ORIGINAL  # added after runs existed: at this value left out of the identity (older runs)
    folder: bool = False  # names one folder (or a log file): checked as resolved, before Hydra makes it
    loader: bool = False  # a DataLoader setting under data.: this machine's, set by the accel preset
    retired: str | None = None  # renamed or removed: what to use instead (a config that sets it is refused)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_finite(v: Any) -> bool:
    return is_number(v) and math.isfinite(v)


def _one_of(*allowed: str) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: isinstance(v, str) and v in allowed, "one of " + ", ".join(allowed))


def _int_at_least(low: int, extra: str = "") -> tuple[Callable[[Any], bool], str]:
    return (lambda v: is_int(v) and v >= low, f"an integer >= {low}{extra}")


def _or_null(rule: tuple[Callable[[Any], bool], str]) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v is None or rule[0](v), f"{rule[1]} or null")


def _named(allowed: str) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: isinstance(v, str) and v != "", allowed)


_BOOL = (lambda v: isinstance(v, bool), "true or false")
_BOOL_OR_AUTO = (lambda v: v == "auto" or isinstance(v, bool), "auto, true or false")
_SEED = (lambda v: is_int(v) and 0 <= v < 2**32, "an integer from 0 to 2**32 - 1")
_BELOW_ONE = (lambda v: is_finite(v) and 0 <= v < 1, "a number from 0 to below 1")
_NON_NEGATIVE = (lambda v: is_finite(v) and v >= 0, "a number >= 0")
_BETWEEN = (lambda v: is_finite(v) and 0 < v < 1, "a number between 0 and 1")
#: How many batches of an epoch: a count, a fraction of them, or null (Lightning's default).
_BATCHES = (
    lambda v: v is None or (is_int(v) and v >= 0) or (is_finite(v) and 0 <= v <= 1),
    "a number of batches >= 0, a fraction from 0 to 1, or null",
)
#: A name that is one folder inside its parent: no separator, not `.` or `..`.
FOLDER_NAME = (
    lambda v: (
        isinstance(v, str)
        and re.fullmatch(r"[\w.,=+-]+", v) is not None
        and v not in (".", "..")
        and len(v.encode()) <= 200  # file systems take 255 bytes; the rest is for a suffix (.tmp)
    ),
    "letters, digits and . , = + - _ (up to 200 bytes) but not . or .. alone (it names one folder)",
)
_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")


#: Every key with a record. Identity: loader settings change speed, not batches (both loaders serve the
#: same order); where a data set is kept and fetched from changes no byte of it (its files are verified
#: against their published MD5s). `added`: every new key that changes what a run computes gets one
#: (tests/test_nothing_lost.py pins the default run's hash to catch a key that was not).
SCHEMA: dict[str, Key] = {
    "seed": Key(*_SEED),
    "data.split_seed": Key(*_SEED),
    "data.normalize": Key(
        lambda v: isinstance(v, bool) or v == "per_feature",
        "true (one mean and std), per_feature (each input feature its own: tabular data) or false",
    ),
    # the shipped models' yamls say so (conf/model); Hydra's default, true, is what any other module gets
    "model._recursive_": Key(*_BOOL, added=False),
    "model.optimizer.weight_decay": Key(*_NON_NEGATIVE),
    "model.optimizer.momentum": Key(*_BELOW_ONE),
    "model.scheduler.pct_start": Key(*_BETWEEN),
    "model.net.dropout": Key(*_BELOW_ONE),
    "trainer.min_epochs": Key(*_or_null(_int_at_least(0))),
    "trainer.num_sanity_val_steps": Key(
        *_int_at_least(-1, " (-1: the whole validation set)"), identity=False
    ),
    "trainer.num_nodes": Key(*_int_at_least(1, " (machines, each started by torchrun or SLURM)"), added=1),
    "trainer.check_val_every_n_epoch": Key(*_or_null(_int_at_least(1))),
    "trainer.val_check_interval": Key(
        lambda v: (
            v is None
            or isinstance(v, (str, Mapping))  # a time, as Lightning takes it ("00:01:00:00", {minutes: 5})
            or (is_int(v) and v >= 1)
            or (is_finite(v) and 0 < v <= 1)
        ),
        "a fraction of an epoch in (0, 1], a number of batches >= 1, a time, or null",
        added=None,
    ),
    "callbacks.model_checkpoint.dirpath": Key(*_or_null(_named("a folder"))),
    "callbacks.model_checkpoint.save_top_k": Key(*_int_at_least(-1, " (-1: keep every checkpoint)")),
    "monitor.metric": Key(
        lambda v: v is None or (isinstance(v, str) and v != ""), "a metric's name, or null"
    ),
    "monitor.mode": Key(lambda v: v is None or v in ("min", "max"), "min, max, or null (the model's)"),
    "monitor.check_mode": Key(*_BOOL, identity=False),  # a check of the settings, not a setting
    "callbacks.early_stopping.patience": Key(*_int_at_least(0)),
    "run_name": Key(*FOLDER_NAME, identity=False, folder=True),
    "task_name": Key(*FOLDER_NAME, folder=True),
    "resume": Key(*_one_of("auto", "never"), identity=False),
    "trainer.max_epochs": Key(
        lambda v: v is None or (is_int(v) and (v >= 1 or v == -1)), "an integer >= 1 (or -1 for no limit)"
    ),
    "trainer.max_steps": Key(*_int_at_least(-1, " (or -1 for no limit)"), added=-1),
    "trainer.accumulate_grad_batches": Key(*_int_at_least(1)),
    "trainer.deterministic": Key(
        lambda v: v is None or isinstance(v, bool) or v == "warn", "true, false or warn"
    ),
    "trainer.gradient_clip_val": Key(*_or_null(_NON_NEGATIVE)),
    "trainer.log_every_n_steps": Key(*_int_at_least(1), identity=False),
    "data.batch_size": Key(*_int_at_least(1)),
    "data.num_workers": Key(
        lambda v: v == "auto" or (is_int(v) and v >= 0),
        "auto or an integer >= 0",
        identity=False,
        loader=True,
    ),
    "data.pin_memory": Key(*_BOOL_OR_AUTO, identity=False, loader=True),
    "data.non_blocking": Key(*_BOOL_OR_AUTO, identity=False, loader=True),
    "data.on_device": Key(*_BOOL_OR_AUTO, identity=False, loader=True),
    "data.persistent_workers": Key(*_BOOL, identity=False, loader=True),
    "data.drop_last": Key(*_BOOL),
    "data.prefetch_factor": Key(*_or_null(_int_at_least(1)), identity=False, loader=True),
    "data.val_fraction": Key(*_BETWEEN),
    "data.test_fraction": Key(*_BETWEEN),
    "data.augment.crop_padding": Key(*_int_at_least(0)),
    "data.augment.flip": Key(*_BOOL),
    "model.optimizer.lr": Key(lambda v: is_finite(v) and v > 0, "a finite number > 0"),
    "accel.matmul_precision": Key(*_one_of("highest", "high", "medium")),
    "accel.channels_last": Key(*_BOOL_OR_AUTO),
    "accel.compile": Key(*_BOOL),
    "accel.compile_mode": Key(
        *_one_of("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    ),
    "accel.compile_backend": Key(
        lambda v: v in torch.compiler.list_backends(exclude_tags=()),
        "a torch.compile backend: " + ", ".join(torch.compiler.list_backends()),
    ),
    "accel.optimizer_impl": Key(*_one_of("auto", "torch", "fused", "foreach", "loop")),
    "accel.flush_denormal": Key(*_BOOL_OR_AUTO),
    "accel.threads": Key(
        lambda v: v == "auto" or (is_int(v) and v >= 1), "auto or an integer >= 1", identity=False
    ),
    "callbacks.nonfinite.action": Key(*_one_of("stop", "skip")),
    "callbacks.nonfinite.check_every_n_steps": Key(*_int_at_least(1), identity=False),
    "callbacks.nonfinite.max_consecutive_skips": Key(*_int_at_least(1)),
    "callbacks.exact_resume.check_every_n_steps": Key(*_int_at_least(1)),
    "callbacks.model_checkpoint.last_every_s": Key(
        lambda v: is_number(v) and v >= 0, "seconds >= 0 (0: at every epoch end)", identity=False
    ),
    "callbacks.speed_report.warmup_steps": Key(
        lambda v: v == "auto" or (is_int(v) and v >= 0),
        "auto (until the step time settles) or an integer >= 0",
    ),
    "callbacks.speed_report.summary_depth": Key(*_int_at_least(-1, " (-1: every layer, 0: none)")),
    "callbacks.rich_progress_bar.refresh_rate": Key(*_int_at_least(1, " (updates a second)")),
    "logger.csv.save_dir": Key(*_named("a folder")),
    "logger.tensorboard.save_dir": Key(*_named("a folder")),
    "model.optimizer.name": Key(*_named("a class in torch.optim, e.g. AdamW")),
    "model.scheduler.name": Key(*_named("none, cosine or onecycle")),
    "trainer.overfit_batches": Key(
        lambda v: (is_int(v) and v >= 0) or (is_finite(v) and 0 <= v <= 1),
        "a number of batches >= 0, or a fraction of them from 0 to 1",
        added=0.0,
    ),
    "trainer.profiler": Key(  # Lightning takes a bool here, then fails in fit
        lambda v: v is None or isinstance(v, str) or (isinstance(v, Mapping) and "_target_" in v),
        "null, simple, advanced or pytorch, or a profiler's node with _target_",
        added=None,
    ),
    "trainer.limit_train_batches": Key(*_BATCHES, added=1.0),
    "trainer.limit_val_batches": Key(*_BATCHES, added=1.0),
    "trainer.limit_test_batches": Key(*_BATCHES, added=1.0),
    "shards.chunk_bytes": Key(
        lambda v: (
            (is_int(v) and v > 0)
            or (isinstance(v, str) and re.fullmatch(r"[1-9]\d*\s*[KMG]B", v) is not None)
        ),
        "a size like 64MB (KB, MB or GB), or a number of bytes > 0",
    ),
    "callbacks.exact_resume.signals": Key(
        lambda v: isinstance(v, Sequence) and all(s in _SIGNALS for s in v),
        "a list of " + ", ".join(_SIGNALS),
    ),
    "predict": Key(*_BOOL, identity=False),  # eval's
    "viz": Key(*_BOOL, identity=False),
    "check_batch": Key(*_int_at_least(1)),  # export's
    "tolerance": Key(*_NON_NEGATIVE),
    "hydra": Key(identity=False),
    "paths": Key(identity=False),
    "ckpt_path": Key(identity=False),
    "test_after_fit": Key(*_BOOL, identity=False),
    "print_config": Key(*_BOOL, identity=False),
    "curves": Key(*_BOOL, identity=False),
    "logger": Key(identity=False),
    "data.data_dir": Key(identity=False),
    "data.mirrors": Key(identity=False),
    "data.cache": Key(identity=False),  # image_folder: the same pixels, decoded once or on the fly
    "trainer.enable_progress_bar": Key(identity=False),
    "trainer.enable_model_summary": Key(identity=False),
    "callbacks.rich_progress_bar": Key(identity=False),
    "callbacks.model_summary": Key(identity=False),
    "callbacks.speed_report": Key(identity=False),
    "callbacks.lr_monitor": Key(identity=False),
    "callbacks.exact_resume": Key(identity=False),
    "callbacks.model_checkpoint.every_n_train_steps": Key(identity=False),
    "trainer.fast_dev_run": Key(added=False),
    "trainer.enable_checkpointing": Key(added=True),
    "hydra.job.name": Key(folder=True),
    "hydra.output_subdir": Key(folder=True),
    "hydra.sweep.subdir": Key(folder=True),
    "callbacks.model_summary.max_depth": Key(
        retired="is now callbacks.speed_report.summary_depth: the speed report prints the model summary "
        "(0: none)"
    ),
    "callbacks.preemption": Key(
        retired="is now part of callbacks.exact_resume (its signals and check_every_n_steps): set them there"
    ),
    "allowed_targets": Key(
        retired="is no longer needed: the command line and conf/ may name any class; remove it "
        "(from conf/local/default.yaml)"
    ),
}
