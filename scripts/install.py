"""`make install`: torch first, the build that suits this machine, then this package with its extras.

Which torch (TORCH=auto, the default): the CUDA build where an NVIDIA driver is found (PyPI's plain
`torch` on Linux); otherwise the much smaller CPU build from PyTorch's own index, or plain `torch` where
that index cannot be reached (its CUDA build runs on the CPU too). macOS and Windows take PyPI's `torch`,
a CPU build there. Any other TORCH value is passed to the installer as it is.

Which installer: uv, installed into the venv first: on a clean clone it installed the same packages in
a quarter of pip's time (docs/install.md). uv reads none of pip's settings, so pip's index, find-links,
constraint, certificate and timeout settings are passed on to it; where pip is configured in a way uv
cannot be told, or uv cannot be installed, pip installs, and a line says why.

Standard library only: it runs in the new venv before anything is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
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
PIP_TO_UV_ENV = {"cert": "SSL_CERT_FILE", "timeout": "UV_HTTP_TIMEOUT", "default-timeout": "UV_HTTP_TIMEOUT"}
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


def unreachable(url: str, timeout: float = 10.0) -> str | None:
    """None when `url` answers; otherwise why not, in a few words."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):  # the headers tell: the page is not read
            return None
    except urllib.error.HTTPError as err:
        return None if err.code < 500 else f"HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return str(reason).strip() or type(reason).__name__


def choose_torch(
    spec: str, driver: str | None, platform: str = sys.platform, cpu_index: str = CPU_INDEX
) -> Torch:
    if spec != "auto":
        args = shlex.split(spec)
        index = args[args.index("--index-url") + 1] if "--index-url" in args[:-1] else None
        return Torch(args, "as TORCH says", index)
    if driver:
        return Torch(["torch"], f"an NVIDIA driver is here ({driver}): torch's CUDA build (about 5.5 GB)")
    if not platform.startswith("linux"):
        return Torch(["torch"], f"PyPI's torch, a CPU build on {platform}")
    reason = unreachable(cpu_index + "/torch/")
    if reason is None:
        return Torch(
            ["torch", "--index-url", cpu_index],
            f"no NVIDIA driver here: torch's CPU build from {cpu_index}, about a sixth of the CUDA build's "
            "size (TORCH=torch installs the CUDA build)",
            cpu_index,
        )
    return Torch(
        ["torch"],
        f"no NVIDIA driver here, but {cpu_index} cannot be reached ({reason}): plain torch instead, the "
        "CUDA build (about 5.5 GB), which runs on the CPU too",
    )


def pip_settings(python: str) -> dict[str, str]:
    """pip's own view of its settings (files and PIP_* variables): {key: value}, the last one winning."""
    proc = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True)
    settings = {}
    for line in proc.stdout.splitlines():
        found = re.fullmatch(r"[^.]*\.([\w-]+)='(.*)'", line.strip())
        if found:
            settings[found.group(1)] = found.group(2)
    return settings


def uv_options(settings: dict[str, str]) -> tuple[list[str], dict[str, str]] | str:
    """pip's settings as uv's flags and environment; a reason instead where uv cannot be told one."""
    flags, env = [], {}
    for key, value in settings.items():
        if key in PIP_TO_UV_FLAGS:
            flags += [part for item in value.split() for part in (PIP_TO_UV_FLAGS[key], item)]
        elif key in PIP_TO_UV_ENV:
            env[PIP_TO_UV_ENV[key]] = value
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
    options = uv_options(pip_settings(python))
    if isinstance(options, str):
        pip.why = f"pip ({options})"
        return pip
    flags, env = options
    got = subprocess.run([python, "-m", "pip", "install", "--quiet", "uv"], capture_output=True, text=True)
    uv = Path(python).parent / "uv"
    if got.returncode != 0 or not uv.exists():
        pip.why = "pip (uv could not be installed: " + (got.stderr.strip().splitlines() or ["?"])[-1] + ")"
        return pip
    passed = sorted({k for k in pip_settings(python) if k not in PIP_ONLY_OUTPUT})
    said = f"; pip's {', '.join(passed)} passed on" if passed else ""
    return Installer(
        [str(uv), "pip", "install", "--python", python], f"uv (faster than pip{said})", flags, env
    )


def torch_version(python: str) -> str | None:
    """The venv's torch, without its build label (2.14.1, not 2.14.1+cu130); None without one."""
    proc = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def install(python: str, torch_spec: str, extras: str) -> None:
    installer = choose_installer(python)
    print(f"installer: {installer.why}", flush=True)
    if not installer.is_uv:
        run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    torch = Torch([], "")
    if found := torch_version(python):
        print(f"torch {found} is in the venv already: kept (a new venv, VENV=..., for another build)")
    else:
        torch = choose_torch(torch_spec, nvidia_driver())
        print(f"installing {shlex.join(torch.args)}: {torch.why}", flush=True)
        run([*installer.command, *installer.flags_beside(torch.index), *torch.args], installer.env)
    version = (torch_version(python) or "").split("+")[0]
    # torch stays the one installed above (an extra's torchvision would otherwise bring the newest in)
    extra = ["--extra-index-url", torch.index] if torch.index else []
    if extra and installer.is_uv and "--index-strategy" not in installer.flags:
        extra += ["--index-strategy", "unsafe-best-match"]  # torchvision of the same build as torch
    package = [*installer.flags, *extra, "--quiet", "-e", f"{REPO}[{extras}]", f"torch=={version}"]
    run([*installer.command, *package], installer.env)


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
