"""The speed report's notes, each saying what it found and what to try: loaded only where one applies (when
each does: `report.NOTES`)."""

from __future__ import annotations

from typing import Any


def data(r: dict[str, Any], device_type: str) -> str:
    remedies = (
        "more loader workers (data.num_workers=auto, accel=default), pinned memory "
        "(data.pin_memory=true) or keeping the data set on the device (data.on_device=auto)"
        if device_type == "cuda"
        else "more loader workers (data.num_workers=auto), or slicing an in-memory data set "
        "without a DataLoader (data.on_device=true; pinned memory only helps copies to a GPU)"
    )
    return f"data loading takes {r['data_wait_share']:.0%} of training time: try {remedies}"


def jitter(r: dict[str, Any], device_type: str) -> str:
    median, p95, threads, cpus = (
        r["step_ms_median"],
        r["step_ms_p95"],
        r["threads_per_process"],
        r["usable_cpus"],
    )
    return (
        f"step times vary a lot on this CPU ({p95:.1f} ms p95 against {median:.1f} ms median): "
        f"{r['devices']} process(es) x {threads} threads on {cpus} usable CPUs may be more than the "
        f"machine has free; try OMP_NUM_THREADS={max(1, cpus // r['devices'] // 2)} or stop other work"
    )


def outside(r: dict[str, Any], device_type: str) -> str:
    fit, val, end = r["fit_seconds_after_warmup"], r["validation_seconds"], r["epoch_end_seconds"]
    count = r.get("validations") or 0
    each = f", {(val + end) / count * 1e3:.0f} ms at each of {count} validations" if count else ""
    return (
        f"validation ({val / fit:.0%}) and checkpoint saves with the rest of the epoch end "
        f"({end / fit:.0%}) take {(val + end) / fit:.0%} of the fit after warm-up{each}, for epochs "
        f"of {r.get('batches_per_epoch')} batches: validate and save less often "
        "(trainer.check_val_every_n_epoch=N) to train more in the same time"
    )


def recompile(r: dict[str, Any], device_type: str) -> str:
    return (
        f"torch.compile compiled {r['recompiles']} time(s) during the timed steps, seconds each: "
        "a changing input shape or mode (see TORCH_LOGS=recompiles); keep data.drop_last=true, "
        "or raise callbacks.speed_report.warmup_steps if it is the first compile"
    )


def small_model(r: dict[str, Any], device_type: str) -> str:
    share = f", {r['mfu']:.1%} of its peak" if r["mfu"] is not None else ""
    return (
        f"the model is too small to keep the GPU busy ({r['step_ms_mean']:.1f} ms a step{share}): "
        "use larger batches, accel=max (torch.compile), or compare with trainer=cpu"
    )
