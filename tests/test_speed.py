"""The speed report: consistent with what ran, cheap, and honest about data loading."""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict

from conftest import LIMIT, TINY
from lightspeed.core.device import gpu_model, math_mode, peak_flops
from lightspeed.speed import accel
from lightspeed.speed.report import SPEED_FILE, SpeedReport
from lightspeed.train import train

KEYS = {
    "device",
    "devices",
    "precision",
    "timed_steps",
    "warmup_steps",
    "samples",
    "train_seconds",
    "samples_per_s",
    "samples_per_s_per_device",
    "step_ms_mean",
    "step_ms_median",
    "step_ms_p95",
    "data_wait_share",
    "flops_per_batch",
    "peak_rss_gib",
    "peak_flops",
    "mfu",
    "diagnosis",
    "fit_seconds_after_warmup",
    "validation_seconds",
    "epoch_end_seconds",
    "validations",
    "batches_per_epoch",
    "has_4d_weights",
}


def speed_of(run_dir: Path) -> dict:
    return json.loads((run_dir / SPEED_FILE).read_text())


def test_report_is_consistent_with_what_ran(train_cfg, run_dir: Path) -> None:
    start = time.perf_counter()
    result = train(train_cfg(*TINY, "callbacks.speed_report.warmup_steps=3", "test_after_fit=false"))
    wall = time.perf_counter() - start  # the whole run, measured outside it: the timed steps lie inside
    r = speed_of(run_dir)
    assert set(r) >= KEYS
    assert result.trainer.global_step == 10 and r["warmup_steps"] == 3 and r["timed_steps"] == 7
    assert r["samples"] == r["timed_steps"] * 64  # every timed step had a full batch of 64
    assert 0 < r["train_seconds"] < wall and r["samples_per_s"] > r["samples"] / wall
    assert 0 <= r["data_wait_share"] < 1 and r["step_ms_median"] <= r["step_ms_p95"]
    # the CNN on a 64-image batch: forward ~1.2 MFLOP an image, backward about twice that
    assert 1.5e8 < r["flops_per_batch"] < 3.5e8
    assert r["mfu"] is None and r["peak_flops"] is None  # no peak figure for a CPU
    assert r["has_4d_weights"] is True  # the CNN's convolutions: channels_last has something to reorder
    metrics = (run_dir / "csv" / "version_0" / "metrics.csv").read_text()
    assert "speed/samples_per_s" in metrics.splitlines()[0]  # the same numbers reach the logger


def _on_a_controlled_clock(train_cfg, run_dir: Path, caplog, monkeypatch, *delays: str) -> dict:
    """A small run of digits whose batches take `delays` virtual seconds to arrive: its speed.json."""
    import probes

    monkeypatch.setattr("lightspeed.speed.report.time", probes.CLOCK)
    with caplog.at_level(logging.INFO):
        train(
            train_cfg(
                *TINY,
                "data._target_=probes.SlowDigits",
                *delays,
                "+data.virtual=true",
                "model=mlp",
                "callbacks.speed_report.warmup_steps=1",
                "test_after_fit=false",
            )
        )
    return speed_of(run_dir)


def test_data_wait_diagnosis_fires_on_slow_data(train_cfg, run_dir: Path, caplog, monkeypatch) -> None:
    """On a controlled clock: each batch takes 10 s to arrive (no real waiting), whatever the load."""
    r = _on_a_controlled_clock(train_cfg, run_dir, caplog, monkeypatch, "+data.delay=10")
    assert r["data_wait_share"] > 0.95
    assert r["has_4d_weights"] is False  # an MLP: make tune does not measure channels_last for it
    notes = [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("speed: data loading")]
    assert len(notes) == 1 and "data.num_workers" in notes[0] and "data.on_device" in notes[0]


def test_validation_and_epoch_ends_are_timed_and_named_when_they_take_the_fit(
    train_cfg, run_dir: Path, caplog, monkeypatch
) -> None:
    """On a controlled clock: each validation batch takes 10 s (no real waiting), training batches none.
    The fit after warm-up is the timed steps, validation and the epoch ends (checkpoint saves)."""
    _on_a_controlled_clock(train_cfg, run_dir, caplog, monkeypatch, "+data.delay=0", "+data.val_delay=10")
    r = speed_of(run_dir)
    assert r["validations"] == 2 and r["validation_seconds"] >= 2 * 2 * 10  # 2 epochs of 2 val batches
    assert r["batches_per_epoch"] == 5 and r["epoch_end_seconds"] >= 0
    parts = r["train_seconds"] + r["validation_seconds"] + r["epoch_end_seconds"]
    assert parts == pytest.approx(r["fit_seconds_after_warmup"])
    notes = [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("speed: validation")]
    assert len(notes) == 1 and "for epochs of 5 batches" in notes[0]
    assert "trainer.check_val_every_n_epoch=N" in notes[0]


