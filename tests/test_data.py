"""DataModules: reproducible disjoint splits, train-only statistics, loader settings that take effect."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lightspeed.core.config import ConfigError
from lightspeed.data import DigitsDataModule, SyntheticDataModule
from lightspeed.data.device_loader import EpochOrder


def test_digits_splits_are_disjoint_complete_and_reproducible() -> None:
    a, b = DigitsDataModule(split_seed=3), DigitsDataModule(split_seed=3)
    a.setup(), b.setup()
    sizes = {k: len(v) for k, v in a.splits.items()}
    assert sizes == {"train": 1258, "val": 180, "test": 359}
    for name in ("train", "val", "test"):
        assert torch.equal(a.splits[name].tensors[0], b.splits[name].tensors[0])
    rows = torch.cat([a.splits[k].tensors[0].flatten(1) for k in ("train", "val", "test")])
    assert rows.shape == (1797, 64)
    other = DigitsDataModule(split_seed=4)
    other.setup()
    assert not torch.equal(other.splits["test"].tensors[1], a.splits["test"].tensors[1])


def test_digits_are_standardised_with_train_statistics_only() -> None:
    dm = DigitsDataModule()
    dm.setup()
    x = dm.splits["train"].tensors[0]
    assert x.shape[1:] == (1, 8, 8) and x.dtype == torch.float32
    assert abs(x.mean().item()) < 1e-4 and abs(x.std().item() - 1) < 1e-3
    assert abs(dm.splits["test"].tensors[0].mean().item()) > 1e-4  # not re-standardised on its own
    assert set(dm.splits["train"].tensors[1].unique().tolist()) == set(range(10))


def test_synthetic_data_has_the_configured_shape_and_is_learnable() -> None:
    dm = SyntheticDataModule(num_samples=200, shape=[3, 16, 16], num_classes=4, batch_size=32)
    dm.setup()
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (32, 3, 16, 16) and dm.input_shape == (3, 16, 16) and int(y.max()) < 4
    # class prototypes make a nearest-class-mean classifier far better than chance
    tx, ty = dm.splits["train"].tensors
    means = torch.stack([tx[ty == c].mean(0) for c in range(4)])
    vx, vy = dm.splits["val"].tensors
    pred = torch.cdist(vx.flatten(1), means.flatten(1)).argmin(1)
    assert (pred == vy).float().mean() > 0.9


def test_a_split_that_would_be_empty_is_a_config_error() -> None:
    dm = SyntheticDataModule(num_samples=10, val_fraction=0.01, test_fraction=0.01)
    with pytest.raises(ConfigError, match="empty split"):
        dm.setup()


class OfficialSplit(SyntheticDataModule):
    """A data set with its own test split (as MNIST's), through the named-splits form of load_arrays."""

    def __init__(self, given: tuple[str, ...] = ("train", "test"), **kwargs) -> None:
        super().__init__(num_samples=300, shape=[1, 4], num_classes=3, **kwargs)
        self.given = given

    def load_arrays(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        x, y = super().load_arrays()
        parts = {"train": (x[:200], y[:200]), "val": (x[200:250], y[200:250]), "test": (x[250:], y[250:])}
        return {name: parts[name] for name in self.given}


def test_named_splits_are_kept_and_a_missing_one_is_drawn_from_train() -> None:
    dm = OfficialSplit(val_fraction=0.1, test_fraction=0.5, normalize=False)
    dm.setup()
    raw_x, _ = SyntheticDataModule.load_arrays(dm)
    assert torch.equal(dm.splits["test"].tensors[0], raw_x[250:])  # as given, in its order
    assert {k: len(v) for k, v in dm.splits.items()} == {
        "train": 180,
        "val": 20,
        "test": 50,
    }  # val: 10% of 200
    seen = torch.cat([dm.splits[k].tensors[0] for k in ("train", "val")])
    assert sorted(map(tuple, seen.tolist())) == sorted(map(tuple, raw_x[:200].tolist()))
    every = OfficialSplit(given=("train", "val", "test"))
    every.setup()
    assert {k: len(v) for k, v in every.splits.items()} == {"train": 200, "val": 50, "test": 50}
    # standardised with the train split's statistics, the given test split included
    train_x = every.splits["train"].tensors[0]
    assert abs(train_x.mean().item()) < 1e-5 and abs(every.splits["test"].tensors[0].mean().item()) > 1e-3


def test_bad_split_names_and_empty_drawn_splits_say_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"returned splits \['test', 'valid'\]: name them train, val, test"):
        _named({"valid": 1, "test": 1})
    with pytest.raises(ConfigError, match=r"data.val_fraction=0.001 leave an empty split of 200 samples"):
        OfficialSplit(val_fraction=0.001).setup()


def _named(splits: dict) -> None:
    dm = OfficialSplit()
    dm.load_arrays = lambda: splits
    dm.setup()


def test_sample_ids_name_raw_inputs_whatever_the_normalisation() -> None:
    a, b = DigitsDataModule(normalize=True), DigitsDataModule(normalize=False, split_seed=5)
    a.setup(), b.setup()
    assert len(set(a.sample_ids["train"].tolist())) > 1250  # 1258 images, a few exact duplicates
    every_a = torch.cat(list(a.sample_ids.values()))
    every_b = torch.cat(list(b.sample_ids.values()))
    assert sorted(every_a.tolist()) == sorted(every_b.tolist())  # the same images, however split
    overlap = torch.isin(b.sample_ids["test"], a.sample_ids["train"]).float().mean()
    assert 0.5 < overlap < 0.9  # another split seed: most of its test set was a's training data


def test_loader_settings_reach_the_dataloader() -> None:
    dm = DigitsDataModule(batch_size=32, num_workers=2, pin_memory=True, persistent_workers=True)
    dm.setup()
    loader = dm.train_dataloader()
    assert (loader.batch_size, loader.num_workers, loader.pin_memory, loader.persistent_workers) == (
        32,
        2,
        True,
        True,
    )
    # shuffled by an order that is a function of (seed, epoch) and can resume mid-epoch
    assert isinstance(loader.sampler, EpochOrder) and loader.sampler.shuffle
    assert sorted(loader.sampler) == list(range(len(dm.splits["train"])))
    assert isinstance(dm.val_dataloader().sampler, torch.utils.data.SequentialSampler)


def test_ddp_evaluation_sees_each_sample_exactly_once() -> None:
    seen = []
    for rank in (0, 1):
        dm = DigitsDataModule(num_workers=0)
        dm.setup()
        dm.trainer = SimpleNamespace(
            strategy=SimpleNamespace(root_device=torch.device("cpu")),
            num_devices=2,
            world_size=2,
            global_rank=rank,
        )
        seen.append(list(iter(dm.test_dataloader().sampler)))
    assert sorted(seen[0] + seen[1]) == list(range(359))  # 359 is odd: no padding repeats


@pytest.mark.parametrize("on_device", [True, False], ids=["device loader", "DataLoader"])
def test_training_batches_are_all_full_and_evaluation_sees_every_sample(on_device: bool) -> None:
    dm = DigitsDataModule(batch_size=64, num_workers=0, on_device=on_device)  # 1258 = 19 x 64 + 42
    dm.setup()
    train = [len(y) for _, y in dm.train_dataloader()]
    assert train == [64] * 19 and len(dm.train_dataloader()) == 19
    assert sum(len(y) for _, y in dm.val_dataloader()) == 180  # 64 + 64 + 52
    kept = DigitsDataModule(batch_size=64, num_workers=0, on_device=on_device, drop_last=False)
    kept.setup()
    assert [len(y) for _, y in kept.train_dataloader()][-1] == 42


def test_a_batch_larger_than_the_training_split_is_a_config_error() -> None:
    dm = DigitsDataModule(batch_size=1259)
    with pytest.raises(ConfigError, match=r"^data.batch_size=1259 is larger than the 1258 training samples"):
        dm.setup("fit")
    DigitsDataModule(batch_size=1259, drop_last=False).setup("fit")  # a single partial batch: allowed
    DigitsDataModule(batch_size=1259).setup("test")  # evaluation drops nothing


def _on_cuda(dm: DigitsDataModule, monkeypatch, free_gib: float) -> None:
    """What the DataModule reads of a CUDA device: the strategy's device and its free memory."""
    dm.trainer = SimpleNamespace(
        strategy=SimpleNamespace(root_device=torch.device("cuda", 0)),
        num_devices=1,
        world_size=1,
        global_rank=0,
    )
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free_gib * 2**30), 80 * 2**30))


