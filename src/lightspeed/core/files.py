"""Files written under a temporary name and renamed into place: readable as any file the user writes;
data files read back one way (`read_regular`); and the checksum that tells whether a file still holds the
bytes written."""

from __future__ import annotations

import json
import os
import stat
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


#: The most a data file the engine reads back may hold (records, caches, summaries): far above what it writes.
MOST_BYTES = 16 * 2**20


class RefusedFile(ValueError):
    """A data file that `read_regular` will not read: the message names the file and why."""


def read_regular(path: Path, within: Path | None = None, most: int = MOST_BYTES) -> bytes:
    """The bytes of `path` where it is a regular file of at most `most` bytes and, its links followed, inside
    `within`: a FIFO never makes the reader wait, a device or a folder is not read, a link out of the folder
    the file belongs to is not followed. Else RefusedFile (a missing file too)."""
    try:
        if within is not None and not path.resolve().is_relative_to(within.resolve()):
            raise RefusedFile(f"{path} is a link out of {within}")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, and is refused below
    except (OSError, RuntimeError) as err:  # RuntimeError: a loop of links
        raise RefusedFile(f"{path} cannot be read ({getattr(err, 'strerror', None) or err})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise RefusedFile(f"{path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(most + 1)  # the size now, not the size stat saw: the file may have grown since
    if len(data) > most:
        raise RefusedFile(f"{path} holds more than {most} bytes")
    return data


def read_json(path: Path, within: Path | None = None) -> Any:
    """The JSON value in `path`, or None when it is missing, unreadable, torn or refused by `read_regular`:
    a file a run wrote for itself, read as data (the caller checks its shape)."""
    try:
        return json.loads(read_regular(path, within))
    except (ValueError, RecursionError):  # RefusedFile; RecursionError: nested deeper than json can read
        return None


def not_own(path: Path, within: Path, folder: bool = False) -> str | None:
    """Why `path`, a file (a folder where `folder`) that a run keeps in `within`, is none the engine may write
    through or read: a link out of `within` (another run's file would be written over), a FIFO (a writer or
    a reader would wait for ever), a device, a folder where a file goes or a file where a folder goes. None
    where it is absent or fine. Checks only: an atomic write (below) replaces a link rather than follow it."""
    if not os.path.lexists(path):
        return None
    try:
        if not path.resolve().is_relative_to(within.resolve()):
            return f"a link out of {within} (to {path.resolve()})"
        mode = path.stat().st_mode
    except (OSError, RuntimeError) as err:  # a broken link or a loop of links
        return f"a link that cannot be followed ({getattr(err, 'strerror', None) or err})"
    if folder:
        return None if stat.S_ISDIR(mode) else "not a folder"
    return None if stat.S_ISREG(mode) else "a folder" if stat.S_ISDIR(mode) else "not a regular file"


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
