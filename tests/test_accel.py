"""Each acceleration knob, read back from the real state after setup: torch flags, memory formats,
the compiled module, DataLoader attributes, optimizer flags. GPU-only knobs are no-ops on a CPU."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from unittest import mock

import pytest
import torch

from conftest import TINY
from lightspeed.core import device
from lightspeed.data import DigitsDataModule
from lightspeed.speed import accel
from lightspeed.train import train
from probes import BatchProbe

FIT_ONLY = [*TINY, "trainer.max_epochs=1", "test_after_fit=false", "++trainer.enable_checkpointing=false"]


def test_presets_compose_to_what_they_promise(train_cfg) -> None:
    off, default, fast = (train_cfg(f"accel={p}") for p in ("off", "default", "max"))
    assert (off.trainer.precision, off.data.num_workers, off.data.pin_memory, off.accel.compile) == (
        "32-true",
        0,
        False,
        False,
    )
    assert (default.trainer.precision, default.data.num_workers, default.data.pin_memory) == (
        "auto",
        "auto",
        "auto",
    )
    assert default.accel.matmul_precision == "high" and default.data.persistent_workers is True
    assert (fast.accel.channels_last, fast.accel.compile, fast.accel.optimizer_impl, fast.data.on_device) == (
        True,
        True,
        "fused",
        "auto",
    )
    assert (default.data.on_device, default.accel.channels_last, default.data.drop_last) == (
        "auto",
        "auto",
        True,
    )
    assert train_cfg().trainer.precision == "auto"  # accel=default is the default
    assert (off.accel.flush_denormal, default.accel.flush_denormal) == (False, "auto")


def test_auto_values_on_a_cpu(train_cfg) -> None:
    cfg = train_cfg("trainer.accelerator=cpu")
    assert accel.resolve(cfg) == []
    assert cfg.data.num_workers == 0  # workers would take the cores that compute
    assert (cfg.trainer.precision, cfg.trainer.benchmark, cfg.data.pin_memory, cfg.data.non_blocking) == (
        "32-true",
        False,
        False,
        False,
    )
    assert cfg.accel.flush_denormal is device.can_flush()


@pytest.mark.parametrize(("bf16", "expected"), [(True, "bf16-mixed"), (False, "16-mixed")])
def test_auto_values_on_a_gpu(train_cfg, monkeypatch, bf16: bool, expected: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16 and not including_emulation
    )
    cfg = train_cfg()
    accel.resolve(cfg)
    assert (cfg.trainer.precision, cfg.trainer.benchmark, cfg.data.pin_memory, cfg.data.non_blocking) == (
        expected,
        True,
        True,
        True,
    )
    assert cfg.accel.flush_denormal is False  # the GPU's math does not go through the CPU's mode


def test_gpu_only_knobs_on_a_cpu_are_no_ops_with_one_info_line(train_cfg, caplog) -> None:
    probe = BatchProbe()
    with caplog.at_level(logging.INFO):
        result = train(
            train_cfg(
                *FIT_ONLY,
                "trainer.accelerator=cpu",
                "data.on_device=false",  # the DataLoader path, where pinning would apply
                "data.pin_memory=true",
                "data.non_blocking=true",
                "trainer.benchmark=true",
            ),
            [probe],
        )
    lines = [r.getMessage() for r in caplog.records if "no effect here" in r.getMessage()]
    assert lines == [
        "cpu run: no effect here, so left off: trainer.benchmark=true; data.pin_memory=true; "
        "data.non_blocking=true"
    ]
    assert result.trainer.train_dataloader.pin_memory is False


def test_matmul_precision_reaches_torch(train_cfg) -> None:
    train(train_cfg(*FIT_ONLY, "accel.matmul_precision=medium"))
    assert torch.get_float32_matmul_precision() == "medium"


def test_deterministic_reaches_torch_and_turns_auto_benchmark_off(train_cfg, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # where benchmark=auto would be on
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    cfg = train_cfg("trainer.deterministic=true")
    accel.resolve(cfg)
    assert cfg.trainer.benchmark is False
    monkeypatch.undo()
    train(train_cfg(*FIT_ONLY, "trainer.deterministic=true"))
    # deterministic algorithms everywhere, cuDNN's included; no autotuning
    assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark is False


@pytest.mark.parametrize("on", [True, False])
def test_channels_last_reaches_weights_and_inputs(train_cfg, on: bool) -> None:
    probe = BatchProbe()
    rgb = ["data=synthetic", "data.num_samples=512", "data.shape=[3,16,16]"]  # 1 channel: both formats alike
    train(train_cfg(*FIT_ONLY, *rgb, f"accel.channels_last={str(on).lower()}"), [probe])
    assert all(s["weight_channels_last"] is on and s["input_channels_last"] is on for s in probe.steps)


def test_compile_compiles_the_module_s_forward(train_cfg) -> None:
    """The LightningModule's forward, whatever its attributes (its steps call it: `self(x)`); the steps
    around it stay eager."""
    from torch._dynamo.utils import counters

    before = counters["frames"]["total"]
    result = train(train_cfg(*FIT_ONLY, "model=mlp", "accel.compile=true", "accel.compile_backend=eager"))
    assert "forward" in vars(result.model) and result.model._compiled_call_impl is None
    assert counters["frames"]["total"] > before  # and the training steps ran through it
    assert not any("_orig_mod" in k for k in result.model.state_dict())


def test_compile_falls_back_with_one_line_when_the_backend_fails(train_cfg, caplog) -> None:
    with pytest.warns(UserWarning, match=r"backend fails here .*; training uncompiled"):
        result = train(
            train_cfg(
                *FIT_ONLY,
                "model=mlp",
                "accel.compile=true",
                "accel.compile_backend=relu_compile_error_TESTING_ONLY",
            )
        )
    assert result.model.net._compiled_call_impl is None
    assert result.trainer.global_step == 5  # and it trained


def test_unknown_compile_backend_is_a_config_error(train_cfg) -> None:
    from lightspeed.core.config import ConfigError, validate_train

    with pytest.raises(
        ConfigError, match=r"^accel\.compile_backend='nope' is invalid: use a torch\.compile backend"
    ):
        validate_train(train_cfg("accel.compile_backend=nope"))


@pytest.mark.parametrize(
    ("impl", "flags"),
    [
        ("fused", {"fused": True}),
        ("foreach", {"foreach": True}),
        ("loop", {"foreach": False}),
        ("torch", {"fused": None, "foreach": None}),
        ("auto", {"fused": True}),  # on the CPU
    ],
)
def test_optimizer_impl_reaches_the_optimizer(train_cfg, impl: str, flags: dict) -> None:
    result = train(train_cfg(*FIT_ONLY, "trainer.accelerator=cpu", f"accel.optimizer_impl={impl}"))
    defaults = result.trainer.optimizers[0].defaults
    assert {k: defaults.get(k) for k in flags} == flags


@pytest.mark.parametrize("threads", ["1", "auto"])
def test_threads_sets_torch_s_cpu_threads_for_the_run_and_auto_keeps_torch_s(train_cfg, threads: str) -> None:
    before = torch.get_num_threads()
    seen: list[int] = []
    try:
        torch.set_num_threads(2)
        with mock.patch.object(accel.torch, "set_num_threads", wraps=torch.set_num_threads) as setter:
            train(train_cfg(*FIT_ONLY, "trainer.accelerator=cpu", f"accel.threads={threads}"))
            seen = [c.args[0] for c in setter.call_args_list]
            after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert (seen, after) == (([1], 1) if threads == "1" else ([], 2))


def test_optimizer_without_a_fused_kernel_is_left_alone_with_a_note(train_cfg) -> None:
    cfg = train_cfg("model.optimizer.name=RMSprop", "accel.optimizer_impl=fused")
    assert accel.resolve(cfg) == ["accel.optimizer_impl=fused (torch.optim.RMSprop has no fused option)"]
    assert "fused" not in cfg.model.optimizer


def test_loader_knobs_reach_the_dataloader(train_cfg) -> None:
    result = train(
        train_cfg(
            *FIT_ONLY,
            "data.num_workers=2",
            "data.persistent_workers=true",
            "data.prefetch_factor=4",
            "data.pin_memory=false",
        )
    )
    loader = result.trainer.train_dataloader
    assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor, loader.pin_memory) == (
        2,
        True,
        4,
        False,
    )


def test_non_blocking_reaches_the_host_to_device_copy() -> None:
    seen = []
    real_to = torch.Tensor.to

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("non_blocking"))
        return real_to(self, *args, **kwargs)

    batch = (torch.zeros(2, 1, 8, 8), torch.zeros(2, dtype=torch.long))
    for knob, expected in ((True, True), (False, False)):  # `auto` is resolved by accel, before
        seen.clear()
        with mock.patch.object(torch.Tensor, "to", spy):
            DigitsDataModule(non_blocking=knob).transfer_batch_to_device(batch, torch.device("cpu"), 0)
        assert seen == [expected, expected]


def test_gradient_clipping_bounds_the_gradient_norm(train_cfg) -> None:
    probe = BatchProbe()
    train(train_cfg(*FIT_ONLY, "trainer.gradient_clip_val=0.01"), [probe])
    norms = [s["grad_norm"] for s in probe.steps]
    assert len(norms) == 5 and max(norms) <= 0.01 + 1e-6


def test_max_preset_trains_on_cpu_with_device_resident_data(train_cfg) -> None:
    probe = BatchProbe()
    rgb = ["data=synthetic", "data.num_samples=512", "data.shape=[3,16,16]"]
    result = train(train_cfg(*FIT_ONLY, *rgb, "accel=max", "accel.compile_backend=eager"), [probe])
    assert type(result.trainer.train_dataloader).__name__ == "DeviceLoader"
    assert result.trainer.optimizers[0].defaults["fused"] is True
    assert all(s["input_channels_last"] and s["weight_channels_last"] for s in probe.steps)


def test_auto_optimizer_impl_is_fused_only_on_the_cpu_and_only_where_torch_has_it(train_cfg) -> None:
    cfg = train_cfg("trainer.accelerator=cpu")
    assert accel.resolve(cfg) == [] and cfg.model.optimizer.fused is True
    cfg = train_cfg("trainer.accelerator=cpu", "model.optimizer.name=RMSprop")  # no fused kernel: no note
    assert accel.resolve(cfg) == [] and "fused" not in cfg.model.optimizer
    cfg = train_cfg("trainer.accelerator=cpu", "+model.optimizer.foreach=true")  # the config's own wins
    assert (
        accel.resolve(cfg) == []
        and cfg.model.optimizer.foreach is True
        and "fused" not in cfg.model.optimizer
    )
    cfg = train_cfg("trainer.accelerator=cpu", "accel=off")
    assert accel.resolve(cfg) == [] and not {"fused", "foreach"} & set(cfg.model.optimizer)
    with mock.patch.object(accel, "device_type", return_value="cuda"):
        cfg = train_cfg("trainer.precision=32-true", "trainer.benchmark=false")
        accel.resolve(cfg)
    assert not {"fused", "foreach"} & set(cfg.model.optimizer)  # torch's choice


def test_fused_optimizer_with_clipping_under_mixed_precision_falls_back_to_foreach(train_cfg) -> None:
    cfg = train_cfg("accel=max", "trainer.precision=bf16-mixed", "trainer.gradient_clip_val=1.0")
    notes = accel.resolve(cfg)
    assert cfg.model.optimizer.foreach is True and "fused" not in cfg.model.optimizer
    assert notes == ["accel.optimizer_impl=fused (with gradient clipping and bf16-mixed: foreach)"]


# A fresh process per case, as the command line starts one: each argument is a step, `work` (torch work,
# which starts torch's CPU threads) or a run's `accel.apply_to_torch` with flush_denormal true/false.
FLUSH_PROBE = """
import sys, torch
from omegaconf import OmegaConf
from lightspeed.speed import accel
from lightspeed.core import device
for step in sys.argv[1:]:
    if step == "work":
        torch.full((1 << 18,), 1.0) * 2
    else:
        accel.apply_to_torch(OmegaConf.create({"accel": {"flush_denormal": step == "true"}}))
