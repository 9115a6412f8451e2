"""`accel=tuned` checked before Hydra reads conf/accel/tuned.yaml: the file as `make tune` writes it, whole.
Hydra would compose an empty or torn one as `accel: None` without a word, wait forever on a FIFO, and
follow a link to any file; a data file must also not name code that runs, so only the keys tune sets are
taken. Loaded only when the command line chooses accel=tuned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightspeed import CONF_DIR
from lightspeed.core.config import ConfigError
from lightspeed.core.files import RefusedFile, read_regular

#: The first line and the last of what tune writes: a file without both was not written whole by it.
HEAD = "# @package _global_\n"
END = "# end of make tune's file\n"
#: The settings tune measures (tune.knobs): all that tuned.yaml may set, each a plain value.
KEYS = {
    "trainer": {"precision", "benchmark", "accumulate_grad_batches"},
    "data": {
        "on_device",
        "num_workers",
        "persistent_workers",
        "prefetch_factor",
        "pin_memory",
        "non_blocking",
        "batch_size",
    },
    "accel": {"threads", "channels_last", "matmul_precision", "optimizer_impl", "compile", "compile_mode"},
}


def check_tuned(path: Path | None = None) -> None:
    """ConfigError, in one line naming the file and `make tune`, unless it is tuned.yaml as tune wrote it."""
    path = path or CONF_DIR / "accel" / "tuned.yaml"
    try:
        text = read_regular(path, within=path.parent).decode()
        damage = _damage(text)
    except (RefusedFile, UnicodeDecodeError) as err:
        damage = str(err).removeprefix(f"{path} ")
    if damage:
        raise ConfigError(f"accel=tuned: {path} {damage}: run make tune to write it again")


def _damage(text: str) -> str | None:
    """What is wrong with tuned.yaml's text, or None."""
    import yaml

    if not (text.startswith(HEAD) and text.endswith(END)):
        return "is not whole (empty or cut short)"
    try:
        found: Any = yaml.safe_load(text)
    except yaml.YAMLError:
        return "is not valid YAML"
    if not isinstance(found, dict) or found.pop("defaults", None) != ["default"]:
        return "does not build on accel=default"
    wrong = next((group for group, values in found.items() if not _tunes(group, values)), None)
    return f"sets {wrong}: {found[wrong]!r}, not what make tune writes" if wrong else None


def _tunes(group: Any, values: Any) -> bool:
    """Plain values of settings tune measures, in the group they belong to."""
    if not isinstance(values, dict) or not set(values) <= KEYS.get(group, set()):
        return False
    return not any(isinstance(v, (dict, list)) for v in values.values())
