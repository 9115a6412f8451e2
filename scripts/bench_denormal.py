"""Step time over a long CPU run, with denormals computed exactly and flushed to zero.

    python scripts/bench_denormal.py [--steps 1600] [--window 200] [--hidden 1024]

Momentum of a weight whose gradient stays zero (a dead ReLU unit) decays by AdamW's beta1 = 0.9 each
step and falls below float32's normal range (1.2e-38) after ~750 steps; x86 CPUs compute with such
denormal numbers many times slower. Each mode trains the MLP 64-h-h-10 (batch 64, fused AdamW, random
class data) in a fresh process, because the mode belongs to each CPU thread and torch's threads copy
it when they start: `accel.flush_denormal` sets it before any torch work, and so does this script.
Prints the median step time of each window of steps, and how many of the momentum values are
denormal at the end.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def train(flush: bool, steps: int, window: int, hidden: int) -> None:
    import torch
    import torch.nn.functional as F

    torch.set_flush_denormal(flush)  # before any torch work: every CPU thread gets it
    from lightspeed.device import count_denormals  # torch only: starts fast

    torch.manual_seed(0)
    n = 64 * 600
    x_all, y_all = torch.randn(n, 64), torch.randint(0, 10, (n,))
    net = torch.nn.Sequential(
        torch.nn.Linear(64, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, fused=True)
    times: list[float] = []
    for step in range(1, steps + 1):
        start = time.perf_counter()
        idx = torch.randint(0, n, (64,))
        loss = F.cross_entropy(net(x_all.index_select(0, idx)), y_all.index_select(0, idx))
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
        if step % window == 0:
            print(f"{step}\t{statistics.median(times[-window:]) * 1e3:.2f}", flush=True)
    momenta = [opt.state[p]["exp_avg"] for p in net.parameters()]
    denormal = sum(count_denormals(m) for m in momenta)  # from the bits: `m != 0` flushes too
    print(f"denormal\t{denormal}\t{sum(m.numel() for m in momenta)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--window", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--mode", choices=("exact", "flush"), help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args()
    if args.mode:
        train(args.mode == "flush", args.steps, args.window, args.hidden)
        return
    results: dict[str, list[str]] = {}
    for mode in ("exact", "flush"):
        proc = subprocess.run(
            [sys.executable, __file__, "--mode", mode, *sys.argv[1:]],
            capture_output=True,
            text=True,
            check=True,
        )
        results[mode] = proc.stdout.splitlines()
    print(f"MLP 64-{args.hidden}-{args.hidden}-10, batch 64, fused AdamW; median ms/step per window\n")
    print("| steps up to | denormals computed exactly | flushed to zero |")
    print("|---:|---:|---:|")
    for exact, flush in zip(results["exact"][:-1], results["flush"][:-1], strict=True):
        step, a = exact.split("\t")
        print(f"| {step} | {a} | {flush.split(chr(9))[1]} |")
    for mode, lines in results.items():
        _, denormal, total = lines[-1].split("\t")
        print(f"\n{mode}: {int(denormal):,} of {int(total):,} momentum values denormal at the end", end="")
    print()


if __name__ == "__main__":
    main()
