"""Hydra's composition errors in one line naming the key and the fix, and the run folder of a refused start
put back: imported only when a command line, a yaml file or a setting is refused (`entry.run`), so a run
that starts never loads it."""

from __future__ import annotations

import difflib
import re
import shutil
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lightspeed import CONF_DIR, CONF_DIRS
from lightspeed.core.config import (
    RETIRED,
    ConfigError,
    first_line,
    plain,
)
from lightspeed.core.files import write_text_atomically
from lightspeed.resilience import identity, lock
from lightspeed.run import entry
from lightspeed.run.command_line import WITH_VALUE, config_dirs, yaml_files
from lightspeed.run.entry import Refused


def refusal(caught: BaseException, started: list[bool], args: list[str], config_name: str) -> BaseException:
    """What to raise for an error of Hydra's or of `Checks` (its cause): before the task started, a
    ConfigError of one line; after, the error itself."""
    err = caught.__cause__ if isinstance(caught, Refused) and caught.__cause__ is not None else caught
    if started or not isinstance(err, (ConfigError, HydraException, OmegaConfBaseException)):
        return err
    return err if isinstance(err, ConfigError) else ConfigError(composition_error(err, args, config_name))


def not_composed(err: Exception, args: list[str]) -> str | None:
    """The line for a composition that failed reading a yaml file or applying the command line's values;
    None for an error elsewhere (its traceback)."""
    stage = _composing(err)
    if stage == "overrides":
        return (
            f"the command line's values cannot be applied ({first_line(err)}): one of them goes under a node "
            "that the chosen yaml files make a list or a plain value; check those files, or drop that value"
        )
    return None if stage is None else unreadable_yaml(err, [*CONF_DIRS, *config_dirs(args)], args)


def _composing(err: BaseException) -> str | None:
    """Where in Hydra's composition `err` came from: "files" (reading a yaml file, or Hydra's config
    repository checking a defaults list), "overrides" (applying the command line's values), else None (another
    part of Hydra, a plugin: its own traceback)."""
    if isinstance(err, (yaml.YAMLError, UnicodeDecodeError)):
        return "files"
    names = {Path(frame.filename).name for frame in traceback.extract_tb(err.__traceback__)}
    if names & {"config_repository.py", "defaults_list.py"}:
        return "files"
    return "overrides" if "config_loader_impl.py" in names else None


def composition_error(err: Exception, args: list[str], config_name: str = "train") -> str:
    """Hydra's composition error in one line: an option that has no file names the options there are; a key
    that is not in the config names the closest one (of its node, or of another option of its group)."""
    text = str(err)
    line = _not_an_option(err, args) if isinstance(err, MissingConfigException) else None
    if line is not None:
        return line
    missing = re.search(r"Could not override '([^']+)'", text)
    if missing:
        return _not_overridden(missing[1], err, args, config_name)
    unreadable = next((line for arg in overrides_in(args) if (line := grammar_error(arg))), None)
    if unreadable:
        return unreadable
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(err).__name__)
    return f"the command line does not compose: {first}"


def _not_an_option(err: MissingConfigException, args: list[str]) -> str | None:
    """`group=option` where no folder of Hydra's search path has `group/option.yaml`: the options there are,
    in one line (Hydra's, where it lists them: a dozen lines with its search path); where a yaml file chose
    it, not the command line, says so. None where there is no option to name (a primary config)."""
    group, _, option = str(err.missing_cfg_file or "").rpartition("/")
    choices = err.options or options(group, args)
    if not group or not choices or str(err).startswith("Cannot find primary config"):
        return None
    named_in = re.match(r"In '([^']+)'", str(err))
    if named_in is None or _typed(group, option, args):
        return not_an_option(group, option, choices)
    return (
        f"{group}={option} is not an option: use one of {', '.join(choices)}: the command line did not "
        f"choose it, a defaults list did ({named_in[1]}.yaml, or an "
        f"`override /{group}: {option}` in an option chosen); fix that file"
    )


def not_an_option(group: str, option: str, choices: list[str]) -> str:
    """The line for `group=option` chosen on the command line with no file: the options there are, or the
    file to add."""
    add = f"conf/{group}/{option}.yaml"
    fix = f"use one of {', '.join(choices)} (or add {add})" if choices else f"add {add}, or leave {group} out"
    return f"{group}={option} is not an option: {fix}"


