"""Tracking: MLflow (a real `mlflow server` on 127.0.0.1, SQLite behind it) and W&B (offline, no key), one
or several loggers at once; each gets the resolved config, the metrics and the speed report, and a run
killed and rerun continues the tracked run its first attempt opened."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import TESTS, TINY, command_line
from lightspeed.run.tracking import TRACKING_FILE, continue_runs

RUN_DIR = "logs/train/runs/tracked"
# Slow batches (0.3 s each), so that a kill lands after the first epoch's checkpoint and before the end
SLOW = ["data._target_=probes.SlowDigits", "+data.delay=0.3", "trainer.max_epochs=4", "run_name=tracked"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    """`mlflow server` on a free port of 127.0.0.1 with a SQLite store in `tmp_path`; stopped (its
    process group: the server and its workers, nothing else) when the test ends."""
    pytest.importorskip(
        "mlflow", reason="logger=mlflow needs the tracking extra (make install EXTRAS=dev,tracking)"
    )
    port = _free_port()
    store = tmp_path / "server"
    store.mkdir()
    args = [
        "server",
        "--backend-store-uri",
        f"sqlite:///{store}/mlflow.db",
        "--artifacts-destination",
        str(store),
    ]
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", *args, "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=open(store / "server.log", "w"),  # noqa: SIM115 (closed with the process)
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, (store / "server.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "mlflow server did not start in 180 s"
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _train(tmp_path: Path, args: tuple[str, ...], env: dict[str, str]) -> subprocess.Popen[str]:
    env = {**env, "PYTHONPATH": str(TESTS), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "lightspeed.train", *TINY, *SLOW, *args, f"paths.log_dir={tmp_path / 'logs'}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _killed_then_rerun(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Start the run, SIGKILL it once its first checkpoint is written, rerun the same command to the end;
    returns both attempts' output."""
    env = dict(os.environ) if env is None else env
    first = _train(tmp_path, args, env)
    last = tmp_path / RUN_DIR / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 240
    while not last.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert first.poll() is None, (
        f"the first attempt ended before it could be killed: {first.stdout.read()[-3000:]}"
    )
    first.send_signal(signal.SIGKILL)
    before, _ = first.communicate()
    second = _train(tmp_path, args, env)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out[-3000:]
    assert "resum" in out.lower(), out[-3000:]
    return before + out


@pytest.mark.slow  # a server that starts in ~30 s here, and two attempts of a slowed run
def test_a_killed_and_rerun_run_continues_its_mlflow_run_on_a_server(
    tmp_path: Path, mlflow_server: str
) -> None:
    import mlflow

    _killed_then_rerun(tmp_path, "logger=[csv,mlflow]", f"logger.mlflow.tracking_uri={mlflow_server}")
    stored = json.loads((tmp_path / RUN_DIR / TRACKING_FILE).read_text())
    assert stored["mlflow"]["at"] == mlflow_server
    client = mlflow.MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("train")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [stored["mlflow"]["id"]]  # one run: the rerun continued it
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    steps = sorted({m.step for m in client.get_metric_history(run.info.run_id, "train/loss")})
    assert min(steps) < 5 < max(steps), steps  # logged before the kill (epoch 0) and after the resume
    assert run.data.params["seed"] == "42" and run.data.params["model/optimizer/name"] == "AdamW"
    assert {"speed/samples_per_s", "test/acc", "val/acc"} <= set(run.data.metrics)
    assert (tmp_path / RUN_DIR / "csv").is_dir()  # the other logger beside it


@pytest.mark.slow  # wandb's service process starts in seconds, twice
def test_wandb_logs_offline_without_a_key_and_a_rerun_continues_the_same_run(tmp_path: Path) -> None:
    pytest.importorskip(
        "wandb", reason="logger=wandb needs the tracking extra (make install EXTRAS=dev,tracking)"
    )
    home = tmp_path / "home"  # no ~/.netrc with a key
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")} | {"HOME": str(home)}
    out = _killed_then_rerun(tmp_path, "logger=wandb", env=env)
    assert "logging offline" in out
    stored = json.loads((tmp_path / RUN_DIR / TRACKING_FILE).read_text())
    attempts = sorted((tmp_path / RUN_DIR / "wandb").glob("offline-run-*"))
    # the killed attempt and the rerun, under one W&B run id (`wandb sync` puts both into one run); what
    # the killed one had not flushed when it was killed is lost (W&B's core buffers it)
    assert len(attempts) == 2 and all(a.name.endswith(f"-{stored['wandb']['id']}") for a in attempts)
    records = _wandb_records(next(attempts[-1].glob("run-*.wandb")))
    assert [r.run.run_id for r in records if r.HasField("run")] == [stored["wandb"]["id"]]
    config = {u.key for r in records if r.HasField("config") for u in r.config.update}
    history = {
        i.key or "/".join(i.nested_key) for r in records if r.HasField("history") for i in r.history.item
    }
    assert {"seed", "model", "trainer"} <= config
    assert {"train/loss", "speed/samples_per_s", "test/acc"} <= history
    assert any(r.HasField("exit") for r in records)  # the rerun finished its W&B run


