"""A user's own DataModule, written as the Lightning docs write one, trains under Lightspeed: alone,
under DDP with its own shard on each rank, and with a one-line error where it lacks what the model needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
