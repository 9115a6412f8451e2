"""On a CUDA GPU (`pytest -m gpu`; scripts/gpu_check.sh runs them on the lent H200), what decides speed
there, checked where it happens: no host-device sync in a steady training step (torch's sync debug mode
set to `error`: the first sync raises where it is made), no torch.compile recompile once training runs
(inductor, the real backend), and channels_last and bf16 in effect in the convolutions with `auto`
resolved on the GPU. Elsewhere they are skipped, with the reason. The probes they use are shown able to
fail here, on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightspeed.run.entry import compose_config
from lightspeed.train import train
from probes import CompileProbe, LayoutProbe, SyncErrors

QUIET = ["test_after_fit=false", "callbacks.speed_report.summary_depth=0"]
# As tests/test_steady_state.py: the logger, the non-finite guard and the speed report's one sync fall on
# the same steps (every 10th); the bar is redrawn at every step but reads values only on those.
CADENCE = [
    "trainer.log_every_n_steps=10",
    "callbacks.nonfinite.check_every_n_steps=10",
    "callbacks.speed_report.warmup_steps=9",
    "callbacks.rich_progress_bar.refresh_rate=100000",
]
ON_A_GPU = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: scripts/gpu_check.sh runs it on one"
)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()  # no shapes remembered from another test's run


@pytest.mark.gpu
@ON_A_GPU
@pytest.mark.parametrize(
    "preset",
    [["accel=default"], ["accel=default", "data.on_device=false"], ["accel=max"]],
    ids=["default-on-device", "default-pinned-loader", "max-compiled"],
)
def test_a_steady_step_on_the_gpu_never_syncs_and_never_recompiles(train_cfg, preset: list[str]) -> None:
    errors, compiles = SyncErrors(), CompileProbe()
    result = train(
        train_cfg("trainer=gpu", "trainer.max_epochs=3", *CADENCE, *QUIET, *preset), [errors, compiles]
    )
    assert result.trainer.strategy.root_device.type == "cuda"
    loader = type(result.trainer.train_dataloader).__name__  # on_device=auto: the digits fit on any GPU
    assert loader == ("ResumableDataLoader" if "data.on_device=false" in preset else "DeviceLoader"), loader
    assert errors.clean_batches >= 30, "too few steady steps for the test to mean anything"
    if "accel=max" in preset:  # compiled at the first step, never again (drop_last: one batch shape)
        assert compiles.train[0] >= 1 and sum(compiles.train[1:]) == 0, compiles.train
    else:
        assert sum(compiles.train) == 0


@pytest.mark.gpu
@ON_A_GPU
def test_channels_last_and_bf16_are_in_effect_on_the_gpu(train_cfg) -> None:
    """accel=default's `auto`s on a GPU: bf16-mixed (every GPU since Ampere) and channels_last for a net
    with convolutions; the convolution sees NHWC input and weights and computes in bfloat16."""
    probe = LayoutProbe()
    train(train_cfg("trainer=gpu", "trainer.max_epochs=1", *QUIET, "accel=default"), [probe])
    assert probe.seen == {
        "device": "cuda",
        "input_channels_last": True,
        "weight_channels_last": True,
        "output_dtype": torch.bfloat16,
    }


def test_the_layout_probe_sees_what_the_settings_do_on_the_cpu(tmp_path: Path) -> None:
    """The probe the GPU test trusts, shown to see both outcomes: accel=default on a CPU resolves to NCHW
    and fp32; channels_last and bf16-mixed asked for explicitly are seen in effect."""
    plain, asked = LayoutProbe(), LayoutProbe()
    run = ["trainer=cpu", "trainer.max_epochs=1", "++trainer.limit_train_batches=3", *QUIET]
    train(compose_config("train", [*run, "accel=default"], tmp_path / "plain"), [plain])
    assert plain.seen == {
        "device": "cpu",
        "input_channels_last": False,
        "weight_channels_last": False,
        "output_dtype": torch.float32,
    }
    bf16_nhwc = ["accel.channels_last=true", "trainer.precision=bf16-mixed"]
    train(compose_config("train", [*run, *bf16_nhwc], tmp_path / "asked"), [asked])
    assert asked.seen == {
        "device": "cpu",
        "input_channels_last": True,
        "weight_channels_last": True,
        "output_dtype": torch.bfloat16,
    }