def test_data_wait_diagnosis_stays_quiet_and_the_figures_follow_the_clock(
    train_cfg, run_dir: Path, caplog, monkeypatch
) -> None:
    """On a controlled clock: every optimizer step takes 100 s (no real waiting) and data comes at once, so
    samples/s and the step time are known in advance, whatever the machine's load (the real milliseconds
    a step takes, even on a busy machine, are well under the 2% allowed)."""
    import probes

    monkeypatch.setattr("lightspeed.speed.report.time", probes.CLOCK)
    cfg = train_cfg(
        *TINY, "data.on_device=true", "callbacks.speed_report.warmup_steps=1", "test_after_fit=false"
    )
    with caplog.at_level(logging.INFO):
        train(cfg, [probes.SlowSteps(100.0)])
    r = speed_of(run_dir)
    assert r["data_wait_share"] < 0.01
    assert r["samples_per_s"] == pytest.approx(64 / 100.0, rel=0.02)  # a batch of 64 every 100 s
    assert r["step_ms_mean"] == pytest.approx(100_000, rel=0.02)
    assert r["step_ms_median"] == pytest.approx(100_000, rel=0.02)
    assert not [rec for rec in caplog.records if rec.getMessage().startswith("speed: data loading")]


def _report(**changes) -> dict:
    r = {
        "data_wait_share": 0.5, "recompiles": 0, "step_ms_mean": 10.0, "step_ms_median": 10.0,
        "step_ms_p95": 12.0, "mfu": None, "threads_per_process": 2, "usable_cpus": 2, "devices": 1,
    }  # fmt: skip
    return {**r, **changes}


def test_the_data_wait_remedies_fit_the_device() -> None:
    report = SpeedReport()
    (cpu,) = report._diagnose(_report(), "cpu")
    assert "data.num_workers=auto" in cpu and "data.pin_memory=true" not in cpu
    (gpu, *_) = report._diagnose(_report(), "cuda")
    assert "data.pin_memory=true" in gpu


def test_a_cpu_whose_step_times_scatter_is_told_about_threads() -> None:
    notes = SpeedReport()._diagnose(_report(data_wait_share=0.0, step_ms_p95=60.0), "cpu")
    assert len(notes) == 1 and "1 process(es) x 2 threads on 2 usable CPUs" in notes[0]
    assert "OMP_NUM_THREADS=1" in notes[0]
    quiet = SpeedReport()._diagnose(
        _report(data_wait_share=0.0, step_ms_p95=60.0, threads_per_process=1), "cpu"
    )
    assert quiet == []  # one thread in one process: nothing to oversubscribe


@pytest.mark.parametrize(
    ("name", "model", "bf16"),
    [
        ("NVIDIA H200", "H200", 989e12),
        ("NVIDIA H200 NVL", "H200", 989e12),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989e12),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", "H100 NVL", 835e12),
        ("NVIDIA A100-SXM4-80GB", "A100", 312e12),
        ("NVIDIA A100-PCIE-40GB", "A100", 312e12),
        ("Tesla V100-SXM2-16GB", None, None),
    ],
)
def test_peak_table_resolves_names_as_the_driver_spells_them(
    name: str, model: str | None, bf16: float | None
):
    assert gpu_model(name) == model
    assert peak_flops(name, "bf16") == bf16


@pytest.mark.parametrize(
    ("name", "lightnings"),
    [("NVIDIA H200", None), ("NVIDIA H200 SXM1", 2.0e15)],  # the driver's name; a 2:4-sparse figure
)
def test_lightnings_peak_table_falls_short_where_ours_is_kept(monkeypatch, name: str, lightnings) -> None:
    """Why core/device.py keeps a table: Lightning's `get_available_flops` has no figure for the H200 as
    its driver names it, and a sparse one for its SXM form. When this fails, use Lightning's instead."""
    from lightning.fabric.utilities import throughput

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its "FLOPs not found" warning
        assert throughput.get_available_flops(torch.device("cuda"), torch.bfloat16) == lightnings
    assert peak_flops(name, "bf16") == 989e12


