"""Nothing lost, round two: each test performs an attack on a run's folder and checks the promised outcome
(one line, an exit code, the run's own state intact)."""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch

from conftest import LIMIT, REPO, TINY, command_line, run_module
from lightspeed import CONF_DIR
from lightspeed.core import config
from lightspeed.core.config import (
    ConfigError,
    exit_on_config_error,
    validate_train,
)
from lightspeed.core.failures import exit_on_failure
from lightspeed.eval import run as evaluate
from lightspeed.resilience import checkpoint, identity, lock, resume, verify
from lightspeed.resilience.checkpoint import AtomicCheckpointIO
from lightspeed.resilience.identity import MODEL_CONFIG_KEY
from lightspeed.run.command_line import check_flags
from lightspeed.run.entry import check_known_keys
from lightspeed.train import Run, train
from probes import Fault

FIT = [*TINY, "test_after_fit=false", "model.scheduler.name=none"]
QUIET = [o for o in TINY if o.startswith(("callbacks.", "+trainer."))]


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


def _fails(run, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        run()
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    return exit_.value.code, errors[0]


# 1. A run's identity


@pytest.mark.parametrize("change", ["model.optimizer.lr=0.01", "model=mlp"])
def test_a_reused_run_name_with_other_settings_is_refused_naming_the_keys(
    train_cfg, run_dir: Path, capsys, change: str
) -> None:
    train(train_cfg(*FIT, "run_name=baseline"))
    last = run_dir / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    code, line = _fails(lambda: train(train_cfg(*FIT, "run_name=baseline", change)), capsys)
    assert code == 2
    key = "model.optimizer.lr: 0.003 -> 0.01" if "lr" in change else "model.net.name"
    assert key in line and "run_name=<new name>" in line and f"ckpt_path={last}" in line, line
    assert last.read_bytes() == before


@pytest.mark.parametrize("debug", ["debug=fdr", "trainer.enable_checkpointing=false"])
def test_a_run_without_checkpoints_into_a_trained_run_s_folder_is_refused_and_leaves_it(
    tmp_path: Path, capsys, debug: str
) -> None:
    """`make train debug=fdr run_name=baseline` after baseline trained: its summary.json would have
    replaced baseline's. Refused in one line, and the `.hydra/` files Hydra wrote at its start are the
    trained run's again."""
    from lightspeed.train import train_or_search

    run = tmp_path / "train" / "runs" / "baseline"
    kept = {run / "checkpoints" / "last.ckpt": "weights", run / "summary.json": "{}"}
    kept |= {run / ".hydra" / name: f"- trained: {name}\n" for name in ("config.yaml", "overrides.yaml")}
    for path, text in kept.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    code, line = _fails(
        lambda: command_line(["run_name=baseline", debug], tmp_path, task=train_or_search), capsys
    )
    assert code == 2 and line.startswith("error: run_name=baseline holds a trained run (checkpoints in "), (
        line
    )
    assert {path: path.read_text() for path in kept} == kept


def test_a_run_that_started_in_its_folder_keeps_its_hydra_files_when_it_ends_in_one_line(
    tmp_path: Path, capsys
) -> None:
    """A resumed run with a new setting that trains, then ends in a one-line error (exit 2): the folder's
    `.hydra/` files are this command's, which trained it, not put back to the earlier one's."""
    from lightspeed.run.entry import keep_hydra_files

    overrides = tmp_path / "train" / "runs" / "r" / ".hydra" / "overrides.yaml"
    overrides.parent.mkdir(parents=True)
    overrides.write_text("- the earlier command\n")

    def started_then_refused(cfg) -> None:
        keep_hydra_files()  # as Run does once it passed its checks and resume
        raise SystemExit(2)

    with pytest.raises(SystemExit):
        command_line(["run_name=r", "trainer.max_epochs=20"], tmp_path, task=started_then_refused)
    assert "trainer.max_epochs=20" in overrides.read_text()
    with pytest.raises(SystemExit):  # refused before it started: put back
        command_line(["run_name=r", "trainer.max_epochs=30"], tmp_path, task=lambda cfg: sys.exit(2))
    assert "trainer.max_epochs=20" in overrides.read_text()


def test_the_run_folder_and_each_checkpoint_hold_the_identity_and_the_code_commit(
    train_cfg, run_dir: Path
) -> None:
    cfg = train_cfg(*FIT)
    ident = identity.of(cfg)
    train(cfg)
    record = json.loads((run_dir / identity.RECORD_FILE).read_text())
    assert record["config"] == ident and record["identity"] == identity.digest(ident)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    assert record["attempts"][0]["commit"] == head.strip() and "dirty" in record["attempts"][0]
    for path in (run_dir / "checkpoints").glob("*.ckpt"):
        assert torch.load(path, weights_only=True)["identity"]["config"] == ident
    train(train_cfg(*FIT))  # a rerun adds its attempt
    assert len(json.loads((run_dir / identity.RECORD_FILE).read_text())["attempts"]) == 2


def test_a_run_s_time_is_the_sum_of_its_attempts_preempted_resumed_and_rerun(
    train_cfg, run_dir: Path
) -> None:
    """Each attempt's fit time is kept in run.json; summary.json (and so `make compare`) gives the run's
    total, never only its last attempt's."""
    from lightspeed.compare import table

    with pytest.raises(SystemExit):
        train(train_cfg(*FIT), [Fault("sigterm", step=1)])
    train(train_cfg(*FIT))  # resumes
    train(train_cfg(*FIT))  # a finished run again: nothing left to train, its time still adds
    attempts = json.loads((run_dir / identity.RECORD_FILE).read_text())["attempts"]
    assert len(attempts) == 3 and all(a["fit_seconds"] > 0 for a in attempts), attempts
    total = json.loads((run_dir / "summary.json").read_text())["fit_seconds"]
    assert total == round(sum(a["fit_seconds"] for a in attempts), 2) and total > attempts[-1]["fit_seconds"]
    row = next(iter(table({"run": json.loads((run_dir / "summary.json").read_text())}).columns[-1].cells))
    assert row == str(total)
    with pytest.raises(SystemExit):  # a debug run in its folder is refused (the test below): no attempt
        train(train_cfg(*FIT, "debug=limit"))
    assert json.loads((run_dir / identity.RECORD_FILE).read_text())["attempts"] == attempts


def test_a_command_whose_task_refuses_its_config_leaves_no_folder_and_an_existing_one_untouched(
    tmp_path: Path, capsys
) -> None:
    """`make export` with no training run (or without its extra) is one line; Hydra had made the run folder
    (`.hydra/`, the log): that goes too. A folder that already held files keeps them."""
    from lightspeed.export import run as export

    logs = tmp_path / "logs"
    with pytest.raises(SystemExit) as stop:
        command_line(["run_name=fresh"], logs, "export", export)
    assert stop.value.code == 2 and "ckpt_path=latest found no training run" in capsys.readouterr().err
    assert not (logs / "export" / "runs" / "fresh").exists()
    kept = logs / "export" / "runs" / "kept"
    kept.mkdir(parents=True)
    (kept / "model.onnx").write_bytes(b"an earlier export")
    with pytest.raises(SystemExit):
        command_line(["run_name=kept"], logs, "export", export)
    assert (kept / "model.onnx").read_bytes() == b"an earlier export"
    mine = tmp_path / "mine"  # a folder of the user's that holds only logs, or nothing, named as the run's
    mine.mkdir()
    (mine / "notes.log").write_text("mine")
    for folder in (mine, tmp_path / "empty"):
        folder.mkdir(exist_ok=True)
        with pytest.raises(SystemExit):
            command_line([f"hydra.run.dir={folder}"], logs, "export", export)
        assert folder.is_dir()
    assert (mine / "notes.log").read_text() == "mine"


def test_a_run_folder_that_cannot_be_written_is_one_line(train_cfg, run_dir: Path, capsys) -> None:
    """run.json made a folder (or a read-only run folder): the rerun says which file it cannot write."""
    train(train_cfg(*FIT))
    (run_dir / identity.RECORD_FILE).unlink()
    (run_dir / identity.RECORD_FILE).mkdir()
    code, line = _fails(lambda: train(train_cfg(*FIT)), capsys)
    assert code == 2 and f"{run_dir / identity.RECORD_FILE} is a folder" in line, line


def test_a_run_from_before_stored_identities_resumes_with_a_warning(train_cfg, run_dir: Path) -> None:
    train(train_cfg(*FIT))
    (run_dir / identity.RECORD_FILE).unlink()
    for path in (run_dir / "checkpoints").glob("*.ckpt"):
        ckpt = torch.load(path, weights_only=True)
        del ckpt["identity"]
        torch.save(ckpt, path)
    with pytest.warns(UserWarning, match="stores no run identity"):
        again = train(train_cfg(*FIT))
    assert again.trainer.global_step == 10  # continued: nothing left to train
    assert json.loads((run_dir / identity.RECORD_FILE).read_text())["adopted"] is True


def test_keys_a_newer_lightspeed_added_at_their_defaults_are_no_difference(monkeypatch) -> None:
    old = {"seed": 1, "data": {"batch_size": 64}}
    monkeypatch.setattr(identity, "ADDED_KEYS", {"data.new_knob": 3})
    assert identity.identity({"seed": 1, "data": {"batch_size": 64, "new_knob": 3}}) == identity.identity(old)
    changed = identity.identity({"seed": 1, "data": {"batch_size": 64, "new_knob": 4}})
    assert verify.differences(identity.identity(old), changed) == ["data.new_knob: (absent) -> 4"]


def test_the_default_runs_identity_is_pinned(train_cfg) -> None:
    """`make train` must land in the folder of the runs before this version, or they are not continued:
    a key added to conf/ that changes what a run computes gets `added=<its old behaviour's value>` in
    schema.SCHEMA (identity.ADDED_KEYS is its view). Change the pin only when runs are meant to start over."""
    # 2026-12-01: b507fa05 (was 6b85900d): checkpoints and early stopping monitor val/acc, not val/loss; an
    # old run's best score (a loss) cannot be compared with an accuracy, so runs start over.
    # 2026-12-01 (later): 6f39af5f: one `monitor` for every consumer (the classifier's own default, val/acc)
    # and checkpoint files named after it (epoch005-val_acc_0.9944.ckpt): the same computation, but the
    # config says it another way and the files have other names, so runs start over.
    assert train_cfg().run_name == "digits-cnn-6f39af5f"


def test_a_net_whose_shapes_changed_ends_in_one_line_naming_the_tensors(
    train_cfg, tmp_path: Path, capsys
) -> None:
    """What a code edit of the net does to a run's checkpoints, as an explicit checkpoint of another width."""
    first = train(train_cfg(*FIT, "model=mlp", "run_name=narrow"))
    last = first.trainer.checkpoint_callback.last_model_path
    wider = ["model=mlp", "model.net.hidden=[64]", "run_name=wide", f"ckpt_path={last}"]
    code, line = _fails(lambda: train(train_cfg(*FIT, *wider)), capsys)
    assert code == 2 and "does not fit the model" in line and "saved" in line and "net." in line, line


def test_rerunning_after_a_code_edit_that_changes_shapes_is_one_line(
    train_cfg, run_dir: Path, capsys, monkeypatch
) -> None:
    """The same command, after the net's code changed its layer widths (the config did not change)."""
    from lightspeed.models.nets.mlp import MLP

    train(train_cfg(*FIT, "model=mlp"))
    edited = MLP.__init__

    def wider(self, input_shape, num_outputs, hidden=(256, 256), dropout=0.0) -> None:
        edited(self, input_shape, num_outputs, [2 * h for h in hidden], dropout)

    monkeypatch.setattr(MLP, "__init__", wider)
    code, line = _fails(lambda: train(train_cfg(*FIT, "model=mlp")), capsys)
    assert code == 2 and "does not fit the model" in line and "saved" in line and "now" in line, line


def test_debug_runs_write_no_checkpoint_and_resume_none(train_cfg, run_dir: Path) -> None:
    quiet = [o for o in TINY if o not in LIMIT]
    for _ in range(2):  # the second identical run trains again, from scratch
        assert train(train_cfg("debug=limit", *quiet)).trainer.global_step == 10
    assert not list(run_dir.rglob("*.ckpt"))


# 2. One folder, one writer


def test_a_locked_run_folder_is_refused_naming_its_holder_and_a_dead_holders_lock_is_taken(
    train_cfg, run_dir: Path, capsys
) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from lightspeed.resilience import lock; "
            f"h = lock.acquire(Path({str(run_dir)!r})); print('held', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        code, line = _fails(lambda: train(train_cfg(*FIT)), capsys)
        assert code == 2 and f"in use by another run (pid {holder.pid} on " in line and "run_name=" in line
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert not (run_dir / "checkpoints").exists()  # the refused run wrote nothing
    assert train(train_cfg(*FIT)).trainer.global_step == 10  # the dead holder's lock is free


def test_the_lock_is_released_when_the_run_ends(run_dir: Path) -> None:
    with lock.held(run_dir), pytest.raises(Exception, match="in use by another run"):
        lock.acquire(run_dir)
    lock.acquire(run_dir).close()


def test_a_run_refused_after_taking_its_lock_releases_it(train_cfg, run_dir: Path, monkeypatch) -> None:
    """A setting refused once the lock is held (accel's autos resolve after it) still frees the folder."""

    def refuse(cfg: Any) -> None:
        raise ConfigError("accel.compile=true is refused here")

    monkeypatch.setattr("lightspeed.speed.accel.resolve", refuse)
    with pytest.raises(SystemExit) as refused, Run(train_cfg(*TINY)):
        pass
    assert (run_dir / lock.LOCK_FILE).exists()  # it was taken
    lock.acquire(run_dir).close()  # while `refused` keeps the failed run's frames (and objects) alive
    assert refused.value.code == 2


def _write_repeatedly(target: str, step: int, size: int, barrier: Any) -> None:
    """One writer process: the same path, again and again, as a second copy of a run would."""
    payload = {"state_dict": {"w": torch.full((size,), float(step))}, "global_step": step}
    barrier.wait()
    for _ in range(8):
        AtomicCheckpointIO().save_checkpoint(dict(payload), target)


@pytest.mark.slow  # two writer processes racing for ~10 s
def test_two_writer_processes_of_one_checkpoint_path_never_tear_it(tmp_path: Path) -> None:
    """Each write has a temporary file of its own: the last rename wins, whole. Processes, not threads:
    torch.save holds the interpreter, so threads never overlap where it matters; two processes sharing
    one temporary name truncate each other's file, or rename it away from under the other."""
    import multiprocessing

    target = tmp_path / "last.ckpt"
    ctx = multiprocessing.get_context(
        "spawn"
    )  # fork after torch has started its threads can deadlock the child
    barrier = ctx.Barrier(2)
    procs = [
        ctx.Process(target=_write_repeatedly, args=(str(target), s, n, barrier))
        for s, n in ((1, 4_000_000), (2, 1_000_000))
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]  # neither found its file renamed or removed by the other
    assert verify.problem(target) is None
    saved = torch.load(target, weights_only=True)
    assert (saved["state_dict"]["w"] == saved["global_step"]).all()  # one writer's bytes, whole
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left


# 3. Foreign checkpoints


def _drop_foreign(train_cfg, run_dir: Path, **changes) -> bytes:
    """A run, then a checkpoint of another run (an MLP) far ahead of it in its folder; last.ckpt's bytes."""
    mlp = train(train_cfg(*FIT, "model=mlp", f"paths.output_dir={run_dir.parent / 'other'}"))
    foreign = torch.load(mlp.trainer.checkpoint_callback.last_model_path, weights_only=True)
    train(train_cfg(*FIT))
    foreign["global_step"] = 1000
    for key, value in changes.items():
        foreign[key] = value
    torch.save(foreign, run_dir / "checkpoints" / "zz-foreign.ckpt")
    return (run_dir / "checkpoints" / "last.ckpt").read_bytes()


def test_a_foreign_checkpoint_further_ahead_is_passed_over_and_last_ckpt_kept(
    train_cfg, run_dir: Path
) -> None:
    before = _drop_foreign(train_cfg, run_dir)
    with pytest.warns(UserWarning, match=r"zz-foreign\.ckpt: written by another run \(.*model\.net\.name"):
        again = train(train_cfg(*FIT))
    assert again.trainer.global_step == 10
    assert (run_dir / "checkpoints" / "last.ckpt").read_bytes() == before


def test_a_checkpoint_without_identity_in_a_run_that_has_one_is_passed_over(train_cfg, run_dir: Path) -> None:
    before = _drop_foreign(train_cfg, run_dir, identity=None)
    with pytest.warns(UserWarning, match="holds no run identity"):
        assert train(train_cfg(*FIT)).trainer.global_step == 10
    assert (run_dir / "checkpoints" / "last.ckpt").read_bytes() == before


def test_a_checkpoint_with_nan_weights_is_passed_over_and_never_copied(train_cfg, run_dir: Path) -> None:
    train(train_cfg(*FIT))
    folder = run_dir / "checkpoints"
    last = folder / "last.ckpt"
    before = last.read_bytes()
    poisoned = torch.load(last, weights_only=True)
    name = next(k for k, v in poisoned["state_dict"].items() if v.is_floating_point())
    poisoned["state_dict"][name][0] = float("nan")
    poisoned["global_step"] = 1000
    poisoned["checksum"] = checkpoint.checksum(poisoned)  # a consistent file: only its weights are bad
    torch.save(poisoned, folder / "zz-nan.ckpt")
    with pytest.warns(UserWarning, match=r"zz-nan\.ckpt: its weights are not finite"):
        assert train(train_cfg(*FIT)).trainer.global_step == 10
    assert last.read_bytes() == before


# 5. Without the optional callbacks


def test_callbacks_none_checkpoints_where_resume_looks_and_a_sigterm_exits_143(
    train_cfg, run_dir: Path, capsys
) -> None:
    none = [*(o for o in FIT if not o.startswith("callbacks.")), "callbacks=none"]
    with pytest.raises(SystemExit) as exit_:
        train(train_cfg(*none), [Fault("sigterm", step=2)])
    assert exit_.value.code == 143 and "preempted by SIGTERM: saved" in capsys.readouterr().err
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3
    assert train(train_cfg(*none)).trainer.global_step == 10  # continued, not started over


# 7. Silent corruption


def _flip_a_weight_bit(path: Path) -> None:
    """Flip the lowest bit of a stored float's first byte on disk, as bit rot would: the file still
    loads (torch does not check the archive's CRCs)."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if "/data/" in i.filename)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        offset = info.header_offset + 30 + name_len + extra_len
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 1]))
    torch.load(path, weights_only=True)  # still loads


def test_a_checkpoint_with_a_flipped_bit_is_treated_as_corrupt(train_cfg, run_dir: Path, capsys) -> None:
    first = train(train_cfg(*FIT))
    last = run_dir / "checkpoints" / "last.ckpt"
    best = Path(first.trainer.checkpoint_callback.best_model_path)
    _flip_a_weight_bit(last)
    assert "checksum" in verify.problem(last)
    with pytest.warns(UserWarning, match=r"last\.ckpt: its tensors no longer match their checksum"):
        assert resume.resolve(train_cfg(*FIT)) == str(best)
    _flip_a_weight_bit(best)
    code, line = _fails(lambda: train(train_cfg(*FIT, "run_name=again", f"ckpt_path={best}")), capsys)
    assert code == 2 and "no longer match their checksum" in line


def test_a_checkpoint_whose_tensor_claims_more_than_its_file_holds_is_passed_over(
    train_cfg, run_dir: Path, capsys
) -> None:
    """A tensor of 2^40 elements over a one-element storage (an expanded view, as torch.save keeps it): a
    checksum or a finiteness check would allocate terabytes. Auto-resume passes it over with a warning;
    given as ckpt_path, it is one line."""
    first = train(train_cfg(*FIT))
    last = run_dir / "checkpoints" / "last.ckpt"
    crafted = torch.load(last, weights_only=True)
    crafted["global_step"] += 100  # newer than the run's own: resume would take it first
    crafted["state_dict"]["huge"] = torch.zeros(1).expand(2**20, 2**20)
    bomb = run_dir / "checkpoints" / "zz-newer.ckpt"
    torch.save(crafted, bomb)
    assert bomb.stat().st_size < 10 * last.stat().st_size  # small on disk
    assert "claims 1099511627776 elements, more than its file holds" in verify.problem(bomb)
    with pytest.warns(UserWarning, match=r"zz-newer\.ckpt: its tensor /state_dict/huge claims"):
        resumed = resume.resolve(train_cfg(*FIT))
    assert resumed in (str(last), first.trainer.checkpoint_callback.best_model_path)
    code, line = _fails(lambda: train(train_cfg(*FIT, "run_name=again", f"ckpt_path={bomb}")), capsys)
    assert code == 2 and "claims 1099511627776 elements" in line


# 9. Names that would leave their folder


@pytest.mark.parametrize(
    "args",
    [
        ["run_name=.."],
        ["task_name=../../../x"],
        ["run_name=a/b"],
        ["task_name=."],
        ["++run_name=.."],
        ["run_name=${oc.env:LIGHTSPEED_TEST_ESCAPE}"],  # as resolved: an environment variable makes ../..
        ["hydra.job.name=../.."],
        ["hydra.output_subdir=../.."],
        ["-r", "run_name=.."],  # Hydra's own flags do not skip the check
        ["--config-dir", "/tmp", "run_name=.."],
        ["-m", "run_name=..", "seed=1,2"],
        ["-m", "run_name=ok,../../x"],  # a swept value: each job's name is checked
        ["-m", "hydra.sweep.subdir=..", "seed=1,2"],
        ["hydra.mode=MULTIRUN", "run_name=a,.."],
    ],
)
def test_names_that_would_leave_their_folder_are_refused_as_resolved_before_any_folder_is_made(
    args: list[str], monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LIGHTSPEED_TEST_ESCAPE", "../..")
    key = (
        next(a for a in args if "=" in a and not a.startswith(("seed", "hydra.mode")))
        .lstrip("+")
        .split("=")[0]
    )
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}=.* \(as resolved\) is invalid"):
        command_line(args, tmp_path)  # what the command line runs before Hydra makes any folder


def test_an_option_that_config_dir_adds_is_an_option(tmp_path: Path) -> None:
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\ntrainer:\n  max_epochs: 1\n")
    args = ["--config-dir", str(tmp_path), "experiment=mine"]
    command_line(args, tmp_path)  # found in the added folder
    with pytest.raises(ConfigError, match=r"^experiment=mine is not an option"):
        command_line(["experiment=mine"], tmp_path)


def test_an_optional_groups_missing_option_is_refused_not_skipped(tmp_path: Path) -> None:
    """`optional local: default`: Hydra skips a missing option of an optional group without a word, and the
    run would go on without the user's settings."""
    with pytest.raises(ConfigError, match=r"^local=nosuch is not an option: add conf/local/nosuch.yaml"):
        command_line(["local=nosuch"], tmp_path)
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "mine.yaml").write_text("trainer:\n  max_epochs: 1\n")
    with pytest.raises(ConfigError, match=r"^local=nosuch is not an option: use one of mine "):
        command_line(["--config-dir", str(tmp_path), "local=nosuch"], tmp_path)


