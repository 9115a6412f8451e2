"""The device-resident loader: full coverage each epoch, determinism, disjoint DDP shards, resume."""

from __future__ import annotations

import pytest
import torch

from lightspeed.data.augment import random_crop, random_flip
from lightspeed.data.device_loader import DeviceLoader, EpochOrder


def loader(
    n: int, seed: int = 0, rank: int = 0, world: int = 1, shuffle: bool = True, bs: int = 8
) -> DeviceLoader:
    x = torch.arange(n, dtype=torch.float32).view(n, 1)
    return DeviceLoader(x, torch.arange(n), bs, EpochOrder(n, shuffle, seed, rank, world))


def epoch_labels(dl: DeviceLoader, epoch: int) -> list[int]:
    dl.sampler.set_epoch(epoch)
    return [i for _, y in dl for i in y.tolist()]


@pytest.mark.parametrize("n", [64, 67])
def test_each_epoch_covers_every_sample_once(n: int) -> None:
    dl = loader(n)
    for epoch in range(3):
        assert sorted(epoch_labels(dl, epoch)) == list(range(n))
    assert len(dl) == -(-n // 8)


def test_order_is_fixed_by_seed_and_epoch_and_changes_between_epochs() -> None:
    """A fresh loader for every epoch read: a loader that served an epoch serves nothing more of it (its
    position says so), and comparing with that empty epoch would prove nothing."""

    def order(seed: int, epoch: int) -> list[int]:
        labels = epoch_labels(loader(100, seed=seed), epoch)
        assert sorted(labels) == list(range(100))  # a whole epoch, each sample once
        return labels

    assert order(1, 0) == order(1, 0) != order(2, 0)  # the seed decides it
    assert order(1, 0) != order(1, 1) != order(1, 2)  # ... and the epoch
    assert order(1, 5) == order(1, 5)
    one = loader(100, seed=1)  # one loader, epoch after epoch, as training reads it
    assert [epoch_labels(one, e) for e in range(3)] == [order(1, e) for e in range(3)]


def test_ranks_get_disjoint_equal_shards_and_a_new_deal_each_epoch() -> None:
    n, world = 101, 2
    for epoch in range(2):
        shards = [epoch_labels(loader(n, seed=3, rank=r, world=world), epoch) for r in range(world)]
        assert len(shards[0]) == len(shards[1]) == n // world  # equal step counts: DDP needs them
        assert not set(shards[0]) & set(shards[1])
    evals = [epoch_labels(loader(n, rank=r, world=world, shuffle=False), 0) for r in range(world)]
    assert sorted(evals[0] + evals[1]) == list(range(n))  # evaluation: every sample exactly once


def test_resumes_mid_epoch_in_the_same_order() -> None:
    full = epoch_labels(loader(50, seed=7), 2)
    first = loader(50, seed=7)
    first.sampler.set_epoch(2)
    it = iter(first)
    seen = [i for _ in range(3) for i in next(it)[1].tolist()]
    state = first.state_dict()
    assert state == {"epoch": 2, "batches_served": 3}
    second = loader(50, seed=7)
    second.load_state_dict(state)
    second.sampler.set_epoch(2)  # Lightning sets the epoch again when it resumes
    rest = [i for _, y in second for i in y.tolist()]
    assert seen + rest == full
    assert sorted(epoch_labels(second, 3)) == list(range(50))  # the next epoch starts from its beginning


def test_augmentations_keep_shape_and_content() -> None:
    x = torch.arange(2 * 3 * 6 * 6, dtype=torch.float32).view(2, 3, 6, 6)
    torch.manual_seed(0)
    cropped = random_crop(x, 2)
    assert cropped.shape == x.shape
    assert not torch.equal(cropped, x)  # shifted
    torch.manual_seed(0)
    assert torch.equal(random_crop(x, 2), cropped)  # reproducible from the seed
    flipped = random_flip(x.repeat(20, 1, 1, 1))
    mirrored = [torch.equal(f, x[i % 2].flip(-1)) for i, f in enumerate(flipped)]
    same = [torch.equal(f, x[i % 2]) for i, f in enumerate(flipped)]
    assert all(m or s for m, s in zip(mirrored, same, strict=True)) and 5 < sum(mirrored) < 35


# Training resumed mid-epoch on device-resident data: tests/test_resume.py (bit-identical weights). Two DDP
# ranks' device-resident shards: tests/test_cli.py::test_ddp_cpu_trains_two_ranks_into_one_run_dir.


@pytest.mark.parametrize("workers", [0, 2])
def test_whole_batches_equal_the_per_sample_batches(workers: int) -> None:
    """One indexing operation a batch gives the very batches torch's per-sample fetch and collate give."""
    from torch.utils.data import DataLoader, TensorDataset

    from lightspeed.data.host_loader import ResumableDataLoader, WholeBatches, whole_batch

    gen = torch.Generator().manual_seed(0)
    split = TensorDataset(torch.randn(67, 3, 4, 4, generator=gen), torch.randint(0, 10, (67,), generator=gen))
    order = EpochOrder(67, True, seed=5)
    order.set_epoch(3)
    per_sample = list(DataLoader(split, batch_size=8, sampler=order))
    whole = list(
        ResumableDataLoader(
            WholeBatches(split), batch_size=8, sampler=order, collate_fn=whole_batch, num_workers=workers
        )
    )
    assert len(whole) == len(per_sample) == 9
    for (x, y), (x2, y2) in zip(per_sample, whole, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)
