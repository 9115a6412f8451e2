"""`make install`: torch first, the build that suits this machine, then this package with its extras.

Which torch (TORCH=auto, the default): the CUDA build where an NVIDIA driver is found (PyPI's plain
`torch` on Linux); otherwise the much smaller CPU build from PyTorch's own index, or plain `torch` where
that index cannot be reached (its CUDA build runs on the CPU too). macOS and Windows take PyPI's `torch`,
a CPU build there. Any other TORCH value is passed to the installer as it is.

Which installer: uv, installed into the venv first: on a clean clone the first result came in 72 s
instead of pip's 93 s (docs/install.md). uv reads none of pip's settings, so pip's index, find-links,
constraint, certificate and timeout settings are passed on to it; where pip is configured in a way uv
cannot be told, or uv cannot be installed, pip installs, and a line says why.

Standard library only: it runs in the new venv before anything is installed.
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
DRIVER_FILE = Path("/proc/driver/nvidia/version")

#: pip settings uv takes too: flags for `uv pip install`, or environment variables for uv.
PIP_TO_UV_FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
                   "find-links": "--find-links", "constraint": "--constraints"}  # fmt: skip
PIP_TO_UV_ENV = {"cert": "SSL_CERT_FILE", "default-timeout": "UV_HTTP_TIMEOUT", "timeout": "UV_HTTP_TIMEOUT"}
#: pip settings that change nothing about what is installed (config-file: its settings are listed too).
PIP_ONLY_OUTPUT = {"config-file", "disable-pip-version-check", "no-input", "progress-bar", "quiet", "verbose",
                   "no-color", "root-user-action", "no-warn-script-location", "require-virtualenv",
                   "cache-dir", "no-cache-dir"}  # fmt: skip


@dataclass
class Torch:
    """What to install as torch, and why, in words for the user."""

    args: list[str]
    why: str
    index: str | None = None  # an index the torch family comes from (torchvision must come from it too)


@dataclass
class Installer:
    """`command` installs what follows it; `flags` and `env` carry pip's settings over to uv."""

    command: list[str]
    why: str
    flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def is_uv(self) -> bool:
        return Path(self.command[0]).name == "uv"

    def flags_beside(self, index: str | None) -> list[str]:
        """The flags for a command that names its own `--index-url` (pip takes both; uv one)."""
        if index is None or not self.is_uv:
            return self.flags
        kept = [
            f for i, f in enumerate(self.flags) if "--index-url" not in (f, self.flags[i - 1] if i else "")
        ]
        return [*kept, *([] if "--index-strategy" in kept else ["--index-strategy", "unsafe-best-match"])]


def nvidia_driver(driver_file: Path = DRIVER_FILE) -> str | None:
    """Where an NVIDIA driver shows itself: the kernel module's file, or nvidia-smi on PATH."""
    if driver_file.exists():
        return str(driver_file)
    return shutil.which("nvidia-smi")


def unreachable(url: str, timeout: float = 10.0, cafile: str | None = None) -> str | None:
    """None when `url` answers with its page; otherwise why not, in a few words. `cafile`: pip's
    certificate bundle, where pip is given one (a proxy that re-signs TLS)."""
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context):  # the headers tell: not read
            return None
    except urllib.error.HTTPError as err:  # 403/407 from a proxy: the index is not reachable either
        return f"HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return str(reason).strip() or type(reason).__name__


def _torch_page(index: str) -> str:
    """The index's page of torch's files: it answers where the index can serve torch."""
    return index.rstrip("/") + "/torch/"


def index_of(args: list[str]) -> str | None:
    """The index URL a pip-style argument list names (`--index-url URL`, `--index-url=URL`, `-i URL`)."""
    for i, arg in enumerate(args):
        if arg in ("--index-url", "-i") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--index-url="):
            return arg.split("=", 1)[1]
    return None


def choose_torch(
    spec: str,
    driver: str | None,
    platform: str = sys.platform,
    cpu_index: str = CPU_INDEX,
    cafile: str | None = None,
) -> Torch:
    if spec != "auto":
        args = shlex.split(spec)
        return Torch(args, "as TORCH says", index_of(args))
    if not platform.startswith("linux"):
        return Torch(["torch"], f"PyPI's torch, the build it has for {platform} (TORCH=... for another)")
    if driver:
        return Torch(["torch"], f"an NVIDIA driver is here ({driver}): torch's CUDA build (about 5.5 GB)")
    reason = unreachable(_torch_page(cpu_index), cafile=cafile)
    if reason is None:
        return Torch(
            ["torch", "--index-url", cpu_index],
            f"no NVIDIA driver here: torch's CPU build from {cpu_index}, a quarter of the CUDA build's size "
            "(TORCH=torch installs the CUDA build)",
            cpu_index,
        )
    return Torch(
        ["torch"],
        f"no NVIDIA driver here, but {cpu_index} cannot be reached ({reason}): plain torch instead, the "
        "CUDA build (about 5.5 GB), which runs on the CPU too",
    )


