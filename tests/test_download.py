"""Downloads and file formats of the standard data sets, against a local HTTP server on 127.0.0.1 and
small files in the real formats that the tests write themselves: nothing here reaches the network."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import pickle
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from fakes import Server, idx_bytes, serving, tarball
from lightspeed.data import download
from lightspeed.data.download import DownloadError, Remote, extract, fetch
from lightspeed.data.formats import read_cifar_batch, read_idx


@pytest.fixture
def server() -> Iterator[Server]:
    with serving() as srv:
        yield srv


def remote_for(server: Server, name: str, body: bytes) -> Remote:
    server.files[name] = body
    return Remote(name, hashlib.md5(body).hexdigest(), (server.url,))


BODY = bytes(range(256)) * 64


def left_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_good_download_is_verified_kept_and_not_fetched_again(server: Server, tmp_path: Path) -> None:
    remote = remote_for(server, "a.gz", BODY)
    path = fetch(remote, tmp_path / "data")
    assert path.read_bytes() == BODY and left_in(tmp_path / "data") == ["a.gz"]  # no partial file
    assert fetch(remote, tmp_path / "data") == path and server.served["a.gz"] == 1  # verified copy kept


def test_a_corrupted_download_is_retried_then_refused_in_one_line_leaving_nothing(
    server: Server, tmp_path: Path
) -> None:
    remote = remote_for(server, "a.gz", BODY)
    server.modes["a.gz"] = "corrupt"
    with pytest.raises(DownloadError) as err:
        fetch(remote, tmp_path / "data")
    message = str(err.value)
    assert "\n" not in message and f"not the published {remote.md5}" in message
    assert f"put it at {tmp_path / 'data' / 'a.gz'}" in message
    assert server.served["a.gz"] == download.ATTEMPTS and left_in(tmp_path / "data") == []


def test_an_interrupted_download_is_tried_again(server: Server, tmp_path: Path) -> None:
    remote = remote_for(server, "a.gz", BODY)
    server.modes["a.gz"] = "cut"
    assert fetch(remote, tmp_path / "data").read_bytes() == BODY
    assert server.served["a.gz"] == 2 and left_in(tmp_path / "data") == ["a.gz"]
    server.modes["b.gz"] = "cut-always"
    with pytest.raises(DownloadError, match=r"b.gz \(cut off after 8192 of 16384 bytes\); http"):
        fetch(remote_for(server, "b.gz", BODY), tmp_path / "data")
    assert server.served["b.gz"] == download.ATTEMPTS and left_in(tmp_path / "data") == ["a.gz"]


def test_the_second_mirror_serves_when_the_first_refuses(server: Server, tmp_path: Path) -> None:
    remote = remote_for(server, "a.gz", BODY)
    dead = "http://127.0.0.1:9/"  # the discard port: nothing listens there
    assert fetch(remote, tmp_path / "data", mirrors=[dead, server.url]).read_bytes() == BODY


def test_offline_one_line_names_each_url_and_where_to_put_the_file(tmp_path: Path) -> None:
    remote = Remote("a.gz", hashlib.md5(BODY).hexdigest(), ("http://127.0.0.1:9/", "http://127.0.0.1:9/m2/"))
    with pytest.raises(DownloadError) as err:
        fetch(remote, tmp_path / "data")
    message = str(err.value)
    assert "http://127.0.0.1:9/a.gz (" in message and "http://127.0.0.1:9/m2/a.gz (" in message
    assert f"download it by hand from http://127.0.0.1:9/a.gz (MD5 {remote.md5})" in message
    assert left_in(tmp_path / "data") == []


def test_a_file_put_by_hand_is_used_offline_and_a_tampered_one_is_replaced(
    server: Server, tmp_path: Path
) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.gz").write_bytes(BODY)
    offline = Remote("a.gz", hashlib.md5(BODY).hexdigest(), ("http://127.0.0.1:9/",))
    assert fetch(offline, folder).read_bytes() == BODY  # verified, no network needed
    (folder / "a.gz").write_bytes(b"tampered")
    remote = remote_for(server, "a.gz", BODY)
    assert fetch(remote, folder).read_bytes() == BODY and server.served["a.gz"] == 1


def test_a_download_that_never_ends_or_is_too_large_is_given_up(
    server: Server, tmp_path: Path, monkeypatch
) -> None:
    """A server that trickles bytes (each read quick, the whole never done), one that announces 10 TB, one
    that sends more than the file has: each given up in one line, nothing left behind."""
    monkeypatch.setattr(download, "DEADLINE", 0.5)
    slow = remote_for(server, "slow.gz", BODY)
    server.modes["slow.gz"] = "trickle"
    with pytest.raises(DownloadError, match=r"slow\.gz \(not whole after 0 s, mirrors and attempts together"):
        fetch(slow, tmp_path / "data")
    huge = remote_for(server, "huge.gz", BODY)
    server.modes["huge.gz"] = "huge"
    with pytest.raises(DownloadError, match=r"announces 10000000000000 bytes, more than the file's"):
        fetch(huge, tmp_path / "data")
    endless = dataclasses.replace(remote_for(server, "endless.gz", BODY), size=len(BODY))
    server.modes["endless.gz"] = "endless"
    with pytest.raises(DownloadError, match=r"endless\.gz \(more than the file's \d+ bytes arrived\)"):
        fetch(endless, tmp_path / "data")
    assert left_in(tmp_path / "data") == []


def test_a_part_file_left_by_a_killed_download_is_removed(server: Server, tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    dead, live = folder / ".a.gz.x1.part", folder / ".a.gz.x2.part"
    dead.write_bytes(b"half"), live.write_bytes(b"another process's, still arriving")
    os.utime(dead, (time.time() - download.DEADLINE - 60,) * 2)
    fetch(remote_for(server, "a.gz", BODY), folder)
    assert left_in(folder) == [".a.gz.x2.part", "a.gz"]  # the dead one gone, the live one kept


def test_an_archive_is_extracted_whole_or_not_at_all(tmp_path: Path) -> None:
    good = tmp_path / "good.tar.gz"
    good.write_bytes(tarball({"set/a.bin": b"a", "set/b.bin": b"b"}))
    folder = extract(good, tmp_path / "out", "set")
    assert sorted(p.name for p in folder.iterdir()) == ["a.bin", "b.bin"]
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(tarball({"other/a.bin": BODY * 8})[:200])
    with pytest.raises(DownloadError, match=r"cannot be extracted .*: delete it to fetch it again"):
        extract(cut, tmp_path / "out2", "other")
    assert left_in(tmp_path / "out2") == []  # no half data set that a later run would load


def _tar_with(member: tarfile.TarInfo, data: bytes = b"") -> bytes:
    """A gzipped tar holding `set/ok.bin` and `member`."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        ok = tarfile.TarInfo("set/ok.bin")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        member.size = len(data) if member.isfile() else 0
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return out.getvalue()


