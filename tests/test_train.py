"""Training end to end, in process: the trainer knobs, checkpoints, eval, resume (every data and model option:
test_registry.py)."""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from pathlib import Path

import lightning as L
import pytest
import torch

from conftest import LIMIT, TINY
from lightspeed.core.config import ConfigError
from lightspeed.core.summary import CONFIG_TREE_FILE, SUMMARY_FILE
from lightspeed.eval import run as evaluate
from lightspeed.models.classifier import Classifier
from lightspeed.run.restore import find_checkpoint
from lightspeed.train import instantiate, train
from probes import AutocastProbe

QUIET = [o for o in TINY if o not in LIMIT]  # TINY without its 2 epochs of a few batches


def test_tiny_run_writes_checkpoints_logs_and_a_summary(train_cfg, run_dir: Path, capsys) -> None:
    result = train(train_cfg(*TINY, "print_config=true"))
    run = run_dir
    # the resolved config as a tree, printed and kept: `auto`s as this run resolved them (a CPU: 32-true)
    tree = (run / CONFIG_TREE_FILE).read_text()
    assert "├── trainer" in tree and "precision: 32-true" in tree and "precision: auto" not in tree
    assert "config (resolved)" in capsys.readouterr().out
    assert result.trainer.global_step == 2 * 5  # debug=limit: 2 epochs of 5 batches
    assert Path(result.best_checkpoint).parent == run / "checkpoints"
    assert (run / "checkpoints" / "last.ckpt").is_file()
    metrics_csv = (run / "csv" / "version_0" / "metrics.csv").read_text()
    assert "train/loss" in metrics_csv and "val/acc" in metrics_csv
    facts = json.loads((run / SUMMARY_FILE).read_text())
    assert facts["best_checkpoint"] == result.best_checkpoint
    assert facts["metrics"]["test/acc"] == pytest.approx(result.metrics["test/acc"])
    assert facts["config"]["model"]["net"]["name"] == "cnn"
    # optimized_metric is what the checkpoint monitors: the tested (best) checkpoint's score
    assert result.score == pytest.approx(float(result.trainer.checkpoint_callback.best_model_score))


def test_every_checkpoint_loads_safely_on_cpu(train_cfg, run_dir: Path) -> None:
    train(train_cfg(*TINY))
    ckpts = sorted((run_dir / "checkpoints").glob("*.ckpt"))
    assert len(ckpts) == 2  # best and last
    for path in ckpts:
        state = torch.load(path, map_location="cpu", weights_only=True)  # plain data only
        assert state["hyper_parameters"]["net"]["name"] == "cnn"
        model = Classifier.load_from_checkpoint(path, map_location="cpu", weights_only=True)
        assert next(model.parameters()).device.type == "cpu"
        assert torch.equal(model.state_dict()["net.head.3.weight"], state["state_dict"]["net.head.3.weight"])


def test_train_then_eval_tests_the_best_checkpoint(train_cfg, eval_cfg, eval_dir: Path, capsys) -> None:
    result = train(train_cfg(*TINY))
    capsys.readouterr()
    # the same 2 test batches as the run tested (debug=limit), on the weights of its best checkpoint
    metrics = evaluate(
        eval_cfg(
            "ckpt_path=latest",
            "predict=true",
            "trainer.enable_progress_bar=false",
            "trainer.limit_test_batches=2",
            "+trainer.limit_predict_batches=2",
            "print_config=false",
        )
    )
    assert "config (resolved)" not in capsys.readouterr().out and (eval_dir / CONFIG_TREE_FILE).is_file()
    assert metrics["test/acc"] == pytest.approx(
        result.metrics["test/acc"], abs=1e-6
    )  # same split, same weights
    facts = json.loads((eval_dir / SUMMARY_FILE).read_text())
    assert facts["checkpoint"] == result.best_checkpoint
    rows = (eval_dir / "predictions.csv").read_text().splitlines()
    assert rows[0] == "index,target,pred,prob" and len(rows) == 1 + 2 * 64
    # the classifier's confusion matrix of the same 128 test samples: its diagonal is the accuracy
    matrix = [
        [int(c) for c in r.split(",")[1:]]
        for r in (eval_dir / "confusion_matrix.csv").read_text().splitlines()[1:]
    ]
    assert len(matrix) == 10 and sum(map(sum, matrix)) == 2 * 64
    assert sum(matrix[i][i] for i in range(10)) / (2 * 64) == pytest.approx(metrics["test/acc"])
    # rows the true class, columns the predicted one: each cell counts its (target, pred) pairs of the
    # predictions of the same samples (a transpose keeps the diagonal, not the cells off it)
    pairs = Counter(tuple(int(v) for v in r.split(",")[1:3]) for r in rows[1:])
    assert any(t != p for t, p in pairs), "no mistake: the test could not see a transpose"
    assert matrix == [[pairs[(t, p)] for p in range(10)] for t in range(10)]
    assert facts["confusion_matrix"] == str(eval_dir / "confusion_matrix.csv")
    assert (eval_dir / "confusion_matrix.png").read_bytes().startswith(b"\x89PNG")


