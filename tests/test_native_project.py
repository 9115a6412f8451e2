"""A project made by `make new-project` with a module, a net and a DataModule of its own written in
lightning-hydra-template's idiom (tests/lht_style.py, in the project's package, named by its conf/), driven
by the project's own Makefile as a person would: train, a SIGKILL and the same command again, eval with
predictions, export, a two-point sweep; then timm's factory as the net."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import lht_style
from test_new_project import PIN, new_project

TESTS = Path(__file__).resolve().parent
RUN = ["model=lht", "data=lht", "trainer.max_epochs=30", "callbacks.rich_progress_bar=null"]
STEPS = 30 * 10  # 1257 samples in batches of 128: 10 an epoch


#: LHT's configs/hparams_search/mnist_optuna.yaml in this engine's terms (one process, its study resumable).
LHT_OPTUNA = """\
# @package _global_
hparams_search:
  study_name: lht_optuna
  n_trials: 20
  sampler:
    _target_: optuna.samplers.TPESampler
    n_startup_trials: 10
  params:
    model:
      optimizer:
        lr: {low: 0.0001, high: 0.1, log: true}
      net:
        lin1_size: [32, 64, 128, 256, 512]
    data:
      batch_size: [32, 64, 128, 256]
"""


@pytest.fixture(scope="module")
def acme(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The project, and the environment its make runs in: this test's Python and engine stand in for the
    project's .venv (a folder with `python` and `lightspeed` that run them), its package on PYTHONPATH."""
    root = tmp_path_factory.mktemp("native")
    dest = root / "acme"
    assert new_project("acme", str(dest), "--engine", PIN).returncode == 0
    (dest / "src" / "acme" / "models" / "lht.py").write_text((TESTS / "lht_style.py").read_text())
    (dest / "conf" / "model" / "lht.yaml").write_text(
        lht_style.MODEL_YAML.replace("lht_style.", "acme.models.lht.")
    )
    (dest / "conf" / "data" / "lht.yaml").write_text(
        lht_style.DATA_YAML.replace("lht_style.", "acme.models.lht.")
    )
    venv = dest / ".venv"
    (venv / "bin").mkdir(parents=True)
    for name, program in (
        ("python", sys.executable),
        ("lightspeed", str(Path(sys.executable).parent / "lightspeed")),
    ):
        (venv / "bin" / name).write_text(f'#!/bin/sh\nexec {program} "$@"\n')
        (venv / "bin" / name).chmod(0o755)
    (venv / ".installed-dev").touch()
    (dest / "conf" / "hparams_search" / "lht_optuna.yaml").write_text(LHT_OPTUNA)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "MAKE", "VIRTUAL_ENV"))}
    env |= {"PYTHONPATH": str(dest / "src"), "OMP_NUM_THREADS": "1"}
    return dest, env