def kept(found: str, cpu_index: str = CPU_INDEX, cafile: str | None = None) -> Torch:
    """A torch the venv has: nothing to install, but a CPU build's torchvision must come from the CPU
    index, where that can be reached (a CPU build from elsewhere, a local file, say, goes without)."""
    cpu = found.endswith("+cpu") and unreachable(_torch_page(cpu_index), cafile=cafile) is None
    return Torch([], "kept (a new venv, VENV=..., for another build)", cpu_index if cpu else None)


def pip_settings(python: str) -> dict[str, str]:
    """The settings pip's install command takes, as pip itself lists them (`pip config list`): its
    files' `global` and `install` sections, the later file winning, then PIP_* variables over them all."""
    proc = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True)
    files: dict[str, str] = {}
    env: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        found = re.fullmatch(r"(:env:|global|install)\.([\w-]+)=(.*)", line.strip())
        if found:
            try:
                value = ast.literal_eval(found.group(3))  # pip prints each value as Python's repr
            except (ValueError, SyntaxError):
                continue
            (env if found.group(1) == ":env:" else files)[found.group(2)] = str(value)
    return {**files, **env}


def uv_options(settings: dict[str, str]) -> tuple[list[str], dict[str, str]] | str:
    """pip's settings as uv's flags and environment; a reason instead where uv cannot be told one."""
    flags, env = [], {}
    for key, value in settings.items():
        if key in PIP_TO_UV_FLAGS:
            flags += [part for item in value.split() for part in (PIP_TO_UV_FLAGS[key], item)]
        elif key in PIP_TO_UV_ENV:  # a timeout: pip takes 60.5, uv whole seconds
            env[PIP_TO_UV_ENV[key]] = str(math.ceil(float(value))) if key.endswith("timeout") else value
        elif key not in PIP_ONLY_OUTPUT:
            return f"pip is configured with {key}={value!r}, which uv cannot be told"
    if flags:
        flags += ["--index-strategy", "unsafe-best-match"]  # as pip: the best version from every index
    return flags, env


def run(command: list[str], env: dict[str, str] | None = None) -> None:
    print("+ " + shlex.join(command), flush=True)
    subprocess.run(command, check=True, env={**os.environ, **(env or {})})


def choose_installer(python: str) -> Installer:
    pip = Installer([python, "-m", "pip", "install"], "")
    settings = pip_settings(python)
    options = uv_options(settings)
    if isinstance(options, str):
        pip.why = f"pip ({options})"
        return pip
    flags, env = options
    got = subprocess.run([python, "-m", "pip", "install", "--quiet", "uv"], capture_output=True, text=True)
    uv = shutil.which("uv", path=str(Path(python).parent))  # bin/uv, Scripts/uv.exe
    if got.returncode != 0 or uv is None:
        pip.why = "pip (uv could not be installed: " + (got.stderr.strip().splitlines() or ["?"])[-1] + ")"
        return pip
    passed = sorted(k for k in settings if k not in PIP_ONLY_OUTPUT)
    said = f"; pip's {', '.join(passed)} passed on" if passed else ""
    # --compile-bytecode, as pip does: without it each first import (every test process) compiles instead
    command = [uv, "pip", "install", "--python", python, "--compile-bytecode"]
    return Installer(command, f"uv (faster than pip{said})", flags, env)


def torch_version(python: str) -> str | None:
    """The venv's torch as it names itself (2.14.1+cu130); None where it does not import."""
    proc = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def install(python: str, torch_spec: str, extras: str) -> None:
    installer = choose_installer(python)
    print(f"installer: {installer.why}", flush=True)
    if not installer.is_uv:
        run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    if found := torch_version(python):
        torch = kept(found, cafile=installer.env.get("SSL_CERT_FILE"))
        print(f"torch {found} is in the venv already: {torch.why}")
    else:
        torch = choose_torch(torch_spec, nvidia_driver(), cafile=installer.env.get("SSL_CERT_FILE"))
        print(f"installing {shlex.join(torch.args)}: {torch.why}", flush=True)
        run([*installer.command, *installer.flags_beside(torch.index), *torch.args], installer.env)
    installed = torch_version(python)
    if installed is None:
        raise InstallError(f"torch does not import after `{shlex.join(torch.args)}`: see the lines above")
    version = installed.split("+")[0]
    # torch stays the one installed above (an extra's torchvision would otherwise bring the newest in)
    extra = ["--extra-index-url", torch.index] if torch.index else []
    if extra and installer.is_uv and "--index-strategy" not in installer.flags:
        extra += ["--index-strategy", "unsafe-best-match"]  # torchvision of the same build as torch
    package = [*installer.flags, *extra, "--quiet", "-e", f"{REPO}[{extras}]", f"torch=={version}"]
    run([*installer.command, *package], installer.env)


class InstallError(Exception):
    """What went wrong, in one line."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", default="auto", help="what to install as torch (TORCH=); auto: see above")
    parser.add_argument("--extras", default="dev", help="this package's extras (EXTRAS=)")
    args = parser.parse_args(argv)
    try:
        install(sys.executable, args.torch, args.extras)
    except subprocess.CalledProcessError as err:
        print(
            f"error: make install: {shlex.join(map(str, err.cmd))} exited with {err.returncode}",
            file=sys.stderr,
        )
        return 1
    except InstallError as err:
        print(f"error: make install: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
