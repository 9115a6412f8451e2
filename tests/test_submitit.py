"""Sweeps submitted through Hydra's submitit launcher (hydra-submitit-launcher, the `cluster` extra):
`-m hydra/launcher=slurm` makes one job per point on a real SLURM cluster of one host (tests/slurm/),
each a 2-rank DDP run in its own folder, collected in the sweep table; a job signalled before its end
saves, is requeued and ends as if never stopped. `hydra/launcher=local`: the same without a cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import TESTS, run_module
from slurm.cluster import cluster, missing
from test_slurm import PAUSE, same, weights
from test_slurm import QUIET as RUN

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the cluster extra is not installed")

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]  # jobs of 2 ranks, one after the other


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[dict[str, str]]:
    if missing() is not None:
        pytest.skip(str(missing()))
    with cluster(tmp_path_factory.mktemp("slurm")) as env:
        yield {**env, "PYTHONPATH": str(TESTS), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def test_a_sweep_submitted_to_slurm_runs_a_ddp_job_per_point_and_a_signalled_job_resumes(
    slurm, tmp_path: Path
) -> None:
    """Two points that compute the same (`run_name=a,b`: only the folder differs), each a job of 2 tasks.
    Job a gets SLURM's warning before a time limit (SIGUSR1, as `--signal` sends it) after its first
    checkpoint: it saves, requeues itself and ends with b's weights; the table shows both runs done."""
    logs = tmp_path / "logs"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "lightspeed.train", "-m", "hydra/launcher=slurm", "trainer=ddp_cpu",
         "hydra.launcher.tasks_per_node=2", *RUN, *PAUSE, f"paths.log_dir={logs}", "run_name=a,b"],
        cwd=tmp_path, env=slurm, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        first = logs / "train" / "runs" / "a" / "checkpoints" / "last.ckpt"
        deadline = time.monotonic() + 300
        while not first.exists() and sweep.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first.exists(), (
            sweep.communicate(timeout=60)[0][-3000:] if sweep.poll() is not None else "no ckpt"
        )
        time.sleep(1.0)  # into the second epoch
        running = subprocess.run(
            ["squeue", "-h", "-t", "R", "-o", "%i"], env=slurm, capture_output=True, text=True, check=True
        ).stdout.split()
        assert len(running) == 1, running  # one job of 2 tasks fills the 2 CPUs: a's
        subprocess.run(["scancel", "--signal=USR1", running[0]], env=slurm, check=True)
        out, _ = sweep.communicate(timeout=420)
    finally:
        if sweep.poll() is None:
            sweep.send_signal(signal.SIGINT)
            sweep.wait(timeout=60)
            subprocess.run(["scancel", "--user", str(os.getuid())], env=slurm)
    assert sweep.returncode == 0, out[-3000:]
    table = next((logs / "train" / "sweeps").glob("*.md")).read_text()
    rows = [line for line in table.splitlines() if line.startswith("| run_name=")]
    assert len(rows) == 2 and all("| done |" in row for row in rows), table
    said = "".join(p.read_text() for p in (logs / "train" / "submitit").rglob("*_log.*"))
    assert said.count("preempted by SIGUSR1: saved") == 1 and "requeued SLURM job" in said, said[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in said  # both ranks started by SLURM, none by Lightning
    assert same(weights(logs / "train" / "runs" / "a"), weights(logs / "train" / "runs" / "b"))


def test_a_local_sweep_runs_each_job_in_its_own_process_and_collects_the_table(tmp_path: Path) -> None:
    proc = run_module(
        "lightspeed.train", "-m", "hydra/launcher=local", "trainer=cpu", *RUN, f"paths.log_dir={tmp_path}",
        "model.optimizer.lr=1e-3,3e-3", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Lightspeed: sweep of 2 runs" in proc.stdout
    runs = sorted(p.parent.name for p in (tmp_path / "train" / "runs").glob("*/summary.json"))
    assert len(runs) == 2 and all(name in proc.stdout for name in runs)
    assert len(list((tmp_path / "train" / "submitit").glob("*/*_result.pkl"))) == 2  # a process each
