"""`make new-project NAME=... DEST=...`: a project of your own that depends on this engine.

The project holds what the user owns and nothing of the machinery: its package `src/<name>/` (the
examples' LightningModules in models/, their DataModules in data/, a short train.py), conf/ (train, eval,
export and shards configs, the data, model, experiment and hparams_search groups), tests/test_project.py
(every data set, model and experiment of its conf/ trained for one batch), a Makefile, a README and a
pyproject.toml that pins the engine (ENGINE=, by default this checkout's commit as a `git+file://` URL).
The engine's groups (trainer, accel, callbacks, logger, paths, hydra, debug) and commands come from the
pinned `lightspeed` package, so that a fix reaches the project when its pin moves (docs/engine.md).

The files are this template's own examples (copied, their module paths renamed to the project's) and
the scaffold in scripts/project/ (`myproject` renamed). The downloaded example data sets (MNIST and
Fashion-MNIST, CIFAR-10) stay in the engine; KEEP copies their configs, which name the engine's classes.

Each setting is checked before anything is written: a bad one is a line naming it and its fix (exit 2).
The project is built in a temporary folder beside DEST and renamed into place at the end (an atomic step:
of two runs at once to one DEST, one wins and the other writes nothing), so a failure leaves nothing
half-copied. Standard library only (it runs before any install: `python3 scripts/new_project.py`), but for
packaging, which checks ENGINE: pip's own copy where packaging itself is not installed.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import keyword
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

TEMPLATE = Path(__file__).resolve().parent.parent
SCAFFOLD = TEMPLATE / "scripts" / "project"
PACKAGE = "lightspeed"
PLACEHOLDER = "myproject"  # the scaffold's name for the project's package

#: The template's examples every project starts with: the default run (digits), a regression (diabetes)
#: and a sequence task (sort), with the models that train them.
COPIED = (
    "conf/train.yaml", "conf/eval.yaml", "conf/export.yaml", "conf/shards.yaml",
    "conf/data/digits.yaml", "conf/data/diabetes.yaml", "conf/data/sort.yaml", "conf/data/synthetic.yaml",
    "conf/model/cnn.yaml", "conf/model/mlp.yaml", "conf/model/linear.yaml", "conf/model/regressor.yaml",
    "conf/model/gpt.yaml", "conf/experiment/digits_mlp.yaml", "conf/experiment/diabetes_linear.yaml",
    "conf/experiment/diabetes_mlp.yaml", "conf/experiment/sort_gpt.yaml",
    "conf/hparams_search/digits_optuna.yaml", "scripts/install.py", "scripts/exit_code.sh",
    "scripts/docker.mk", "Dockerfile", ".dockerignore",
    "src/lightspeed/models/classifier.py", "src/lightspeed/models/regressor.py",
    "src/lightspeed/models/next_token.py", "src/lightspeed/models/gpt.py",
    "src/lightspeed/data/digits.py", "src/lightspeed/data/diabetes.py", "src/lightspeed/data/sort.py",
    "src/lightspeed/data/synthetic.py",
)  # fmt: skip

#: The example data sets that download, which a project may keep: their configs, naming the engine's
#: DataModules (lightspeed.data.mnist, lightspeed.data.cifar10).
EXAMPLES: dict[str, tuple[str, ...]] = {
    "mnist": (
        "conf/data/mnist.yaml",
        "conf/data/fashion_mnist.yaml",
        "conf/experiment/mnist_cnn.yaml",
        "conf/experiment/fashion_mnist_cnn.yaml",
    ),
    "cifar10": ("conf/data/cifar10.yaml", "conf/experiment/cifar10_resnet.yaml", "conf/model/resnet.yaml"),
}

#: The copied modules, whose paths (`lightspeed.models.classifier`) become the project's; and the names
#: the template's data/__init__.py gives two of them.
MODULES = ("classifier", "regressor", "next_token", "gpt", "digits", "diabetes", "sort", "synthetic")
MOVED = re.compile(rf"\b{PACKAGE}\.(models|data)\.({'|'.join(MODULES)})\b")
SHORT = re.compile(rf"\b{PACKAGE}\.data\.(Digits|Synthetic)DataModule\b")
ENTRY = re.compile(rf"\b{PACKAGE}\.train\b")
MOVED_FILE = re.compile(rf"\bsrc/{PACKAGE}/(models|data)/({'|'.join(MODULES)})\.py\b")

#: Modules the project imports or its tests run beside: a package of that name would shadow them, and the
#: interpreter that runs this script may not have them installed yet.
TAKEN = {
    "torch", "torchvision", "torchmetrics", "lightning", "pytorch_lightning", "lightning_fabric", "hydra",
    "omegaconf", "numpy", "rich", "PIL", "yaml", "matplotlib", "litdata", "mlflow", "wandb", "optuna",
    "onnx", "onnxruntime", "onnxscript", "pytest", "tests", "conftest", "scripts",
    "sklearn", "scipy", "lightning_utilities", "tqdm", "psutil", "triton", "requests", "tensorboard",
    "xdist", "ruff", "uv", "src",
}  # fmt: skip


class Refused(Exception):
    """A bad NAME, DEST, KEEP or ENGINE: one line for the user."""


def check_name(name: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,99}", name) or keyword.iskeyword(name):
        hint = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "my_project"
        raise Refused(
            f"NAME={name!r} is not a Python package name: use up to 100 lowercase letters, digits and _ "
            f"({hint[:100]})"
        )
    if (
        name in TAKEN | {PACKAGE}
        or name in sys.stdlib_module_names
        or importlib.util.find_spec(name) is not None
    ):
        raise Refused(
            f"NAME={name} is already a Python module here (imports would clash): choose another name"
        )
    return name


def check_dest(given: Path) -> Path:
    """DEST, its parent folders' links resolved; never a link itself, which would write at its target."""
    try:
        dest = given.expanduser()
        if dest.is_symlink():
            raise Refused(f"DEST={given} is a symbolic link: give the path of a new folder, not a link")
        dest = dest.resolve()
        if dest == TEMPLATE or TEMPLATE in dest.parents:
            raise Refused(
                f"DEST={dest} is inside this repository: give a folder outside it (e.g. ../myproject)"
            )
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise Refused(
                f"DEST={dest} exists and is not an empty folder: give a new one (nothing was written)"
            )
        if not dest.parent.is_dir():
            raise Refused(f"DEST={dest}: its parent folder {dest.parent} does not exist: make it first")
    except (OSError, RuntimeError, ValueError) as err:  # too long, a loop of links, ~user unknown, NUL
        raise Refused(f"DEST={given}: {reason(err)}: give another folder (nothing was written)") from None
    return dest


