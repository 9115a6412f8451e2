"""Failures during training: non-finite loss, out of memory, preemption signals; each one line."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import TESTS, TINY, run_module
from lightspeed.callbacks import NonFiniteGuard
from lightspeed.train import train
from probes import Fault, Snapshot


def _fails(run, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        run()
    return exit_.value.code, capsys.readouterr().err


def test_a_nan_loss_stops_the_run_naming_the_step_and_no_checkpoint_holds_its_weights(
    train_cfg, run_dir: Path, capsys
) -> None:
    # 5 steps an epoch; the epoch-0 checkpoint is saved at step 5, the loss turns NaN at step 7
    code, err = _fails(lambda: train(train_cfg(*TINY), [Fault("nan", step=6)]), capsys)
    assert code == 3
    assert "error: the training loss was not finite at step 7 (epoch 1)" in err and "last.ckpt" in err
    for path in (run_dir / "checkpoints").glob("*.ckpt"):
        ckpt = torch.load(path, weights_only=True)
        assert ckpt["global_step"] == 5, path
        assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values()), path


def test_the_nan_check_reads_the_device_only_on_its_cadence(train_cfg, monkeypatch) -> None:
    reads = []
    real = NonFiniteGuard._check
    monkeypatch.setattr(
        NonFiniteGuard, "_check", lambda self, trainer: reads.append(1) or real(self, trainer)
    )
    train(train_cfg(*TINY, "callbacks.nonfinite.check_every_n_steps=4", "test_after_fit=false"))
    # steps 4 and 8, the checkpoint saves after the two validations (best + last each) and the end:
    # never once a step
    assert len(reads) == 2 + 4 + 1


def test_skip_drops_the_update_of_a_non_finite_step_and_trains_on(train_cfg, capsys) -> None:
    snap = Snapshot(step=2)
    result = train(
        train_cfg(*TINY, "callbacks.nonfinite.action=skip", "test_after_fit=false"), [Fault("nan", 2), snap]
    )
    (guard,) = [cb for cb in result.trainer.callbacks if isinstance(cb, NonFiniteGuard)]
    assert guard.skipped == 1 and result.trainer.global_step == 10
    for key, before in snap.before["weights"].items():
        assert torch.equal(before, snap.after["weights"][key]), key  # the step changed nothing
    assert snap.after["opt_step"] == snap.before["opt_step"]  # not even the optimizer's state
    assert all(torch.isfinite(p).all() for p in result.model.parameters())
    assert math.isfinite(result.metrics["val/loss"])


def test_out_of_memory_says_what_to_try_and_leaves_loadable_checkpoints(
    train_cfg, run_dir: Path, capsys
) -> None:
    code, err = _fails(lambda: train(train_cfg(*TINY, "data.batch_size=64"), [Fault("oom", step=7)]), capsys)
    assert code == 3 and len(err.strip().splitlines()) == 1
    assert "error: out of memory (CUDA out of memory. Tried to allocate 2.00 GiB (simulated); peak" in err
    assert "data.batch_size=32 trainer.accumulate_grad_batches=2" in err and "bf16-mixed" in err
    saved = list((run_dir / "checkpoints").glob("*"))
    assert saved and all(torch.load(p, weights_only=True)["global_step"] == 5 for p in saved)


@pytest.mark.parametrize("name", ["SIGTERM", "SIGUSR1"])
def test_a_preemption_signal_saves_and_exits_and_the_rerun_continues(
    train_cfg, run_dir: Path, capsys, name: str
) -> None:
    signum = signal.Signals[name]

    def mine(*_: object) -> None:  # the handler the program had before the run
        return None

    outer = signal.signal(signum, mine)
    try:
        code, err = _fails(lambda: train(train_cfg(*TINY), [Fault(name.lower(), step=2)]), capsys)
        assert signal.getsignal(signum) is mine  # the run's handler is gone again: the program's is back
    finally:
        signal.signal(signum, outer)
    assert code == 128 + signal.Signals[name]
    last = run_dir / "checkpoints" / "last.ckpt"
    assert f"preempted by {name}: saved {last} at step 3; rerun the same command to continue" in err
    assert torch.load(last, weights_only=True)["global_step"] == 3
    resumed = train(train_cfg(*TINY))
    assert resumed.trainer.global_step == 10 and "test/acc" in resumed.metrics
    assert torch.load(last, weights_only=True)["global_step"] == 10  # last.ckpt itself, no last-v1.ckpt
    assert not list(last.parent.glob("last-v*.ckpt"))


def test_the_preemption_callback_puts_back_the_handlers_it_replaced() -> None:
    """On its own (in a Trainer, Lightning also puts back every handler it found before fit, so a run
    alone cannot tell whether the callback does)."""
    from types import SimpleNamespace

    from lightspeed.resilience.preemption import Preemption

    def mine(*_: object) -> None:
        return None

    signums = (signal.SIGTERM, signal.SIGUSR1)
    outer = {s: signal.signal(s, mine) for s in signums}
    try:
        preemption = Preemption(signals=["SIGTERM", "SIGUSR1"])
        preemption.on_train_start(SimpleNamespace(received_sigterm=False), None)
        assert all(signal.getsignal(s) == preemption._record for s in signums)  # its own, while training
        preemption.teardown(None, None, "fit")
        assert all(signal.getsignal(s) is mine for s in signums)  # the program's, after
    finally:
        for s, handler in outer.items():
            signal.signal(s, handler)


@pytest.mark.slow  # two real runs (~18 s); the in-process signal tests above cover the logic in make test
def test_sigterm_to_a_real_run_exits_143_within_seconds_and_rerunning_resumes(tmp_path: Path) -> None:
    """What a cluster does: SIGTERM to the training process, some seconds of grace, the job restarted."""
    args = [
        sys.executable,
        "-m",
        "lightspeed.train",
        *TINY,
        "data._target_=probes.SlowDigits",
        "+data.delay=0.2",  # 5 steps an epoch, 1 s each: time to signal it mid-epoch
        f"paths.log_dir={tmp_path}",
    ]
    env = {"PYTHONPATH": str(TESTS), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("train/runs/*/csv/version_0/metrics.csv")) and time.monotonic() < deadline:
        time.sleep(0.2)  # training has started once the logger has written (every step here)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    assert time.monotonic() - sent < 10
    assert "preempted by SIGTERM: saved" in err and "Traceback" not in err
    again = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resume=auto: continuing from" in again.stdout + again.stderr


# --- under DDP (2 CPU processes, gloo) ----------------------------------------------------------------

DDP = [
    "trainer=ddp_cpu",
    *TINY,
    "callbacks.exact_resume.check_every_n_steps=1",
    "+callbacks.fault._target_=probes.Fault",
]


def _ddp_run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = run_module(
        "lightspeed.train", *DDP, f"hydra.run.dir={tmp_path / 'run'}", *extra, cwd=tmp_path, timeout=180
    )
    return proc, time.monotonic() - start


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_ddp_a_rank_that_raises_ends_every_rank_within_a_minute(tmp_path: Path, rank: int) -> None:
    proc, seconds = _ddp_run(
        tmp_path, "+callbacks.fault.kind=raise", "+callbacks.fault.step=3", f"+callbacks.fault.rank={rank}"
    )
    assert proc.returncode != 0 and seconds < 60, (seconds, proc.stderr[-2000:])
    assert f"simulated failure on rank {rank}" in proc.stderr
    said = (
        "error: rank 0 failed (below); stopped the other 1 ranks"
        if rank == 0
        else "error: rank 1 exited with code 3"
    )
    assert said in proc.stderr


@pytest.mark.slow
def test_ddp_out_of_memory_on_every_rank_exits_with_the_first_ranks_line_and_code(tmp_path: Path) -> None:
    proc, seconds = _ddp_run(tmp_path, "+callbacks.fault.kind=oom", "+callbacks.fault.step=3")
    assert proc.returncode == 3 and seconds < 60, (seconds, proc.stderr[-2000:])
    assert "error: rank 0: out of memory (CUDA out of memory." in proc.stderr
    assert "exited with code" not in proc.stderr  # no rank is blamed for what each had


@pytest.mark.slow
def test_ddp_a_rank_killed_outright_ends_every_rank_within_a_minute(tmp_path: Path) -> None:
    proc, seconds = _ddp_run(
        tmp_path, "+callbacks.fault.kind=exit", "+callbacks.fault.step=3", "+callbacks.fault.rank=1"
    )
    assert proc.returncode != 0 and seconds < 60, (seconds, proc.stderr[-2000:])
    assert "error: rank 1 exited with code 9 (its error is above); stopped every rank" in proc.stderr
    assert "Traceback" not in proc.stderr  # not the lost connection's


@pytest.mark.slow
def test_ddp_sigterm_to_the_first_rank_saves_once_for_all_ranks_and_the_rerun_continues(
    tmp_path: Path,
) -> None:
    """Only the process the user started gets the signal; the ranks agree at the next step boundary."""
    fault = ["+callbacks.fault.kind=sigterm", "+callbacks.fault.step=2", "+callbacks.fault.rank=0"]
    proc, _ = _ddp_run(tmp_path, *fault)
    assert proc.returncode == 143, proc.stderr[-3000:]
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert proc.stderr.count("preempted by SIGTERM: saved") == 1 and "at step 3" in proc.stderr
    state = torch.load(last, weights_only=True)
    assert state["global_step"] == 3 and len(state["rank_rng"]["ranks"]) == 2  # both ranks' RNG
    again, _ = _ddp_run(tmp_path, *fault)  # the same command: the fault's step has passed
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resume=auto: continuing from" in again.stdout + again.stderr
    assert torch.load(last, weights_only=True)["global_step"] == 10


def test_ddp_collectives_wait_at_most_the_configured_timeout(train_cfg) -> None:
    from datetime import timedelta

    from lightspeed.run import build, monitor
    from lightspeed.speed import accel

    cfg = train_cfg("trainer=ddp_cpu", "trainer.strategy.timeout.seconds=42")
    accel.resolve(cfg)  # `auto` values become what this device takes, as train() does first
    monitor.settle(cfg)  # the model's monitor into the config, as train() does
    trainer = build.trainer(cfg)
    assert trainer.strategy._timeout == timedelta(seconds=42)  # what init_process_group receives


@pytest.mark.slow
@pytest.mark.parametrize("action", ["stop", "skip"])
def test_ddp_a_nan_on_one_rank_is_handled_alike_on_every_rank(tmp_path: Path, action: str) -> None:
    """The poisoned batch is rank 1's; rank 0 (which prints) must see it too: through the all-reduced
    gradients (skip) or the reduced flag (stop)."""
    # quoted: Hydra reads a bare nan as a float
    nan = ["+callbacks.fault.kind='nan'", "+callbacks.fault.step=2", "+callbacks.fault.rank=1"]
    proc, seconds = _ddp_run(tmp_path, *nan, f"callbacks.nonfinite.action={action}")
    if action == "skip":
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "non-finite gradients at step 2: update skipped (1 so far)" in proc.stdout + proc.stderr
    else:
        assert proc.returncode == 3 and seconds < 60, proc.stderr[-3000:]
        assert proc.stderr.count("error: the training loss was not finite at step 3 (epoch 0)") == 1


def test_slurm_requeue_asks_scontrol_for_this_job(tmp_path: Path, monkeypatch) -> None:
    from lightspeed.resilience.incidents import requeue_slurm_job

    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    assert requeue_slurm_job() == 0
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert requeue_slurm_job() == 0
    assert calls.read_text().splitlines() == ["requeue 4242", "requeue 77_3"]


def test_under_slurm_sigusr1_requeues_the_job_and_sigterm_does_not(tmp_path: Path, monkeypatch) -> None:
    """SIGUSR1 is SLURM's requeue signal (`--signal=USR1@...`); SIGTERM is also what `scancel` sends, and a
    cancelled job must stay cancelled. Both save last.ckpt and stop."""
    from types import SimpleNamespace

    from lightning.fabric.plugins.environments import SLURMEnvironment

    from lightspeed.core.failures import Preempted
    from lightspeed.resilience import incidents, preemption

    requeued: list[int] = []
    monkeypatch.setattr(incidents, "requeue_slurm_job", lambda: requeued.append(1) or 0)
    saved: list[str] = []
    trainer = SimpleNamespace(
        global_step=7,
        checkpoint_callback=SimpleNamespace(dirpath=str(tmp_path), last_model_path=""),
        save_checkpoint=lambda path, weights_only: saved.append(path),
        is_global_zero=True,
        strategy=SimpleNamespace(cluster_environment=SLURMEnvironment(auto_requeue=True)),
    )
    for received, requeues in ((signal.SIGTERM, 0), (signal.SIGUSR1, 1)):
        with pytest.raises(Preempted):
            preemption.Preemption()._save_and_stop(trainer, received)
        assert len(requeued) == requeues, signal.Signals(received).name
    assert saved == [str(tmp_path / "last.ckpt")] * 2


def test_no_checkpoint_with_non_finite_weights_is_ever_written(tmp_path: Path) -> None:
    """Even when the loss stayed finite (gradients that overflowed), or nothing else checked."""
    import lightning as L

    from lightspeed.core.failures import TrainingFailure
    from lightspeed.resilience.checkpoint import AtomicCheckpointIO

    target = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 1}, target)
    with pytest.raises(TrainingFailure, match=r"not finite .*step 2.*not written"):
        io.save_checkpoint({"state_dict": {"w": torch.tensor([1.0, math.inf])}, "global_step": 2}, target)
    assert torch.load(target, weights_only=True)["global_step"] == 1 and not list(tmp_path.glob("*.tmp"))

    guard, module = NonFiniteGuard(), torch.nn.Linear(2, 2)
    with torch.no_grad():
        module.weight[0, 0] = float("nan")
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(TrainingFailure, match="weights are not finite at step 0"):
        guard.on_save_checkpoint(trainer, module, {})


def test_a_cpu_allocation_failure_counts_as_out_of_memory() -> None:
    from lightspeed.core.failures import is_out_of_memory

    cpu = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried"
    )
    assert is_out_of_memory(cpu) and is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


def test_a_collective_that_lost_its_peer_is_told_apart_from_other_errors() -> None:
    """gloo's and NCCL's words for a rank that is gone (under torchrun or SLURM no launcher of ours
    sees it end): one line without gloo's source path and advice; any other error is not one."""
    from lightspeed.core.failure_lines import lost_peer

    gloo = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
        "[127.0.0.1]:64210: Connection reset by peer. This is typically caused by a remote worker "
        "hanging or bugs in the application."
    )
    assert lost_peer(gloo) == "Read error [127.0.0.1]:64210: Connection reset by peer"
    assert (
        lost_peer(RuntimeError("NCCL error: remote process exited or there was a network error")) is not None
    )
    assert lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    assert lost_peer(ValueError("Connection reset by peer")) is None  # a collective raises RuntimeError


