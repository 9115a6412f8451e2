"""Data larger than memory: `make shards` writes any data set as LitData shards, `data=shards` streams them,
resumes mid-epoch exactly, deals them out by rank, and holds about a chunk in anonymous memory."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import REPO, TINY, assert_resumes_exactly, run_module

pytest.importorskip(
    "litdata", reason="data=shards needs the streaming extra (make install EXTRAS=dev,streaming)"
)
from fakes import image_folder
from lightspeed.data import DigitsDataModule, SyntheticDataModule
from lightspeed.data.image_folder import ImageFolderDataModule
from lightspeed.data.shards import CHECKSUMS, META, ShardsDataModule, write_shards
from lightspeed.resilience.identity import CLASS_NAMES_KEY
from lightspeed.run.entry import compose_config
from lightspeed.shards import convert
from lightspeed.train import train

RUN = [*TINY, "data=shards", "data.batch_size=16", "model=mlp", "model.scheduler.name=none"]


def synthetic(n: int = 600, shape: tuple[int, ...] = (3, 8, 8)) -> SyntheticDataModule:
    return SyntheticDataModule(num_samples=n, shape=shape, batch_size=16)


@pytest.mark.slow  # over 9 s on the 2-core CI machine: make test stays within 4 minutes
def test_make_shards_writes_every_split_and_a_run_streams_them(tmp_path: Path, train_cfg) -> None:
    cfg = compose_config("shards", ["data=digits", f"shards.out={tmp_path / 'digits'}"], tmp_path / "logs")
    out = convert(cfg)
    meta = json.loads((out / META).read_text())
    assert meta["samples"] == {"train": 1258, "val": 180, "test": 359}
    assert meta["declares"] == {"input_shape": [1, 8, 8], "num_classes": 10} and meta["target_stats"] is None
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left

    result = train(
        train_cfg(
            *RUN,
            f"data.path={out}",
            "model=cnn",
            "trainer.max_epochs=3",
            "++trainer.limit_train_batches=null",
            "++trainer.limit_val_batches=null",
            "++trainer.limit_test_batches=null",
        )
    )
    assert result.metrics["test/acc"] > 0.8
    # the same samples as the in-memory data set, in the same splits: the checkpoint knows them
    digits = DigitsDataModule()
    digits.setup()
    best = torch.load(result.best_checkpoint, weights_only=True)
    assert torch.equal(best["train_samples"], digits.sample_ids["train"])


def test_a_regression_data_set_streams_from_shards_to_the_regressor(tmp_path: Path, train_cfg) -> None:
    """Shards keep what the data set declares (num_targets, not num_classes) and its target statistics."""
    cfg = compose_config("shards", ["data=diabetes", f"shards.out={tmp_path / 'd'}"], tmp_path / "logs")
    out = convert(cfg)
    meta = json.loads((out / META).read_text())
    assert meta["declares"] == {"input_shape": [10], "num_targets": 1}
    stats = {"target_mean": meta["target_stats"][0], "target_std": meta["target_stats"][1]}
    assert meta["model_args"] == {"input_shape": [10], "num_targets": 1, **stats}
    run = [*TINY, "data=shards", f"data.path={out}", "data.batch_size=16", "model=regressor"]
    result = train(train_cfg(*run, "trainer.max_epochs=3"))
    assert result.model.hparams["target_mean"] == pytest.approx(meta["target_stats"][0])
    assert result.model.hparams["target_mean"][0] == pytest.approx(152, abs=10)  # the targets' own units
    assert 0 < result.metrics["test/mae"] < 100
    # shards written before they kept model_args: the same, from what the data set declared
    (out / META).write_text(json.dumps({k: v for k, v in meta.items() if k != "model_args"}))
    assert ShardsDataModule(path=str(out)).model_args() == meta["model_args"]


def test_sort_shards_build_the_next_token_model_with_or_without_model_args_in_meta(tmp_path: Path) -> None:
    cfg = compose_config(
        "shards", ["data=sort", "data.num_samples=600", f"shards.out={tmp_path / 's'}"], tmp_path / "logs"
    )
    out = convert(cfg)
    meta = json.loads((out / META).read_text())
    assert meta["model_args"] == {"vocab_size": 4, "block_size": 15}
    (out / META).write_text(json.dumps({k: v for k, v in meta.items() if k != "model_args"}))
    assert ShardsDataModule(path=str(out)).model_args() == {"vocab_size": 4, "block_size": 15}


def test_shards_written_before_they_kept_what_the_data_declares_still_load(tmp_path: Path) -> None:
    out = write_shards(synthetic(200), tmp_path / "old")
    meta = json.loads((out / META).read_text())
    old = {k: v for k, v in meta.items() if k not in ("declares", "target_stats", CHECKSUMS)}
    old |= {"input_shape": [3, 8, 8], "num_classes": 10, "class_names": None}  # meta.json's keys before
    (out / META).write_text(json.dumps(old))
    dm = ShardsDataModule(path=str(out))
    assert (dm.input_shape, dm.num_classes) == ((3, 8, 8), 10)
    assert dm.model_args() == {"input_shape": [3, 8, 8], "num_classes": 10}
    dm.setup()
    assert len(list(dm.val_dataloader())) > 0  # no checksums to check: read as before


def test_image_folder_shards_keep_uint8_pixels_the_scaling_and_the_class_names(
    tmp_path: Path, train_cfg
) -> None:
    images = ImageFolderDataModule(root=str(image_folder(tmp_path / "img")), image_size=8, batch_size=8)
    out = write_shards(images, tmp_path / "shards", "64KB")
    dm = ShardsDataModule(path=str(out), batch_size=8)
    dm.setup("fit")
    assert dm.class_names == ["blob", "green", "stripes"] and dm.input_scale == images.input_scale
    x, y = next(iter(dm.val_dataloader()))
    assert x.dtype == torch.uint8 and x.shape == (7, 3, 8, 8)  # all 7 validation images (72 x 0.1)
    assert y.dtype == torch.int64
    result = train(train_cfg(*RUN, f"data.path={out}", "data.batch_size=8"))
    assert torch.load(result.trainer.checkpoint_callback.last_model_path, weights_only=True)[
        CLASS_NAMES_KEY
    ] == ["blob", "green", "stripes"]


def test_an_interrupted_conversion_leaves_nothing_and_an_existing_folder_is_refused(
    tmp_path: Path, monkeypatch
) -> None:
    from litdata.streaming.writer import BinaryWriter

    def cut(self) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(BinaryWriter, "done", cut)
    with pytest.raises(KeyboardInterrupt):
        write_shards(synthetic(), tmp_path / "out", "64KB")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    write_shards(synthetic(), tmp_path / "out", "64KB")
    with pytest.raises(ValueError, match=r"shards\.out=.*holds shards already"):
        write_shards(synthetic(), tmp_path / "out", "64KB")


def test_shards_are_readable_like_any_file_and_a_folder_in_the_way_is_refused_before_any_work(
    tmp_path: Path, train_cfg
) -> None:
    out = write_shards(synthetic(), tmp_path / "out", "64KB")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"shards\.out=.*other holds other files: delete it"):
        write_shards(synthetic(), other, "64KB")
    cfg = compose_config(
        "shards", ["data=shards", f"data.path={out}", f"shards.out={tmp_path / 'x'}"], tmp_path
    )
    with pytest.raises(SystemExit):
        convert(cfg)


def test_a_rank_short_of_its_share_of_chunks_is_one_line(tmp_path: Path) -> None:
    dm = ShardsDataModule(path=str(write_shards(synthetic(), tmp_path / "out", "1MB")), batch_size=16)
    dm._check_share(420)  # all of it
    with pytest.raises(ValueError, match=r"rank 0 of 1 gets 0 of its 420 training samples \(1 chunks"):
        dm._check_share(0)


def test_a_missing_or_unset_path_is_one_line(train_cfg, tmp_path: Path, capsys) -> None:
    for settings, line in (([], "data.path is not set"), ([f"data.path={tmp_path}"], "holds no shards")):
        with pytest.raises(SystemExit) as exit_:
            train(train_cfg(*RUN, *settings))
        assert exit_.value.code == 2 and line in capsys.readouterr().err


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])  # 2 loader workers: ~9 s
def test_a_sharded_run_resumes_mid_epoch_bit_identically(train_cfg, tmp_path: Path, workers: int) -> None:
    out = write_shards(synthetic(), tmp_path / "shards", "16KB")  # 420 training samples in 23 chunks
    overrides = [
        *RUN,
        f"data.path={out}",
        f"data.num_workers={workers}",
        "data.augment.flip=true",
        "model.net.dropout=0.3",
        "++trainer.limit_train_batches=null",
        "trainer.max_epochs=2",
    ]
    assert_resumes_exactly(train_cfg, tmp_path, overrides, at=11, steps=52)  # 26 steps an epoch


@pytest.mark.slow
def test_ddp_cpu_ranks_stream_disjoint_shards(tmp_path: Path) -> None:
    out = write_shards(synthetic(), tmp_path / "shards", "16KB")
    proc = run_module(
        "lightspeed.train",
        "trainer=ddp_cpu",
        *RUN,
        f"data.path={out}",
        "++trainer.limit_train_batches=null",
        "trainer.max_epochs=1",
        "test_after_fit=false",
        "+callbacks.probe._target_=probes.SeenSamples",
        f"+callbacks.probe.out={tmp_path / 'probe'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / "probe" / f"rank{r}.json").read_text()) for r in (0, 1)]
    a, b = (set(r["samples"]) for r in ranks)
    assert len(a) == len(ranks[0]["samples"]) == len(b) == 208  # 420 training samples: 13 steps of 16 a rank
    assert not a & b


MEMORY_SCRIPT = """
import sys
from lightspeed.data.shards import ShardsDataModule