def test_eval_tests_on_the_run_s_own_data_and_warns_when_it_trained_on_the_test_set(
    train_cfg, eval_cfg, eval_dir: Path, caplog
) -> None:
    """The run was trained on split_seed=1; conf/data says 0 (as if edited since): eval takes the run's own
    split from the checkpoint. Asked for split 0 explicitly, it does so and says how much it trained on."""
    result = train(train_cfg(*TINY, "data.split_seed=1"))
    ckpt = torch.load(result.best_checkpoint, map_location="cpu", weights_only=True)
    assert ckpt["identity"]["config"]["data"]["split_seed"] == 1 and len(ckpt["train_samples"]) == 1258
    quiet = ["trainer.enable_progress_bar=false", "trainer.limit_test_batches=2"]
    with caplog.at_level(logging.INFO):
        own = evaluate(eval_cfg(f"ckpt_path={result.best_checkpoint}", *quiet))
    assert own["test/acc"] == pytest.approx(result.metrics["test/acc"], abs=1e-6)  # the run's split
    assert json.loads((eval_dir / SUMMARY_FILE).read_text())["test_samples_seen_in_training"] == 0
    assert "data: the run's own, as saved in" in caplog.text
    with (
        caplog.at_level(logging.INFO),
        pytest.warns(UserWarning, match=r"of the 359 test samples \(.*\) are among the 1258 the checkpoint"),
    ):
        evaluate(eval_cfg(f"ckpt_path={result.best_checkpoint}", "data.split_seed=0", *quiet))
    assert "data: as given, not the run's (data.split_seed: 1 -> 0)" in caplog.text
    assert json.loads((eval_dir / SUMMARY_FILE).read_text())["test_samples_seen_in_training"] > 200


def test_checkpoints_are_picked_by_val_acc_and_the_summary_shows_best_and_last(
    train_cfg, run_dir: Path
) -> None:
    result = train(train_cfg(*TINY, "trainer.max_epochs=3"))
    callback = result.trainer.checkpoint_callback
    assert (callback.monitor, callback.mode) == ("val/acc", "max")
    assert result.metrics["val/acc@best"] == pytest.approx(float(callback.best_model_score))
    assert {"val/loss@best", "val/acc", "val/loss"} <= set(result.metrics)  # best and last side by side
    facts = json.loads((run_dir / SUMMARY_FILE).read_text())
    assert facts["metrics"]["val/acc@best"] == result.metrics["val/acc@best"]
    # kept in the checkpoints, so that a resumed run still knows its best checkpoint's metrics
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["callbacks"]
    state = next(v for k, v in saved.items() if k.startswith("ModelCheckpoint"))
    assert state["best_metrics"] == {
        k[: -len("@best")]: v for k, v in result.metrics.items() if k.endswith("@best")
    }


class StopAfterFirstEpoch(L.Callback):
    """Ends fit after epoch 0 as an interruption would, leaving last.ckpt behind."""

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        trainer.should_stop = True


