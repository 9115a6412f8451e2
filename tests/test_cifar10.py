"""CIFAR-10 (`data=cifar10`), downloaded from a local HTTP server on 127.0.0.1 that serves a small
archive in the real format (python pickles in a tar.gz): nothing here reaches the network. A project
made by `make new-project` without this data set leaves this file out with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import LIMIT
from fakes import check_fetched_once_kept_as_uint8_and_scaled_on_the_device, fake_downloads
from lightspeed.data.cifar10 import CIFAR10DataModule


def test_cifar10_is_fetched_once_kept_as_uint8_and_scaled_on_the_device(tmp_path: Path, monkeypatch) -> None:
    check_fetched_once_kept_as_uint8_and_scaled_on_the_device(
        CIFAR10DataModule, tmp_path / "data", monkeypatch
    )


def test_the_published_checksum_matches_torchvision_s() -> None:
    """Where torchvision is installed: its MD5 of the same archive (it is optional, not a dependency)."""
    datasets = pytest.importorskip("torchvision.datasets")
    (archive,) = CIFAR10DataModule.remotes["archive"]
    assert (archive.filename, archive.md5) == (datasets.CIFAR10.filename, datasets.CIFAR10.tgz_md5)


def test_a_checkpoint_chooses_neither_the_folder_eval_writes_into_nor_the_server_it_downloads_from(
    train_cfg, eval_cfg, tmp_path: Path, capsys, monkeypatch
) -> None:
    """Where data is kept and fetched from would let a checkpoint choose the folder eval writes into and
    the server it downloads from: a fixed folder is refused (data.data_dir names one); the mirrors are
    this machine's whatever the checkpoint says."""
    from lightspeed.eval import run as evaluate
    from lightspeed.resilience.identity import DATA_CONFIG_KEY
    from lightspeed.train import train

    with fake_downloads(CIFAR10DataModule, monkeypatch):  # a CIFAR-10 run's checkpoint
        cifar = ["data=cifar10", "model=mlp", *LIMIT, f"paths.output_dir={tmp_path / 'cifar'}"]
        run = train(train_cfg(*cifar, "callbacks.rich_progress_bar=null"))
    assert run.trainer.global_step > 0
    state = torch.load(tmp_path / "cifar" / "checkpoints" / "last.ckpt", weights_only=True)
    chosen = tmp_path / "chosen" / "by" / "ckpt"
    state[DATA_CONFIG_KEY] |= {"data_dir": str(chosen), "mirrors": ["http://127.0.0.1:9/attacker/"]}
    torch.save(state, tmp_path / "places.ckpt")
    places = [f"ckpt_path={tmp_path / 'places.ckpt'}", "trainer.enable_progress_bar=false"]
    with pytest.raises(SystemExit) as exit_:
        evaluate(eval_cfg(*places))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "places.ckpt's data config keeps its data at a fixed path" in err
    # a folder of its own, so that eval downloads (the training run's has the files: no mirror asked)
    with fake_downloads(CIFAR10DataModule, monkeypatch) as server:  # the attacker's mirror would not serve
        tested = evaluate(eval_cfg(*places, f"++data.data_dir={tmp_path / 'fresh'}"))
    assert "test/acc" in tested and not chosen.exists()  # where the user says
    assert sum(server.served.values()) >= 1 and (tmp_path / "fresh").is_dir()  # from this machine's mirrors