def _wandb_records(path: Path) -> list:
    """The records of a W&B run file as W&B writes them (LevelDB's log format after a 7-byte header:
    32 KiB blocks of records, each a CRC, a length, a type: whole, first, middle, last), parsed with
    W&B's own protobuf messages."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block, pos, found, part = path.read_bytes(), 32768, 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:  # padding up to the next block
            pos += left - 7 - length
            continue
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            found.append(record)
    return found


def test_a_stored_id_is_used_only_where_it_lives_and_a_torn_file_is_no_id(tmp_path: Path) -> None:
    """tracking.json is data the run wrote for itself: read with care; an id for another server or project
    is not handed to this one (it would not find it)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = OmegaConf.create(
        {
            "paths": {"output_dir": str(run_dir)},
            "logger": {
                "mlflow": {
                    "_target_": "lightning.pytorch.loggers.MLFlowLogger",
                    "tracking_uri": "http://a",
                    "run_id": None,
                },
                "wandb": {
                    "_target_": "lightning.pytorch.loggers.WandbLogger",
                    "project": "p",
                    "id": None,
                    "offline": True,
                },
                "csv": {"_target_": "lightning.pytorch.loggers.CSVLogger"},
            },
        }
    )
    (run_dir / TRACKING_FILE).write_text(
        '{"mlflow": {"id": "abc", "at": "http://a"}, "wandb": {"id": "w1", "at": "q"}}'
    )
    continue_runs(cfg)
    assert cfg.logger.mlflow.run_id == "abc" and cfg.logger.wandb.id is None  # project p, not q
    cfg.logger.mlflow.run_id = None
    (run_dir / TRACKING_FILE).write_text('{"mlflow": {"id": "ab')  # torn
    continue_runs(cfg)
    assert cfg.logger.mlflow.run_id is None


def test_the_ids_a_run_stored_come_back_where_they_live_and_nowhere_else(tmp_path: Path, caplog) -> None:
    """remember then continue_runs, the round trip of a rerun (the slow tests run it with a real server and
    W&B): each id comes back for its MLflow tracking URI or W&B project, and for another one is a new run."""
    import logging

    from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

    from lightspeed.run.tracking import remember

    class OpenedMLflow(MLFlowLogger):  # what remember reads of a logger whose run is open
        def __init__(self) -> None:
            pass

        run_id = "m1"

    class OpenedWandb(WandbLogger):
        def __init__(self) -> None:
            pass

        version = "w1"

    def cfg(uri: str, project: str):
        return OmegaConf.create(
            {
                "paths": {"output_dir": str(tmp_path)},
                "logger": {
                    "mlflow": {"_target_": "lightning.pytorch.loggers.MLFlowLogger", "tracking_uri": uri},
                    "wandb": {
                        "_target_": "lightning.pytorch.loggers.WandbLogger",
                        "project": project,
                        "save_dir": str(tmp_path),
                    },
                },
            }
        )

    (tmp_path / "wandb" / "offline-run-20260101_000000-w1").mkdir(parents=True)  # the attempt W&B wrote
    remember(cfg("http://a", "p"), [OpenedMLflow(), OpenedWandb()])
    again = cfg("http://a", "p")
    continue_runs(again)
    assert (again.logger.mlflow.get("run_id"), again.logger.wandb.get("id")) == ("m1", "w1")
    with caplog.at_level(logging.INFO):
        elsewhere = cfg("http://b", "q")
        continue_runs(elsewhere)
    assert (elsewhere.logger.mlflow.get("run_id"), elsewhere.logger.wandb.get("id")) == (None, None)
    said = [r.getMessage() for r in caplog.records]
    assert any("logged to http://a, not http://b: a new tracked run there" in m for m in said), said
    assert any("logged to p, not q: a new tracked run there" in m for m in said), said


