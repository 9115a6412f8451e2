"""Where the training time goes, measured on every run at almost no cost: two host timestamps (`perf_counter`)
a step, and a device sync only where the numbers need it (warm-up end, around validation, training end), so
samples/s is exact on a GPU too, while per-step figures are the host's cadence."""

from __future__ import annotations

import json
import resource
import statistics
import time
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
from lightspeed.speed.accel import compiled_frames
from lightspeed.speed.steady import settled

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
        self.warmup_steps = warmup_steps
        self.data_wait_warn = data_wait_warn
        self.max_timed_steps = max_timed_steps
        self.summary_depth = summary_depth
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
        self._warm_times: list[float] = []  # seconds between the warm-up steps' starts
        self._warm_start: float | None = None
        self._warmed_after: int | None = None  # steps before the first timed one
        self._warm_times_origin = 0.0
        self.warmup_seconds: float | None = None  # from the first batch to the first timed one
        self._timed_from: float | None = None  # when the warm-up ended
        self._validation_from: float | None = None
        self.validation_seconds = 0.0  # validation inside fit, after the warm-up
        self.validations = 0
        self._fit_seconds: float | None = None

    # --- timing -----------------------------------------------------------------------------------

    @staticmethod
    def _sync(trainer: L.Trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)

    def _start_clock(self, trainer: L.Trainer) -> None:
        self._sync(trainer)
        self._clock = time.perf_counter()
        self._frames_at_clock = compiled_frames()

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
            self._start_clock(trainer)
        elif self._clock is not None and self._prev_end is not None:
            self.wait_times.append(now - self._prev_end)  # fetching and moving the next batch
        if self.flops_per_batch is None and self._seen == 0:
            self.flops_per_batch = measure_flops(pl_module, batch)

    def _warm_up(self, trainer: L.Trainer, now: float) -> None:
        """A warm-up step: its time kept; the warm-up ends once the step time settles (`warmup_steps=auto`)
        or after `warmup_steps` steps, and the timing starts from a synced device."""
        if self._warm_start is not None:
            self._warm_times.append(now - self._warm_start)
        else:
            self._warm_times_origin = now
        self._warm_start = now
        auto = self.warmup_steps == "auto"
        if (auto and settled(self._warm_times)) or (not auto and self._seen >= int(self.warmup_steps)):
            self._warmed_after = self._seen
            self._sync(trainer)
            self._timed_from = time.perf_counter()
            self.warmup_seconds = self._timed_from - self._warm_times_origin

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
        self._fit_seconds = time.perf_counter() - self._timed_from if self._timed_from is not None else None
        self.report = self._compute(trainer)
        self._publish(trainer)

    # --- the numbers --------------------------------------------------------------------------------

    def _compute(self, trainer: L.Trainer) -> dict[str, Any]:
        dev = trainer.strategy.root_device
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
            "fit_seconds_after_warmup": self._fit_seconds,
            "validation_seconds": self.validation_seconds,
            "epoch_end_seconds": (
                max(0.0, self._fit_seconds - self.train_seconds - self.validation_seconds)
                if self._fit_seconds is not None
                else None
            ),
            "batches_per_epoch": int(batches) if batches != float("inf") else None,
            "validations": self.validations,
            # channels_last reorders 4-D tensors only: without such weights it changes nothing (make tune).
            # Conv2d modules too: FSDP's flat shards are 1-D by the fit's end.
            "has_4d_weights": _has_4d_weights(trainer.lightning_module),
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
            "step_ms_p95": _quantile(times, 0.95) * 1e3 if times else None,
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
        notes = (
            _data_note(r, device_type, self.data_wait_warn),
            _jitter_note(r, device_type),
            _outside_note(r),
            _recompile_note(r),
            _small_model_note(r, device_type),
        )
        return [note for note in notes if note]

    @rank_zero_only
    def _publish(self, trainer: L.Trainer) -> None:
        r = self.report
        run_dir = Path(trainer.default_root_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / SPEED_FILE).write_text(json.dumps(r, indent=2) + "\n")
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


def _has_4d_weights(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for m in module.modules()) or any(
        p.dim() == 4 for p in module.parameters()
    )


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _outside(r: dict[str, Any]) -> str:
    fit, val, end = r["fit_seconds_after_warmup"], r["validation_seconds"], r["epoch_end_seconds"]
    if not fit or end is None:
        return "n/a"
    return (
        f"validation {val:.2f} s ({val / fit:.0%}), checkpoints and epoch ends {end:.2f} s ({end / fit:.0%}) "
        f"of the {fit:.2f} s after warm-up"
    )


