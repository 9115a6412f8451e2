"""One failure boundary around every command: an error that no closer handler explained ends in one line
naming the phase it escaped from and its cause, exit 3 (2 where it names a file), its traceback in the run's
log file, and on the terminal only with LIGHTSPEED_DEBUG=1 (docs/resilience.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any

from lightspeed.core.config import ConfigError

#: The attribute that carries the innermost phase an error escaped from.
PHASE = "lightspeed_phase"


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Name the phase (`fit`, `instantiate model.net`) that an error escaping this block happened in."""
    try:
        yield
    except Exception as err:
        if not hasattr(err, PHASE):
            with contextlib.suppress(AttributeError):  # an error type whose instances take no attributes
                setattr(err, PHASE, name)
        raise


@contextmanager
def boundary(command: str) -> Iterator[None]:
    """Around a command's (or a search trial's) work: any Exception but a ConfigError (its own one line,
    exit 2) becomes one line and a SystemExit."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as err:
        from lightspeed.core.unexpected import stop  # only when something failed

        stop(err, getattr(err, PHASE, command))


def bounded(command: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command's `main` inside `boundary(command)`."""

    def wrap(main: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(main)
        def run(*args: Any, **kwargs: Any) -> Any:
            with boundary(command):
                return main(*args, **kwargs)

        return run

    return wrap
