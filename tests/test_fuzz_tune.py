"""`make tune` and its files, fuzzed: every file it reads (its cached results, a run's speed.json, the folders
they live in, conf/accel/tuned.yaml before it and as `accel=tuned` reads it) turned into a FIFO, a folder, a
link out, empty, torn and huge, plus hostile cached results and arguments. Each case ends in one line (exit 2
for a setting or a file, 3 for a run that failed), a clean re-measure, or a tune that runs correctly: never
a traceback, a hang (SIGALRM fails the case), or a silently wrong result. Tunes run the fake project of
test_tune.py: a train module that writes its speed.json in a blink. A few cases run in `make test`, the rest
are slow."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from lightspeed.core.config import ConfigError
from lightspeed.core.files import MOST_BYTES
from lightspeed.run import command_line, tuned_file
from test_tune import Project


def _fifo(p: Path) -> None:
    os.mkfifo(p)


#: How a file is damaged: each replaces it (or makes it) at the path given.
DAMAGE: dict[str, Callable[[Path], None]] = {
    "fifo": _fifo,
    "folder": lambda p: p.mkdir(),
    "link out": lambda p: p.symlink_to(p.parents[4] / "elsewhere.txt"),
    "empty": lambda p: p.write_text(""),
    "torn": lambda p: p.write_text('{"seal": "ab'),
    "huge": lambda p: p.write_bytes(b" " * (MOST_BYTES + 1)),
    "binary": lambda p: p.write_bytes(b"\xff\xfe\x00"),
}
#: Cached results whose shape is not what tune writes.
HOSTILE = ['{}', '{"samples_per_s": "fast"}', '{"samples_per_s": 1e9}', '{"error": "error: fine", "exit": 0}',
           '{"seal": "x", "result": {"samples_per_s": 1e9}}', "[]", "null", '"text"',
           "[" * 100_000]  # fmt: skip
#: Arguments a careless hand or a script may pass.
ARGS = ["tune.steps=1e3", "tune.steps=true", "tune.repeats=9999999999999999999999", "tune.budget_s=nan",
        "tune.budget_s=1e400", "tune.tolerance=-0.0", "tune.numerics=1", "tune.steps=", "tune.=1",
        "tune.x.y=1", "-h2", "--cfg=job", "tune.budget_s=[1]", "tune.steps={a: 1}",
        "tune.steps=!!python/object:os.system",
        "model=nope", "data.batch_size=abc"]  # fmt: skip


@pytest.fixture
def fake(tmp_path: Path, monkeypatch) -> Project:
    return Project(tmp_path, monkeypatch)


@pytest.fixture(autouse=True)
def no_hang():
    """A case that runs past 20 s hangs: it fails, it does not stop the suite."""

    def hung(*_):
        raise AssertionError("hung")  # not an OSError, which the code under test may catch

    signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)


def ends_well(fake: Project, capsys, *args: str) -> int:
    """The tune's exit: 0 with tuned.yaml whole, or 2 or 3 with one line on stderr and nothing else."""
    code = fake.tune(*args)
    err = capsys.readouterr().err
    if code == 0:
        tuned_file.check_tuned(fake.tuned)
    else:
        assert code in (2, 3) and err.startswith("error: ") and err.count("\n") == 1, (code, err)
    return code


def cache_case(fake: Project, capsys, poison: Callable[[Path], None]) -> None:
    assert fake.tune() == 0
    files = sorted(Path("logs/tune").glob("*/runs/*.json"))
    for f in files:
        f.unlink()
        poison(f)
    code = ends_well(fake, capsys)
    assert (code == 0 and fake.measured == len(files)) or code == 2  # each measured again, or a folder named


def speed_case(fake: Project, capsys, monkeypatch, speed: str) -> None:
    """The run's own speed.json damaged: the tune's first run fails in one line."""
    monkeypatch.setenv("FAKE_SPEED", speed)
    assert ends_well(fake, capsys) == 3 and not fake.tuned.exists()


def tuned_before_case(fake: Project, capsys, poison: Callable[[Path], None]) -> None:
    """Whatever is at conf/accel/tuned.yaml before a tune: written over whole, or a folder named."""
    fake.tuned.parent.mkdir(exist_ok=True)
    poison(fake.tuned)
    assert ends_well(fake, capsys) in (0, 2)


def folder_case(fake: Project, capsys, where: str) -> None:
    """A file where tune makes a folder."""
    assert fake.tune() == 0
    (target,) = Path().glob(where)
    shutil.rmtree(target)
    target.write_text("a file")
    assert ends_well(fake, capsys) == 2