def test_an_option_that_a_yaml_file_names_is_refused_naming_that_file(tmp_path: Path) -> None:
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "bad.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /logger: nosuch\n"
    )
    with pytest.raises(
        ConfigError, match=r"^logger=nosuch is not an option: use one of csv, .*a defaults list did"
    ):
        command_line(["--config-dir", str(tmp_path), "experiment=bad"], tmp_path)
    with pytest.raises(ConfigError) as err:  # a primary config is no option of a group
        command_line(["--config-name", "sub/nosuch"], tmp_path)
    assert "is not an option" not in str(err.value) and "sub/nosuch" in str(err.value)


def test_hydra_flags_that_would_read_other_configs_or_unpickle_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^--experimental-rerun is not supported: it unpickles a file"):
        check_flags(["--experimental-rerun", "logs/x/.hydra/config.pickle"])
    with pytest.raises(ConfigError, match=r"^--config-path is not supported here: use --config-dir"):
        check_flags(["--config-path", "/tmp"])


@pytest.mark.slow  # the command line's path to the check above (~7 s: a fresh process)
def test_a_name_that_would_leave_its_folder_is_one_line_from_the_command_line(tmp_path: Path) -> None:
    proc = run_module("lightspeed.train", "run_name=..", f"paths.log_dir={tmp_path / 'logs'}", cwd=tmp_path)
    assert proc.returncode == 2
    assert one_line_error(proc).startswith("error: run_name='..' (as resolved) is invalid")
    assert not (tmp_path / "logs").exists()


