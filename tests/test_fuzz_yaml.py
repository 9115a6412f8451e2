"""A fuzzer of the YAML a user writes: each shipped option of the user's groups and of the engine's (a data
set, a model, an experiment, a trainer, accel, callbacks, a logger), mutated whole (empty, torn, not UTF-8,
another shape, broken syntax) or at one drawn place (a wrong value, a key dropped or misspelt, a mapping
turned scalar, a key added, its defaults or package line changed), given as a new option through
`--config-dir` and run as the command line runs it (Hydra, the checks, then `train` on one batch): each ends
as a run or in one line (exit 2, or 3 for a training failure it explains), never a traceback.

The fast suite runs a fixed-seed sample (FUZZ_SEED=<n> draws another); the slow suite the rest."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import yaml

from conftest import TINY, command_line
from lightspeed import CONF_DIRS
from lightspeed.core.config import exit_on_config_error
from lightspeed.train import train

#: (group, shipped option, what it runs with: an option that fits only its own data or model)
SOURCES = [
    ("data", "digits", []),
    ("data", "diabetes", ["model=regressor"]),
    ("data", "sort", ["model=gpt"]),
    ("data", "synthetic", []),
    ("model", "cnn", []),
    ("model", "mlp", []),
    ("model", "regressor", ["data=diabetes"]),
    ("model", "gpt", ["data=sort"]),
    ("experiment", "diabetes_mlp", []),
    ("experiment", "sort_gpt", []),
    ("trainer", "cpu", []),
    ("accel", "max", []),
    ("callbacks", "default", []),
    ("logger", "csv", []),
]
#: What a careless hand or another program might write for any value.
VALUES = ["abc", -5, 0, 1.5, 1e30, 10**12, [1], {"a": 1}, None, "日本語", "", True]
WHOLE = ["empty", "torn", "not utf-8", "a list", "null", "a string", "broken syntax"]
DRAWN = 8
QUIET = [o for o in TINY if "batches" not in o and "max_epochs" not in o]


def _source(group: str, option: str) -> Path:
    return next(d / group / f"{option}.yaml" for d in CONF_DIRS if (d / group / f"{option}.yaml").is_file())


def _places(node: object, path: tuple = ()) -> list[tuple]:
    """Every key path in a parsed yaml, mappings and list items included."""
    found = [path] if path else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _places(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _places(value, (*path, i))
    return found


def _drawn(text: str, rng: random.Random) -> str:
    """The file with one change at a drawn place, its `# @package` line kept or changed."""
    header = "# @package _global_\n" if "# @package _global_" in text else ""
    tree = yaml.safe_load(text) or {}
    places = _places(tree)
    path = rng.choice(places) if places else ()
    parent = tree
    for part in path[:-1]:
        parent = parent[part]
    key = path[-1] if path else None
    how = rng.choice(["value", "value", "drop", "misspell", "scalar", "add", "header"])
    if key is None or how == "add":
        target = parent if isinstance(parent, dict) else tree
        if isinstance(target, dict):
            target[rng.choice(["extra", "_target_", "defaults", "max_epochs"])] = rng.choice(VALUES)
    elif how == "value":
        parent[key] = rng.choice(VALUES)
    elif how == "drop":
        del parent[key]
    elif how == "misspell" and isinstance(key, str):
        parent[key[:-1] or "x"] = parent.pop(key)
    elif how == "scalar":
        parent[key] = rng.choice(["abc", 3, None])
    elif how == "header":
        header = rng.choice(["", "# @package _global_\n", "# @package model\n", "# @package _group_.x\n"])
    body = yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)
    return header + body


def _whole(text: str, how: str) -> bytes:
    return {
        "empty": b"",
        "torn": text.encode()[: len(text.encode()) // 2],
        "not utf-8": b"\xff\xfe" + text.encode("utf-16-le"),
        "a list": b"- 1\n- 2\n",
        "null": b"null\n",
        "a string": b"hello\n",
        "broken syntax": b"key: [1, 2\n\tother: {\n",
    }[how]


def _cases() -> list[tuple[str, str, str]]:
    """(group, option, mutation): the whole-file ones, then DRAWN drawn ones (by their number) per option."""
    return [
        (g, o, how)
        for g, o, _ in SOURCES
        for how in ["as shipped", *WHOLE, *(f"drawn {i}" for i in range(DRAWN))]
    ]


CASES = _cases()
#: Cases that were tracebacks once (each fixed, kept in the fast suite): torn and not-UTF-8 files, a
#: defaults list of another shape, a model without `_target_`, a model's settings turned into a list, an
#: optimizer without its name, a data set's seed null, accel, callbacks and logger groups as lists.
FOUND = [
    ("model", "cnn", "broken syntax"),
    ("data", "digits", "not utf-8"),
    ("trainer", "cpu", "drawn 3"),
    ("model", "mlp", "empty"),
    ("model", "gpt", "a list"),
    ("model", "cnn", "drawn 5"),
    ("data", "sort", "drawn 2"),
    ("accel", "max", "a list"),
    ("callbacks", "default", "a list"),
    ("logger", "csv", "a list"),
]
SAMPLE = random.Random(int(os.environ.get("FUZZ_SEED", "0"))).sample(CASES, 8) + FOUND


def check(case: tuple[str, str, str], capsys, monkeypatch, tmp_path: Path) -> None:
    group, option, how = case
    text = _source(group, option).read_text()
    folder = tmp_path / "conf" / group
    folder.mkdir(parents=True)
    if how.startswith("drawn"):
        rng = random.Random(f"{group}/{option}/{how}")
        content = _drawn(text, rng).encode()
    else:
        content = text.encode() if how == "as shipped" else _whole(text, how)
    (folder / "fuzzed.yaml").write_bytes(content)
    monkeypatch.chdir(tmp_path)  # a relative path a value makes lands here
    with_ = next(w for g, o, w in SOURCES if (g, o) == (group, option))
    args = ["--config-dir", str(tmp_path / "conf"), "debug=fdr", *QUIET, *with_, f"{group}=fuzzed"]
    try:
        with exit_on_config_error():
            command_line(args, tmp_path / "logs", task=train)
    except SystemExit as stop:
        code, err = int(stop.code or 0), capsys.readouterr().err.strip().splitlines()
    else:
        code, err = 0, []
    said = f"{group}/{option} {how}:\n{content.decode(errors='replace')[:600]}"
    if how == "as shipped":
        assert code == 0, (said, err[-5:])
    assert code in (0, 2, 3), (said, code, err[-5:])
    if code:
        assert [line for line in err if line.startswith("error: ")], (said, err[-5:])
        assert "Traceback" not in "\n".join(err), (said, err[-8:])


@pytest.mark.parametrize("case", SAMPLE, ids=lambda c: "-".join(c))
def test_a_sample_of_mutated_yaml_options_ends_in_a_run_or_one_line(
    case, capsys, monkeypatch, tmp_path
) -> None:
    check(case, capsys, monkeypatch, tmp_path)


@pytest.mark.slow  # the cases the sample above did not run (CI runs both)
@pytest.mark.parametrize("case", [c for c in CASES if c not in SAMPLE], ids=lambda c: "-".join(c))
def test_every_other_mutated_yaml_option_ends_in_a_run_or_one_line(
    case, capsys, monkeypatch, tmp_path
) -> None:
    check(case, capsys, monkeypatch, tmp_path)
