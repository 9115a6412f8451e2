"""Device-resident (in-memory) loader vs DataLoader(TensorDataset) with default collate.

    python scripts/bench_data.py [--device cpu|cuda] [--repeats 5] [--seconds 1.0]

Iterates batches only (no model) and reports samples/s, median over repeats, for: torch's DataLoader
(num_workers=0, per-sample indexing + default collate), Lightspeed's DeviceLoader, and a bare
`x[perm[i:i+b]]` gather loop (the floor any loader can reach). On a GPU, the DataLoader's batches are
copied to the device (pinned, non_blocking) as in training.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterable

import torch
from torch.utils.data import DataLoader, TensorDataset

from lightspeed.data import DigitsDataModule, SyntheticDataModule
from lightspeed.data.device_loader import DeviceLoader, EpochOrder

BATCH = 64


def samples_per_second(epoch: Callable[[], Iterable], n: int, device: torch.device, seconds: float) -> float:
    """Whole epochs until `seconds` have passed; samples/s over them."""
    done, start = 0, time.perf_counter()
    while True:
        for x, _ in epoch():
            if x.device != device:
                x = x.to(device, non_blocking=True)
        done += n
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if (elapsed := time.perf_counter() - start) >= seconds:
            return done / elapsed


def bare_gather(x: torch.Tensor, y: torch.Tensor) -> Callable[[], Iterable]:
    def epoch() -> Iterable:
        perm = torch.randperm(len(x), device=x.device)
        for i in range(0, len(x), BATCH):
            idx = perm[i : i + BATCH]
            yield x[idx], y[idx]

    return epoch


def bench(
    name: str, x: torch.Tensor, y: torch.Tensor, device: torch.device, repeats: int, seconds: float
) -> dict:
    n = len(x)
    pinned = device.type == "cuda"
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True, pin_memory=pinned)
    xd, yd = x.to(device), y.to(device)
    order = EpochOrder(n, shuffle=True, seed=0)
    resident = DeviceLoader(xd, yd, BATCH, order)

    def resident_epoch() -> Iterable:
        order.set_epoch(order.epoch + 1)
        return resident

    contenders = {
        "DataLoader": lambda: loader,
        "DeviceLoader": resident_epoch,
        "bare gather": bare_gather(xd, yd),
    }
    rates: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(repeats):  # interleaved, so that drifts in machine load hit every contender alike
        for key, epoch in contenders.items():
            rates[key].append(samples_per_second(epoch, n, device, seconds))
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {"data": name, "shape": tuple(x.shape[1:]), "samples": n, **med}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    rows = []
    for name, dm in (("digits", DigitsDataModule()), ("synthetic", SyntheticDataModule(num_samples=8192))):
        x, y = dm.load_arrays()
        rows.append(bench(name, x, y, device, args.repeats, args.seconds))
    print(f"batch {BATCH}, {args.device}, torch {torch.__version__}, median of {args.repeats}\n")
    print(
        "| data | sample shape | DataLoader (samples/s) | DeviceLoader (samples/s) | bare gather (samples/s) "
        "| DeviceLoader / DataLoader | DeviceLoader / bare gather |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['data']} | {'x'.join(map(str, r['shape']))} | {r['DataLoader']:,.0f} "
            f"| {r['DeviceLoader']:,.0f} | {r['bare gather']:,.0f} "
            f"| {r['DeviceLoader'] / r['DataLoader']:.1f}x | {r['DeviceLoader'] / r['bare gather']:.2f} |"
        )


if __name__ == "__main__":
    main()