# 10. What a config may instantiate: the command line and conf/ are code the user runs; data is not


@pytest.mark.slow  # a fresh process (~7 s)
def test_the_command_line_may_name_any_class_as_code_the_user_runs(tmp_path: Path) -> None:
    """Trusted like the .py files beside it: a callback of the user's own (here a probe) and Hydra's own
    plugins run from the command line, and so does what they were told."""
    args = [
        "+callbacks.mine._target_=probes.AutocastProbe",
        "+hydra.callbacks.ret._target_=hydra.experimental.callbacks.LogJobReturnCallback",
        "debug=fdr",
        f"paths.log_dir={tmp_path / 'logs'}",
    ]
    proc = run_module("lightspeed.train", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_what_hydra_itself_instantiates_from_the_command_line_passes_the_checks(tmp_path: Path) -> None:
    """The allow-list is gone for trusted input: Hydra's callbacks, launchers and sweepers, and Python's
    logging handlers, as the user names them (the checks before Hydra still compose and check names)."""
    command_line(["+hydra.callbacks.x._target_=hydra.experimental.callbacks.LogJobReturnCallback"], tmp_path)
    command_line(["-m", "seed=1,2", "hydra/launcher=basic", "hydra/sweeper=basic"], tmp_path)
    command_line(["+hydra.job_logging.handlers.x.class=logging.NullHandler"], tmp_path)


def test_a_checkpoint_cannot_make_the_checkpoint_callback_delete_a_file_outside_its_folder(
    tmp_path: Path,
) -> None:
    """A checkpoint is data: its ModelCheckpoint state names "previous best" files, which Lightning deletes
    when a better one comes, after checking by the path's text alone that they are in its folder. A path
    through `..` passed that check; restored now, only paths inside the folder once resolved are kept."""
    from lightspeed.callbacks import ModelCheckpoint

    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (folder / "epoch000-val_acc_0.5000.ckpt").write_bytes(b"x")
    escape = str(folder / ".." / ".." / "victim.txt")
    mine = str(folder / "epoch000-val_acc_0.5000.ckpt")
    callback = ModelCheckpoint(dirpath=str(folder), monitor="val/acc", mode="max", save_top_k=1)
    state = {
        "dirpath": str(folder),
        "monitor": "val/acc",
        "best_model_score": torch.tensor(0.5),
        "best_model_path": mine,
        "kth_best_model_path": escape,
        "kth_value": torch.tensor(-1.0),
        "best_k_models": {escape: torch.tensor(-1.0), mine: torch.tensor(0.5)},
        "last_model_path": escape,
    }
    callback.load_state_dict(state)
    assert callback.best_k_models == {mine: torch.tensor(0.5)}
    assert (callback.kth_best_model_path, callback.last_model_path, callback.best_model_path) == (
        "",
        "",
        mine,
    )
    assert victim.read_text() == "keep me"


def test_an_allow_list_of_an_earlier_version_is_one_line(train_cfg, capsys) -> None:
    with pytest.raises(
        ConfigError, match=r"^allowed_targets is no longer needed: the command line and conf/"
    ):
        check_known_keys(train_cfg("+allowed_targets=[mypkg]"), "train")


def test_a_key_a_release_renamed_is_one_line_naming_its_new_name_wherever_it_is_set(
    train_cfg, monkeypatch, tmp_path: Path
) -> None:
    """On the command line (the old key is no longer in the config: Hydra refuses it) and in a yaml file
    (merged into the composed config, `+` here: what nothing would read): never silently ignored."""
    line = "was renamed accel.compile_knob (0.3): use accel.compile_knob=<value>"
    monkeypatch.setitem(config.RETIRED, "accel.old_knob", line)
    with pytest.raises(ConfigError, match=rf"^accel.old_knob {re.escape(line)}$"):
        command_line(["accel.old_knob=1"], tmp_path)
    with pytest.raises(ConfigError, match=rf"^accel.old_knob {re.escape(line)}$"):
        check_known_keys(train_cfg("+accel.old_knob=1"), "train")
    check_known_keys(train_cfg("+accel.other_knob=1"), "train")  # a key of the user's own stays theirs


def test_the_model_summary_s_old_key_names_the_speed_report_s_and_a_user_s_own_summary_stays(
    train_cfg, tmp_path: Path
) -> None:
    """0.2 prints the model summary from the speed report: `callbacks.model_summary.max_depth=3` (and
    `callbacks.model_summary=null`, of the quiet test lists) is one line naming the new key; a
    ModelSummary the user configures in a callbacks group of their own is theirs, and kept."""
    new = "callbacks.speed_report.summary_depth"
    for old in ("callbacks.model_summary.max_depth=3", "callbacks.model_summary=null"):
        with pytest.raises(ConfigError, match=rf"^callbacks.model_summary\S* *.*is now {new}:"):
            command_line([old], tmp_path)
    own = "+callbacks.model_summary={_target_:lightning.pytorch.callbacks.ModelSummary,max_depth:3}"
    check_known_keys(train_cfg(own), "train")


def test_the_preemption_keys_name_exact_resume_s(tmp_path: Path) -> None:
    """Preemption is a part of ExactResume since issue 47: the old node and any key under it, as the SLURM
    scripts and docs of an earlier release write them, are one line naming callbacks.exact_resume."""
    for old in ("callbacks.preemption.check_every_n_steps=1", "callbacks.preemption=null"):
        with pytest.raises(ConfigError, match=r"^callbacks.preemption\S* *.*callbacks.exact_resume"):
            command_line([old], tmp_path)


# 6. A full disk


class FillDisk(L.Callback):
    """At a step, fill the run folder's disk but for a few KiB, as another job writing there would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, idx: int) -> None:
        if trainer.global_step == self.step:
            folder = Path(trainer.default_root_dir)
            free = shutil.disk_usage(folder).free
            with open(folder / "filler", "wb") as f:
                f.write(b"\0" * max(free - 16 * 1024, 0))


@pytest.fixture
def small_disk(tmp_path: Path, monkeypatch) -> Iterator[tuple[Path, list[L.Callback]]]:
    """A 32 MiB tmpfs that a callback fills at step 6, where mounting works; else the real disk (never
    filled), with the checkpoint writer made to fail after step 5 as torch's does on a full disk."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(disk)], capture_output=True
    ).returncode:
        real_save = torch.save

        def full(obj, f, *args, **kwargs):
            if isinstance(obj, dict) and obj.get("global_step", 0) > 5:
                raise RuntimeError(
                    "[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed "
                    "writing file data/3: file write failed"
                )
            return real_save(obj, f, *args, **kwargs)

        monkeypatch.setattr(checkpoint.torch, "save", full)
        yield disk, []
        return
    yield disk, [FillDisk(step=6)]
    subprocess.run(["umount", str(disk)], check=False)


