"""A local HTTP server, and small files in the real formats of the data sets Lightspeed downloads (IDX
gzip, the CIFAR-10 python tarball), so that download code is tested without a network; and folders of
real JPEG and PNG images."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import pickle
import struct
import tarfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
from PIL import Image


class Server(ThreadingHTTPServer):
    """Serves `files` by name; `modes[name]`: `corrupt` (other bytes, always), `cut` (the first request
    ends halfway through its Content-Length), `cut-always`, `missing` (404), `trickle` (8 bytes every
    0.1 s), `huge` (announces 10 TB), `endless` (no Content-Length, the file over and over), `error` (503)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.files: dict[str, bytes] = {}
        self.modes: dict[str, str] = {}
        self.served: Counter[str] = Counter()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


class Handler(BaseHTTPRequestHandler):
    server: Server

    def do_GET(self) -> None:
        name = self.path.lstrip("/")
        self.server.served[name] += 1
        mode = self.server.modes.get(name)
        if name not in self.server.files or mode == "missing":
            self.send_error(404)
            return
        if mode == "error":
            self.send_error(503)
            return
        body = self.server.files[name]
        if mode == "corrupt":
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        self.send_response(200)
        if mode == "endless":  # no Content-Length, and more bytes than the file has, until the client stops
            self.end_headers()
            with contextlib.suppress(OSError):
                for _ in range(4096):
                    self.wfile.write(body)
            self.close_connection = True
            return
        self.send_header("Content-Length", str(10**13 if mode == "huge" else len(body)))
        self.end_headers()
        if mode == "trickle":  # a few bytes at a time: each read is quick, the whole never ends
            with contextlib.suppress(OSError):
                for i in range(0, len(body), 8):
                    self.wfile.write(body[i : i + 8])
                    self.wfile.flush()
                    time.sleep(0.1)
            return
        if mode == "cut-always" or (mode == "cut" and self.server.served[name] == 1):
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving() -> Iterator[Server]:
    srv = Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def idx_bytes(array: np.ndarray) -> bytes:
    header = b"\0\0\x08" + bytes([array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def tarball(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


def cifar_batch(n: int, rng: np.random.Generator) -> bytes:
    content = {
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"labels": rng.integers(0, 10, n).tolist(),
    }
    return pickle.dumps(content, protocol=2)  # as the published files: protocol 2, bytes keys


def cifar_files(n_train: int = 640, n_test: int = 64, seed: int = 0) -> dict[str, bytes]:
    """The batch files of a small CIFAR-10 archive: 5 training batches, enough for the CIFAR-10 config's
    batch of 256, and the test batch."""
    rng = np.random.default_rng(seed)
    files = {f"data_batch_{i}": cifar_batch(max(n_train, 640) // 5, rng) for i in range(1, 6)}
    return {**files, "test_batch": cifar_batch(n_test, rng)}


def fake_file(filename: str, n_train: int = 256, n_test: int = 64, seed: int = 0) -> bytes:
    """A small file in the format of the published `filename`: `n_train` or `n_test` samples."""
    rng = np.random.default_rng(seed)
    n = n_test if filename.startswith("t10k") else n_train
    if filename.endswith("-images-idx3-ubyte.gz"):
        return gzip.compress(idx_bytes(rng.integers(0, 256, (n, 28, 28))), mtime=0)
    if filename.endswith("-labels-idx1-ubyte.gz"):
        return gzip.compress(idx_bytes(rng.integers(0, 10, n)), mtime=0)
    if filename == "cifar-10-python.tar.gz":
        return tarball(
            {f"cifar-10-batches-py/{name}": body for name, body in cifar_files(n_train, n_test).items()}
        )
    raise ValueError(f"no fake for {filename}: add one to tests/fakes.py")


@contextmanager
def fake_downloads(cls: type, monkeypatch) -> Iterator[Server]:
    """While inside: `cls` (a DataModule with `remotes`) fetches small fakes of its files from a local
    server, their MD5s in place of the published ones."""
    with serving() as server:
        remotes = {}
        for key, group in cls.remotes.items():
            patched = []
            for remote in group:
                body = fake_file(remote.filename)
                server.files[remote.filename] = body
                md5 = hashlib.md5(body).hexdigest()
                patched.append(dataclasses.replace(remote, md5=md5, mirrors=(server.url,)))
            remotes[key] = tuple(patched)
        monkeypatch.setattr(cls, "remotes", remotes)
        if hasattr(cls, "batches"):  # files inside an archive, with MD5s of their own (CIFAR-10)
            md5s = {name: hashlib.md5(body).hexdigest() for name, body in cifar_files().items()}
            batches = {k: tuple((name, md5s[name]) for name, _ in v) for k, v in cls.batches.items()}
            monkeypatch.setattr(cls, "batches", batches)
        yield server


#: The classes of `image_folder`: a pattern each that a small net learns in a few steps.
PATTERNS = ("blob", "green", "stripes")
#: (width, height) of the images, in turn: mixed sizes and aspect ratios.
SIZES = ((40, 40), (60, 45), (32, 50), (24, 24))
#: PIL modes of the images, in turn: colour, grey, palette, with alpha.
MODES = ("RGB", "L", "P", "RGBA")


def image(pattern: str, size: tuple[int, int], mode: str, rng: np.random.Generator) -> Image.Image:
    w, h = size
    a = rng.integers(0, 60, (h, w, 3)).astype(np.uint8)
    if pattern == "blob":
        a[h // 4 : 3 * h // 4, w // 4 : 3 * w // 4] = 230
    elif pattern == "green":
        a[:, :, 1] = 200
    else:
        a[::4] = 250
    return Image.fromarray(a).convert(mode)


def image_folder(root: Path, per_class: int = 24, seed: int = 0, classes: tuple[str, ...] = PATTERNS) -> Path:
    """`root/<class>/<i>.jpg|.png`: real files of mixed sizes and modes (JPEG for RGB and grey, PNG for
    all), and one file that is not an image."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            mode = MODES[i % len(MODES)]
            suffix = ".jpg" if i % 2 and mode in ("RGB", "L") else ".png"
            image(PATTERNS[c % len(PATTERNS)], SIZES[i % len(SIZES)], mode, rng).save(
                root / name / f"{i}{suffix}"
            )
    (root / classes[0] / "notes.txt").write_text("not an image")
    return root


def give_data_folder(cfg, tmp_path: Path) -> None:
    """What a composed config needs to run here: a data set that reads a folder (`data.root: null`) gets a
    generated image folder; one that streams shards (`data.path: null`), shards of digits."""
    if "root" in cfg.data and cfg.data.root is None:
        cfg.data.root = str(image_folder(tmp_path / "images"))
    if "path" in cfg.data and cfg.data.path is None:
        import pytest

        pytest.importorskip("litdata", reason="data=shards needs the streaming extra")
        from lightspeed.data import DigitsDataModule
        from lightspeed.data.shards import write_shards

        cfg.data.path = str(write_shards(DigitsDataModule(), tmp_path / "shards", "64KB"))


def check_fetched_once_kept_as_uint8_and_scaled_on_the_device(cls: type, data_dir: Path, monkeypatch) -> None:
    """What every downloaded data set promises, on the fakes above: each published file fetched once and
    kept (a second data module fetches nothing), uint8 samples of the declared shape, the published test
    split, 10% of training held out for validation, and scaling to float on the device."""
    import torch

    with fake_downloads(cls, monkeypatch) as server:
        dm = cls(data_dir=str(data_dir), batch_size=32)
        dm.prepare_data()
        dm.setup("fit")
        fetched = sum(server.served.values())
        assert fetched == sum(len(group) for group in cls.remotes.values())
        x, y = dm.splits["train"].tensors
        assert x.dtype == torch.uint8 and x.shape[1:] == cls.input_shape and y.dtype == torch.int64
        sizes = {name: len(split) for name, split in dm.splits.items()}
        n_train = 640 if "CIFAR" in cls.__name__ else 256  # the fakes: 5 CIFAR batches of 128
        assert sizes == {"train": n_train - round(0.1 * n_train), "val": round(0.1 * n_train), "test": 64}
        scaled, _ = dm.on_after_batch_transfer((x, y), 0)  # as every batch is, on the device
        assert scaled.dtype == torch.float32 and abs(float(scaled.mean())) < 0.02
        again = cls(data_dir=str(data_dir), batch_size=32)
        again.prepare_data()
        again.setup("fit")
        assert sum(server.served.values()) == fetched  # verified copies, not fetched again
        assert torch.equal(again.splits["test"].tensors[0], dm.splits["test"].tensors[0])
