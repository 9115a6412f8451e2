"""`make tune`: the decisions with figures and a clock the tests control (a slower or merely equal knob is
never chosen; the budget ends the tuning; a rerun measures only what it had not; a faster numerics knob is
kept only with the baseline's results), and a real tune on the CPU, killed and rerun, in a copy of conf/."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY, module_env, run_module
from lightspeed import tune

REPO = Path(__file__).resolve().parent.parent
SETTINGS = {key: default for key, (default, _, _) in tune.SETTINGS.items()}
CPU = {"cuda": False, "device": "cpu", "cpus": 4, "batch": 32, "accumulate": 1, "precision": "32-true"}


class Machine:
    """A fake machine: each run's samples/s from the overrides it was given (the last value of a key wins,
    as on the command line), a fixed cost in seconds on a clock the test reads, and every call counted."""

    def __init__(
        self, rates: dict[str, list[float]], seconds: float = 10.0, metric: dict | None = None, **model: bool
    ):
        self.rates, self.seconds, self.now, self.calls, self.timeouts = rates, seconds, 0.0, [], []
        self.metrics, self.model = metric or {}, model  # `model`: what speed.json says of the model

    def clock(self) -> float:
        return self.now

    def measure(
        self, overrides: list[str], steps: int, warmup: str, folder: Path, timeout: float | None = None
    ) -> dict:
        self.calls.append((*overrides, folder.name))
        self.timeouts.append(timeout)
        if timeout is not None and self.seconds > timeout:  # stopped at its deadline, as run_process does
            self.now += timeout
            return {"error": "error: stopped at its deadline", "exit": 3, "timed_out": True}
        self.now += self.seconds
        repeat = int(folder.name.rsplit("-", 1)[1])
        for key in reversed(overrides):
            if key in self.rates:
                values = self.rates[key]
                return {"samples_per_s": values[repeat % len(values)], "peak_rss_gib": 1.0, **self.model}
        return {"samples_per_s": [100.0, 104.0, 96.0][repeat % 3], "peak_rss_gib": 1.0, **self.model}

    def check(self, overrides: list[str], folder: Path, timeout: float | None = None) -> dict:
        self.now += self.seconds
        value = next((self.metrics[o] for o in reversed(overrides) if o in self.metrics), 0.95)
        return {"metric": "val/acc", "mode": "max", "value": value}


def tuner(machine: Machine, out: Path, **settings) -> tune.Tuner:
    return tune.Tuner(
        [], {**SETTINGS, **settings}, out, measure=machine.measure, check=machine.check, clock=machine.clock
    )


def rows(t: tune.Tuner, knob: str) -> dict[str, tune.Choice]:
    return {c.label: c for c in t.rows if c.knob == knob}


@pytest.mark.parametrize("has_4d_weights", [False, True])
def test_channels_last_is_measured_only_for_a_model_with_4d_weights(
    tmp_path: Path, has_4d_weights: bool
) -> None:
    """It reorders 4-D tensors only: for a GPT or an MLP it changes nothing, and measuring it can only let a
    noise win through (it did, on sort_gpt). The runs' speed.json says whether the model has any."""
    machine = Machine({"accel.channels_last=true": [500.0]}, has_4d_weights=has_4d_weights)  # would win
    t = tuner(machine, tmp_path)
    best = t.tune(tune.knobs(CPU, numerics=False))
    assert any("accel.channels_last=true" in call for call in machine.calls) is has_4d_weights
    assert ("accel.channels_last=true" in best) is has_4d_weights
    if not has_4d_weights:
        (row,) = rows(t, "channels_last").values()
        assert row.label == "off" and not row.runs and row.chosen
        assert row.reason == "not measured: the model has no 4-D weights, the only tensors it reorders"
        assert (
            "| channels_last | off | - | - (0x) | - | yes | not measured: the model has no 4-D"
            in "\n".join(tune.table_lines(t.rows))
        )