def test_a_full_disk_is_one_line_and_keeps_the_earlier_checkpoints(train_cfg, small_disk, capsys) -> None:
    disk, filler = small_disk
    run = disk / "run"
    code, line = _fails(lambda: train(train_cfg(*FIT, f"paths.output_dir={run}"), filler), capsys)
    assert code == 3 and "no space left on the disk of" in line and "kept intact: " in line, line
    folder = run / "checkpoints"
    assert not list(folder.glob("*.tmp"))
    for path in folder.glob("*.ckpt"):
        assert verify.problem(path) is None
        assert torch.load(path, weights_only=True)["global_step"] == 5


# 11. Messages that say what happened


def test_random_bytes_are_not_a_checkpoint_file_and_a_folder_is_a_folder(
    train_cfg, tmp_path: Path, capsys
) -> None:
    noise = tmp_path / "noise.ckpt"
    noise.write_bytes(bytes(range(256)) * 64)
    assert verify.problem(noise) == "not a checkpoint file"
    with pytest.raises(ConfigError, match=r"is not a checkpoint file"), checkpoint.loading(noise):
        torch.load(noise, weights_only=True)
    code, line = _fails(lambda: train(train_cfg(f"ckpt_path={tmp_path}")), capsys)
    assert code == 2 and line.startswith(f"error: ckpt_path={tmp_path} is a folder (it holds noise.ckpt)")


