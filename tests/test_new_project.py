"""`make new-project NAME=... DEST=...`: the template under a new package name, without the example data
sets left out, built beside DEST and renamed into place. The slow test runs the copy's own `make install`
and `make test`."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "new_project.py"


def new_project(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def text_files(root: Path) -> dict[str, str]:
    found = {}
    for path in root.rglob("*"):
        if ".git" in path.relative_to(root).parts or not path.is_file():
            continue
        with contextlib.suppress(UnicodeDecodeError):
            found[path.relative_to(root).as_posix()] = path.read_text()
    return found


@pytest.fixture(scope="module")
def acme(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("projects") / "acme"
    proc = new_project("acme", str(dest))
    assert proc.returncode == 0, proc.stderr
    assert 'left out the example data sets mnist cifar10: KEEP="mnist cifar10" keeps them' in proc.stdout
    return dest


def test_the_copy_names_its_own_package_everywhere(acme: Path) -> None:
    assert (acme / "src" / "acme" / "train.py").is_file() and not (acme / "src" / "lightspeed").exists()
    texts = text_files(acme)
    named = [
        f"{name}:{n}"
        for name, text in texts.items()
        for n, line in enumerate(text.splitlines(), 1)
        if re.search(r"lightspeed", line, re.I) and not line.startswith("Made from Lightspeed (")
    ]
    assert named == []  # but the README's line that says where the project came from
    origin = re.compile(r"^Made from Lightspeed \(.*\n", re.M)
    machinery = [
        n for n, t in texts.items() if re.search(r"new.project|template: (begin|end)", origin.sub("", t))
    ]
    assert machinery == []  # the template's own blocks are left out
    assert '\nname = "acme"\n' in texts["pyproject.toml"]
    assert '\nacme-train = "acme.train:main"\n' in texts["pyproject.toml"]
    assert (
        "-m acme.train" in texts["Makefile"]
        and "_target_: acme.models.classifier" in texts["conf/model/cnn.yaml"]
    )
    assert texts["README.md"].startswith("# acme\n\nMade from Lightspeed (")
    # the template's own files, the same set but the examples left out
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.split()
    left_out = {name for name in tracked if re.search(r"mnist|cifar10|new_project", name)}
    copied = subprocess.run(["git", "ls-files"], cwd=acme, capture_output=True, text=True).stdout.split()
    assert len(copied) == len(set(tracked) - left_out) and left_out and not set(copied) & left_out


def test_the_examples_left_out_leave_nothing_that_names_them(acme: Path) -> None:
    code = {name: text for name, text in text_files(acme).items() if not name.endswith(".md")}
    for name, text in code.items():
        if name in ("scripts/new_project.py", "tests/test_new_project.py"):  # what may be left out, and this
            continue
        assert not re.search(
            r"data[.=/](fashion_)?mnist|data[.=/]cifar10|experiment=\w*(mnist|cifar)", text
        ), name


def test_the_copy_is_a_git_repository_with_one_clean_commit(acme: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    assert acme.stat().st_mode & 0o777 == 0o777 & ~umask  # not the temporary folder's private mode
    log = subprocess.run(["git", "log", "--format=%s"], cwd=acme, capture_output=True, text=True).stdout
    status = subprocess.run(["git", "status", "--porcelain"], cwd=acme, capture_output=True, text=True).stdout
    assert log.splitlines() == ["acme: a new project from Lightspeed"] and status == ""


@pytest.mark.slow  # a run of the copy in a fresh process (the copy's own make test, below, trains more)
def test_the_copy_trains_under_its_own_name(acme: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(acme / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "acme.train", "debug=fdr", "callbacks.rich_progress_bar=null",
         "print_config=false", f"paths.log_dir={tmp_path / 'logs'}"],
        cwd=acme, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "acme: training finished" in proc.stdout and "lightspeed" not in (proc.stdout + proc.stderr).lower()
    )


def test_kept_examples_come_with_their_configs_code_and_tests(tmp_path: Path) -> None:
    proc = new_project("acme", str(tmp_path / "acme"), "--keep", "mnist")
    assert proc.returncode == 0, proc.stderr
    assert "left out the example data sets cifar10" in proc.stdout
    for name in (
        "conf/data/mnist.yaml",
        "conf/data/fashion_mnist.yaml",
        "src/acme/data/mnist.py",
        "tests/test_mnist.py",
    ):
        assert (tmp_path / "acme" / name).is_file(), name
    assert not (tmp_path / "acme" / "conf" / "data" / "cifar10.yaml").exists()
    assert "from acme.data.mnist import" in (tmp_path / "acme" / "tests" / "test_mnist.py").read_text()


BAD = {
    "name": (["My-Proj", "{tmp}/a"], "NAME='My-Proj' is not a Python package name: use lowercase letters, "
             "digits and _ (my_proj)"),
    "taken": (["torch", "{tmp}/a"], "NAME=torch is already a Python module here (imports would clash): "
              "choose another name"),
    "dest-full": (["acme", "{tmp}/full"], "DEST={tmp}/full exists and is not an empty folder: give a new one "
                  "(nothing was written)"),
    "dest-parent": (["acme", "{tmp}/no/such/a"], "DEST={tmp}/no/such/a: its parent folder {tmp}/no/such "
                    "does not exist: make it first"),
    "dest-inside": (["acme", "{repo}/acme"], "DEST={repo}/acme is inside this repository: give a folder "
                    "outside it (e.g. ../myproject)"),
    "keep": (["acme", "{tmp}/a", "--keep", "mnist,svhn"], "KEEP=mnist svhn: svhn is not an example data set "
             "(mnist, cifar10)"),
    "nothing": ([], 'give NAME and DEST: make new-project NAME=my_project DEST=../my_project '
                '[KEEP="mnist cifar10"]'),
}  # fmt: skip


@pytest.mark.parametrize(("args", "line"), BAD.values(), ids=BAD.keys())
def test_a_bad_name_dest_or_keep_is_one_line_and_writes_nothing(
    tmp_path: Path, args: list[str], line: str
) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("kept")
    args = [a.format(tmp=tmp_path, repo=REPO) for a in args]
    proc = new_project(*args)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "error: " + line.format(tmp=tmp_path, repo=REPO)
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # no half-built folder beside DEST
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["mine.txt"] and not (REPO / "acme").exists()


@pytest.mark.slow
def test_the_copy_s_own_make_install_and_make_test_pass(tmp_path: Path) -> None:
    """As its README says, in the copy: a venv of its own (the local CPU build of torch 2.13, the oldest
    supported, to keep this short), then its fast test suite."""
    dest = tmp_path / "acme"
    assert new_project("acme", str(dest)).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "MAKE", "VIRTUAL_ENV"))}
    install = subprocess.run(
        ["make", "install", "TORCH=torch==2.13.0", f"PYTHON={sys.executable}"],
        cwd=dest, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    test = subprocess.run(["make", "test"], cwd=dest, env=env, capture_output=True, text=True, timeout=1200)
    assert test.returncode == 0, test.stdout[-5000:] + test.stderr[-2000:]
    assert re.search(r"\d+ passed", test.stdout) and " failed" not in test.stdout


def test_a_commit_git_refuses_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    """A commit hook that fails (or a signing key that is not there): git's own reason, nothing left."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "pre-commit").write_text("#!/bin/sh\necho 'refused by policy' >&2\nexit 1\n")
    (hooks / "pre-commit").chmod(0o755)
    env = {**os.environ, "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.hooksPath"}
    env["GIT_CONFIG_VALUE_0"] = str(hooks)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "acme", str(tmp_path / "acme")], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: git commit failed in the new project (refused by policy): nothing was written"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hooks"]
