"""A user's own DataModule, written as the Lightning docs write one, trains under Lightspeed: alone,
under DDP with its own shard on each rank, and with a one-line error where it lacks what the model needs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from conftest import TINY, run_ddp_cpu
from lightspeed.train import train

PLAIN = ["~data", "+data._target_=probes.PlainDigits", "+data.batch_size=64"]


def test_a_plain_lightning_datamodule_trains_and_the_loader_knobs_it_does_not_take_are_named(
    train_cfg, caplog
) -> None:
    import logging

    with caplog.at_level(logging.INFO):
        result = train(train_cfg(*TINY, *PLAIN, "trainer.max_epochs=1", "test_after_fit=false"))
    assert result.trainer.global_step == 5 and "val/acc" in result.metrics
    assert type(result.trainer.train_dataloader).__name__ == "DataLoader"  # its own, as it built it
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data: PlainDigits")]
    assert notes == [
        "data: PlainDigits takes no num_workers, pin_memory, non_blocking, on_device, persistent_workers, "
        "prefetch_factor: its own loaders decide them"
    ]


def test_a_datamodule_without_model_args_is_one_line(train_cfg, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        train(train_cfg(*TINY, "~data", "+data._target_=probes.ShapelessDigits"))
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: model=cnn (Classifier) is built from num_classes and input_shape, which data ShapelessDigits "
        "does not give (it has no model_args()): choose a model for this data (model=...), or have your "
        "DataModule's model_args() return them"
    ]


def test_only_what_a_module_is_built_from_comes_from_the_data_and_eval_rebuilds_it(
    train_cfg, eval_cfg, run_dir: Path, capsys, caplog
) -> None:
    """Not Lightning's own DataModule attributes (`name`), nor the DataModule's settings (`batch_size`) for
    an argument that has a default; `make eval` then rebuilds the module from its checkpoint (`lr` left at
    its default, not in its yaml), its class named on eval's command line, since no yaml of conf/ does."""
    from lightspeed.eval import run as evaluate

    model = ["~model", "+model._target_=probes.NamedClassifier"]
    result = train(train_cfg(*TINY, *model, "trainer.max_epochs=1"))
    hparams = dict(result.model.hparams)
    assert hparams == {
        "num_classes": 10,
        "input_shape": [1, 8, 8],
        "lr": 0.05,
        "name": "plain",
        "batch_size": 8,
    }
    assert torch.load(result.best_checkpoint, weights_only=True)["from_data"] == [
        "input_shape",
        "num_classes",
    ]
    quiet = ["trainer.enable_progress_bar=false", "++trainer.limit_test_batches=2"]
    with pytest.raises(SystemExit) as stop:  # a checkpoint is data: it names no class that conf/ does not
        evaluate(eval_cfg(*quiet))
    assert stop.value.code == 2 and "names model._target_=probes.NamedClassifier, a class that no yaml" in (
        capsys.readouterr().err
    )
    tested = evaluate(eval_cfg(*quiet, "module=probes.NamedClassifier"))  # named by the user: code they run
    assert tested["test/loss"] == pytest.approx(result.metrics["test/loss"])
    # without a predict_step of its own, predict=true is one line of what it loses, then the test's figures
    caplog.clear()
    predicted = evaluate(eval_cfg(*quiet, "module=probes.NamedClassifier", "predict=true"))
    assert predicted["test/loss"] == pytest.approx(result.metrics["test/loss"])
    said = [r.getMessage() for r in caplog.records if "predict_step" in r.getMessage()]
    assert said == [
        "predict=true: NamedClassifier has no predict_step, so nothing is predicted (no predictions.csv or "
        "pictures): give it one returning a dict of tensors (docs/guide.md)"
    ]
    assert not list(run_dir.parent.parent.parent.glob("eval/runs/*/predictions.csv"))
    forwarding = train(  # a debug run: a folder of its own (the trained run's is refused to it)
        train_cfg(
            *TINY,
            "model._target_=probes.ForwardingClassifier",
            "debug=fdr",
            f"paths.output_dir={run_dir.parent / 'fwd'}",
        )
    )
    assert forwarding.model.hparams["num_classes"] == 10  # `**kwargs` passed on: the base class's arguments


@pytest.mark.slow
def test_a_plain_datamodule_under_ddp_cpu_gives_each_rank_its_own_shard(tmp_path: Path) -> None:
    proc = run_ddp_cpu(tmp_path, *PLAIN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / "probe" / f"rank{r}.json").read_text()) for r in (0, 1)]
    a, b = (set(r["indices"]) for r in ranks)
    assert ranks[0]["dataset_size"] == 1200 and not a & b and len(a) == len(b) == 600


USER_MODEL = ["~model", "+model._target_=probes.PlainClassifier"]