def test_a_rank_that_lost_its_peer_says_one_line_naming_itself_and_exits_3(tmp_path: Path, capsys) -> None:
    """What each surviving rank prints (the slow multi-node test kills a real rank): the line, the newest
    checkpoint to continue from, exit 3; alone (one rank) the same error is not taken for a lost peer."""
    from types import SimpleNamespace

    from lightspeed.core.failures import TRAINING_FAILURE_EXIT, exit_on_failure

    last = tmp_path / "last.ckpt"
    torch.save({"global_step": 40}, last)
    gone = RuntimeError(
        "[pair.cc:545] Read error [10.0.0.2]:64210: Connection reset by peer. This is typically"
    )

    def trainer(world_size: int) -> SimpleNamespace:
        return SimpleNamespace(
            global_rank=1,
            world_size=world_size,
            strategy=SimpleNamespace(cluster_environment=None, launcher=None),
            checkpoint_callback=SimpleNamespace(last_model_path=str(last)),
        )

    with pytest.raises(SystemExit) as stop, exit_on_failure({}, trainer(world_size=2)):
        raise gone
    assert stop.value.code == TRAINING_FAILURE_EXIT
    assert capsys.readouterr().err.splitlines() == [
        "error: rank 1 lost another rank in a collective (Read error [10.0.0.2]:64210: Connection reset by "
        "peer): that rank or its node ended or hung, its own log says why; the newest checkpoint is "
        f"{last} (step 40); rerun the same command to continue from it (on every node)"
    ]
    with (
        pytest.raises(RuntimeError, match="Connection reset by peer"),
        exit_on_failure({}, trainer(world_size=1)),
    ):
        raise gone


def test_several_machines_without_a_launcher_is_one_line_not_a_wait_for_the_others(
    train_cfg, monkeypatch, capsys
) -> None:
    """trainer.num_nodes=2 started as a plain command would wait at the rendezvous for a node that never
    comes; under torchrun or SLURM (their variables set) it is the command each machine runs."""
    from lightspeed.core.config import CLUSTER_VARIABLES
    from lightspeed.train import train

    for name in CLUSTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exit_:
        train(train_cfg("trainer.num_nodes=2", "trainer.max_epochs=1"))
    err = capsys.readouterr().err
    assert (
        exit_.value.code == 2
        and "error: trainer.num_nodes=2 needs each machine's processes started by" in err
    )
