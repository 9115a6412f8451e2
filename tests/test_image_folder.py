"""data=image_folder on folders of real JPEG and PNG files that the tests make (tests/fakes.py)."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import TINY, assert_resumes_exactly
from fakes import image_folder
from lightspeed.core.config import ConfigError, exit_on_config_error
from lightspeed.data.host_loader import ResumableDataLoader
from lightspeed.data.image_folder import ImageFolderDataModule
from lightspeed.data.images import ImageFiles, decode, scan
from lightspeed.eval import run as evaluate
from lightspeed.resilience.identity import CLASS_NAMES_KEY
from lightspeed.train import train

RUN = [*TINY, "data=image_folder", "data.image_size=16", "data.batch_size=8", "model.scheduler.name=none"]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return image_folder(tmp_path / "shapes")


def save(array: np.ndarray, path: Path) -> Path:
    Image.fromarray(array).save(path)
    return path


def test_the_resize_policy_scales_the_shorter_side_and_cuts_the_centre(tmp_path: Path) -> None:
    wide = np.zeros((32, 64, 3), np.uint8)
    wide[:, :16, 0] = wide[:, 48:, 2] = 255  # red left quarter, blue right quarter, green middle half
    wide[:, 16:48, 1] = 255
    x = decode(save(wide, tmp_path / "wide.png"), 32, 3)
    assert x.shape == (3, 32, 32) and x.dtype == torch.uint8
    assert (x[1] == 255).all() and (x[0] == 0).all() and (x[2] == 0).all()  # only the centre is left
    small = decode(save(np.full((8, 8, 3), 77, np.uint8), tmp_path / "small.png"), 32, 3)  # scaled up
    assert small.shape == (3, 32, 32) and (small == 77).all()
    same = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    assert torch.equal(
        decode(save(same, tmp_path / "same.png"), 32, 3), torch.from_numpy(same).permute(2, 0, 1)
    )


def test_grey_palette_and_alpha_images_become_the_channels_asked_for(tmp_path: Path) -> None:
    grey = save(np.full((10, 10), 100, np.uint8), tmp_path / "grey.png")
    rgba = tmp_path / "rgba.png"
    Image.new("RGBA", (10, 10), (10, 20, 30, 0)).save(rgba)
    palette = tmp_path / "palette.png"
    Image.new("RGB", (10, 10), (204, 0, 0)).convert("P").save(palette)  # a web-palette colour
    assert decode(grey, 10, 3).tolist() == torch.full((3, 10, 10), 100).tolist()
    assert decode(rgba, 10, 3)[:, 0, 0].tolist() == [10, 20, 30]  # alpha dropped
    assert decode(palette, 10, 3)[:, 0, 0].tolist() == [204, 0, 0]
    assert decode(rgba, 10, 1).shape == (1, 10, 10)


def test_the_exif_orientation_is_applied_and_16_bit_grey_is_scaled_not_clipped(tmp_path: Path) -> None:
    tall = np.zeros((40, 20, 3), np.uint8)
    tall[:20] = 255  # white top half, as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to view", as a phone writes it
    Image.fromarray(tall).save(tmp_path / "phone.jpg", exif=exif)
    shown = decode(tmp_path / "phone.jpg", 20, 1)  # seen as 40 wide, 20 high: the white half on the right
    assert shown[0, :, :8].float().mean() < 40 and shown[0, :, 12:].float().mean() > 215
    ramp = np.tile(np.linspace(0, 65535, 32).astype(np.uint16), (32, 1))
    Image.fromarray(ramp).save(tmp_path / "deep.png")  # mode I;16
    grey = decode(tmp_path / "deep.png", 32, 1)[0]
    assert grey[0, 0] == 0 and grey[0, -1] == 255 and 120 < grey.float().mean() < 135


def test_hidden_folders_are_not_classes_and_train_beside_other_folders_is_refused(tmp_path: Path) -> None:
    root = image_folder(tmp_path / "shapes")
    (root / ".ipynb_checkpoints").mkdir()
    (root / "__MACOSX").mkdir()
    image_folder(root / "green" / ".thumbnails", per_class=2)  # hidden copies inside a class
    assert scan(root).classes == ["blob", "green", "stripes"] and len(scan(root).files) == 72
    image_folder(tmp_path / "mixed" / "train", per_class=2)
    (tmp_path / "mixed" / "valid").mkdir()
    with pytest.raises(ConfigError, match=r"has train/ beside valid: name the splits train/, val/, test/"):
        scan(tmp_path / "mixed")


def test_the_folder_trains_decoded_in_loader_workers_as_uint8(train_cfg, folder: Path) -> None:
    cfg = train_cfg(*RUN, f"data.root={folder}", "data.num_workers=1", "data.persistent_workers=false")
    result = train(cfg)
    dm = result.trainer.datamodule
    assert dm.class_names == ["blob", "green", "stripes"] and dm.num_classes == 3
    assert isinstance(dm.splits["train"], ImageFiles)  # files, not a tensor in memory
    loader = dm.train_dataloader()
    assert isinstance(loader, ResumableDataLoader) and loader.num_workers == 1
    x, y = next(iter(loader))
    assert x.dtype == torch.uint8 and x.shape == (8, 3, 16, 16) and y.dtype == torch.int64
    assert sum(len(dm.splits[s]) for s in ("train", "val", "test")) == 72  # notes.txt left out
    assert result.metrics["test/acc"] > 1 / 3  # it learns the patterns
    best = torch.load(result.best_checkpoint, weights_only=True)
    assert best[CLASS_NAMES_KEY] == ["blob", "green", "stripes"]


def test_named_split_folders_are_kept_and_validation_is_drawn_from_train(tmp_path: Path) -> None:
    root = tmp_path / "named"
    image_folder(root / "train", per_class=10)
    image_folder(root / "test", per_class=3, seed=1)
    dm = ImageFolderDataModule(root=str(root), image_size=8, val_fraction=0.2, batch_size=4)
    dm.setup("fit")
    assert {s: len(dm.splits[s]) for s in ("train", "val", "test")} == {"train": 24, "val": 6, "test": 9}
    assert all(f.startswith("test/") for f in dm.splits["test"].files)
    assert not set(dm.splits["val"].files) & set(dm.splits["train"].files)


def test_the_decode_once_cache_serves_the_same_pixels_from_memory_and_follows_changes(
    tmp_path: Path, folder: Path, monkeypatch
) -> None:
    def module(cache: bool) -> ImageFolderDataModule:
        dm = ImageFolderDataModule(
            root=str(folder),
            image_size=16,
            cache=cache,
            data_dir=str(tmp_path / "d"),
            batch_size=8,
            on_device="auto",
        )
        dm.prepare_data()
        dm.setup("fit")
        return dm

    files, cached = module(False), module(True)
    (path,) = (tmp_path / "d" / "image_folder").glob("*.pt")
    assert not list(path.parent.glob(".*"))  # no temporary file left
    for split in ("train", "val", "test"):
        x, y = cached.splits[split].tensors
        assert x.dtype == torch.uint8
        whole = files.splits[split].__getitems__(list(range(len(y))))
        assert torch.equal(x, whole[0]) and torch.equal(y, whole[1])
    assert torch.equal(cached.sample_ids["train"], files.sample_ids["train"])
    assert cached.uses_device_loader() and not files.uses_device_loader()

    monkeypatch.setattr("lightspeed.data.images.decode", lambda *a: pytest.fail("decoded again"))
    module(True)  # read from the cache file
    monkeypatch.undo()
    save(np.zeros((16, 16, 3), np.uint8), folder / "green" / "0.png")  # a file changes: decoded again
    changed = module(True)
    (fresh,) = set(path.parent.glob("*.pt")) - {path}
    assert not path.exists()  # the folder's older cache is removed
    pixels = torch.load(fresh, weights_only=True)["pixels"]
    assert (pixels[changed.listing.files.index("green/0.png")] == 0).all()


def test_eval_refuses_a_folder_whose_classes_differ_and_names_classes_in_predictions(
    train_cfg, eval_cfg, folder: Path, tmp_path: Path, capsys
) -> None:
    train(train_cfg(*RUN, f"data.root={folder}"))
    evaluate(eval_cfg("predict=true"))
    (predictions,) = (tmp_path / "logs" / "eval").glob("**/predictions.csv")
    rows = list(csv.DictReader(predictions.open()))
    names = ["blob", "green", "stripes"]
    assert rows and all(r["pred_class"] == names[int(r["pred"])] for r in rows)
    assert all(r["target_class"] == names[int(r["target"])] for r in rows)

    shutil.move(folder / "stripes", folder / "zebra")  # same count, another meaning for label 2
    with pytest.raises(SystemExit) as exit_, exit_on_config_error():
        evaluate(eval_cfg())
    assert exit_.value.code == 2
    assert "label 2 is 'stripes' in training, 'zebra' here" in capsys.readouterr().err


def test_a_file_that_is_not_an_image_ends_in_one_line_naming_it(train_cfg, folder: Path, capsys) -> None:
    (folder / "green" / "5.png").write_bytes(b"not a png")
    cfg = train_cfg(*RUN, f"data.root={folder}", "data.num_workers=1", "data.persistent_workers=false")
    with pytest.raises(SystemExit) as exit_:
        train(cfg)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "green/5.png is not a JPEG or PNG image" in err[-1], err[-3:]


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        ([], "data.root is not set: data=image_folder needs data.root="),
        (["data.root=/nonexistent/x"], "data.root=/nonexistent/x is not a folder"),
        (["data.root={folder}", "data.channels=2"], "data.channels=2 is invalid"),
    ],
)
def test_a_bad_folder_setting_is_one_line(
    train_cfg, folder: Path, capsys, settings: list[str], line: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        train(train_cfg(*RUN, *(s.format(folder=folder) for s in settings)))
    assert exit_.value.code == 2 and capsys.readouterr().err.startswith(f"error: {line}")


def test_on_device_true_needs_the_cache(train_cfg, folder: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        train(train_cfg(*RUN, f"data.root={folder}", "data.on_device=true"))
    assert "data.on_device=true needs the data set in memory" in capsys.readouterr().err


def test_a_run_on_files_resumes_mid_epoch_bit_identically(train_cfg, folder: Path, tmp_path: Path) -> None:
    overrides = [
        *RUN,
        f"data.root={folder}",
        "data.num_workers=1",
        "data.augment.crop_padding=2",
        "++trainer.limit_train_batches=null",
        "trainer.max_epochs=2",
    ]
    assert_resumes_exactly(train_cfg, tmp_path, overrides, at=3, steps=14)  # 7 steps an epoch


@pytest.mark.parametrize("where", ["blob/0.png", "stripes/2.png"])  # the first test batch of 8, the second
def test_a_corrupt_test_image_ends_in_one_line_and_the_finished_fit_keeps_its_summary(
    train_cfg, run_dir: Path, tmp_path: Path, capsys, where: str
) -> None:
    """Testing meets a file that does not decode: one line (exit 2), not a traceback. In the first test
    batch, which `test_after_fit` tries before the fit, nothing is trained; later, the fit has finished and
    its summary is already written, so `make eval ckpt_path=latest` finds its best checkpoint."""
    from lightspeed.run.restore import find_checkpoint

    root = tmp_path / "split"
    image_folder(root / "train", per_class=12)
    image_folder(root / "test", per_class=3)
    broken = root / "test" / where
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really" * 10)
    with pytest.raises(SystemExit) as stop:
        train(train_cfg(*RUN, f"data.root={root}", "data.num_workers=0"))
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert f"{broken} cannot be decoded as an image" in err[0]
    if where.startswith("blob"):
        assert not (run_dir / "summary.json").exists() and not list(run_dir.rglob("*.ckpt"))
        return
    best = json.loads((run_dir / "summary.json").read_text())["best_checkpoint"]
    assert best and find_checkpoint("latest", tmp_path / "logs") == Path(best)


def test_eval_latest_passes_over_a_torn_or_odd_summary(tmp_path: Path) -> None:
    from lightspeed.run.restore import find_checkpoint

    runs = tmp_path / "logs" / "train" / "runs"
    good = runs / "good"
    (good / "checkpoints").mkdir(parents=True)
    (good / "checkpoints" / "best.ckpt").write_bytes(b"x")
    (good / "summary.json").write_text(
        json.dumps({"best_checkpoint": str(good / "checkpoints" / "best.ckpt")})
    )
    for name, text in (
        ("torn", '{"best_checkpoint": "/x'),
        ("list", "[1, 2]"),
        ("odd", '{"best_checkpoint": 7}'),
    ):
        (runs / name).mkdir()
        (runs / name / "summary.json").write_text(text)  # newer than the good one
    (runs / "fifo").mkdir()
    os.mkfifo(runs / "fifo" / "summary.json")  # reading it would wait forever
    assert find_checkpoint("latest", tmp_path / "logs") == good / "checkpoints" / "best.ckpt"


def test_only_jpeg_and_png_are_decoded_and_bombs_are_one_line(tmp_path: Path, monkeypatch) -> None:
    """A GIF named .png, an image past PIL's pixel limit, a PNG whose text chunk decompresses past its limit:
    each one line naming the file (the limits lowered here, so that the files stay small)."""
    from PIL import PngImagePlugin

    gif = tmp_path / "a.png"
    Image.new("RGB", (8, 8)).save(gif, format="GIF")
    with pytest.raises(ConfigError, match=rf"^{gif} is not a JPEG or PNG image: remove or convert it$"):
        decode(gif, 8, 3)
    big = tmp_path / "big.png"
    Image.new("RGB", (64, 64)).save(big)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 4096 pixels: over twice the limit
    with pytest.raises(ConfigError, match=rf"^{big} is too large to decode \(.*\): remove or shrink it$"):
        decode(big, 8, 3)
    monkeypatch.undo()
    text = tmp_path / "text.png"
    info = PngImagePlugin.PngInfo()
    info.add_text("comment", "x" * 5000, zip=True)
    Image.new("RGB", (8, 8)).save(text, pnginfo=info)
    monkeypatch.setattr(PngImagePlugin, "MAX_TEXT_CHUNK", 1000)
    with pytest.raises(
        ConfigError, match=rf"^{text} cannot be decoded as an image \(.*\): remove or replace it$"
    ):
        decode(text, 8, 3)


def _refused_as_changed(cfg, capsys) -> None:
    """The rerun ends in one line (exit 2) saying the data changed since the run's checkpoint."""
    with pytest.raises(SystemExit) as stop:
        train(cfg)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(
        "error: the data changed since this run's checkpoint: its training split now has"
    )


