"""Per-rank state in checkpoints: Lightning writes rank 0's checkpoint, so what differs between ranks
(random states, metric accumulators) is gathered from every rank first."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


def gather(mine: Any) -> list[Any]:
    """Every rank's `mine`, in rank order (a collective: call it on all ranks at once, as Lightning does
    when it builds a checkpoint); `[mine]` in a single process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [mine]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out