def _table(r: dict[str, Any]) -> Table:
    def fmt(value: Any, spec: str, unit: str = "") -> str:
        return "n/a" if value is None else f"{value:{spec}}{unit}"

    table = Table(title="Lightspeed: where the training time went", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    rows = [
        ("device", f"{r['devices']} x {r['device']}, {r['precision']}"),
        ("throughput", fmt(r["samples_per_s"], ",.0f", " samples/s")),
        (
            "step time",
            f"{fmt(r['step_ms_mean'], '.2f', ' ms')} mean, {fmt(r['step_ms_median'], '.2f', ' ms')} "
            f"median, {fmt(r['step_ms_p95'], '.2f', ' ms')} p95",
        ),
        ("waiting for data", fmt(r["data_wait_share"], ".1%", " of training time")),
        (
            "timed",
            f"{r['timed_steps']} batches after {r['warmup_steps']} warm-up batches, "
            f"{r['train_seconds']:.2f} s"
            + (
                f" ({r['timed_steps'] // r['accumulate_grad_batches']} optimizer steps: "
                f"accumulate_grad_batches={r['accumulate_grad_batches']})"
                if r["accumulate_grad_batches"] > 1
                else ""
            ),
        ),
        ("outside the steps", _outside(r)),
        ("FLOPs per batch", fmt(r["flops_per_batch"], ".3g")),
        ("recompiles", f"{r['recompiles']} during the timed steps"),
        ("MFU", fmt(r["mfu"], ".1%") + (" of dense peak" if r["mfu"] is not None else " (no peak figure)")),
        (
            "peak memory",
            f"{fmt(r.get('peak_allocated_gib'), '.2f', ' GiB')} allocated, "
            f"{fmt(r.get('peak_reserved_gib'), '.2f', ' GiB')} reserved on the device; "
            f"{r['peak_rss_gib']:.2f} GiB host RSS",
        ),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table


# --- the diagnosis: each note says what it found and what to try, or is None --------------------------


def _data_note(r: dict[str, Any], device_type: str, warn: float) -> str | None:
    if r["data_wait_share"] is None or r["data_wait_share"] <= warn:
        return None
    remedies = (
        "more loader workers (data.num_workers=auto, accel=default), pinned memory "
        "(data.pin_memory=true) or keeping the data set on the device (data.on_device=auto)"
        if device_type == "cuda"
        else "more loader workers (data.num_workers=auto), or slicing an in-memory data set "
        "without a DataLoader (data.on_device=true; pinned memory only helps copies to a GPU)"
    )
    return f"data loading takes {r['data_wait_share']:.0%} of training time: try {remedies}"


def _jitter_note(r: dict[str, Any], device_type: str) -> str | None:
    median, p95 = r["step_ms_median"], r["step_ms_p95"]
    threads, cpus = r["threads_per_process"], r["usable_cpus"]
    if device_type != "cpu" or not (median and p95) or p95 <= 3 * median or threads * r["devices"] <= 1:
        return None
    return (
        f"step times vary a lot on this CPU ({p95:.1f} ms p95 against {median:.1f} ms median): "
        f"{r['devices']} process(es) x {threads} threads on {cpus} usable CPUs may be more than the "
        f"machine has free; try OMP_NUM_THREADS={max(1, cpus // r['devices'] // 2)} or stop other work"
    )


def _outside_note(r: dict[str, Any]) -> str | None:
    fit, val, end = r.get("fit_seconds_after_warmup"), r.get("validation_seconds"), r.get("epoch_end_seconds")
    if not fit or val is None or end is None or (val + end) / fit <= OUTSIDE_STEPS_WARN:
        return None
    count = r.get("validations") or 0
    each = f", {(val + end) / count * 1e3:.0f} ms at each of {count} validations" if count else ""
    return (
        f"validation ({val / fit:.0%}) and checkpoint saves with the rest of the epoch end "
        f"({end / fit:.0%}) take {(val + end) / fit:.0%} of the fit after warm-up{each}, for epochs "
        f"of {r.get('batches_per_epoch')} batches: validate and save less often "
        "(trainer.check_val_every_n_epoch=N) to train more in the same time"
    )


def _recompile_note(r: dict[str, Any]) -> str | None:
    if not r["recompiles"]:
        return None
    return (
        f"torch.compile compiled {r['recompiles']} time(s) during the timed steps, seconds each: "
        "a changing input shape or mode (see TORCH_LOGS=recompiles); keep data.drop_last=true, "
        "or raise callbacks.speed_report.warmup_steps if it is the first compile"
    )


def _small_model_note(r: dict[str, Any], device_type: str) -> str | None:
    step, mfu = r["step_ms_mean"], r["mfu"]
    if device_type != "cuda" or step is None or not (step < 5 or (mfu is not None and mfu < 0.02)):
        return None
    share = f", {mfu:.1%} of its peak" if mfu is not None else ""
    return (
        f"the model is too small to keep the GPU busy ({step:.1f} ms a step{share}): "
        "use larger batches, accel=max (torch.compile), or compare with trainer=cpu"
    )
