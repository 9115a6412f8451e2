"""One summary for the person at the terminal, and the same facts as JSON beside the run."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_only
from rich.console import Console
from rich.table import Table

from lightspeed.core.files import write_text_atomically

SUMMARY_FILE = "summary.json"


@rank_zero_only
def write(run_dir: Path, facts: dict[str, Any], metrics: dict[str, float]) -> None:
    """`summary.json` in `run_dir`, whole or not at all: a reader never finds half of one."""
    write_text_atomically(
        run_dir / SUMMARY_FILE, json.dumps({**facts, "metrics": metrics}, indent=2, default=str) + "\n"
    )


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


CONFIG_TREE_FILE = "config_tree.txt"


@rank_zero_only
def config_tree(config: dict[str, Any], run_dir: Path, show: bool = True) -> None:
    """The resolved config as a tree, a branch a group: printed when `show`, and always kept in the run
    folder beside Hydra's unresolved `.hydra/config.yaml`, so that what a run really used can be read."""
    import yaml
    from rich.syntax import Syntax
    from rich.tree import Tree

    tree = Tree("config (resolved)", guide_style="dim")
    groups = [(k, v) for k, v in config.items() if isinstance(v, dict)]
    for name, values in [("run", {k: v for k, v in config.items() if not isinstance(v, dict)}), *groups]:
        text = yaml.safe_dump(values, sort_keys=False, allow_unicode=True, default_flow_style=False).strip()
        tree.add(f"[bold]{name}[/bold]").add(
            Syntax(text, "yaml", theme="ansi_dark", background_color="default")
        )
    text = io.StringIO()
    Console(file=text, width=110, no_color=True, force_terminal=False).print(tree)
    write_text_atomically(run_dir / CONFIG_TREE_FILE, text.getvalue())  # never through a link or a FIFO
    if show:
        Console().print(tree)
