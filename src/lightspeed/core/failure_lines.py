"""The line a failed fit ends in (a rank lost in a collective, memory run out, Ctrl-C, the rank that failed
first), with this run's numbers: loaded only when a fit fails (`failures.exit_on_failure`)."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from subprocess import Popen
from typing import Any

import lightning as L
import torch

from lightspeed.core.failures import is_out_of_memory


def newest_saved(trainer: L.Trainer) -> str:
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


#: What gloo and NCCL say when the process at the other end of a collective is gone.
LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "remote process exited", "Broken pipe")


def lost_peer(err: BaseException) -> str | None:
    """The first line of a collective's error that says another rank is gone; None for other errors."""
    text = str(err).strip()
    if not isinstance(err, RuntimeError) or not any(cause in text for cause in LOST_PEER):
        return None
    first = text.splitlines()[0]
    return first.split("] ", 1)[-1].split(". This is typically", 1)[0][:200]  # gloo's source path, advice


def explained(err: RuntimeError, cfg: Any, trainer: L.Trainer) -> str | None:
    """Each rank's own line for a peer lost in a collective or for running out of memory; None for
    anything else (its traceback)."""
    if (peer := lost_peer(err)) is not None and trainer.world_size > 1:
        return (
            f"rank {trainer.global_rank} lost another rank in a collective ({peer}): that rank or its node "
            f"ended or hung, its own log says why; {newest_saved(trainer)} (on every node)"
        )
    if not is_out_of_memory(err):
        return None
    rank = f"rank {trainer.global_rank}: " if trainer.world_size > 1 else ""
    return f"{rank}{out_of_memory_advice(err, cfg)}"


def stop_ranks(procs: Sequence[Popen[bytes]], kill: Callable[[], None], explained: bool) -> None:
    """End the launched ranks (`kill`); unless the error is `explained` (ours, or out of memory), name the
    rank that failed first: a peer's death (exit 1, its error above) or this rank's own (the error below)."""
    dead = None if explained else _first_dead(procs)
    kill()
    if explained:
        return
    if dead:
        rank, code = dead
        print(
            f"error: rank {rank} exited with code {code} (its error is above); stopped every rank",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    print(f"error: rank 0 failed (below); stopped the other {len(procs)} ranks", file=sys.stderr)


def _first_dead(procs: Sequence[Popen[bytes]]) -> tuple[int, int] | None:
    """(rank, exit code) of the first launched rank that died, waiting up to 2 s: a peer's death reaches
    this rank (a failed collective) before its exit status does."""
    deadline = time.monotonic() + 2.0
    while not any(p.poll() for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    return next(((rank, p.returncode) for rank, p in enumerate(procs, start=1) if p.returncode), None)
