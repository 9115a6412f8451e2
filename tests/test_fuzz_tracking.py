"""Tracking and downloads fuzzed: tracking.json mutated (a FIFO, a folder, a link out, empty, torn, huge, of
another shape, an id that is code or another run's), download mirrors that misbehave (a drip of headers or
body, a wrong size or checksum, a redirect loop, a server that never answers) and tracking settings (MLflow
tracking URIs, run names, W&B ids, WANDB_MODE). Each case ends in one line (exit 2) or a correct run, within a
bounded time, and writes no file outside its run: never a traceback or a hang.

The fast suite runs a few cases that take milliseconds; the slow suite runs the rest."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import QUIET, command_line
from lightspeed.core.config import exit_on_config_error
from lightspeed.data import download
from lightspeed.data.download import DownloadError, Remote, fetch
from lightspeed.run.tracking import TRACKING_FILE, _stored, continue_runs, remember
from lightspeed.train import train

#: Outcomes: a correct run, one line (exit 2), anything else (a traceback, exit 3, a wrong result).
RUN, LINE = "run", "line"


def _outcome(step: Callable[[], object], capsys) -> str:
    """RUN where `step` returns, LINE where it ends in one `error:` line and exit 2."""
    try:
        with exit_on_config_error():
            step()
    except SystemExit as stop:
        err = capsys.readouterr().err.strip().splitlines()
        errors = [line for line in err if line.startswith("error: ")]
        assert stop.code == 2 and len(errors) == 1 and "Traceback" not in "\n".join(err), err[-5:]
        return LINE
    return RUN


# tracking.json ------------------------------------------------------------------------------------------

MLFLOW_ID = "0123456789abcdef0123456789abcdef"


def _tracking_cfg(run_dir: Path, uri: str) -> object:
    return OmegaConf.create(
        {
            "paths": {"output_dir": str(run_dir)},
            "logger": {
                "mlflow": {
                    "_target_": "lightning.pytorch.loggers.MLFlowLogger",
                    "tracking_uri": uri,
                    "run_name": "this",
                    "run_id": None,
                },
                "wandb": {
                    "_target_": "lightning.pytorch.loggers.WandbLogger",
                    "project": "p",
                    "save_dir": str(run_dir),
                    "id": None,
                    "offline": True,
                },
            },
        }
    )


def _entries(mlflow_id: str, wandb_id: str, uri: str) -> str:
    return json.dumps({"mlflow": {"id": mlflow_id, "at": uri}, "wandb": {"id": wandb_id, "at": "p"}})


def _mutate(case: str, path: Path, outside: Path, uri: str, mlflow_id: str) -> None:
    """`path` (tracking.json) as the case makes it; `outside` is a good tracking file of another folder."""
    good = _entries(MLFLOW_ID, "w1", uri)
    written = {
        "empty": "",
        "torn": good[: len(good) // 2],
        "huge": json.dumps({"mlflow": {"id": MLFLOW_ID, "at": uri, "pad": "x" * (17 << 20)}}),
        "not_utf8": "\udcff",
        "a_list": "[1, 2]",
        "null": "null",
        "deep": "[" * 100_000 + "]" * 100_000,
        "id_not_a_string": json.dumps({"mlflow": {"id": 7, "at": uri}}),
        "entry_not_a_dict": json.dumps({"mlflow": "x"}),
        "an_extra_key": json.dumps({"mlflow": {"id": MLFLOW_ID, "at": uri, "cmd": "rm -rf ~"}}),
        "id_is_code": _entries("${oc.create:{_target_: os.makedirs, _args_: [PWNED]}}", "w1", uri),
        "id_reads_the_environment": _entries("${oc.env:HOME}", "${oc.env:HOME}", uri),
        "id_is_a_path": _entries("../../x", "../../../x", uri),
        "another_run_s_ids": _entries(mlflow_id, "w2", uri),  # no attempt of w2 here; the run is "other"'s
    }
    if case in written:
        path.write_bytes(written[case].encode("utf-8", "surrogateescape"))
    elif case == "fifo":
        os.mkfifo(path)
    elif case == "folder":
        path.mkdir()
        (path / "x").write_text(good)
    elif case == "link_out":
        path.symlink_to(outside)
    elif case == "dangling_link":
        path.symlink_to(outside.parent / "nothing")
    elif case != "missing":
        raise AssertionError(case)


TRACKING_CASES = [
    "missing", "fifo", "folder", "link_out", "dangling_link", "empty", "torn", "huge", "not_utf8", "a_list",
    "null", "deep", "id_not_a_string", "entry_not_a_dict", "an_extra_key", "id_is_code",
    "id_reads_the_environment", "id_is_a_path", "another_run_s_ids",
]  # fmt: skip
FAST_TRACKING = ["fifo", "link_out", "torn", "huge", "id_is_code", "another_run_s_ids"]


class _Opened:
    """What `remember` reads of an MLflow and a W&B logger whose runs are open."""

    def __init__(self) -> None:
        from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

        class OpenedMLflow(MLFlowLogger):
            def __init__(self) -> None:
                pass

            run_id = "fedcba9876543210fedcba9876543210"

        class OpenedWandb(WandbLogger):
            def __init__(self) -> None:
                pass

            version = "new1"

        self.loggers = [OpenedMLflow(), OpenedWandb()]


def check_tracking_file(case: str, tmp_path: Path, capsys) -> str:
    """The case's tracking.json under a run's start (continue_runs) and its remember: one line, or new tracked
    runs and a tracking.json that holds them; nothing outside the run folder changed, nothing run."""
    uri, mlflow_id = "http://127.0.0.1:9", MLFLOW_ID  # a server: no request before the logger starts
    if case == "another_run_s_ids":  # a local store, asked whose the run is
        pytest.importorskip("mlflow", reason="logger=mlflow needs the tracking extra")
        uri, mlflow_id = _store_with_another_run(tmp_path)
    run_dir, other = tmp_path / "run", tmp_path / "other"
    run_dir.mkdir()
    other.mkdir()
    (run_dir / "wandb" / "offline-run-20260101_000000-w1").mkdir(parents=True)  # this folder's W&B attempt
    outside = other / TRACKING_FILE
    outside.write_text(_entries(MLFLOW_ID, "w2", uri))
    before = outside.read_bytes()
    _mutate(case, run_dir / TRACKING_FILE, outside, uri, mlflow_id)
    cfg = _tracking_cfg(run_dir, uri)
    start = time.monotonic()
    got = _outcome(lambda: continue_runs(cfg), capsys)
    assert got == RUN, case  # a bad tracking file is no stored run: new tracked runs, said
    assert (cfg.logger.mlflow.run_id, cfg.logger.wandb.id) == (None, None), case
    got = _outcome(lambda: remember(cfg, _Opened().loggers), capsys)
    assert time.monotonic() - start < 30, case
    assert outside.read_bytes() == before and not (tmp_path / "PWNED").exists(), case
    assert not list(Path.cwd().glob("PWNED*")), case
    if got == RUN:  # the new runs' ids, in the shape a run writes
        assert _stored(run_dir) == {
            "mlflow": {"id": "fedcba9876543210fedcba9876543210", "at": uri},
            "wandb": {"id": "new1", "at": "p"},
        }, case
    return got


@pytest.mark.parametrize("case", FAST_TRACKING)
def test_a_sample_of_mutated_tracking_files_starts_new_tracked_runs(
    case: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert check_tracking_file(case, tmp_path, capsys) == RUN


def _store_with_another_run(tmp_path: Path) -> tuple[str, str]:
    """A SQLite MLflow store with a run of another run folder (named `other`, not `this`): its URI, its id."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    return uri, client.create_run(client.create_experiment("e"), run_name="other").info.run_id