def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) * 1024

dm = ShardsDataModule(path=sys.argv[1], batch_size=16)  # 0.75 MiB a batch
dm.setup("fit")
batches = iter(dm.train_dataloader())
seen = len(next(batches)[0])
baseline = peak = rss_anon()
for x, y in batches:
    seen += len(x)
    peak = max(peak, rss_anon())
print(baseline, peak, seen)
"""


@pytest.mark.slow  # over 9 s on the 2-core CI machine: make test stays within 4 minutes
def test_streaming_shards_larger_than_the_allowed_growth_keeps_anonymous_memory_bounded(
    tmp_path: Path,
) -> None:
    """Shards 8x the allowed growth (two chunks) are read in a fresh process: from its first batch on (the
    baseline: imports done, the loader running), its anonymous memory (RssAnon: not the page cache, not
    memory-mapped files) stays within the baseline plus two chunks."""
    chunk = 4 * 2**20
    out = write_shards(synthetic(n=2000, shape=(3, 64, 64)), tmp_path / "shards", chunk)  # 48 KiB a sample
    written = sum(p.stat().st_size for p in (out / "train").glob("*.bin"))
    assert written > 8 * chunk
    script = tmp_path / "read.py"
    script.write_text(MEMORY_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(out)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    baseline, peak, seen = map(int, proc.stdout.split()[-3:])
    assert seen == 1400 - 1400 % 16  # 1400 training samples, full batches
    assert peak - baseline < 2 * chunk, f"RssAnon grew {(peak - baseline) / 2**20:.1f} MiB"


def _shards_writer(out: str, barrier: Any, queue: Any) -> None:
    from lightspeed.core.config import ConfigError

    dm = DigitsDataModule()
    dm.setup()
    barrier.wait()
    try:
        write_shards(dm, Path(out), "64KB")
        queue.put("written")
    except ConfigError as err:
        queue.put(str(err))


@pytest.mark.slow  # over 9 s on the 2-core CI machine: make test stays within 4 minutes
def test_two_make_shards_into_one_folder_leave_one_whole_set_and_one_line(tmp_path: Path) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # no threads inherited from earlier tests (LitData readers)
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    out = tmp_path / "digits"
    procs = [ctx.Process(target=_shards_writer, args=(str(out), barrier, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    said = sorted(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert said[1] == "written", said
    assert said[0] == "written" or said[0].startswith(f"shards.out={out} "), said  # the other: one line
    assert ShardsDataModule(path=str(out)).samples == {"train": 1258, "val": 180, "test": 359}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_broken_shards_and_a_file_in_the_way_are_one_line_each(tmp_path: Path) -> None:
    from lightspeed.core.config import ConfigError

    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ConfigError, match=r"^shards\.out=.*a-file is a file: name a folder"):
        write_shards(synthetic(100), tmp_path / "a-file")
    out = write_shards(synthetic(200), tmp_path / "s")
    (out / "val" / "index.json").rename(out / "val" / "index.json.gone")
    with pytest.raises(
        ConfigError, match=r"^data\.path=.* holds broken shards \(.*index\.json.*\): write them"
    ):
        ShardsDataModule(path=str(out))
    (out / "val" / "index.json.gone").rename(out / "val" / "index.json")
    next((out / "train").glob("chunk-*.bin")).unlink()
    with pytest.raises(ConfigError, match=r"holds broken shards \(train/chunk-.*\.bin is missing\)"):
        ShardsDataModule(path=str(out))
    (out / META).write_text("{not json")
    with pytest.raises(ConfigError, match=r"holds broken shards \(Expecting property name"):
        ShardsDataModule(path=str(out))


def _flip_a_byte_of_the_last_training_chunk(out: Path) -> Path:
    """One flipped byte, the file's size and modification time kept: only its CRC-32 can tell."""
    chunk = sorted((out / "train").glob("chunk-*.bin"))[-1]
    before = chunk.stat()
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01
    chunk.write_bytes(bytes(data))
    os.utime(chunk, ns=(before.st_atime_ns, before.st_mtime_ns))
    return chunk