def test_only_a_knob_faster_by_more_than_the_spread_is_chosen(tmp_path: Path) -> None:
    machine = Machine(
        {
            "data.on_device=true": [150.0, 152.0, 149.0],  # faster beyond the spread: chosen
            "data.num_workers=1": [60.0, 62.0, 61.0],  # not reached: on_device=true ends the loader knobs
            "accel.threads=2": [103.0, 99.0, 160.0],  # faster median, spread overlapping: not chosen
            "accel.threads=1": [150.0, 151.0, 140.0],  # ... against the incumbent (on device) at ~150
            "accel.channels_last=true": [90.0, 91.0, 89.0],  # slower: not chosen
            "accel.optimizer_impl=fused": [170.0, 171.0, 172.0],
            "accel.optimizer_impl=foreach": [165.0, 166.0, 164.0],  # beats the incumbent, fused is faster
            "accel.compile=true": [0.0],  # replaced by a failure below
        }
    )
    real = machine.measure

    def measure(overrides, steps, warmup, folder, timeout):
        if overrides[-1] == "accel.compile=true":
            machine.now += machine.seconds
            return {"error": "error: accel.compile=true: inductor needs a C++ compiler"}
        return real(overrides, steps, warmup, folder, timeout)

    settings = {**SETTINGS, "budget_s": 10_000}
    t = tune.Tuner([], settings, tmp_path, measure=measure, check=machine.check, clock=machine.clock)
    best = t.tune(tune.knobs(CPU, numerics=False))
    assert "data.on_device=true" in best and "accel.optimizer_impl=fused" in best
    assert (
        "accel.threads=auto" in best and "accel.channels_last=false" in best and "accel.compile=false" in best
    )
    assert not rows(t, "loader workers")  # its condition (data off the device) no longer holds
    threads, layout = rows(t, "CPU threads"), rows(t, "channels_last")
    assert threads["auto"].chosen and threads["auto"].reason.startswith("kept: nothing beat it")
    assert layout["on"].reason.startswith("slower than off")
    kernels = rows(t, "optimizer kernels")
    assert kernels["fused"].chosen and kernels["fused"].reason.startswith(
        "beats torch by more than the spread"
    )
    assert kernels["foreach"].reason == "beats torch, but fused is faster"
    assert (
        rows(t, "torch.compile")["on"].reason
        == "failed: error: accel.compile=true: inductor needs a C++ compiler"
    )


def test_settings_that_do_not_train_stop_the_tune_at_the_first_run_with_its_line(tmp_path: Path) -> None:
    calls = []

    def measure(overrides, steps, warmup, folder, timeout):
        calls.append(overrides)
        return {"error": "error: data.batch_size=-3 is invalid: use an integer >= 1", "exit": 2}

    t = tune.Tuner(["data.batch_size=-3"], SETTINGS, tmp_path, measure=measure)
    with pytest.raises(tune.BaselineFailed) as failed:
        t.tune(tune.knobs(CPU, numerics=False))
    assert len(calls) == 1 and failed.value.args[0]["exit"] == 2


def test_equal_within_the_spread_keeps_the_safer_value() -> None:
    safe = tune.Choice("k", "off", [], runs=[{"samples_per_s": v} for v in (100.0, 110.0, 90.0)])
    other = tune.Choice("k", "on", [], runs=[{"samples_per_s": v} for v in (105.0, 112.0, 109.0)])
    assert tune.decide(safe, [safe, other]) is safe
    assert other.reason == "within the spread of off (105-112 against 90-110)"
    other.runs = [{"samples_per_s": v} for v in (111.0, 112.0, 113.0)]
    assert tune.decide(safe, [safe, other]) is other


