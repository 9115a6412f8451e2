"""The container (Dockerfile, `make docker-build`, `make docker-train`, `make docker-doctor`), built and run
for real: a Docker daemon of the test's own, and a base image made from Debian's packages (no registry is
reachable here), with torch's CPU build from this machine's disk. `.ci/run` installs Docker and debootstrap;
without them, or without root to start the daemon, the slow tests skip, saying why."""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from conftest import REPO

USER = 4321  # the caller: not root, so that a file the container wrote as root would show
RUN = ["trainer.max_epochs=4", "trainer.deterministic=true"]  # the default task, a few epochs
WHEELS = "/opt/wheels/torch-2.13.0+cpu-*.whl"  # torch's CPU build on this machine's disk (PyPI's is ~3 GB)


def _missing() -> str | None:
    if os.name != "posix" or os.geteuid() != 0:
        return "starting a Docker daemon needs root"
    for tool in ("dockerd", "docker", "debootstrap", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/run installs docker.io and debootstrap)"
    if not glob.glob(WHEELS):
        return f"no torch CPU wheel at {WHEELS} to build the test image with"
    return None


def _run(cmd: list[str], env: dict[str, str], timeout: float = 900, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)


def _make(env: dict[str, str], *args: str, **kw) -> subprocess.CompletedProcess[str]:
    """`make` in the repository, as the calling user (USER), with the daemon the fixture started."""
    return _run(
        ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", "make", *args],
        env,
        cwd=REPO,
        **kw,
    )


