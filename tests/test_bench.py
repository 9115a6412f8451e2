"""make bench: runs configurations, writes bench.md and a real PNG; refuses bad arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_module
from test_cli import make_dry_run


@pytest.mark.slow
def test_bench_with_two_configs_writes_markdown_and_a_png(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = run_module(
        "lightspeed.bench",
        "--configs",
        "off,off+on_device",
        "--steps",
        "8",
        "--warmup",
        "2",
        "--out",
        str(out),
        "model=mlp",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (out / "bench.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| off")]
    assert [r.split("|")[1].strip() for r in rows] == ["off", "off+on_device"]
    assert "| 1.00x |" in rows[0] and "overrides: model=mlp" in table
    png = (out / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(out / "bench.png").shape[0] > 100
    assert (out / "runs" / "off" / "speed.json").is_file()


def test_bench_refuses_unknown_configs_and_no_timed_steps(tmp_path: Path) -> None:
    proc = run_module("lightspeed.bench", "--configs", "off,turbo", "--out", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2 and "--configs turbo: unknown; use any of off, default, max" in proc.stderr
    proc = run_module(
        "lightspeed.bench", "--steps", "5", "--warmup", "5", "--out", str(tmp_path), cwd=tmp_path
    )
    assert proc.returncode == 2 and "leaves no timed step" in proc.stderr


def test_make_bench_passes_overrides_and_options() -> None:
    line = make_dry_run("bench", "data=synthetic", "ARGS=--steps 20 --configs off,max")
    assert line.endswith("-m lightspeed.bench 'data=synthetic' --steps 20 --configs off,max"), line
