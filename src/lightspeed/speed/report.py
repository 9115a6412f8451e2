"""Where the training time goes, measured on every run at almost no cost: two host timestamps (`perf_counter`)
a step, and a device sync only where the numbers need it (warm-up end, around validation, training end), so
samples/s is exact on a GPU too, while per-step figures are the host's cadence."""

from __future__ import annotations

import json
import resource
import statistics
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from lightning.pytorch.utilities.model_summary import summarize
from rich.console import Console
from rich.table import Table
from torch.utils.flop_counter import FlopCounterMode

from lightspeed.core import device as device_facts
from lightspeed.core.files import write_text_atomically
from lightspeed.speed.accel import compiled_frames

SPEED_FILE = "speed.json"

#: A note names validation and checkpoints when they take more than this share of the fit after warm-up.
OUTSIDE_STEPS_WARN = 0.3


class SpeedReport(L.Callback):
    """Samples/s, step time, data wait, peak memory, FLOPs per batch and MFU, after `warmup_steps` (compile,
    autotuning, worker start-up; `auto`: until the step time settles): a table, `speed.json`, `speed/*` in the
    loggers and one-line diagnoses (docs/usage.md). `max_timed_steps` ends the run after that many timed steps
    (`make bench`). At fit start: the model summary (as ModelSummary), `summary_depth` deep (0: none)."""

    def __init__(
        self,
        warmup_steps: int | str = 5,
        data_wait_warn: float = 0.2,
        max_timed_steps: int | None = None,
        summary_depth: int = 0,
    ) -> None:
        self.warmup_steps, self.data_wait_warn = warmup_steps, data_wait_warn
        self.max_timed_steps, self.summary_depth = max_timed_steps, summary_depth
        self._reset()

    def _reset(self) -> None:
        self.steps = 0  # timed steps (after warm-up)
        self.samples = 0
        self.step_times: list[float] = []
        self.wait_times: list[float] = []
        self.train_seconds = 0.0
        self.flops_per_batch: float | None = None
        self.report: dict[str, Any] = {}
        self._prev_end: float | None = None
        self._clock: float | None = None  # start of the current timed interval
        self._seen = 0
        self.recompiles = 0  # torch.compile compiles inside the timed intervals
        self._frames_at_clock = 0
        self._warm_starts: list[float] = []  # when each warm-up step started
        self._warmed_after: int | None = None  # steps before the first timed one
        self.warmup_seconds: float | None = None  # from the first batch to the first timed one
        self._timed_from: float | None = None  # when the warm-up ended
        self._validation_from: float | None = None
        self.validation_seconds = 0.0  # validation inside fit, after the warm-up
        self.validations = 0

    # --- timing -----------------------------------------------------------------------------------

    @staticmethod
    def _sync(trainer: L.Trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)

    def _stop_clock(self, trainer: L.Trainer) -> None:
        if self._clock is not None:
            self._sync(trainer)
            self.train_seconds += time.perf_counter() - self._clock
            self._clock = None
            self.recompiles += compiled_frames() - self._frames_at_clock

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset()
        if self.summary_depth:
            example = pl_module.example_input_array  # in the precision the weights are in (bf16-true)
            if isinstance(example, torch.Tensor):
                pl_module.example_input_array = trainer.precision_plugin.convert_input(example)
            try:
                rank_zero_info(f"\n{summarize(pl_module, max_depth=self.summary_depth)}")
            finally:
                pl_module.example_input_array = example
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(trainer.strategy.root_device)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int
    ) -> None:
        now = time.perf_counter()
        if self._warmed_after is None:
            self._warm_up(trainer, now)
        if self._warmed_after is not None and self._clock is None:
            # the warm-up ends, or training resumes after validation and the checkpoint saves that follow it
            self._sync(trainer)
            self._clock, self._frames_at_clock = time.perf_counter(), compiled_frames()
        elif self._clock is not None and self._prev_end is not None:
            self.wait_times.append(now - self._prev_end)  # fetching and moving the next batch
        if self.flops_per_batch is None and self._seen == 0:
            self.flops_per_batch = measure_flops(pl_module, batch)

    def _warm_up(self, trainer: L.Trainer, now: float) -> None:
        """A warm-up step: its start kept; the warm-up ends once the step time settles (`warmup_steps=auto`)
        or after `warmup_steps` steps, and the timing starts from a synced device."""
        starts = self._warm_starts
        starts.append(now)
        auto = self.warmup_steps == "auto"
        if auto:
            from lightspeed.speed.steady import settled  # `make bench`'s rule, loaded for `auto` only
        if settled([b - a for a, b in pairwise(starts)]) if auto else self._seen >= int(self.warmup_steps):
            self._warmed_after = self._seen
            self._sync(trainer)
            self._timed_from = time.perf_counter()
            self.warmup_seconds = self._timed_from - starts[0]

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        now = time.perf_counter()
        self._seen += 1
        if self._clock is not None:
            if self._prev_end is not None:
                self.step_times.append(now - self._prev_end)
            self.steps += 1
            self.samples += len(_first(batch))
            if self.max_timed_steps is not None and self.steps >= self.max_timed_steps:
                trainer.should_stop = True
        self._prev_end = now if self._clock is not None else None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit":  # validation inside fit is not training time
            self._stop_clock(trainer)
            self._prev_end = None
            if self._timed_from is not None:
                self._validation_from = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Checkpoint callbacks run after this one (Lightning calls them last): their saves are not in it.
        if self._validation_from is not None:
            self._sync(trainer)
            self.validation_seconds += time.perf_counter() - self._validation_from
            self._validation_from = None
            self.validations += 1

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._prev_end = None  # a new epoch's first batch waits for the iterator to be made: not counted

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_clock(trainer)
        self.report = self._compute(trainer)
        self._publish(trainer)

    # --- the numbers --------------------------------------------------------------------------------

    def _compute(self, trainer: L.Trainer) -> dict[str, Any]:
        dev = trainer.strategy.root_device
        fit = time.perf_counter() - self._timed_from if self._timed_from is not None else None
        batches = trainer.num_training_batches
        report: dict[str, Any] = {
            "device": device_facts.name(dev),
            "devices": trainer.world_size,
            "precision": str(trainer.precision),
            **self._timing(trainer.world_size),
            "flops_per_batch": self.flops_per_batch,
            "recompiles": self.recompiles,
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "threads_per_process": torch.get_num_threads(),
            "usable_cpus": device_facts.cpu_count(),
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            # The fit after the warm-up: the timed steps, validation, and the rest (checkpoint saves and
            # the other epoch-end work), which a plain loop that only trains does not do.
            "fit_seconds_after_warmup": fit,
            "validation_seconds": self.validation_seconds,
            "epoch_end_seconds": (
                max(0.0, fit - self.train_seconds - self.validation_seconds) if fit is not None else None
            ),
            "batches_per_epoch": int(batches) if batches != float("inf") else None,
            "validations": self.validations,
            # channels_last reorders 4-D tensors only: without such weights it changes nothing (make tune).
            # Conv2d modules too: FSDP's flat shards are 1-D by the fit's end.
            "has_4d_weights": any(isinstance(m, torch.nn.Conv2d) for m in trainer.lightning_module.modules())
            or any(p.dim() == 4 for p in trainer.lightning_module.parameters()),
        }
        report |= self._device_figures(dev, report["device"], str(trainer.precision))
        report["diagnosis"] = self._diagnose(report, dev.type)
        return report

    def _timing(self, world: int) -> dict[str, Any]:
        """The timed steps' figures; None for what was not measured (no timed step, no time)."""
        per_device = self.samples / self.train_seconds if self.train_seconds > 0 else None
        step_s = self.train_seconds / self.steps if self.steps else None
        times = self.step_times
        return {
            "timed_steps": self.steps,
            "warmup_steps": self._seen if self._warmed_after is None else self._warmed_after,
            "warmup_seconds": self.warmup_seconds,
            "samples": self.samples,
            "train_seconds": self.train_seconds,
            "samples_per_s": per_device * world if per_device else None,
            "samples_per_s_per_device": per_device,
            "step_ms_mean": step_s * 1e3 if step_s else None,
            "step_ms_median": statistics.median(times) * 1e3 if times else None,
            "step_ms_p95": sorted(times)[round(0.95 * (len(times) - 1))] * 1e3 if times else None,
            "data_wait_share": sum(self.wait_times) / self.train_seconds if self.train_seconds > 0 else None,
        }

    def _device_figures(self, dev: torch.device, name: str, precision: str) -> dict[str, Any]:
        """CUDA's peak memory, and the model FLOP utilisation where the device's peak is known."""
        if dev.type != "cuda":
            return {"peak_flops": None, "mfu": None}
        peak = device_facts.peak_flops(
            name, device_facts.math_mode(precision, torch.get_float32_matmul_precision())
        )
        measured = peak and self.flops_per_batch and self.train_seconds > 0
        return {
            "peak_allocated_gib": torch.cuda.max_memory_allocated(dev) / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved(dev) / 2**30,
            "peak_flops": peak,
            "mfu": self.flops_per_batch * self.steps / self.train_seconds / peak if measured else None,
        }

    def _diagnose(self, r: dict[str, Any], device_type: str) -> list[str]:
        """A line for each of `NOTES` that applies, worded by speed/diagnosis.py (loaded only then)."""
        found = [name for name, applies in NOTES.items() if applies(r, device_type, self.data_wait_warn)]
        if not found:
            return []
        from lightspeed.speed import diagnosis

        return [getattr(diagnosis, name)(r, device_type) for name in found]

    @rank_zero_only
    def _publish(self, trainer: L.Trainer) -> None:
        r = self.report
        run_dir = Path(trainer.default_root_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomically(run_dir / SPEED_FILE, json.dumps(r, indent=2) + "\n")
        metrics = {f"speed/{k}": float(v) for k, v in r.items() if isinstance(v, (int, float))}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
            logger.save()
        Console().print(_table(r))
        for note in r["diagnosis"]:
            rank_zero_info(f"speed: {note}")


def measure_flops(pl_module: L.LightningModule, batch: Any) -> float | None:
    """FLOPs of a training step's forward and backward on the batch's first element, on a `meta`-device copy
    built from the hyperparameters (no memory, time or effect on the run); None where that fails."""
    inputs = _first(batch)
    if not isinstance(inputs, torch.Tensor):
        return None
    counter = FlopCounterMode(display=False)
    try:
        with torch.device("meta"):
            copy = type(pl_module)(**pl_module.hparams)
        with counter:
            out = _first(copy(torch.empty(inputs.shape, dtype=inputs.dtype, device="meta")))
            if out.requires_grad:
                out.float().sum().backward()
    except Exception:  # a module that cannot be rebuilt from its hyperparameters, or not on meta
        return None
    return float(counter.get_total_flops())


def _first(batch: Any) -> Any:
    """The inputs of an (inputs, targets, ...) batch, or the batch itself."""
    return batch[0] if isinstance(batch, (tuple, list)) else batch


def _table(r: dict[str, Any]) -> Table:
    def fmt(value: Any, spec: str, unit: str = "") -> str:
        return "n/a" if value is None else f"{value:{spec}}{unit}"

    table = Table(title="Lightspeed: where the training time went", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    timed = (
        f"{r['timed_steps']} batches after {r['warmup_steps']} warm-up batches, {r['train_seconds']:.2f} s"
    )
    if (acc := r["accumulate_grad_batches"]) > 1:
        timed += f" ({r['timed_steps'] // acc} optimizer steps: accumulate_grad_batches={acc})"
    fit, val, end = r["fit_seconds_after_warmup"], r["validation_seconds"], r["epoch_end_seconds"]
    outside = (
        f"validation {val:.2f} s ({val / fit:.0%}), checkpoints and epoch ends {end:.2f} s ({end / fit:.0%}) "
        f"of the {fit:.2f} s after warm-up"
        if fit and end is not None
        else "n/a"
    )
    for row in (
        ("device", f"{r['devices']} x {r['device']}, {r['precision']}"),
        ("throughput", fmt(r["samples_per_s"], ",.0f", " samples/s")),
        (
            "step time",
            ", ".join(f"{fmt(r[f'step_ms_{k}'], '.2f', ' ms')} {k}" for k in ("mean", "median", "p95")),
        ),
        ("waiting for data", fmt(r["data_wait_share"], ".1%", " of training time")),
        ("timed", timed),
        ("outside the steps", outside),
        ("FLOPs per batch", fmt(r["flops_per_batch"], ".3g")),
        ("recompiles", f"{r['recompiles']} during the timed steps"),
        ("MFU", fmt(r["mfu"], ".1%") + (" of dense peak" if r["mfu"] is not None else " (no peak figure)")),
        (
            "peak memory",
            f"{fmt(r.get('peak_allocated_gib'), '.2f', ' GiB')} allocated, "
            f"{fmt(r.get('peak_reserved_gib'), '.2f', ' GiB')} reserved on the device; "
            f"{r['peak_rss_gib']:.2f} GiB host RSS",
        ),
    ):
        table.add_row(*row)
    return table


#: When each note of the diagnosis applies, given the report, the device type and `data_wait_warn` (the fit's
#: figures by `get`: a report made in a test may lack them).
NOTES: dict[str, Callable[[dict[str, Any], str, float], bool]] = {
    "data": lambda r, dev, warn: r["data_wait_share"] is not None and r["data_wait_share"] > warn,
    "jitter": lambda r, dev, warn: (
        dev == "cpu"
        and bool(r["step_ms_median"] and r["step_ms_p95"])
        and r["step_ms_p95"] > 3 * r["step_ms_median"]
        and r["threads_per_process"] * r["devices"] > 1
    ),
    "outside": lambda r, dev, warn: (
        bool(fit := r.get("fit_seconds_after_warmup"))
        and r.get("validation_seconds") is not None
        and r.get("epoch_end_seconds") is not None
        and (r["validation_seconds"] + r["epoch_end_seconds"]) / fit > OUTSIDE_STEPS_WARN
    ),
    "recompile": lambda r, dev, warn: bool(r["recompiles"]),
    "small_model": lambda r, dev, warn: (
        dev == "cuda"
        and (step := r["step_ms_mean"]) is not None
        and (step < 5 or (r["mfu"] is not None and r["mfu"] < 0.02))
    ),
}
