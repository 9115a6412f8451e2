"""Fault injection: kill training at random moments, rerun the same command, compare with a run that
was never interrupted.

    python scripts/chaos.py [--trials 5] [--mode single|ddp_cpu|shards|all] [--seed 0] [-- extra overrides]

Modes: one process, two DDP ranks on the CPU (`ddp_cpu`), and one process streaming the same data from
LitData shards (`shards`, the data-larger-than-memory path, a loader worker reading them). For each
mode: one uninterrupted reference run, then `--trials` runs that are each SIGKILLed (the whole process
group: every rank, as a lost node or an OOM killer would) at a random moment during
training, and rerun with the same command until they finish (`resume=auto` continues from the newest
loadable checkpoint; a save cut short leaves only a `.tmp`). Checkpoints are written every 3 steps, so
kills land mid-epoch, at epoch ends and during saves (and a few in the final test). Each finished
trial's final weights (last.ckpt) and metrics (summary.json) are compared bit for bit with the
reference's. Prints, per mode,
"N/N resumed, weights identical to the uninterrupted run". Then two scenarios per mode: the same command
started twice at once (the run folder's lock lets one train and refuses the other in one line), and a
checkpoint of another run, further into training, dropped into the run's folder after a kill (resume
passes it over). Each must end with the run's own state identical to the reference. Exits 1 if any
trial or scenario differs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

#: Small, deterministic, and random where it matters: dropout and random crops/flips draw from the RNG.
DATA = ["data=synthetic", "data.num_samples=6000", "data.shape=[3,8,8]"]
RUN = [
    "data.batch_size=64",  # 4800 training samples: 75 steps an epoch
    "model=mlp",
    "model.net.dropout=0.3",
    "trainer.max_epochs=3",
    "trainer.deterministic=true",
    "trainer.log_every_n_steps=5",
    "trainer.num_sanity_val_steps=0",
    "+callbacks.model_checkpoint.every_n_train_steps=3",
    "callbacks.rich_progress_bar=null",
    "callbacks.speed_report.summary_depth=0",
    "trainer.enable_progress_bar=false",
]
#: The same data streamed from LitData shards (written once, by `python -m lightspeed.shards`, into SHARDS
#: under the chaos folder), read by a loader worker, with random flips.
STREAMED = ["data=shards", "data.path={shards}", "data.num_workers=1", "data.augment.flip=true"]
MODES = {"single": DATA, "ddp_cpu": ["trainer=ddp_cpu", *DATA], "shards": STREAMED}
SHARDS = "shards"


def command(mode: str, run_dir: Path, extra: list[str]) -> list[str]:
    shards = run_dir.parent.parent / SHARDS
    modal = [o.format(shards=shards) for o in MODES[mode]]
    return [sys.executable, "-m", "lightspeed.train", *modal, *RUN, *extra, f"hydra.run.dir={run_dir}"]


def write_shards(root: Path) -> None:
    """The chaos data set as LitData shards of 64 KB (the training split in ~60 chunks)."""
    out = root / SHARDS
    if not out.exists():
        cmd = [
            sys.executable,
            "-m",
            "lightspeed.shards",
            *DATA,
            f"shards.out={out}",
            "shards.chunk_bytes=64KB",
        ]
        subprocess.run([*cmd, f"hydra.run.dir={root / 'shards-log'}"], check=True, capture_output=True)


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with open(log, "a") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def finish(cmd: list[str], log: Path, attempts: int = 5) -> int:
    """Rerun `cmd` until it exits 0; the number of runs it took."""
    for attempt in range(1, attempts + 1):
        if start(cmd, log).wait(timeout=900) == 0:
            return attempt
    raise RuntimeError(f"{cmd} did not finish in {attempts} attempts: see {log}")


def final_state(run_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    weights = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    metrics = json.loads((run_dir / "summary.json").read_text())["metrics"]
    return weights, metrics


def identical(a: Path, b: Path) -> bool:
    (wa, ma), (wb, mb) = final_state(a), final_state(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa) and ma == mb


def started(proc: subprocess.Popen, run_dir: Path) -> float:
    """Wait until training has written its first checkpoint (step 3); the time it took."""
    began = time.monotonic()
    while proc.poll() is None and not (run_dir / "checkpoints").exists():
        time.sleep(0.02)
    return time.monotonic() - began


def trial(mode: str, run_dir: Path, extra: list[str], training: float, rng: random.Random) -> str:
    """Kill a run once at a random moment of its training (from its first checkpoint to the end of fit,
    as long as the reference's took, plus 20% that lands in testing), finish it, and say how it went."""
    cmd, log = command(mode, run_dir, extra), run_dir.with_suffix(".log")
    run_dir.mkdir(parents=True)
    proc = start(cmd, log)
    after = started(proc, run_dir)
    when = rng.uniform(0, 1.2 * training)
    try:
        proc.wait(timeout=when)
        killed = "finished before the kill"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        killed = f"SIGKILL {when:.2f}s into training ({after + when:.1f}s after start)"
    leftovers = (
        sorted(p.name for p in (run_dir / "checkpoints").glob("*"))
        if (run_dir / "checkpoints").exists()
        else []
    )
    runs = finish(cmd, log)
    resumed = re.findall(
        r"resume=auto: continuing from \S+/(\S+) \(epoch (\d+), step (\d+)\)", log.read_text()
    )
    source = f"resumed from {resumed[-1][0]} at step {resumed[-1][2]}" if resumed else "started over"
    return f"{killed}; files then: {', '.join(leftovers) or 'none'}; {source}; {runs} rerun(s)"


def twice_at_once(mode: str, run_dir: Path, extra: list[str]) -> tuple[bool, str]:
    """Two copies of one command started together: one trains, the other is refused (exit 2, one line
    naming the holder) or, if it came second, continues or finds nothing left to train."""
    cmd, log = command(mode, run_dir, extra), run_dir.with_suffix(".log")
    run_dir.mkdir(parents=True)
    procs = [start(cmd, run_dir.with_name(f"{run_dir.name}-{i}.log")) for i in (1, 2)]
    codes = sorted(p.wait(timeout=900) for p in procs)
    logs = "".join(run_dir.with_name(f"{run_dir.name}-{i}.log").read_text() for i in (1, 2))
    refused = "is in use by another run" in logs
    finish(cmd, log)  # the run completes whatever happened, as a person would rerun it
    files = sorted(p.name for p in (run_dir / "checkpoints").glob("*"))
    ok = codes in ([0, 0], [0, 2]) and not [
        f for f in files if re.search(r"-v\d+\.ckpt$", f) or f.endswith(".tmp")
    ]
    lock = "one refused by the lock" if refused else "none refused"
    return ok, f"exit codes {codes}, {lock}; files: {', '.join(files)}"


def foreign_checkpoint(mode: str, run_dir: Path, extra: list[str], training: float) -> tuple[bool, str]:
    """Kill a run halfway, drop another run's checkpoint (its identity differs, its step is far ahead)
    beside the run's own, rerun: resume must pass it over and last.ckpt must stay the run's."""
    cmd, log = command(mode, run_dir, extra), run_dir.with_suffix(".log")
    run_dir.mkdir(parents=True)
    proc = start(cmd, log)
    started(proc, run_dir)
    try:
        proc.wait(timeout=training / 2)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    own = sorted((run_dir / "checkpoints").glob("*.ckpt"))
    foreign = torch.load(own[-1], weights_only=True)
    foreign["global_step"] = 10**6
    foreign["identity"]["config"]["seed"] = -1  # another run's settings
    torch.save(foreign, run_dir / "checkpoints" / "zz-foreign.ckpt")
    finish(cmd, log)
    passed_over = "zz-foreign.ckpt: written by another run" in log.read_text()
    return passed_over, f"foreign checkpoint {'passed over' if passed_over else 'NOT passed over'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--mode", choices=[*MODES, "all"], default="all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="keep the runs in this folder (default: a temporary one)")
    parser.add_argument("extra", nargs="*", help="more overrides for every run")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    root = args.keep or Path(tempfile.mkdtemp(prefix="chaos-"))
    failed = False
    for mode in MODES if args.mode == "all" else [args.mode]:
        if mode == "shards" and importlib.util.find_spec("litdata") is None:
            if args.mode == "shards":  # asked for by name: it cannot run here
                raise SystemExit("chaos: --mode shards needs LitData: make install EXTRAS=dev,streaming")
            print("shards: skipped (LitData is not installed: make install EXTRAS=dev,streaming)", flush=True)
            continue
        if mode == "shards":
            write_shards(root)
        reference = root / mode / "reference"
        reference.mkdir(parents=True)
        proc = start(command(mode, reference, args.extra), reference.with_suffix(".log"))
        setup = started(proc, reference)
        began = time.monotonic()
        while proc.poll() is None and not (reference / "speed.json").exists():  # written as fit ends
            time.sleep(0.02)
        training = time.monotonic() - began
        if proc.wait(timeout=900) != 0:
            raise RuntimeError(f"the reference run failed: see {reference.with_suffix('.log')}")
        print(
            f"{mode}: reference run: {setup:.1f}s to its first checkpoint, then {training:.1f}s of training"
        )
        same = 0
        for i in range(1, args.trials + 1):
            run_dir = root / mode / f"trial-{i}"
            story = trial(mode, run_dir, args.extra, training, rng)
            ok = identical(reference, run_dir)
            same += ok
            print(f"{mode}: trial {i}: {story}: {'identical' if ok else 'DIFFERENT'}", flush=True)
        verdict = "weights identical to the uninterrupted run" if same == args.trials else "NOT all identical"
        print(f"{mode}: {same}/{args.trials} resumed, {verdict}")
        failed |= same != args.trials
        scenarios = {
            "the same command twice at once": lambda d, m=mode: twice_at_once(m, d, args.extra),
            "another run's checkpoint dropped in": lambda d, m=mode, s=training: foreign_checkpoint(
                m, d, args.extra, s
            ),
        }
        for name, scenario in scenarios.items():
            run_dir = root / mode / name.replace(" ", "-").replace("'", "")
            ok, story = scenario(run_dir)
            ok = ok and identical(reference, run_dir)
            print(f"{mode}: {name}: {story}: {'identical' if ok else 'DIFFERENT'}", flush=True)
            failed |= not ok
    print(f"runs and logs: {root}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
