"""The command line as a person uses it: subprocesses, DDP with 2 CPU processes, multirun, make."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LIMIT, REPO, command_line, run_module
from lightspeed import CONF_DIR
from lightspeed.core.config import ConfigError, validate_train

QUIET = [
    "trainer.num_sanity_val_steps=0",
    "callbacks.rich_progress_bar=null",
    "trainer.enable_progress_bar=false",
]


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize(
    ("override", "line"),
    [
        pytest.param(  # refused before the run takes a folder: the slow suite
            "trainer.precision=15",
            "trainer.precision=15: Precision 15 is invalid. Allowed precision values: (",
            marks=pytest.mark.slow,
        ),
        ("trainer.profiler=bogus", "trainer.profiler=bogus: When passing string value for the `profiler`"),
    ],
)
def test_a_value_lightning_refuses_is_its_own_line_naming_the_key_and_leaves_no_folder(
    tmp_path: Path, override: str, line: str
) -> None:
    """Lightning's own check, reworded where it is raised (the precision as accel resolves it, the profiler
    as the Trainer is built, after the run took its folder): one line, exit 2, and the folder the refused
    start made is gone."""
    proc = run_module("lightspeed.train", override, f"paths.log_dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2
    assert one_line_error(proc).startswith(f"error: {line}")
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("train/runs/*")), list(tmp_path.rglob("*"))  # nothing left


def test_a_mistyped_key_is_named_with_the_fix(tmp_path: Path) -> None:
    """In process: the command line runs this check before Hydra starts (a CLI example: the tests above
    and test_nothing_lost.py's folder names)."""
    with pytest.raises(ConfigError) as err:
        command_line(["trainer.max_epoch=3"], tmp_path)
    assert str(err.value) == (
        "trainer.max_epoch is not a setting: did you mean trainer.max_epochs? "
        "to add a key of your own: +trainer.max_epoch=3"
    )


@pytest.mark.parametrize("args", [[], ["model=mlp", "~callbacks.early_stopping"], ["trainer.max_epochs=3"]])
def test_hydra_composes_a_run_as_often_as_a_bare_hydra_app(
    monkeypatch, capsys, tmp_path: Path, args: list[str]
) -> None:
    """Options alone (`make train`, `model=mlp`) and values (`x=3`): the engine composes nothing of its
    own; the checks read what Hydra composed. Hydra's
    `main` itself composes twice (once for `hydra.mode`, once for the run): a bare app is the measure. A
    wrong type is still one line."""
    import hydra
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    calls = []
    real = ConfigLoaderImpl.load_configuration
    monkeypatch.setattr(
        ConfigLoaderImpl, "load_configuration", lambda *a, **k: calls.append(a) or real(*a, **k)
    )
    assert len(command_line(args, tmp_path)) == 1
    ours, calls[:] = len(calls), []

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
    def bare(cfg) -> None:
        pass

    argv = ["bare", *args, f"paths.log_dir={tmp_path}", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    monkeypatch.setattr(sys, "argv", argv)
    bare()
    assert ours == len(calls) == 2
    with pytest.raises(SystemExit) as stop:  # the task's refusal: its one line, exit 2
        command_line(["trainer.accumulate_grad_batches=many"], tmp_path, task=validate_train)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and line.startswith("error: trainer.accumulate_grad_batches='many'"), line


@pytest.mark.slow
def test_ddp_cpu_trains_two_ranks_into_one_run_dir(tmp_path: Path) -> None:
    """Also the ranks' device-resident shards (data.on_device=true, as auto gives on the CPU)."""
    run = tmp_path / "ddp_run"
    proc = run_module(
        "lightspeed.train",
        "trainer=ddp_cpu",
        "data.on_device=true",
        *LIMIT,
        *QUIET,
        f"hydra.run.dir={run}",
        "+callbacks.probe._target_=probes.RankProbe",
        f"+callbacks.probe.out={tmp_path / 'probe'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / "probe" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["initial_seed"] != ranks[1]["initial_seed"]  # distinct seeds per rank
    assert {r["loader"] for r in ranks} == {"DeviceLoader"}
    a, b = (set(r["indices"]) for r in ranks)
    assert not a & b and a | b == set(range(ranks[0]["dataset_size"]))  # the sampler splits the data
    assert len(a) == len(b) == ranks[0]["dataset_size"] // 2  # in shares of one size
    # one run directory, written by rank 0 only: its checkpoints, logs and summary
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["ddp_run", "probe"]
    assert {p.name for p in (run / "checkpoints").iterdir()} >= {"last.ckpt"}
    assert (run / "csv" / "version_0" / "metrics.csv").is_file() and (run / "summary.json").is_file()
    assert (run / "train_ddp_process_1.log").is_file()  # rank 1 ran in the same directory
    assert proc.stdout.count("Lightspeed: training finished") == 1  # one summary, from rank 0
    # each rank released its process group before the interpreter's exit (gloo's threads can abort it)
    ends = [json.loads((tmp_path / "probe" / f"rank{r}.exit.json").read_text()) for r in (0, 1)]
    assert ends == [{"process_group_alive": False}] * 2


def _rank_draws(rank: int, queue: object) -> None:
    """One rank's process: what RankSeed seeds once fit starts, then a draw of each generator."""
    import random
    from types import SimpleNamespace

    import numpy as np
    import torch

    from lightspeed.resilience.rank_seed import RankSeed

    torch.manual_seed(42)  # as seed_everything leaves every rank before fit: the same seed
    RankSeed(42).on_fit_start(SimpleNamespace(world_size=2, global_rank=rank), None)
    queue.put((rank, torch.initial_seed(), torch.rand(3).tolist(), float(np.random.rand()), random.random()))


def test_each_rank_process_draws_its_own_random_numbers_from_seed_plus_rank() -> None:
    """The fast twin of the DDP run above: two processes, as two ranks are, and their draws after fit
    starts (dropout masks, on-device augmentation) differ, and are the same again in a rerun."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")

    def ranks() -> dict[int, tuple]:
        queue = ctx.Queue()
        procs = [ctx.Process(target=_rank_draws, args=(r, queue)) for r in (0, 1)]
        for p in procs:
            p.start()
        found = dict((r, rest) for r, *rest in (queue.get(timeout=60) for _ in procs))
        for p in procs:
            p.join(timeout=60)
        return found

    first, again = ranks(), ranks()
    assert [first[r][0] for r in (0, 1)] == [42, 43]  # seed + rank
    assert all(first[0][i] != first[1][i] for i in (1, 2, 3))  # torch, numpy and random all differ
    assert first == again  # and are a function of the seed and the rank alone


def test_multirun_sweeps_two_jobs(tmp_path: Path) -> None:
    proc = run_module(
        "lightspeed.train",
        "-m",
        "model=mlp,cnn",
        "debug=fdr",
        *QUIET,
        f"paths.log_dir={tmp_path}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # each job is an ordinary run, in the folder its own command would use: rerunning the sweep resumes it
    jobs = sorted(tmp_path.glob("train/runs/*/summary.json"))
    assert [p.parent.name.rsplit("-", 1)[0] for p in jobs] == ["digits-cnn", "digits-mlp"]
    assert [json.loads(p.read_text())["config"]["model"]["net"]["name"] for p in jobs] == ["cnn", "mlp"]
    for job in jobs:  # Lightning's messages reach each job's log file, not only the console
        assert "Running in `fast_dev_run` mode" in (job.parent / "train.log").read_text()
    # the sweep ends with a table of its jobs, printed and written
    assert "Lightspeed: sweep of 2 runs" in proc.stdout
    (table,) = tmp_path.glob("train/sweeps/*.md")
    rows = table.read_text().splitlines()[4:]
    assert len(rows) == 2 and all(" done " in r for r in rows), rows
    assert sorted(r.split(" | ")[0] for r in rows) == ["| model=cnn", "| model=mlp"]  # what varies


@pytest.mark.slow  # the refusal itself is tested in process (test_train.py)
def test_multirun_with_in_process_ddp_is_refused_up_front(tmp_path: Path) -> None:
    proc = run_module(
        "lightspeed.train",
        "-m",
        "trainer=ddp_cpu",
        "model=mlp,cnn",
        f"paths.log_dir={tmp_path}",
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "multirun (-m) cannot drive a multi-process trainer.strategy" in one_line_error(proc)
    assert not list(tmp_path.glob("**/*.ckpt"))


def test_eval_without_a_training_run_says_what_to_do(eval_cfg, tmp_path: Path, capsys) -> None:
    """In process; eval's command line ends in one line and exit 2 in test_checkpoint.py."""
    from lightspeed.eval import run as evaluate

    with pytest.raises(SystemExit) as exit_:
        evaluate(eval_cfg(f"paths.log_dir={tmp_path}"))
    assert exit_.value.code == 2
    assert "run `make train` first, or pass ckpt_path=" in capsys.readouterr().err


def test_eval_of_a_missing_checkpoint_names_it(eval_cfg, tmp_path: Path, capsys) -> None:
    """In process, as the test above."""
    from lightspeed.eval import run as evaluate

    with pytest.raises(SystemExit) as exit_:
        evaluate(eval_cfg(f"ckpt_path={tmp_path / 'nope.ckpt'}"))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"error: ckpt_path={tmp_path / 'nope.ckpt'} does not exist" in err


@pytest.mark.parametrize(
    ("config_name", "fix"),
    [("eval", "; it uses the config the checkpoint's run trained with: choose that run with ckpt_path="),
     ("shards", ": remove it")],
)  # fmt: skip
def test_a_group_the_command_does_not_choose_from_says_so(config_name: str, fix: str, tmp_path: Path) -> None:
    """`make eval experiment=sort_gpt`: Hydra's "No match in the defaults list" as one line with the fix
    (was: "experiment is not a setting (the top level has ): ...")."""
    with pytest.raises(ConfigError) as err:
        command_line(["experiment=sort_gpt"], tmp_path, config_name)
    assert str(err.value).startswith(f"experiment=sort_gpt: {config_name} has no experiment to choose{fix}")


def make(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """`make <args>` as a user types it: not the settings of the `make test ARGS=...` that runs this."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS")}
    return subprocess.run(["make", *args], cwd=REPO, env=env, capture_output=True, text=True, check=check)


def make_dry_run(*args: str) -> str:
    """The command `make train ...` would run, without running it."""
    out = make("-n", *args, check=True).stdout
    return [line for line in out.splitlines() if "-m lightspeed." in line][-1].rstrip()


def test_make_passes_overrides_through_in_order() -> None:
    line = make_dry_run(
        "train",
        "trainer.max_epochs=3",
        "data.batch_size=128",
        "model=mlp",
        "ARGS=+trainer.max_time=00:00:01:00 ~logger",
    )
    assert re.search(
        r"-m lightspeed\.train 'trainer\.max_epochs=3' 'data\.batch_size=128' 'model=mlp' "
        r"\+trainer\.max_time=00:00:01:00 '~logger' \|\|",
        line,
    ), line


def test_make_keeps_values_with_spaces_and_drops_its_own_settings() -> None:
    line = make_dry_run("eval", "ckpt_path=/tmp/a b.ckpt", "TORCH=torch==2.13.0", "predict=true")
    assert "-m lightspeed.eval 'ckpt_path=/tmp/a b.ckpt' 'predict=true' ||" in line, line


def test_make_puts_multirun_before_the_overrides() -> None:
    line = make_dry_run("train", "experiment=digits_mlp", "ARGS=-m model.optimizer.lr=0.003,0.01")
    assert re.search(
        r"-m lightspeed\.train -m 'experiment=digits_mlp' model\.optimizer\.lr=0\.003,0\.01 \|\|", line
    ), line


def test_make_names_the_programs_exit_code_and_its_meaning() -> None:
    proc = make("train", "foo=bar")
    assert proc.returncode == 2  # make's own, whatever the program's
    explained = [line for line in proc.stderr.splitlines() if line.startswith("make: python")]
    meaning = "a bad setting: the error line above names it and the fix"
    assert explained == [f"make: python -m lightspeed.train exited with 2: {meaning}"], proc.stderr


def test_without_any_hydra_plugin_a_command_line_runs_and_a_launcher_of_the_extra_is_one_line(
    monkeypatch,
) -> None:
    """A made project installs no Hydra plugin: `hydra_plugins` itself is then missing, and looking for the
    submitit launcher in it raises instead of finding nothing (its `make train` was a traceback)."""
    import importlib.util

    from lightspeed.run.command_line import check_flags

    real = importlib.util.find_spec

    def no_plugins(name: str, *args: object):
        if name.startswith("hydra_plugins"):
            raise ModuleNotFoundError("No module named 'hydra_plugins'")
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_plugins)
    check_flags(["trainer.max_epochs=2", "model=mlp"])
    with pytest.raises(ConfigError, match=r"^hydra/launcher=slurm needs Hydra's submitit launcher"):
        check_flags(["hydra/launcher=slurm"])


@pytest.mark.parametrize(
    ("code", "meaning"),
    [(137, "killed (SIGKILL), most often by the out-of-memory killer"), (134, "killed by signal 6 (ABRT)")],
)
def test_a_killed_program_s_exit_code_says_what_killed_it(code: int, meaning: str) -> None:
    """A process the kernel killed prints nothing itself: make's line is all the user sees."""
    proc = subprocess.run(
        ["bash", "scripts/exit_code.sh", str(code), "python -m lightspeed.train"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == code
    assert proc.stderr.startswith(f"make: python -m lightspeed.train exited with {code}: {meaning}"), (
        proc.stderr
    )


@pytest.mark.slow  # two runs of the command line
def test_a_rerun_refused_before_its_fit_leaves_the_runs_files_as_they_were(tmp_path: Path) -> None:
    """A setting refused as the run is planned (a constructor's annotation) puts back the `.hydra/` files
    that its start wrote over in the folder of the run it would have continued."""
    args = ["debug=fdr", "run_name=k", "test_after_fit=false", f"paths.log_dir={tmp_path}"]
    assert run_module("lightspeed.train", *args, cwd=tmp_path).returncode == 0
    files = sorted((tmp_path / "train" / "runs" / "k" / ".hydra").iterdir())
    before = [p.read_bytes() for p in files]
    proc = run_module("lightspeed.train", *args, "trainer.enable_model_summary=abc", cwd=tmp_path)
    assert proc.returncode == 2
    assert one_line_error(proc).startswith("error: trainer.enable_model_summary=abc is invalid")
    assert [p.read_bytes() for p in files] == before


def test_a_refused_start_removes_a_lock_only_where_it_took_it(tmp_path: Path) -> None:
    """Two starts of one new run: the one refused because the other holds the lock leaves that lock (and the
    other's run.json) alone; a start that took the lock itself and was refused removes its folder."""
    from lightspeed.resilience import identity, lock
    from lightspeed.run import compose_errors, entry

    folder = tmp_path / "run"
    (folder / ".hydra").mkdir(parents=True)
    for name in (lock.LOCK_FILE, identity.RECORD_FILE):
        (folder / name).write_text("{}")
    entry.NEW_FOLDERS.add(folder.resolve())
    compose_errors.undo_refused_start(folder, "train")
    assert (folder / lock.LOCK_FILE).is_file() and (folder / identity.RECORD_FILE).is_file()
    lock.TAKEN.add(folder.resolve())
    compose_errors.undo_refused_start(folder, "train")
    assert not folder.exists()