@pytest.mark.parametrize("step", [5, 8], ids=["epoch end", "mid-epoch"])
def test_a_plain_lightning_module_resumes_bit_exactly(train_cfg, tmp_path: Path, step: int) -> None:
    """Its torchmetrics accuracy, on every rank, and the run's figures travel in the checkpoint through
    ExactResume: the module knows nothing of it."""
    from probes import Fault

    base = [*TINY, *USER_MODEL, "trainer.max_epochs=3", "test_after_fit=false"]
    whole = train(train_cfg(*base, f"paths.output_dir={tmp_path / 'whole'}"))
    cut = [*base, f"paths.output_dir={tmp_path / 'cut'}"]
    with pytest.raises(SystemExit):
        train(train_cfg(*cut), [Fault("sigterm", step=step - 1)])  # saved once step `step` is done
    resumed = train(train_cfg(*cut))
    assert resumed.trainer.global_step == whole.trainer.global_step == 15
    for key, value in whole.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    assert resumed.metrics == whole.metrics
    # the resumed epoch's train/acc counts its batches from before the cut too (the metric's restored state)
    whole_log, cut_log = (
        list(csv.DictReader((tmp_path / run / "csv" / version / "metrics.csv").open()))
        for run, version in (("whole", "version_0"), ("cut", "version_1"))
    )
    epoch = str(step // 5)
    acc = [
        {r["train/acc"] for r in log if r.get("train/acc") and r["epoch"] == epoch}
        for log in (whole_log, cut_log)
    ]
    assert acc[0] == acc[1] and len(acc[0]) == 1


def test_a_mid_epoch_resume_with_a_plain_dataloader_says_the_epoch_replays(
    train_cfg, tmp_path, caplog
) -> None:
    import logging

    from probes import Fault

    cut = [*TINY, *PLAIN, "trainer.max_epochs=2", "test_after_fit=false", f"paths.output_dir={tmp_path}"]
    with pytest.raises(SystemExit):
        train(train_cfg(*cut), [Fault("sigterm", step=2)])  # saved after batch 3 of 5
    with caplog.at_level(logging.INFO):
        train(train_cfg(*cut))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resumed at batch")]
    assert lines == [
        "resumed at batch 3 of 5 in epoch 0, but the training loader has no state_dict: the rest of the "
        "epoch replays its first batches (a loader with state_dict/load_state_dict, e.g. torchdata's "
        "StatefulDataLoader, resumes exactly)"
    ]


def test_exact_resume_keeps_metrics_whose_state_is_a_list(train_cfg) -> None:
    """torchmetrics that keep every value (CatMetric, AUROC without thresholds) hold lists of tensors."""
    from types import SimpleNamespace

    import lightning as L
    from torchmetrics import CatMetric

    from lightspeed.resilience.exact_resume import MetricState

    class Holder(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.seen = CatMetric()

    saved, restored = Holder(), Holder()
    saved.seen.update(torch.tensor([1.0, 2.0]))
    saved.seen.update(torch.tensor([3.0]))
    progress = SimpleNamespace(
        epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(current=SimpleNamespace(processed=2)))
    )
    trainer = SimpleNamespace(
        current_epoch=0,
        callback_metrics={},
        world_size=1,
        global_rank=0,
        num_training_batches=5,
        fit_loop=progress,
        train_dataloader=SimpleNamespace(state_dict=dict),
    )
    checkpoint: dict = {}
    MetricState().on_save_checkpoint(trainer, saved, checkpoint)
    callback = MetricState()
    callback.on_load_checkpoint(trainer, restored, checkpoint)
    callback.on_train_start(trainer, restored)
    assert restored.seen.compute().tolist() == [1.0, 2.0, 3.0]


@pytest.mark.slow
def test_a_compiled_model_under_ddp_cpu_does_not_recompile_in_steady_state(tmp_path: Path) -> None:
    """Lightning calls the whole module under DDP: only its forward is compiled, not the step around it."""
    proc = run_ddp_cpu(
        tmp_path, "model=mlp", "accel.compile=true", "accel.compile_backend=eager", probe=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recompile_limit" not in proc.stderr
    assert json.loads((tmp_path / "run" / "speed.json").read_text())["recompiles"] == 0


def test_a_training_step_that_returns_none_skips_its_update_and_the_run_goes_on(train_cfg) -> None:
    """Lightning's meaning of None (no update for that batch); the non-finite guard had raised KeyError."""
    snap = ["+callbacks.snap._target_=probes.Snapshot", "+callbacks.snap.step=2"]
    result = train(
        train_cfg(*TINY, *snap, "model._target_=probes.NoneStepClassifier", "test_after_fit=false")
    )
    (taken,) = [cb for cb in result.trainer.callbacks if type(cb).__name__ == "Snapshot"]
    params = dict(result.model.named_parameters())  # BatchNorm's running statistics move in any forward
    assert all(torch.equal(taken.before["weights"][k], taken.after["weights"][k]) for k in params)


@pytest.mark.parametrize(
    ("override", "hook"),
    [
        ("model._target_=probes.UntestedClassifier", "test_step"),
        ("data._target_=probes.UntestedDigits", "test_dataloader"),
    ],
)
def test_what_testing_needs_is_checked_before_the_fit_not_after_it(
    train_cfg, capsys, override: str, hook: str
) -> None:
    cfg = train_cfg(*TINY, override)
    with pytest.raises(SystemExit) as stop:
        train(cfg)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and hook in line and "test_after_fit=false" in line, line
    assert not (Path(cfg.paths.output_dir) / "checkpoints").exists()  # refused before the first step
    assert train(train_cfg(*TINY, override, "test_after_fit=false")).trainer.global_step > 0
