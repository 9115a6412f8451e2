"""What every command-line entry point does around its task: check the group options, let Hydra
compose the config, route logs to the run directory."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from lightspeed import CONF_DIR
from lightspeed.core.config import (
    FOLDER_KEYS,
    ConfigError,
    check_folder_names,
    check_group_choices,
    check_known_keys,
    check_types,
    check_yaml_sizes,
    exit_on_config_error,
    flat_keys,
    is_group,
    unknown_key,
)
from lightspeed.core.failures import process_group_released
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
            check_yaml_sizes()
            check_group_choices(sys.argv[1:])
            check_composes(config_name, sys.argv[1:])
        with process_group_released():  # once a process: the jobs of a sweep in one rank share it
            _run()

    return main


#: Hydra's flags that run no task (they print, or complete a shell): nothing to check before them.
_NO_RUN = {"--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc"}
#: Flags that take a value: the value is not an override.
_WITH_VALUE = {
    "--config-dir",
    "-cd",
    "--config-name",
    "-cn",
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--info",
    "-i",
}


def check_composes(config_name: str, args: list[str]) -> None:
    """Compose the config as Hydra will, with the same flags (`-m`, `-r`, `--config-dir`, `--config-name`),
    and turn what Hydra would print as a dozen lines (a mistyped key, an override it cannot parse) into one
    ConfigError line; check the names that become folders as resolved, before Hydra makes any. A sweep's
    (`-m`) swept overrides are left out (each job checks its own values)."""
    config_name, flags, overrides, extra_dirs = _parse(config_name, args)
    if flags & _NO_RUN:
        return
    _check_launcher_installed(overrides)
    sweep = bool(flags & {"-m", "--multirun"}) or any(a.lstrip("+").startswith("hydra.mode=") for a in args)
    swept = [a for a in overrides if _swept(a) or a.lstrip("+").startswith("hydra.mode=")] if sweep else []
    overrides = [a for a in overrides if a not in swept]
    search = [_searchpath(config_name, extra_dirs)] if extra_dirs else []
    choices = [o for o in overrides if _is_choice(o)]  # the options, without the command line's values
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name, overrides=[*search, *overrides], return_hydra_config=True)
            # the types the options declare, without the command line's values (none: the same config)
            schema = compose(config_name, overrides=[*search, *choices]) if choices != overrides else None
            for job in _swept_folder_names(swept):  # each job's folder names, as that job resolves them
                check_folder_names(compose(config_name, [*search, *overrides, job], return_hydra_config=True))
        check_folder_names(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(composition_error(err, overrides, config_name)) from None
    finally:
        GlobalHydra.instance().clear()
    with open_dict(cfg):
        del cfg.hydra
    check_known_keys(cfg, config_name)
    if schema is not None:
        check_types(OmegaConf.to_container(cfg, resolve=False), OmegaConf.to_container(schema, resolve=False))


def _parse(config_name: str, args: list[str]) -> tuple[str, set[str], list[str], list[str]]:
    """Hydra's command line as (config name, flags, overrides, `--config-dir` folders)."""
    flags, overrides, extra_dirs = set(), [], []
    rest = iter(args)
    for arg in rest:
        flag, eq, value = arg.partition("=")
        if not arg.startswith("-"):
            overrides.append(arg)
            continue
        flags.add(flag)
        if flag in _WITH_VALUE and not eq:
            value = next(rest, "")
        if flag in ("--config-dir", "-cd"):
            extra_dirs.append(str(Path(value).resolve()))
        elif flag in ("--config-name", "-cn"):
            config_name = value
        elif flag in ("--config-path", "-cp"):
            raise ConfigError(f"{flag} is not supported here: use --config-dir <folder> to add configs")
        elif flag == "--experimental-rerun":  # it unpickles a file: data must not choose code
            raise ConfigError("--experimental-rerun is not supported: it unpickles a file; rerun the command")
    return config_name, flags, overrides, extra_dirs


def _searchpath(config_name: str, extra_dirs: list[str]) -> str:
    """`--config-dir` as an override of hydra.searchpath: the added folders ahead of the primary config's
    own entries (the engine's groups), which Hydra keeps when it adds a --config-dir itself."""
    found = [p for d in (CONF_DIR, *map(Path, extra_dirs)) if (p := d / f"{config_name}.yaml").is_file()]
    primary = OmegaConf.load(found[0]) if found else OmegaConf.create()  # none: Hydra's own error says so
    own = list(OmegaConf.select(primary, "hydra.searchpath", default=None) or [])
    return f"hydra.searchpath=[{','.join([*(f'file://{d}' for d in extra_dirs), *own])}]"


def _check_launcher_installed(overrides: list[str]) -> None:
    """The engine's hydra/launcher/{slurm,local}.yaml build on hydra-submitit-launcher, an extra: without
    it, one line naming the install instead of Hydra's "Could not find 'hydra/launcher/submitit_slurm'"."""
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        if key != "hydra/launcher" or value not in ("slurm", "local"):
            continue
        if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
            raise ConfigError(
                f"hydra/launcher={value} needs Hydra's submitit launcher, which is not installed: "
                "make install EXTRAS=dev,cluster (or pip install hydra-submitit-launcher)"
            )


def _is_choice(override: str) -> bool:
    """`group=option` (or `hydra/group=option`, `~group`): picks a file of conf/, sets no value."""
    key = override.lstrip("+~").partition("=")[0]
    return key.startswith("hydra/") or is_group(key) or override.startswith("~")


def _swept_folder_names(swept: list[str]) -> list[str]:
    """`key=value` for each value a sweep gives a key that names a folder (`run_name=a,..`)."""
    parser = OverridesParser.create()
    found = []
    for override in swept:
        parsed = parser.parse_override(override)
        if parsed.key_or_group in FOLDER_KEYS:
            found += [f"{parsed.key_or_group}={value}" for value in parsed.sweep_string_iterator()]
    return found


def _swept(override: str) -> bool:
    """`key=a,b` or `key=range(...)`: a value per job."""
    value = override.partition("=")[2]
    return "," in re.sub(r"\[[^\]]*\]|\{[^}]*\}", "", value) or re.match(r"\w+\(", value) is not None


def composition_error(err: Exception, args: list[str], config_name: str) -> str:
    """Hydra's composition error in one line: a key that is not in the config names the closest one."""
    text = str(err)
    missing = re.search(r"Could not override '([^']+)'", text)
    if missing:
        key = missing[1]
        value = next((a.split("=", 1)[1] for a in args if a.split("=", 1)[0] == key), "...")
        return unknown_key(key, _config_keys(config_name), f"to add a key of your own: +{key}={value}")
    if "LexerNoViableAlt" in type(err).__name__ or "LexerNoViableAlt" in text or "mismatched input" in text:
        bad = next((a for a in args if a in text), text.splitlines()[-1] if text else "")
        return f"{bad} cannot be read: use plain ASCII digits and key=value (quote values with spaces)"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(err).__name__)
    return f"the command line does not compose: {first}"


def _config_keys(config_name: str) -> list[str]:
    """Every key of the default composition, dotted: the candidates for a mistyped one."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name)
    GlobalHydra.instance().clear()
    return flat_keys(OmegaConf.to_container(cfg, resolve=False))


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