def test_eval_latest_takes_the_newest_run_that_has_a_best_checkpoint(tmp_path: Path) -> None:
    runs = tmp_path / "train" / "runs"
    for i, best in enumerate(["a.ckpt", "b.ckpt", None]):  # the newest (a debug=fdr run) has none
        (runs / str(i)).mkdir(parents=True)
        if best:
            (runs / str(i) / best).write_bytes(b"x")
        facts = {"best_checkpoint": str(runs / str(i) / best) if best else None}
        (runs / str(i) / SUMMARY_FILE).write_text(json.dumps(facts))
        os.utime(runs / str(i) / SUMMARY_FILE, (1000 + i, 1000 + i))
    (runs / "3").mkdir()
    (runs / "3" / SUMMARY_FILE).write_text('{"a":' * 50_000 + "1" + "}" * 50_000)  # the newest: unreadable
    assert find_checkpoint("latest", tmp_path) == runs / "1" / "b.ckpt"
    with pytest.raises(ConfigError, match="found no training run with a best checkpoint"):
        find_checkpoint("latest", tmp_path / "elsewhere")


def test_resume_from_last_checkpoint_continues_the_global_step(train_cfg, run_dir: Path) -> None:
    first = train(train_cfg(*TINY, "test_after_fit=false"), [StopAfterFirstEpoch()])
    assert (first.trainer.global_step, first.trainer.current_epoch) == (5, 1)
    last = run_dir / "checkpoints" / "last.ckpt"
    resumed = train(train_cfg(*TINY, f"ckpt_path={last}"))
    assert resumed.trainer.global_step == 10  # 5 restored + 5 new, not 10 new
    assert resumed.trainer.current_epoch == 2


def test_accumulate_grad_batches_takes_a_quarter_of_the_optimizer_steps(train_cfg, tmp_path: Path) -> None:
    steps = {}
    for n in (1, 4):
        result = train(
            train_cfg(
                *TINY,
                f"paths.output_dir={tmp_path / str(n)}",  # two runs, two folders (as two run_names)
                "trainer.max_epochs=1",
                "++trainer.limit_train_batches=8",
                f"trainer.accumulate_grad_batches={n}",
                "test_after_fit=false",
            )
        )
        optimizer = result.trainer.optimizers[0]
        steps[n] = (result.trainer.global_step, int(next(iter(optimizer.state.values()))["step"]))
    assert steps == {1: (8, 8), 4: (2, 2)}


def test_bf16_mixed_precision_autocasts_on_cpu(train_cfg) -> None:
    probe = AutocastProbe()
    result = train(train_cfg(*TINY, "trainer.precision=bf16-mixed", "test_after_fit=false"), [probe])
    assert result.trainer.precision == "bf16-mixed"
    assert probe.seen == {"enabled": True, "dtype": torch.bfloat16, "logits_dtype": torch.bfloat16}


def test_32_true_runs_in_float32(train_cfg) -> None:
    probe = AutocastProbe()
    result = train(train_cfg(*TINY, "trainer.precision=32-true", "test_after_fit=false"), [probe])
    assert result.trainer.precision == "32-true"
    assert probe.seen["enabled"] is False and probe.seen["logits_dtype"] == torch.float32


@pytest.mark.parametrize("flag", [True, False])
def test_benchmark_flag_reaches_cudnn(train_cfg, flag: bool) -> None:
    torch.backends.cudnn.benchmark = not flag
    train(
        train_cfg(
            *TINY, f"trainer.benchmark={str(flag).lower()}", "trainer.max_epochs=1", "test_after_fit=false"
        )
    )
    assert torch.backends.cudnn.benchmark is flag


def test_the_issue_knob_combination_reaches_trainer_and_torch(train_cfg) -> None:
    result = train(
        train_cfg(
            *TINY,
            "trainer.precision=bf16-mixed",
            "trainer.accumulate_grad_batches=4",
            "trainer.benchmark=true",
            "++trainer.limit_train_batches=8",
            "trainer.max_epochs=1",
            "test_after_fit=false",
        )
    )
    assert result.trainer.precision == "bf16-mixed"
    assert result.trainer.accumulate_grad_batches == 4 and result.trainer.global_step == 2
    assert torch.backends.cudnn.benchmark is True