def _eval_fails(eval_cfg, capsys, ckpt: Path, *extra: str) -> str:
    code, line = _fails(lambda: evaluate(eval_cfg(f"ckpt_path={ckpt}", *extra)), capsys)
    assert code == 2
    return line


def test_eval_refuses_nan_weights_mismatched_hyperparameters_and_instantiators(
    train_cfg, eval_cfg, run_dir: Path, tmp_path: Path, capsys
) -> None:
    last = Path(train(train_cfg(*FIT)).trainer.checkpoint_callback.last_model_path)
    ckpt = torch.load(last, weights_only=True)
    bad = tmp_path / "bad.ckpt"

    nan = {**ckpt, "state_dict": {k: v.clone() for k, v in ckpt["state_dict"].items()}}
    next(v for v in nan["state_dict"].values() if v.is_floating_point()).fill_(float("nan"))
    nan["checksum"] = checkpoint.checksum(nan)  # a consistent file: only its weights are bad
    torch.save(nan, bad)
    assert "weights are not finite" in _eval_fails(eval_cfg, capsys, bad)

    mlp = {**ckpt, MODEL_CONFIG_KEY: {**ckpt[MODEL_CONFIG_KEY], "net": {"name": "mlp"}}}
    torch.save(mlp, bad)
    assert "does not fit the model" in _eval_fails(eval_cfg, capsys, bad)

    # the module is rebuilt from its node, not by Lightning from its hyperparameters (an instantiator there
    # is never called); an older checkpoint's hyperparameters are the class's arguments, and this is none
    code = {**ckpt, "hyper_parameters": {**ckpt["hyper_parameters"], "_instantiator": "os.system"}}
    torch.save({k: v for k, v in code.items() if k != MODEL_CONFIG_KEY}, bad)
    assert "does not rebuild" in _eval_fails(eval_cfg, capsys, bad)


