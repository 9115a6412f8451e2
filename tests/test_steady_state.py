"""What decides speed on a GPU, checked on a CPU: no host-device sync in a training step that does not
log, no torch.compile recompile once training runs, and every training batch of one shape."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY
from lightspeed.train import train
from probes import CompileProbe, SyncCounter

QUIET = [
    "test_after_fit=false",
    "callbacks.speed_report.summary_depth=0",
]
# The logger writes every 10 steps; the non-finite guard reads its kept losses at the same cadence, and
# the speed report synchronises once, when its warm-up ends: all on the same steps. The progress bar
# stays on, redrawn at every step (its redraws are part of what is counted).
CADENCE = [
    "trainer.log_every_n_steps=10",
    "callbacks.nonfinite.check_every_n_steps=10",
    "callbacks.speed_report.warmup_steps=9",
    "callbacks.rich_progress_bar.refresh_rate=100000",
]
# A compiled run: the eager backend is dynamo's tracing and guards without inductor's code generation
# (minutes on 2 CPU cores); recompiles and host reads are decided by dynamo and the Python around it.
EAGER = ["accel.compile_backend=eager"]


def unexpected_syncs(train_cfg, *overrides: str) -> tuple[dict[int, list[str]], SyncCounter]:
    counter = SyncCounter()
    train(train_cfg("trainer.max_epochs=2", *CADENCE, *QUIET, *overrides), [counter])
    allowed = counter.logging_batches | counter.epoch_edges
    return {b: ev for b, ev in counter.events.items() if b not in allowed}, counter


@pytest.mark.parametrize("preset", [["accel=default"], ["accel=max", *EAGER]], ids=["default", "max"])
def test_no_host_sync_in_a_step_that_does_not_log(train_cfg, preset: list[str]) -> None:
    unexpected, counter = unexpected_syncs(train_cfg, *preset)
    clean = counter.batches - len(counter.logging_batches | counter.epoch_edges)
    assert clean >= 25, "too few steps outside the allowance for the test to mean anything"
    assert unexpected == {}, f"host-device syncs outside logging steps and epoch edges: {unexpected}"
    # the allowance is used: the logger and the bar read their values on logging steps
    assert any(b in counter.logging_batches for b in counter.events)


def test_the_sync_count_catches_a_loss_item_in_the_step(train_cfg) -> None:
    unexpected, counter = unexpected_syncs(train_cfg, "model._target_=probes.ReadsLoss")
    assert len(unexpected) == counter.batches - len(counter.logging_batches | counter.epoch_edges)
    assert all(any(e.startswith("item at probes.py") for e in ev) for ev in unexpected.values())


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    """dynamo remembers, per function and process-wide, the shapes it has seen (an earlier test's other
    batch size makes it compile the next run's forward with a dynamic batch dimension)."""
    torch._dynamo.reset()


def _compiles(train_cfg, *overrides: str) -> CompileProbe:
    probe = CompileProbe()
    # digits: 1258 training samples, batch 64: 19 full batches and a partial one of 42 each epoch
    train(train_cfg("trainer.max_epochs=3", "accel.compile=true", *EAGER, *QUIET, *overrides), [probe])
    return probe


def test_a_compiled_run_compiles_the_training_forward_once(train_cfg) -> None:
    probe = _compiles(train_cfg)
    assert len(probe.train) == 3 * 19  # drop_last: every epoch 19 full batches, the partial one left out
    assert probe.train[0] >= 1 and sum(probe.train[1:]) == 0  # compiled at the first step, never again
    # evaluation (inference mode, eval mode, its own last batch) compiles its variants once, not per epoch
    assert sum(probe.val[:2]) >= 1 and sum(probe.val[2:]) == 0  # sanity check, epoch 0 | epochs 1, 2


# Without validation, as `make bench` trains: a validation's own partial batch, compiled before training,
# would have made dynamo treat the batch size as dynamic already.
NO_VAL = [
    "++trainer.limit_val_batches=0",
    "trainer.num_sanity_val_steps=0",
    "++trainer.enable_checkpointing=false",
]


@pytest.mark.slow  # ~5 s on 2 CPU cores: make test stays within 4 minutes (compiled_once is make test's)
def test_a_partial_last_batch_recompiles_the_training_forward(train_cfg) -> None:
    """What data.drop_last=true prevents: the shape guard fails at the epoch's last batch."""
    probe = _compiles(train_cfg, "data.drop_last=false", *NO_VAL)
    assert len(probe.train) == 3 * 20 and probe.train[19] == 1  # the first epoch's partial batch
    assert _compiles(train_cfg, *NO_VAL).train[1:] == [0] * (3 * 19 - 1)  # the same run, drop_last


def test_the_speed_report_counts_recompiles_in_the_timed_window(train_cfg, run_dir, caplog) -> None:
    import json
    import logging

    cfg = train_cfg(
        *TINY, *NO_VAL, "accel.compile=true", *EAGER, "data.drop_last=false", "data.batch_size=200"
    )
    cfg.trainer.limit_train_batches = 1.0  # digits at batch 200: 6 full batches and a partial one of 58
    cfg.trainer.max_epochs = 1
    with caplog.at_level(logging.INFO):
        train(cfg)
    report = json.loads((run_dir / "speed.json").read_text())
    assert report["recompiles"] >= 1
    assert any("torch.compile compiled" in r.getMessage() for r in caplog.records)