def test_the_budget_ends_the_tuning_and_says_what_it_did_not_measure(tmp_path: Path) -> None:
    machine = Machine({}, seconds=10.0)
    t = tuner(machine, tmp_path, budget_s=130, repeats=2)
    best = t.tune(tune.knobs(CPU, numerics=False))
    # 130 s, less the final comparison's 2 x 2 x 10 s: 9 runs fit. On device: 2 choices x 2; workers: the
    # incumbent read back, 2 x 2 more; then one of the threads' before the budget ends
    assert len(machine.calls) == 9 and machine.now == 90
    assert [c.knob for c in t.rows] == ["data on device"] * 2 + ["loader workers"] * 3
    assert t.unmeasured == ["CPU threads", "channels_last", "matmul precision", "optimizer kernels",
                            "torch.compile"]  # fmt: skip
    assert "accel.compile=false" in best  # every knob not measured keeps its safe value


def test_a_rerun_measures_only_what_it_had_not(tmp_path: Path) -> None:
    machine = Machine({"data.on_device=true": [200.0, 201.0, 202.0]})
    first = tuner(machine, tmp_path, budget_s=200)
    first.tune(tune.knobs(CPU, numerics=False))
    done = len(machine.calls)
    assert first.unmeasured and done > 0
    again = tuner(machine, tmp_path, budget_s=10_000)
    best = again.tune(tune.knobs(CPU, numerics=False))
    assert not again.unmeasured and "data.on_device=true" in best
    remeasured = [c for c in machine.calls[done:] if c in machine.calls[:done]]
    assert remeasured == []  # every run the first tune finished was read back, none run twice
    machine.calls.clear()
    tuner(machine, tmp_path, budget_s=10_000).tune(tune.knobs(CPU, numerics=False))
    assert machine.calls == []


def test_a_failed_measurement_is_not_kept_a_rerun_measures_it_again(tmp_path: Path) -> None:
    """A train module missing, then installed: the rerun measures, instead of failing with the old line."""

    def missing(overrides, steps, warmup, folder, timeout):
        return {"error": "error: No module named 'mytrain'", "exit": 1}

    with pytest.raises(tune.BaselineFailed):
        tune.Tuner([], SETTINGS, tmp_path, measure=missing).tune(tune.knobs(CPU, numerics=False))
    machine = Machine({})
    best = tuner(machine, tmp_path, budget_s=10_000).tune(tune.knobs(CPU, numerics=False))
    assert machine.calls and "data.on_device=false" in best