def test_on_device_auto_keeps_data_that_fits_on_the_gpu_and_says_so(monkeypatch, caplog) -> None:
    import logging

    for free_gib, expected in ((1.0, True), (0.0005, False)):  # digits: ~0.46 MiB of tensors
        dm = DigitsDataModule(on_device="auto")
        dm.setup()
        _on_cuda(dm, monkeypatch, free_gib)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert dm.uses_device_loader() is expected
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data.on_device=auto")]
        assert len(lines) == 1
        assert ("batches are sliced on the device" in lines[0]) is expected
        assert ("using a DataLoader" in lines[0]) is not expected
    dm = DigitsDataModule(on_device=True)
    dm.setup()
    _on_cuda(dm, monkeypatch, 0.0005)
    with pytest.raises(ConfigError, match=r"set data\.on_device=auto or false"):
        dm.uses_device_loader()


def test_on_a_gpu_the_default_preset_keeps_data_on_the_device_although_auto_picks_workers(
    train_cfg, monkeypatch, caplog
) -> None:
    """The H200 (2026-12-04): num_workers=auto became 8 before the DataModule decided `on_device=auto`, which
    took the 8 for workers asked for by number and fed the data through a DataLoader. Workers asked for by
    number still mean a DataLoader."""
    import logging

    from hydra.utils import instantiate

    from lightspeed.speed import accel

    monkeypatch.setattr(accel, "cpu_count", lambda: 16)
    for overrides, on_device in (([], True), (["data.num_workers=2"], False)):
        cfg = train_cfg("trainer=gpu", *overrides)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            accel.resolve(cfg)
            dm = instantiate(cfg.data)
            dm.setup()
            _on_cuda(dm, monkeypatch, free_gib=1.0)
            assert dm.uses_device_loader() is on_device, overrides
        assert dm.num_workers == (8 if not overrides else 2)  # the DataLoader's, where one is used
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data.on_device=auto")]
        said = "batches are sliced on the device" if on_device else "data.num_workers=2 asks for a DataLoader"
        assert len(lines) == 1 and said in lines[0], lines


