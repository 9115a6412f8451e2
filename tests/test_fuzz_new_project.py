"""`make new-project`'s arguments, hostile (quotes, newlines, TOML and shell metacharacters, very long,
/proc, links dangling, looping and out, unicode, empty): each case ends in one line naming the setting
(exit 2) or in a correct project, never in a traceback, a write outside DEST or a pyproject.toml key of
the input's choosing. In process: scripts/new_project.py's `main`, given its arguments as the Makefile's
recipe passes them (whose quoting is checked on its own, with `make -n`).

The fast suite runs a sample drawn with a fixed seed (FUZZ_SEED=<n> draws another); the slow suite the
rest, so the two run every case once."""

from __future__ import annotations

import os
import random
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from test_new_project import FIX, PIN, REPO, script, tagged_repo

tomllib = pytest.importorskip("tomllib")  # Python 3.11


@pytest.fixture(scope="module")
def engine_repo(tmp_path_factory) -> Path:
    return tagged_repo(tmp_path_factory.mktemp("engine"))


HOSTILE = ["", "-h", "a b", "a\nb", "a'b", 'a"b', "a;b", "$(touch pwn)", "`touch pwn`", "日本", "a\udcffb"]

#: One argument hostile at a time, the others good: (NAME, DEST, ENGINE, KEEP). DEST is in `box`, the
#: current folder, beside `outside`; {engine} is a local git repository with a tag v1.
CASES = (
    [(name, "new", PIN, "") for name in [*HOSTILE, "Acme", "class", "os", "a" * 101, "a" * 100, "ａｃｍｅ"]]
    + [("acme", dest, PIN, "") for dest in [*HOSTILE, "dangling", "loop", "loop/x", "out", "via/new", "file",
                                               "full", "empty", "a" * 300, "/".join(["d" * 200] * 25),
                                               "/proc/acme", "/proc/self/acme", "new/..", "~nosuchuser/x",
                                               "~", "no/such/new", "no\nsuch/new", "/", "new\t",
                                               str(REPO / "acme-fuzz")]]
    + [("acme", "new", engine, "") for engine in [*HOSTILE, "not a url", 'x" , "evil", "', "/srv/lightspeed",
                                                   "git+https://example.invalid/a\"b@v1",
                                                   'git+https://example.invalid/x@v1",{evil=1},"',
                                                   "git+https://example.invalid/x@v1\"\nevil = \"1",
                                                   "git+https://example.invalid/x@v1]\n[tool.evil]",
                                                   "git+https://example.invalid/x\\\"@v1",
                                                   "git+https://example.invalid/日本@v1",
                                                   "git+https://example.invalid/$(touch pwn)@v1",
                                                   "git+https://example.invalid/" + "a" * 10_000 + "@v1",
                                                   'git+https://example.invalid/x@v1 ; python_version<"4"',
                                                   "git+https://example.invalid/x@v1\x7f", "ftp://h/x",
                                                   "file:///nonexistent", "git+file://otherhost/srv/x@v1",
                                                   "git+file://localhost{engine}@v1",
                                                   "git+file://localhost{engine}@nosuchtag",
                                                   "git+file://localhost{engine}@--help",
                                                   "git+file://localhost{engine}/missing@v1", "file://{engine}"]]
    + [("acme", "new", PIN, keep) for keep in [*HOSTILE, "mnist\ncifar10", "svhn", "mnist,,mnist"]]
)  # fmt: skip


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root, links not followed: its kind, a link's target, a file's bytes."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for entry in (*dirs, *files):
            path = Path(folder, entry)
            if path.is_symlink():
                found[str(path)] = ("link", os.readlink(path))
            else:
                found[str(path)] = ("dir",) if path.is_dir() else ("file", path.read_bytes())
    return found


def sandbox(tmp_path: Path) -> Path:
    box, outside = tmp_path / "box", tmp_path / "outside"
    box.mkdir()
    outside.mkdir()
    (box / "dangling").symlink_to(outside / "target")
    (box / "loop").symlink_to(box / "loop")
    (box / "out").symlink_to(outside)  # an empty folder, elsewhere
    (box / "via").symlink_to(outside)  # a folder on DEST's way: DEST's real path is under it
    (box / "file").write_text("mine")
    (box / "full").mkdir()
    (box / "full" / "mine.txt").write_text("mine")
    (box / "empty").mkdir()
    return box


