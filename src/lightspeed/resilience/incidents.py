"""What the resilience callbacks do only once something happened, loaded then: a preemption's save and exit
(with SLURM's requeue), a non-finite loss, gradient or weights, a full disk, a run folder in use. (Under DDP
the ranks agree on the first non-finite loss here at every check.)"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightspeed.core.config import ConfigError
from lightspeed.core.failures import Preempted, TrainingFailure

if TYPE_CHECKING:
    from lightspeed.resilience.nonfinite import NonFiniteGuard

ADVICE = "try a lower model.optimizer.lr, trainer.gradient_clip_val=1.0, bf16-mixed instead of 16-mixed"


def save_and_stop(trainer: L.Trainer, received: int) -> NoReturn:
    """Save `last.ckpt` where `resume=auto` looks and raise Preempted (`Preemption`)."""
    step = trainer.global_step
    callback = trainer.checkpoint_callback
    if callback is None:  # checkpointing is off (a debug run): stop, saving nothing
        raise Preempted(received, step, None)
    # where `resume=auto` looks: the checkpoint callback's folder, else `<run dir>/checkpoints`
    folder = getattr(callback, "dirpath", None) or Path(trainer.default_root_dir) / "checkpoints"
    path = str(Path(folder) / "last.ckpt")
    if hasattr(callback, "last_model_path"):
        # its own record of last.ckpt, saved with it: after resuming it overwrites the file instead of
        # writing last-v1.ckpt beside it
        callback.last_model_path = path
    trainer.save_checkpoint(path, weights_only=False)  # on every rank: their random states are gathered
    env = getattr(trainer.strategy, "cluster_environment", None)
    if (
        trainer.is_global_zero
        and isinstance(env, SLURMEnvironment)
        and env.auto_requeue
        and received == env.requeue_signal  # SIGUSR1 (--signal=USR1@...); SIGTERM is scancel's, too
    ):
        requeue_slurm_job()  # what Lightning's own SIGUSR1 handler, replaced by this one, would do
    raise Preempted(received, step, path)


def requeue_slurm_job() -> int:
    """`scontrol requeue <job>`: SLURM puts the job back in the queue, and it reruns the same command.
    (`sbatch --requeue` alone does not: it concerns node failures, not a job that exits.)"""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ["SLURM_JOB_ID"]
    code = subprocess.call(["scontrol", "requeue", job])
    if code == 0:
        rank_zero_info(f"requeued SLURM job {job}")
    else:
        rank_zero_warn(f"scontrol requeue {job} failed (exit {code}): resubmit the job to continue")
    return code


def loss_not_finite(
    trainer: L.Trainer, steps: list[tuple[int, int]], finite: list[bool]
) -> TrainingFailure | None:
    """The failure naming the first non-finite loss of any rank (a collective: every rank calls it at the
    same step), or None when every rank's were finite."""
    none = (2**62, 0)
    bad = next((at for at, ok in zip(steps, finite, strict=True) if not ok), none)
    flag = torch.tensor(bad, device=trainer.strategy.root_device)
    step, epoch = (int(v) for v in trainer.strategy.reduce(flag, reduce_op="min"))  # the first rank's
    if step == none[0]:
        return None
    newest = getattr(trainer.checkpoint_callback, "last_model_path", "") or "none saved yet"
    return TrainingFailure(
        f"the training loss was not finite at step {step} (epoch {epoch}): stopped; "
        f"the newest checkpoint ({newest}) predates it; {ADVICE}, or callbacks.nonfinite.action=skip",
        agreed=True,  # every rank reduced the same flag
    )


def weights_not_finite(step: int) -> TrainingFailure:
    return TrainingFailure(
        f"the weights are not finite at step {step} (overflowing gradients?): not saved, stopped; {ADVICE}",
        agreed=True,  # every rank reduced the same flag
    )


def skip_update(
    guard: NonFiniteGuard, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
) -> None:
    """`action=skip` after non-finite gradients: no update from this step (its gradients dropped, the buffers,
    BatchNorm's statistics, as before it), counted and said; too many in a row stop the run."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None
    with torch.no_grad():
        for buffer, saved in zip(pl_module.buffers(), guard._saved_buffers, strict=False):
            buffer.copy_(saved)
    guard.skipped += 1
    guard._consecutive += 1
    if guard._consecutive > guard.max_consecutive_skips:
        raise TrainingFailure(
            f"the gradients were not finite for {guard._consecutive} steps in a row (up to step "
            f"{trainer.global_step}): stopped; {ADVICE}",
            agreed=True,  # all-reduced gradients: every rank counts alike
        )
    if guard.skipped <= 3 or guard.skipped % 100 == 0:
        rank_zero_warn(
            f"non-finite gradients at step {trainer.global_step}: update skipped ({guard.skipped} so far)"
        )


def not_written(checkpoint: dict[str, Any], path: Any) -> TrainingFailure:
    """Never NaN or inf weights over a good checkpoint, whatever saved them (`AtomicCheckpointIO`)."""
    return TrainingFailure(
        f"the weights to be saved in {path} are not finite (step {checkpoint.get('global_step')}): "
        "not written, the previous checkpoint is intact; try a lower model.optimizer.lr or "
        "trainer.gradient_clip_val=1.0"
    )


def out_of_space(err: BaseException, checkpoint: dict[str, Any], target: Path) -> TrainingFailure | None:
    """The failure a full disk (or quota) makes of a checkpoint's write, naming what is kept; None for other
    errors. Full: an OSError saying so, or torch's writer failing on one (its error then names a short
    write, with the OSError as its context, or says "file write failed")."""
    from lightspeed.resilience.checkpoint import tensors

    cause: BaseException | None = err
    while cause is not None and not (
        (isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT))
        or "file write failed" in str(cause)
    ):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return None
    need = sum(t.numel() * t.element_size() for _, t in tensors(checkpoint)) / 2**20
    free = shutil.disk_usage(target.parent).free / 2**20
    kept = sorted(p.name for p in target.parent.glob("*.ckpt"))
    return TrainingFailure(
        f"no space left on the disk of {target.parent} ({free:.0f} MiB free, the checkpoint needs "
        f"~{need:.0f} MiB): {target.name} was not written; kept intact: {', '.join(kept) or 'nothing yet'}; "
        "free some space and rerun the same command to continue, or set paths.log_dir to a larger disk"
    )


def not_locked(err: OSError, handle: IO[str], run_dir: Path) -> None:
    """A run folder's lock not taken (`lock.acquire`): held by another run (a ConfigError naming it), or a
    file system without flock (Lustre noflock, NFS: a warning, and the run goes on unlocked)."""
    if not isinstance(err, BlockingIOError):
        rank_zero_warn(f"{run_dir} cannot be locked ({err.strerror}): two runs of it would not be kept apart")
        return
    handle.seek(0)
    text = handle.read()
    handle.close()
    try:
        info = json.loads(text)
        holder = f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (ValueError, KeyError, TypeError):
        holder = "a process that has not said who it is yet"
    raise ConfigError(
        f"{run_dir} is in use by another run ({holder}): wait for it to end, stop it, or use "
        "run_name=<new name> for a run of your own"
    ) from None