def test_default_preset_serves_in_memory_data_from_memory_and_off_uses_a_dataloader(train_cfg) -> None:
    from conftest import TINY
    from lightspeed.train import train

    fit = [*TINY, "trainer.max_epochs=1", "test_after_fit=false", "++trainer.enable_checkpointing=false"]
    assert type(train(train_cfg(*fit)).trainer.train_dataloader).__name__ == "DeviceLoader"
    off = train(train_cfg(*fit, "accel=off")).trainer.train_dataloader
    assert type(off).__name__ == "ResumableDataLoader"
    workers = train(train_cfg(*fit, "data.num_workers=1")).trainer.train_dataloader  # asked for by name
    assert type(workers).__name__ == "ResumableDataLoader" and workers.num_workers == 1


def test_overfit_batches_with_a_large_batch_is_not_refused() -> None:
    """overfit_batches trains on unshuffled batches, where nothing is dropped."""
    dm = DigitsDataModule(batch_size=1259)
    dm.trainer = SimpleNamespace(
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
        num_devices=1,
        world_size=1,
        global_rank=0,
        overfit_batches=1,
    )
    dm.setup("fit")
    assert [len(y) for _, y in dm.train_dataloader()] == [1258]


def test_augment_without_crop_padding_only_mirrors() -> None:
    """A DataModule built in code may say crop_padding=None: the batch is mirrored (or not), never cropped."""
    from lightspeed.data.augment import augment

    x = torch.arange(2 * 4 * 4, dtype=torch.float32).view(2, 1, 4, 4)
    out = augment(x, None, True)  # type: ignore[arg-type]
    assert all(torch.equal(o, i) or torch.equal(o, i.flip(-1)) for o, i in zip(out, x, strict=True))
