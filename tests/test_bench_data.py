"""scripts/bench_data.py as `make bench-data` runs it, on a small folder: every data path gets a figure."""

from __future__ import annotations

import importlib.util
import re
import time
from pathlib import Path

import pytest

from conftest import REPO, run_script


@pytest.mark.slow  # over 9 s on the 2-core CI machine: make test stays within 4 minutes
def test_the_data_paths_bench_measures_every_path_on_the_same_images(tmp_path: Path) -> None:
    args = ("--repeats", "1", "--seconds", "0.05", "--images", "160", "--workers", "0")
    start = time.perf_counter()
    proc = run_script("bench_data.py", *args, cwd=tmp_path)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = dict(re.findall(r"^\| (in memory|files|streamed) .*?\| 0 \| ([\d,]+) \|", proc.stdout, re.M))
    streamed = {"streamed"} if importlib.util.find_spec("litdata") else set()  # the streaming extra
    assert set(rows) == {"in memory", "files", *streamed}, proc.stdout
    # each path timed at least one whole epoch of the training split (128 of the 160 images) inside the
    # script's own lifetime: a rate below that is miscounted (milliseconds taken for seconds, a sample
    # counted per batch); a rate too high cannot be told from a fast machine here
    assert all(int(rate.replace(",", "")) >= 128 / wall for rate in rows.values()), (wall, proc.stdout)
    assert "| digits |" in proc.stdout and REPO.exists()
