"""Run identity and auto-resume: the same command continues the same run, exactly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from conftest import REPO, TINY
from lightspeed import resume
from lightspeed.config import ConfigError
from lightspeed.entry import compose_config
from lightspeed.train import train


def _name(tmp_path: Path, *overrides: str) -> str:
    return compose_config("train", list(overrides), tmp_path).run_name


def test_the_same_command_names_the_same_run_and_a_changed_setting_a_new_one(tmp_path: Path) -> None:
    base = _name(tmp_path, "model=mlp")
    assert base == _name(tmp_path, "model=mlp") and base.startswith("digits-mlp-")
    assert _name(tmp_path, "model=mlp", "model.optimizer.lr=0.01") != base
    assert _name(tmp_path, "model=mlp", "seed=1") != base
    # how the run starts is not what it trains: same folder
    assert _name(tmp_path, "model=mlp", "resume=never", "ckpt_path=x.ckpt") == base
    assert _name(tmp_path, "experiment=digits_mlp").startswith("digits_mlp-")
    assert _name(tmp_path, "run_name=mine") == "mine"


def _tiny_run(train_cfg, *extra: str) -> L.Trainer:
    return train(train_cfg(*TINY, "test_after_fit=false", "model.scheduler.name=none", *extra)).trainer


def test_auto_resume_takes_the_newest_loadable_checkpoint_and_names_each_it_skips(
    train_cfg, run_dir: Path, caplog
) -> None:
    _tiny_run(train_cfg)
    folder = run_dir / "checkpoints"
    (folder / "zz-empty.ckpt").write_bytes(b"")
    good = (folder / "last.ckpt").read_bytes()
    (folder / "zz-truncated.ckpt").write_bytes(good[: len(good) // 2])
    (folder / "last.ckpt.tmp").write_bytes(good[:100])  # a save killed midway: not a .ckpt, ignored
    with pytest.warns(UserWarning) as warned:
        path = resume.resolve(train_cfg(*TINY))  # corrupt files first, with newer names and times
    assert path == str(folder / "last.ckpt")
    skipped = sorted(str(w.message) for w in warned if "skipping" in str(w.message))
    assert len(skipped) == 2 and "zz-empty.ckpt" in skipped[0] and "zz-truncated.ckpt" in skipped[1]
    resumed = _tiny_run(train_cfg, "trainer.max_epochs=3")
    assert resumed.global_step == 15  # 10 restored, 5 trained


def test_a_schedule_cannot_be_stretched_on_resume(train_cfg, capsys) -> None:
    train(train_cfg(*TINY, "test_after_fit=false", "model.scheduler.name=onecycle"))
    with pytest.raises(SystemExit) as exit_:
        train(
            train_cfg(*TINY, "test_after_fit=false", "model.scheduler.name=onecycle", "trainer.max_epochs=3")
        )
    assert exit_.value.code == 2
    assert "schedule spans 10 steps, this run 15" in capsys.readouterr().err


def test_resume_never_refuses_to_overwrite_a_run(train_cfg, run_dir: Path) -> None:
    _tiny_run(train_cfg)
    with pytest.raises(ConfigError, match=r"resume=never.*last\.ckpt, step 10.*resume=auto.*run_name"):
        resume.resolve(train_cfg(*TINY, "resume=never"))
    assert (
        resume.resolve(train_cfg(*TINY, f"paths.output_dir={run_dir.parent / 'fresh'}", "resume=never"))
        is None
    )


def test_a_finished_run_rerun_trains_nothing(train_cfg) -> None:
    first = _tiny_run(train_cfg)
    again = _tiny_run(train_cfg)
    assert first.global_step == again.global_step == 10


class StopAt(L.Callback):
    """Saves a checkpoint once `step` optimizer steps are done and stops, as a crash right after would."""

    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path, weights_only=False)
            raise KeyboardInterrupt  # what Lightning turns into a graceful stop


EXACT = [
    *TINY,
    "data=synthetic",
    "data.num_samples=600",
    "data.shape=[3,8,8]",
    "data.batch_size=64",  # 480 train samples: 7 full batches and one of 32
    "++trainer.limit_train_batches=null",
    "trainer.max_epochs=3",
    "model=mlp",
    "model.net.dropout=0.3",  # dropout and random crops/flips: the RNG matters
    "trainer.deterministic=true",
    "test_after_fit=false",
]


@pytest.mark.parametrize("step", [3, 8, 11])  # mid-epoch, at the end of epoch 0, mid-epoch 1
@pytest.mark.parametrize("loader", ["data.on_device=true", "data.num_workers=1"])
def test_a_resumed_run_ends_bit_identical_to_an_uninterrupted_one(
    train_cfg, tmp_path: Path, step: int, loader: str
) -> None:
    whole = train(train_cfg(*EXACT, loader, f"paths.output_dir={tmp_path / 'whole'}"))
    ckpt = tmp_path / "stop.ckpt"
    with pytest.raises(SystemExit):
        train(train_cfg(*EXACT, loader, f"paths.output_dir={tmp_path / 'cut'}"), [StopAt(step, ckpt)])
    resumed = train(
        train_cfg(*EXACT, loader, f"paths.output_dir={tmp_path / 'resumed'}", f"ckpt_path={ckpt}")
    )
    assert resumed.trainer.global_step == whole.trainer.global_step == 24
    for key, value in whole.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    assert resumed.metrics == whole.metrics


@pytest.mark.slow
def test_chaos_one_kill_and_resume_per_mode_is_bit_identical(tmp_path: Path) -> None:
    """scripts/chaos.py, one trial on one process and one under ddp_cpu (`make chaos` runs more)."""
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "chaos.py"),
            "--trials",
            "1",
            "--keep",
            str(tmp_path / "chaos"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "single: 1/1 resumed, weights identical to the uninterrupted run" in proc.stdout
    assert "ddp_cpu: 1/1 resumed, weights identical to the uninterrupted run" in proc.stdout
