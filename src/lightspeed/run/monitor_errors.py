"""The lines refusing a run's monitor (`run/monitor.py`): loaded only where one is refused."""

from __future__ import annotations

import difflib
from typing import Any

from lightspeed.core.config import ConfigError
from lightspeed.run.monitor import ChecksMonitor, direction


def differs(key: str, field: str, value: Any, own: str, want: Any) -> ConfigError:
    """Where a callback's own `monitor` or `mode` differs from the run's."""
    return ConfigError(
        f"{key}.{field}={value} differs from monitor.{own}={want}: set the run's one "
        "monitor instead (monitor.metric=..., monitor.mode=...), which every consumer reads"
    )


def mode_unknown(metric: str) -> ConfigError:
    """Where neither the config nor the model says the mode, and the metric's name does not either."""
    return ConfigError(
        f"monitor.mode is not set and the name of monitor.metric={metric} does not say whether "
        f"higher is better: set monitor.mode=min or monitor.mode=max"
    )


def mode_invalid(mode: Any) -> ConfigError:
    """Where the mode is neither min nor max."""
    return ConfigError(f"monitor.mode={mode!r} is invalid: use min or max")


def mode_contradicts(metric: str, mode: str) -> ConfigError:
    """Where the metric's name says the other way is better (val/mae with max)."""
    named = direction(metric)
    better = "lower" if named == "min" else "higher"
    return ConfigError(
        f"monitor.mode={mode} contradicts monitor.metric={metric} ({better} is better by its name): use "
        f"monitor.mode={named}, or monitor.check_mode=false if {mode} is really meant"
    )


def not_logged(callback: ChecksMonitor, logged: list[str]) -> ConfigError:
    """Where a callback monitors a metric the module does not log: the closest name it logs."""
    close = difflib.get_close_matches(str(callback.monitor), logged, n=1)
    hint = f"did you mean monitor.metric={close[0]}? " if close else ""
    return ConfigError(
        f"monitor.metric={callback.monitor} (mode {callback.mode}, used by {type(callback).__name__}) is not "
        f"a metric the model logs: {hint}(it logs {', '.join(logged)})"
    )
