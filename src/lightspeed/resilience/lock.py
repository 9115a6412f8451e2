"""One run folder, one writer: an OS lock (`flock`) on `<run dir>/.lock` for as long as a training run lives,
or two copies of one command (a double submit) would write the same checkpoints at once. The OS drops it
however its process ends (SIGKILL included), so a dead run's lock is free. The file says who holds it.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from lightning.fabric.utilities.rank_zero import rank_zero_only

from lightspeed.core.config import ConfigError
from lightspeed.core.files import not_own

try:
    import fcntl
except ImportError:  # Windows: no flock; runs are not locked there
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".lock"
#: What a run keeps in its folder ({name: whether a folder}): each checked before the run writes any of them.
OWN = {
    **dict.fromkeys(("summary.json", "run.json", "speed.json", "curves.json", "curves.png"), False),
    **dict.fromkeys(("config_tree.txt", "tracking.json", "search.json", "study.db", LOCK_FILE), False),
    **dict.fromkeys(("checkpoints", "trials", "csv", "tensorboard", "wandb", "mlruns"), True),
}
#: The run folders whose lock this process took (a refused start may then remove its lock file).
TAKEN: set[Path] = set()


@contextmanager
def held(run_dir: Path) -> Iterator[None]:
    """Hold the run folder's lock for the block, or raise ConfigError naming its holder. Only the first
    process of a run locks: under DDP, Lightning starts the other ranks into the same folder later, and
    they (and the other nodes' ranks) are the same run."""
    check_own(run_dir)
    if fcntl is None or not first_process():
        yield
        return
    handle = acquire(run_dir)
    TAKEN.add(run_dir.resolve())
    try:
        yield
    finally:
        handle.close()  # releases the lock


def first_process() -> bool:
    """Global rank 0: not a rank Lightning, torchrun or SLURM started beside it, nor another node's first."""
    node = os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or "0"
    return rank_zero_only.rank == 0 and node == "0"


def check_own(run_dir: Path) -> None:
    """A ConfigError where the run folder, or a file the run keeps in it (`OWN`), is a link to elsewhere (a
    run name linked to another run's folder: that run's files would be written over), a FIFO or a device,
    or not the kind the run writes: refused before the run writes anything of its own."""
    if run_dir.is_symlink():
        found = f"{run_dir} is a link (to {run_dir.resolve()})"
    else:
        found = next(
            (f"{run_dir / n} is {why}" for n, d in OWN.items() if (why := not_own(run_dir / n, run_dir, d))),
            "",
        )
    if found:
        raise ConfigError(
            f"{found}: a run writes only its own files, in its own folder; remove it (another run's files "
            "are kept where they are), or run_name=<new name>"
        )


def acquire(run_dir: Path) -> IO[str]:
    """The open lock file, locked; closing it (or the process ending) releases the lock."""
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = open(run_dir / LOCK_FILE, "a+")  # noqa: SIM115 (held open past this function on purpose)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        from lightspeed.resilience.incidents import not_locked

        not_locked(err, handle, run_dir)  # raises unless the file system cannot lock: then unlocked
        return handle
    handle.seek(0)
    handle.truncate()
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": started,
        "command": " ".join(sys.argv),
    }
    handle.write(json.dumps(holder))
    handle.flush()
    return handle
