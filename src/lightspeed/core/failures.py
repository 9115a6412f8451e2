"""Failures during training, each ending the run with one line that says what happened and what to try, and
an exit code (docs/resilience.md): 3 a failure explained here, 128 + N preempted by signal N after saving a
checkpoint; anything unexpected ends at the command's boundary (`core/boundary.py`). Under trainer=ddp
these are the first rank's codes."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.utilities.exceptions import SIGTERMException

TRAINING_FAILURE_EXIT = 3
#: The ends every rank reaches at the same step: the run's own, and a preemption (agreed by a collective).
ENDED_TOGETHER = (None, 0, 128 + signal.SIGTERM, 128 + signal.SIGUSR1)


class TrainingFailure(RuntimeError):
    """Training cannot go on; the message says why and what to try. `agreed`: every rank raises it at the
    same point (a reduced check), so every rank exits by itself."""

    def __init__(self, message: str, agreed: bool = False) -> None:
        super().__init__(message)
        self.agreed = agreed


class Preempted(BaseException):
    """A preemption signal arrived and a checkpoint was saved: not an error, so not an Exception (user
    code that catches Exception lets it through)."""

    def __init__(self, signum: int, step: int, path: str | None) -> None:
        super().__init__(signum, step, path)
        self.signum, self.step, self.path = signum, step, path


def is_out_of_memory(err: BaseException) -> bool:
    """torch's OutOfMemoryError (CUDA, MPS), or the CPU allocator's, which is a plain RuntimeError."""
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(err)
    )


def launched_by_lightning(trainer: L.Trainer) -> bool:
    """A non-first rank started by Lightning's own launcher (trainer=ddp on one machine): Lightning SIGKILLs
    the first rank when one exits non-zero, so these exit 0 on outcomes all ranks agree on."""
    env = getattr(trainer.strategy, "cluster_environment", None)
    return (
        trainer.global_rank != 0
        and isinstance(env, LightningEnvironment)
        and trainer.strategy.launcher is not None
    )


@contextmanager
def exit_on_failure(cfg: Any, trainer: L.Trainer) -> Iterator[None]:
    """Around fit and test: each failure above becomes its stderr line and exit code; the first rank says the
    agreed ones (Preemption, TrainingFailure), each rank its own out-of-memory (named under DDP)."""
    launched = launched_by_lightning(trainer)  # exits 0 on an agreed end: else Lightning SIGKILLs rank 0
    try:
        yield
    except (Preempted, SystemExit, RuntimeError) as err:  # TrainingFailure, torch OOM: RuntimeErrors
        from lightspeed.core.failure_exit import exit_code

        if (code := exit_code(err, cfg, trainer, launched)) is None:
            raise
        raise SystemExit(code) from None


@contextmanager
def process_group_released() -> Iterator[None]:
    """Around a command: when it ends on every rank, destroy the default process group while Python is whole.
    At exit, gloo's threads can abort the process (`terminate called without an active exception`,
    pytorch/pytorch#190489), turning a finished SLURM job FAILED. Not after one rank's failure: destroying it
    while another rank is in a collective can hang (torchtitan#1342)."""
    try:
        yield
    except SIGTERMException:  # Lightning's, from each rank's own flag: another may be in a collective
        raise
    except SystemExit as stop:
        if stop.code in ENDED_TOGETHER:
            _destroy_process_group()
        raise
    else:
        _destroy_process_group()


def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