def test_the_peak_follows_the_math_mode() -> None:
    assert [
        math_mode(p, m)
        for p, m in [
            ("bf16-mixed", "high"),
            ("16-mixed", "high"),
            ("32-true", "high"),
            ("32-true", "highest"),
        ]
    ] == ["bf16", "fp16", "tf32", "fp32"]
    assert peak_flops("NVIDIA H200", "tf32") == 494.7e12 and peak_flops("NVIDIA H200", "fp32") == 66.9e12


@pytest.mark.parametrize(("seconds_per_step", "steps_read"), [(0.0, [1, 10]), (1.0, list(range(1, 11)))])
def test_progress_bar_reads_metrics_on_a_clock(train_cfg, monkeypatch, seconds_per_step, steps_read) -> None:
    """refresh_rate=1 (a second): 10 instant steps read the metrics on the first and the last step only;
    10 steps a second apart read them on each (and the epoch's end once more). Lightning's own bar reads
    them after every step."""
    from lightspeed.speed import progress
    from lightspeed.speed.progress import ProgressBar

    reads: list[int] = []
    real = ProgressBar.get_metrics

    def counting(self, trainer, pl_module):
        if trainer.training:
            reads.append(trainer.global_step)
        return real(self, trainer, pl_module)

    clock = iter(range(10**6))
    monkeypatch.setattr(ProgressBar, "get_metrics", counting)
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock) * seconds_per_step)
    result = train(
        train_cfg(
            "debug=limit",
            "callbacks.speed_report.summary_depth=0",
            "callbacks.rich_progress_bar.refresh_rate=1",
            "++trainer.limit_train_batches=10",
            "++trainer.limit_val_batches=0",
            "trainer.max_epochs=1",
            "trainer.num_sanity_val_steps=0",
            "test_after_fit=false",
        )
    )
    assert result.trainer.global_step == 10
    assert reads == [*steps_read, 10]


def test_stock_callbacks_keep_lightnings_state_key_and_build_it_once(monkeypatch) -> None:
    from lightning.pytorch import callbacks as stock

    from lightspeed.callbacks import EarlyStopping, ModelCheckpoint

    ours, theirs = ModelCheckpoint(monitor="val/loss", mode="min"), stock.ModelCheckpoint(monitor="val/loss")
    assert ours.state_key == theirs.state_key  # checkpoints written by either load into the other
    assert EarlyStopping(monitor="val/loss").state_key == stock.EarlyStopping(monitor="val/loss").state_key
    calls: list[dict] = []
    build_key = lambda self, **kw: calls.append(kw) or "k"  # noqa: E731
    monkeypatch.setattr(stock.ModelCheckpoint, "_generate_state_key", build_key)
    fresh = ModelCheckpoint(monitor="val/loss")
    assert [fresh.state_key for _ in range(6)] == ["k"] * 6 and len(calls) == 1


def test_model_checkpoint_skips_per_step_checks_and_still_saves_every_n_train_steps(
    train_cfg, run_dir: Path, monkeypatch
) -> None:
    """The per-step shortcut applies only when no step or time interval is set."""
    from lightning.pytorch.callbacks import ModelCheckpoint as Stock

    checks: list[str] = []
    real = Stock._should_skip_saving_checkpoint

    def counted(self, trainer):  # records which hook asked
        checks.append(sys._getframe(1).f_code.co_name)
        return real(self, trainer)

    monkeypatch.setattr(Stock, "_should_skip_saving_checkpoint", counted)
    cfg = train_cfg(*LIMIT, "trainer.max_epochs=1", "++trainer.limit_train_batches=6")
    counts = []
    for target in ["lightning.pytorch.callbacks.ModelCheckpoint", "lightspeed.callbacks.ModelCheckpoint"]:
        checks.clear()
        cfg.callbacks.model_checkpoint._target_ = target
        if target.startswith("lightning"):  # Lightning's own writes last.ckpt with each new best
            with open_dict(cfg):
                del cfg.callbacks.model_checkpoint.last_every_s
        cfg.paths.output_dir = str(run_dir / target)  # a fresh run each time, not a resumed one
        train(cfg.copy())
        counts.append(checks.count("on_train_batch_end"))
    assert counts == [6, 0]  # Lightning's checks the trainer after each of the 6 steps
    result = train(
        train_cfg(
            *LIMIT,
            f"paths.output_dir={run_dir / 'every2'}",
            "trainer.max_epochs=1",
            "++trainer.limit_train_batches=4",
            "++trainer.limit_val_batches=0",
            "callbacks.model_checkpoint.monitor=null",
            "callbacks.model_checkpoint.save_top_k=-1",
            "+callbacks.model_checkpoint.every_n_train_steps=2",
            "callbacks.model_checkpoint.filename='step{step}'",
        )
    )
    saved = sorted(p.name for p in Path(result.trainer.checkpoint_callback.dirpath).glob("step*.ckpt"))
    assert saved == ["step2.ckpt", "step4.ckpt"]