@pytest.mark.slow  # the cases the sample above did not run
@pytest.mark.parametrize("case", [c for c in TRACKING_CASES if c not in FAST_TRACKING])
def test_every_other_mutated_tracking_file_starts_new_tracked_runs_or_is_one_line(
    case: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert check_tracking_file(case, tmp_path, capsys) == (LINE if case == "folder" else RUN)


# download mirrors ---------------------------------------------------------------------------------------

BODY = bytes(range(256)) * 64
HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"


class Mirror:
    """A raw HTTP server on 127.0.0.1 whose answer the path names (`/<case>/<file>`): each misbehaves as a
    mirror on the internet might; stopped with the test (its drips end)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.silent = socket.create_server(("127.0.0.1", 0))  # takes connections, never answers
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def url(self, case: str) -> str:
        if case == "never_answers":
            return f"http://127.0.0.1:{self.silent.getsockname()[1]}/"
        if case == "refused":
            return "http://127.0.0.1:9/"  # the discard port: nothing listens there
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/{case}/"

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while not self.stopped.is_set():
                conn, _ = self.listener.accept()
                threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket, data: bytes) -> None:
        for i in range(len(data)):
            if self.stopped.wait(0.05):
                return
            conn.sendall(data[i : i + 1])

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            request = b""
            while b"\r\n\r\n" not in request and (got := conn.recv(4096)):
                request += got
            case = request.split(b" ")[1].decode().split("/")[1]
            answers = {
                "good": HEAD % len(BODY) + BODY,
                "wrong_checksum": HEAD % len(BODY) + BODY[::-1],
                "short": HEAD % (2 * len(BODY)) + BODY,
                "too_long": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY * 200,
                "redirect_loop": b"HTTP/1.1 302 Found\r\nLocation: /redirect_loop/a.gz\r\n\r\n",
                "not_found": b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
                "server_error": b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n",
                "not_http": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
                "closed": b"",
            }
            if case == "drip_headers":  # every read within TIMEOUT, the headers never done
                self._drip(conn, b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 10_000)
            elif case == "drip_body":
                conn.sendall(HEAD % len(BODY))
                self._drip(conn, BODY)
            else:
                conn.sendall(answers[case])

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()
        self.silent.close()


MIRROR_CASES = [
    "good", "wrong_checksum", "short", "too_long", "redirect_loop", "not_found", "server_error", "not_http",
    "closed", "drip_headers", "drip_body", "never_answers", "refused",
]  # fmt: skip
FAST_MIRRORS = ["drip_headers", "redirect_loop", "wrong_checksum"]


@pytest.fixture
def mirror(monkeypatch) -> Iterator[Mirror]:
    monkeypatch.setattr(download, "TIMEOUT", 0.5)
    monkeypatch.setattr(download, "DEADLINE", 1.0)
    served = Mirror()
    yield served
    served.close()


def check_mirror(case: str, mirror: Mirror, tmp_path: Path) -> str:
    """`fetch` from the case's mirror: the file, verified, or one line naming the URL; within a bounded
    time; nothing left in the data folder but the verified file."""
    folder = tmp_path / "data"
    remote = Remote("a.gz", hashlib.md5(BODY).hexdigest(), (mirror.url(case),), size=len(BODY))
    start = time.monotonic()
    try:
        got = fetch(remote, folder).read_bytes() == BODY and RUN
    except DownloadError as err:
        assert "\n" not in str(err) and mirror.url(case) in str(err), str(err)
        got = LINE
    took = time.monotonic() - start
    assert took < 4 * (download.DEADLINE + download.ATTEMPTS * download.TIMEOUT), (case, took)
    assert sorted(p.name for p in folder.iterdir()) == (["a.gz"] if got == RUN else []), case
    return got


@pytest.mark.parametrize("case", FAST_MIRRORS)
def test_a_sample_of_misbehaving_mirrors_is_one_line_in_bounded_time(
    case: str, mirror: Mirror, tmp_path: Path
) -> None:
    assert check_mirror(case, mirror, tmp_path) == LINE


@pytest.mark.slow  # the cases the sample above did not run (a few are seconds of waiting)
@pytest.mark.parametrize("case", [c for c in MIRROR_CASES if c not in FAST_MIRRORS])
def test_every_other_mirror_is_the_verified_file_or_one_line_in_bounded_time(
    case: str, mirror: Mirror, tmp_path: Path
) -> None:
    assert check_mirror(case, mirror, tmp_path) == (RUN if case == "good" else LINE)


# tracking settings --------------------------------------------------------------------------------------

LONG = "n" * 300  # past a file name's 255 bytes
SETTINGS = [
    ("logger=mlflow", "logger.mlflow.tracking_uri=sqlite:////proc/x.db"),
    ("logger=mlflow", "logger.mlflow.tracking_uri=sqlite:///{tmp}/fifo.db"),
    ("logger=mlflow", "logger.mlflow.tracking_uri=sqlite:///{tmp}/no/such/../deep/m.db"),
    ("logger=mlflow", "logger.mlflow.tracking_uri=file:///proc/mlruns"),
    ("logger=mlflow", "logger.mlflow.tracking_uri=bogus://x"),
    ("logger=mlflow", "logger.mlflow.tracking_uri=''"),
    ("logger=mlflow", "logger.mlflow.tracking_uri=http://127.0.0.1:9"),
    ("logger=mlflow", f"logger.mlflow.run_name={LONG}"),
    ("logger=mlflow", "logger.mlflow.run_id=../../x"),
    ("logger=wandb", f"logger.wandb.name={LONG}"),
    ("logger=wandb", f"logger.wandb.id={LONG}"),
    ("logger=wandb", "logger.wandb.id=../../x"),
    ("logger=wandb", "logger.wandb.project=a/b"),
    ("logger=wandb", "WANDB_MODE=bogus"),
    ("logger=wandb", "WANDB_MODE="),
    ("logger=wandb", "WANDB_MODE=disabled"),
    ("logger=wandb", "WANDB_MODE=offline"),
    ("logger=[mlflow,wandb]", "run_name=日本語"),
]
FAST_SETTINGS = [SETTINGS[0], SETTINGS[13]]
FEW_BATCHES = ["trainer.max_epochs=1", *(f"++trainer.limit_{s}_batches=1" for s in ("train", "val", "test"))]


def check_setting(setting: tuple[str, str], tmp_path: Path, monkeypatch, capsys) -> str:
    """`make train <logger> <setting>` (a WANDB_* one in the environment), in process, of a few batches: a
    run, or one line; nothing written outside the logs and the home folder; within a bounded time."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # no W&B key, no ~/.netrc: offline
    for name in [n for n in os.environ if n.startswith(("WANDB_", "MLFLOW_"))]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "fifo.db")
    logger, value = setting[0], setting[1].replace("{tmp}", str(tmp_path))
    args = [logger, *FEW_BATCHES, *QUIET]
    if value.startswith("WANDB_MODE="):
        monkeypatch.setenv("WANDB_MODE", value.split("=", 1)[1])
    else:
        args.append(value)
    start = time.monotonic()
    got = _outcome(lambda: command_line(args, tmp_path / "logs", task=train), capsys)
    assert time.monotonic() - start < 120, setting
    assert {p.name for p in tmp_path.iterdir()} <= {"home", "logs", "fifo.db", "no"}, setting
    return got


@pytest.mark.parametrize("setting", FAST_SETTINGS, ids="-".join)
def test_a_sample_of_tracking_settings_is_a_run_or_one_line(
    setting, tmp_path: Path, monkeypatch, capsys
) -> None:
    """MLflow at a SQLite file it cannot open (its 10 tries slept 100 s, then a traceback) and
    WANDB_MODE=bogus (a pydantic traceback): one line each, before training."""
    pytest.importorskip("mlflow", reason="logger=mlflow needs the tracking extra")
    pytest.importorskip("wandb", reason="logger=wandb needs the tracking extra")
    assert check_setting(setting, tmp_path, monkeypatch, capsys) == LINE


@pytest.mark.slow  # a run each, MLflow's or W&B's start included
@pytest.mark.parametrize("setting", [s for s in SETTINGS if s not in FAST_SETTINGS], ids="-".join)
def test_every_other_tracking_setting_is_a_run_or_one_line(
    setting, tmp_path: Path, monkeypatch, capsys
) -> None:
    pytest.importorskip("mlflow", reason="logger=mlflow needs the tracking extra")
    pytest.importorskip("wandb", reason="logger=wandb needs the tracking extra")
    check_setting(setting, tmp_path, monkeypatch, capsys)