def reason(err: Exception) -> str:
    return err.strerror if isinstance(err, OSError) and err.strerror else str(err)


def check_keep(keep: list[str]) -> list[str]:
    unknown = sorted(set(keep) - set(EXAMPLES))
    if unknown:
        raise Refused(
            f"KEEP={' '.join(keep)}: {', '.join(unknown)} is not an example data set: "
            f"choose from {', '.join(EXAMPLES)}"
        )
    return sorted(set(keep))


def engine_pin(engine: str) -> tuple[str, str]:
    """The URL that pins the engine (ENGINE as given, checked, else this checkout's commit), and a line for
    the user where the pin is not what they may think."""
    if engine:
        return check_engine(engine), ""
    if not ((TEMPLATE / ".git").exists() and shutil.which("git")):
        return TEMPLATE.as_uri(), f"the engine is pinned to the folder {TEMPLATE} (not a git checkout)"
    commit = git(TEMPLATE, "rev-parse", "HEAD").stdout.strip()
    said = "this checkout's commit, a local path: ENGINE=git+<url>@<tag> pins a published engine"
    if git(TEMPLATE, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        said += "; the uncommitted changes here are not in it"
    return f"git+file://localhost{quote(str(TEMPLATE))}@{commit}", said


def git(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True)


def check_engine(engine: str) -> str:
    """ENGINE as pyproject.toml will pin it: a URL that a requirement takes as it is given (no marker, no
    character a URL does not hold) and, where it is local, a path and git ref that exist (no network)."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:  # a bare python3, as this runs before any install: pip's own copy
        try:
            from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
        except ImportError:
            raise Refused(
                f"ENGINE={engine} cannot be checked: {sys.executable} has neither packaging nor pip: "
                "give PYTHON=<a Python with pip>"
            ) from None
    fix = "give git+https://<host>/<repo>@<tag>, git+file://localhost/<path>@<tag> or file:///<path>"
    try:
        url = Requirement(f"{PACKAGE} @ {engine}").url
    except InvalidRequirement:
        url = None
    scheme = urlsplit(engine).scheme if engine.isprintable() else ""
    if url != engine or not re.fullmatch(r"https?|file|git\+(https?|file|ssh|git)", scheme):
        raise Refused(f"ENGINE={engine!r} is not a URL pip installs from: {fix}")
    if scheme.endswith("file"):
        local = local_engine(engine)
        if local:
            raise Refused(f"ENGINE={engine}: {local}: {fix}")
    return engine


def local_engine(engine: str) -> str:
    """Why a file:// ENGINE cannot be installed from, or "": its path exists, and its git ref (pip's
    `@<ref>` after the path) is a commit of the repository there."""
    parts = urlsplit(engine)
    if parts.netloc not in ("", "localhost"):
        return f"{parts.netloc} is not this machine (a file:// URL names a local path)"
    path, ref = unquote(parts.path), "HEAD"
    if parts.scheme == "git+file" and "@" in path:
        path, ref = path.rsplit("@", 1)
    if not Path(path).exists():
        return f"{path} does not exist"
    verify = ["-C", path, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"]
    if parts.scheme == "git+file" and shutil.which("git") and git(TEMPLATE, *verify).returncode:
        return f"{ref} is no tag, branch or commit of a git repository at {path} (git -C {path} tag)"
    return ""


def project_files(keep: list[str]) -> dict[str, bytes]:
    """Every file of the new project, by its path in the project, before the package is named."""
    files: dict[str, bytes] = {}
    for rel in (*COPIED, *(f for example in keep for f in EXAMPLES[example])):
        text = (TEMPLATE / rel).read_text(encoding="utf-8")
        text = ENTRY.sub(f"{PLACEHOLDER}.train", MOVED.sub(rf"{PLACEHOLDER}.\1.\2", text))
        text = MOVED_FILE.sub(rf"src/{PLACEHOLDER}/\1/\2.py", text)
        text = SHORT.sub(lambda m: f"{PLACEHOLDER}.data.{m.group(1).lower()}.{m.group(1)}DataModule", text)
        files[rel.replace(f"src/{PACKAGE}/", f"src/{PLACEHOLDER}/")] = text.encode()
    for path in sorted(SCAFFOLD.rglob("*")):
        if path.is_file() and not {"__pycache__", ".ruff_cache", ".pytest_cache"} & set(path.parts):
            files[path.relative_to(SCAFFOLD).as_posix()] = path.read_bytes()
    return files


def write_project(name: str, into: Path, keep: list[str], engine: str) -> None:
    placeholder = re.compile(rf"(?<![A-Za-z0-9_]){PLACEHOLDER}(?![A-Za-z0-9_])")
    for rel, raw in project_files(keep).items():
        target = into / placeholder.sub(name, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        text = placeholder.sub(name, raw.decode()).replace(
            "ENGINE_URL", json.dumps(engine, ensure_ascii=False)[1:-1]
        )
        if rel == "README.md":
            title, _, rest = text.partition("\n")
            text = f"{title}\n\n{origin_line(engine)}{rest}"
        target.write_text(text, encoding="utf-8")


def origin_line(engine: str) -> str:
    return f"Made by Lightspeed's `make new-project` on {datetime.date.today()}; engine: `{engine}`.\n"


def git_init(folder: Path, name: str) -> None:
    """A repository of its own with the copy as its first commit (its runs record a commit, as here)."""
    if not shutil.which("git"):
        return
    env = dict(os.environ)
    for key, value in (("NAME", "new-project"), ("EMAIL", "new-project@localhost")):
        for who in ("AUTHOR", "COMMITTER"):
            if subprocess.run(
                ["git", "config", f"user.{key.lower()}"], cwd=folder, capture_output=True
            ).returncode:
                env.setdefault(f"GIT_{who}_{key}", value)
    for command in (
        ["init", "-q"],
        ["add", "-A"],
        ["commit", "-q", "-m", f"{name}: a new project from Lightspeed"],
    ):
        proc = subprocess.run(["git", *command], cwd=folder, env=env, capture_output=True, text=True)
        if proc.returncode != 0:  # a commit hook, a signing key that is not there, ...
            said = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise Refused(f"git {command[0]} failed in the new project ({said}): nothing was written")


def new_project(name: str, dest: Path, keep: list[str], engine: str) -> Path:
    """The project at DEST, or Refused with nothing written: the settings are checked first, then it is
    built beside DEST and renamed into place in one step."""
    name, dest, keep = check_name(name), check_dest(dest), check_keep(keep)
    try:
        building = Path(tempfile.mkdtemp(prefix=".new-project-", dir=dest.parent))
    except OSError as err:  # read-only, /proc, ...
        raise Refused(
            f"DEST={dest}: cannot write in {dest.parent} ({reason(err)}): give a folder you can write in"
        ) from None
    try:
        write_project(name, building, keep, engine)
        git_init(building, name)
        umask = os.umask(0)
        os.umask(umask)
        building.chmod(0o777 & ~umask)  # as a folder made by mkdir, not mkdtemp's private one
        try:
            building.rename(dest)  # replaces an empty folder; fails where another run put its project first
        except OSError as err:
            raise Refused(
                f"DEST={dest} was taken while this ran ({reason(err)}; another new-project to it at once?): "
                "give a new folder (nothing was written)"
            ) from None
    except OSError as err:
        raise Refused(
            f"DEST={dest}: {reason(err)} while writing the project: give a folder with room "
            "(nothing was written)"
        ) from None
    finally:
        shutil.rmtree(building, ignore_errors=True)  # gone once renamed
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", nargs="?", default="", help="the new package's name (NAME=)")
    parser.add_argument("dest", nargs="?", default="", help="the folder to create (DEST=)")
    parser.add_argument("--keep", default="", help="example data sets to keep, by space or comma (KEEP=)")
    parser.add_argument("--engine", default="", help="the engine's URL to pin, e.g. git+https://...@v0.2.0")
    args = parser.parse_args(argv)
    if not args.name or not args.dest:
        print(
            "error: give NAME and DEST: make new-project NAME=my_project DEST=../my_project "
            '[KEEP="mnist cifar10"] [ENGINE=git+<url>@<tag>]',
            file=sys.stderr,
        )
        return 2
    keep = [k for k in re.split(r"[\s,]+", args.keep) if k]
    try:
        engine, said = engine_pin(args.engine)
        dest = new_project(args.name, Path(args.dest), keep, engine)
    except Refused as err:
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        return 2
    except Exception as err:  # the one failure boundary of every command (docs/resilience.md)
        if os.environ.get("LIGHTSPEED_DEBUG") == "1":
            raise
        said = one_line((str(err).strip().splitlines() or [""])[0])
        print(
            f"error: new-project: {type(err).__name__}: {said}; LIGHTSPEED_DEBUG=1 shows its traceback",
            file=sys.stderr,
        )
        return 3
    shown = one_line(str(dest))
    print(f"{args.name}: a new project in {shown} (package src/{args.name}/, a git repository, one commit)")
    print(f"engine: lightspeed @ {engine}" + (f" ({said})" if said else ""))
    print(f"next: cd {shown} && make install && make test && make train")
    return 0


def one_line(text: str) -> str:
    """`text` with what a terminal would not show as it is (a newline, an undecodable byte) escaped."""
    return text if text.isprintable() else repr(text)[1:-1]


if __name__ == "__main__":
    sys.exit(main())
