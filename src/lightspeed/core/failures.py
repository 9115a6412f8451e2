"""Failures during training, each ending the run with one line that says what happened and what to try, and
an exit code (docs/resilience.md): 3 a failure explained here, 128 + N preempted by signal N after saving a
checkpoint, 1 anything unexpected (with its traceback). Under trainer=ddp these are the first rank's codes."""

from __future__ import annotations

import resource
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.utilities import rank_zero_only
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

    def line(self) -> str:
        name = signal.Signals(self.signum).name
        if self.path is None:
            return (
                f"preempted by {name} at step {self.step}: nothing saved (trainer.enable_checkpointing=false)"
            )
        return (
            f"preempted by {name}: saved {self.path} at step {self.step}; rerun the same command to continue "
            "(resume=auto)"
        )


def _newest_saved(trainer: L.Trainer) -> str:
    """What a rerun continues from, in words."""
    callback = trainer.checkpoint_callback
    path = getattr(callback, "last_model_path", "") or getattr(callback, "best_model_path", "")
    if not path or not Path(path).exists():
        return "no checkpoint was saved yet (a rerun starts over)"
    file = Path(path) / "meta.pt" if Path(path).is_dir() else path  # sharded: its meta.pt holds the position
    step = torch.load(file, map_location="cpu", weights_only=True, mmap=True).get("global_step")
    return f"the newest checkpoint is {path} (step {step}); rerun the same command to continue from it"


def out_of_memory_advice(err: BaseException, cfg: Any) -> str:
    """What ran out, the peak, and three ways to need less, with this run's numbers filled in."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(device).total_memory
        peak = (
            f"peak {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB allocated, "
            f"{torch.cuda.max_memory_reserved(device) / 2**30:.2f} GiB reserved of {total / 2**30:.1f} GiB"
        )
    else:  # ru_maxrss is in KiB on Linux
        peak = f"peak process memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"
    batch = int(cfg.data.batch_size)
    accumulate = int(cfg.trainer.get("accumulate_grad_batches") or 1)
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (
        f"out of memory ({first_line[:120]}; {peak}): try data.batch_size={max(1, batch // 2)} "
        f"trainer.accumulate_grad_batches={accumulate * 2} (the same effective batch), "
        "trainer.precision=bf16-mixed (or 16-mixed), or activation checkpointing "
        "(torch.utils.checkpoint) in the net; checkpoints already saved are intact"
    )


def is_out_of_memory(err: BaseException) -> bool:
    """torch's OutOfMemoryError (CUDA, MPS), or the CPU allocator's, which is a plain RuntimeError."""
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(err)
    )


#: What gloo and NCCL say when the process at the other end of a collective is gone.
LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "remote process exited", "Broken pipe")


def lost_peer(err: BaseException) -> str | None:
    """The first line of a collective's error that says another rank is gone; None for other errors."""
    text = str(err).strip()
    if not isinstance(err, RuntimeError) or not any(cause in text for cause in LOST_PEER):
        return None
    first = text.splitlines()[0]
    return first.split("] ", 1)[-1].split(". This is typically", 1)[0][:200]  # gloo's source path, advice


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
    except Preempted as stop:
        _say(stop.line())
        raise SystemExit(0 if launched else 128 + stop.signum) from None
    except SystemExit as stop:
        # Lightning's exit after a KeyboardInterrupt (trainer.interrupted alone is true after any error)
        if not isinstance(stop.__context__, KeyboardInterrupt) or stop.code != 1:
            raise
        _say(f"interrupted by SIGINT (Ctrl-C) at step {trainer.global_step}: {_newest_saved(trainer)}")
        raise SystemExit(128 + signal.SIGINT) from None
    except TrainingFailure as err:
        _say(f"error: {err}")
        raise SystemExit(0 if launched else TRAINING_FAILURE_EXIT) from None
    except RuntimeError as err:  # torch.OutOfMemoryError is one
        line = _explained(err, cfg, trainer)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        raise SystemExit(TRAINING_FAILURE_EXIT) from None


def _explained(err: RuntimeError, cfg: Any, trainer: L.Trainer) -> str | None:
    """Each rank's own line for a peer lost in a collective or for running out of memory; None for
    anything else (its traceback)."""
    if (peer := lost_peer(err)) is not None and trainer.world_size > 1:
        return (
            f"rank {trainer.global_rank} lost another rank in a collective ({peer}): that rank or its node "
            f"ended or hung, its own log says why; {_newest_saved(trainer)} (on every node)"
        )
    if not is_out_of_memory(err):
        return None
    rank = f"rank {trainer.global_rank}: " if trainer.world_size > 1 else ""
    return f"{rank}{out_of_memory_advice(err, cfg)}"


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


@rank_zero_only
def _say(message: str) -> None:
    print(message, file=sys.stderr)
