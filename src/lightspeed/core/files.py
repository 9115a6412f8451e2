"""Files written under a temporary name and renamed into place: readable as any file the user writes;
and the checksum that tells whether a file still holds the bytes written."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any


def readable(path: Path) -> None:
    """Give `path` (made by mkdtemp or mkstemp: owner-only) the permissions the user's umask gives new
    files and folders, so that other users and containers can read what it becomes once renamed."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def crc32(path: Path) -> int:
    """The file's CRC-32 (zlib's: about 1.4 GB/s on one core of a slow VM), read a megabyte at a time."""
    value = 0
    with path.open("rb") as f:
        while block := f.read(2**20):
            value = zlib.crc32(block, value)
    return value


def read_json(path: Path) -> Any:
    """The JSON value in `path`, or None when it is missing, unreadable or torn: a file a run wrote for
    itself, read as data (the caller checks its shape)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # RecursionError: nested deeper than json can read
        return None


def write_text_atomically(path: Path, text: str) -> None:
    """`text` into `path` whole or not at all: a temporary file of this process beside it, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, newline="")  # as given: no line-end translation
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
