"""`make new-project NAME=... DEST=...`: a thin project that pins the engine (its package, conf/, tests,
Makefile, README), built beside DEST and renamed into place. The slow test pins a git tag of the engine and
runs the project's own `make install`, `make test`, `make train` and `make eval`."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_module
from test_engine import copy_source

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "new_project.py"
spec = importlib.util.spec_from_file_location("new_project_script", SCRIPT)
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)  # its functions, called in process where a subprocess is not the point


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


#: Where the fast tests' projects pin the engine: they install nothing, and a remote URL is not looked up.
PIN = "git+https://example.invalid/lightspeed@v9.9.9"


@pytest.fixture(scope="module")
def acme(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("projects") / "acme"
    proc = new_project("acme", str(dest), "--engine", PIN)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1] == f"engine: lightspeed @ {PIN}"
    return dest


#: What a project holds: its package (the examples' modules), its conf/ (no engine group), its tests.
EXPECTED = {
    ".gitignore", "Makefile", "README.md", "pyproject.toml", "scripts/install.py", "conf/local/.gitkeep",
    "Dockerfile", ".dockerignore", "scripts/docker.mk", "scripts/exit_code.sh",
    "conf/train.yaml", "conf/eval.yaml", "conf/export.yaml", "conf/shards.yaml",
    "conf/data/digits.yaml", "conf/data/diabetes.yaml", "conf/data/sort.yaml", "conf/data/synthetic.yaml",
    "conf/model/cnn.yaml", "conf/model/mlp.yaml", "conf/model/linear.yaml", "conf/model/regressor.yaml",
    "conf/model/gpt.yaml", "conf/experiment/digits_mlp.yaml", "conf/experiment/diabetes_linear.yaml",
    "conf/experiment/diabetes_mlp.yaml", "conf/experiment/sort_gpt.yaml",
    "conf/hparams_search/digits_optuna.yaml", "tests/test_project.py",
    "src/acme/__init__.py", "src/acme/train.py", "src/acme/models/__init__.py",
    "src/acme/models/classifier.py", "src/acme/models/regressor.py", "src/acme/models/next_token.py",
    "src/acme/models/gpt.py", "src/acme/data/__init__.py", "src/acme/data/digits.py",
    "src/acme/data/diabetes.py", "src/acme/data/sort.py", "src/acme/data/synthetic.py",
}  # fmt: skip


def test_the_project_holds_the_user_s_part_under_its_name_and_pins_the_engine(acme: Path) -> None:
    texts = text_files(acme)
    assert set(texts) == EXPECTED  # nothing of the machinery: no engine group, no core/, no run/
    lines = sum(len(t.splitlines()) for n, t in texts.items() if n.endswith((".py", ".yaml")))
    assert lines <= 1500, f"{lines} lines of Python and YAML in a new project"
    assert f'"lightspeed[bench] @ {PIN}",' in texts["pyproject.toml"]
    assert '\nname = "acme"\n' in texts["pyproject.toml"]
    assert "-m acme.train" in texts["Makefile"] and "myproject" not in "".join(texts.values())
    targets = re.findall(r"_target_: (\S+)", "".join(t for n, t in texts.items() if n.startswith("conf/")))
    ours = {t for t in targets if not t.startswith(("torch.", "optuna."))}
    assert ours and all(t.startswith(("acme.models.", "acme.data.")) for t in ours), ours
    code = "".join(t for n, t in texts.items() if n.startswith("src/"))
    assert not re.search(r"lightspeed\.(models|data)\.(classifier|regressor|next_token|gpt|digits)\b", code)
    assert texts["README.md"].startswith("# acme\n\nMade by Lightspeed's `make new-project` on ")


def dry(project: Path, *args: str) -> str:
    """What `make <args>` would run in the project (`make -n`)."""
    proc = subprocess.run(["make", "-n", *args], cwd=project, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_project_s_bench_and_tune_measure_its_own_train_py(acme: Path) -> None:
    """Its train.py may add callbacks or steps: what `make tune` and `make bench` time is that training
    (tests/test_tune.py: a measured run is the module $LIGHTSPEED_TRAIN names)."""
    for target in ("tune", "bench"):  # the venv: .venv, or the one a make around this test names
        said = dry(acme, target, "trainer.max_epochs=2")
        assert re.search(
            rf"^LIGHTSPEED_TRAIN=acme\.train \S+/bin/lightspeed {target} 'trainer\.max_epochs=2'", said, re.M
        )


def test_the_project_s_container_is_its_own_and_runs_its_own_entry(acme: Path) -> None:
    """The same Dockerfile and docker targets as the template (tests/test_docker.py builds and runs them),
    named for the project and running its train.py; what make would run, read with `make -n`."""
    assert '\nCMD [".venv/bin/python", "-m", "acme.train"]\n' in (acme / "Dockerfile").read_text()
    assert {".venv*", "logs", "data"} <= set((acme / ".dockerignore").read_text().splitlines())

    assert "docker build -t acme " in dry(acme, "docker-build")
    train = dry(acme, "docker-train", "trainer.max_epochs=2", "IMAGE=acme:1", "LOGS=/tmp/acme-logs")
    assert '-v "/tmp/acme-logs:/app/logs" ' in train and f'-v "{acme}/data:/app/data" ' in train
    assert " acme:1 .venv/bin/python -m acme.train 'trainer.max_epochs=2'" in train, train
    assert '--user "$(id -u):$(id -g)"' in train and "bash scripts/exit_code.sh" in train


def test_every_extra_of_the_engine_is_an_extra_of_the_project_under_its_name(acme: Path) -> None:
    """The engine's one-line errors say `make install EXTRAS=dev,export`: that must work in a project too
    (bench is in the pin itself)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    engine = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    project = tomllib.loads((acme / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {name: project.get(name) for name in engine if name not in ("dev", "bench")} == {
        name: [f"lightspeed[{name}]"] for name in engine if name not in ("dev", "bench")
    }
    assert {"pytest", "pytest-xdist", "ruff"} <= {re.split(r"[<>=]", d)[0] for d in project["dev"]}


def test_the_engine_is_pinned_at_this_checkout_s_commit_by_default(tmp_path: Path) -> None:
    proc = new_project("acme", str(tmp_path / "acme"))
    assert proc.returncode == 0, proc.stderr
    pinned = re.search(r'"lightspeed\[bench\] @ (.+)",', (tmp_path / "acme" / "pyproject.toml").read_text())[
        1
    ]
    if (REPO / ".git").exists():
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
        assert pinned == f"git+file://localhost{REPO}@{head.stdout.strip()}"
    else:  # CI's tree may be no git checkout: the folder itself
        assert pinned == REPO.as_uri()


def test_the_project_is_a_git_repository_with_one_clean_commit(acme: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    assert acme.stat().st_mode & 0o777 == 0o777 & ~umask  # not the temporary folder's private mode
    log = subprocess.run(["git", "log", "--format=%s"], cwd=acme, capture_output=True, text=True).stdout
    status = subprocess.run(["git", "status", "--porcelain"], cwd=acme, capture_output=True, text=True).stdout
    assert log.splitlines() == ["acme: a new project from Lightspeed"] and status == ""


def test_kept_examples_bring_their_configs_which_name_the_engine_s_data_sets(tmp_path: Path) -> None:
    proc = new_project("acme", str(tmp_path / "acme"), "--keep", "mnist", "--engine", PIN)
    assert proc.returncode == 0, proc.stderr
    conf = tmp_path / "acme" / "conf"
    assert set(text_files(tmp_path / "acme")) == EXPECTED | {
        "conf/data/mnist.yaml", "conf/data/fashion_mnist.yaml",
        "conf/experiment/mnist_cnn.yaml", "conf/experiment/fashion_mnist_cnn.yaml",
    }  # fmt: skip
    assert "_target_: lightspeed.data.mnist.MNISTDataModule" in (conf / "data" / "mnist.yaml").read_text()
    assert "acme.models.classifier" in (conf / "model" / "cnn.yaml").read_text()


BAD = {
    "name": (["My-Proj", "{tmp}/a"], "NAME='My-Proj' is not a Python package name: use up to 100 lowercase "
             "letters, digits and _ (my_proj)"),
    "taken": (["torch", "{tmp}/a"], "NAME=torch is already a Python module here (imports would clash): "
              "choose another name"),
    "dest-full": (["acme", "{tmp}/full"], "DEST={tmp}/full exists and is not an empty folder: give a new one "
                  "(nothing was written)"),
    "dest-parent": (["acme", "{tmp}/no/such/a"], "DEST={tmp}/no/such/a: its parent folder {tmp}/no/such "
                    "does not exist: make it first"),
    "dest-inside": (["acme", "{repo}/acme"], "DEST={repo}/acme is inside this repository: give a folder "
                    "outside it (e.g. ../myproject)"),
    "keep": (["acme", "{tmp}/a", "--keep", "mnist,svhn"], "KEEP=mnist svhn: svhn is not an example data set: "
             "choose from mnist, cifar10"),
    "nothing": ([], 'give NAME and DEST: make new-project NAME=my_project DEST=../my_project '
                '[KEEP="mnist cifar10"] [ENGINE=git+<url>@<tag>]'),
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


def make(target: str, *args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["make", target, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, f"make {target}: {proc.stdout[-4000:]}{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow  # a venv, the engine built from a git tag, the project's tests, two runs: ~2 min
def test_a_new_project_installs_tests_trains_and_evaluates_as_its_readme_says(tmp_path: Path) -> None:
    """The engine pinned as a real project pins it, by a tag of a git repository (a copy of this source);
    the project's own `make install` (the local CPU build of torch 2.13, the oldest supported, to keep it
    short), `make lint`, `make test`, `make train` (the template's default result) and `make eval`."""
    engine = copy_source(tmp_path / "lightspeed")
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "engine"], ["tag", "v1"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *command], cwd=engine, check=True)
    dest = tmp_path / "acme"
    assert new_project("acme", str(dest), "--engine", f"git+file://localhost{engine}@v1").returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "MAKE", "VIRTUAL_ENV"))}
    env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "LIGHTSPEED_CONF")} | {
        "OMP_NUM_THREADS": "1"
    }
    make("install", "TORCH=torch==2.13.0", f"PYTHON={sys.executable}", cwd=dest, env=env)
    make("lint", cwd=dest, env=env)  # the project passes its own ruff, its engine imports a block apart
    test = make("test", cwd=dest, env=env)
    assert re.search(r"\d+ passed", test.stdout) and " failed" not in test.stdout
    train = make("train", "trainer.max_epochs=2", cwd=dest, env=env)
    assert "Lightspeed: training finished" in train.stdout and "digits-cnn-" in train.stdout
    ours = run_module(
        "lightspeed.train", "trainer.max_epochs=2", f"paths.log_dir={tmp_path / 'ours'}", cwd=REPO
    )
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert accuracy_printed(train.stdout) == accuracy_printed(ours.stdout)  # the same run, under another name
    evaluated = make("eval", "predict=true", cwd=dest, env=env)
    assert accuracy_printed(evaluated.stdout) == accuracy_printed(train.stdout)
    assert list((dest / "logs" / "eval" / "runs").glob("*/predictions.csv"))


