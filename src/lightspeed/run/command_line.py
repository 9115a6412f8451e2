"""The command line and the yaml files it names, checked before Hydra reads them, for what Hydra would
take without a word or choke on: flags that read configs from elsewhere or unpickle a file, a launcher whose
plugin is missing, an optional group's missing option, yaml whose aliases expand past any real config (a
"billion laughs" hangs composition for minutes) or nest past Python's recursion limit."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from lightspeed import CONF_DIR, CONF_DIRS
from lightspeed.core.config import ConfigError, known_groups
from lightspeed.core.files import RefusedFile, read_regular


def check_command_line(args: list[str], config_name: str) -> None:
    """Each check below, in one line naming the setting and the fix."""
    if any(re.fullmatch(r"\+*accel=.*\btuned\b.*", arg) for arg in args):  # a file make tune wrote
        from lightspeed.run.tuned_file import check_tuned

        check_tuned()
    check_yaml_sizes([*CONF_DIRS, *config_dirs(args)], args)
    check_flags(args)
    check_optional_choices(args, config_name)


def check_optional_choices(args: list[str], config_name: str) -> None:
    """`group=option` for a group that the primary config names as optional (`optional local: default`), whose
    option has no file: Hydra skips it without a word, and the run would go on without the user's settings."""
    optional = _optional_groups(config_name)
    for arg in args:
        match = re.fullmatch(r"\+?([\w/]+)=\[?([\w.,-]+)\]?", arg)
        if match is None or match[1] not in optional:
            continue
        from lightspeed.run.compose_errors import not_an_option, options  # Hydra's search path

        choices = options(match[1], args)
        for option in set(match[2].split(",")) - {*choices, "null"}:
            raise ConfigError(not_an_option(match[1], option, choices))


def _optional_groups(config_name: str) -> set[str]:
    """The groups of the primary config's defaults list marked `optional`."""
    primary = CONF_DIR / f"{config_name}.yaml"
    defaults = OmegaConf.load(primary).get("defaults") or [] if primary.is_file() else []
    entries = [str(k) for d in defaults if OmegaConf.is_dict(d) for k in d]
    return {k.split()[-1] for k in entries if k.startswith("optional ")}


#: Flags that take a value: the value is not an override.
WITH_VALUE = {"--config-dir", "-cd", "--config-name", "-cn", "--cfg", "-c", "--package", "-p", "--info", "-i"}


def check_flags(args: list[str]) -> None:
    """Refuse Hydra's flags that would read configs from elsewhere or unpickle a file, and a launcher
    whose plugin (an extra) is not installed, in one line each."""
    rest = iter(args)
    for arg in rest:
        flag, eq, _ = arg.partition("=")
        if not arg.startswith("-"):
            _check_launcher_installed(arg)
        elif flag in WITH_VALUE and not eq:
            next(rest, "")
        elif flag in ("--config-path", "-cp"):
            raise ConfigError(f"{flag} is not supported here: use --config-dir <folder> to add configs")
        elif flag == "--experimental-rerun":  # it unpickles a file: data must not choose code
            raise ConfigError("--experimental-rerun is not supported: it unpickles a file; rerun the command")


def _check_launcher_installed(override: str) -> None:
    """The engine's hydra/launcher/{slurm,local}.yaml build on hydra-submitit-launcher, an extra: without
    it, one line naming the install instead of Hydra's "Could not find 'hydra/launcher/submitit_slurm'"."""
    key, _, value = override.lstrip("+").partition("=")
    if key != "hydra/launcher" or value not in ("slurm", "local"):
        return
    try:
        missing = importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None
    except ModuleNotFoundError:  # no Hydra plugin at all: no `hydra_plugins` package to look in
        missing = True
    if missing:
        raise ConfigError(
            f"hydra/launcher={value} needs Hydra's submitit launcher, which is not installed: "
            "make install EXTRAS=dev,cluster (or pip install hydra-submitit-launcher)"
        )


#: Values a yaml file of conf/ may expand to: far above any real config, far below a "billion laughs".
MAX_YAML_VALUES = 100_000


def config_dirs(args: Sequence[str]) -> list[Path]:
    """The folders a command line adds to the search path: `--config-dir X`, `-cd X`, `=X` forms, the
    abbreviations argparse takes (`--config-d X`), and the `file://` entries of `hydra.searchpath=[...]`."""
    found = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag == "-cd" or (len(flag) >= len("--config-d") and "--config-dir".startswith(flag)):
            found += [Path(value)] if eq else [Path(args[i + 1])] if i + 1 < len(args) else []
        if flag.lstrip("+") == "hydra.searchpath":
            found += [Path(p) for p in re.findall(r"file://([^,\]\s'\"]+)", value)]
    return found


def check_yaml_sizes(folders: Sequence[Path] = (CONF_DIR,), named: Sequence[str] = ()) -> None:
    """Refuse a yaml file whose aliases (`*name`) expand past MAX_YAML_VALUES values (Hydra would build every
    copy, hanging for minutes), counted on PyYAML's node graph, each aliased node once; or nested deeper than
    Python's recursion limit (Hydra's traceback)."""
    import yaml

    for path in yaml_files(folders, named):
        try:
            root = yaml.compose(read_regular(path).decode())  # a FIFO: refused, not waited on
            n = _expanded(root, {}) if root is not None else 0
        except RefusedFile:
            if path.exists() and not path.is_file():  # a FIFO or a device: Hydra would wait on it
                raise ConfigError(f"{path} is not a regular file: replace it with a yaml file") from None
            continue
        except (yaml.YAMLError, OSError, UnicodeDecodeError):
            continue  # Hydra's own error says what is wrong with it
        except RecursionError:
            raise ConfigError(f"{path} is nested too deeply to read: flatten it") from None
        if n > MAX_YAML_VALUES:
            raise ConfigError(
                f"{path} would expand to {n} values through its aliases (*name): remove the repeated aliases"
            )


def yaml_files(folders: Sequence[Path], named: Sequence[str]) -> list[Path]:
    """What Hydra may read in these folders: primary configs, and the options of the known groups and of any
    group the command line names (`+mygroup=x`), two levels deep (hydra/launcher/x.yaml)."""
    groups = known_groups() | {m[1] for arg in named if (m := re.match(r"[+~]*([\w/-]+)=", arg))}
    patterns = ["*.yaml", *(f"{g}/*.yaml" for g in groups), *(f"{g}/*/*.yaml" for g in groups)]
    return sorted({p for folder in map(Path, folders) for pattern in patterns for p in folder.glob(pattern)})


def _expanded(node: Any, sizes: dict[int, int]) -> int:
    """How many values a yaml node stands for once every alias is copied out (memoised per node)."""
    import yaml

    if id(node) not in sizes:
        sizes[id(node)] = 0  # a cycle counts once
        children = node.value if isinstance(node.value, list) else []
        items = [c for pair in children for c in pair] if isinstance(node, yaml.MappingNode) else children
        sizes[id(node)] = 1 + sum(_expanded(c, sizes) for c in items)
    return sizes[id(node)]