def keys(table: dict, prefix: str = "") -> set[str]:
    return (
        {k for key, value in table.items() for k in [prefix + key, *keys(value, f"{prefix}{key}.")]}
        if (isinstance(table, dict))
        else set()
    )


def check(case: tuple[str, str, str, str], tmp_path: Path, engine_repo: Path, capsys, monkeypatch) -> None:
    name, dest, engine, keep = (part.replace("{engine}", str(engine_repo)) for part in case)
    monkeypatch.chdir(sandbox(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "box" / "empty"))  # DEST=~ is made there, not in a real home
    before, repo_before = snapshot(tmp_path), sorted(os.listdir(REPO))
    code = script.main([f"--keep={keep}", f"--engine={engine}", "--", name, dest])
    err = capsys.readouterr().err
    after = snapshot(tmp_path)
    assert sorted(os.listdir(REPO)) == repo_before
    if code == 2:
        [line] = err.splitlines()
        assert re.match(r"error: (NAME|DEST|KEEP|ENGINE)=|error: give NAME and DEST", line), line
        assert FIX.search(line) or "NAME and DEST" in line, line
        assert after == before, "a refused case wrote"
        return
    assert code == 0 and err == "", (code, err)
    made_correctly(name, Path(dest), engine, before, after)


def made_correctly(name: str, dest: Path, engine: str, before: dict, after: dict) -> None:
    """A project at DEST's real path (its folders' links resolved), its pyproject.toml's keys the scaffold's,
    nothing else written."""
    where = dest.expanduser().parent.resolve() / dest.expanduser().name
    assert {p: v for p, v in after.items() if not is_under(p, where)} == {
        p: v for p, v in before.items() if not is_under(p, where)
    }, "a write outside DEST"
    pyproject = tomllib.loads((where / "pyproject.toml").read_text())
    assert keys(pyproject) == keys(tomllib.loads((REPO / "scripts/project/pyproject.toml").read_text()))
    assert pyproject["project"]["name"] == name and (where / "src" / name / "__init__.py").is_file()
    [pin] = pyproject["project"]["dependencies"]
    assert pin == f"lightspeed[bench] @ {engine}" if engine else pin.startswith("lightspeed[bench] @ ")


def is_under(path: str, folder: Path) -> bool:
    return Path(path) == folder or folder in Path(path).parents


def short(case: tuple[str, ...]) -> str:
    return repr(case)[:100]


SAMPLE = random.Random(int(os.environ.get("FUZZ_SEED", "0"))).sample(CASES, 6)


@pytest.mark.parametrize("case", SAMPLE, ids=short)
def test_a_sample_of_hostile_arguments_ends_in_a_project_or_one_line(
    case, tmp_path: Path, engine_repo: Path, capsys, monkeypatch
) -> None:
    check(case, tmp_path, engine_repo, capsys, monkeypatch)


@pytest.mark.slow  # the cases the sample above did not run (CI runs both): ~10 s
@pytest.mark.parametrize("case", [c for c in CASES if c not in SAMPLE], ids=short)
def test_every_other_hostile_argument_ends_in_a_project_or_one_line(
    case, tmp_path: Path, engine_repo: Path, capsys, monkeypatch
) -> None:
    check(case, tmp_path, engine_repo, capsys, monkeypatch)


def test_make_passes_each_argument_to_the_script_as_it_was_given(tmp_path: Path) -> None:
    """What make would run (`make -n`): the words the script gets, however the values are quoted; nothing
    of them run by make or the shell."""
    values = {"NAME": "a'b\"c", "DEST": "$(shell touch pwn)`touch pwn`$$x\n#%;", "ENGINE": "-x \\' ${HOME}"}
    values["KEEP"] = "日本 $(touch pwn)"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", *values)}
    proc = subprocess.run(
        ["make", "-s", "-n", "new-project", *(f"{k}={v}" for k, v in values.items())],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout)
    assert words[words.index("scripts/new_project.py") + 1 :] == [
        f"--keep={values['KEEP']}", f"--engine={values['ENGINE']}", "--", values["NAME"], values["DEST"]
    ]  # fmt: skip
    assert not (REPO / "pwn").exists() and not (tmp_path / "pwn").exists()
