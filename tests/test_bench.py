"""make bench: runs configurations, writes bench.md and a real PNG; refuses bad arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_module, run_script
from test_cli import make_dry_run


@pytest.mark.slow
def test_bench_prints_the_hand_loop_and_the_presets_side_by_side(tmp_path: Path) -> None:
    """`make bench ARGS="--configs hand,off,default,max"` on a CPU: every row, the ratios, the spread."""
    out = tmp_path / "bench"
    proc = run_module(
        "lightspeed.bench",
        *("--configs", "hand,off,default,max", "--steps", "8", "--warmup", "2", "--repeats", "2"),
        *("--out", str(out), "model=mlp", "accel.compile_backend=eager"),
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (out / "bench.md").read_text()
    cells = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| ")]
    rows = {c[0].strip(): c for c in cells[1:]}  # after the header row
    assert list(rows) == ["hand", "off", "default", "max"], table
    assert rows["off"][4].strip() == "1.00x" and rows["default"][5].strip().endswith("x")  # vs off, vs hand
    assert all(r[3].strip().endswith("(2x)") for r in rows.values())  # the spread over both repeats
    assert all(r[7].strip().startswith("2 steps") for r in rows.values())  # the warm-up, apart
    assert "overrides: model=mlp" in table
    png = (out / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(out / "bench.png").shape[0] > 100
    assert (out / "runs" / "hand-1" / "speed.json").is_file()


def test_bench_refuses_unknown_configs_and_bad_arguments(tmp_path: Path, capsys) -> None:
    from lightspeed.bench import main

    for args, message in (
        (["--configs", "off,turbo"], "--configs turbo: unknown; use any of hand+off, hand"),
        (["--warmup", "soon"], "--warmup soon: use auto or a number of steps"),
        (["--steps", "0"], "--steps and --repeats must be at least 1"),
    ):
        assert main([*args, "--out", str(tmp_path)]) == 2
        assert capsys.readouterr().err.startswith(f"error: {message}")


@pytest.mark.slow
def test_profile_script_writes_a_trace_and_an_operator_table(tmp_path: Path) -> None:
    proc = run_script("profile_steps.py", "--out", str(tmp_path), "--skip", "3", "--steps", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "aten::" in (tmp_path / "ops.txt").read_text()
    assert (tmp_path / "trace.json").stat().st_size > 1000


def test_make_bench_passes_overrides_and_options() -> None:
    line = make_dry_run("bench", "data=synthetic", "ARGS=--steps 20 --configs off,max")
    assert line.endswith("-m lightspeed.bench 'data=synthetic' --steps 20 --configs off,max"), line


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


def test_a_bench_stopped_early_leaves_the_table_of_every_run_so_far(tmp_path: Path, monkeypatch) -> None:
    """A GPU lease's limit cut two benches short before their first round ended, and they left no table:
    it is rewritten after every configuration's run."""
    from lightspeed import bench

    def fake_run(name: str, user: list[str], steps: int, warmup: str, run_dir: Path) -> dict:
        if name == "max":  # the third run: what is on disk now is what a killed bench leaves
            raise KeyboardInterrupt
        return {"name": name, "overrides": bench.CONFIGS[name][0], "samples_per_s": 100.0, "warmup_steps": 3}

    monkeypatch.setattr(bench, "run_config", fake_run)
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--configs", "hand,off,max", "--repeats", "2", "--out", str(tmp_path)])
    table = (tmp_path / "bench.md").read_text()
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")]
    assert rows[1:] == ["hand", "off"], table  # after the header row
    assert "round 1 of 2" in (tmp_path / "bench.md").read_text()