print(device.thread_modes())
"""
FLUSH_CASES = {
    ("true",): ("flushed", None),  # before any torch work: every thread
    ("false",): ("exact", None),
    ("work", "true"): ("exact", "accel.flush_denormal=true cannot take effect"),  # a notebook
    ("true", "work", "false"): ("flushed", "accel.flush_denormal=false cannot take effect"),  # a -m sweep
}


@pytest.mark.slow  # 4 fresh processes (~15 s); the next test checks a run's result in process
def test_flush_denormal_holds_in_every_cpu_thread_or_in_none() -> None:
    if torch.get_num_threads() < 2 or not device.can_flush():
        pytest.skip("needs 2 CPU threads and a CPU that can flush denormals")
    procs = {
        case: subprocess.Popen(
            [sys.executable, "-c", FLUSH_PROBE, *case],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for case in FLUSH_CASES
    }
    for case, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        modes, line = FLUSH_CASES[case]
        assert out.split()[-1] == modes, case
        # the threads started with the other mode: the run keeps it everywhere, and says so in one line
        said = [ln for ln in (out + err).splitlines() if "cannot take effect" in ln]
        assert said == ([] if line is None else [said[0]]) and (line is None or line in said[0]), (case, said)


def test_a_run_leaves_every_cpu_thread_in_one_mode(train_cfg) -> None:
    """In this test process torch's threads started long ago: whatever a run asks, the main thread ends
    up computing denormals as the pool does."""
    one = device.denormals(1)
    for flush in ("auto", "false", "true"):
        train(train_cfg(*FIT_ONLY, "trainer.accelerator=cpu", f"accel.flush_denormal={flush}"))
        modes = device.thread_modes()
        assert modes != "mixed"
        assert (device.count_denormals(one * 2.0) == 0) is (modes == "flushed")


def test_flush_denormal_resolves_to_what_the_cpu_can_do(train_cfg) -> None:
    cfg = train_cfg("trainer.accelerator=cpu", "accel.flush_denormal=true")
    with mock.patch.object(accel, "can_flush", return_value=False):
        assert accel.resolve(cfg) == ["accel.flush_denormal=true (this CPU cannot flush denormals)"]
        assert cfg.accel.flush_denormal is False
        cfg = train_cfg("trainer.accelerator=cpu")  # auto: quietly off
        assert accel.resolve(cfg) == [] and cfg.accel.flush_denormal is False
    with mock.patch.object(accel, "can_flush", return_value=True):
        cfg = train_cfg("trainer.accelerator=cpu")
        assert accel.resolve(cfg) == [] and cfg.accel.flush_denormal is True


@pytest.mark.parametrize(("gpus", "expected"), [(0, "0"), (1, "1")])
def test_no_nvml_query_per_optimizer_step_without_a_gpu(monkeypatch, gpus: int, expected: str) -> None:
    """Lightning's NVML-based CUDA check re-asks NVML at every optimizer step of a CPU run; without a
    GPU, torch's cached check replaces it. With a GPU, Lightning's fork-safe setting stays."""
    monkeypatch.setenv(device.NVML_CHECK, "1")
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    device.skip_repeated_cuda_probe()
    assert os.environ[device.NVML_CHECK] == expected


def test_channels_last_auto_is_on_only_for_convolutions_on_a_gpu(train_cfg) -> None:
    """On a CUDA run of a conv net (cuDNN's NHWC kernels); never for an MLP (a layout copy a batch for
    nothing) nor on a CPU. The config keeps `auto` (it is read-only once the model is built)."""
    from lightspeed.models.nets import build_net

    cnn = build_net({"name": "cnn"}, input_shape=[1, 8, 8], num_outputs=10)
    mlp = build_net({"name": "mlp"}, input_shape=[1, 8, 8], num_outputs=10)
    for accelerator, net, expected in (("gpu", cnn, True), ("gpu", mlp, False), ("cpu", cnn, False)):
        cfg = train_cfg(f"trainer.accelerator={accelerator}")
        assert cfg.accel.channels_last == "auto"
        assert accel.resolve_channels_last(cfg, net) is expected and cfg.accel.channels_last == "auto"
    assert accel.resolve_channels_last(train_cfg("accel=max", "trainer.accelerator=cpu"), mlp) is True


def test_auto_num_workers_shares_the_cpus_among_devices(monkeypatch) -> None:
    monkeypatch.setattr("lightspeed.speed.accel.cpu_count", lambda: 32)
    assert accel.auto_num_workers(1) == 8  # capped
    assert accel.auto_num_workers(4) == 7
    assert accel.auto_num_workers(32) == 0
    monkeypatch.setattr("lightspeed.speed.accel.cpu_count", lambda: 2)
    assert accel.auto_num_workers(1) == 1
    assert accel.auto_num_workers(1, "cpu") == 0  # workers would compete with the computation for the cores


def test_every_loader_auto_is_resolved_once_for_the_run_s_devices(train_cfg, monkeypatch) -> None:
    """accel is the one resolver: the DataModule and the Trainer receive concrete values."""
    monkeypatch.setattr("lightspeed.speed.accel.cpu_count", lambda: 16)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    cfg = train_cfg("trainer=ddp")  # every visible GPU: 4 processes share the 16 CPUs
    accel.resolve(cfg)
    assert (cfg.data.num_workers, cfg.data.pin_memory, cfg.data.non_blocking) == (3, True, True)
    assert (cfg.trainer.precision, cfg.trainer.benchmark) == ("bf16-mixed", True)
    loader = {k: v for k, v in cfg.data.items() if k in accel.LOADER_KNOBS and k != "on_device"}
    assert "auto" not in loader.values()  # on_device=auto is decided where the data's size is known
    from lightspeed import ENGINE_CONF

    trainer_files = "".join(p.read_text() for p in (ENGINE_CONF / "trainer").glob("*.yaml"))
    assert "precision:" not in trainer_files and "benchmark:" not in trainer_files  # the accel preset's
