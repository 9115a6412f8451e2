"""make bench: runs configurations, writes bench.md and a real PNG; refuses bad arguments."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import run_module, run_script
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


def test_hotpath_bench_times_each_piece_old_against_new(tmp_path: Path) -> None:
    proc = run_script("bench_hotpath.py", "--repeats", "1", "--calls", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = [
        line.split("|")[1:-1]
        for line in proc.stdout.splitlines()
        if line.startswith("| ") and "us)" not in line
    ]
    assert len(rows) == 9  # on a CPU: every row
    assert all(float(old) > 0 and float(new) > 0 for _, old, new, _ in rows)
    removed = re.search(r"inherited empty: (\d+) calls a step", proc.stdout)
    assert removed and int(removed[1]) > 20  # most of the default callbacks' per-batch hooks are empty


def test_denormal_bench_compares_exact_and_flushed_in_fresh_processes(tmp_path: Path) -> None:
    proc = run_script("bench_denormal.py", "--steps", "6", "--window", "3", "--hidden", "32", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if re.match(r"\| \d", line)]
    assert [int(r[0]) for r in rows] == [3, 6]
    assert all(float(a) > 0 and float(b) > 0 for _, a, b in rows)
    assert re.search(r"exact: [\d,]+ of [\d,]+ momentum values denormal", proc.stdout), proc.stdout


@pytest.mark.slow
def test_overhead_bench_reports_every_row_against_the_bare_trainer(tmp_path: Path) -> None:
    proc = run_script(
        "bench_overhead.py",
        *("--steps", "12", "--warmup", "4", "--repeats", "1", "--models", "small", "--variants", "6,7,8"),
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    for label in ("hand-written loop", "bare Trainer", "Lightspeed default", "bare, manual optimization"):
        assert any(k.startswith(label) for k in rows), (label, proc.stdout)
    assert rows["bare Trainer"].split("|")[5].strip() == "+0"  # its paired difference from itself
