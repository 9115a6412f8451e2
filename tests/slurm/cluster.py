"""A real SLURM cluster of one host for the tests: munged, slurmctld and slurmd started from Debian's
packages (`.ci/run` installs slurm-wlm and munge) with a config of our own in a temporary folder, and
stopped again: exactly the processes started here."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing() -> str | None:
    """Why no cluster can be started here, or None."""
    for program in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol"):
        if shutil.which(program) is None:
            return f"{program} is not installed (apt-get install slurm-wlm munge; .ci/run does)"
    if os.geteuid() != 0:
        return "the test cluster runs its daemons as root"
    return None


@contextmanager
def cluster(folder: Path, cpus: int = 2) -> Iterator[dict[str, str]]:
    """A running cluster; yields the environment that points SLURM's commands at it (SLURM_CONF)."""
    folder.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (folder / sub).mkdir(exist_ok=True)
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    values = {
        "@HOST@": socket.gethostname(),
        "@DIR@": str(folder),
        "@CTLD_PORT@": str(free_port()),
        "@SLURMD_PORT@": str(free_port()),
        "@CPUS@": str(cpus),
        "@FIRST_JOB_ID@": str(random.Random(os.getpid()).randrange(1000, 9000, 100)),
    }
    text = (HERE / "slurm.conf.in").read_text()
    for name, value in values.items():
        text = text.replace(name, value)
    conf = folder / "slurm.conf"
    conf.write_text(text)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started: list[subprocess.Popen] = []
    try:
        started.append(
            subprocess.Popen(
                ["munged", "--foreground", "--force", f"--key-file={key}",
                 f"--socket={folder / 'munge.socket'}", f"--pid-file={folder / 'munged.pid'}",
                 f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'munge.seed'}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        _wait_for(lambda: (folder / "munge.socket").exists(), 30, "munged did not start", folder)
        for daemon in ("slurmctld", "slurmd"):
            log = open(folder / f"{daemon}.out", "w")  # noqa: SIM115 (the daemon writes it)
            started.append(subprocess.Popen([daemon, "-D", "-f", str(conf)], env=env, stdout=log, stderr=log))
        _wait_for(lambda: _node_idle(env), 60, "the node did not become idle", folder)
        yield env
    finally:
        if len(started) == 3:
            _drain(env)
        for process in reversed(started):
            process.terminate()
        for process in reversed(started):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        _kill_spawned(str(conf))


def _drain(env: dict[str, str], seconds: float = 60) -> None:
    """Let the jobs end before the daemons do: a job whose tasks are done still reports to slurmd and
    slurmctld (submitit returns as soon as the results are written), and its slurmstepd outlives daemons
    stopped before that; a job still running after `seconds` is cancelled."""
    deadline = time.monotonic() + seconds
    while _jobs(env) and time.monotonic() < deadline:
        time.sleep(0.5)
    if _jobs(env):
        subprocess.run(["scancel", "--full", *_jobs(env)], env=env)
        deadline = time.monotonic() + 30
        while _jobs(env) and time.monotonic() < deadline:
            time.sleep(0.5)


def _jobs(env: dict[str, str]) -> list[str]:
    proc = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True)
    return proc.stdout.split() if proc.returncode == 0 else []


def _kill_spawned(conf: str) -> None:
    """SIGKILL whatever this cluster's daemons left running (a job step's slurmstepd, a batch script):
    the processes whose environment points at this cluster's config."""
    mark = f"SLURM_CONF={conf}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), 9)
        except (OSError, ValueError):
            continue


def _node_idle(env: dict[str, str]) -> bool:
    proc = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
    return proc.returncode == 0 and proc.stdout.strip() == "idle"


def _wait_for(ready, seconds: float, what: str, folder: Path) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            logs = "".join(
                f"\n--- {p.name}\n{p.read_text()[-2000:]}"
                for p in sorted(folder.glob("*.log")) + sorted(folder.glob("*.out"))
            )
            raise RuntimeError(f"{what} within {seconds} s{logs}")
        time.sleep(0.2)


def job_state(job: str, env: dict[str, str]) -> str:
    """The job's state as scontrol sees it (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...)."""
    proc = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True)
    for field in proc.stdout.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return "GONE"
