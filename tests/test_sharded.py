"""Sharded checkpoints (resilience/sharded.py, torch.distributed.checkpoint) on the CPU: DDP with the
gloo backend writes them as trainer=fsdp does on GPUs (Lightning 2.6 refuses FSDP on a CPU). Written whole
or not at all, identity and checksums inside, found by resume=auto, loaded without unpickling code,
one file for eval; a run preempted on 2 ranks resumes from one bit-identical to an uninterrupted run."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from conftest import TINY, assert_resumes_exactly, module_env, run_module
from lightspeed.core.config import ConfigError
from lightspeed.resilience import checkpoint, resume, resume_from, sharded
from lightspeed.run.entry import compose_config
from lightspeed.run.restore import load_module
from lightspeed.train import train

SHARDED = [
    "trainer=ddp_cpu",
    "trainer.devices=1",
    "trainer.strategy._target_=lightspeed.resilience.sharded.DDPStrategy",
]


@pytest.fixture(autouse=True)
def _no_process_group_left(monkeypatch) -> Iterator[None]:
    """A run of one DDP rank in this process leaves its process group and MASTER_PORT behind: end the one,
    forget the other (a later `torchrun`-free subprocess would try to listen on that port)."""
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """One finished run (one DDP rank, in this process) with sharded checkpoints, for the module's tests."""
    logs = tmp_path_factory.mktemp("trained") / "logs"
    with pytest.MonkeyPatch.context() as patch:
        for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK"):
            patch.delenv(name, raising=False)
        result = train(compose_config("train", [*TINY, *SHARDED], logs))
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return logs / "train" / "runs" / "test", {k: v.clone() for k, v in result.model.state_dict().items()}