@pytest.mark.parametrize(
    "kind", ["dot-dot path", "absolute path", "symlink out", "hard link out", "device file"]
)
def test_an_archive_member_that_would_land_outside_its_folder_is_refused(tmp_path: Path, kind: str) -> None:
    """A downloaded archive is data: a member named `../x` or `/x`, a link pointing out of the folder, or a
    device file is refused, the whole archive with it, and nothing is written outside."""
    outside = tmp_path / "outside.txt"
    member = {
        "dot-dot path": tarfile.TarInfo("set/../../outside.txt"),
        "absolute path": tarfile.TarInfo(str(outside)),
        "symlink out": tarfile.TarInfo("set/link"),
        "hard link out": tarfile.TarInfo("set/hard"),
        "device file": tarfile.TarInfo("set/dev"),
    }[kind]
    if kind == "symlink out":
        member.type, member.linkname = tarfile.SYMTYPE, str(outside)
    elif kind == "hard link out":
        member.type, member.linkname = tarfile.LNKTYPE, "../../outside.txt"
    elif kind == "device file":
        member.type, member.devmajor, member.devminor = tarfile.CHRTYPE, 1, 3
    archive = tmp_path / "evil.tar.gz"
    archive.write_bytes(_tar_with(member, b"pwned"))
    if kind == "absolute path":  # the leading / is stripped: it lands inside, beside the data set's folder
        folder = extract(archive, tmp_path / "data" / "cifar", "set")
        assert [p.name for p in folder.iterdir()] == ["ok.bin"] and not outside.exists()
        return
    with pytest.raises(DownloadError, match=r"cannot be extracted .*: delete it to fetch it again"):
        extract(archive, tmp_path / "data" / "cifar", "set")
    assert not outside.exists() and left_in(tmp_path / "data" / "cifar") == []


