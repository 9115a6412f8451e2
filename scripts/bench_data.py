"""Where the batches come from, measured: loaders over in-memory tensors, then the three data paths.

    python scripts/bench_data.py [--device cpu|cuda] [--repeats 5] [--seconds 1.0]
                                 [--images 4096] [--image-size 32] [--workers 0,2]

First table: iterates batches only (no model) and reports samples/s, median over repeats, for: torch's
DataLoader (num_workers=0, per-sample indexing + default collate), Lightspeed's DeviceLoader, and a bare
`x[perm[i:i+b]]` gather loop (the floor any loader can reach). On a GPU, the DataLoader's batches are
copied to the device (pinned, non_blocking) as in training.

Second table: the same folder of JPEG and PNG images (made here) served by each data path as training
sees it (the DataModule's training loader, the copy to the device, uint8 scaled there), samples/s over
whole epochs, median over repeats: in memory (`data=image_folder data.cache=true`: decoded once, then
sliced from memory or the device), from the files (`data=image_folder`: decoded every epoch by the
loader's workers), and streamed (`data=shards`: LitData chunks read by the workers). With what each path
pays once (decoding into the cache, writing the shards).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

from lightspeed.data import ArrayDataModule, DigitsDataModule, SyntheticDataModule
from lightspeed.data.device_loader import DeviceLoader, EpochOrder
from lightspeed.data.image_folder import ImageFolderDataModule
from lightspeed.data.shards import ShardsDataModule, write_shards

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


def make_images(root: Path, n: int, size: int) -> Path:
    """`n` colour images in 10 class folders, half JPEG and half PNG, at 1.5x `size` (decoding resizes)."""
    rng = np.random.default_rng(0)
    side = size * 3 // 2
    for i in range(n):
        folder = root / f"class{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.{'jpg' if i % 2 else 'png'}")
    return root


def epoch_rate(dm: ArrayDataModule, device: torch.device, repeats: int) -> float:
    """Samples/s of whole training epochs as the training loop sees them (median over `repeats`, after
    one epoch that starts the workers)."""
    loader = dm.train_dataloader()
    rates = []
    new_epoch = getattr(getattr(loader, "sampler", None), "set_epoch", None)  # as Lightning calls it
    for i in range(repeats + 1):
        if new_epoch is not None:
            new_epoch(i)
        done, start = 0, time.perf_counter()
        for batch in loader:
            x, _ = dm.on_after_batch_transfer(dm.transfer_batch_to_device(batch, device, 0), 0)
            done += len(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:  # the first epoch starts the workers
            rates.append(done / (time.perf_counter() - start))
    return statistics.median(rates)


def data_paths(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """One row per data path and worker count, on the same images."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        root = make_images(Path(tmp) / "images", args.images, args.image_size)
        loader = {
            "batch_size": BATCH,
            "pin_memory": device.type == "cuda",
            "non_blocking": device.type == "cuda",
        }
        folder = {
            "root": str(root),
            "image_size": args.image_size,
            "data_dir": tmp,
            "val_fraction": 0.05,
            "test_fraction": 0.05,
            **loader,
        }

        def timed(make: Callable[[], ArrayDataModule]) -> tuple[ArrayDataModule, float]:
            start = time.perf_counter()
            dm = make()
            dm.prepare_data()
            dm.setup("fit")
            return dm, time.perf_counter() - start

        cached, once = timed(lambda: ImageFolderDataModule(cache=True, on_device="auto", **folder))
        rows.append(
            {
                "path": "in memory (data.cache=true)",
                "workers": 0,
                "once": once,
                "rate": epoch_rate(cached, device, args.repeats),
            }
        )
        streaming = importlib.util.find_spec("litdata") is not None  # the streaming extra
        if streaming:
            start = time.perf_counter()
            shards = write_shards(
                ImageFolderDataModule(**folder, num_workers=max(args.workers)), Path(tmp) / "shards"
            )
            written = time.perf_counter() - start
        else:
            print("streamed (data=shards): not measured, LitData is not installed (the streaming extra)")
        for workers in args.workers:
            files, once = timed(lambda w=workers: ImageFolderDataModule(num_workers=w, **folder))
            rows.append(
                {
                    "path": "files (data=image_folder)",
                    "workers": workers,
                    "once": 0.0,
                    "rate": epoch_rate(files, device, args.repeats),
                }
            )
            if not streaming:
                continue
            streamed, _ = timed(lambda w=workers: ShardsDataModule(path=str(shards), num_workers=w, **loader))
            rows.append(
                {
                    "path": "streamed (data=shards)",
                    "workers": workers,
                    "once": written,
                    "rate": epoch_rate(streamed, device, args.repeats),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    parser.add_argument("--images", type=int, default=4096, help="images in the folder the data paths read")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--workers", type=lambda s: [int(w) for w in s.split(",")], default=[0, 2])
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
    rows = data_paths(args, device)
    print(
        f"\n{args.images} images ({args.image_size}x{args.image_size} after decoding, half JPEG, half PNG), "
        f"batch {BATCH}, {args.device}, median of {args.repeats} epochs\n"
    )
    print("| data path | loader workers | samples/s | paid once (s) |")
    print("|---|---:|---:|---:|")
    for r in rows:
        once = f"{r['once']:.1f}" if r["once"] else "-"
        print(f"| {r['path']} | {r['workers']} | {r['rate']:,.0f} | {once} |")


if __name__ == "__main__":
    main()