@pytest.fixture
def sharded_run(trained, run_dir: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """`trained`'s run folder, copied to this test's `run_dir` (the tests change it)."""
    shutil.copytree(trained[0], run_dir)
    return run_dir, trained[1]


def test_checkpoints_are_folders_that_check_out_resume_and_become_one_file(
    sharded_run, train_cfg, eval_cfg, tmp_path: Path
) -> None:
    run, weights = sharded_run
    last = run / "checkpoints" / "last.ckpt"
    names = {p.name for p in last.iterdir()}
    assert (
        last.is_dir() and {sharded.META, ".metadata"} <= names and any(n.endswith(".distcp") for n in names)
    )
    assert not list(last.parent.glob(".*"))  # nothing left half-written beside it
    assert resume_from.problem(last) is None
    meta = sharded.read_meta(last)  # plain data (weights_only), with the run's identity
    assert meta["global_step"] == 10 and meta["identity"]["config"]["model"]["_target_"]
    # the same command again: resume=auto finds the folder, there is nothing left to train
    again = train(train_cfg(*TINY, *SHARDED))
    assert again.trainer.global_step == 10
    # eval on one device, no process group, from the folder
    _, _, model = load_module(eval_cfg(f"ckpt_path={last}"))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    # ... and one file for anything else: plain data, the same weights
    out = tmp_path / "one.ckpt"
    assert (
        sharded.main([str(last), str(out)]) == 0
    )  # `python -m lightspeed.resilience.sharded <folder> <file>`
    one = torch.load(out, weights_only=True)
    assert one["identity"] == meta["identity"] and all(
        torch.equal(one["state_dict"][k], v) for k, v in weights.items()
    )


def test_a_preempted_run_resumes_from_its_sharded_checkpoint_bit_identical(train_cfg, tmp_path: Path) -> None:
    """SIGTERM after step 7 (mid second epoch): saved as a folder; the rerun restores weights, optimizer
    states, loop position and the data order from it and ends with an uninterrupted run's weights."""
    exact = [*TINY, *SHARDED, "callbacks.exact_resume.check_every_n_steps=1"]
    assert_resumes_exactly(train_cfg, tmp_path, exact, at=6, steps=10)


def test_a_changed_missing_or_added_file_is_found_and_resume_passes_over_it(sharded_run, train_cfg) -> None:
    run, _ = sharded_run
    last = run / "checkpoints" / "last.ckpt"
    best = next(p for p in last.parent.iterdir() if p.name != "last.ckpt")
    shard = next(last.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit in a weight
    shard.write_bytes(bytes(data))
    assert (
        resume_from.problem(last)
        == f"its file {shard.name} no longer matches its checksum (corrupted on disk?)"
    )
    (best / "extra.distcp").write_bytes(b"")
    assert "files changed since it was written" in resume_from.problem(best)
    (best / "extra.distcp").unlink()
    os.unlink(best / sharded.META)
    assert resume_from.problem(best) == "a sharded checkpoint that was never finished (no meta.pt)"
    with pytest.warns(UserWarning, match="skipping .*last.ckpt: its file"):
        assert resume_from.latest(last.parent, sharded.read_meta(last)["identity"]["config"]) is None


def test_dcp_metadata_that_names_code_is_refused_without_running_it(sharded_run, tmp_path: Path) -> None:
    run, _ = sharded_run
    last = run / "checkpoints" / "last.ckpt"
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (last / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(pickle.UnpicklingError, match="not DCP metadata"):
        sharded.read_dcp_metadata(last)
    assert not marker.exists()


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_dcp_metadata_naming_a_module_attribute_is_refused_too(sharded_run) -> None:
    """Pickle follows dotted names: `metadata.os.system` must not pass as DCP's metadata module."""
    run, _ = sharded_run
    last = run / "checkpoints" / "last.ckpt"
    module, name = b"torch.distributed.checkpoint.metadata", b"os.system"
    global_ = b"\x8c" + bytes([len(module)]) + module + b"\x8c" + bytes([len(name)]) + name + b"\x93"
    crafted = b"\x80\x04" + global_ + b"."  # protocol 4: STACK_GLOBAL of the two strings
    (last / ".metadata").write_bytes(crafted)
    with pytest.raises(pickle.UnpicklingError, match="not DCP metadata"):
        sharded.read_dcp_metadata(last)


def test_dcp_metadata_may_name_torch_s_dtypes_and_nothing_else_of_torch(tmp_path: Path) -> None:
    """The unpickler lets `torch.<name>` through only where it is a dtype: torch.save, torch.load or
    torch.compile named by a crafted `.metadata` are refused, torch.float32 is read."""

    def crafted(name: bytes) -> bytes:  # protocol 4: STACK_GLOBAL of "torch" and `name`
        return b"\x80\x04\x8c\x05torch\x8c" + bytes([len(name)]) + name + b"\x93."

    for name in (b"save", b"load", b"compile", b"Tensor"):
        (tmp_path / ".metadata").write_bytes(crafted(name))
        with pytest.raises(pickle.UnpicklingError, match=rf"names torch\.{name.decode()}, which is not DCP"):
            sharded.read_dcp_metadata(tmp_path)
    (tmp_path / ".metadata").write_bytes(crafted(b"float32"))
    assert sharded.read_dcp_metadata(tmp_path) is torch.float32


def test_values_dcp_stores_as_bytes_load_as_plain_data_only(tmp_path: Path) -> None:
    """DCP keeps what is not a tensor as a torch.save'd blob, which its own planner unpickles freely."""
    marker = tmp_path / "ran"
    folder = tmp_path / "crafted.ckpt"
    dcp.save({"model": {"w": torch.zeros(2), "evil": _RunsCode(marker)}}, checkpoint_id=folder, no_dist=True)
    with pytest.raises(
        pickle.UnpicklingError, match=r"not plain data \(refused, not run\): Weights only load failed"
    ):
        sharded.to_one_file(folder)
    one_line = pytest.raises(ConfigError, match=r"^ckpt_path=.*crafted.ckpt holds Python objects, not plain")
    with one_line, checkpoint.loading(folder):  # as eval and train load it
        sharded.to_one_file(folder)
    assert not marker.exists()


def test_a_crash_between_the_two_renames_leaves_the_previous_checkpoint_found(sharded_run, train_cfg) -> None:
    run, _ = sharded_run
    folder = run / "checkpoints"
    last = folder / "last.ckpt"
    ident = sharded.read_meta(last)["identity"]["config"]
    os.rename(last, folder / ".last.ckpt.old")  # the old one renamed aside; the new one never renamed in
    shutil.copytree(folder / ".last.ckpt.old", folder / ".last.ckpt.partial")
    os.unlink(folder / ".last.ckpt.partial" / sharded.META)
    found = resume_from.latest(folder, ident)
    assert found is not None and last.is_dir() and resume_from.problem(last) is None
    assert not (folder / ".last.ckpt.old").exists()


def test_a_sharded_checkpoint_needs_a_strategy_that_reads_it(sharded_run, train_cfg, run_dir: Path) -> None:
    run, _ = sharded_run
    last = run / "checkpoints" / "last.ckpt"
    with pytest.raises(ConfigError, match=r"ckpt_path .*last.ckpt, a sharded checkpoint: continue it with"):
        resume.start(train_cfg(*TINY, "trainer=cpu", f"ckpt_path={last}", "run_name=other"))


@pytest.mark.slow
def test_two_ranks_preempted_resume_from_their_shards_bit_identical(tmp_path: Path) -> None:
    """2 DDP ranks (gloo): SIGTERM after step 7 on both, each saves its part; the same command continues;
    the weights equal an uninterrupted plain (one-file) DDP run's: the sharded saves before and after the
    resume hold the very weights."""
    sharded_ddp = "trainer.strategy._target_=lightspeed.resilience.sharded.DDPStrategy"
    common = ["trainer=ddp_cpu", *TINY, "callbacks.exact_resume.check_every_n_steps=1"]
    fault = ["+callbacks.fault._target_=probes.Fault", "+callbacks.fault.kind=sigterm"]

    def run(name: str, *overrides: str) -> subprocess.CompletedProcess[str]:
        return run_module(
            "lightspeed.train", *common, *fault, *overrides, f"hydra.run.dir={tmp_path / name}", cwd=tmp_path
        )

    # the rerun is the same command (its identity must match): resumed after step 7, it never meets step 6
    cut = run("cut", sharded_ddp, "+callbacks.fault.step=6")
    assert cut.returncode == 143 and "preempted by SIGTERM: saved" in cut.stderr, cut.stderr[-3000:]
    again = run("cut", sharded_ddp, "+callbacks.fault.step=6")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resume=auto: continuing from" in again.stdout + again.stderr
    assert run("plain", "+callbacks.fault.step=1000").returncode == 0
    final = sharded.to_one_file(tmp_path / "cut" / "checkpoints" / "last.ckpt")
    reference = torch.load(tmp_path / "plain" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert final["global_step"] == 10 and final["state_dict"].keys() == reference.keys()
    for key, value in reference.items():
        assert torch.equal(final["state_dict"][key], value), key


FSDP_ON_A_GPU = pytest.param(
    ["trainer=fsdp"],
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(
            not torch.cuda.is_available(), reason="needs a CUDA GPU: scripts/gpu_check.sh runs it"
        ),
    ],
    id="fsdp-gpu",
)
DDP_ON_THE_CPU = pytest.param([SHARDED[0], SHARDED[2]], marks=pytest.mark.slow, id="sharded-ddp-cpu")


@pytest.mark.parametrize("strategy", [FSDP_ON_A_GPU, DDP_ON_THE_CPU])
def test_a_killed_run_resumes_from_its_sharded_checkpoint(tmp_path: Path, strategy: list[str]) -> None:
    """One process (trainer=fsdp on a GPU; on the CPU the sharded DDP, which shows here that the test can
    pass and fail): SIGKILLed in its second epoch, after the first epoch's checkpoint; the same command
    resumes from the sharded folder and ends with the weights of an uninterrupted run."""
    common = [*strategy, "trainer.devices=1", "model=mlp", "trainer.deterministic=true", *TINY]
    common += ["+callbacks.pause._target_=probes.Pause", "+callbacks.pause.seconds=0.5"]
    env = module_env()
    command = [sys.executable, "-m", "lightspeed.train", *common, f"hydra.run.dir={tmp_path / 'cut'}"]
    first = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    meta = tmp_path / "cut" / "checkpoints" / "last.ckpt" / sharded.META
    deadline = time.monotonic() + 240
    while not meta.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # into the second epoch
    first.kill()
    assert first.wait() == -9, first.stderr.read().decode()[-3000:]
    assert sharded.read_meta(meta.parent)["global_step"] == 5
    again = run_module("lightspeed.train", *command[3:], cwd=tmp_path)
    assert again.returncode == 0 and "resume=auto: continuing from" in again.stdout + again.stderr, (
        again.stderr
    )
    whole = run_module("lightspeed.train", *common, f"hydra.run.dir={tmp_path / 'whole'}", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    final = {
        name: sharded.to_one_file(tmp_path / name / "checkpoints" / "last.ckpt") for name in ("cut", "whole")
    }
    assert final["cut"]["global_step"] == final["whole"]["global_step"] == 10
    for key, value in final["whole"]["state_dict"].items():
        assert torch.equal(final["cut"]["state_dict"][key], value), key


#: What a disk, an editor or an attacker might leave of a file of a sharded checkpoint's folder.
_FILE_CHANGES = ("empty", "torn", "flipped", "deleted", "a folder", "another file's bytes")
#: What an entry of meta.pt might become (saved again as plain data).
_HOSTILE = [None, "", "x" * 10_000, -1, 10**30, float("nan"), [], {}, {"a": [1, None]}, True]
_SHARDED_CASES = [(f, c) for f in ("meta.pt", ".metadata", "shard") for c in _FILE_CHANGES] + [
    ("meta.pt entry", str(i)) for i in range(12)
]


def _mutate_sharded(folder: Path, target: str, change: str) -> None:
    """One file of the folder changed as `change` says, or one entry of meta.pt replaced (drawn, seeded)."""
    if target == "meta.pt entry":
        import random

        meta = torch.load(folder / sharded.META, weights_only=True)
        rng = random.Random(int(change))
        key = rng.choice(sorted(meta))
        meta[key] = rng.choice(_HOSTILE)
        if key != checkpoint.CHECKSUM_KEY:  # re-signed, as one who knows the format would: the reads meet it
            meta[checkpoint.CHECKSUM_KEY] = checkpoint.checksum(meta)
        torch.save(meta, folder / sharded.META)
        return
    path = next(folder.glob("*.distcp")) if target == "shard" else folder / target
    data = path.read_bytes()
    if change == "deleted" or change == "a folder":
        path.unlink()
        if change == "a folder":
            path.mkdir()
        return
    other = next(p for p in folder.iterdir() if p.is_file() and p != path).read_bytes()
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    path.write_bytes(
        {"empty": b"", "torn": data[: len(data) // 2], "flipped": bytes(flipped)}.get(change, other)
    )


@pytest.mark.parametrize(("target", "change"), _SHARDED_CASES, ids=[f"{t}-{c}" for t, c in _SHARDED_CASES])
def test_a_mutated_sharded_checkpoint_is_passed_over_loaded_or_one_line(
    target, change, sharded_run, train_cfg, capsys
) -> None:
    """Each file of last.ckpt's folder torn, emptied, flipped, deleted, replaced by a folder or another file's
    bytes, or an entry of meta.pt given a hostile value: eval's load of it and a rerun's resume end in a
    result (the resume passing over it, or loading it whole) or one line, never a traceback (issue 32)."""
    from test_fuzz_records import outcome

    run, _ = sharded_run
    last = run / "checkpoints" / "last.ckpt"
    _mutate_sharded(last, target, change)
    capsys.readouterr()
    eval_cfg = compose_config("eval", [f"ckpt_path={last}"], run.parent.parent.parent)
    rerun = train_cfg(*TINY, *SHARDED, "run_name=test", f"paths.output_dir={run}")
    for read in (lambda: load_module(eval_cfg), lambda: resume.start(rerun)):
        try:
            outcome(read, capsys)
        except AssertionError as failed:
            raise AssertionError(f"{target} {change}: {failed}") from None
