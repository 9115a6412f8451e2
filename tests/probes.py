"""Callbacks that record what really happened inside a run, for tests (also in subprocesses: the CLI
tests put this folder on PYTHONPATH and add them with `+callbacks.<name>._target_=probes.<Class>`)."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightspeed.data import DigitsDataModule
from lightspeed.data.diabetes import DiabetesDataModule
from lightspeed.models.classifier import Classifier
from lightspeed.models.nets.mlp import MLP
from lightspeed.resilience.identity import RunIdentity, digest
from lightspeed.speed.accel import compiled_frames


class AutocastProbe(L.Callback):
    """Records whether autocast is on, and its dtype, inside the first training step."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int
    ) -> None:
        if not self.seen:
            with trainer.precision_plugin.forward_context():
                self.seen = {
                    "enabled": torch.is_autocast_enabled("cpu"),
                    "dtype": torch.get_autocast_dtype("cpu"),
                    "logits_dtype": pl_module(batch[0]).dtype,
                }


class RankProbe(L.Callback):
    """Writes `<out>/rank<R>.json`: the rank's torch seed after fit starts and the sample indices its
    sampler gave it in the first epoch; and, as the process exits (atexit, before the interpreter is
    torn down), `<out>/rank<R>.exit.json`: whether its process group was still alive then."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            atexit.register(self._at_exit, self.out / f"rank{trainer.global_rank}.exit.json")

    @staticmethod
    def _at_exit(path: Path) -> None:
        path.write_text(json.dumps({"process_group_alive": torch.distributed.is_initialized()}))

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch != 0:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        facts = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "initial_seed": torch.initial_seed(),
            "indices": list(iter(trainer.train_dataloader.sampler)),
            "dataset_size": len(
                getattr(trainer.train_dataloader, "dataset", None) or trainer.datamodule.splits["train"]
            ),
            "loader": type(trainer.train_dataloader).__name__,
            "identity": next(  # the run identity this rank computed from its own command line
                (digest(cb.ident) for cb in trainer.callbacks if isinstance(cb, RunIdentity) and cb.ident),
                None,
            ),
        }
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(facts))


class SeenSamples(L.Callback):
    """Writes `<out>/rank<R>.json`: a hash of every training sample the rank trained on in the first epoch
    (for loaders without a sampler to ask: streamed shards)."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.samples: list[str] = []

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, i: int
    ) -> None:
        if trainer.current_epoch == 0:
            rows = batch[0].detach().cpu().reshape(len(batch[0]), -1)
            self.samples += [hashlib.blake2b(r.numpy().tobytes(), digest_size=8).hexdigest() for r in rows]

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            facts = {"rank": trainer.global_rank, "samples": self.samples}
            (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(facts))


