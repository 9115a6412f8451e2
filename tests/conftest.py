"""Shared fixtures: composing configs as the command line would, small runs in temporary folders."""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from omegaconf import DictConfig

from lightspeed.core.logs import silence_known_noise
from lightspeed.testing import QUIET

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
#: For copying conf/: leaves out what belongs to this machine and git ignores (conf/local/, make tune's file).
MACHINE_FILES = shutil.ignore_patterns("local", "tuned.yaml")

silence_known_noise()

Compose = Callable[..., DictConfig]


@pytest.fixture(autouse=True, scope="session")
def _threads() -> None:
    """Keep small runs small: tiny CPU runs are slower with many intra-op threads on a shared 2-core box,
    and `make test` runs a pytest process per core (pytest-xdist): a thread each, then. (torch is imported
    here and in the tests, not as this file loads: xdist's own process, which starts the others, runs
    none.)"""
    import torch

    torch.set_num_threads(1 if "PYTEST_XDIST_WORKER" in os.environ else min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True, scope="session")
def _yaml_parsed_once() -> Iterator[None]:
    """A test process composes a thousand configs from the same few dozen yaml files, and Hydra reads each
    file again for each composition (half of its ~0.1 s). Here a regular file is read once for each
    content it has had, and each composition gets its own copy of what was read."""
    from importlib import resources

    from hydra._internal.config_repository import ConfigRepository
    from hydra.core.object_type import ObjectType

    read = ConfigRepository.load_config
    kept: dict[tuple[Any, ...], Any] = {}

    def load(repo: ConfigRepository, config_path: str) -> Any:
        source = repo._find_object_source(config_path=config_path, object_type=ObjectType.CONFIG)
        try:
            name = source._normalize_file_name(config_path)
            file = os.path.join(source.path, name) if source.scheme() == "file" else None
            if source.scheme() == "pkg":
                file = os.fspath(resources.files(source.path).joinpath(name))
            content = Path(file).read_bytes() if stat.S_ISREG(os.stat(file).st_mode) else None
        except (AttributeError, OSError, TypeError):  # no source, not a file, a FIFO: as Hydra reads it
            content = None
        if content is None:
            return read(repo, config_path)
        key = (source.scheme(), source.path, source.provider, config_path, content)
        if key not in kept:
            kept[key] = read(repo, config_path)
        got = kept[key]
        return dataclasses.replace(
            got,
            config=copy.deepcopy(got.config),
            header=dict(got.header),
            defaults_list=copy.deepcopy(got.defaults_list),
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ConfigRepository, "load_config", load)
        yield


@pytest.fixture(autouse=True)
def _restore_torch_state() -> Iterator[None]:
    """Runs change global torch flags (cudnn, matmul precision, RNG): leave each test as it found it."""
    import torch

    benchmark, deterministic = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    rng, matmul = torch.get_rng_state(), torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = benchmark, deterministic
    torch.set_rng_state(rng)
    torch.use_deterministic_algorithms(False)


@pytest.fixture
def train_cfg(tmp_path: Path) -> Compose:
    """`train_cfg("model=mlp", ...)`: a composed train config; its run directory is `run_dir`; downloaded
    data sets go to `tmp_path/data`, never into the checkout."""
    from lightspeed.run.entry import compose_config

    return lambda *overrides: compose_config(
        "train", [data_dir_override(tmp_path), *overrides], tmp_path / "logs"
    )


@pytest.fixture
def eval_cfg(tmp_path: Path) -> Compose:
    """An eval config; its run directory is `eval_dir`, and `ckpt_path=latest` looks in `run_dir`'s logs."""
    from lightspeed.run.entry import compose_config

    return lambda *overrides: compose_config(
        "eval", [data_dir_override(tmp_path), *overrides], tmp_path / "logs"
    )


def data_dir_override(tmp_path: Path) -> str:
    return f"paths.data_dir={tmp_path / 'data'}"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs" / "train" / "runs" / "test"


@pytest.fixture
def eval_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs" / "eval" / "runs" / "test"


#: Overrides for a small but real run (as debug=limit: 2 epochs of a few batches, but with checkpoints,
#: which debug runs do not write) that prints little.
LIMIT = [
    "trainer.max_epochs=2",
    "++trainer.limit_train_batches=5",
    "++trainer.limit_val_batches=2",
    "++trainer.limit_test_batches=2",
]
TINY = [*LIMIT, "trainer.log_every_n_steps=1", *QUIET]


def run_script(name: str, *args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run `python scripts/<name> <args>` in `cwd`, as the docs tell a person to."""
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / name), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def module_env() -> dict[str, str]:
    """The environment of every `python -m lightspeed...` a test starts: one thread each, since runs that
    must end bit-identical must also add up in the same order (a run killed on 2 threads and resumed on 1
    ends a few ulps away from one on 1)."""
    return {**os.environ, "PYTHONPATH": str(TESTS), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def run_module(module: str, *args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run `python -m <module> <args>` as a user would, in `cwd`, capturing what they would see."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=module_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def command_line(
    args: list[str],
    log_dir: Path,
    config_name: str = "train",
    task: Callable[[DictConfig], object] | None = None,
) -> list[DictConfig]:
    """`python -m lightspeed.<config_name> <args>` in process: Hydra's one composition and the checks before
    any folder (`entry.run`), a ConfigError where the command line prints one line; then `task`, or the
    configs it would get (each job's, in a sweep). Hydra leaves the test's logging alone."""
    from lightspeed.run import entry

    got: list[DictConfig] = []
    quiet = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
    with mock.patch.object(sys, "argv", ["lightspeed", *args, f"paths.log_dir={log_dir}", *quiet]):
        entry.run(config_name, task or got.append)
    return got


def run_ddp_cpu(tmp_path: Path, *overrides: str, probe: bool = True) -> subprocess.CompletedProcess[str]:
    """`python -m lightspeed.train trainer=ddp_cpu debug=limit <overrides>` without a bar, its run
    folder `tmp_path/run`; with `probe`, each rank writes `tmp_path/probe/rank<R>.json` (RankProbe)."""
    ranks = ["+callbacks.probe._target_=probes.RankProbe", f"+callbacks.probe.out={tmp_path / 'probe'}"]
    return run_module(
        "lightspeed.train",
        *(
            "trainer=ddp_cpu",
            "debug=limit",
            "callbacks.rich_progress_bar=null",
            "trainer.enable_progress_bar=false",
        ),
        *overrides,
        f"hydra.run.dir={tmp_path / 'run'}",
        *(ranks if probe else []),
        cwd=tmp_path,
    )


def assert_resumes_exactly(
    train_cfg: Compose, tmp_path: Path, overrides: list[str], at: int, steps: int
) -> None:
    """A run stopped by SIGTERM after step `at` (it saves and exits) and run again ends with the very
    weights of an uninterrupted one, after `steps` steps: the loader continued where it stopped."""
    import torch

    from lightspeed.train import train
    from probes import Fault

    exact = [*overrides, "trainer.deterministic=true", "test_after_fit=false"]
    whole = train(train_cfg(*exact, f"paths.output_dir={tmp_path / 'whole'}"))
    cut = [*exact, f"paths.output_dir={tmp_path / 'cut'}"]
    with pytest.raises(SystemExit):
        train(train_cfg(*cut), [Fault("sigterm", step=at)])
    resumed = train(train_cfg(*cut))
    assert resumed.trainer.global_step == whole.trainer.global_step == steps
    for key, value in whole.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