def accuracy_printed(printed: str) -> str:
    return re.findall(r"│ test/acc +│ ([0-9.]+)", printed)[-1]


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


def tagged_repo(repo: Path) -> Path:
    """A local git repository with a tag v1 in `repo`, for ENGINE=git+file://localhost<repo>@v1."""
    for command in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "engine"], ["tag", "v1"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *command], cwd=repo, check=True)
    return repo


@pytest.fixture(scope="module")
def engine_repo(tmp_path_factory) -> Path:
    return tagged_repo(tmp_path_factory.mktemp("engine"))


#: The fix a refusal names: what to do, after a colon.
FIX = re.compile(r": (give|use|make|choose) ")

#: Settings checked before anything is written; {tmp} holds `link` (to a `target` that is not there) and
#: `loop` (a link to itself).
REFUSED = {
    "dest-dangling-link": (["acme", "{tmp}/link"], "DEST"),
    "dest-link-loop": (["acme", "{tmp}/loop"], "DEST"),
    "dest-under-a-loop": (["acme", "{tmp}/loop/acme"], "DEST"),
    "dest-300-characters": (["acme", "{tmp}/" + "a" * 300], "DEST"),
    "dest-proc": (["acme", "/proc/acme"], "DEST"),
    "name-300-characters": (["a" * 300, "{tmp}/a"], "NAME"),
    "engine-not-a-url": (["acme", "{tmp}/a", "--engine=not a url"], "ENGINE"),
    "engine-quote": (["acme", "{tmp}/a", '--engine=git+https://h/x@v1" , "x", "'], "ENGINE"),
    "engine-marker": (["acme", "{tmp}/a", '--engine=git+https://h/x@v1 ; python_version<"4"'], "ENGINE"),
    "engine-newline": (["acme", "{tmp}/a", "--engine=git+https://h/x@v1\nevil = 1"], "ENGINE"),
    "engine-a-path": (["acme", "{tmp}/a", "--engine={engine}"], "ENGINE"),
    "engine-missing-path": (["acme", "{tmp}/a", "--engine=git+file://localhost{tmp}/none@v1"], "ENGINE"),
    "engine-missing-tag": (["acme", "{tmp}/a", "--engine=git+file://localhost{engine}@v2"], "ENGINE"),
    "engine-missing-file": (["acme", "{tmp}/a", "--engine=file://{tmp}/none.tar.gz"], "ENGINE"),
}  # fmt: skip


