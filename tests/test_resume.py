"""Run identity and auto-resume: the same command continues the same run, exactly."""

from __future__ import annotations

import csv
import importlib.util
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch

from conftest import REPO, TINY, run_script
from lightspeed.core.config import ConfigError
from lightspeed.resilience import checkpoint, resume
from lightspeed.run.entry import compose_config
from lightspeed.train import train
from probes import Fault


def _name(tmp_path: Path, *overrides: str) -> str:
    return compose_config("train", list(overrides), tmp_path).run_name


def test_the_same_command_names_the_same_run_and_a_changed_setting_a_new_one(tmp_path: Path) -> None:
    base = _name(tmp_path, "model=mlp")
    assert base == _name(tmp_path, "model=mlp") and base.startswith("digits-mlp-")
    assert _name(tmp_path, "model=mlp", "model.optimizer.lr=0.01") != base
    assert _name(tmp_path, "model=mlp", "seed=1") != base
    # how the run starts is not what it trains: same folder
    assert _name(tmp_path, "model=mlp", "resume=never", "ckpt_path=x.ckpt") == base
    # nor how it is fed, watched or saved: changing those continues the run
    fed = ["data.num_workers=2", "logger=tensorboard", "+callbacks.model_checkpoint.every_n_train_steps=5"]
    assert _name(tmp_path, "model=mlp", *fed, "trainer.log_every_n_steps=1") == base
    assert _name(tmp_path, "model=mlp", "data.batch_size=32") != base
    assert _name(tmp_path, "experiment=digits_mlp").startswith("digits_mlp-")
    assert _name(tmp_path, "run_name=mine") == "mine"


TINY_RUN = [*TINY, "test_after_fit=false", "model.scheduler.name=none"]


def _tiny_run(train_cfg, *extra: str) -> L.Trainer:
    return train(train_cfg(*TINY_RUN, *extra)).trainer


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
        path = resume.resolve(train_cfg(*TINY_RUN))  # corrupt files first, with newer names and times
    assert path == str(folder / "last.ckpt")
    skipped = sorted(str(w.message) for w in warned if "skipping" in str(w.message))
    assert len(skipped) == 2 and "zz-empty.ckpt" in skipped[0] and "zz-truncated.ckpt" in skipped[1]
    assert _tiny_run(train_cfg).global_step == 10  # resumed from last.ckpt: nothing left to train


def test_a_schedule_cannot_be_stretched_on_resume(train_cfg, capsys) -> None:
    first = train(train_cfg(*TINY, "test_after_fit=false", "model.scheduler.name=onecycle"))
    longer = ["model.scheduler.name=onecycle", "trainer.max_epochs=3", "run_name=longer"]
    with pytest.raises(SystemExit) as exit_:
        train(
            train_cfg(
                *TINY,
                "test_after_fit=false",
                *longer,
                f"ckpt_path={first.trainer.checkpoint_callback.last_model_path}",
            )
        )
    assert exit_.value.code == 2
    assert "schedule spans 10 steps, this run's 15" in capsys.readouterr().err


def test_resume_never_refuses_to_overwrite_a_run(train_cfg, run_dir: Path) -> None:
    _tiny_run(train_cfg)
    with pytest.raises(ConfigError, match=r"resume=never.*last\.ckpt, step 10.*resume=auto.*run_name"):
        resume.resolve(train_cfg(*TINY_RUN, "resume=never"))
    assert (
        resume.resolve(train_cfg(*TINY_RUN, f"paths.output_dir={run_dir.parent / 'fresh'}", "resume=never"))
        is None
    )


def test_a_finished_run_rerun_trains_nothing(train_cfg) -> None:
    first = _tiny_run(train_cfg)
    again = _tiny_run(train_cfg)
    assert first.global_step == again.global_step == 10


EXACT = [
    *TINY,
    "data=synthetic",
    "data.num_samples=600",
    "data.shape=[3,8,8]",
    "data.batch_size=64",  # 480 train samples: 7 full batches (the 32 left over change every epoch)
    "++trainer.limit_train_batches=null",
    "trainer.max_epochs=3",
    "trainer.log_every_n_steps=6",  # some resumed stretches have no logging step of their own
    "model=mlp",
    "model.net.dropout=0.3",  # dropout and random crops/flips: the RNG matters
    "trainer.deterministic=true",
    "test_after_fit=false",
]


def _logged(run: Path) -> dict[tuple[str, str], str]:
    """Every value the CSV logger wrote, by (step, metric), as text: equal text, equal bits."""
    rows = list(csv.DictReader(run.open()))
    return {(r["step"], k): v for r in rows for k, v in r.items() if k.startswith(("train/", "val/")) and v}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, tuple[Path, dict[str, torch.Tensor], dict[str, float]]]:
    """One uninterrupted run per loader, shared by the resume cases."""
    runs = {}
    for loader in ("data.on_device=true", "data.num_workers=1"):
        out = tmp_path_factory.mktemp("whole")
        cfg = compose_config("train", [*EXACT, loader, f"paths.output_dir={out}"], out / "logs")
        result = train(cfg)
        weights = {k: v.clone() for k, v in result.model.state_dict().items()}
        runs[loader] = (out / "csv" / "version_0" / "metrics.csv", weights, result.metrics)
    return runs


