"""`make install` (scripts/install.py): which torch build, which installer, and pip's settings carried over
to uv. The index probe talks to real local servers; the install itself is what `.ci/run` runs (twice:
plain `torch`, and TORCH="torch==2.13.0")."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fakes import serving

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("install_script", REPO / "scripts" / "install.py")
install = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = install  # dataclasses look their module up
spec.loader.exec_module(install)


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # nobody listens once it is closed


def test_a_driver_is_found_by_its_kernel_file_or_nvidia_smi(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert install.nvidia_driver(tmp_path / "version") is None
    (tmp_path / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05\n")
    assert install.nvidia_driver(tmp_path / "version") == str(tmp_path / "version")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvidia-smi").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    assert install.nvidia_driver(tmp_path / "missing") == str(tmp_path / "bin" / "nvidia-smi")


def test_with_a_driver_auto_is_the_cuda_build() -> None:
    torch = install.choose_torch("auto", "/proc/driver/nvidia/version", "linux", closed_port())
    assert torch.args == ["torch"] and torch.index is None and "NVIDIA driver is here" in torch.why


def test_without_a_driver_auto_is_the_cpu_build_from_its_index() -> None:
    with serving() as server:
        server.files["torch/"] = b"<html></html>"
        torch = install.choose_torch("auto", None, "linux", server.url.rstrip("/"))
    index = server.url.rstrip("/")
    assert torch.args == ["torch", "--index-url", index] and torch.index == index
    assert f"no NVIDIA driver here: torch's CPU build from {index}" in torch.why


def test_without_a_driver_and_no_cpu_index_auto_falls_back_to_plain_torch_and_says_why() -> None:
    down = closed_port()
    torch = install.choose_torch("auto", None, "linux", down)
    assert torch.args == ["torch"] and torch.index is None
    assert torch.why.startswith(f"no NVIDIA driver here, but {down} cannot be reached (")


def test_only_a_page_that_answers_counts_as_reachable() -> None:
    """A proxy's 403/407, a missing page, a server error: the index would not serve torch either."""
    with serving() as server:
        server.files["torch/"] = b"<html></html>"
        assert install.unreachable(server.url + "torch/") is None
        assert install.unreachable(server.url + "nothing/") == "HTTP 404"
        server.files["busy/"] = b""
        server.modes["busy/"] = "error"
        assert install.unreachable(server.url + "busy/") == "HTTP 503"


def test_macos_and_windows_take_pypi_s_torch_a_cpu_build_there() -> None:
    for platform in ("darwin", "win32"):
        torch = install.choose_torch("auto", None, platform, closed_port())
        assert torch.args == ["torch"] and platform in torch.why


def test_any_other_torch_is_passed_on_as_given() -> None:
    torch = install.choose_torch("torch==2.13.0", None, "linux")
    assert torch.args == ["torch==2.13.0"] and torch.index is None
    for spec in ("torch --index-url URL", "torch --index-url=URL", "torch -i URL"):
        torch = install.choose_torch(spec.replace("URL", "https://example.org/whl/cu126"), None, "linux")
        assert torch.args[0] == "torch" and torch.index == "https://example.org/whl/cu126", spec


def test_a_kept_cpu_torch_keeps_its_index_for_torchvision_where_it_answers() -> None:
    with serving() as server:
        server.files["torch/"] = b"<html></html>"
        index = server.url.rstrip("/")
        assert install.kept("2.13.0+cpu", index) == install.Torch([], install.kept("x", index).why, index)
        assert install.kept("2.14.1+cu130", index).index is None
    assert install.kept("2.13.0+cpu", closed_port()).index is None  # from a local file, say: no index


def pip_config(monkeypatch, **settings: str) -> dict[str, str]:
    """pip's own reading of exactly these PIP_* settings (no config file)."""
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    return install.pip_settings(sys.executable)