@pytest.mark.parametrize(("args", "setting"), REFUSED.values(), ids=REFUSED.keys())
def test_a_setting_is_checked_before_anything_is_written(
    tmp_path: Path, engine_repo: Path, capsys, args: list[str], setting: str
) -> None:
    """One line naming the setting and its fix, exit 2; the links and their missing target as they were."""
    if "/proc/" in args[1] and not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    code = script.main([a.format(tmp=tmp_path, engine=engine_repo) for a in args])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "", captured
    [line] = captured.err.splitlines()
    assert line.startswith(f"error: {setting}=") and FIX.search(line), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "loop"]


def test_an_engine_at_a_tag_of_a_local_repository_is_pinned(
    tmp_path: Path, engine_repo: Path, capsys
) -> None:
    engine = f"git+file://localhost{engine_repo}@v1"
    assert script.main(["acme", str(tmp_path / "acme"), f"--engine={engine}"]) == 0, capsys.readouterr()
    assert f'"lightspeed[bench] @ {engine}",' in (tmp_path / "acme" / "pyproject.toml").read_text()


def test_of_two_runs_at_once_to_one_dest_one_wins_and_the_other_is_one_line(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """The other run's project lands at DEST while this one builds: this one leaves it whole and removes
    its own half (the step that puts a project in place is one rename)."""
    dest = tmp_path / "acme"
    init = script.git_init

    def the_other_run_wins(folder: Path, name: str) -> None:
        dest.mkdir()
        (dest / "theirs.txt").write_text("the other run's project")
        init(folder, name)

    monkeypatch.setattr(script, "git_init", the_other_run_wins)
    assert script.main(["acme", str(dest), f"--engine={PIN}"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: DEST={dest} ") and FIX.search(line), line
    assert [p.name for p in tmp_path.iterdir()] == ["acme"]  # nothing half-built beside it
    assert [p.name for p in dest.iterdir()] == ["theirs.txt"]


def test_a_disk_that_fills_while_writing_is_one_line_and_leaves_nothing(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    def full(name: str, into: Path, keep: list[str], engine: str) -> None:
        (into / "README.md").write_text("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(script, "write_project", full)
    assert script.main(["acme", str(tmp_path / "acme"), f"--engine={PIN}"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: DEST={tmp_path / 'acme'}: ") and "No space left" in line, line
    assert FIX.search(line), line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # two processes; the test above pins the rename step in process
def test_two_processes_at_once_to_one_dest_make_one_project_and_one_line(tmp_path: Path) -> None:
    args = [sys.executable, str(SCRIPT), "acme", str(tmp_path / "acme"), "--engine", PIN]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"]
    results = sorted((proc.wait(timeout=120), proc.stderr.read().splitlines()) for proc in procs)
    assert [code for code, _ in results] == [0, 2] and len(results[1][1]) == 1, results
    assert [p.name for p in tmp_path.iterdir()] == ["acme"]
    status = subprocess.run(["git", "status", "--porcelain"], cwd=tmp_path / "acme", capture_output=True)
    assert status.returncode == 0 and status.stdout == b""


def test_an_unexpected_error_is_one_line_and_exit_3(tmp_path: Path, capsys, monkeypatch) -> None:
    """The one failure boundary of every command: here a bug of the script's own, simulated."""

    def bug(*args: object) -> None:
        raise KeyError("a bug of the script's own")

    monkeypatch.setattr(script, "new_project", bug)
    assert script.main(["demo", str(tmp_path / "demo")]) == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: new-project: KeyError") and "LIGHTSPEED_DEBUG=1" in line, line
    monkeypatch.setenv("LIGHTSPEED_DEBUG", "1")
    with pytest.raises(KeyError):
        script.main(["demo", str(tmp_path / "demo")])