def options(group: str, args: list[str]) -> list[str]:
    """The options of `group` in conf/, the engine's groups and the folders the command line adds."""
    folders = [*CONF_DIRS, *config_dirs(args)]
    return sorted({p.stem for folder in folders for p in (folder / group).glob("*.yaml")})


def _typed(group: str, option: str, args: list[str]) -> bool:
    """Whether the command line chose `option` for `group` (`group=a,option`, `+group=[x,option]`)."""
    return any(
        a.lstrip("+~").partition("=")[0] == group and option in re.split(r"[\[\],]", a.partition("=")[2])
        for a in overrides_in(args)
    )


def _not_overridden(key: str, err: Exception, args: list[str], config_name: str) -> str:
    """The line for a command-line key Hydra could not override: a group this command has not, a mapping
    merged into a node that lacks its keys, or a key that is not in the config."""
    value = next((a.split("=", 1)[1] for a in args if a.lstrip("+").split("=", 1)[0] == key), "...")
    if "No match in the defaults list" in str(err) and is_group(key):
        return unused_group(key, value, config_name)
    inner = str(getattr(err.__cause__, "full_key", None) or "")
    if value.startswith("{") and inner.startswith(f"{key}."):  # Hydra merges a mapping into the node
        new = inner[len(key) + 1 :]
        return (
            f"{key}={value} is merged into the {key} the config has, which has no {new}: to replace "
            f"that node, give ~{key} '+{key}={value}'"
        )
    return unknown_key(key, _known_near(key, err.__cause__), f"to add a key of your own: +{key}={value}")


def unused_group(key: str, value: str, config_name: str) -> str:
    """`make eval experiment=x`: a group that `config_name` does not choose from. A checkpoint carries the
    config its run trained with, so for eval and export the fix is which checkpoint."""
    says = f"{key}={value}: {config_name} has no {key} to choose"
    own = OmegaConf.load(CONF_DIR / f"{config_name}.yaml")
    if own.get("ckpt_path") == "latest":  # eval's and export's: a checkpoint to read (train's: to start from)
        return (
            f"{says}; it uses the config the checkpoint's run trained with: choose that run with "
            "ckpt_path=logs/train/runs/<run>/checkpoints/<file>.ckpt (latest: the newest run's best)"
        )
    return f"{says}: remove it"


def overrides_in(args: list[str]) -> list[str]:
    """The overrides of a command line: not Hydra's flags, nor the values of those that take one."""
    rest, found = iter(args), []
    for arg in rest:
        if not arg.startswith("-"):
            found.append(arg)
        elif arg.partition("=")[0] in WITH_VALUE and "=" not in arg:
            next(rest, "")
    return found


def grammar_error(arg: str) -> str | None:
    """One line for an override Hydra's grammar cannot read (`a=b=c`, `x=[1`, `n=٣`), with its reason."""
    try:
        OverridesParser.create().parse_overrides([arg])
    except HydraException as err:
        text = str(err)
        if "LexerNoViableAlt" in text:  # a character outside the grammar
            if any(c.isdigit() and not c.isascii() for c in arg):  # a digit of another script
                return (
                    f"{arg} cannot be read: use plain ASCII digits and key=value (quote values with spaces)"
                )
            return (
                f"{arg} cannot be read: a character Hydra's override grammar does not take; quote the value"
            )
        said = (line for line in text.splitlines() if not line.startswith(("Error parsing", "See https")))
        reason = next((line.strip() for line in said if line.strip()), "not key=value")
        reason = re.sub(r" expecting \{.*", "", reason)  # the grammar's two dozen token names
        return (
            f"{arg} cannot be read ({reason}): write key=value and quote a value that has =, brackets, "
            "braces or spaces: key='...' (Hydra's override grammar)"
        )
    return None


