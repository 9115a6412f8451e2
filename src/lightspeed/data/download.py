"""Files fetched once into a data folder: from the first mirror that serves them whole, checked against the
published MD5, written atomically (a temporary name, then a rename), so that an interrupted or corrupted
download never leaves a file that a later run would load. Without a network, one line says which URLs
failed and where to put the file by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import shutil
import socket
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from lightspeed.core.config import ConfigError, first_line
from lightspeed.core.files import readable
from lightspeed.data.base import ArrayDataModule

#: Seconds without a byte from the server before a download attempt is given up.
TIMEOUT = 30.0
#: Seconds fetching a whole file may take, every mirror and attempt together (a server that drips its headers
#: or its body a byte every few seconds never trips TIMEOUT); a `.part` file older than this was left by a
#: download that died, and is removed.
DEADLINE = 3 * 3600.0
#: Bytes accepted for a file whose size is not recorded (`Remote.size`): the shipped data sets are smaller.
MAX_BYTES = 1 << 30
#: Attempts per mirror: a download cut short or failing its checksum is tried again once.
ATTEMPTS = 2


class DownloadError(ConfigError):
    """A file could not be fetched whole and verified from any mirror (one line, exit code 2)."""


@dataclass(frozen=True)
class Remote:
    """A published file: its name, its MD5 as its publisher gives it, and the base URLs that serve it."""

    filename: str
    md5: str
    mirrors: tuple[str, ...]
    size: int | None = None  # bytes, as published: a body well past it cannot be the file

    @property
    def limit(self) -> int:
        """The most bytes a download of it may bring (a margin over the published size)."""
        return MAX_BYTES if self.size is None else self.size + self.size // 4 + (1 << 20)

    def urls(self, mirrors: Sequence[str] | None = None) -> list[str]:
        return [base.rstrip("/") + "/" + self.filename for base in (mirrors or self.mirrors)]


def md5_of(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def fetch(remote: Remote, folder: Path, mirrors: Sequence[str] | None = None) -> Path:
    """`folder/<filename>`, verified; downloaded first unless a verified copy is there (put by hand, or by
    an earlier run), within DEADLINE seconds. `mirrors` replaces the remote's own base URLs (a local copy, a
    test server)."""
    target = folder / remote.filename
    tried = []
    if target.is_file():
        found = md5_of(target)
        if found == remote.md5:
            return target
        tried.append(f"{target} (MD5 {found}, not the published {remote.md5})")
    folder.mkdir(parents=True, exist_ok=True)
    _remove_stale(folder, f".{remote.filename}.*.part")  # left by a download killed mid-file
    deadline = time.monotonic() + DEADLINE
    for url in remote.urls(mirrors):
        for _ in range(ATTEMPTS):
            if time.monotonic() >= deadline:
                break
            # a name of its own: another process (another node on a shared file system) may fetch it too
            handle, name = tempfile.mkstemp(dir=folder, prefix=f".{remote.filename}.", suffix=".part")
            os.close(handle)
            part = Path(name)
            try:
                got = _download(url, part, remote.limit, deadline)
            except (OSError, ValueError, http.client.HTTPException) as err:  # URLError is an OSError
                tried.append(f"{url} ({_reason(err)})")
                if not _worth_retrying(err):
                    break
                continue
            else:
                if got == remote.md5:
                    readable(part)
                    os.replace(part, target)
                    return target
                tried.append(f"{url} (MD5 {got}, not the published {remote.md5})")
            finally:
                part.unlink(missing_ok=True)
    raise DownloadError(
        f"could not fetch {remote.filename}: {'; '.join(tried)}; download it by hand from "
        f"{remote.urls(mirrors)[0]} (MD5 {remote.md5}) and put it at {target}"
    )


def _remove_stale(folder: Path, pattern: str) -> None:
    """What a download or an extraction killed midway left (older than DEADLINE: no live one's)."""
    for stale in folder.glob(pattern):
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > DEADLINE:
                shutil.rmtree(stale) if stale.is_dir() else stale.unlink()


def _download(url: str, part: Path, limit: int, deadline: float) -> str:
    """Stream `url` into `part`; the MD5 of what arrived. A body shorter than its Content-Length (the
    connection dropped: http.client returns what came, silently) raises ConnectionError; one announced or
    growing past `limit` bytes is given up, and so is the connection, headers or body, at `deadline` (a
    timer shuts its socket: a drip keeps each read within TIMEOUT)."""
    sockets: list[socket.socket] = []
    timer = threading.Timer(max(deadline - time.monotonic(), 0.0), _shut, (sockets,))
    timer.start()
    try:
        got = _stream(_watched(sockets).open(url, timeout=TIMEOUT), part, limit)
    except (OSError, ValueError, http.client.HTTPException):
        if time.monotonic() < deadline:
            raise
        got = None
    finally:
        timer.cancel()
    if got is None or time.monotonic() >= deadline:  # shut mid-headers, http.client may take it for an end
        raise TimeoutError(f"not whole after {DEADLINE:.0f} s, mirrors and attempts together")
    return got


def _stream(response: Any, part: Path, limit: int) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    received = 0
    with response, part.open("wb") as out:
        expected = getattr(response, "length", None)  # None without a Content-Length (file://)
        if expected is not None and expected > limit:
            raise ValueError(f"the server announces {expected} bytes, more than the file's {limit}")
        read = getattr(response, "read1", response.read)  # returns what has come
        while block := read(1 << 20):
            digest.update(block)
            out.write(block)
            received += len(block)
            if received > limit:
                raise ValueError(f"more than the file's {limit} bytes arrived")
    if expected is not None and received < expected:
        raise ConnectionError(f"cut off after {received} of {expected} bytes")
    return digest.hexdigest()


class _Kept:
    """urllib's http(s) handler, keeping each connection's socket once connected, in `sockets`."""

    sockets: list[socket.socket]

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        def kept(*args: Any, **kw: Any) -> http.client.HTTPConnection:
            conn = http_class(*args, **kw)
            connect = conn.connect

            def connect_kept() -> None:
                connect()
                self.sockets.append(conn.sock)  # https's too: the wrapped one

            conn.connect = connect_kept
            return conn

        return super().do_open(kept, req, **kwargs)  # type: ignore[misc]


class _KeptHTTP(_Kept, urllib.request.HTTPHandler):
    pass


class _KeptHTTPS(_Kept, urllib.request.HTTPSHandler):
    pass


def _watched(sockets: list[socket.socket]) -> urllib.request.OpenerDirector:
    """An opener like urlopen's (redirects followed: urllib stops a loop) whose sockets go into `sockets`."""
    handlers = (_KeptHTTP(), _KeptHTTPS())
    for handler in handlers:
        handler.sockets = sockets
    return urllib.request.build_opener(*handlers)


def _shut(sockets: list[socket.socket]) -> None:
    """The deadline: every socket of the download shut, which ends a read that waits on it."""
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _worth_retrying(err: BaseException) -> bool:
    """A connection cut mid-file is tried again; a refusal (404, no route, no name) goes to the next
    mirror at once."""
    if isinstance(err, urllib.error.HTTPError):
        return err.code >= 500
    return not isinstance(err, (urllib.error.URLError, ValueError, FileNotFoundError))


def _reason(err: BaseException) -> str:
    """Why, in a few words on one line (a server's own text may span lines)."""
    if isinstance(err, urllib.error.HTTPError):
        said = (str(err.reason).splitlines() or [""])[0][:120]  # a redirect loop's: urllib's words
        return f"HTTP {err.code}" + (f" ({said})" if 300 <= err.code < 400 else "")
    if isinstance(err, urllib.error.URLError):
        return str(err.reason)
    if isinstance(err, http.client.HTTPException):
        return f"not an HTTP answer ({type(err).__name__}: {first_line(err)[:120]})"
    return first_line(err)[:200]


def extract(archive: Path, folder: Path, name: str) -> Path:
    """`folder/<name>`, the tar archive's top folder `name`, extracted whole or not at all: into a
    temporary folder, then renamed over any older copy. tarfile's `data` filter refuses members that
    would land outside the folder (absolute paths, `..`, links pointing out) and device files."""
    if not hasattr(tarfile, "data_filter"):  # Python 3.11.4 and 3.10.12 brought it
        raise DownloadError(
            f"extracting {archive} safely needs Python >= 3.11.4 (or 3.10.12): upgrade Python"
        )
    final = folder / name
    folder.mkdir(parents=True, exist_ok=True)
    _remove_stale(folder, f".{name}.*.extracting")  # left by an extraction killed midway
    tmp = Path(tempfile.mkdtemp(dir=folder, prefix=f".{name}.", suffix=".extracting"))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        if not (tmp / name).is_dir():
            raise DownloadError(f"{archive} holds no folder {name}: delete it to download it again")
        if final.is_dir():  # an older copy that failed its checks: moved aside, then removed
            os.replace(final, tmp / f"{name}.old")
        os.replace(tmp / name, final)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise DownloadError(f"{archive} cannot be extracted ({err}): delete it to fetch it again") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


class DownloadedDataModule(ArrayDataModule):
    """An in-memory data set whose published files (`remotes`, by group) are fetched into `data_dir` in
    `prepare_data` (one process per node, Lightning's rule) and verified again when read (`fetched`):
    a file changed on disk since is fetched again, or refused; it never trains."""

    remotes: ClassVar[dict[str, tuple[Remote, ...]]] = {}

    def __init__(self, data_dir: str, mirrors: Sequence[str] | None = None, **loader_args: Any) -> None:
        super().__init__(**loader_args)
        self.data_dir = Path(data_dir)
        if isinstance(mirrors, str):  # one URL where a list was meant: not its characters, one by one
            raise ConfigError(f"data.mirrors={mirrors} is a string: give a list, data.mirrors=[{mirrors}]")
        self.mirrors = list(mirrors) if mirrors else None

    def prepare_data(self) -> None:
        for group in self.remotes.values():
            for remote in group:
                self.fetched(remote)

    def fetched(self, remote: Remote) -> Path:
        return fetch(remote, self.data_dir, self.mirrors)
