"""`make <target> ARGS="..."` hands the program ARGS split into words as a shell splits them (quotes group a
word with spaces) and nothing of it expanded or run: no glob, no `$`, no `$(...)`, no `;`. Make runs for
real here, with VENV a stub whose bin/python (and bin/lightspeed) prints the argv it was given as JSON, and
PATH a stub `docker` that does the same: what a target runs is read from what the program received."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

STUB = f"""#!{sys.executable}
import json, os, sys
print("ARGV " + json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]))
print("ENV " + json.dumps({{k: os.environ.get(k) for k in ("LIGHTSPEED_TRAIN",)}}))
"""


def _stub(path: Path) -> None:
    path.write_text(STUB)
    path.chmod(0o755)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A VENV whose programs print their argv, with the stamp that says it is installed (EXTRAS=dev)."""
    root = tmp_path_factory.mktemp("stubvenv")
    (root / "bin").mkdir()
    for name in ("python", "lightspeed", "docker"):
        _stub(root / "bin" / name)
    (root / ".installed-dev").touch()  # newer than pyproject.toml: make installs nothing
    return root


def make(cwd: Path, venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`make <args>` as a user types it (not the settings of a `make test ARGS=...` around this test)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # its `docker` too
    return subprocess.run(
        ["make", "--no-print-directory", *args, f"VENV={venv}", "EXTRAS=dev", f"PYTHON={sys.executable}"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def received(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The argv the (only) stubbed program was run with."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [json.loads(line[5:]) for line in proc.stdout.splitlines() if line.startswith("ARGV ")]
    assert len(runs) == 1, proc.stdout + proc.stderr
    return runs[0]


GLOB = "-m experiment=glob(*)"
QUOTES = """'+a=b c' x="q" "it's" '' a\\ b"""
HOSTILE = "$(echo pwned) `echo pwned` ${{HOME}} $HOME ;touch {marker} && touch {marker} | cat > {marker} ~ *"


def hostile(tmp_path: Path) -> tuple[str, list[str], Path]:
    marker = tmp_path / "pwned"
    text = HOSTILE.format(marker=marker)
    words = ["$(echo", "pwned)", "`echo", "pwned`", "${HOME}", "$HOME", ";touch", str(marker), "&&", "touch",
             str(marker), "|", "cat", ">", str(marker), "~", "*"]  # fmt: skip
    return text, words, marker


def test_a_glob_and_parentheses_reach_hydra_as_they_are_with_multirun_first(venv: Path) -> None:
    assert received(make(REPO, venv, "train", f"ARGS={GLOB}")) == [
        "python", "-m", "lightspeed.train", "-m", "experiment=glob(*)"
    ]  # fmt: skip


def test_quotes_group_words_as_a_shell_would(venv: Path) -> None:
    assert received(make(REPO, venv, "train", f"ARGS={QUOTES}"))[3:] == ["+a=b c", "x=q", "it's", "", "a b"]


def test_nothing_in_args_is_expanded_or_run(venv: Path, tmp_path: Path) -> None:
    text, words, marker = hostile(tmp_path)
    got = received(make(REPO, venv, "train", f"ARGS={text}"))
    assert got == ["python", "-m", "lightspeed.train", *words]
    assert not marker.exists()


def test_make_itself_expands_nothing_in_args_or_in_an_override(venv: Path, tmp_path: Path) -> None:
    """`$(shell ...)` is make's own command substitution: ARGS and KEY=VALUE values are text."""
    marker = tmp_path / "made"
    args = f"ARGS=$(shell touch {marker}) $(HOME) $$x"
    got = received(make(REPO, venv, "train", f"a.b=$(shell touch {marker})", args))
    assert got[3:] == [f"a.b=$(shell touch {marker})", "$(shell", "touch", f"{marker})", "$(HOME)", "$$x"]
    assert not marker.exists()


def test_overrides_come_before_args_and_multirun_before_both(venv: Path) -> None:
    args = "ARGS=-m model.optimizer.lr=0.003,0.01 '+x=a  b' ~logger --multirun"
    given = ["trainer.max_epochs=3", "ckpt_path=/tmp/a b.ckpt", "TORCH=cpu", "k=it's", "b=x\\y"]
    got = received(make(REPO, venv, "train", *given, args))
    assert got == ["python", "-m", "lightspeed.train", "-m", "--multirun", "trainer.max_epochs=3",
                   "ckpt_path=/tmp/a b.ckpt", "k=it's", "b=x\\y", "model.optimizer.lr=0.003,0.01", "+x=a  b",
                   "~logger"]  # fmt: skip


@pytest.mark.parametrize(
    ("target", "before"),
    [
        ("eval", ["-m", "lightspeed.eval", "-m", "k=v"]),
        ("shards", ["-m", "lightspeed.shards", "k=v"]),
        ("viz", ["-m", "lightspeed.eval", "viz=true", "k=v"]),
        ("export", ["-m", "lightspeed.export", "k=v"]),
        ("bench", ["-m", "lightspeed.bench", "k=v"]),
        ("tune", ["-m", "lightspeed.tune", "k=v"]),
        ("doctor", ["-m", "lightspeed.doctor"]),
        ("test", ["-m", "pytest", "-m", "not slow", "-n", "auto", "--dist", "loadgroup"]),
        ("test-full", ["-m", "pytest"]),
        ("bench-data", ["scripts/bench_data.py"]),
        ("chaos", ["scripts/chaos.py"]),
    ],
)
def test_every_target_that_takes_args_gets_its_words(target: str, before: list[str], venv: Path) -> None:
    """-m moves before the overrides where the program is Hydra's (train, eval); elsewhere ARGS stays as
    given (pytest's -m is its own)."""
    args = "--json 'my file.json' (x)" if target != "eval" else "-m '(x)'"
    after = ["--json", "my file.json", "(x)"] if target != "eval" else ["(x)"]
    said = make(REPO, venv, target, "k=v", f"ARGS={args}", "WORKERS=auto")
    assert received(said) == ["python", *before, *after]


def test_compare_takes_runs_and_args(venv: Path) -> None:
    got = received(make(REPO, venv, "compare", "RUNS=a b", "ARGS=--out 'my chart.png'"))
    assert got == ["python", "-m", "lightspeed.compare", "a", "b", "--out", "my chart.png"]


def test_args_whose_quotes_do_not_close_is_refused_before_anything_runs(venv: Path) -> None:
    proc = make(REPO, venv, "train", "ARGS=+x='a b")
    assert proc.returncode != 0 and "ARGV " not in proc.stdout, proc.stdout
    assert "ARGS" in proc.stderr and "quot" in proc.stderr, proc.stderr


def test_docker_train_and_doctor_hand_the_container_the_same_words(venv: Path, tmp_path: Path) -> None:
    where = [f"LOGS={tmp_path / 'logs'}", f"DATA={tmp_path / 'data'}", "IMAGE=img"]
    text, words, marker = hostile(tmp_path)
    got = received(make(REPO, venv, "docker-train", "k=v", *where, f"ARGS={GLOB} {text}"))
    assert got[0] == "docker" and got[got.index("img") :] == [
        "img", ".venv/bin/python", "-m", "lightspeed.train", "-m", "k=v", "experiment=glob(*)", *words
    ]  # fmt: skip
    got = received(make(REPO, venv, "docker-doctor", *where, f"ARGS={QUOTES} {text}"))
    assert got[got.index("img") :] == ["img", "make", "doctor", f"ARGS={QUOTES} {text}"]  # as it was given
    assert not marker.exists()


@pytest.fixture(scope="module")
def project(tmp_path_factory, venv: Path) -> Path:
    """A project made by `make new-project` (scripts/project/Makefile, scripts/docker.mk)."""
    dest = tmp_path_factory.mktemp("projects") / "acme"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "new_project.py"), "acme", str(dest),
         "--engine", "git+https://example.invalid/lightspeed@v9.9.9"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (venv / ".installed-dev").touch()  # newer than its pyproject.toml
    return dest


@pytest.mark.parametrize(
    ("target", "before"),
    [
        ("train", ["python", "-m", "acme.train", "-m", "k=v"]),
        ("eval", ["lightspeed", "eval", "-m", "k=v"]),
        ("viz", ["lightspeed", "viz", "-m", "k=v"]),
        ("export", ["lightspeed", "export", "-m", "k=v"]),
        ("bench", ["lightspeed", "bench", "k=v", "-m"]),
        ("tune", ["lightspeed", "tune", "k=v", "-m"]),
        ("doctor", ["lightspeed", "doctor", "-m"]),
        ("test", ["python", "-m", "pytest", "-n", "auto", "-m"]),
    ],
)
def test_a_project_s_targets_get_the_same_words(
    target: str, before: list[str], project: Path, venv: Path, tmp_path: Path
) -> None:
    text, words, marker = hostile(tmp_path)
    said = make(project, venv, target, "k=v", f"ARGS={GLOB} {QUOTES} {text}", "WORKERS=auto")
    got = received(said)
    assert got == [*before, "experiment=glob(*)", "+a=b c", "x=q", "it's", "", "a b", *words]
    assert not marker.exists()
    if target in ("bench", "tune"):
        assert '"LIGHTSPEED_TRAIN": "acme.train"' in said.stdout


def test_a_project_s_docker_train_gets_the_same_words(project: Path, venv: Path, tmp_path: Path) -> None:
    where = [f"LOGS={tmp_path / 'logs'}", f"DATA={tmp_path / 'data'}", "IMAGE=img"]
    got = received(make(project, venv, "docker-train", "k=v", *where, f"ARGS={GLOB}"))
    assert got[got.index("img") :] == [
        "img", ".venv/bin/python", "-m", "acme.train", "-m", "k=v", "experiment=glob(*)"
    ]  # fmt: skip