CASES = {
    **{f"cache: {k}": (cache_case, v) for k, v in DAMAGE.items()},
    **{f"cache: {h[:30]}": (cache_case, lambda p, h=h: p.write_text(h)) for h in HOSTILE},
    **{f"speed.json: {s[:20]}": (speed_case, s) for s in ("{}", '{"samples_per_s": "x"}', "[", "null")},
    **{f"tuned.yaml before: {k}": (tuned_before_case, v) for k, v in DAMAGE.items()},
    **{f"arg {a[:40]}": (ends_well, a) for a in ARGS},
    **{f"folder: {w}": (folder_case, w) for w in ("logs/tune", "logs/tune/*", "logs/tune/*/runs")},
}
SAMPLE = ["cache: fifo", 'cache: {"samples_per_s": 1e9}', "arg tune.budget_s=1e400",
          "tuned.yaml before: folder"]  # fmt: skip


def run_case(name: str, fake: Project, capsys, monkeypatch) -> None:
    case, value = CASES[name]
    if case is speed_case:
        case(fake, capsys, monkeypatch, value)
    else:
        case(fake, capsys, value)


@pytest.mark.parametrize("name", SAMPLE)
def test_fuzz_tune_sample(name: str, fake: Project, capsys, monkeypatch) -> None:
    run_case(name, fake, capsys, monkeypatch)


@pytest.mark.slow  # the cases the sample did not run, about a second each
@pytest.mark.parametrize("name", [n for n in CASES if n not in SAMPLE])
def test_fuzz_tune(name: str, fake: Project, capsys, monkeypatch) -> None:
    run_case(name, fake, capsys, monkeypatch)


WHOLE = "# @package _global_\n# `make tune` ...\ndefaults:\n  - default\n\ndata:\n  on_device: true\n"
TUNED = {
    **DAMAGE,
    "cut short": lambda p: p.write_text(WHOLE),
    "without its header": lambda p: p.write_text(WHOLE.split("\n", 1)[1] + tuned_file.END),
    "code to run": lambda p: p.write_text(
        WHOLE + "callbacks:\n  x:\n    _target_: os.system\n" + tuned_file.END
    ),
    "a key tune does not set": lambda p: p.write_text(WHOLE + "accel:\n  backend: x\n" + tuned_file.END),
    "a nested value": lambda p: p.write_text(WHOLE.replace("true", "{a: 1}") + tuned_file.END),
    "no defaults": lambda p: p.write_text(WHOLE.replace("  - default", "  - max") + tuned_file.END),
}


@pytest.mark.parametrize("damage", TUNED)
def test_a_damaged_tuned_yaml_is_one_line_naming_it_and_make_tune(
    damage: str, tmp_path: Path, monkeypatch
) -> None:
    """As `make train accel=tuned` checks it, before Hydra composes: never `accel: None`, never a wait."""
    (tmp_path / "elsewhere.txt").write_text(WHOLE + tuned_file.END)  # whole, but out of conf/accel/
    path = tmp_path / "a" / "b" / "conf" / "accel" / "tuned.yaml"
    path.parent.mkdir(parents=True)
    TUNED[damage](path)
    monkeypatch.setattr(tuned_file, "CONF_DIR", path.parent.parent)
    with pytest.raises(ConfigError) as refused:
        command_line.check_command_line(["accel=tuned"], "train")
    said = str(refused.value)
    assert str(path) in said and "make tune" in said and "\n" not in said
    if path.exists() and not path.is_file():  # a FIFO or a folder: one line for any run, never a wait
        with pytest.raises(ConfigError, match="not a regular file"):
            command_line.check_yaml_sizes([path.parent.parent])
    else:
        command_line.check_yaml_sizes([path.parent.parent])  # another accel: not read


def test_a_tuned_yaml_tune_wrote_passes_its_check(fake: Project, monkeypatch) -> None:
    assert fake.tune() == 0
    monkeypatch.setattr(tuned_file, "CONF_DIR", fake.tuned.parent.parent)
    command_line.check_command_line(["accel=tuned"], "train")


def test_every_key_a_knob_sets_is_one_tuned_yaml_may_hold() -> None:
    from lightspeed import tune

    cpu = {"cuda": False, "device": "cpu", "cpus": 8, "batch": 32, "accumulate": 1, "precision": "32-true"}
    overrides = [o for cuda in (False, True) for k in tune.knobs({**cpu, "cuda": cuda}, numerics=True)
                 for _, values in k.choices for o in values]  # fmt: skip
    for o in overrides:
        group, key = o.split("=")[0].split(".")
        assert key in tuned_file.KEYS[group], o
    json.dumps(overrides)
