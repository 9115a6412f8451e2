"""Fixes reach projects: a project pinned to engine tag A takes tag B's fix by moving its pin and
reinstalling, with none of its other files touched.

The engine is a git repository of this checkout's source with two tags; the project is what `make
new-project` writes, pinning it as a real project would (`lightspeed @ git+<url>@<tag>`, here a file://
URL); its own entry (`python -m acme.train`) runs with the engine's groups."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from conftest import run_script
from lightspeed import __version__
from test_engine import copy_source, fresh_venv, pip, run

REPO = Path(__file__).resolve().parent.parent
FIXED = "0.99.1"  # the version tag B's commit gives the engine


def git(*args: str, cwd: Path) -> str:
    return run("git", "-c", "user.name=t", "-c", "user.email=t@t", *args, cwd=cwd)


def files(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and not {"logs", "build"} & set(p.relative_to(root).parts)
        and ".egg-info" not in str(p)
    }


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Path:
    """A repository of this checkout's source (as it is, whether or not a git checkout) tagged vA, then
    a fix tagged vB: a new version and a changed default of the engine's own trainer group."""
    clone = copy_source(tmp_path_factory.mktemp("engine") / "lightspeed")
    git("init", "-q", cwd=clone)
    git("add", "-A", cwd=clone)
    git("commit", "-qm", "the engine as it is", cwd=clone)
    git("tag", "vA", cwd=clone)
    init = clone / "src/lightspeed/__init__.py"
    init.write_text(re.sub(r'__version__ = "[^"]+"', f'__version__ = "{FIXED}"', init.read_text()))
    trainer = clone / "src/lightspeed/conf/trainer/default.yaml"
    text = trainer.read_text()
    assert re.search(r"^max_epochs: \d+", text, re.M), "the default the fix changes"
    trainer.write_text(re.sub(r"^max_epochs: \d+", "max_epochs: 7", text, flags=re.M))
    git("commit", "-qam", "fix: a shorter default", cwd=clone)
    git("tag", "vB", cwd=clone)
    return clone


@pytest.mark.slow  # the engine built from git twice and installed into a fresh venv: ~1 min
def test_moving_the_pin_to_a_fixed_tag_brings_the_fix_with_no_project_file_touched(
    engine: Path, tmp_path: Path
) -> None:
    project = tmp_path / "acme"  # what `make new-project` writes, pinned to tag A
    made = run_script(
        "new_project.py", "acme", str(project), "--engine", f"git+file://localhost{engine}@vA", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    python = fresh_venv(tmp_path / "venv")
    lightspeed = tmp_path / "venv" / "bin" / "lightspeed"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LIGHTSPEED_CONF")}

    def installed() -> tuple[str, str]:
        pip(python, "--no-build-isolation", project)
        version = run(lightspeed, "--version", env=env).strip()
        composed = run(python, "-m", "acme.train", "--cfg", "job", cwd=project, env=env)
        return version, re.search(r"^  max_epochs: (\d+)$", composed, re.M)[1]

    assert installed() == (f"lightspeed {__version__}", "20")
    before = files(project)
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("@vA", "@vB"))
    assert installed() == (f"lightspeed {FIXED}", "7")
    after = files(project)
    assert {k for k in before if before[k] != after.get(k)} == {
        "pyproject.toml"
    } and before.keys() == after.keys()