@pytest.mark.parametrize(
    ("logger", "artifact"),
    [("csv", "csv/version_0/metrics.csv"), ("tensorboard", "tensorboard/version_0"), ("none", None)],
)
def test_logger_options(train_cfg, run_dir: Path, logger: str, artifact: str | None) -> None:
    result = train(train_cfg(*TINY, f"logger={logger}", "trainer.max_epochs=1"))
    run = run_dir
    if artifact is None:
        assert result.trainer.loggers == [] and not (run / "csv").exists()
    elif logger == "tensorboard":
        assert list((run / artifact).glob("events.out.tfevents.*"))
    else:
        assert (run / artifact).is_file()


def test_a_default_run_has_the_callbacks_conf_lists_and_prints_the_model_summary_once(
    train_cfg, caplog
) -> None:
    """Each callback is what conf/callbacks/default.yaml lists, in its order (Lightning puts checkpoints
    last), no dispatcher; the speed report prints the model summary that a ModelSummary callback would."""
    result = train(train_cfg(*LIMIT, "curves=false"))
    names = [type(cb).__name__ for cb in result.trainer.callbacks]
    assert names == [
        "EarlyStopping",
        "ProgressBar",
        "SpeedReport",
        "NonFiniteGuard",
        "ExactResume",
        "ModelCheckpoint",
    ]
    assert caplog.text.count("Total params") == 1 and "net.features" in caplog.text  # 2 layers deep
    caplog.clear()
    train(train_cfg(*LIMIT, "curves=false", "callbacks.speed_report.summary_depth=0", "run_name=quiet"))
    assert "Total params" not in caplog.text


def test_callbacks_none_keeps_what_nothing_lost_needs(train_cfg, run_dir: Path) -> None:
    """callbacks=none drops the optional callbacks, not the run's checkpoints where resume=auto looks,
    the non-finite guard or ExactResume (preemption, per-rank seeds, the run's identity)."""
    result = train(train_cfg("callbacks=none", *LIMIT, "trainer.enable_progress_bar=false"))
    names = {type(cb).__name__ for cb in result.trainer.callbacks}
    assert names == {"NonFiniteGuard", "ExactResume", "ModelCheckpoint"}  # no bar (switched off) nor stopping
    (resume,) = [cb for cb in result.trainer.callbacks if type(cb).__name__ == "ExactResume"]
    assert resume.ident is not None and resume.signals  # the run's identity given; SIGTERM/SIGUSR1 caught
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["last.ckpt"]


def test_a_monitor_no_callback_watches_and_nothing_logs_leaves_the_run_without_a_score(train_cfg) -> None:
    """callbacks=none: no callback reads the monitor, so nothing refuses it; the run's score (what sweeps
    optimise) is missing, and the run says so instead of returning None silently."""
    cfg = train_cfg("callbacks=none", *LIMIT, "monitor.metric=val/never", "monitor.mode=min")
    with pytest.warns(UserWarning, match=r"monitor.metric=val/never was never logged: the run has no score"):
        result = train(cfg)
    assert result.score is None and "val/loss" in result.metrics


def test_enable_progress_bar_false_leaves_the_configured_bar_out(train_cfg) -> None:
    """Lightning refuses a progress bar among the callbacks of a trainer told to show none: the one the
    callbacks group lists is left out instead (was a one-line refusal naming neither the key nor the fix)."""
    result = train(train_cfg(*LIMIT, "curves=false", "trainer.enable_progress_bar=false"))
    assert result.trainer.progress_bar_callback is None
    assert "EarlyStopping" in {type(cb).__name__ for cb in result.trainer.callbacks}  # the rest as listed


def test_profiler_debug_option_writes_a_report(train_cfg, run_dir: Path) -> None:
    train(
        train_cfg(
            *QUIET,
            "debug=profiler",
            "trainer.limit_train_batches=3",
            "trainer.limit_val_batches=1",
            "test_after_fit=false",
        )
    )
    report = next(run_dir.glob("*profile*.txt")).read_text()
    assert "run_training_epoch" in report


