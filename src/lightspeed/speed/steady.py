"""When a training run has warmed up: the rule that `make bench`'s rows (the speed report and the plain
PyTorch loop alike) use to leave compilation, cuDNN autotuning and worker start-up out of the timing."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

WINDOW = 5  # steps compared
TOLERANCE = 0.15  # relative difference of the two windows' medians that counts as settled
MAX_WARMUP = 300  # steps: a run that never settles is timed from here on anyway


def settled(step_seconds: Sequence[float]) -> bool:
    """True once the last `WINDOW` steps' median time is within `TOLERANCE` of the `WINDOW` before's
    (the first compile or autotuning step makes the earlier window far slower), or after `MAX_WARMUP`
    steps. Host times: on a GPU they follow the device once the launch queue is full."""
    if len(step_seconds) >= MAX_WARMUP:
        return True
    if len(step_seconds) < 2 * WINDOW:
        return False
    last = statistics.median(step_seconds[-WINDOW:])
    before = statistics.median(step_seconds[-2 * WINDOW : -WINDOW])
    return abs(last - before) <= TOLERANCE * max(last, before)
