"""Hydra's callback for every run (hydra/default.yaml): a sweep (`-m`) ends with a table of its jobs, whose
rows `run/sweep_rows.py` collects (loaded only in a sweep); a single run does nothing here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class SweepTable(Callback):
    rows_dir: Path | None = None  # set when a sweep starts; a single run writes no row

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from lightspeed.run import sweep_rows

        self.rows_dir = sweep_rows.start(config)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if self.rows_dir is not None:
            from lightspeed.run import sweep_rows

            sweep_rows.add(self.rows_dir, config, job_return)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.rows_dir is not None:
            from lightspeed.run import sweep_rows

            sweep_rows.end(self.rows_dir, config)