def test_idx_files_read_as_uint8_tensors_and_truncated_ones_are_refused(tmp_path: Path) -> None:
    images = np.arange(3 * 28 * 28, dtype=np.uint32).reshape(3, 28, 28) % 256
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(idx_bytes(images)))
    x = read_idx(path)
    assert (
        x.dtype == torch.uint8 and x.shape == (3, 28, 28) and torch.equal(x, torch.from_numpy(images).byte())
    )
    labels = tmp_path / "labels-idx1-ubyte"
    labels.write_bytes(idx_bytes(np.array([7, 2, 1])))  # uncompressed works too
    assert read_idx(labels).tolist() == [7, 2, 1]
    (tmp_path / "cut").write_bytes(idx_bytes(images)[:-5])
    with pytest.raises(ValueError, match="bytes of data where its header says 2352"):
        read_idx(tmp_path / "cut")


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_cifar_batches_read_as_uint8_and_a_pickle_that_names_code_is_refused(tmp_path: Path) -> None:
    data = (np.arange(4 * 3072) % 256).astype(np.uint8).reshape(4, 3072)
    batch = tmp_path / "data_batch_1"
    batch.write_bytes(
        pickle.dumps({b"batch_label": b"training batch 1 of 5", b"data": data, b"labels": [3, 1, 4, 1]})
    )
    x, y = read_cifar_batch(batch)
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.uint8 and y.tolist() == [3, 1, 4, 1]
    assert torch.equal(x[1, 2], torch.from_numpy(data[1, 2048:].reshape(32, 32)))  # rows of R, then G, then B
    marker = tmp_path / "pwned"
    evil = tmp_path / "data_batch_2"
    evil.write_bytes(pickle.dumps({b"data": Payload(marker), b"labels": []}))
    with pytest.raises(pickle.UnpicklingError, match="refusing pathlib"):
        read_cifar_batch(evil)
    assert not marker.exists()


def test_eval_refuses_a_checkpoint_whose_data_names_code_outside_the_allow_list(
    train_cfg, eval_cfg, tmp_path: Path, capsys
) -> None:
    from lightspeed.eval import run as evaluate
    from lightspeed.resilience.identity import DATA_CONFIG_KEY
    from lightspeed.train import train

    result = train(train_cfg("trainer.max_epochs=1", "model=mlp", "callbacks.rich_progress_bar=null"))
    state = torch.load(result.best_checkpoint, weights_only=True)
    state[DATA_CONFIG_KEY]["_target_"] = "shutil.rmtree"
    tampered = tmp_path / "tampered.ckpt"
    torch.save(state, tampered)
    with pytest.raises(SystemExit) as exit_:
        evaluate(eval_cfg(f"ckpt_path={tampered}"))
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "error: tampered.ckpt's data config names data._target_=shutil.rmtree, a class that no yaml" in err


def test_a_resolver_in_a_checkpoint_s_data_config_is_refused_before_it_runs(
    train_cfg, eval_cfg, tmp_path: Path, capsys
) -> None:
    """A resolver in the stored data config would build and call objects when eval merges it.
    (Where a downloaded set is kept and fetched from: that data set's own tests.)"""
    from lightspeed.eval import run as evaluate
    from lightspeed.resilience.identity import DATA_CONFIG_KEY
    from lightspeed.train import train

    result = train(train_cfg("trainer.max_epochs=1", "model=mlp", "callbacks.rich_progress_bar=null"))
    state = torch.load(result.best_checkpoint, weights_only=True)
    marker = tmp_path / "PWNED"
    state[DATA_CONFIG_KEY]["augment"] = f"${{oc.create:{{_target_: os.makedirs, _args_: ['{marker}']}}}}"
    torch.save(state, tmp_path / "resolver.ckpt")
    with pytest.raises(SystemExit) as exit_:
        evaluate(eval_cfg(f"ckpt_path={tmp_path / 'resolver.ckpt'}"))
    assert (
        exit_.value.code == 2
        and "resolver.ckpt's data config holds an interpolation" in capsys.readouterr().err
    )
    assert not marker.exists()