@pytest.mark.slow  # ~6 s on 2 CPU cores: make test stays within 4 minutes (a debug option; CI runs it)
def test_overfit_debug_option_memorises_one_batch(train_cfg) -> None:
    result = train(train_cfg(*QUIET, "debug=overfit", "test_after_fit=false"))
    assert result.trainer.global_step == 50  # one batch per epoch
    assert result.trainer.callback_metrics["train/loss"] < 0.1  # from ~2.3


def test_experiment_option_trains(train_cfg) -> None:
    result = train(train_cfg("experiment=digits_mlp", "debug=fdr", *QUIET))
    assert type(result.model.net).__name__ == "MLP"


@pytest.mark.slow
def test_default_run_reaches_98_percent_on_digits(train_cfg) -> None:
    result = train(train_cfg())
    assert result.metrics["test/acc"] >= 0.98


def test_the_readme_optimizer_and_schedule_switch_works(train_cfg, caplog) -> None:
    import logging

    with caplog.at_level(logging.INFO):
        result = train(
            train_cfg(
                *TINY,
                "model.optimizer.name=SGD",
                "model.optimizer.lr=0.05",
                "model.scheduler.name=cosine",
                "test_after_fit=false",
            )
        )
    assert type(result.trainer.optimizers[0]).__name__ == "SGD"
    assert type(result.trainer.lr_scheduler_configs[0].scheduler).__name__ == "CosineAnnealingLR"
    assert any("ignoring pct_start" in r.getMessage() for r in caplog.records)  # cnn.yaml's onecycle key


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["model.optimizer.name=SGD", "+model.optimizer.betas=[0.9,0.99]"],
            r"^model.optimizer \(torch.optim.SGD\)",
        ),
        (["trainer.max_epochs=-1"], "needs a known length, but trainer.max_epochs=-1"),
        (["model.net.name=foo"], "^model.net.name='foo' is not a known net"),
    ],
)
def test_model_config_mistakes_are_one_line_errors(
    train_cfg, capsys, overrides: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        train(train_cfg(*TINY, *overrides))
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0].removeprefix("error: ")), lines


def test_training_without_validation_leaves_early_stopping_out(train_cfg) -> None:
    result = train(train_cfg(*TINY, "++trainer.limit_val_batches=0", "test_after_fit=false"))
    assert result.trainer.global_step == 10
    assert not any(type(cb).__name__ == "EarlyStopping" for cb in result.trainer.callbacks)


def test_a_net_that_cannot_take_the_datas_shape_is_one_line_naming_both(train_cfg, capsys) -> None:
    """A 1D data set with the default 2D CNN (model= forgotten): one line before any training."""
    with pytest.raises(SystemExit) as exit_:
        train(train_cfg("data=synthetic", "data.shape=[40]", "data.num_samples=256", *QUIET))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert "cannot take the inputs of data=synthetic (shape [40])" in err and "conv2d" in err  # meta forward
    with pytest.raises(SystemExit) as exit_:  # images too small to pool, too
        train(train_cfg("data=synthetic", "data.shape=[3,1,1]", "data.num_samples=256", *QUIET))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert "cannot take the inputs of data=synthetic (shape [3, 1, 1])" in err and "too small" in err


def test_a_net_that_cannot_be_built_for_the_datas_shape_is_named_by_the_shapes_it_declares(
    train_cfg, monkeypatch, capsys
) -> None:
    """A 1D net whose constructor unpacks (C, L), given 8x8 digits: one line, no constructor traceback."""
    from lightspeed.models.nets import NETS
    from probes import Conv1DNet

    monkeypatch.setitem(NETS, "conv1d_probe", Conv1DNet)
    with pytest.raises(SystemExit) as exit_:
        train(train_cfg("model.net.name=conv1d_probe", "~model.net.channels", "~model.net.dropout", *QUIET))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert "(shape [1, 8, 8]): model.net conv1d_probe is built for inputs like (1, 40)" in err
    flat = train(train_cfg("model=mlp", "data=synthetic", "data.shape=[64]", "data.batch_size=32", *TINY))
    assert flat.trainer.global_step > 0 and flat.model.hparams["input_shape"] == [
        64
    ]  # an MLP takes any shape


