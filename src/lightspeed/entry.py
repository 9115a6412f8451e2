"""What every command-line entry point does around its task: check the group options, let Hydra
compose the config, route logs to the run directory."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import hydra
from omegaconf import DictConfig

from lightspeed import CONF_DIR
from lightspeed.config import check_group_choices, exit_on_config_error
from lightspeed.runlog import route_to_run_log


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