def test_ctrl_c_says_it_was_interrupted_and_what_a_rerun_continues_from(
    train_cfg, run_dir: Path, capsys
) -> None:
    # As in a terminal: a shell without job control starts background commands with SIGINT ignored, and
    # Python then leaves it ignored (`make test &` in a script).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as exit_:
            train(train_cfg(*FIT), [Fault("sigint", step=7)])
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert exit_.value.code == 130 and "Traceback" not in err
    last = run_dir / "checkpoints" / "last.ckpt"
    assert f"interrupted by SIGINT (Ctrl-C) at step 7: the newest checkpoint is {last} (step 5)" in err


def test_a_mid_epoch_resume_with_another_batch_size_says_so(train_cfg, run_dir: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        train(train_cfg(*FIT), [Fault("sigterm", step=2)])  # saved mid-epoch, at step 3
    last = run_dir / "checkpoints" / "last.ckpt"
    other = [*FIT, "data.batch_size=32", "run_name=other", f"ckpt_path={last}"]
    with pytest.warns(UserWarning, match=r"resumed at batch 3 of epoch 0 with data.batch_size=32, but the "):
        train(train_cfg(*other, f"paths.output_dir={run_dir.parent / 'other'}"))


# 4. Moved run folders

TESTED = [*TINY, "model.scheduler.name=none"]


def test_a_finished_run_copied_or_moved_elsewhere_tests_its_own_files(
    train_cfg, run_dir: Path, tmp_path: Path
) -> None:
    train(train_cfg(*TESTED))
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)  # the old folder stays: the copy must not use its files
    again = train(train_cfg(*TESTED, f"paths.output_dir={copy}"))
    assert again.best_checkpoint and Path(again.best_checkpoint).parent == copy / "checkpoints"
    shutil.rmtree(run_dir)
    moved = tmp_path / "moved"
    shutil.move(copy, moved)  # and a folder whose old place is gone
    again = train(train_cfg(*TESTED, f"paths.output_dir={moved}"))
    assert Path(again.best_checkpoint).parent == moved / "checkpoints" and "test/acc" in again.metrics
    summary = json.loads((moved / "summary.json").read_text())
    assert summary["best_checkpoint"].startswith(str(moved))


