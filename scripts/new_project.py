"""`make new-project NAME=... DEST=...`: this template copied into a project of your own.

The copy is the repository's files (git's tracked and untracked-but-not-ignored ones: no .venv, logs or
data) with the package renamed everywhere it is named: the folder src/<name>/, imports, `_target_`s in
conf/, pyproject's name and console scripts, the Makefile's commands, the tests, the README's title. The
downloaded example data sets (MNIST and Fashion-MNIST, CIFAR-10) are left out with their configs,
experiments, code and tests unless KEEP names them; the embedded ones stay (digits is the default run,
and the test suite's data; diabetes and sort are the regression and sequence examples).

It is built in a temporary folder beside DEST and renamed into place at the end, so a failure leaves
nothing half-copied. Standard library only: it runs before any install (`python3 scripts/new_project.py`).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import keyword
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent.parent
PACKAGE = "lightspeed"

#: The example data sets a project may leave out, and every file that is only theirs ({pkg}: the package).
EXAMPLES: dict[str, tuple[str, ...]] = {
    "mnist": (
        "conf/data/mnist.yaml",
        "conf/data/fashion_mnist.yaml",
        "conf/experiment/mnist_cnn.yaml",
        "conf/experiment/fashion_mnist_cnn.yaml",
        "src/{pkg}/data/mnist.py",
        "tests/test_mnist.py",
    ),
    "cifar10": (
        "conf/data/cifar10.yaml",
        "conf/experiment/cifar10_resnet.yaml",
        "src/{pkg}/data/cifar10.py",
        "tests/test_cifar10.py",
    ),
}

#: Modules the project imports or its tests run beside: a package of that name would shadow them, and the
#: interpreter that runs this script may not have them installed yet.
TAKEN = {
    "torch", "torchvision", "torchmetrics", "lightning", "pytorch_lightning", "lightning_fabric", "hydra",
    "omegaconf", "numpy", "rich", "PIL", "yaml", "matplotlib", "litdata", "mlflow", "wandb", "optuna",
    "onnx", "onnxruntime", "onnxscript", "pytest", "tests", "conftest", "fakes", "probes", "scripts",
    "sklearn", "scipy", "lightning_utilities", "tqdm", "psutil", "triton", "requests", "tensorboard",
    "xdist", "ruff", "uv", "src",
}  # fmt: skip

#: The template's own machinery, not copied: this script and its tests. Blocks of other files between a
#: `template: begin` and a `template: end` line (in a # or <!-- --> comment) are left out too.
TEMPLATE_ONLY = ("scripts/new_project.py", "tests/test_new_project.py")
BLOCK = re.compile(  # the block, its end line and the blank lines after it
    r"^[ \t]*(?:#|<!--)[ \t]*template: begin.*?^[ \t]*(?:#|<!--)[ \t]*template: end[^\n]*\n(?:[ \t]*\n)*",
    re.M | re.S,
)

#: Folders never copied when the template is not a git checkout (what .gitignore keeps out).
NOT_COPIED = {
    ".git",
    ".venv",
    ".venv-oldest",
    "logs",
    "data",
    "outputs",
    "multirun",
    "gpu_out",
    "__pycache__",
}


class Refused(Exception):
    """A bad NAME, DEST or KEEP: one line for the user."""


def check_name(name: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        hint = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "my_project"
        raise Refused(
            f"NAME={name!r} is not a Python package name: use lowercase letters, digits and _ ({hint})"
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


def check_dest(dest: Path) -> Path:
    dest = dest.expanduser().resolve()
    if dest == TEMPLATE or TEMPLATE in dest.parents:
        raise Refused(f"DEST={dest} is inside this repository: give a folder outside it (e.g. ../myproject)")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise Refused(f"DEST={dest} exists and is not an empty folder: give a new one (nothing was written)")
    if not dest.parent.is_dir():
        raise Refused(f"DEST={dest}: its parent folder {dest.parent} does not exist: make it first")
    return dest


def check_keep(keep: list[str]) -> list[str]:
    unknown = sorted(set(keep) - set(EXAMPLES))
    if unknown:
        raise Refused(
            f"KEEP={' '.join(keep)}: {', '.join(unknown)} is not an example data set ({', '.join(EXAMPLES)})"
        )
    return sorted(set(keep))


def template_files() -> list[Path]:
    """The repository's files, relative to it: what git tracks or would track; a walk without git."""
    if (TEMPLATE / ".git").exists() and shutil.which("git"):
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=TEMPLATE,
            capture_output=True,
            check=True,
        ).stdout.decode()
        names = sorted({n for n in listed.split("\0") if n})
        return [Path(n) for n in names if (TEMPLATE / n).is_file()]
    found = []
    for root, dirs, files in os.walk(TEMPLATE):
        dirs[:] = sorted(d for d in dirs if d not in NOT_COPIED and not d.endswith(".egg-info"))
        found += [Path(root, f).relative_to(TEMPLATE) for f in sorted(files)]
    return found


