"""Checkpoints: written whole or not at all; loading never runs code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from conftest import TINY, run_module
from lightspeed.resilience.checkpoint import AtomicCheckpointIO
from lightspeed.train import train


def test_save_replaces_the_file_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "ckpts" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": torch.tensor(1)}, path)
    io.save_checkpoint({"step": torch.tensor(2)}, path)
    assert torch.load(path, weights_only=True)["step"].item() == 2
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]


def test_a_save_that_fails_midway_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": torch.tensor(1)}, path)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)  # fails after the temporary file was written
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"step": torch.tensor(2)}, path)
    assert torch.load(path, weights_only=True)["step"].item() == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_training_writes_checkpoints_through_the_atomic_writer(train_cfg, run_dir: Path) -> None:
    result = train(train_cfg(*TINY, "trainer.max_epochs=1", "test_after_fit=false"))
    assert isinstance(result.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    assert not list((run_dir / "checkpoints").glob("*.tmp"))


class Payload:
    """Unpickling this creates a marker file: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_with_a_pickle_payload_is_refused(train_cfg, tmp_path: Path, capsys) -> None:
    """Through the command line for eval, in process for train (the same loading code)."""
    from lightspeed.train import train

    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}, "payload": Payload(marker)}, evil)
    proc = run_module(
        "lightspeed.eval", f"ckpt_path={evil}", f"paths.log_dir={tmp_path / 'logs'}", cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    with pytest.raises(SystemExit) as exit_:
        train(train_cfg(f"ckpt_path={evil}", "debug=limit"))
    assert exit_.value.code == 2
    assert not marker.exists()  # never executed
    for err in (proc.stderr, capsys.readouterr().err):
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "holds Python objects, not plain data, and was not loaded" in errors[0]


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 truncated zip"])
def test_an_empty_or_truncated_checkpoint_is_a_one_line_error(tmp_path: Path, content: bytes) -> None:
    from lightspeed.eval import run as evaluate
    from lightspeed.run.entry import compose_config

    bad = tmp_path / "last.ckpt"
    bad.write_bytes(content)
    with pytest.raises(SystemExit) as exit_:
        evaluate(compose_config("eval", [f"ckpt_path={bad}"], tmp_path / "logs"))
    assert exit_.value.code == 2