def test_a_run_moved_mid_training_resumes_into_its_own_last_ckpt(
    train_cfg, run_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(SystemExit):
        train(train_cfg(*TESTED), [Fault("sigterm", step=6)])
    moved = tmp_path / "moved"
    shutil.move(run_dir, moved)
    again = train(train_cfg(*TESTED, f"paths.output_dir={moved}"))
    assert again.trainer.global_step == 10
    assert not [p for p in (moved / "checkpoints").glob("*.ckpt") if re.search(r"-v\d+\.ckpt$", p.name)]
    assert torch.load(moved / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 10


# 8. Every bad input in one line, before any work

BAD_INPUTS = [
    # (overrides, the start of the one line)
    (
        ["callbacks=none", "callbacks.early_stopping.patience=3"],
        "callbacks.early_stopping.patience is not a setting with the options chosen here (another option "
        "has it)",
    ),
    (["ckpt_path=/dev/zero"], "ckpt_path=/dev/zero is not a regular file (a fifo, a device)"),
    (["trainer.max_epoch=3"], "trainer.max_epoch is not a setting: did you mean trainer.max_epochs?"),
    (["trainer.devices=abc"], "trainer.devices=abc: `devices` selected with `CPUAccelerator`"),  # Lightning's
    (["trainer.devices=1.5"], "trainer.devices=1.5: `devices` selected with `CPUAccelerator`"),
    (["model.net.dropout=1.5"], "model.net.dropout=1.5 is invalid"),
    (["foo=bar"], "foo is not a setting (the top level has"),
    (["trainer.max_steps=-5"], "trainer.max_steps=-5 is invalid"),
    (["callbacks.model_checkpoint.save_top_k=-2"], "callbacks.model_checkpoint.save_top_k=-2 is invalid"),
    (["monitor.mode=minimum"], "monitor.mode='minimum' is invalid"),
    (["monitor.metric=val/loss", "monitor.mode=max"], "monitor.mode=max contradicts monitor.metric=val/loss"),
    (["monitor.metric=val/margin"], "monitor.mode is not set and the name of monitor.metric=val/margin"),
    (["trainer.max_epochs=٣"], "trainer.max_epochs=٣ cannot be read"),
    (["data.batch_size=６４"], "data.batch_size=６４ cannot be read"),
    (["a=b=c"], "a=b=c cannot be read (mismatched input '=' expecting <EOF>): write key=value and quote"),
    (
        ["trainer.max_epochs=(1"],
        "trainer.max_epochs=(1 cannot be read (extraneous input '('): write key=value",
    ),
    (
        ["model.optimizer.momentum=0.9"],
        "model.optimizer.momentum is not a setting with the options chosen here (another option has it)",
    ),
    (["trainer.val_check_interval=0"], "trainer.val_check_interval=0 is invalid"),
    (["model.optimizer.weight_decay=-1"], "model.optimizer.weight_decay=-1 is invalid"),
    (["model.scheduler.pct_start=2"], "model.scheduler.pct_start=2 is invalid"),
    (["model.net.channels=[0]"], "model.net.channels=[0] is invalid"),
    (["seed=-1"], "seed=-1 is invalid"),
    (["seed=99999999999999999999"], "seed=99999999999999999999 is invalid"),
    (["trainer.check_val_every_n_epoch=0"], "trainer.check_val_every_n_epoch=0 is invalid"),
    (
        ["monitor.metric=val/los", "monitor.mode=min"],
        "monitor.metric=val/los (mode min, used by EarlyStopping) is not a metric the model logs: did you "
        "mean monitor.metric=val/loss?",
    ),
    (
        ["monitor.metric=val/los", "monitor.mode=min", "trainer.num_sanity_val_steps=0"],
        "monitor.metric=val/los (mode min, used by EarlyStopping) is not a metric the model logs",
    ),
    (["data.split_seed=abc"], "data.split_seed='abc' is invalid"),
    (["data.batch_size=100000"], "data.batch_size=100000 is larger than the 1258 training samples"),
    (["model.net.channels=[]"], "model.net.channels=[] is invalid"),
    (["+foo=bar"], "foo is not a setting (the top level has"),
    (["run_name=.."], "run_name='..' (as resolved) is invalid"),
    (["trainer.min_epochs=-1"], "trainer.min_epochs=-1 is invalid"),
    (["trainer.num_sanity_val_steps=-5"], "trainer.num_sanity_val_steps=-5 is invalid"),
    (["callbacks.early_stopping.patience=-1"], "callbacks.early_stopping.patience=-1 is invalid"),
    (
        ["trainer.max_epochs=2", "trainer.min_epochs=5"],
        "trainer.min_epochs=5 is more than trainer.max_epochs=2",
    ),
    (["data.normalize=maybe"], "data.normalize='maybe' is invalid"),
    (["model.optimizer.lr=inf"], "model.optimizer.lr=inf is invalid"),
    (["experiment=bad_global_key"], "max_steps is not a setting"),
    (
        ["callbacks.early_stopping.monitor=val/accuracy"],
        "callbacks.early_stopping.monitor=val/accuracy differs from monitor.metric=val/acc: set the run's "
        "one "
        "monitor instead",
    ),
]


@pytest.fixture
def bad_experiment() -> Iterator[None]:
    """An experiment file with a key in the wrong place, as `+max_steps:` in its global package. (It is
    written into the checkout's conf/: the guide's test, which copies conf/, runs on the same xdist
    worker.)"""
    path = CONF_DIR / "experiment" / "bad_global_key.yaml"
    path.write_text("# @package _global_\nmax_steps: 100\n")
    yield
    path.unlink()


@pytest.mark.xdist_group("writes_conf")
@pytest.mark.parametrize(("overrides", "line"), BAD_INPUTS, ids=[" ".join(o) for o, _ in BAD_INPUTS])
def test_a_bad_input_is_one_line_and_exit_2_before_any_training(
    train_cfg, run_dir: Path, capsys, request, overrides: list[str], line: str, tmp_path: Path
) -> None:
    """As `python -m lightspeed.train <overrides>` runs them, in process: the checks before Hydra's run,
    then the task. (tests/test_cli.py runs the command line itself.)"""
    if "experiment=bad_global_key" in overrides:
        request.getfixturevalue("bad_experiment")

    def run() -> None:
        with exit_on_config_error():
            command_line(overrides, tmp_path)
        train(
            train_cfg(
                *overrides, "trainer.max_epochs=1" if "epochs" not in str(overrides) else "seed=1", *QUIET
            )
        )

    code, error = _fails(run, capsys)
    assert code == 2 and error.startswith(f"error: {line}"), error
    assert not (run_dir / "checkpoints").exists()


# What a second reading found


@pytest.mark.parametrize(
    ("kind", "group", "flag"),
    [
        ("aliases", "experiment", "--config-dir"),
        ("aliases", "mygroup", "-cd="),  # a group of the command line's own (+mygroup=bomb), the = form
        ("aliases", "experiment", "--config-d"),  # an abbreviation argparse takes
        ("nesting", "experiment", "--config-dir"),
        ("nesting_hydra", "experiment", "--config-dir"),
    ],
)
def test_a_yaml_bomb_through_config_dir_is_one_line_before_hydra_builds_it(
    tmp_path: Path, kind: str, group: str, flag: str
) -> None:
    """Nine levels of nine aliases: 9^9 (387 million) values once copied out, which Hydra would build for
    minutes (a hang); or 20,000 nested lists (Hydra's RecursionError traceback). Read on PyYAML's node
    graph, either is refused at once, in a `--config-dir` of the command line too; conf/ passes."""
    from lightspeed.run.command_line import check_yaml_sizes

    lines = ["# @package _global_", 'l0: &l0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
    depth = 300 if kind == "nesting_hydra" else 20_000  # 300: PyYAML reads it, OmegaConf recurses too deep
    text = "\n".join(lines) if kind == "aliases" else "a: " + "[" * depth + "]" * depth
    (tmp_path / "extra" / group).mkdir(parents=True)
    (tmp_path / "extra" / group / "bomb.yaml").write_text(text + "\n")
    where = [f"{flag}{tmp_path / 'extra'}"] if flag.endswith("=") else [flag, str(tmp_path / "extra")]
    choice = "experiment=bomb" if group == "experiment" else f"+{group}=bomb"
    said = {
        "aliases": r"\S+bomb\.yaml would expand to \d{9,} values",
        "nesting": r"\S+bomb\.yaml is nested too",
    }
    with pytest.raises(ConfigError, match=said.get(kind, "the config nests too deeply to compose")):
        command_line([*where, choice], tmp_path / "logs")
    check_yaml_sizes()  # the repository's own


def test_hydra_mode_multirun_is_a_sweep_too(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Ambiguous value"):  # a swept value outside a sweep
        command_line(["seed=1,2"], tmp_path)
    command_line(["hydra.mode=MULTIRUN", "seed=1,2"], tmp_path)  # a sweep: each job checks its own value


def test_a_launcher_whose_plugin_is_missing_is_one_line_naming_the_extra(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if "submitit" in name else real(name, *a)
    )
    for launcher in ("slurm", "local"):
        with pytest.raises(ConfigError, match=rf"^hydra/launcher={launcher} needs .* EXTRAS=dev,cluster"):
            check_flags(["-m", f"hydra/launcher={launcher}", "seed=1,2"])
    check_flags(["-m", "hydra/launcher=basic", "seed=1,2"])  # Hydra's own: no plugin


def test_fsdp_on_a_cpu_is_one_line_naming_what_works_there(train_cfg) -> None:
    with pytest.raises(ConfigError, match=r"^trainer=fsdp needs GPUs .* trainer=ddp_cpu"):
        validate_train(train_cfg("trainer=fsdp", "trainer.accelerator=cpu"))


def test_a_crash_after_which_lightning_exits_1_is_not_reported_as_ctrl_c() -> None:
    strategy = SimpleNamespace(launcher=None, cluster_environment=None)
    trainer = SimpleNamespace(interrupted=True, world_size=1, global_rank=0, strategy=strategy)
    with pytest.raises(SystemExit) as exit_, exit_on_failure(None, trainer):
        raise SystemExit(1)  # as after a rank died, with no KeyboardInterrupt behind it
    assert exit_.value.code == 1


def test_an_error_of_the_training_after_a_resume_is_not_blamed_on_the_checkpoint() -> None:
    with pytest.raises(EOFError, match="a truncated data file"), checkpoint.loading("last.ckpt"):
        raise EOFError("a truncated data file")
    with pytest.raises(pickle.UnpicklingError), checkpoint.loading(None):
        raise pickle.UnpicklingError("from the data, with no checkpoint at all")


def test_fine_tuning_from_another_runs_checkpoint_tests_its_own_best(train_cfg, run_dir: Path) -> None:
    first = train(train_cfg(*TESTED))
    last = first.trainer.checkpoint_callback.last_model_path
    other = run_dir.parent / "finetune"
    tuned = train(
        train_cfg(*TESTED, "trainer.max_epochs=3", f"paths.output_dir={other}", f"ckpt_path={last}")
    )
    assert Path(tuned.best_checkpoint).parent == other / "checkpoints" and "test/acc" in tuned.metrics


def test_the_lock_steps_aside_where_it_cannot_work(run_dir: Path, monkeypatch) -> None:
    def no_flock(*args) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock.fcntl, "flock", no_flock)
    with pytest.warns(UserWarning, match="cannot be locked"):
        lock.acquire(run_dir).close()
    monkeypatch.undo()
    monkeypatch.setenv("NODE_RANK", "1")  # another node's first process: the same run
    with lock.held(run_dir), lock.held(run_dir):
        pass


def test_a_monitor_of_step_or_epoch_is_not_refused(train_cfg) -> None:
    result = train(
        train_cfg(*FIT, "monitor.metric=step", "monitor.mode=max", "callbacks.early_stopping=null")
    )
    assert result.trainer.global_step == 10


def test_a_bug_inside_a_constructor_keeps_its_traceback_and_bad_keys_are_one_line() -> None:
    from hydra.errors import InstantiationException

    from lightspeed.run import build

    with pytest.raises(InstantiationException):  # a ValueError/TypeError of the code: not a setting
        build.instantiate({"_target_": "datetime.timedelta", "days": "x"}, "trainer.strategy.timeout")
    with pytest.raises(ConfigError, match=r"^trainer\.strategy\.timeout: .*dayz"):
        build.instantiate({"_target_": "datetime.timedelta", "dayz": 1}, "trainer.strategy.timeout")


# A run's folder and its files are its own: never a link into another run's, a FIFO or a device


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _other_run(tmp_path: Path) -> Path:
    other = tmp_path / "logs" / "train" / "runs" / "other"
    (other / "checkpoints").mkdir(parents=True)
    for name in ("summary.json", "run.json", "config_tree.txt", ".lock", "checkpoints/last.ckpt"):
        (other / name).write_text(f"the other run's {name}")
    return other


def test_a_run_name_linked_to_another_runs_folder_is_refused_before_hydra_writes(tmp_path: Path) -> None:
    """Every command: one line naming the link before Hydra makes the folder; the other run's files stay."""
    other = _other_run(tmp_path)
    (other.parent / "mine").symlink_to(other)
    before = _snapshot(other)
    with pytest.raises(ConfigError, match=r"runs/mine is a link .*run_name=<new name>"):
        command_line(["run_name=mine"], tmp_path / "logs")
    assert _snapshot(other) == before and not (other / ".hydra").exists()


def test_a_read_only_run_folder_is_one_line_before_hydra_writes(tmp_path: Path, monkeypatch) -> None:
    """As root the folder cannot be made read-only: this process is told it cannot write there."""
    folder = tmp_path / "logs" / "export" / "runs" / "ro"
    folder.mkdir(parents=True)
    access = config.os.access
    monkeypatch.setattr(config.os, "access", lambda p, mode: Path(p) != folder and access(p, mode))
    with pytest.raises(ConfigError, match=f"{folder} is not a writable folder"):
        command_line(["ckpt_path=x.ckpt", "run_name=ro"], tmp_path / "logs", "export")
    assert not (folder / ".hydra").exists()


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("summary.json", lambda path, other: path.symlink_to(other / "summary.json")),
        ("checkpoints", lambda path, other: path.symlink_to(other / "checkpoints")),
        (".lock", lambda path, other: path.symlink_to(other / ".lock")),
        ("config_tree.txt", lambda path, other: os.mkfifo(path)),
    ],
)
def test_a_file_of_the_run_linked_out_of_its_folder_or_a_fifo_is_refused(
    train_cfg, run_dir: Path, tmp_path: Path, capsys, name, make
) -> None:
    """In place of a file the run writes: one line naming it, before the run writes anything of its own
    (a FIFO would hang the write); the other run's files byte for byte as they were."""
    other = _other_run(tmp_path)
    run_dir.mkdir(parents=True)
    make(run_dir / name, other)
    before = _snapshot(other)
    code, line = _fails(lambda: train(train_cfg(*FIT)), capsys)
    assert code == 2 and f"{run_dir / name} is " in line, line
    assert _snapshot(other) == before
    assert {p.name for p in run_dir.iterdir()} == {name}