HOSTILE = {
    "empty": "{}",
    "a string rate": '{"samples_per_s": "fast"}',
    "a rate of 1e9": '{"samples_per_s": 1e9}',
    "a failure saying exit 0": '{"error": "error: all is well", "exit": 0}',
    "sealed, then edited": None,  # the file tune wrote, its rate changed
    "torn": '{"seal": "',
    "a list": "[1, 2]",
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_cached_result_not_as_tune_wrote_it_is_measured_again(tmp_path: Path, case: str) -> None:
    machine = Machine({})
    tuner(machine, tmp_path, budget_s=10_000).tune(tune.knobs(CPU, numerics=False))
    files = sorted(tmp_path.glob("runs/*.json"))
    for f in files:
        text = f.read_text()
        f.write_text(HOSTILE[case] or text.replace('"samples_per_s": ', '"samples_per_s": 9'))
    machine.calls.clear()
    again = tuner(machine, tmp_path, budget_s=10_000)
    again.tune(tune.knobs(CPU, numerics=False))
    assert len(machine.calls) == len(files)  # each measured again, and nothing believed
    assert max(r for c in again.rows for r in c.rates) == 104.0


def test_each_measurement_has_a_deadline_within_the_budget(tmp_path: Path) -> None:
    """tune.steps=10**12 with tune.budget_s=30: the first measurement is stopped at 30 s, and the tune ends
    with nothing measured (main says so in one line); later ones get what the budget leaves."""
    never = Machine({}, seconds=10**9)
    t = tuner(never, tmp_path / "never", budget_s=30)
    t.tune(tune.knobs(CPU, numerics=False))
    assert never.timeouts == [30] and never.now == 30 and not t.rows and not t.durations
    machine = Machine({}, seconds=10.0)
    tuner(machine, tmp_path / "some", budget_s=130, repeats=2).tune(tune.knobs(CPU, numerics=False))
    assert machine.timeouts[0] == 130 and all(t is not None and t <= 130 - 40 for t in machine.timeouts[1:])


def test_a_run_past_its_deadline_is_stopped_with_the_processes_it_started(tmp_path: Path) -> None:
    """A hung run whose child holds its output open: both are killed at the deadline, not waited for."""
    from lightspeed.speed import measure as measuring

    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"  # noqa: E501
    began = time.monotonic()
    result = measuring.run_process([sys.executable, "-c", code], tmp_path / "hung", timeout=1)
    assert result["timed_out"] and time.monotonic() - began < 15
    assert (tmp_path / "hung.log").exists()


@pytest.mark.parametrize(("bf16_acc", "kept"), [(0.949, True), (0.90, False)])
def test_a_faster_numerics_knob_is_kept_only_with_the_baseline_s_results(
    tmp_path: Path, bf16_acc: float, kept: bool
) -> None:
    machine = Machine(
        {"trainer.precision=bf16-mixed": [300.0, 301.0, 302.0]},
        metric={"trainer.precision=32-true": 0.95, "trainer.precision=bf16-mixed": bf16_acc},
    )
    t = tuner(machine, tmp_path, numerics=True, budget_s=10_000, tolerance=0.01)
    best = t.tune(tune.knobs(CPU, numerics=True))
    bf16 = rows(t, "precision")["bf16-mixed"]
    assert ("trainer.precision=bf16-mixed" in best) is kept and bf16.chosen is kept
    said = f"val/acc {bf16_acc:.4g} against 0.95, 1.0% allowed"
    assert bf16.reason.endswith(f"results kept ({said})" if kept else f"its results are worse ({said})")
    batch = rows(t, "micro-batch x accumulation")
    assert list(batch) == ["32x1", "16x2", "8x4", "4x8"]  # the effective batch kept: 32


@pytest.mark.slow  # two training processes (~20 s)
def test_the_results_check_reads_the_monitored_metric_of_a_real_short_training(tmp_path: Path) -> None:
    """check_metric trains in a process of its own and reads the monitor and its best value from
    summary.json: val/mse, minimised, for the diabetes MLP."""
    folder = tmp_path / "check"
    found = tune.check_metric(["experiment=diabetes_mlp", "trainer.max_epochs=2", *TINY], folder)
    summary = json.loads((folder / "summary.json").read_text())
    assert found == {"metric": "val/mse", "mode": "min", "value": summary["metrics"]["val/mse@best"]}
    bad = tune.check_metric(["experiment=diabetes_mlp", "trainer.max_epochs=-5"], tmp_path / "bad")
    assert bad["error"].startswith("error: trainer.max_epochs=-5")


@pytest.mark.parametrize(
    ("arg", "said"),
    [
        ("tune.budget_s=-1", "tune.budget_s='-1' is invalid: use seconds > 0"),
        ("tune.budget_s=.inf", "tune.budget_s='.inf' is invalid: use seconds > 0"),
        ("--cfg", "--cfg: make tune takes overrides and tune.<key>=<value>, no flags"),
        ("tune.repeats=1", "tune.repeats='1' is invalid: use an integer >= 2"),
        ("tune.numerics=yes please", "tune.numerics='yes please' is invalid: use true or false"),
        (
            "tune.budget=60",
            "tune.budget=60: not a setting of make tune; use tune.<key>=<value> with a key of",
        ),
    ],
)
def test_a_bad_tune_setting_is_one_line_and_exit_2(arg: str, said: str, capsys) -> None:
    assert tune.main([arg]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {said}") and err.count("\n") == 1


def project(tmp_path: Path) -> Path:
    """A copy of conf/ to tune in: tuned.yaml is written there, never into the repository's."""
    shutil.copytree(REPO / "conf", tmp_path / "conf", ignore=shutil.ignore_patterns("tuned.yaml"))
    return tmp_path


@pytest.mark.slow
def test_a_real_tune_on_the_cpu_killed_and_rerun_writes_accel_tuned_that_trains(tmp_path: Path) -> None:
    """The CPU's knobs (on-device data, workers, threads, matmul precision, optimizer kernels, compile)
    measured for real on the diabetes MLP, channels_last not (its speed.json says it has no 4-D weights);
    killed after its first results, rerun: the results already there are read back, not run again; then
    `make train accel=tuned` composes and trains."""
    root = project(tmp_path)
    args = ["experiment=diabetes_mlp", "tune.steps=10", "tune.repeats=2", "tune.budget_s=1200"]
    cmd = [sys.executable, "-m", "lightspeed.tune", *args]
    proc = subprocess.Popen(
        cmd, cwd=root, env=module_env(), start_new_session=True, stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while len(list(root.glob("logs/tune/*/runs/*.json"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {p: p.read_bytes() for p in root.glob("logs/tune/*/runs/*.json")}
    assert len(before) >= 3 and not (root / "conf" / "accel" / "tuned.yaml").exists()

    done = run_module("lightspeed.tune", *args, cwd=root, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(p.read_bytes() == text for p, text in before.items())  # read back, not measured again
    logs = list(root.glob("logs/tune/*/runs/*.log"))
    assert len(logs) == len(list(root.glob("logs/tune/*/runs/*.json")))  # one process per result, no more
    (folder,) = root.glob("logs/tune/experiment_diabetes_mlp-*")
    record = json.loads((folder / "tune.json").read_text())
    measured = {r["knob"] for r in record["rows"] if any("samples_per_s" in run for run in r["runs"])}
    assert {"data on device", "CPU threads", "matmul precision", "optimizer kernels", "torch.compile",
            "final"} <= measured, record["rows"]  # fmt: skip
    (layout,) = [r for r in record["rows"] if r["knob"] == "channels_last"]
    assert not layout["runs"] and layout["reason"].startswith("not measured: the model has no 4-D weights")
    assert not record["unmeasured"]
    tuned = (root / "conf" / "accel" / "tuned.yaml").read_text()
    assert tuned.startswith("# @package _global_\n# `make tune` ") and "| knob | value | samples/s" in tuned
    assert "accel=tuned against accel=default: " in tuned and "\ndefaults:\n  - default\n" in tuned
    assert "Lightspeed: make tune" in done.stdout and "make train accel=tuned" in done.stdout
    assert (folder / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    run = run_module("lightspeed.train", "experiment=diabetes_mlp", "accel=tuned", "debug=fdr", cwd=root)
    assert run.returncode == 0, run.stderr[-2000:]


def test_a_measured_run_and_a_results_check_run_the_train_module_lightspeed_train_names(
    tmp_path: Path, monkeypatch
) -> None:
    """A project's Makefile sets LIGHTSPEED_TRAIN=<name>.train: its train.py (its callbacks, its steps) is
    what is measured and checked, not the engine's. Here a module of the test's that says who ran it."""
    from lightspeed.speed import measure as measuring

    (tmp_path / "mytrain.py").write_text(
        "import sys\n"
        "print('error: mytrain ran with', ' '.join(sys.argv[1:3]), file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("LIGHTSPEED_TRAIN", "mytrain")
    said = {"error": "error: mytrain ran with model=mlp accel.threads=1", "exit": 3}
    assert measuring.measure(["model=mlp", "accel.threads=1"], 10, "auto", tmp_path / "m") == said
    assert tune.check_metric(["model=mlp", "accel.threads=1"], tmp_path / "c") == said
    monkeypatch.delenv("LIGHTSPEED_TRAIN")
    assert measuring.train_command() == [sys.executable, "-m", "lightspeed.train"]


def test_help_is_the_usage_not_a_run(capsys) -> None:
    assert tune.main(["--help"]) == 0 and "lightspeed tune [tune.budget_s=300]" in capsys.readouterr().out


FAKE_TRAIN = """
import json, os, sys
from pathlib import Path
args = dict(a.lstrip("+").split("=", 1) for a in sys.argv[1:] if "=" in a)
run = Path(args["hydra.run.dir"])
run.mkdir(parents=True, exist_ok=True)
fast = args.get("data.on_device") == "true" or args.get("accel") == "tuned"
speed = {"samples_per_s": 200.0 if fast else 100.0, "peak_rss_gib": 1.0, "has_4d_weights": False}
(run / "speed.json").write_text(os.environ.get("FAKE_SPEED") or json.dumps(speed))
(run / "summary.json").write_text(json.dumps({"metrics": {"train/loss": 0.5}}))
with open(Path(os.environ["FAKE_RUNS"]), "a") as runs:
    runs.write(run.name + "\\n")
"""


class Project:
    """A project to tune in, without training: a copy of conf/, and a train module that writes a speed.json
    in a blink (200 samples/s with the data on the device, else 100) and counts its runs."""

    def __init__(self, root: Path, monkeypatch) -> None:
        self.root, self.runs = root, root / "runs.txt"
        shutil.copytree(REPO / "conf", root / "conf", ignore=shutil.ignore_patterns("tuned.yaml"))
        (root / "faketrain.py").write_text(FAKE_TRAIN)
        monkeypatch.setenv("PYTHONPATH", f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        monkeypatch.setenv("LIGHTSPEED_TRAIN", "faketrain")
        monkeypatch.setenv("FAKE_RUNS", str(self.runs))
        monkeypatch.setattr(tune, "CONF_DIR", root / "conf")
        monkeypatch.setattr(tune, "write_chart", lambda *args: None)  # matplotlib: seconds to import
        monkeypatch.chdir(root)
        self.tuned = root / "conf" / "accel" / "tuned.yaml"

    def tune(self, *args: str) -> int:
        self.runs.write_text("")
        return tune.main(["tune.repeats=2", "tune.steps=10", *args])

    @property
    def measured(self) -> int:
        return len(self.runs.read_text().splitlines())


@pytest.fixture
def fake(tmp_path: Path, monkeypatch) -> Project:
    return Project(tmp_path, monkeypatch)


def test_a_rerun_with_its_results_cached_measures_nothing_and_writes_the_same_file(
    fake: Project, monkeypatch
) -> None:
    """The same tune again, a day later: every result read back, tuned.yaml unchanged to the byte."""
    assert fake.tune() == 0 and fake.measured > 0
    first = fake.tuned.read_bytes()
    assert b"data:\n  on_device: true" in first
    monkeypatch.setattr(tune.time, "strftime", lambda *args: "2099-01-01")
    assert fake.tune() == 0 and fake.measured == 0
    assert fake.tuned.read_bytes() == first


def test_tune_writes_under_paths_log_dir(fake: Project, tmp_path: Path) -> None:
    """Where `make train` with the same overrides writes: paths.log_dir (./logs unless set)."""
    assert fake.tune(f"paths.log_dir={tmp_path / 'elsewhere'}") == 0
    assert list((tmp_path / "elsewhere" / "tune").glob("*/tune.json")) and not (tmp_path / "logs").exists()


def test_a_measurement_does_not_outlive_a_tune_ended_by_sigterm(tmp_path: Path) -> None:
    """The measured run is in a process group of its own (killed whole at its deadline): SIGTERM to tune,
    as a job's time limit sends, ends it too."""
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    parent = (
        "import sys; from pathlib import Path; from lightspeed.speed.measure import run_process; "
        f"run_process([sys.executable, '-c', {child!r}], Path({str(tmp_path / 'run')!r}))"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    pid = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("the measured process outlived tune")
