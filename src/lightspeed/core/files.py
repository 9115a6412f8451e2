"""Files written under a temporary name and renamed into place: readable as any file the user writes."""

from __future__ import annotations

import os
from pathlib import Path


def readable(path: Path) -> None:
    """Give `path` (made by mkdtemp or mkstemp: owner-only) the permissions the user's umask gives new
    files and folders, so that other users and containers can read what it becomes once renamed."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)
