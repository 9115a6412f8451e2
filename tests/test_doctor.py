"""make doctor: runs anywhere, writes the documented JSON, and turns problems into fixes."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest
import torch

from conftest import run_module
from lightspeed import doctor
from lightspeed.doctor import diagnose, driver_verdict

KEYS = {
    "python",
    "platform",
    "torch",
    "lightning",
    "cuda_build",
    "cudnn",
    "nccl",
    "driver",
    "nvidia_device_present",
    "cuda_available",
    "container",
    "gpus",
    "cpu_cores",
    "recommended_num_workers",
    "compile_backend_ok",
    "compile_problem",
    "h2d_gbps",
    "matmul_tflops",
    "warnings",
}


@pytest.mark.slow  # a fresh process that compiles with inductor (~12 s); diagnose() is tested below
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only report")
def test_doctor_on_a_cpu_writes_the_documented_json(tmp_path: Path, capsys) -> None:
    proc = run_module("lightspeed.doctor", "--quick", "--json", str(tmp_path / "doctor.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    facts = json.loads((tmp_path / "doctor.json").read_text())
    assert set(facts) == KEYS
    assert facts["cuda_available"] is False and facts["gpus"] == [] and facts["h2d_gbps"] is None
    assert facts["cpu_cores"] >= 1 and facts["recommended_num_workers"] == 0
    assert facts["matmul_tflops"]["fp32"] > 0
    assert "none usable: training runs on the CPU" in proc.stdout
    # --require-gpu on the same facts (measured once: the compile check alone takes seconds)
    with mock.patch.object(doctor, "collect", return_value=facts), pytest.raises(SystemExit) as exit_:
        raise SystemExit(doctor.main(["--quick", "--require-gpu"]))
    assert exit_.value.code == 1 and "--require-gpu: torch sees no CUDA GPU" in capsys.readouterr().err


def facts(**changes) -> dict:
    base = {
        "torch": "2.13.0",
        "cuda_build": "13.0",
        "driver": "580.1",
        "nvidia_device_present": True,
        "cuda_available": True,
        "gpus": [],
        "h2d_gbps": {"pageable": 10.0, "pinned": 25.0},
        "compile_backend_ok": True,
        "compile_problem": None,
        "matmul_tflops": {"fp32": 50.0, "bf16": 700.0},
    }
    return {**base, **changes}


def test_a_healthy_gpu_machine_has_no_warnings() -> None:
    assert diagnose(facts()) == []


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"cuda_available": False, "cuda_build": None}, "is a CPU build: reinstall torch with CUDA"),
        ({"cuda_available": False}, "CUDA is unavailable to torch"),
        ({"driver": "535.104"}, "driver 535.104 is too old for torch's CUDA 13.0 build (needs >= 580)"),
        ({"h2d_gbps": {"pageable": 10.0, "pinned": 10.5}}, "no faster than pageable"),
        ({"compile_backend_ok": False, "compile_problem": "no compiler"}, "torch.compile does not work here"),
        ({"gpus": [{"name": "Tesla T4", "bf16": False}]}, "precision=auto picks 16-mixed"),
    ],
)
def test_problems_come_with_their_fix(changes: dict, expected: str) -> None:
    notes = diagnose(facts(**changes))
    assert len(notes) == 1 and expected in notes[0]


def test_in_a_container_without_the_host_s_driver_it_says_how_to_pass_the_gpu_in() -> None:
    inside = facts(
        driver=None, nvidia_device_present=False, cuda_available=False, container={"image_cuda": "13.2.0"}
    )
    notes = diagnose(inside)
    assert len(notes) == 1 and "start it with `--gpus all`" in notes[0]
    assert (
        driver_verdict(inside)
        == "the host's NVIDIA driver is not visible here (torch's CUDA 13.0 build needs >= 580)"
    )
    assert diagnose(facts(driver=None, nvidia_device_present=False, cuda_available=False)) == []  # a CPU host


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, "580.1: can run torch's CUDA 13.0 build (needs >= 580)"),
        ({"driver": "575.51"}, "575.51: cannot run torch's CUDA 13.0 build (needs >= 580)"),
        (
            {"cuda_build": "12.8", "driver": "535.104"},
            "535.104: can run torch's CUDA 12.8 build (needs >= 525)",
        ),
        ({"cuda_build": None, "driver": None}, "no nvidia-smi"),
    ],
)
def test_the_driver_row_says_whether_it_can_run_torch_s_cuda(changes: dict, expected: str) -> None:
    assert driver_verdict(facts(**changes)) == expected
