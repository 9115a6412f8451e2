"""A user's own DataModule, written as the Lightning docs write one, trains under Lightspeed: alone,
under DDP with its own shard on each rank, and with a one-line error where it lacks what the model needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import TINY, run_module
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
        "data: PlainDigits takes no pin_memory, num_workers, persistent_workers, prefetch_factor, "
        "non_blocking, on_device: its own loaders decide them"
    ]


def test_a_datamodule_without_num_classes_is_one_line(train_cfg, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        train(train_cfg(*TINY, "~data", "+data._target_=probes.ShapelessDigits"))
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: data: ShapelessDigits has no num_classes and no input_shape: the model is built from "
        "them; set them as attributes of your DataModule (e.g. num_classes = 10, input_shape = (1, 28, 28))"
    ]


@pytest.mark.slow
def test_a_plain_datamodule_under_ddp_cpu_gives_each_rank_its_own_shard(tmp_path: Path) -> None:
    proc = run_module(
        "lightspeed.train",
        *("trainer=ddp_cpu", "debug=limit", *PLAIN, "callbacks.rich_progress_bar=null"),
        *("+trainer.enable_progress_bar=false", f"hydra.run.dir={tmp_path / 'run'}"),
        *("+callbacks.probe._target_=probes.RankProbe", f"+callbacks.probe.out={tmp_path / 'probe'}"),
        cwd=tmp_path,
    )
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
    assert resumed.metrics == whole.metrics  # train/acc over the whole final epoch, on both


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