def _known_near(key: str, cause: BaseException | None) -> list[str]:
    """The dotted keys near a missing one: those of the node Hydra could not add it to (OmegaConf's error
    carries it), and those that any option file of its group gives."""
    node = getattr(cause, "parent_node", None)
    where = str(getattr(cause, "full_key", key)).rpartition(".")[0]
    known = flat_keys(plain(node), f"{where}." if where else "") if OmegaConf.is_config(node) else []
    known = [k for k in known if k.partition(".")[0] != "hydra"]
    group = key.partition(".")[0]
    paths = [p for d in CONF_DIRS for p in sorted((d / group).glob("*.yaml"))] if is_group(group) else []
    return known + [k for path in paths for k in flat_keys(plain(OmegaConf.load(path)), f"{group}.")]


def unknown_key(key: str, known: Sequence[str], fix: str) -> str:
    """One line for a key that is not in the config: what replaced it, or the closest of its siblings."""
    retired = _retired(key)
    if retired:
        return retired
    parent, _, leaf = key.rpartition(".")
    siblings = sorted({k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent} - {"defaults"})
    if leaf in siblings:  # in the default composition, not in this one: another option left it out
        return f"{key} is not a setting with the options chosen here (another option has it): {fix}"
    close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.7)
    where = f"{parent}." if parent else ""
    if close:
        return f"{key} is not a setting: did you mean {where}{close[0]}? {fix}"
    return f"{key} is not a setting ({parent or 'the top level'} has {', '.join(siblings)}): {fix}"


def _retired(key: str) -> str | None:
    """What replaced `key`, a key under it, or the retired node it is under; None where none was."""
    retired = next((k for k in RETIRED if f"{key}.".startswith(f"{k}.") or k.startswith(f"{key}.")), None)
    if retired is None:
        return None
    return f"{retired} {RETIRED[retired]}" if retired == key else f"{key}: {retired} {RETIRED[retired]}"


def unreadable_yaml(err: Exception, folders: Sequence[Path], named: Sequence[str]) -> str:
    """The line for a yaml file Hydra could not read (not UTF-8, not YAML: the file is named) or could not
    use (a defaults list of another shape: Hydra's own words name the option)."""
    import yaml

    mark = getattr(err, "problem_mark", None)
    paths = (
        [Path(mark.name)] if mark is not None and Path(mark.name).is_file() else yaml_files(folders, named)
    )
    for path in paths:
        try:
            yaml.compose(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as bad:
            return f"{path} is not UTF-8 text (byte {bad.start}: {bad.reason}): save it as UTF-8"
        except yaml.MarkedYAMLError as bad:
            where = f" at line {bad.problem_mark.line + 1}" if bad.problem_mark is not None else ""
            return f"{path} is not valid YAML ({bad.problem}{where}): fix it, or move it out of conf/"
        except (yaml.YAMLError, OSError):
            continue
    first = first_line(err).rstrip(".")
    return f"{first}: fix that yaml file (a defaults list is a list of group: option lines)"


def flat_keys(node: Any, prefix: str = "") -> list[str]:
    """Every dotted key of a config container, parents included."""
    items = node.items() if isinstance(node, dict) else ()
    return [k for key, value in items for k in (f"{prefix}{key}", *flat_keys(value, f"{prefix}{key}."))]


def is_group(name: str) -> bool:
    """Whether `name` is a config group: a folder of the project's conf/ or of the engine's groups."""
    return any((d / name).is_dir() for d in CONF_DIRS)


def undo_refused_start(folder: Path, job: str) -> None:
    """Remove a run folder Hydra made for this run if it holds only what this start wrote (`.hydra/`, the
    log; the lock and run.json where it took the lock: a setting refused as the trainer was built); in one
    that was there (another run's), put back the `.hydra/` files this run's start wrote over."""
    for path, data in entry.HYDRA_FILES.pop(folder.resolve(), {}).items():
        write_text_atomically(path, data)
    ours = {folder / ".hydra", folder / f"{job}.log"}
    if folder.resolve() in lock.TAKEN:  # this start's lock and run.json, not a concurrent start's
        ours |= {folder / lock.LOCK_FILE, folder / identity.RECORD_FILE}
    if folder.resolve() not in entry.NEW_FOLDERS or not set(folder.iterdir()) <= ours:
        return
    shutil.rmtree(folder / ".hydra", ignore_errors=True)
    for name in ours - {folder / ".hydra"}:
        name.unlink(missing_ok=True)
    folder.rmdir()
