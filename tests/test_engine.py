"""The engine as a distribution: its wheel holds the package, the engine's config groups and its version,
and installed into a fresh venv it runs a project that has nothing of the engine but a `conf/` of its own.

The fresh venv sees this environment's dependencies (torch, Lightning, ...) through a path file, so the test
installs nothing from the network; the engine itself comes only from the wheel (this checkout's editable
install is not on that venv's path: a path file's entries are added as they are, their own .pth files are
not read)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import MACHINE_FILES
from lightspeed import CONF_DIR, ENGINE_CONF, __version__

REPO = Path(__file__).resolve().parent.parent
ENGINE_GROUPS = sorted(p.name for p in ENGINE_CONF.iterdir() if p.is_dir() and p.name != "__pycache__")


def run(*args: str | Path, cwd: Path | None = None, env: dict | None = None) -> str:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{args}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc.stdout


def copy_source(dest: Path) -> Path:
    """This checkout's source tree, without what was built or downloaded into it (src/lightspeed/data is
    code: only the top-level folders are left out)."""
    top = {".git", "logs", "data", "build", "dist"}

    def ignore(folder: str, names: list[str]) -> list[str]:
        here = top if Path(folder) == REPO else set()
        built = (".venv", "__pycache__")
        return [n for n in names if n in here or n.startswith(built) or n.endswith(".egg-info")]

    shutil.copytree(REPO, dest, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    source = copy_source(out / "source")  # a copy: a build writes build/ and *.egg-info into its tree
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, source)
    (found,) = out.glob("lightspeed-*.whl")
    return found


def fresh_venv(root: Path) -> Path:
    """A venv without the engine that sees this environment's dependencies; returns its python."""
    run(sys.executable, "-m", "venv", "--without-pip", root)
    python = root / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    (site / "_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


def pip(python: Path, *args: str | Path) -> str:
    """This environment's pip, installing into `python`'s venv, from nothing but local files."""
    return run(sys.executable, "-m", "pip", "--python", python, "install", "--no-index", "-q", *args)


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel: Path) -> Path:
    root = tmp_path_factory.mktemp("venv")
    pip(fresh_venv(root), "--no-deps", wheel)
    return root


@pytest.mark.slow  # a wheel built, a venv made, a run trained in it: ~40 s
def test_the_wheel_carries_the_version_and_the_engine_s_config_groups(wheel: Path) -> None:
    assert wheel.name.startswith(f"lightspeed-{__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    for group in ENGINE_GROUPS:
        prefix = f"lightspeed/conf/{group}/"
        shipped = sorted(n for n in names if n.startswith(prefix) and n.endswith(".yaml"))
        here = sorted(
            f"{prefix}{p.relative_to(ENGINE_CONF / group).as_posix()}"
            for p in (ENGINE_CONF / group).rglob("*.yaml")
        )
        assert shipped == here and here, group
    assert not any(n.startswith(("conf/", "tests/")) for n in names)  # the project's part stays out


@pytest.mark.slow
def test_installed_from_the_wheel_it_says_its_version_and_trains_a_project_of_only_conf(
    venv: Path, tmp_path: Path
) -> None:
    assert run(venv / "bin" / "lightspeed", "--version").strip() == f"lightspeed {__version__}"
    where = run(venv / "bin" / "python", "-c", "import lightspeed; print(lightspeed.__file__)")
    assert where.startswith(str(venv)), where  # the wheel's copy, not this checkout's

    project = tmp_path / "project"
    shutil.copytree(REPO / "conf", project / "conf", ignore=MACHINE_FILES)
    assert not any((project / "conf" / group).exists() for group in ENGINE_GROUPS)
    # a project adds an option to an engine group with a file of its own
    (project / "conf" / "trainer").mkdir()
    (project / "conf" / "trainer" / "short.yaml").write_text("defaults:\n  - default\nmax_epochs: 1\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LIGHTSPEED_CONF")}
    lightspeed = venv / "bin" / "lightspeed"
    composed = run(lightspeed, "train", "trainer=short", "--cfg", "job", cwd=project, env=env)
    assert "max_epochs: 1\n" in composed and "accelerator: auto" in composed  # the option, on the engine's

    run(
        lightspeed, "train", "trainer=short", "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "print_config=false",
        "callbacks.rich_progress_bar=null", "curves=false", cwd=project, env=env,
    )  # fmt: skip
    (run_dir,) = (project / "logs" / "train" / "runs").iterdir()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and (run_dir / "summary.json").is_file()


def lightspeed(*args: str, cwd: Path = REPO, conf: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LIGHTSPEED_CONF"}
    if conf is not None:
        env["LIGHTSPEED_CONF"] = str(conf)
    return subprocess.run(
        [sys.executable, "-m", "lightspeed.cli", *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_lightspeed_says_its_version_and_refuses_an_unknown_command_in_one_line() -> None:
    assert lightspeed("--version").stdout == f"lightspeed {__version__}\n"
    proc = lightspeed("trian")
    assert proc.returncode == 2 and proc.stdout.splitlines() == [
        "error: trian is not a command: use one of train, eval, viz, export, shards, compare, doctor, bench, "
        "tune (lightspeed --help)"
    ]


@pytest.mark.slow  # a fresh process for one config print (~6 s): make test stays within 4 minutes
def test_lightspeed_viz_is_eval_with_viz_on() -> None:
    proc = lightspeed("viz", "--cfg", "job")
    assert proc.returncode == 0, proc.stderr
    assert "\nviz: true\n" in proc.stdout and "\npredict: false\n" in proc.stdout


@pytest.mark.slow  # over 9 s on the 2-core CI machine: make test stays within 4 minutes
def test_a_project_s_file_adds_an_option_to_an_engine_group_or_replaces_one(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf, ignore=MACHINE_FILES)
    (conf / "trainer").mkdir()
    (conf / "trainer" / "short.yaml").write_text("defaults:\n  - default\nmax_epochs: 1\n")
    (conf / "accel").mkdir()
    replaced = (
        (ENGINE_CONF / "accel" / "default.yaml")
        .read_text()
        .replace("matmul_precision: high ", "matmul_precision: medium ")
    )
    (conf / "accel" / "default.yaml").write_text(replaced)
    proc = lightspeed("train", "trainer=short", "--cfg", "job", cwd=tmp_path, conf=conf)
    assert proc.returncode == 0, proc.stderr
    assert (
        "  max_epochs: 1\n" in proc.stdout and "  accelerator: auto\n" in proc.stdout
    )  # on the engine's default
    assert "  matmul_precision: medium\n" in proc.stdout  # the project's accel/default.yaml, not the engine's
    proc = lightspeed("train", "trainer=long", cwd=tmp_path, conf=conf)
    assert proc.returncode == 2
    assert (
        "trainer=long is not an option: use one of cpu, ddp, ddp_cpu, default, fsdp, gpu, short "
        in proc.stderr
    )


@pytest.mark.slow  # two gloo ranks started through the CLI: ~30 s
def test_lightspeed_train_starts_ddp_ranks_that_run_the_same_command(tmp_path: Path) -> None:
    """Lightning starts the other ranks by rerunning `python -m <__main__'s module>` with this process's
    arguments: through `lightspeed train` those must be lightspeed.train's own."""
    proc = lightspeed(
        "train", "trainer=ddp_cpu", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "print_config=false",
        "callbacks.rich_progress_bar=null", "curves=false", f"paths.log_dir={tmp_path}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "training finished" in proc.stdout
