"""What every command-line entry point does around its task: check the group options, let Hydra
compose the config, route logs to the run directory."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from lightspeed import CONF_DIR
from lightspeed.core.config import check_group_choices, exit_on_config_error
from lightspeed.core.logs import route_to_run_log
from lightspeed.resilience.identity import register_resolver

register_resolver()


def hydra_entry(config_name: str, task: Callable[[DictConfig], Any]) -> Callable[[], None]:
    """A `main()` that runs `task` on `conf/<config_name>.yaml` composed with the command line."""

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)
    def _run(cfg: DictConfig) -> Any:
        route_to_run_log()
        return task(cfg)  # Hydra sweepers read the return value

    def main() -> None:
        with exit_on_config_error():
            check_group_choices(sys.argv[1:])
        _run()

    return main


def compose_config(config_name: str, overrides: list[str], log_dir: Path) -> DictConfig:
    """The config that `python -m lightspeed.<config_name> <overrides>` would run with, for use from
    Python (tests, benchmarks): logs under `log_dir`, this run's outputs in
    `log_dir/<config_name>/runs/test`, and Hydra's runtime state set as during a real run."""
    GlobalHydra.instance().clear()
    run_dir = log_dir / config_name / "runs" / "test"
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            config_name,
            overrides=[f"paths.output_dir={run_dir}", f"paths.log_dir={log_dir}", *overrides],
            return_hydra_config=True,
        )
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg.hydra
    return cfg
