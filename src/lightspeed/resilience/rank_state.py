"""What differs between DDP ranks, as plain data for checkpoints: every random generator's state, from all
ranks (Lightning writes rank 0's checkpoint only). `weights_only=True` loads only tensors, numbers, strings
and containers, so numpy's and Python's states (tuples with arrays) become tensors and numbers."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


def capture() -> dict[str, Any]:
    """This process's RNG states: torch (CPU), the current CUDA device if in use, numpy, random."""
    _, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {
            "version": version,
            "state": torch.tensor(internal, dtype=torch.int64),
            "gauss": gauss_next,
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore(state: dict[str, Any]) -> None:
    """Set the generators `capture` read; CUDA's only where this process uses CUDA too."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"].tolist()), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda"])


def gather(mine: Any) -> list[Any]:
    """Every rank's `mine`, in rank order (a collective: call it on all ranks at once, as Lightning does
    when it builds a checkpoint); `[mine]` in a single process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [mine]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out