def test_pip_s_indexes_links_constraints_and_certificate_are_passed_on_to_uv(monkeypatch) -> None:
    settings = pip_config(
        monkeypatch,
        PIP_INDEX_URL="https://mirror.example/simple",
        PIP_EXTRA_INDEX_URL="file:///a/simple file:///b/simple",
        PIP_FIND_LINKS="/wheels",
        PIP_CONSTRAINT="/etc/constraints.txt",
        PIP_CERT="/etc/ca.pem",
        PIP_DEFAULT_TIMEOUT="180",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    flags, env = install.uv_options(settings)
    assert flags[-2:] == ["--index-strategy", "unsafe-best-match"]  # as pip: best of every index
    pairs = sorted(zip(flags[:-2:2], flags[1:-2:2], strict=True))
    assert pairs == [
        ("--constraints", "/etc/constraints.txt"),
        ("--extra-index-url", "file:///a/simple"),
        ("--extra-index-url", "file:///b/simple"),
        ("--find-links", "/wheels"),
        ("--index-url", "https://mirror.example/simple"),
    ]
    assert env == {"SSL_CERT_FILE": "/etc/ca.pem", "UV_HTTP_TIMEOUT": "180"}
    assert install.uv_options(pip_config(monkeypatch)) == ([], {})


def test_a_pip_setting_uv_cannot_take_keeps_pip_and_says_which(monkeypatch) -> None:
    reason = install.uv_options(pip_config(monkeypatch, PIP_TRUSTED_HOST="mirror.example"))
    assert reason == "pip is configured with trusted-host='mirror.example', which uv cannot be told"


def test_uv_beside_a_torch_index_drops_pip_s_index_url_but_keeps_the_rest() -> None:
    flags = ["--index-url", "https://mirror.example/simple", "--find-links", "/wheels"]
    uv = install.Installer(["/venv/bin/uv", "pip", "install"], "", flags)
    assert uv.flags_beside("https://download.pytorch.org/whl/cpu") == [
        "--find-links",
        "/wheels",
        "--index-strategy",
        "unsafe-best-match",
    ]
    assert uv.flags_beside(None) == flags
    pip = install.Installer([sys.executable, "-m", "pip", "install"], "")
    assert not pip.is_uv and pip.flags_beside("https://download.pytorch.org/whl/cpu") == []


def test_the_makefile_installs_through_the_script_with_torch_auto() -> None:
    dry = subprocess.run(
        ["make", "-n", "install", "VENV=/nonexistent/venv"], cwd=REPO, capture_output=True, text=True
    ).stdout
    assert '/nonexistent/venv/bin/python scripts/install.py --torch "auto" --extras "dev"' in dry


@pytest.mark.parametrize("given", ["torch==2.13.0", "torch --index-url https://download.pytorch.org/whl/cpu"])
def test_the_makefile_passes_torch_on_as_given(given: str) -> None:
    dry = subprocess.run(
        ["make", "-n", "install", "VENV=/nonexistent/venv", f"TORCH={given}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout
    assert f'scripts/install.py --torch "{given}"' in dry


def test_pip_s_files_are_read_as_pip_reads_them(tmp_path: Path, monkeypatch) -> None:
    """Values as pip prints them (a multi-line list, a fractional timeout), only the sections an install
    reads, and PIP_* variables over any file."""
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\nextra-index-url =\n    https://a.example/simple\n    https://b.example/simple\n"
        "timeout = 60.5\nfind-links = /from-file\n[list]\nformat = columns\n[download]\nno-deps = true\n"
    )
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "none"))  # the machine's own /etc/xdg/pip
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("PIP_FIND_LINKS", "/from-env")
    settings = install.pip_settings(sys.executable)
    assert "format" not in settings and "no-deps" not in settings
    options = install.uv_options({k: v for k, v in settings.items() if k != "cert"})
    flags, env = options
    assert flags.count("--extra-index-url") == 2 and "https://b.example/simple" in flags
    assert flags[flags.index("--find-links") + 1] == "/from-env" and env["UV_HTTP_TIMEOUT"] == "61"