def renamer(name: str):
    """The package's name in its three spellings, replaced as whole words (`lightspeed.train`,
    `Lightspeed:`, `LIGHTSPEED_TEST_...`)."""
    table = {PACKAGE: name, PACKAGE.capitalize(): name, PACKAGE.upper(): name.upper()}
    pattern = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(table) + r")(?![a-z0-9])")
    return lambda text: pattern.sub(lambda m: table[m.group(1)], text)


def without_template_blocks(text: str, rel: Path) -> str:
    text = BLOCK.sub("", text)
    if "template: begin" in text or "template: end" in text:
        raise ValueError(f"{rel}: a `template: begin` without its `template: end` (or the other way round)")
    return text


def commit_of_template() -> str:
    if not shutil.which("git"):
        return ""
    proc = subprocess.run(  # a template with edits of its own is named so: abc1234-dirty
        ["git", "describe", "--always", "--dirty"], cwd=TEMPLATE, capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def origin_line(left_out: list[str]) -> str:
    commit = commit_of_template()
    made = f"Made from Lightspeed{f' ({commit})' if commit else ''} by `make new-project`"
    made += f" on {datetime.date.today()}"
    if left_out:
        made += f"; left out: the example data sets {', '.join(left_out)} (the text below still names them)"
    return made + ".\n"


def write_copy(name: str, into: Path, keep: list[str]) -> list[str]:
    """Every file of the template into `into`, renamed; returns the example data sets left out."""
    left_out = [example for example in EXAMPLES if example not in keep]
    skipped = {f.format(pkg=PACKAGE) for example in left_out for f in EXAMPLES[example]} | set(TEMPLATE_ONLY)
    rename = renamer(name)
    for rel in template_files():
        if rel.as_posix() in skipped:
            continue
        target = into / rename(rel.as_posix())
        target.parent.mkdir(parents=True, exist_ok=True)
        raw = (TEMPLATE / rel).read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            target.write_bytes(raw)
        else:
            text = rename(without_template_blocks(text, rel))
            if rel.as_posix() == "README.md":
                title, _, rest = text.partition("\n")
                text = f"{title}\n\n{origin_line(left_out)}{rest}"
            target.write_bytes(text.encode("utf-8"))  # line endings as in the template, on any system
        shutil.copymode(TEMPLATE / rel, target)
    return left_out


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


def new_project(name: str, dest: Path, keep: list[str]) -> list[str]:
    name, dest, keep = check_name(name), check_dest(dest), check_keep(keep)
    building = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        left_out = write_copy(name, building, keep)
        git_init(building, name)
        umask = os.umask(0)
        os.umask(umask)
        building.chmod(0o777 & ~umask)  # as a folder made by mkdir, not mkdtemp's private one
        if dest.exists():
            dest.rmdir()  # empty, checked above
        building.rename(dest)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return left_out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", nargs="?", default="", help="the new package's name (NAME=)")
    parser.add_argument("dest", nargs="?", default="", help="the folder to create (DEST=)")
    parser.add_argument("--keep", default="", help="example data sets to keep, by space or comma (KEEP=)")
    args = parser.parse_args(argv)
    if not args.name or not args.dest:
        print(
            "error: give NAME and DEST: make new-project NAME=my_project DEST=../my_project "
            '[KEEP="mnist cifar10"]',
            file=sys.stderr,
        )
        return 2
    keep = [k for k in re.split(r"[\s,]+", args.keep) if k]
    try:
        left_out = new_project(args.name, Path(args.dest), keep)
    except Refused as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    dest = Path(args.dest).expanduser().resolve()
    print(
        f"{args.name}: a new project in {dest} (package src/{args.name}/, a git repository with one commit)"
    )
    if left_out:
        print(f'left out the example data sets {" ".join(left_out)}: KEEP="{" ".join(left_out)}" keeps them')
    print(f"next: cd {dest} && make install && make test && make train")
    return 0


if __name__ == "__main__":
    sys.exit(main())