def test_a_folder_changed_since_the_run_s_checkpoint_is_refused_naming_the_change(
    train_cfg, folder: Path, run_dir: Path, capsys
) -> None:
    """Preempted, one image added, rerun: every split would be drawn anew (test images among the training
    ones) and the resume used to go on without a word."""
    from probes import Fault

    run = [*RUN, f"data.root={folder}"]
    with pytest.raises(SystemExit):
        train(train_cfg(*run), [Fault("sigterm", step=2)])
    capsys.readouterr()
    for added in (1, 30):  # one image; enough for an epoch of another length too
        for i in range(added):
            shutil.copy(folder / "blob" / "0.png", folder / "blob" / f"new{i}.png")
        _refused_as_changed(train_cfg(*run), capsys)
        if added == 1:  # a new run fine-tuning from it on the changed folder: its own choice, not refused
            last = run_dir / "checkpoints" / "last.ckpt"
            tuned = [
                *run,
                "run_name=tuned",
                f"paths.output_dir={run_dir.parent / 'tuned'}",
                f"ckpt_path={last}",
            ]
            assert train(train_cfg(*tuned)).trainer.global_step == 10
        for extra in folder.glob("blob/new*.png"):
            extra.unlink()
    assert train(train_cfg(*run)).trainer.global_step == 10  # the data restored: it resumes


def test_a_folder_with_its_own_splits_changed_in_train_is_refused_and_in_test_resumes(
    train_cfg, tmp_path: Path, run_dir: Path, capsys
) -> None:
    """Named train/ and test/ folders: an image added to train/ changes what the run trains on (refused, one
    line); one added to test/ only does not change the training split (validation is drawn from train/)."""
    from probes import Fault

    root = tmp_path / "named"
    image_folder(root / "train", per_class=10)
    image_folder(root / "test", per_class=3, seed=1)
    run = [*RUN, f"data.root={root}"]
    with pytest.raises(SystemExit):
        train(train_cfg(*run), [Fault("sigterm", step=2)])
    capsys.readouterr()
    added = shutil.copy(root / "train" / "blob" / "0.png", root / "train" / "blob" / "new.png")
    _refused_as_changed(train_cfg(*run), capsys)
    os.unlink(added)
    shutil.copy(root / "test" / "blob" / "0.png", root / "test" / "blob" / "new.png")
    assert train(train_cfg(*run)).trainer.global_step == 6  # resumed to the end: 2 epochs of 27 // 8 batches
