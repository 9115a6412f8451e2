"""How an error that no closer handler explained ends (`boundary.boundary`), loaded only then."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from hydra.errors import InstantiationException

from lightspeed.core.config import CONFIG_ERROR_EXIT, first_line
from lightspeed.core.failures import TRAINING_FAILURE_EXIT


def stop(err: Exception, phase: str) -> NoReturn:
    """Say `error: <phase>: <cause>` in one line, keep the traceback in the run's log file (on the terminal
    with LIGHTSPEED_DEBUG=1) and exit: 2 where the cause names a file (OSError), else 3."""
    cause = err.__cause__ if isinstance(err, InstantiationException) and err.__cause__ else err
    logged = _log_traceback(err)
    if os.environ.get("LIGHTSPEED_DEBUG") == "1":
        traceback.print_exception(err, file=sys.stderr)
        where = ""
    else:
        where = (
            f"; its traceback: {logged}, or here with LIGHTSPEED_DEBUG=1"
            if logged
            else ("; LIGHTSPEED_DEBUG=1 shows its traceback")
        )
    print(f"error: {phase}: {type(cause).__name__}: {_line(cause)}{where}", file=sys.stderr)
    file = isinstance(cause, OSError) and cause.filename is not None
    raise SystemExit(CONFIG_ERROR_EXIT if file else TRAINING_FAILURE_EXIT) from None


def _line(err: BaseException) -> str:
    """The error's first line; one that carries another process's traceback (a DataLoader worker's, a
    spawned rank's) says its cause last."""
    text = str(err).strip()
    return text.splitlines()[-1] if "Traceback (most recent call last)" in text else first_line(err)


def _log_traceback(err: BaseException) -> str | None:
    """The traceback written to the run's log files (Hydra's file handlers) only; the first file's name."""
    files = [
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.FileHandler) and Path(h.baseFilename).is_file()  # not /dev/null
    ]
    record = logging.LogRecord("lightspeed", logging.ERROR, __file__, 0, "the run failed", None, None)
    record.exc_info = (type(err), err, err.__traceback__)
    for handler in files:
        handler.handle(record)
    return files[0].baseFilename if files else None
