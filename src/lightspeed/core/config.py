"""Validation of the composed config: one place, one line per mistake, before any work starts.

Hydra already rejects unknown groups/options and keys that are not in the config (struct mode); this
module checks the values that Hydra cannot know about (types, ranges, what this machine can run).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from lightspeed import CONF_DIR

#: Exit code for a bad config (training failures exit 1, like any Python error).
CONFIG_ERROR_EXIT = 2

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")


class ConfigError(ValueError):
    """A setting has a value Lightspeed cannot run with; the message names the key and the fix."""


@contextmanager
def exit_on_config_error() -> Iterator[None]:
    """Turn a ConfigError into one line on stderr and exit code 2, instead of a traceback."""
    try:
        yield
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(CONFIG_ERROR_EXIT) from None


_ABSENT = object()


def _get(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, default=None)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _one_of(*allowed: str) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: isinstance(v, str) and v in allowed, "one of " + ", ".join(allowed))


def _int_at_least(low: int, extra: str = "") -> tuple[Callable[[Any], bool], str]:
    return (lambda v: _is_int(v) and v >= low, f"an integer >= {low}{extra}")


def _bool_or_auto() -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v == "auto" or isinstance(v, bool), "auto, true or false")


_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")

# key -> (predicate, what is allowed). A key that is absent from the config is not checked.
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "seed": (_is_int, "an integer"),
    "run_name": (
        lambda v: isinstance(v, str) and re.fullmatch(r"[\w.,=+-]+", v) is not None,
        "letters, digits and . , = + - _ (it names a folder)",
    ),
    "resume": _one_of("auto", "never"),
    "trainer.precision": _one_of("auto", *PRECISIONS),
    "trainer.accelerator": _one_of(*ACCELERATORS),
    "trainer.max_epochs": (
        lambda v: v is None or (_is_int(v) and (v >= 1 or v == -1)),
        "an integer >= 1 (or -1 for no limit)",
    ),
    "trainer.max_steps": _int_at_least(-1, " (or -1 for no limit)"),
    "trainer.accumulate_grad_batches": _int_at_least(1),
    "trainer.benchmark": (lambda v: v in ("auto", None) or isinstance(v, bool), "auto, true or false"),
    "trainer.deterministic": (
        lambda v: v is None or isinstance(v, bool) or v == "warn",
        "true, false or warn",
    ),
    "trainer.gradient_clip_val": (lambda v: v is None or (_is_number(v) and v > 0), "a number > 0 or null"),
    "trainer.log_every_n_steps": _int_at_least(1),
    "data.batch_size": _int_at_least(1),
    "data.num_workers": (lambda v: v == "auto" or (_is_int(v) and v >= 0), "auto or an integer >= 0"),
    "data.pin_memory": _bool_or_auto(),
    "data.non_blocking": _bool_or_auto(),
    "data.on_device": _bool_or_auto(),
    "data.persistent_workers": (lambda v: isinstance(v, bool), "true or false"),
    "data.drop_last": (lambda v: isinstance(v, bool), "true or false"),
    "data.prefetch_factor": (lambda v: v is None or (_is_int(v) and v >= 1), "an integer >= 1 or null"),
    "data.val_fraction": (lambda v: _is_number(v) and 0 < v < 1, "a number between 0 and 1"),
    "data.test_fraction": (lambda v: _is_number(v) and 0 < v < 1, "a number between 0 and 1"),
    "data.augment.crop_padding": _int_at_least(0),
    "data.augment.flip": (lambda v: isinstance(v, bool), "true or false"),
    "model.optimizer.lr": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "accel.matmul_precision": _one_of("highest", "high", "medium"),
    "accel.channels_last": _bool_or_auto(),
    "accel.compile": (lambda v: isinstance(v, bool), "true or false"),
    "accel.compile_mode": _one_of("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    "accel.compile_backend": (
        lambda v: v in torch.compiler.list_backends(exclude_tags=()),
        "a torch.compile backend: " + ", ".join(torch.compiler.list_backends()),
    ),
    "accel.optimizer_impl": _one_of("auto", "torch", "fused", "foreach", "loop"),
    "accel.flush_denormal": _bool_or_auto(),
    "callbacks.nonfinite.action": _one_of("stop", "skip"),
    "callbacks.nonfinite.check_every_n_steps": _int_at_least(1),
    "callbacks.nonfinite.max_consecutive_skips": _int_at_least(1),
    "callbacks.preemption.check_every_n_steps": _int_at_least(1),
    "callbacks.speed_report.warmup_steps": (
        lambda v: v == "auto" or (_is_int(v) and v >= 0),
        "auto (until the step time settles) or an integer >= 0",
    ),
    "callbacks.preemption.signals": (
        lambda v: isinstance(v, Sequence) and all(s in _SIGNALS for s in v),
        "a list of " + ", ".join(_SIGNALS),
    ),
}


def validate_train(cfg: DictConfig) -> None:
    """Raise ConfigError for the first value that cannot work, naming the key and what is allowed."""
    validate_common(cfg)
    ckpt = cfg.get("ckpt_path")
    if ckpt is not None and not Path(str(ckpt)).is_file():
        raise ConfigError(
            f"ckpt_path={ckpt} does not exist: pass the path of a .ckpt file, or ckpt_path=null"
        )


def validate_common(cfg: DictConfig) -> None:
    """The checks that train and eval share: every rule whose key the config has, the splits, the
    strategy, the devices and the output folder."""
    for key, (ok, allowed) in _RULES.items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is not _ABSENT and not ok(value):
            raise ConfigError(f"{key}={value!r} is invalid: use {allowed}")
    _validate_splits(cfg)
    _validate_strategy(cfg)
    validate_devices(cfg)
    validate_writable(cfg)


def validate_writable(cfg: DictConfig) -> None:
    """Fail before training, not at the first checkpoint an hour later."""
    folder = Path(str(OmegaConf.select(cfg, "paths.log_dir", default="logs")))
    existing = next((p for p in (folder, *folder.resolve().parents) if p.exists()), None)
    if existing is not None and not (existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)):
        raise ConfigError(
            f"paths.log_dir={folder} cannot be written ({existing} is not a writable folder): "
            "choose a folder you can write to, e.g. paths.log_dir=$HOME/lightspeed-logs"
        )


def _validate_strategy(cfg: DictConfig) -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    strategy = OmegaConf.select(cfg, "trainer.strategy", default="auto")
    if (
        isinstance(strategy, str)
        and strategy != "auto"
        and strategy not in StrategyRegistry.available_strategies()
    ):
        raise ConfigError(
            f"trainer.strategy={strategy} is not a Lightning strategy: use auto, ddp, ddp_spawn, fsdp, "
            "deepspeed or another name in lightning.pytorch.strategies.StrategyRegistry (or trainer=ddp)"
        )


def _validate_splits(cfg: DictConfig) -> None:
    val, test = _get(cfg, "data.val_fraction"), _get(cfg, "data.test_fraction")
    if _is_number(val) and _is_number(test) and val + test >= 1:
        raise ConfigError(
            f"data.val_fraction={val} + data.test_fraction={test} leaves no training data: "
            "keep their sum below 1"
        )


def validate_devices(cfg: DictConfig) -> None:
    """Never fall back to the CPU when a GPU was asked for; never ask for more devices than exist."""
    accelerator = str(_get(cfg, "trainer.accelerator") or "auto")
    devices = _get(cfg, "trainer.devices")
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"trainer.accelerator={accelerator} but torch sees no CUDA GPU "
                f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}): "
                "check `nvidia-smi` and install a CUDA build of torch, or train on the CPU with trainer=cpu"
            )
        available = torch.cuda.device_count()
        if _is_int(devices) and devices > available:
            raise ConfigError(
                f"trainer.devices={devices} but only {available} GPU(s) are visible: use at most {available}"
            )
    if _is_int(devices) and (devices == 0 or devices < -1):
        raise ConfigError(f"trainer.devices={devices} is invalid: use a count >= 1, -1 for all, or auto")


def check_group_choices(args: Sequence[str], conf_dir: Path = CONF_DIR) -> None:
    """Refuse `group=option` overrides whose option has no file, in one line, before Hydra composes
    (Hydra's own message for this is a dozen lines and exits with 1)."""
    for arg in args:
        match = re.fullmatch(r"([A-Za-z_][\w/]*)=([\w.,-]+)", arg)
        if not match or match[1].startswith("hydra") or not (conf_dir / match[1]).is_dir():
            continue
        group, value = match.groups()
        choices = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
        for option in value.split(","):  # a,b,c: a multirun sweep over options
            if option not in choices and option != "null":
                raise ConfigError(
                    f"{group}={option} is not an option: use one of {', '.join(choices)} (conf/{group}/)"
                )