# steps 3 and 10: mid-epoch; 7: an epoch's last batch (saved after its validation); 16: mid final epoch;
# 20: after the final epoch's last logging step, 18 (the resumed stretch logs no loss of its own)
@pytest.mark.parametrize(
    "step", [*(pytest.param(s, marks=pytest.mark.slow) for s in (3, 16, 20)), 7, 10]
)  # 7, 10: make test
@pytest.mark.parametrize("loader", ["data.on_device=true", "data.num_workers=1"])
def test_a_preempted_and_resumed_run_is_bit_identical_to_an_uninterrupted_one(
    train_cfg, tmp_path: Path, uninterrupted, step: int, loader: str
) -> None:
    """Weights, every metric logged from the resume on, step by step, and the metrics the run reports."""
    whole_csv, whole_weights, whole_metrics = uninterrupted[loader]
    cut = [*EXACT, loader, f"paths.output_dir={tmp_path / 'cut'}"]
    with pytest.raises(SystemExit):
        train(train_cfg(*cut), [Fault("sigterm", step=step - 1)])  # saved once step `step` is done
    resumed = train(train_cfg(*cut))  # the same command again
    assert resumed.trainer.global_step == 21
    for key, value in whole_weights.items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    after = _logged(tmp_path / "cut" / "csv" / "version_1" / "metrics.csv")  # the resumed attempt's log
    whole = _logged(whole_csv)
    assert after and all(whole[key] == value for key, value in after.items())
    assert {key for key in whole if int(key[0]) >= step} <= set(after)  # nothing it should log is missing
    assert resumed.metrics == whole_metrics  # summary.json's, and the latest loss the bar showed


def test_an_earlier_lightspeed_s_checkpoint_resumes_bit_identical_and_without_a_warning(
    train_cfg, tmp_path: Path, uninterrupted
) -> None:
    """Before 0.2 each rank's random states were a callback's own state (`callbacks["RankSeed"]`): such a
    checkpoint still resumes exactly (dropout draws the same), and Lightning does not ask for a callback
    the run no longer has."""
    loader = "data.on_device=true"
    _, whole_weights, _ = uninterrupted[loader]
    cut = [*EXACT, loader, f"paths.output_dir={tmp_path / 'cut'}"]
    with pytest.raises(SystemExit):
        train(train_cfg(*cut), [Fault("sigterm", step=9)])
    last = tmp_path / "cut" / "checkpoints" / "last.ckpt"
    state = torch.load(last, weights_only=True)
    state["callbacks"]["RankSeed"] = state.pop("rank_rng")  # the layout an earlier release wrote
    state[checkpoint.CHECKSUM_KEY] = checkpoint.checksum(state)
    torch.save(state, last)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = train(train_cfg(*cut))
    assert not [w for w in caught if "callbacks" in str(w.message) and "RankSeed" in str(w.message)]
    for key, value in whole_weights.items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key


@pytest.mark.slow
def test_chaos_one_kill_and_resume_per_mode_is_bit_identical(tmp_path: Path) -> None:
    """scripts/chaos.py, one trial on one process, one under ddp_cpu and one streaming LitData shards (`make
    chaos` runs more)."""
    proc = run_script("chaos.py", "--trials", "1", "--keep", str(tmp_path / "chaos"), cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "single: 1/1 resumed, weights identical to the uninterrupted run" in proc.stdout
    assert "ddp_cpu: 1/1 resumed, weights identical to the uninterrupted run" in proc.stdout
    if importlib.util.find_spec("litdata") is None:  # the streaming extra is not installed: said, not failed
        assert "shards: skipped (LitData is not installed" in proc.stdout
    else:
        assert "shards: 1/1 resumed, weights identical to the uninterrupted run" in proc.stdout


def test_a_last_checkpoint_behind_the_one_resumed_from_is_brought_up_to_date(
    train_cfg, run_dir: Path
) -> None:
    """A run killed between writing its best and its last checkpoint of the same step."""
    first = _tiny_run(train_cfg)
    folder = run_dir / "checkpoints"
    best = Path(first.checkpoint_callback.best_model_path)
    stale = torch.load(folder / "last.ckpt", weights_only=True)
    stale["global_step"] = 7  # as if last.ckpt were still from an earlier step
    torch.save(stale, folder / "last.ckpt")
    assert resume.resolve(train_cfg(*TINY_RUN)) == str(best)  # the furthest one, copied over last.ckpt
    assert (folder / "last.ckpt").read_bytes() == best.read_bytes()
    assert _tiny_run(train_cfg).global_step == 10  # and nothing left to train
