"""The files a run writes for itself and reads back, mutated as a disk, an editor or an attacker might leave
them: summary.json, run.json, tracking.json, curves.json, a shard folder's meta.json, the checkpoint and a
search's study.db. Each mutated file, read by what reads it (eval's `ckpt_path=latest`, `make compare`, a
rerun's resume, the tracked runs' continuation, the curves, `data=shards`, eval's checkpoint load, a continued
search), ends in a correct result or one line (exit 2, or a `make compare` error), never a traceback or a
hang. (search.json is written, never read back.)

The mutations are drawn from a fixed seed: the fast suite runs a sample (the same cases on every run;
FUZZ_SEED=<n> draws another), the slow suite the rest: every case once between them."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import os
import random
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from conftest import TINY
from lightspeed.core.config import exit_on_config_error
from lightspeed.run.entry import compose_config

#: What a value in a record might become.
HOSTILE: list[Any] = [
    None, "", "\x00", "../../../etc/passwd", "x" * 100_000, -1, 0, 10**30, 1e308, float("nan"), True, [], {},
    [1, "a", None], {"a": {"b": []}},
]  # fmt: skip
#: Whole files as they might be found: empty, torn, not UTF-8, another JSON type, nested past Python's limit.
WHOLE: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda b: b"",
    "torn": lambda b: b[: len(b) // 2],
    "not-utf8": lambda b: b"\xff\xfe" + b[2:],
    "a-list": lambda b: b"[1, 2]",
    "null": lambda b: b"null",
    "a-string": lambda b: b'"x"',
    "deep": lambda b: b"[" * 100_000 + b"]" * 100_000,
}
STRUCTURAL = 12  # drawn mutations of the parsed value, per file
CHECKPOINT_ENTRIES = 30  # drawn entries of a checkpoint's dict replaced


def _paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every place in a JSON value (a key of a dict or an index of a list), depth first."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield (*prefix, key)
        yield from _paths(child, (*prefix, key))


def _mutated(value: Any, rng: random.Random) -> tuple[str, Any]:
    """One place of `value` replaced by a hostile value, or deleted."""
    value = copy.deepcopy(value)
    path = rng.choice(list(_paths(value)))
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and rng.random() < 0.25:
        del parent[path[-1]]
        return f"{'.'.join(map(str, path))} deleted", value
    hostile = rng.choice(HOSTILE)
    parent[path[-1]] = hostile
    return f"{'.'.join(map(str, path))}={str(hostile)[:20]!r}", value


def json_cases(name: str, text: bytes, seed: int) -> list[tuple[str, bytes]]:
    rng = random.Random(f"{name}-{seed}")
    cases = [(f"{name}: {kind}", make(text)) for kind, make in WHOLE.items()]
    value = json.loads(text)
    for _ in range(STRUCTURAL):
        said, changed = _mutated(value, rng)
        cases.append((f"{name}: {said}", json.dumps(changed).encode()))
    return cases


def checkpoint_cases(text: bytes, seed: int) -> list[tuple[str, bytes]]:
    """Bytes torn or flipped, and the stored dict's entries replaced (saved again as plain data)."""
    rng = random.Random(f"ckpt-{seed}")
    cases = [("last.ckpt: empty", b""), ("last.ckpt: torn", text[: len(text) // 2])]
    for _ in range(4):
        at = rng.randrange(len(text))
        cases.append((f"last.ckpt: byte {at} flipped", text[:at] + bytes([text[at] ^ 0xFF]) + text[at + 1 :]))
    state = torch.load(io.BytesIO(text), weights_only=True)
    for _ in range(CHECKPOINT_ENTRIES):
        key, hostile = rng.choice(sorted(state)), rng.choice([None, "x", -1, {"a": 1}, [], 1e308])
        buffer = io.BytesIO()
        torch.save({**state, key: hostile}, buffer)
        cases.append((f"last.ckpt: {key}={hostile!r}", buffer.getvalue()))
    return cases


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Two finished runs of the default task (a and b) under one log folder, the source of every file."""
    from lightspeed.run.entry import compose_config
    from lightspeed.train import train

    logs = tmp_path_factory.mktemp("records")
    for name in ("a", "b"):
        out = f"paths.output_dir={logs / 'train' / 'runs' / name}"
        train(
            compose_config(
                "train", [*TINY, f"run_name={name}", out, "curves=true", "print_config=false"], logs
            )
        )
    return logs


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Shards of a small synthetic data set, as `make shards` writes them (None without LitData)."""
    if importlib.util.find_spec("litdata") is None:
        return None
    from lightspeed.data import SyntheticDataModule
    from lightspeed.data.shards import write_shards

    data = SyntheticDataModule(num_samples=300, shape=[3, 8, 8], batch_size=16)
    return write_shards(data, tmp_path_factory.mktemp("shards") / "s", "16KB")


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path | None:
    """The folder of a search of two trials (made-up scores), its study.db as Optuna keeps it (None without
    Optuna)."""
    if importlib.util.find_spec("optuna") is None:
        return None
    from lightspeed.run import search
    from test_search import _search_cfg

    folder = tmp_path_factory.mktemp("study")
    search.run(_search_cfg(folder, "hparams_search.n_trials=2"), lambda cfg, _: float(cfg.model.optimizer.lr))
    return folder / "search"


#: SQL a hand or a tool might leave in a study (Optuna's own tables).
TAMPERED = [
    "UPDATE trial_params SET param_value = 1e308",
    "UPDATE trial_params SET distribution_json = 'x'",
    'UPDATE trial_params SET distribution_json = \'{"name": "FloatDistribution", "attributes": {}}\'',
    "UPDATE trials SET state = 'NOPE'",
    "UPDATE trial_values SET value = NULL",
    "DELETE FROM study_directions",
    "DROP TABLE trial_values",
    "UPDATE studies SET study_name = 'other'",
    "UPDATE trial_user_attributes SET value_json = '{'",
    "INSERT INTO trial_user_attributes (trial_id, key, value_json) VALUES (1, 'failed', '[[[[')",
]


def study_cases(text: bytes, seed: int) -> list[tuple[str, bytes]]:
    """Bytes torn or flipped (SQLite's header and pages), another file's bytes, and tampered rows."""
    import sqlite3
    import tempfile

    rng = random.Random(f"study-{seed}")
    cases = [
        ("study.db: empty", b""),
        ("study.db: torn", text[: len(text) // 2]),
        ("study.db: text", b"hello"),
    ]
    for at in [0, 20, 100, *(rng.randrange(len(text)) for _ in range(5))]:
        cases.append((f"study.db: byte {at} flipped", text[:at] + bytes([text[at] ^ 0xFF]) + text[at + 1 :]))
    for statement in TAMPERED:
        with tempfile.TemporaryDirectory() as scratch:
            db = Path(scratch) / "study.db"
            db.write_bytes(text)
            with sqlite3.connect(db) as connection:
                connection.execute(statement)
            connection.close()
            cases.append((f"study.db: {statement}", db.read_bytes()))
    return cases


def outcome(read: Callable[[], Any], capsys) -> bool:
    """`read` returns (False), or ends in one line (True): a ConfigError (exit 2), or an `error: ...` exit of
    its own."""
    try:
        with exit_on_config_error():
            read()
    except SystemExit as stop:
        err = capsys.readouterr().err.strip().splitlines()
        if isinstance(stop.code, str):  # make compare's own: the message is the exit
            err = stop.code.splitlines()
        else:
            assert stop.code == 2, (stop.code, err[-5:])
        assert len([e for e in err if e.startswith("error: ")]) == 1 and "Traceback" not in "\n".join(err), (
            err
        )
        return True
    return False


def _readers(logs: Path, surface: str) -> list[Callable[[], Any]]:
    """What reads each surface, as the commands do."""
    from lightspeed import compare
    from lightspeed.report.curves import CurvesLogger
    from lightspeed.resilience import identity, resume
    from lightspeed.run.entry import compose_config
    from lightspeed.run.restore import find_checkpoint, load_module
    from lightspeed.run.tracking import continue_runs

    run_a = logs / "train" / "runs" / "a"
    both = [str(run_a), str(logs / "train" / "runs" / "b"), "--out", str(logs / "compare.png")]
    if surface in ("summary.json", "curves.json"):
        readers = [lambda: find_checkpoint("latest", logs), lambda: compare.main(both)]
        if surface == "curves.json":
            readers.append(lambda: CurvesLogger(run_a).log_metrics({"train/loss": 1.0}, step=3))
        return readers
    if surface == "run.json":
        run = ["run_name=a", f"paths.output_dir={run_a}", "print_config=false"]
        cfg = compose_config("train", [*TINY, *run], logs)
        return [lambda: resume.start(cfg), lambda: identity.add_fit_seconds(run_a, 1.0)]
    if surface == "study.db":
        from lightspeed.run import search
        from test_search import _search_cfg

        return [lambda: search.run(_search_cfg(logs), lambda cfg, _: float(cfg.model.optimizer.lr))]
    if surface == "meta.json":
        from lightspeed.train import train

        streamed = ["data=shards", f"data.path={logs / 's'}", "data.batch_size=16", "model=mlp"]
        short = ["trainer.max_epochs=1", "test_after_fit=false", "run_name=shards"]
        return [lambda: train(compose_config("train", [*TINY, *streamed, *short], logs))]
    if surface == "tracking.json":
        loggers = {
            "mlflow": {"_target_": "lightning.pytorch.loggers.MLFlowLogger", "tracking_uri": "http://a"},
            "wandb": {"_target_": "lightning.pytorch.loggers.WandbLogger", "project": "p", "offline": True},
        }
        cfg = OmegaConf.create({"paths": {"output_dir": str(run_a)}, "logger": loggers})
        return [lambda: continue_runs(cfg)]
    cfg = compose_config("eval", [f"ckpt_path={run_a / 'checkpoints' / 'last.ckpt'}"], logs)
    rerun = compose_config("train", [*TINY, "run_name=a", f"paths.output_dir={run_a}"], logs)
    return [lambda: load_module(cfg), lambda: resume.start(rerun)]


SURFACES = {
    "summary.json": "summary.json",
    "run.json": "run.json",
    "tracking.json": "tracking.json",
    "curves.json": "curves.json",
    "last.ckpt": "checkpoints/last.ckpt",
    "meta.json": "meta.json",
    "study.db": "study.db",
}
SEED = int(os.environ.get("FUZZ_SEED", "0"))


def _base(surface: str) -> bytes:
    """The file as a run writes it (tracking.json as two tracked runs leave it)."""
    if surface == "tracking.json":
        return json.dumps(
            {"mlflow": {"id": "m1", "at": "http://a"}, "wandb": {"id": "w1", "at": "p"}}
        ).encode()
    return b""  # read from the run in the test (a module fixture cannot parametrize)


def _cases(surface: str, text: bytes) -> list[tuple[str, bytes]]:
    if surface == "study.db":
        return study_cases(text, SEED)
    return checkpoint_cases(text, SEED) if surface == "last.ckpt" else json_cases(surface, text, SEED)


#: The number of each surface's cases (the same for any file of its kind), to parametrize by index.
COUNTS = {s: len(WHOLE) + STRUCTURAL for s in SURFACES} | {
    "last.ckpt": 6 + CHECKPOINT_ENTRIES,
    "study.db": 11 + len(TAMPERED),
}
ALL = [(s, i) for s, n in COUNTS.items() for i in range(n)]
SAMPLE = random.Random(SEED).sample(ALL, 15)


def check(
    surface: str, index: int, runs: Path, shards: Path | None, study: Path | None, tmp_path, capsys
) -> None:
    logs = tmp_path / "logs"
    shutil.copytree(runs, logs)
    target = logs / "train" / "runs" / "a" / SURFACES[surface]
    if surface == "meta.json":
        if shards is None:
            pytest.skip("data=shards needs the streaming extra (make install EXTRAS=dev,streaming)")
        target = shutil.copytree(shards, logs / "s") / "meta.json"
    if surface == "study.db":
        if study is None:
            pytest.skip("hparams_search needs the search extra (make install EXTRAS=dev,search)")
        target = shutil.copytree(study, logs / "search") / "study.db"
    text = _base(surface) or target.read_bytes()
    said, mutated = _cases(surface, text)[index]
    target.write_bytes(mutated)
    capsys.readouterr()
    for read in _readers(logs, surface):
        try:
            outcome(read, capsys)
        except AssertionError as failed:
            raise AssertionError(f"{said}: {failed}") from None


@pytest.mark.parametrize(("surface", "index"), SAMPLE, ids=[f"{s}-{i}" for s, i in SAMPLE])
def test_a_sample_of_mutated_records_ends_in_a_result_or_one_line(
    surface, index, runs, shards, study, tmp_path, capsys
) -> None:
    check(surface, index, runs, shards, study, tmp_path, capsys)


REST = [c for c in ALL if c not in SAMPLE]


@pytest.mark.slow  # the cases the sample above did not run (CI runs both)
@pytest.mark.parametrize(("surface", "index"), REST, ids=[f"{s}-{i}" for s, i in REST])
def test_every_other_mutated_record_ends_in_a_result_or_one_line(
    surface, index, runs, shards, study, tmp_path, capsys
) -> None:
    check(surface, index, runs, shards, study, tmp_path, capsys)


# The same files in other shapes: a FIFO, a folder, a link out of the run's folder (to a sound file of the
# same kind), emptied, torn, and larger than any the engine reads. Each, through what reads it (a rerun of
# train with resume=auto as far as its plan, eval's `ckpt_path=latest`, `make compare`, a search rerun, the
# end of a sweep), ends in a correct result or one line: never a hang, a traceback, a write through the link.

SHAPES: dict[str, Callable[[Path, bytes], None]] = {
    "fifo": lambda path, text: os.mkfifo(path),
    "folder": lambda path, text: path.mkdir(),
    "link out": lambda path, text: path.symlink_to(_elsewhere(path, text)),
    "empty": lambda path, text: path.write_bytes(b""),
    "torn": lambda path, text: path.write_bytes(text[: len(text) // 2]),
    "huge": lambda path, text: path.write_bytes(text + b" " * (16 * 2**20)),  # valid JSON, too large
}
SHAPED = ["summary.json", "run.json", "curves.json", "speed.json", "study.db", "sweep row"]


def _elsewhere(path: Path, text: bytes) -> Path:
    """A sound copy of the file outside the folder it belongs to (another run's, say)."""
    out = path.parents[4] / "elsewhere" / path.name
    out.parent.mkdir(exist_ok=True)
    out.write_bytes(text)
    return out


@contextlib.contextmanager
def _no_hang(seconds: int = 60) -> Iterator[None]:
    """A reader still waiting after `seconds` (on a FIFO) fails the test rather than hanging it."""

    def stuck(*_: Any) -> None:
        raise AssertionError(f"still waiting after {seconds} s")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _shape_readers(logs: Path, name: str) -> list[Callable[[], Any]]:
    """What reads the file as a command does: a train rerun's plan (its lock, its files checked, resume), and
    `_readers`' commands; a search rerun; a sweep's end."""
    from lightspeed.train import Run

    if name == "sweep row":
        from lightspeed.run import sweep_rows

        cfg = OmegaConf.create({"paths": {"log_dir": str(logs)}, "task_name": "train"})
        return [lambda: sweep_rows.end(logs / "rows", cfg)]
    if name == "study.db":
        return _readers(logs, "study.db")
    run_a = logs / "train" / "runs" / "a"
    rerun = compose_config(
        "train", [*TINY, "run_name=a", f"paths.output_dir={run_a}", "print_config=false"], logs
    )

    def plan() -> None:
        with Run(rerun):
            pass

    readers = [plan]
    if name in ("summary.json", "curves.json"):
        readers += _readers(logs, name)
    return readers


def check_shape(name: str, shape: str, runs: Path, study: Path | None, tmp_path, capsys) -> None:
    logs = tmp_path / "logs"
    shutil.copytree(runs, logs)
    target = logs / "train" / "runs" / "a" / name
    if name == "study.db":
        if study is None:
            pytest.skip("hparams_search needs the search extra (make install EXTRAS=dev,search)")
        target = shutil.copytree(study, logs / "search") / "study.db"
    if name == "sweep row":
        from hydra.core.utils import JobReturn, JobStatus

        from lightspeed.run import sweep_rows

        job = JobReturn(overrides=["seed=1"], status=JobStatus.COMPLETED, _return_value=0.5)
        (logs / "rows").mkdir()
        for number in (0, 1):
            row = json.dumps(sweep_rows._row(logs / "train" / "runs" / "ab"[number], job))
            (logs / "rows" / f"{number}.json").write_text(row)
        target = logs / "rows" / "1.json"
    text = target.read_bytes()
    target.unlink()
    SHAPES[shape](target, text)
    other = {p: p.read_bytes() for p in (logs / "train" / "runs" / "b").rglob("*") if p.is_file()}
    capsys.readouterr()
    refused = []
    for read in _shape_readers(logs, name):
        try:
            with _no_hang():
                refused.append(outcome(read, capsys))
        except AssertionError as failed:
            raise AssertionError(f"{name} as {shape}: {failed}") from None
    if shape in ("fifo", "folder", "link out") and name != "sweep row":  # not written through, nor waited on
        assert refused[0], f"{name} as {shape}: the rerun (or the search) went on"
    if (name, shape) == ("summary.json", "link out"):  # make compare: not another folder's figures
        assert refused[-1], "make compare read a summary.json through a link out of its run's folder"
    if shape == "link out":
        assert _elsewhere(target, text).read_bytes() == text  # nothing written through it
    assert {p: p.read_bytes() for p in other} == other  # the other run's files as they were
    if name == "sweep row":  # every shape here is no row as written: left out, and said
        assert "1.json" in capsys.readouterr().err


SHAPE_CASES = [(name, shape) for name in SHAPED for shape in SHAPES]
SHAPE_SAMPLE = [
    ("summary.json", "link out"),
    ("run.json", "fifo"),
    ("curves.json", "huge"),
    ("sweep row", "torn"),
]


@pytest.mark.parametrize(("name", "shape"), SHAPE_SAMPLE, ids=[f"{n}-{s}" for n, s in SHAPE_SAMPLE])
def test_a_sample_of_records_in_other_shapes_ends_in_a_result_or_one_line(
    name, shape, runs, study, tmp_path, capsys
) -> None:
    check_shape(name, shape, runs, study, tmp_path, capsys)


SHAPE_REST = [c for c in SHAPE_CASES if c not in SHAPE_SAMPLE]


@pytest.mark.slow  # the shapes the sample above did not run
@pytest.mark.parametrize(("name", "shape"), SHAPE_REST, ids=[f"{n}-{s}" for n, s in SHAPE_REST])
def test_every_other_record_in_another_shape_ends_in_a_result_or_one_line(
    name, shape, runs, study, tmp_path, capsys
) -> None:
    check_shape(name, shape, runs, study, tmp_path, capsys)
