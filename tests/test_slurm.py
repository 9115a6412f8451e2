"""Jobs on a real SLURM cluster of one host (tests/slurm/cluster.py; `.ci/run` installs SLURM): the
sbatch script trains a 2-task DDP job as the same run started by hand does, and a job that is signalled
or cancelled continues, bit-identical, when SLURM requeues it or it is submitted again."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from conftest import LIMIT, TESTS, run_module
from slurm.cluster import cluster, job_state, missing

pytestmark = [
    pytest.mark.slow,  # daemons to start, jobs of two DDP ranks (~3 min)
    pytest.mark.skipif(missing() is not None, reason=str(missing())),
    pytest.mark.xdist_group("slurm"),
]

REPO = TESTS.parent
SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"
QUIET = [  # a short run that prints little and saves at the step after a signal
    *LIMIT,
    "trainer.num_sanity_val_steps=0",
    "callbacks.rich_progress_bar=null",
    "trainer.enable_progress_bar=false",
    "print_config=false",
    "curves=false",
    "callbacks.exact_resume.check_every_n_steps=1",
]
RUN = ["trainer=ddp_cpu", *QUIET]
PAUSE = ["+callbacks.pause._target_=probes.Pause", "+callbacks.pause.seconds=0.5"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[dict[str, str]]:
    with cluster(tmp_path_factory.mktemp("slurm")) as env:
        yield {
            **env,
            "VENV": str(Path(os.sys.executable).parent.parent),
            "PYTHONPATH": str(TESTS),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
        }


def submit(env: dict[str, str], folder: Path, *overrides: str) -> str:
    proc = subprocess.run(
        ["sbatch", "--parsable", "--ntasks-per-node=2", str(SBATCH), *RUN, f"hydra.run.dir={folder / 'run'}",
         *overrides],
        cwd=folder, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout.strip().split(";")[0]


def wait_until(done, seconds: float, what: str, folder: Path) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            out = "".join(p.read_text()[-3000:] for p in folder.glob("slurm-*.out"))
            raise AssertionError(f"{what} within {seconds} s\n{out}")
        time.sleep(0.2)


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def by_hand(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The weights of the same run started by hand, never stopped: what every job must end with (the pause
    of the signalled jobs only sleeps), trained once for the module."""
    folder = tmp_path_factory.mktemp("by_hand")
    proc = run_module("lightspeed.train", *RUN, f"hydra.run.dir={folder / 'hand'}", cwd=folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return weights(folder / "hand")


def test_a_two_task_job_trains_the_run_that_the_same_command_by_hand_trains(
    slurm, by_hand: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    job = submit(slurm, tmp_path)
    wait_until(
        lambda: job_state(job, slurm) in ("COMPLETED", "FAILED", "CANCELLED", "GONE"),
        300,
        "the job",
        tmp_path,
    )
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert job_state(job, slurm) == "COMPLETED", out[-3000:]
    assert out.count("Lightspeed: training finished") == 1 and "Traceback" not in out
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in out  # both ranks started by SLURM, none by Lightning
    assert same(weights(tmp_path / "run"), by_hand)


FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "GONE")


def after_first_checkpoint(job: str, env: dict[str, str], folder: Path) -> None:
    last = folder / "run" / "checkpoints" / "last.ckpt"
    wait_until(lambda: last.exists() or job_state(job, env) in FINAL, 300, "the first checkpoint", folder)
    assert last.exists(), "".join(p.read_text()[-3000:] for p in folder.glob("slurm-*.out"))
    time.sleep(1.0)  # into the second epoch


def test_a_job_signalled_before_its_end_saves_is_requeued_and_ends_as_if_never_stopped(
    slurm, by_hand: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    """SLURM's warning before a time limit (--signal=USR1@90), sent by hand: the ranks save at the next
    step, rank 0 requeues the job, SLURM runs the script again, and it continues from the checkpoint."""
    job = submit(slurm, tmp_path, *PAUSE)
    after_first_checkpoint(job, slurm, tmp_path)
    subprocess.run(["scancel", "--signal=USR1", job], env=slurm, check=True)
    out = tmp_path / f"slurm-{job}.out"
    wait_until(lambda: "resume=auto: continuing from" in out.read_text(), 300, "the requeued job", tmp_path)
    wait_until(lambda: job_state(job, slurm) in FINAL, 300, "the end of the requeued job", tmp_path)
    said = out.read_text()
    assert job_state(job, slurm) == "COMPLETED", said[-3000:]
    assert said.count("preempted by SIGUSR1: saved") == 1 and f"requeued SLURM job {job}" in said
    assert said.count("Lightspeed: training finished") == 1
    assert same(weights(tmp_path / "run"), by_hand)


def test_a_cancelled_job_submitted_again_continues_where_it_stopped(
    slurm, by_hand: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    job = submit(slurm, tmp_path, *PAUSE)
    after_first_checkpoint(job, slurm, tmp_path)
    subprocess.run(["scancel", job], env=slurm, check=True)  # SIGTERM to every task, then SIGKILL
    wait_until(lambda: job_state(job, slurm) in FINAL, 120, "the cancelled job's end", tmp_path)
    first = (tmp_path / f"slurm-{job}.out").read_text()
    assert "preempted by SIGTERM: saved" in first and "Lightspeed: training finished" not in first, first[
        -3000:
    ]
    again = submit(slurm, tmp_path, *PAUSE)
    wait_until(lambda: job_state(again, slurm) in FINAL, 300, "the second job", tmp_path)
    said = (tmp_path / f"slurm-{again}.out").read_text()
    assert job_state(again, slurm) == "COMPLETED" and "resume=auto: continuing from" in said, said[-3000:]
    assert same(weights(tmp_path / "run"), by_hand)