def test_a_sweep_cannot_drive_a_multi_process_trainer(train_cfg) -> None:
    """`-m` with trainer=ddp_cpu: every rank would run its own sweep (test_cli.py has it end to end)."""
    from lightspeed.train import refuse_multirun_with_ddp

    refuse_multirun_with_ddp(train_cfg("trainer=ddp_cpu"))  # one run: fine
    with pytest.raises(ConfigError, match=r"multirun \(-m\) cannot drive a multi-process trainer.strategy"):
        refuse_multirun_with_ddp(train_cfg("trainer=ddp_cpu", "hydra.mode=MULTIRUN"))
    refuse_multirun_with_ddp(train_cfg("trainer=cpu", "hydra.mode=MULTIRUN"))  # a sweep on one device: fine


def test_a_sweep_job_whose_ranks_slurm_started_may_be_multi_process(train_cfg, monkeypatch) -> None:
    """hydra/launcher=slurm: each job is an srun of its tasks, Lightning starts no rank (test_submitit.py)."""
    from lightspeed.train import refuse_multirun_with_ddp

    cfg = train_cfg("trainer=ddp_cpu", "hydra.mode=MULTIRUN")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    refuse_multirun_with_ddp(cfg)
    monkeypatch.setenv("SLURM_JOB_NAME", "bash")  # an interactive allocation: Lightning starts the ranks
    with pytest.raises(ConfigError, match=r"submit the sweep to SLURM \(-m hydra/launcher=slurm"):
        refuse_multirun_with_ddp(cfg)


def test_the_plan_is_decided_once_and_the_config_is_read_only_until_the_run_ends(train_cfg) -> None:
    """Run's plan (identity, monitor, the checkpoint to resume, the autos) is frozen; no step after it can
    change the run's config (a write raises), no `auto` is left in what it resolves; Hydra's `cfg` stays as
    composed, the caller's to change."""
    from dataclasses import FrozenInstanceError

    from omegaconf import OmegaConf
    from omegaconf.errors import ReadonlyConfigError

    from lightspeed.train import Run

    args = (*TINY, "trainer.max_epochs=1", "test_after_fit=false")
    cfg = train_cfg(*args)
    with Run(cfg) as run:
        plan = run.plan
        assert plan.monitor == ("val/acc", "max") and plan.resume_from is None and plan.idle == ()
        with pytest.raises(FrozenInstanceError):
            plan.resume_from = "elsewhere.ckpt"  # type: ignore[misc]
        with pytest.raises(ReadonlyConfigError):
            run.cfg.trainer.max_epochs = 2
        assert cfg.trainer.precision == cfg.data.pin_memory == "auto" and cfg.monitor.metric is None
        resolved = OmegaConf.to_container(run.cfg, resolve=True)
        autos = {f"{p}.{k}" for p in ("trainer", "data") for k, v in resolved[p].items() if v == "auto"}
        assert autos == {
            "trainer.accelerator",
            "trainer.strategy",
            "data.on_device",
        }  # Lightning's; the data's
        assert resolved["trainer"]["precision"] == "32-true" and resolved["data"]["pin_memory"] is False
        assert resolved["model"]["optimizer"]["fused"] is True  # accel.optimizer_impl=auto, on a CPU
        dm = instantiate(run.cfg.data)
        model = instantiate(run.model_node(dm))
        trainer = instantiate(
            run.cfg.trainer, callbacks=run.callbacks(), logger=run.loggers(), plugins=run.plugins()
        )
        run.fit(trainer, model, dm)
        run.finish(trainer, model, dm)  # every step ran on the read-only config
    assert OmegaConf.to_container(cfg) == OmegaConf.to_container(train_cfg(*args))  # untouched by the run
    with Run(train_cfg(*args)) as run:  # the same command again: its plan continues the last checkpoint
        assert run.plan.resume_from is not None and run.plan.resume_from.endswith("last.ckpt")