class BatchProbe(L.Callback):
    """Records, for every training step, the memory formats of the first conv's input and weight, a
    fingerprint of the batch (to compare sample orders between runs), and the gradient norm after
    clipping."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        conv = next((m for m in pl_module.modules() if isinstance(m, torch.nn.Conv2d)), None)
        if conv is not None:
            conv.register_forward_pre_hook(self._conv_input)

    def _conv_input(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        self.steps[-1]["input_channels_last"] = args[0].is_contiguous(memory_format=torch.channels_last)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int
    ) -> None:
        x, y = batch
        conv = next((m for m in pl_module.modules() if isinstance(m, torch.nn.Conv2d)), None)
        self.steps.append(
            {
                "input_channels_last": False,  # until the first conv sees it
                "weight_channels_last": conv is not None
                and conv.weight.is_contiguous(memory_format=torch.channels_last),
                "fingerprint": (y.tolist(), round(float(x.double().sum()), 6)),
            }
        )

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        grads = [p.grad.norm() for p in pl_module.parameters() if p.grad is not None]  # clipped, stepped
        if grads:
            self.steps[-1]["grad_norm"] = float(torch.stack(grads).norm())


class Clock:
    """`time.perf_counter`, plus the seconds that `advance` added: a clock a test controls (put it in
    place of a module's `time`)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


CLOCK = Clock()


class SlowLoader:
    """Wraps a loader and waits before each batch, as a slow disk or decoder would: for real, or on
    `CLOCK` (`virtual`)."""

    def __init__(self, loader: Any, seconds: float, virtual: bool = False) -> None:
        self.loader, self.seconds, self.virtual = loader, seconds, virtual

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Any:
        for batch in self.loader:
            if self.virtual:
                CLOCK.advance(self.seconds)
            else:
                time.sleep(self.seconds)
            yield batch


class SlowSteps(L.Callback):
    """Each optimizer step takes `seconds` more on `CLOCK` (no real waiting): compute that dominates."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_before_optimizer_step(self, *args: Any) -> None:
        CLOCK.advance(self.seconds)


class Pause(L.Callback):
    """Sleeps `seconds` of real time after each training step: a window for a test to act on a running run
    (kill a node after its first checkpoint, say)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(self.seconds)


class SlowDigits(DigitsDataModule):
    """Digits whose training batches take `delay` seconds each to arrive, and validation batches
    `val_delay` (on `CLOCK` if `virtual`)."""

    def __init__(
        self, delay: float = 0.02, virtual: bool = False, val_delay: float = 0.0, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.delay, self.virtual, self.val_delay = delay, virtual, val_delay

    def train_dataloader(self) -> Any:
        return SlowLoader(super().train_dataloader(), self.delay, self.virtual)

    def val_dataloader(self) -> Any:
        return SlowLoader(super().val_dataloader(), self.val_delay, self.virtual)


class Fault(L.Callback):
    """Injects one fault at a training step (`global_step` before the step), on one rank or all:
    `nan` poisons the batch's inputs, `oom` raises torch's out-of-memory error, `raise` a RuntimeError,
    `sigterm`/`sigusr1` sends the signal to this process, `exit` ends the process at once."""

    def __init__(self, kind: str, step: int, rank: int | None = None) -> None:
        self.kind, self.step, self.rank = kind, step, rank

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int
    ) -> None:
        if trainer.global_step != self.step or (self.rank is not None and trainer.global_rank != self.rank):
            return
        if self.kind == "nan":
            batch[0][0] = float("nan")
        elif self.kind == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        elif self.kind == "raise":
            raise RuntimeError(f"simulated failure on rank {trainer.global_rank}")
        elif self.kind in ("sigterm", "sigusr1", "sigint"):
            os.kill(os.getpid(), getattr(signal, self.kind.upper()))
        elif self.kind == "exit":
            os._exit(9)


class Snapshot(L.Callback):
    """The weights and the optimizer's step count before and after the training step at `step`."""

    def __init__(self, step: int) -> None:
        self.step, self.before, self.after = step, {}, {}

    def _take(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        state = next(iter(trainer.optimizers[0].state.values()), {})
        return {
            "weights": {k: v.clone() for k, v in pl_module.state_dict().items()},
            "opt_step": state.get("step"),
        }

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.before = self._take(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step == self.step + 1:
            self.after = self._take(trainer, pl_module)


#: Tensor methods that read a value back to the host: on a GPU each one waits for all queued work.
SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__float__", "__int__", "__index__")


class SyncCounter(L.Callback):
    """Counts, per training batch, every call that would synchronise a GPU with the host: the tensor
    reads in `SYNC_METHODS`, `torch.nonzero`, `torch.cuda.synchronize`, and `torch.tensor(..., device=...)`
    (host data copied to the device: a blocking copy on a GPU). On a CUDA device
    `torch.cuda.set_sync_debug_mode("warn")` also reports the syncs these wrappers cannot see (boolean
    mask indexing inside torch, blocking copies), each counted as a `cuda:` event.

    A batch's window runs from its `on_train_batch_start` to the next one's: the step, every hook after
    it, the logger's update and the fetch of the next batch. `events[batch] = [where, ...]` for the
    batches that synchronised, where is `method at file:line` of the first frame outside torch."""

    def __init__(self) -> None:
        self.events: dict[int, list[str]] = {}
        self.logging_batches: set[int] = set()  # global batch numbers where Lightning's logger writes
        self.epoch_edges: set[int] = set()  # global batch numbers of each epoch's first and last batch
        self.batches = 0
        self._batch: int | None = None
        self._undo: list[Any] = []

    def _record(self, what: str) -> None:
        if self._batch is None:
            return
        import traceback

        frames = [f for f in traceback.extract_stack()[:-2] if "/torch/" not in f.filename]
        where = f"{frames[-1].filename.rsplit('/', 2)[-1]}:{frames[-1].lineno}" if frames else "?"
        self.events.setdefault(self._batch, []).append(f"{what} at {where}")

    def _wrap(self, owner: Any, name: str) -> None:
        original = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            # torch.tensor(...) without a device stays on the host: only one made for a device is a copy
            if name != "tensor" or kwargs.get("device") is not None:
                self._record(name)
            return original(*args, **kwargs)

        setattr(owner, name, counted)
        self._undo.append((owner, name, original))

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """First in line, so that a batch's window opens before any other callback's batch hooks run
        (removed from its place and put first: the hook loop over the list visits nobody twice)."""
        trainer.callbacks.remove(self)
        trainer.callbacks.insert(0, self)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for name in SYNC_METHODS:
            self._wrap(torch.Tensor, name)
        self._wrap(torch, "nonzero")
        self._wrap(torch, "tensor")
        self._wrap(torch.cuda, "synchronize")
        if trainer.strategy.root_device.type == "cuda":
            import warnings

            torch.cuda.set_sync_debug_mode("warn")
            self._warnings = warnings.catch_warnings(record=True)
            self._caught = self._warnings.__enter__()
            warnings.simplefilter("always")

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._drain_cuda_warnings()
        self._batch = self.batches
        if batch_idx == 0:
            self.epoch_edges.add(self.batches)
        if (trainer.global_step + 1) % trainer.log_every_n_steps == 0:  # Lightning's should_update_logs
            self.logging_batches.add(self.batches)
        self.batches += 1

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.epoch_edges.add(self.batches - 1)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._drain_cuda_warnings()
        self._restore()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore()  # also after a failed run: later tests get torch as it was

    def _restore(self) -> None:
        self._batch = None
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo = []
        if getattr(self, "_warnings", None) is not None:
            torch.cuda.set_sync_debug_mode("default")
            self._warnings.__exit__(None, None, None)
            self._warnings = None

    def _drain_cuda_warnings(self) -> None:
        caught = getattr(self, "_caught", None)
        if not caught or self._batch is None:
            return
        for w in caught:
            if "synchroniz" in str(w.message):  # where the synchronising call was made, as torch says
                where = f"{w.filename.rsplit('/', 2)[-1]}:{w.lineno}"
                self.events.setdefault(self._batch, []).append(f"cuda: {str(w.message)[:60]} at {where}")
        caught.clear()


class ReadsLoss(Classifier):
    """The Classifier with a `loss.item()` in every training step: what the sync-count test must catch."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        loss.item()
        return loss


class SyncErrors(L.Callback):
    """On a CUDA device, torch's sync debug mode set to `error` for each training batch that neither logs
    nor opens or closes an epoch (the batches `SyncCounter` allows nothing in), from its
    `on_train_batch_start` to the next batch's: any synchronising call there (a value read to the host, a
    blocking copy, a mask that torch must count) raises where it is made, with its traceback.
    `clean_batches` counts the batches so watched."""

    def __init__(self) -> None:
        self.clean_batches = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        trainer.callbacks.remove(self)  # first in line, as SyncCounter
        trainer.callbacks.insert(0, self)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        edge = batch_idx in (0, trainer.num_training_batches - 1)
        logs = (trainer.global_step + 1) % trainer.log_every_n_steps == 0  # Lightning's should_update_logs
        clean = not edge and not logs
        self.clean_batches += clean
        torch.cuda.set_sync_debug_mode("error" if clean else "default")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.cuda.set_sync_debug_mode("default")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        torch.cuda.set_sync_debug_mode("default")  # also after a failed run


class LayoutProbe(L.Callback):
    """What the net's last 2-D convolution (its input has channels to lay out, unlike a first layer's
    single one) is given and gives in the second training step, eagerly (no torch.compile): whether its
    input and its weight are strictly channels_last (NHWC strides, not NCHW ones), and the dtype of its
    output (bfloat16 under bf16-mixed autocast)."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}
        self._handle: Any = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == 1 and self._handle is None:
            conv = [m for m in pl_module.modules() if isinstance(m, torch.nn.Conv2d)][-1]
            self._handle = conv.register_forward_hook(self._record)

    def _record(self, conv: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
        def nhwc(t: torch.Tensor) -> bool:
            return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()

        self.seen = {
            "device": output.device.type,
            "input_channels_last": nhwc(args[0]),
            "weight_channels_last": nhwc(conv.weight),
            "output_dtype": output.dtype,
        }
        self._handle.remove()


class CompileProbe(L.Callback):
    """How many frames torch.compile compiled inside each training batch (`train`, one entry a batch)
    and inside each validation run (`val`, one entry a validation, the sanity check included)."""

    def __init__(self) -> None:
        self.train: list[int] = []
        self.val: list[int] = []
        self._at = 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._at = compiled_frames()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.train.append(compiled_frames() - self._at)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._at = compiled_frames()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.val.append(compiled_frames() - self._at)


class PlainDigits(L.LightningDataModule):
    """A user's own DataModule, as the Lightning docs write one: plain DataLoaders over its own splits,
    no Lightspeed base class; `model_args()` says what the model is built from."""

    def __init__(self, batch_size: int = 64) -> None:
        super().__init__()
        self.batch_size = batch_size

    def model_args(self) -> dict[str, Any]:
        return {"num_classes": 10, "input_shape": [1, 8, 8]}

    def setup(self, stage: str | None = None) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16
        y = torch.tensor(digits.target)
        self.train_set = TensorDataset(x[:1200], y[:1200])
        self.val_set, self.test_set = (
            TensorDataset(x[1200:1500], y[1200:1500]),
            TensorDataset(x[1500:], y[1500:]),
        )

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=self.batch_size)


class ShapelessDigits(L.LightningDataModule):
    """A user's DataModule that does not say what the model needs (no `model_args()`)."""

    def __init__(self, batch_size: int = 64) -> None:
        super().__init__()
        self.batch_size = batch_size


class PlainClassifier(L.LightningModule):
    """A user's own LightningModule, as the Lightning docs write one: torchmetrics' accuracy logged the
    documented way, its own optimizer, no Lightspeed base class or helper."""

    def __init__(self, num_classes: int, input_shape: list[int], lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        features = int(torch.tensor(input_shape).prod())
        self.net = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(features, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2)
        )
        self.head = torch.nn.Linear(64, num_classes)
        from torchmetrics.classification import MulticlassAccuracy

        self.train_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        self.train_acc.update(logits, y)
        self.log("train/loss", loss)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.val_acc.update(logits, y)
        self.log("val/loss", torch.nn.functional.cross_entropy(logits, y))
        self.log("val/acc", self.val_acc)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test/loss", torch.nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)


class NamedClassifier(PlainClassifier):
    """Arguments with defaults whose names a DataModule also has (Lightning's `name`, the `batch_size`
    setting): they keep their defaults."""

    def __init__(
        self,
        num_classes: int,
        input_shape: list[int],
        lr: float = 0.05,
        name: str = "plain",
        batch_size: int = 8,
    ) -> None:
        super().__init__(num_classes, input_shape, lr)
        self.save_hyperparameters()


class ForwardingClassifier(Classifier):
    """A subclass that passes its arguments on, as Python subclasses often do."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)


class Conv1DNet(torch.nn.Module):
    """A user's 1D net: its constructor takes (C, L) and nothing else."""

    example_input_shapes = ((1, 40),)

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, _ = input_shape
        self.layers = torch.nn.Sequential(
            torch.nn.Conv1d(channels, 8, 5, padding=2),
            torch.nn.AdaptiveAvgPool1d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(8, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class DiabetesAsClasses(DiabetesDataModule):
    """A data set that declares classes, but whose targets are continuous."""

    num_classes = 10

    def model_args(self) -> dict[str, Any]:
        return {"input_shape": list(self.input_shape), "num_classes": self.num_classes}


class LabelsFromOne(DigitsDataModule):
    """Digits labelled 1..10 for num_classes=10: one label out of range."""

    def load_arrays(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super().load_arrays()
        return x, y + 1


class TwelveFeatures(DiabetesDataModule):
    """The diabetes data with two more (constant) features: a model built for 10 does not fit it."""

    input_shape = (12,)

    def load_arrays(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super().load_arrays()
        return torch.cat([x, torch.ones(len(x), 2)], dim=1), y


class ForwardingMLP(MLP):
    """A net subclass that passes its keyword arguments on, as Python subclasses often do."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)


class BrokenNet(torch.nn.Module):
    """A net whose constructor has a bug of its own (not a setting): the error names the node it built."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        raise KeyError("a bug in the constructor")


class NoneStepClassifier(Classifier):
    """A training_step that returns None (Lightning skips the update): the run goes on to its end."""

    def training_step(self, batch: Any, batch_idx: int) -> None:
        super().training_step(batch, batch_idx)


class UntestedClassifier(Classifier):
    """No test_step of its own."""

    test_step = L.LightningModule.test_step


class UntestedDigits(DigitsDataModule):
    """No test loader."""

    test_dataloader = L.LightningDataModule.test_dataloader
