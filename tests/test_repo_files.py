"""What a contributor expects to find: a pre-commit config that runs the checks CI runs, and a CI workflow
for a public forge that runs `.ci/run`; and the repository passes those hooks as it stands."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml

from conftest import REPO


def test_the_forge_workflow_runs_ci_run_on_pushes_and_pull_requests() -> None:
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert set(triggers) == {"push", "pull_request"}
    (job,) = workflow["jobs"].values()
    assert job["timeout-minutes"] <= 90 and "ubuntu" in job["runs-on"]
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert runs == ["bash .ci/run"]
    python = next(s["with"]["python-version"] for s in job["steps"] if "setup-python" in s.get("uses", ""))
    oldest = re.search(r'requires-python = ">=(\d+)\.(\d+)"', (REPO / "pyproject.toml").read_text())
    assert tuple(map(int, python.split("."))) >= tuple(map(int, oldest.groups()))  # one the project supports
    assert "make test" in (REPO / ".ci" / "run").read_text()  # the README's test command


def test_pre_commit_runs_ruff_at_the_version_lint_uses_and_the_repository_passes_its_hooks() -> None:
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    hooks = {h["id"]: repo for repo in config["repos"] for h in repo["hooks"]}
    assert {"ruff", "ruff-format", "trailing-whitespace", "end-of-file-fixer", "check-yaml"} <= set(hooks)
    ruff = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True, text=True).stdout
    assert hooks["ruff"]["rev"] == "v" + ruff.split()[-1]  # the hook's ruff is the one `make lint` runs
    # what the whitespace, end-of-file and yaml hooks would change or refuse, on the tracked text files
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    for name in files:
        path = REPO / name
        if path.suffix in (".png", ".gz") or not path.is_file():
            continue
        text = path.read_text()
        assert not re.search(r"[ \t]+$", text, re.M), f"{name}: trailing whitespace"
        assert text == "" or (text.endswith("\n") and not text.endswith("\n\n")), f"{name}: end of file"
        if path.suffix in (".yaml", ".yml"):
            yaml.safe_load(text)