@pytest.mark.parametrize(
    "target", ["lightspeed.callbacks.ModelCheckpoint", "lightning.pytorch.callbacks.ModelCheckpoint"]
)
def test_last_checkpoint_follows_every_epoch_even_without_a_new_best(
    train_cfg, run_dir: Path, target: str
) -> None:
    """Lightning 2.6 writes last.ckpt only with a new best, so a run that stops improving would resume
    from an old epoch. mode=max on a falling val/loss: the first epoch stays the best."""
    cfg = train_cfg(
        *TINY,
        "trainer.max_epochs=4",
        "test_after_fit=false",
        "callbacks.early_stopping=null",
        "monitor.metric=val/loss",
        "monitor.mode=max",
        "monitor.check_mode=false",
        f"callbacks.model_checkpoint._target_={target}",
        *([] if target.startswith("lightspeed") else ["~callbacks.model_checkpoint.last_every_s"]),
    )
    train(cfg)
    step = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert (step == 20) == target.startswith("lightspeed"), step  # Lightning's own keeps an older one


@pytest.mark.parametrize(("every_s", "writes"), [(0, [5, 10, 15, 20]), (3600, [5, 20])])
def test_last_checkpoint_is_written_on_its_cadence_and_at_the_end(
    train_cfg, run_dir: Path, monkeypatch, every_s: int, writes: list[int]
) -> None:
    """A small model's epoch can take less time than saving last.ckpt: it is written at most once every
    `last_every_s` (the first epoch's end included), and always at the end: a finished run's last step."""
    from lightspeed.resilience.checkpoint import AtomicCheckpointIO

    saved: list[int] = []
    real = AtomicCheckpointIO.save_checkpoint

    def spy(self, checkpoint, path, storage_options=None):
        if Path(path).name == "last.ckpt":
            saved.append(checkpoint["global_step"])
        return real(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", spy)
    cfg = train_cfg(
        *TINY,
        "trainer.max_epochs=4",
        "test_after_fit=false",
        "callbacks.early_stopping=null",
        f"callbacks.model_checkpoint.last_every_s={every_s}",
    )
    train(cfg)
    assert saved == writes
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 20


@pytest.mark.parametrize("rank_zero_says", [False, True])
def test_last_checkpoint_cadence_follows_rank_zero_s_clock(
    tmp_path: Path, monkeypatch, rank_zero_says
) -> None:
    """A save is collective (every rank enters it): a rank whose own clock says due follows rank 0's."""
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import ModelCheckpoint as Stock

    from lightspeed.callbacks import ModelCheckpoint

    saved: list[int] = []
    monkeypatch.setattr(
        Stock, "_save_last_checkpoint", lambda self, trainer, c: saved.append(trainer.global_step)
    )
    callback = ModelCheckpoint(dirpath=tmp_path, save_last=True, last_every_s=60)
    callback._last_written = (3, time.monotonic() - 61)  # this rank's clock: due
    strategy = SimpleNamespace(broadcast=lambda due: rank_zero_says)
    callback._save_last_checkpoint(SimpleNamespace(world_size=2, global_step=5, strategy=strategy), {})
    assert saved == ([5] if rank_zero_says else [])


def test_empty_per_batch_hooks_are_not_called_and_implemented_ones_are(train_cfg, run_dir: Path) -> None:
    """Lightning profiles every hook call, done or not: the profiler's own record shows which ran."""
    from lightning.pytorch.callbacks import LearningRateMonitor

    class Counter(LearningRateMonitor):  # an extra callback: overrides on_before_zero_grad only
        def on_before_zero_grad(self, *args: object) -> None:
            self.zero_grads = getattr(self, "zero_grads", 0) + 1

    cfg = train_cfg(*TINY, "test_after_fit=false", "trainer.profiler=simple")
    counter = Counter(logging_interval="step")
    result = train(cfg, [counter])
    steps = result.trainer.global_step
    calls = {
        k.replace(Counter.__qualname__, "Counter"): len(v)
        for k, v in result.trainer.profiler.recorded_durations.items()
    }
    assert counter.zero_grads == steps and calls["[Callback]Counter.on_before_zero_grad"] == steps
    assert calls["[Callback]Counter.on_train_batch_start"] == steps  # LearningRateMonitor's own
    assert calls["[Callback]ExactResume.on_train_batch_end"] == steps  # preemption's check
    assert calls["[Callback]NonFiniteGuard.on_train_batch_end"] == steps
    assert "[Callback]NonFiniteGuard.on_before_optimizer_step" not in calls  # action=stop: unused
    for hook in ("on_before_backward", "on_after_backward"):  # no configured callback does one
        assert not any(
            k.startswith("[Callback]") and k.endswith(f".{hook}") and "Counter" not in k for k in calls
        )
        assert calls[f"[Callback]Counter.{hook}"] == steps  # the caller's own callback is left as given
    assert calls["[LightningModule]Classifier.on_train_batch_end"] == steps  # the user's module: as written
    assert not any(
        k.startswith("[Callback]") and "on_validation_batch" in k and "Counter" not in k for k in calls
    )
    assert calls["[LightningModule]Classifier.on_validation_batch_end"] > 0  # Lightning reads its signature
    report = next(cb for cb in result.trainer.callbacks if type(cb).__name__ == "SpeedReport")
    assert report.on_before_backward is None and report.on_train_batch_start is not None


def test_skip_empty_leaves_overridden_and_instance_hooks_alone() -> None:
    import lightning as L

    from lightspeed.compat import hooks

    class Mine(L.Callback):
        def on_after_backward(self, *args: object) -> None: ...

    cb = Mine()
    own = lambda *args: None  # noqa: E731
    cb.on_train_batch_end = own
    skipped = hooks.skip_empty(cb, L.Callback)
    assert "on_after_backward" not in skipped and cb.on_after_backward is not None
    assert "on_train_batch_end" not in skipped and cb.on_train_batch_end is own
    assert "on_before_backward" in skipped and cb.on_before_backward is None


def test_the_user_s_module_is_built_as_written_with_no_hook_or_class_of_ours(train_cfg) -> None:
    """build.model sets nothing on the user's module: its class is their own, no hook is switched off on
    the instance, and it pickles and copies as written."""
    import copy
    import pickle

    from lightspeed.compat.hooks import EVALUATION, TRAINING
    from lightspeed.models.classifier import Classifier
    from lightspeed.run import build

    cfg = train_cfg("model=mlp")
    accel.resolve(cfg)  # the loader's autos, as a run resolves them
    model = build.model(cfg, build.datamodule(cfg)).eval()  # dropout off: copies compute alike
    assert type(model) is Classifier
    assert not {*TRAINING, *EVALUATION} & set(vars(model)), "a hook was set on the user's module"
    for copied in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):  # ddp_spawn, loggers
        assert type(copied) is Classifier and torch.equal(copied(torch.ones(1, 64)), model(torch.ones(1, 64)))


