"""MNIST and Fashion-MNIST (`data=mnist`, `data=fashion_mnist`), downloaded from a local HTTP server on
127.0.0.1 that serves small files in the real IDX format: nothing here reaches the network. A project
made by `make new-project` without these data sets leaves this file out with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakes import check_fetched_once_kept_as_uint8_and_scaled_on_the_device, fake_downloads, fake_file
from lightspeed.data.mnist import FashionMNISTDataModule, MNISTDataModule


@pytest.mark.parametrize("cls", [MNISTDataModule, FashionMNISTDataModule], ids=lambda c: c.__name__)
def test_mnist_is_fetched_once_kept_as_uint8_and_scaled_on_the_device(
    cls: type, tmp_path: Path, monkeypatch
) -> None:
    check_fetched_once_kept_as_uint8_and_scaled_on_the_device(cls, tmp_path / "data", monkeypatch)


def test_a_tampered_file_never_trains(train_cfg, tmp_path: Path, monkeypatch, capsys) -> None:
    """A downloaded file changed on disk, no mirror to fetch it again from: one line, nothing trained."""
    from lightspeed.train import train

    with fake_downloads(MNISTDataModule, monkeypatch):
        MNISTDataModule(data_dir=str(tmp_path / "data" / "mnist")).prepare_data()
    path = tmp_path / "data" / "mnist" / "train-labels-idx1-ubyte.gz"
    path.write_bytes(fake_file(path.name, seed=1))  # other labels, same format
    with pytest.raises(SystemExit) as exit_:
        train(train_cfg("data=mnist", "data.mirrors=[http://127.0.0.1:9/]", "debug=fdr"))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "could not fetch train-labels-idx1-ubyte.gz" in lines[0]
    assert (
        "not the published" in lines[0]
        and not (tmp_path / "logs" / "train" / "runs" / "test" / "checkpoints").exists()
    )


def test_mirrors_given_as_one_string_are_one_line_before_any_download(
    train_cfg, tmp_path: Path, capsys
) -> None:
    from lightspeed.train import train

    with pytest.raises(SystemExit) as exit_:
        train(train_cfg("data=mnist", "data.mirrors=http://127.0.0.1:9/", "trainer.max_epochs=1"))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert "error: data.mirrors=http://127.0.0.1:9/ is a string: give a list" in err
    assert not (tmp_path / "data").exists()


def test_the_published_checksums_match_torchvision_s() -> None:
    """Where torchvision is installed: its MD5s of the same files (it is optional, not a dependency)."""
    datasets = pytest.importorskip("torchvision.datasets")
    for ours, theirs in ((MNISTDataModule, datasets.MNIST), (FashionMNISTDataModule, datasets.FashionMNIST)):
        mine = {r.filename: r.md5 for group in ours.remotes.values() for r in group}
        assert mine == dict(theirs.resources)


def test_eval_reads_a_downloaded_data_set_where_the_run_kept_it(
    train_cfg, eval_cfg, tmp_path: Path, monkeypatch, caplog
) -> None:
    """Trained with its own paths.data_dir: eval resolves the run's `${paths.data_dir}/mnist` on this
    machine and reads the files there, whatever eval's own default data; loader settings on the command
    line do not count as other data."""
    import logging

    from lightspeed.eval import run as evaluate
    from lightspeed.train import train

    store = f"paths.data_dir={tmp_path / 'store'}"
    quiet = ["callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false"]
    with fake_downloads(MNISTDataModule, monkeypatch) as server:
        result = train(train_cfg("data=mnist", store, "trainer.max_epochs=1", "model=mlp", *quiet))
        fetched = sum(server.served.values())
        with caplog.at_level(logging.INFO):
            metrics = evaluate(eval_cfg(f"ckpt_path={result.best_checkpoint}", store, "data.num_workers=0"))
        assert sum(server.served.values()) == fetched  # read where the run kept it, nothing fetched
    assert metrics["test/acc"] == pytest.approx(result.metrics["test/acc"], abs=1e-6)
    assert "data: as given" not in caplog.text and not (tmp_path / "data").exists()
