"""Every assumption `lightspeed.compat` makes about Lightning's internals, checked on the installed
version: when an upgrade breaks one, the failing test names it and the compat function to mend."""

from __future__ import annotations

import subprocess
import sys
import warnings
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from lightspeed.compat import hooks
from lightspeed.compat import trainer as compat

VERSION = L.__version__


def broken(what: str, where: str) -> str:
    return f"Lightning {VERSION}: {what} no longer holds; mend lightspeed.compat.{where}"


class Tiny(L.LightningModule):
    """The smallest module that trains: 6 samples, batch 2, 3 steps an epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(6, 2)), batch_size=2)


def fit(module: L.LightningModule, callbacks: list[L.Callback], **kwargs: Any) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **kwargs,
    )
    trainer.fit(module)
    return trainer


def test_lightning_is_the_minor_series_the_compat_layer_was_checked_on() -> None:
    assert VERSION.startswith("2.6."), broken("the version pin (lightning 2.6.x in pyproject.toml)", "*")


class Record(L.Callback):
    """Records `read(trainer)` at every call of the training-batch hook `hook`."""

    def __init__(self, hook: str, read: Any) -> None:
        self.seen: list[Any] = []
        setattr(self, hook, lambda trainer, *args: self.seen.append(read(trainer)))


def test_is_last_batch_marks_each_epochs_last_batch() -> None:
    probe = Record("on_train_batch_end", compat.is_last_batch)
    fit(Tiny(), [probe])
    assert probe.seen == [False, False, True] * 2, broken(
        "fit_loop.epoch_loop.batch_progress.is_last_batch", "trainer.is_last_batch"
    )


def test_batches_done_in_epoch_counts_the_epochs_finished_batches() -> None:
    probe = Record("on_train_batch_start", compat.batches_done_in_epoch)
    fit(Tiny(), [probe])
    assert probe.seen == [0, 1, 2] * 2, broken(
        "fit_loop.epoch_loop.batch_progress.current.processed", "trainer.batches_done_in_epoch"
    )


def test_a_hook_set_to_none_is_skipped_by_the_dispatcher() -> None:
    class Counting(L.Callback):
        calls = 0

        def on_train_batch_end(self, *args: Any) -> None:
            Counting.calls += 1

    off = Counting()
    hooks.switch_off(off, ("on_train_batch_end",))
    fit(Tiny(), [off, Counting()])
    assert Counting.calls == 6, broken("a hook set to None is not called", "hooks.switch_off / skip_empty")


def test_the_launcher_keeps_the_ranks_it_started() -> None:
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

    launcher = _SubprocessScriptLauncher(LightningEnvironment(), num_processes=2, num_nodes=1)
    assert launcher.procs == [], broken("_SubprocessScriptLauncher.procs", "ranks.launched_ranks")


@pytest.mark.slow  # over 9 s on the 2-core CI machine: make test stays within 4 minutes
def test_the_launchers_observer_disarmed_no_longer_kills_this_process_when_a_rank_dies() -> None:
    """Lightning's observer SIGKILLs the main process when a rank exits non-zero; disarmed (as
    kill_launched_ranks does before it kills the ranks), it leaves it alone. In a child process, with a
    real observer watching a real process that fails."""
    script = (
        "import subprocess, sys, time\n"
        "from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver\n"
        "from lightspeed.compat.ranks import disarm_child_observer\n"
        "import os\n"
        "child = subprocess.Popen([sys.executable, '-c', 'raise SystemExit(3)'])\n"
        "_ChildProcessObserver(os.getpid(), [child], sleep_period=1).start()\n"
        "if sys.argv[1] == 'disarm':\n"
        "    disarm_child_observer()\n"
        "time.sleep(3)\n"
        "print('alive')\n"
    )
    armed = subprocess.run([sys.executable, "-c", script, "keep"], capture_output=True, text=True)
    assert armed.returncode == -9 and "alive" not in armed.stdout  # what the observer does
    disarmed = subprocess.run([sys.executable, "-c", script, "disarm"], capture_output=True, text=True)
    assert disarmed.returncode == 0 and "alive" in disarmed.stdout, broken(
        "_ChildProcessObserver watches _child_processes", "ranks.disarm_child_observer"
    )


def test_a_metric_marked_updated_computes_its_state_without_a_warning() -> None:
    from torchmetrics.aggregation import SumMetric

    metric = SumMetric()
    metric.sum_value = torch.tensor(3.0)
    compat.mark_updated(metric)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "compute called before update" would be one
        assert float(metric.compute()) == 3.0, broken("Metric._update_count", "trainer.mark_updated")


def test_unrepeated_sampler_gives_each_sample_to_exactly_one_rank() -> None:
    data = list(range(7))
    shards = [
        list(compat.UnrepeatedDistributedSampler(data, num_replicas=2, rank=r, shuffle=False)) for r in (0, 1)
    ]
    assert sorted(shards[0] + shards[1]) == data, broken("UnrepeatedDistributedSampler", "trainer")


@pytest.mark.parametrize(
    "name",
    [
        "_every_n_train_steps",
        "_train_time_interval",
        "_every_n_epochs",
        "_last_global_step_saved",
        "_should_skip_saving_checkpoint",
        "_should_save_on_train_epoch_end",
        "_monitor_candidates",
        "_save_topk_checkpoint",
        "_save_last_checkpoint",
        "_ModelCheckpoint__warn_if_dir_not_empty",
    ],
)
def test_model_checkpoint_has_the_private_members_the_subclass_uses(name: str) -> None:
    assert hasattr(ModelCheckpoint(), name), broken(f"ModelCheckpoint.{name}", "callbacks.ModelCheckpoint")


def test_the_rich_bar_names_its_epochs_in_one_method_and_the_mixin_drops_a_negative_limit() -> None:
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import RichProgressBar

    from lightspeed.speed.progress import ProgressBar

    assert callable(getattr(RichProgressBar, "_get_train_description", None)), broken(
        "RichProgressBar._get_train_description names the epoch", "callbacks.EpochOfNoLimit"
    )
    bar = ProgressBar()
    bar._trainer = SimpleNamespace(max_epochs=-1)
    assert bar._get_train_description(93).strip() == "Epoch 93"
    bar._trainer = SimpleNamespace(max_epochs=20)
    assert bar._get_train_description(3).strip() == "Epoch 3/19"


PROMPT_STOP = """
import sys
sys.path.insert(0, {tests!r})
import lightning as L
from test_compat import Tiny
from lightspeed.speed.progress import ProgressBar

class Seen(ProgressBar):
    def on_train_start(self, trainer, pl_module):
        super().on_train_start(trainer, pl_module)
        print("thread", type(self.progress.live._refresh_thread).__name__)

bar = Seen(refresh_rate=0.001)  # 1,000 s between refreshes: a stop that waits out the sleep hangs
trainer = L.Trainer(
    accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False, callbacks=[bar]
)
trainer.fit(Tiny())
print("stopped")
"""


@pytest.mark.slow  # a fresh process (~6 s): make test stays within 4 minutes
def test_the_rich_bar_stops_at_once_however_long_its_refresh_interval() -> None:
    """Lightning 2.6's refresh thread sleeps out its interval and the bar's stop joins it (up to 0.25 s at
    each fit's end); `callbacks.PromptStop` swaps in a thread that wakes when told to stop."""
    from pathlib import Path

    script = PROMPT_STOP.format(tests=str(Path(__file__).parent))
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(broken("a bar whose stop returns at once", "callbacks.PromptStop"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "thread _WakingRefresh" in done.stdout and "stopped" in done.stdout, done.stdout[-2000:]
