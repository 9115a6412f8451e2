"""The table a sweep ends with (`run/sweep.py` collects its rows): printed, and kept as Markdown under
`<log dir>/<task>/sweeps/`. Loaded only when a sweep ends."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def show(rows: list[dict[str, Any]], folder: Path) -> None:
    """Print the rows as a table, the best marked, and write it as Markdown into `folder`."""
    title, names, cells = tabulate(rows)
    table = Table(title=title, title_justify="left")
    for name in names:
        table.add_column(name)
    for row in cells:
        table.add_row(*row)
    console = Console()
    (console if console.is_terminal else Console(width=160)).print(table)  # a log file: no wrapping
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}.md"
    lines = [f"{title}\n", "| " + " | ".join(names) + " |", "|" + " --- |" * len(names)]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    path.write_text("\n".join(lines) + "\n")
    print(f"sweep table: {path}")


def tabulate(rows: list[dict[str, Any]]) -> tuple[str, list[str], list[list[str]]]:
    """The sweep's title (what all rows share), columns and cells: each row's varied overrides, its score (the
    best marked where every job has the same monitor) and every validation and test metric any job logged."""
    metric, mode, best = _judge(rows)
    shared = [o for o in rows[0]["overrides"] if all(o in row["overrides"] for row in rows)]
    logged = sorted({k for row in rows for k in row["metrics"]}, key=lambda k: (k.startswith("test/"), k))
    score = f"{metric} ({mode}, best ckpt)" if metric else "score (its monitor, best ckpt)"
    cells = [_cells(row, shared, logged, best, metric) for row in rows]
    title = f"Lightspeed: sweep of {len(rows)} runs"
    title += (f", all with {' '.join(shared)}" if shared else "") + (
        " (* the best)" if best is not None else ""
    )
    return title, ["overrides", "run", "status", score, *logged], cells


def _cells(
    row: dict[str, Any], shared: list[str], logged: list[str], best: float | None, metric: str | None
) -> list[str]:
    """A job's row: the overrides it alone has, its run, status and score, each metric logged."""
    varied = " ".join(o for o in row["overrides"] if o not in shared) or "-"
    return [
        varied,
        row["run"],
        row["status"],
        _score(row, best, metric),
        *(_cell(row["metrics"].get(k)) for k in logged),
    ]


def _judge(rows: list[dict[str, Any]]) -> tuple[str | None, str | None, float | None]:
    """The jobs' one monitor (metric, mode) and the best score, where every job has the same monitor."""
    monitors = {tuple(row["monitor"]) for row in rows if row["monitor"][0] is not None}
    (metric, mode) = monitors.pop() if len(monitors) == 1 else (None, None)
    scores = [row["score"] for row in rows if isinstance(row["score"], (int, float))]
    return metric, mode, (min if mode == "min" else max)(scores) if scores and mode else None


def _score(row: dict[str, Any], best: float | None, metric: str | None) -> str:
    """The row's score, `*` if the best; where jobs have monitors of their own, the row's named."""
    mark = " *" if best is not None and row["score"] == best else ""
    own = "" if metric or row["monitor"][0] is None else f" ({row['monitor'][0]})"
    return _cell(row["score"]) + mark + own


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)