def test_a_chunk_whose_bytes_changed_is_refused_when_first_read(tmp_path: Path) -> None:
    """In process, no loader worker (the slow test below runs `make train` with one): the training loader
    stops at the changed chunk, naming it; the chunks that did not change stream as written."""
    from lightspeed.core.config import ConfigError

    out = write_shards(synthetic(400), tmp_path / "s", "16KB")
    whole = ShardsDataModule(path=str(out), batch_size=16)
    whole.setup("fit")
    assert sum(len(x) for x, _ in whole.val_dataloader()) == whole.samples["val"]
    chunk = _flip_a_byte_of_the_last_training_chunk(out)
    dm = ShardsDataModule(path=str(out), batch_size=16)
    dm.setup("fit")
    with pytest.raises(
        ConfigError, match=rf"^data.path={out}: train/{chunk.name} changed after `make shards`"
    ):
        for _ in dm.train_dataloader():
            pass
    assert sum(len(x) for x, _ in dm.val_dataloader()) == dm.samples["val"]


@pytest.mark.slow  # over 9 s on the 2-core CI machine: make test stays within 4 minutes
def test_a_chunk_whose_bytes_changed_on_disk_stops_the_run_in_one_line(tmp_path: Path) -> None:
    """One flipped byte in a training chunk, the file's size and time kept: the run that streams it (in a
    loader worker) ends with one line naming the chunk, where it trained on the changed bytes."""
    out = write_shards(synthetic(400), tmp_path / "s", "16KB")
    meta = json.loads((out / META).read_text())
    for split in ("train", "val", "test"):
        index = json.loads((out / split / "index.json").read_text())
        assert sorted(meta[CHECKSUMS][split]) == sorted(c["filename"] for c in index["chunks"])
    chunk = _flip_a_byte_of_the_last_training_chunk(out)
    run = [*RUN, f"data.path={out}", "data.num_workers=1", "model.net.hidden=[8]", "resume=never"]
    done = run_module("lightspeed.train", *run, f"paths.log_dir={tmp_path / 'logs'}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"error: data.path={out}: train/{chunk.name} changed after `make shards` wrote it (its CRC-32 is not "
        "the one in meta.json): write the shards again"
    ), done.stderr[-2000:]