def test_several_loggers_at_once_and_an_unknown_one_is_one_line(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from lightspeed.core.config import ConfigError
    from lightspeed.run import build
    from lightspeed.run.entry import compose_config

    cfg = compose_config("train", ["logger=[csv,tensorboard]"], tmp_path / "logs")
    assert [type(lg) for lg in build.loggers(cfg)] == [CSVLogger, TensorBoardLogger]
    with pytest.raises(ConfigError, match=r"^logger=nope is not an option: use one of csv, mlflow, none, "):
        command_line(["logger=[csv,nope]"], tmp_path)


def test_a_stored_mlflow_run_gone_from_its_local_store_is_a_new_run_and_a_line(
    tmp_path: Path, caplog
) -> None:
    """logs/mlflow.db deleted (or the run deleted in the UI) while the run folder stayed: the rerun opens a
    new MLflow run, where it would have stopped with MLflow's traceback; a run that is there is continued."""
    import logging

    MlflowClient = pytest.importorskip(
        "mlflow.tracking", reason="logger=mlflow needs the tracking extra"
    ).MlflowClient
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    node = {"_target_": "lightning.pytorch.loggers.MLFlowLogger", "tracking_uri": uri, "run_id": None}
    cfg = OmegaConf.create({"paths": {"output_dir": str(run_dir)}, "logger": {"mlflow": node}})
    (run_dir / TRACKING_FILE).write_text(json.dumps({"mlflow": {"id": "0123abcd", "at": uri}}))
    with caplog.at_level(logging.INFO):
        continue_runs(cfg)
    assert cfg.logger.mlflow.run_id is None
    assert f"logger.mlflow: the run 0123abcd this run folder logged to is no longer in {uri}" in caplog.text
    client = MlflowClient(tracking_uri=uri)
    kept = client.create_run(client.create_experiment("e")).info.run_id
    (run_dir / TRACKING_FILE).write_text(json.dumps({"mlflow": {"id": kept, "at": uri}}))
    continue_runs(cfg)
    assert cfg.logger.mlflow.run_id == kept
    cfg.logger.mlflow.run_id = None
    client.delete_run(kept)
    with caplog.at_level(logging.INFO):
        continue_runs(cfg)
    assert (
        cfg.logger.mlflow.run_id is None
        and f"the run {kept} this run folder logged to was deleted" in caplog.text
    )


def test_a_tracking_uri_s_password_is_not_logged_with_the_config() -> None:
    from lightspeed.run.tracking import _as_logged

    node = {"tracking_uri": "https://me:s3cret@mlflow.example:5000/", "run_id": "abc", "experiment_name": "x"}
    assert _as_logged(node) == {"tracking_uri": "https://***@mlflow.example:5000/", "experiment_name": "x"}
    assert (
        _as_logged({"tracking_uri": "sqlite:///logs/mlflow.db"})["tracking_uri"] == "sqlite:///logs/mlflow.db"
    )


@pytest.mark.slow  # a server that never answers, waited for (~8 s)
def test_an_mlflow_server_that_is_down_or_never_answers_is_one_line_before_training(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """A refused port, and a server that takes the connection and never answers (MLflow's own waits: 4 and
    16 minutes, then a traceback): MLflow's retries are bounded, then one line naming the setting, exit 2,
    at the first request (the config's logging, before fit)."""
    from lightning.pytorch.loggers import MLFlowLogger

    pytest.importorskip("mlflow", reason="logger=mlflow needs the tracking extra")
    from lightspeed.run.tracking import MLFLOW_WAITS, log_config

    for name in MLFLOW_WAITS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(
        "MLFLOW_HTTP_REQUEST_TIMEOUT", "1"
    )  # a user's own value wins; 1 s keeps the test short
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the connection; nothing ever reads or answers
        for uri in (f"http://127.0.0.1:{silent.getsockname()[1]}", f"http://127.0.0.1:{_free_port()}"):
            node = {"_target_": "lightning.pytorch.loggers.MLFlowLogger", "tracking_uri": uri}
            cfg = OmegaConf.create({"paths": {"output_dir": str(tmp_path)}, "logger": {"mlflow": node}})
            continue_runs(cfg)
            with pytest.raises(SystemExit) as stop:
                log_config({"logger": {"mlflow": node}}, [MLFlowLogger(tracking_uri=uri)])
            assert stop.value.code == 2
            line = capsys.readouterr().err.strip().splitlines()[-1]
            assert line.startswith(f"error: logger.mlflow.tracking_uri={uri}: MLflow cannot log there (")
            assert "logger=csv" in line
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "1"
    retries = int(os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"])
    assert retries == int(MLFLOW_WAITS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"])  # set, where MLflow's 7 was
    tries_s = (retries + 1) * int(MLFLOW_WAITS["MLFLOW_HTTP_REQUEST_TIMEOUT"])
    assert (
        tries_s + sum(int(MLFLOW_WAITS["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"]) * 2**i for i in range(retries))
        < 90
    )


def test_w_and_b_that_cannot_reach_its_server_is_one_line_before_training(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """With a key and no server (WANDB_BASE_URL refused: W&B gives up after its 90 s init_timeout with a
    traceback, seen by hand), one line naming the logger and the offline switch, exit 2."""
    wandb = pytest.importorskip("wandb", reason="logger=wandb needs the tracking extra")
    from lightning.pytorch.loggers import WandbLogger

    from lightspeed.run.tracking import log_config

    def refused(*_, **__) -> None:
        raise wandb.errors.CommError("Failed to get resume status for run x1: context deadline exceeded")

    logger = WandbLogger(project="p", save_dir=str(tmp_path))
    monkeypatch.setattr(logger, "log_hyperparams", refused)
    node = {"_target_": "lightning.pytorch.loggers.WandbLogger", "project": "p"}
    with pytest.raises(SystemExit) as stop:
        log_config({"logger": {"wandb": node}}, [logger])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: logger.wandb: W&B cannot log (Failed to get resume status for run x1: context deadline "
        "exceeded): check the network and WANDB_BASE_URL, or log offline (logger.wandb.offline=true; "
        "`wandb sync` later), or logger=csv"
    ]