def _checked(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def docker() -> Iterator[dict[str, str]]:
    """A dockerd of its own (socket, data and state in a temporary folder; the caller's group may use it),
    the base image, and the project's image built with `make docker-build`; all gone afterwards."""
    if (why := _missing()) is not None:
        pytest.skip(why)
    home = Path(tempfile.mkdtemp(prefix="lsd-"))  # short: the daemon's socket paths have a length limit
    home.chmod(0o755)  # the caller's folders are made in it (pytest's tmp_path is root's alone)
    sock = home / "docker.sock"
    log = (home / "dockerd.log").open("w")
    daemon = subprocess.Popen(
        ["dockerd", "--bridge=none", "--iptables=false", "--ip-forward=false", f"--group={USER}",
         f"--host=unix://{sock}", f"--data-root={home / 'root'}", f"--exec-root={home / 'exec'}",
         f"--pidfile={home / 'dockerd.pid'}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    env = {**os.environ, "DOCKER_HOST": f"unix://{sock}", "HOME": str(home)}
    try:
        deadline = time.monotonic() + 60
        while _run(["docker", "info"], env).returncode != 0:
            assert daemon.poll() is None and time.monotonic() < deadline, (home / "dockerd.log").read_text()
            time.sleep(0.5)
        yield {**env, "BUILD_SECONDS": str(_build(home, env)), "LSD_HOME": str(home)}
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        for mount in reversed(Path("/proc/self/mounts").read_text().splitlines()):  # the daemon's netns
            if mount.split()[1].startswith(str(home)):
                subprocess.run(["umount", "-l", mount.split()[1]], check=False)
        shutil.rmtree(home, ignore_errors=True)


def _build(home: Path, env: dict[str, str]) -> float:
    """Debian bookworm's packages (debootstrap) as a base, with torch's CPU wheel and this machine's
    certificates (a proxy's CA, where there is one) for pip; then `make docker-build` on it. Seconds."""
    rootfs = home / "rootfs"
    packages = "--include=python3,python3-venv,python3-dev,ca-certificates,make,g++,git"
    debian = "http://deb.debian.org/debian"
    _checked(_run(["debootstrap", "--variant=minbase", packages, "bookworm", str(rootfs), debian], env))
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    _checked(_run(["docker", "import", "-", "lightspeed-test/debian:bookworm"], env, stdin=tar.stdout))
    tar.wait()
    shutil.rmtree(rootfs)
    context = home / "base"
    context.mkdir()
    wheel = Path(glob.glob(WHEELS)[0])
    shutil.copy(wheel, context)
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", context)
    (context / "Dockerfile").write_text(
        "FROM lightspeed-test/debian:bookworm\n"
        f"COPY {wheel.name} /opt/wheels/\n"
        "COPY ca-certificates.crt /etc/ssl/certs/\n"
        "ENV PIP_FIND_LINKS=/opt/wheels PIP_CERT=/etc/ssl/certs/ca-certificates.crt\n"
    )
    _checked(_run(["docker", "build", "-t", "lightspeed-test/base", str(context)], env))
    start = time.monotonic()
    build = ["--network host --build-arg BASE=lightspeed-test/base --build-arg TORCH=torch==2.13.0"]
    _checked(
        _run(["make", "docker-build", "IMAGE=lightspeed-test", f"DOCKER_BUILD={build[0]}"], env, cwd=REPO)
    )
    return time.monotonic() - start


def _folder(docker: dict[str, str], name: str) -> Path:
    """A folder of the caller's, for a run's logs/ and data/."""
    folder = Path(docker["LSD_HOME"]) / name
    folder.mkdir()
    os.chown(folder, USER, USER)
    return folder


def _train(docker: dict[str, str], logs: Path, *args: str) -> subprocess.Popen[str]:
    cmd = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", "make", "docker-train",
           "IMAGE=lightspeed-test", f"LOGS={logs}", f"DATA={logs.parent / 'data'}", *args, *RUN]  # fmt: skip
    return subprocess.Popen(
        cmd, env=docker, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _weights(logs: Path) -> dict[str, torch.Tensor]:
    (last,) = logs.glob("train/runs/*/checkpoints/last.ckpt")
    return torch.load(last, map_location="cpu", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def whole(docker: dict[str, str]) -> Path:
    """The default trained in a container, never stopped, its logs/ the host's."""
    logs = _folder(docker, "whole") / "logs"
    proc = _train(docker, logs, "DOCKER_RUN=--network none")
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    return logs


pytestmark = [pytest.mark.xdist_group("docker")]


@pytest.mark.slow
def test_the_image_trains_the_default_into_the_host_s_logs_as_the_calling_user(whole: Path) -> None:
    written = list(whole.parent.rglob("*"))
    assert any(p.name == "summary.json" for p in written) and any(p.suffix == ".ckpt" for p in written)
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in written}
    assert owners == {(USER, USER)}, f"files owned by {owners}, not only the caller ({USER})"


@pytest.mark.slow
def test_a_killed_container_resumes_in_the_next_and_ends_with_the_uninterrupted_weights(
    docker: dict[str, str], whole: Path
) -> None:
    logs = _folder(docker, "killed") / "logs"
    name = f"lightspeed-test-{os.getpid()}"
    proc = _train(docker, logs, f"DOCKER_RUN=--network none --name {name}")
    deadline = time.monotonic() + 600
    while not list(logs.glob("train/runs/*/checkpoints/*.ckpt")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.1)
    _checked(_run(["docker", "kill", name], docker))
    first, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "exited with 137: killed (SIGKILL)" in first, first[-3000:]
    again = _train(docker, logs, "DOCKER_RUN=--network none")  # the same command, a new container
    out, _ = again.communicate(timeout=900)
    assert again.returncode == 0, out[-3000:]
    assert "resume=auto: continuing from /app/logs/train/runs/" in out, out[-3000:]
    resumed, uninterrupted = _weights(logs), _weights(whole)
    assert resumed.keys() == uninterrupted.keys()
    for key, value in uninterrupted.items():
        assert torch.equal(value, resumed[key]), key


@pytest.mark.slow
def test_doctor_in_the_container_says_its_versions_and_what_it_can_run(docker: dict[str, str]) -> None:
    folder = _folder(docker, "doctor")
    where = [f"LOGS={folder / 'logs'}", f"DATA={folder / 'data'}", "DOCKER_RUN=--network none"]
    proc = _checked(_make(docker, "docker-doctor", "IMAGE=lightspeed-test", *where, "ARGS=--quick"))
    out = " ".join(proc.stdout.split())
    assert re.search(r"python / torch / lightning │ 3\.11\.\d+ / 2\.13\.0\+cpu / 2\.6\.\d+", out), out
    assert "CUDA build / cuDNN / NCCL │ none (CPU build)" in out, out
    assert "container │ yes; no CUDA in the image" in out, out


def _dockerfile_arg(name: str) -> str:
    found = re.search(rf'^ARG {name}="?([^"\n]+)"?$', (REPO / "Dockerfile").read_text(), re.M)
    assert found, f"the Dockerfile has no ARG {name}"
    return found.group(1)


def test_the_image_s_cuda_base_matches_the_cuda_of_the_torch_it_installs() -> None:
    """The default base is NVIDIA's runtime for the CUDA that the pinned torch's PyPI build carries (checked
    against the torch installed here when it is that build: CI's newest stage), and the CPU variant pins the
    same torch."""
    torch_pin = _dockerfile_arg("TORCH")
    base = _dockerfile_arg("BASE")
    assert re.fullmatch(r"torch==\d+\.\d+\.\d+", torch_pin), torch_pin
    assert (
        f'TORCH="{torch_pin} --index-url https://download.pytorch.org/whl/cpu"'
        in (REPO / "scripts" / "docker.mk").read_text()
    )
    cuda = re.fullmatch(r"nvidia/cuda:(\d+\.\d+)\.\d+-runtime-ubuntu\d+\.\d+", base)
    assert cuda, base
    if torch.__version__.split("+")[0] != torch_pin.split("==")[1] or torch.version.cuda is None:
        pytest.skip(f"torch {torch.__version__} here is not the Dockerfile's {torch_pin} CUDA build")
    assert cuda.group(1) == torch.version.cuda, (
        f"{base} carries CUDA {cuda.group(1)}, torch {torch.version.cuda}"
    )