def test_auto_warmup_waits_for_the_step_time_to_settle_and_max_timed_steps_ends_the_run(
    train_cfg, run_dir: Path
) -> None:
    from lightspeed.speed.steady import WINDOW

    overrides = ["callbacks.speed_report.warmup_steps=auto", "+callbacks.speed_report.max_timed_steps=6"]
    cfg = train_cfg(*TINY, *overrides, "test_after_fit=false", "trainer.max_epochs=3", "trainer.min_epochs=0")
    cfg.trainer.limit_train_batches = 1.0  # 19 batches an epoch
    result = train(cfg)
    r = speed_of(run_dir)
    assert r["warmup_steps"] >= 2 * WINDOW and r["warmup_seconds"] > 0
    assert r["timed_steps"] == 6 and result.trainer.global_step == r["warmup_steps"] + 6


def test_the_report_says_batches_and_under_accumulation_optimizer_steps(train_cfg, run_dir: Path) -> None:
    from lightspeed.speed.report import _table

    train(train_cfg(*TINY, "trainer.accumulate_grad_batches=2", "callbacks.speed_report.warmup_steps=2"))
    r = speed_of(run_dir)
    timed = next(row for row in _rows(_table(r)) if row[0] == "timed")[1]
    assert timed.startswith(f"{r['timed_steps']} batches after 2 warm-up batches")
    assert f"({r['timed_steps'] // 2} optimizer steps: accumulate_grad_batches=2)" in timed


def _rows(table) -> list[tuple[str, str]]:
    cells = [list(column.cells) for column in table.columns]
    return list(zip(*cells, strict=True))
