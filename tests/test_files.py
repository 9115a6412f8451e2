"""Data files are read one way (`core.files.read_regular`): a FIFO never makes the reader wait, a device,
a folder or a file too large is not read, a link out of the folder a file belongs to is not followed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from lightspeed.core.files import RefusedFile, read_json, read_regular


def test_a_fifo_a_device_or_a_folder_is_refused_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # no writer: a plain open() would wait for ever
    start = time.perf_counter()
    with pytest.raises(RefusedFile, match="not a regular file"):
        read_regular(tmp_path / "fifo")
    assert read_json(tmp_path / "fifo") is None
    assert time.perf_counter() - start < 5
    for path in (tmp_path, Path("/dev/zero")):
        with pytest.raises(RefusedFile, match="not a regular file"):
            read_regular(path)


def test_a_file_too_large_a_link_out_or_a_loop_is_refused(tmp_path: Path) -> None:
    (tmp_path / "big.json").write_text("[" + "1, " * 20 + "1]")
    assert read_json(tmp_path / "big.json") == [1] * 21
    with pytest.raises(RefusedFile, match="more than"):
        read_regular(tmp_path / "big.json", most=10)
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "elsewhere.json").write_text("{}")
    (run / "out.json").symlink_to(tmp_path / "elsewhere.json")
    (run / "inside.json").symlink_to(run / "own.json")
    (run / "own.json").write_text('{"a": 1}')
    (run / "loop.json").symlink_to(run / "loop.json")
    with pytest.raises(RefusedFile, match="link out"):
        read_regular(run / "out.json", within=run)
    assert read_json(run / "out.json", within=run) is None
    assert read_json(run / "inside.json", within=run) == {"a": 1}  # a link inside its folder is followed
    assert read_json(run / "out.json") == {}  # no folder given: any regular file
    for bad in ("loop.json", "missing.json"):
        with pytest.raises(RefusedFile, match="cannot be read"):
            read_regular(run / bad, within=run)


def test_a_fifo_among_the_yaml_files_hydra_may_read_is_one_line_not_a_hang(tmp_path: Path) -> None:
    from lightspeed.core.config import ConfigError
    from lightspeed.run.command_line import check_yaml_sizes

    (tmp_path / "mygroup").mkdir()
    os.mkfifo(tmp_path / "mygroup" / "x.yaml")  # conf/local/default.yaml as a FIFO hung every run
    with pytest.raises(ConfigError, match=r"x\.yaml is not a regular file"):
        check_yaml_sizes([tmp_path], ["+mygroup=x"])
