"""The package's layout is its architecture: each room imports only from rooms on lower floors (or from
itself), so that a user's `models/` and `data/` never depend on the machinery, and the machinery never
on the commands that use it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import lightspeed

PACKAGE = Path(lightspeed.__file__).parent

#: Floors, lowest first; a room is a subpackage or a top-level module.
FLOORS: list[set[str]] = [
    {"compat", "conf"},  # the one door to Lightning's internals; the engine's config groups (yaml only)
    {"core"},  # config, device facts, failures, logs, summary
    {"models", "data"},  # the user's part
    {"resilience", "speed", "report"},  # the machinery, by concern
    {"run"},  # composing the config, building the objects
    {
        "train",
        "eval",
        "shards",
        "export",
        "bench",
        "tune",
        "doctor",
        "compare",
        "callbacks",
        "cli",
    },  # the commands (and `lightspeed <command>`), and the names conf/ uses
    {"testing"},  # checks for a project's own tests: they run the commands
]


def room(module: str) -> str | None:
    """`lightspeed.speed.accel` -> `speed`; the package root (its version and `CONF_DIR`) has none."""
    parts = module.split(".")
    return parts[1] if parts[0] == "lightspeed" and len(parts) > 1 else None


def floor(name: str) -> int:
    for i, rooms in enumerate(FLOORS):
        if name in rooms:
            return i
    raise AssertionError(f"{name} is on no floor of tests/test_layout.py: add it where it belongs")


def imports(path: Path) -> set[str]:
    """Every `lightspeed...` module `path` imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightspeed"):
            root = node.module == "lightspeed"  # `from lightspeed import train`
            found |= {f"{node.module}.{a.name}" if root else node.module for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("lightspeed")}
    return found


def test_every_import_goes_to_the_same_room_or_a_lower_floor() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(("lightspeed", *path.relative_to(PACKAGE).with_suffix("").parts))
        mine = room(module)
        if mine in (None, "__init__"):
            continue
        for target in imports(path):
            theirs = room(target)
            if theirs in (None, mine) or (
                not (PACKAGE / theirs).exists() and not (PACKAGE / f"{theirs}.py").exists()
            ):
                continue
            if floor(theirs) >= floor(mine):
                upward.append(f"{module} imports {target}")
    assert not upward, "imports that run sideways or up a floor:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from lightspeed.run import build\nimport lightspeed.speed.accel\n")
    assert imports(probe) == {"lightspeed.run", "lightspeed.speed.accel"}
    assert floor(room("lightspeed.run")) > floor(room("lightspeed.data.base"))


def test_the_top_level_holds_the_users_part_and_the_rooms() -> None:
    top = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert top - {"__init__"} == set().union(*FLOORS)


#: Optional features a default run never loads: each is imported where it is used (issue 47, a small core).
OPTIONAL = (
    "lightspeed.core.unexpected",  # how an unexplained error ends: only when one does
    "lightspeed.run.search",
    "lightspeed.resilience.sharded",
    "lightspeed.run.tracking",  # MLflow's and W&B's runs continued: only with such a logger
    "lightspeed.report.sweep_table",  # only when a sweep ends
    "lightspeed.run.sweep_rows",  # and the rows of its jobs: only in a sweep
    "lightspeed.models.nets.resnet",  # the nets the default model does not use
    "lightspeed.models.nets.mlp",
    "lightspeed.models.net_target",  # a net by import path, or the line refusing a net: only for those
    "lightspeed.run.compose_errors",  # the wording of what Hydra refuses: only when it refuses
    "lightspeed.run.build_errors",  # and of what a constructor or the Trainer refuses
    "lightspeed.run.monitor_errors",  # and of a monitor refused
    "lightspeed.resilience.verify",  # a checkpoint on disk checked: only where one is read
    "lightspeed.core.failure_lines",  # the line a failed fit ends in
    "lightspeed.core.failure_exit",  # and its exit code
    "lightspeed.resilience.resume_from",  # the checkpoint a rerun continues from
    "lightspeed.speed.on_model",  # channels_last and torch.compile: only where one is on
    "lightspeed.speed.diagnosis",  # the speed report's notes: only where one applies
    "lightspeed.speed.steady",  # when the step time has settled: only for warmup_steps=auto
    "lightspeed.resilience.resumed",  # the metrics and random states a resumed run puts back
    "lightspeed.resilience.incidents",  # a preemption's save, a NaN, a full disk, a folder in use
    "lightspeed.compat.checkpoint_paths",  # a restored ModelCheckpoint's paths, made this folder's
    "lightspeed.compat.ranks",  # the launcher's ranks: only where a run has them
    "lightspeed.data.host_loader",  # the DataLoader path: a default run slices its data on the device
    "lightspeed.data.refusals",  # the wording of what a DataModule refuses
    "lightspeed.data.stats",  # uint8 images' and regression targets' statistics
    "lightspeed.data.augment",  # only where data.augment asks for some
    "lightspeed.data.synthetic",  # the data sets a default run does not use
    "lightspeed.run.tuned_file",  # conf/accel/tuned.yaml checked: only for accel=tuned
    "optuna",
    "torch.distributed.checkpoint",
)


def test_a_default_run_loads_no_optional_feature(tmp_path: Path) -> None:
    code = (
        "import atexit, json, sys\n"
        "atexit.register(lambda: print('LOADED', json.dumps(sorted(sys.modules))))\n"
        f"sys.argv = ['train', 'debug=fdr', 'print_config=false', 'paths.log_dir={tmp_path}']\n"
        "from lightspeed.train import main\n"
        "main()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = json.loads(proc.stdout.rsplit("LOADED ", 1)[1])
    assert "lightspeed.train" in loaded and not [m for m in loaded if m.startswith(OPTIONAL)]
