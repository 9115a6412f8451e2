"""What every command-line entry point does around its task: refuse what cannot run before Hydra makes a
folder, let Hydra compose the config once, reword its errors in one line, route logs to the run dir."""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from lightspeed import CONF_DIR
from lightspeed.core.boundary import boundary
from lightspeed.core.config import (
    FOLDER_KEYS,
    ConfigError,
    check_folder_names,
    check_retired,
    exit_on_config_error,
    known_groups,
    validate_writable,
)
from lightspeed.core.failures import process_group_released
from lightspeed.core.logs import route_to_run_log
from lightspeed.resilience import identity, lock
from lightspeed.run.command_line import check_command_line

identity.register_resolver()


def hydra_entry(config_name: str, task: Callable[[DictConfig], Any]) -> Callable[[], None]:
    """A `main()` that runs `task` on `conf/<config_name>.yaml` composed with the command line."""

    def main() -> None:
        with exit_on_config_error(), boundary(config_name):
            run(config_name, task)

    return main


def run(config_name: str, task: Callable[[DictConfig], Any]) -> Any:
    """Run `task` as `python -m lightspeed.<config_name> <sys.argv>` does: what Hydra or `Checks` refuse
    before the task starts is a ConfigError of one line; an error after that is the task's own."""
    args = sys.argv[1:]
    check_command_line(args, config_name)
    started = []

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)
    def _run(cfg: DictConfig) -> Any:
        started.append(True)
        route_to_run_log()
        with boundary(config_name):  # here, not only around Hydra: its own report of an error is lines more
            try:
                with exit_on_config_error():  # here: Hydra would report it in lines of its own first
                    return task(cfg)  # Hydra sweepers read the return value
            except SystemExit as stop:
                if stop.code == 2:  # the task refused its config: a folder of Hydra's files alone is no run
                    from lightspeed.run.compose_errors import undo_refused_start

                    undo_refused_start(Path(HydraConfig.get().runtime.output_dir), HydraConfig.get().job.name)
                raise

    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises its errors instead of printing a dozen lines
    GlobalHydra.instance().clear()
    try:
        with process_group_released():  # once a process: the jobs of a sweep in one rank share it
            return _run()
    except RecursionError:
        if started:
            raise
        raise ConfigError(
            "the config nests too deeply to compose (a yaml file of nested lists or maps?): flatten it"
        ) from None
    except (Refused, HydraException, OmegaConfBaseException) as caught:
        from lightspeed.run.compose_errors import refusal

        raise refusal(caught, started, args, config_name) from None
    except (yaml.YAMLError, UnicodeDecodeError, ValueError) as err:  # a yaml file Hydra cannot read or use
        from lightspeed.run.compose_errors import not_composed

        line = None if started or isinstance(err, ConfigError) else not_composed(err, args)
        if line is None:
            raise
        raise ConfigError(line) from None
    finally:
        GlobalHydra.instance().clear()


#: The run folders that did not exist when `Checks` saw the run start: Hydra made them for this run.
NEW_FOLDERS: set[Path] = set()
#: The `.hydra/` files of a run folder that existed then: what Hydra writes over, a run refused before it
#: started (the first process of it) puts back.
HYDRA_FILES: dict[Path, dict[Path, str]] = {}


def keep_hydra_files() -> None:
    """The run has started in its folder (it passed its checks and resume): its `.hydra/` files stay, even
    if it later ends in a one-line error."""
    HYDRA_FILES.clear()


class Refused(BaseException):
    """An error out of a Hydra callback (its `__cause__`): Hydra turns a callback's Exception into a warning
    and goes on, a BaseException passes."""


class Checks(Callback):
    """Checks the composed config before Hydra makes the run's folder (hydra/default.yaml): folder names
    (each sweep job's) and added top-level keys. Values are checked where they are used: the engine's rules
    (`schema.SCHEMA`) as a command starts, a constructor's arguments against its annotations as it is built
    (`build.instantiate`)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config, Path(str(config.hydra.run.dir)))
        folder = Path(str(config.hydra.run.dir)).resolve()
        (NEW_FOLDERS.discard if folder.exists() else NEW_FOLDERS.add)(folder)  # as it is at this start
        subdir = config.hydra.get("output_subdir")
        if subdir is not None and lock.first_process():  # the other ranks' Hydra writes the same files
            HYDRA_FILES[folder] = {p: p.read_text() for p in (folder / subdir).glob("*.yaml") if p.is_file()}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config)


def _check(config: DictConfig, run_dir: Path | None = None) -> None:
    try:
        validate_writable(config, run_dir)  # a read-only log folder, a run folder linked to another's
        check_folder_names(config)
        check_known_keys(config, str(config.hydra.job.config_name))
        for override in OverridesParser.create().parse_overrides(list(config.hydra.overrides.task)):
            key = override.key_or_group
            if override.is_sweep_override() and key in FOLDER_KEYS:  # each job's folder name, here
                for value in override.sweep_string_iterator():
                    job = copy.deepcopy(config)
                    with read_write(job), open_dict(job):
                        OmegaConf.update(job, key, value)
                    check_folder_names(job)
    except Exception as err:
        raise Refused(str(err)) from err


def check_known_keys(cfg: DictConfig, config_name: str) -> None:
    """A key added at the top level (`+foo=bar`, or `max_steps:` in an experiment file's global package)
    that nothing reads is a mistake: refuse it, naming the closest setting."""
    primary = CONF_DIR / f"{config_name}.yaml"
    known = set(OmegaConf.load(primary).keys() if primary.is_file() else ()) | known_groups()
    known -= {"defaults", "hydra"}
    check_retired(cfg)
    for key in cfg:
        if key not in known and key != "hydra":
            from lightspeed.run.compose_errors import unknown_key

            raise ConfigError(unknown_key(str(key), sorted(known), "remove it"))


def compose_config(config_name: str, overrides: list[str], log_dir: Path) -> DictConfig:
    """The config `python -m lightspeed.<config_name> <overrides>` would run with, for tests and benchmarks:
    outputs in `log_dir/<config_name>/runs/test`, Hydra's runtime state set as during a real run."""
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