def make(dest: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["make", *args], cwd=dest, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"make {' '.join(args)}: {proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


@pytest.mark.slow  # ten trainings of a small net on digits through make: ~2 min on 2 cores
def test_lht_style_code_trains_resumes_bit_identically_evaluates_exports_and_sweeps(acme) -> None:
    dest, env = acme
    whole = dest / "whole"  # the uninterrupted run, in a log folder of its own
    make(dest, env, "train", *RUN, f"paths.log_dir={whole}")
    # the same command, killed (make and python, a process group) once its first checkpoint is written
    killed = subprocess.Popen(["make", "train", *RUN], cwd=dest, env=env, start_new_session=True)
    last = dest / "logs" / "train" / "runs"
    deadline = time.monotonic() + 300
    while not list(last.glob("*/checkpoints/last.ckpt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)
    assert killed.wait() != 0
    (cut,) = last.glob("*/checkpoints/last.ckpt")
    assert torch.load(cut, weights_only=True)["global_step"] < STEPS  # it was cut short
    make(dest, env, "train", *RUN)
    (run,) = (dest / "logs" / "train" / "runs").iterdir()
    (reference,) = (whole / "train" / "runs").iterdir()
    resumed, uninterrupted = (
        weights(run / "checkpoints" / "last.ckpt"),
        weights(reference / "checkpoints" / "last.ckpt"),
    )
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)

    evaluated = make(dest, env, "eval", "predict=true", "trainer.enable_progress_bar=false")
    assert re.search(r"│ test/acc +│ 0\.[89]", evaluated.stdout), evaluated.stdout[-2000:]
    assert (
        len((next((dest / "logs" / "eval" / "runs").glob("*/predictions.csv"))).read_text().splitlines())
        == 361
    )

    exported = make(dest, env, "export")
    assert list((dest / "logs").rglob("*.onnx")), exported.stdout[-2000:]

    sweep = make(
        dest,
        env,
        "train",
        "model=lht",
        "data=lht",
        "trainer.max_epochs=1",
        "ARGS=-m model.optimizer.lr=0.001,0.002",
    )
    assert sweep.stdout.count("Lightspeed: training finished") == 2
    for path in (dest / "logs").rglob("*.ckpt"):
        torch.load(path, weights_only=True)  # plain data, every one


@pytest.mark.slow
def test_timm_s_factory_named_on_the_command_line_trains_and_is_evaluated(acme, tmp_path: Path) -> None:
    pytest.importorskip("timm")
    dest, env = acme
    net = "'+model.net={_target_: timm.create_model, model_name: resnet10t, num_classes: 10, in_chans: 1}'"
    logs = f"paths.log_dir={tmp_path}"
    make(dest, env, "train", "model=lht", "data=lht", "trainer.max_epochs=1", logs, f"ARGS=~model.net {net}")
    evaluated = make(
        dest, env, "eval", logs, "trainer.enable_progress_bar=false"
    )  # its command line named it
    assert "│ test/acc" in evaluated.stdout


#: lightning-hydra-template's tests/test_train.py and test_sweeps.py, their command lines translated to this
#: project (LHT's model and data: model=lht data=lht; its trainer=ddp_sim: ours, trainer=ddp_cpu): the
#: exit code each ends with (2: a refusal in one line that docs/guide.md explains).
LHT_COMMANDS = {
    "train_fast_dev_run": (["trainer.fast_dev_run=true", "trainer.accelerator=cpu"], 0),
    "train_fast_dev_run_gpu": (["trainer.fast_dev_run=true", "trainer.accelerator=gpu"], 2),  # no GPU here
    "train_epoch_gpu_amp": (["trainer.max_epochs=1", "trainer.accelerator=cpu", "trainer.precision=16"], 0),
    "train_epoch_double_val_loop": (["trainer.max_epochs=1", "trainer.val_check_interval=0.5"], 0),
    "train_ddp_sim": (["trainer.max_epochs=2", "trainer.devices=2", "trainer.strategy=ddp_spawn"], 0),
    "experiments": (["ARGS=-m experiment=glob(*) ++trainer.fast_dev_run=true logger=[]"], 0),
    "hydra_sweep": (["ARGS=-m model.optimizer.lr=0.005,0.01 ++trainer.fast_dev_run=true logger=[]"], 0),
    "hydra_sweep_ddp_sim": (
        [
            "ARGS=-m trainer=ddp_cpu trainer.max_epochs=3 ++trainer.limit_train_batches=0.01 "
            "++trainer.limit_val_batches=0.1 ++trainer.limit_test_batches=0.1 "
            "model.optimizer.lr=0.005,0.01,0.02 logger=[]"
        ],
        2,  # each rank would run its own sweep: one SLURM job per point, or a shell loop
    ),
    "optuna_sweep": (
        [
            "hparams_search=lht_optuna",
            "hparams_search.n_trials=10",
            "hparams_search.sampler.n_startup_trials=5",
            "++trainer.max_epochs=1",
            "logger=[]",
        ],
        0,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", LHT_COMMANDS)
def test_lht_s_own_command_lines_run_or_are_one_line(acme, tmp_path: Path, name: str) -> None:
    if name.endswith("_gpu") and torch.cuda.is_available():
        pytest.skip("a GPU is here: the GPU check script runs it")
    dest, env = acme
    args, code = LHT_COMMANDS[name]
    if "experiment=" not in " ".join(args):
        args = ["model=lht", "data=lht", *args]
    sweep = [f"hydra.sweep.dir={tmp_path / 'sweep'}"] if "-m" in " ".join(args) else []
    args = [*args[:-1], f"{args[-1]} {sweep[0]}"] if sweep else args
    proc = subprocess.run(
        ["make", "train", f"paths.log_dir={tmp_path}", *args],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    if code == 0:
        assert proc.returncode == 0, proc.stderr[-3000:]
        if name == "train_ddp_sim":  # the children's progress, which Lightning does not bring back
            assert re.search(r"│ epochs +│ 2 ", proc.stdout), proc.stdout[-2000:]
            assert not re.search(r"│ global step +│ 0 ", proc.stdout), proc.stdout[-2000:]
    else:
        assert proc.returncode != 0 and len(errors) == 1, proc.stderr[-3000:]


@pytest.mark.slow
def test_lht_s_resume_and_eval_command_lines(acme, tmp_path: Path) -> None:
    """test_train_resume: one epoch, then from its last.ckpt to two; test_eval: the checkpoint's test
    accuracy again."""
    dest, env = acme
    logs = f"paths.log_dir={tmp_path}"
    first = make(dest, env, "train", "model=lht", "data=lht", "trainer.max_epochs=1", logs)
    (last,) = (tmp_path / "train" / "runs").glob("*/checkpoints/last.ckpt")
    second = make(
        dest, env, "train", "model=lht", "data=lht", "trainer.max_epochs=2", logs, f"ckpt_path={last}"
    )
    assert re.search(r"│ epochs +│ 2 ", second.stdout), second.stdout[-2000:]
    evaluated = make(dest, env, "eval", logs, f"ckpt_path={last}", "trainer.enable_progress_bar=false")
    accuracy = re.findall(r"│ test/acc +│ ([0-9.]+)", evaluated.stdout)
    assert accuracy and float(accuracy[-1]) > 0.0 and first.returncode == 0
