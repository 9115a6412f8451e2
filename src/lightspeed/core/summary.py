"""One summary for the person at the terminal, and the same facts as JSON beside the run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_only
from rich.console import Console
from rich.table import Table

SUMMARY_FILE = "summary.json"


@rank_zero_only
def write(run_dir: Path, facts: dict[str, Any], metrics: dict[str, float]) -> None:
    """`summary.json` in `run_dir`, whole or not at all (a temporary file of its own, then a rename): a
    reader never finds half of one."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{SUMMARY_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({**facts, "metrics": metrics}, indent=2, default=str) + "\n")
    os.replace(tmp, run_dir / SUMMARY_FILE)


@rank_zero_only
def report(title: str, run_dir: Path, facts: dict[str, Any], metrics: dict[str, float]) -> None:
    """Write `summary.json` into `run_dir` and print a table of `facts` and `metrics`."""
    write(run_dir, facts, metrics)
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in facts.items():
        if key != "config" and value is not None:
            table.add_row(key.replace("_", " "), str(value))
    for key, value in metrics.items():
        table.add_row(key, f"{value:.4f}")
    Console().print(table)
