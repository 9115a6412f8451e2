"""`make tune` / `lightspeed tune`: the fastest settings for this model on this machine, measured, written as
an accel option (conf/accel/tuned.yaml) that `make train accel=tuned` uses.

    lightspeed tune [tune.budget_s=300] [tune.numerics=false] [tune.repeats=3] [tune.steps=100]
                    [tune.tolerance=0.01] [tune.check_epochs=3] [overrides...]

Every measurement is a training process of its own in steady state (`speed.measure`: the bench's warm-up
rule, then `tune.steps` timed steps), `tune.repeats` times, in rounds. The knobs are tried one at a time on
top of the best so far, each from its safe value (`knobs`); an alternative is chosen only when its slowest
repeat beats the incumbent's fastest (by more than the spread), else the safer value stays. Knobs that
change the arithmetic (precision; the micro-batch, with accumulation keeping the effective batch) are tried
only with `tune.numerics=true`, and kept only if a short training (`tune.check_epochs`) with them reaches
the baseline's monitored validation metric within `tune.tolerance` (relative). At the end the tuned option
is measured against `accel=default` side by side; when it is not faster, tuned.yaml keeps default.

Everything lands in <paths.log_dir>/tune/<overrides>-<hash>/ (logs/tune/...): each measurement's folder,
log and result, tune.json, tune.md, tune.png. The same command again reuses every result already there, so a
killed tune measures only what it had not, and one that finished measures nothing and writes the same
tuned.yaml. A failure is not kept (the rerun tries it again); each measurement ends at its deadline, within
tune.budget_s. docs/performance.md says what it measures and why.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from omegaconf import OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lightspeed import CONF_DIR
from lightspeed.core import device as device_facts
from lightspeed.core.boundary import bounded
from lightspeed.core.files import read_json, write_text_atomically
from lightspeed.core.schema import is_int, is_number
from lightspeed.report import figures
from lightspeed.run import tuned_file
from lightspeed.speed import measure as measuring

#: tune.<key>: (default, check, what the check takes)
SETTINGS: dict[str, tuple[Any, Callable[[Any], bool], str]] = {
    "budget_s": (300, lambda v: is_number(v) and 0 < v <= 7 * 86400, "seconds > 0, at most a week (604800)"),
    "numerics": (False, lambda v: isinstance(v, bool), "true or false"),
    "repeats": (3, lambda v: is_int(v) and v >= 2, "an integer >= 2"),
    "steps": (100, lambda v: is_int(v) and v >= 10, "an integer >= 10"),
    "tolerance": (0.01, lambda v: is_number(v) and 0 <= v < 1, "0 <= x < 1"),
    "check_epochs": (3, lambda v: is_int(v) and v >= 1, "an integer >= 1"),
}
#: What a numerics check trains with besides the user's settings: nothing it need not write.
CHECK_RUN = ["logger=none", "curves=false", "test_after_fit=false", "++callbacks.rich_progress_bar=null"]
TUNED = "tuned"  # the accel option's name: conf/accel/tuned.yaml
Choices = tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class Knob:
    """One setting and its choices, the safe one first: (label, the overrides that set it)."""

    name: str
    choices: Choices
    numerics: bool = False
    when: tuple[str, tuple[str, ...]] | None = None  # tried only when that knob ended on one of these labels
    needs: tuple[str, str] | None = None  # (a key of the runs' speed.json, why): tried only where it is true

    def applies(self, chosen: dict[str, str]) -> bool:
        return self.when is None or chosen.get(self.when[0]) in self.when[1]


def _on_off(*overrides: str) -> Choices:
    """off, then on, for boolean keys."""
    return (("off", tuple(f"{o}=false" for o in overrides)), ("on", tuple(f"{o}=true" for o in overrides)))


def _values(key: str, values: tuple[Any, ...]) -> Choices:
    return tuple((str(v), (f"{key}={v}",)) for v in values)


# radon C: which knobs a CUDA device and a CPU each have, in one list to read
def knobs(facts: dict[str, Any], numerics: bool) -> list[Knob]:
    """The knobs that matter on this device, in the order they are tried: the data path, then the math."""
    cuda, cpus = facts["cuda"], facts["cpus"]
    workers = sorted(
        {n for n in (1, 2, 4, 8) if n < cpus} | ({min(8, cpus - 1)} if cuda and cpus > 1 else set())
    )
    loader: Choices = (
        ("0", ("data.num_workers=0", "data.persistent_workers=false")),
        *((str(n), (f"data.num_workers={n}", "data.persistent_workers=true")) for n in workers),
    )
    found = [
        Knob("data on device", _on_off("data.on_device")),
        Knob("loader workers", loader, when=("data on device", ("off",))),
        Knob(
            "prefetch",
            _values("data.prefetch_factor", (2, 4, 8)),
            when=("loader workers", tuple(map(str, workers))),
        ),
    ]
    if cuda:
        pinned = _on_off("data.pin_memory", "data.non_blocking")
        found += [Knob("pinned memory", pinned, when=("data on device", ("off",)))]
        found += [Knob("cuDNN autotuning", _on_off("trainer.benchmark"))]
    else:
        fewer = sorted({n for n in (1, cpus // 2) if 1 <= n < cpus}, reverse=True)
        found += [Knob("CPU threads", _values("accel.threads", ("auto", *fewer)))]
    found += [
        Knob(
            "channels_last",
            _on_off("accel.channels_last"),
            needs=("has_4d_weights", "the model has no 4-D weights, the only tensors it reorders"),
        ),
        Knob("matmul precision", _values("accel.matmul_precision", ("highest", "high"))),
        Knob("optimizer kernels", _values("accel.optimizer_impl", ("torch", "foreach", "fused"))),
        Knob("torch.compile", _on_off("accel.compile")),
    ]
    if cuda:
        modes = ("default", "reduce-overhead", "max-autotune")
        found += [Knob("compile mode", _values("accel.compile_mode", modes), when=("torch.compile", ("on",)))]
    return found + (_numerics(facts) if numerics else [])


def _numerics(facts: dict[str, Any]) -> list[Knob]:
    """Precision, and the micro-batch with accumulation keeping the effective batch: the user's first."""
    precisions = (facts["precision"], "bf16-mixed", *(("16-mixed",) if facts["cuda"] else ()))
    batch, accumulate = facts["batch"], facts["accumulate"]
    effective = batch * accumulate
    splits = [
        (effective // a, a)
        for a in (1, 2, 4, 8)
        if effective % a == 0 and (effective // a, a) != (batch, accumulate)
    ]
    return [
        Knob("precision", _values("trainer.precision", tuple(dict.fromkeys(precisions))), numerics=True),
        Knob(
            "micro-batch x accumulation",
            tuple(
                (f"{b}x{a}", (f"data.batch_size={b}", f"trainer.accumulate_grad_batches={a}"))
                for b, a in [(batch, accumulate), *splits]
            ),
            numerics=True,
        ),
    ]


@dataclass
class Choice:
    """One choice of one knob as measured: its runs' samples/s and what was decided."""

    knob: str
    label: str
    overrides: list[str]
    runs: list[dict] = field(default_factory=list)
    chosen: bool = False
    reason: str = ""

    @property
    def error(self) -> str | None:
        return next((r["error"] for r in self.runs if "error" in r), None)

    @property
    def rates(self) -> list[float]:
        return sorted(r["samples_per_s"] for r in self.runs if "error" not in r)

    @property
    def median(self) -> float:
        rates = self.rates
        return rates[(len(rates) - 1) // 2] if rates else 0.0

    @property
    def spread(self) -> str:
        rates = self.rates
        return f"{rates[0]:,.0f}-{rates[-1]:,.0f}" if rates else "-"

    @property
    def peak_gib(self) -> float | None:
        peaks = [r.get("peak_allocated_gib") or r.get("peak_rss_gib") for r in self.runs if "error" not in r]
        return max((p for p in peaks if p is not None), default=None)


# radon C: one reason per way a choice can end, each said to the user
def decide(incumbent: Choice, choices: list[Choice]) -> Choice:
    """The fastest alternative whose slowest repeat beats the incumbent's fastest; else the incumbent (the
    safer value). Each choice says why it was or was not taken."""
    top = incumbent.rates[-1] if incumbent.rates else float("inf")
    beating = [c for c in choices if c is not incumbent and not c.error and c.rates and c.rates[0] > top]
    best = max(beating, key=lambda c: c.median, default=incumbent)
    for c in choices:
        if c.error:
            c.reason = f"failed: {c.error}"
        elif c is incumbent:
            c.reason = "kept: nothing beat it by more than the spread" if best is incumbent else ""
        elif c is best:
            c.reason = (
                f"beats {incumbent.label} by more than the spread ({c.spread} against {incumbent.spread})"
            )
        elif c in beating:
            c.reason = f"beats {incumbent.label}, but {best.label} is faster"
        elif c.median >= incumbent.median:
            c.reason = f"within the spread of {incumbent.label} ({c.spread} against {incumbent.spread})"
        else:
            c.reason = f"slower than {incumbent.label} ({c.median:,.0f} against {incumbent.median:,.0f})"
    return best


def results_verdict(incumbent: Choice, winner: Choice, base: dict, trial: dict, tolerance: float) -> Choice:
    """A faster numerics choice is kept only if its short training's metric is within tolerance of the
    incumbent's (relative to the incumbent's value, in the direction the monitor's mode says is worse)."""
    if "error" in base or "error" in trial:
        winner.reason += f"; not kept, its results check failed: {trial.get('error') or base.get('error')}"
        return incumbent
    worse = (base["value"] - trial["value"]) if base["mode"] == "max" else (trial["value"] - base["value"])
    said = f"{base['metric']} {trial['value']:.4g} against {base['value']:.4g}, {tolerance:.1%} allowed"
    if worse > tolerance * abs(base["value"]):
        winner.reason += f"; not kept, its results are worse ({said})"
        return incumbent
    winner.reason += f"; results kept ({said})"
    return winner


class BaselineFailed(Exception):
    """The user's settings do not train at all: every knob would fail the same way."""


class OutOfBudget(Exception):
    """The next measurement would end after tune.budget_s, less the final comparison's share."""


class Tuner:
    """Measures (each result cached in the tune's folder), decides and compares. `measure` and `check` run a
    training process (speed.measure.measure, check_metric); `clock` is time.monotonic, or a test's own."""

    def __init__(
        self,
        user: list[str],
        settings: dict[str, Any],
        out: Path,
        measure: Callable[[list[str], int, str, Path, float], dict] = measuring.measure,
        check: Callable[[list[str], Path, float], dict] | None = None,
        clock: Callable[[], float] = time.monotonic,
        progress: Progress | None = None,
    ) -> None:
        self.user, self.settings, self.out = user, settings, out
        self._measure, self._check = measure, check or check_metric
        self.clock, self.start, self.durations = clock, clock(), []
        self.progress = progress
        self.task = progress.add_task("tune", total=0) if progress else None
        self.rows: list[Choice] = []
        self.unmeasured: list[str] = []
        self.final = False  # the final comparison: its share of the budget was kept aside

    def _cached(self, key: list[Any], name: str, run: Callable[[Path, float], dict], valid: Callable) -> dict:
        """The result of `run(folder, deadline)`, from its file when an earlier tune got it. Only a result is
        kept, sealed with its key: a file tune did not write whole (edited, torn, of another shape) is
        measured again, and a failure is not kept, so that a rerun tries it again."""
        digest = hashlib.sha256(json.dumps([self.user, key]).encode()).hexdigest()[:10]
        folder = self.out / "runs" / f"{digest}-{name}"
        done = folder.with_suffix(".json")
        found = read_json(done, within=self.out)
        if isinstance(found, dict) and found.get("seal") == _seal(key, found.get("result")):
            return found["result"]
        began = self.clock()
        result = run(folder, self._deadline())
        if result.get("timed_out") and not self.final:
            raise OutOfBudget
        self.durations.append(self.clock() - began)
        if "error" in result or not valid(result):
            return {"exit": 3, **result, "error": result.get("error") or f"error: {folder} gave no result"}
        result = json.loads(json.dumps({**result, "measured_on": time.strftime("%Y-%m-%d")}, default=str))
        sealed = {"seal": _seal(key, result), "result": result}
        write_text_atomically(done, json.dumps(sealed, indent=2) + "\n")
        return result

    def _deadline(self) -> float:
        """The seconds the next run may take: what tune.budget_s leaves, less the final comparison's share
        (OutOfBudget where a typical run would not fit); the final comparison's own runs: at least 3 typical
        runs' time, so that a hung one ends."""
        estimate = sorted(self.durations)[len(self.durations) // 2] if self.durations else 0.0
        left = float(self.settings["budget_s"]) - (self.clock() - self.start)
        if self.final:
            return max(left, 3 * estimate)
        left -= 2 * int(self.settings["repeats"]) * estimate
        if self.durations and estimate > left:
            raise OutOfBudget
        return left

    def measure(self, choices: list[Choice], extra: str = "") -> None:
        """Each choice `tune.repeats` times, in rounds (a drifting machine affects every choice alike)."""
        steps, repeats = int(self.settings["steps"]), int(self.settings["repeats"])
        if self.progress is not None:
            self.progress.update(self.task, total=self.progress.tasks[0].total + repeats * len(choices))
        for repeat in range(repeats):
            for c in choices:
                if self.progress is not None:
                    self.progress.update(
                        self.task, description=f"{c.knob} = {c.label} ({repeat + 1}/{repeats})"
                    )
                run = lambda f, t, c=c: self._measure([*self.user, *c.overrides], steps, "auto", f, t)  # noqa: E731
                c.runs.append(self._cached([c.overrides, steps, extra], str(repeat), run, _measured))
                if c.error and not self.rows and c is choices[0] and not extra:
                    raise BaselineFailed(c.runs[-1])
                if self.progress is not None:
                    self.progress.advance(self.task)

    def metric(self, overrides: list[str]) -> dict:
        """A short training's monitored validation metric, cached as the measurements are."""
        epochs = f"trainer.max_epochs={self.settings['check_epochs']}"
        run = lambda f, t: self._check([*self.user, *overrides, epochs], f, t)  # noqa: E731
        return self._cached([overrides, epochs], "check", run, _checked)

    # radon C: the knobs' conditions and the budget's end are both decided here
    def tune(self, all_knobs: list[Knob]) -> list[str]:
        """Every knob in turn on top of the best so far; the best's overrides. self.rows: every choice."""
        state = {k.name: k.choices[0] for k in all_knobs}
        for i, knob in enumerate(all_knobs):
            if not knob.applies({name: label for name, (label, _) in state.items()}):
                continue
            if knob.needs and self.measured(knob.needs[0]) is False:  # idle for this model: noise to measure
                said = f"not measured: {knob.needs[1]}"
                self.rows.append(Choice(knob.name, knob.choices[0][0], [], chosen=True, reason=said))
                continue
            try:
                state[knob.name] = self._knob(knob, state)
            except OutOfBudget:
                chosen = {name: label for name, (label, _) in state.items()}
                self.unmeasured = [k.name for k in all_knobs[i:] if k.applies(chosen)]
                break
        return [o for _, overrides in state.values() for o in overrides]

    def measured(self, key: str) -> Any:
        """What the runs measured so far say of `key` (speed.json's), or None where none says."""
        return next((r[key] for c in self.rows for r in c.runs if key in r), None)

    def _knob(self, knob: Knob, state: dict[str, tuple[str, tuple[str, ...]]]) -> tuple[str, tuple[str, ...]]:
        def overrides(choice: tuple[str, ...]) -> list[str]:
            return [
                o for name, (_, values) in state.items() for o in (choice if name == knob.name else values)
            ]

        choices = [Choice(knob.name, label, overrides(values)) for label, values in knob.choices]
        self.measure(choices)
        incumbent = choices[0]
        winner = decide(incumbent, choices)
        if winner is not incumbent and knob.numerics:
            try:
                base, trial = self.metric(incumbent.overrides), self.metric(winner.overrides)
            except OutOfBudget:
                winner.reason += "; not kept: tune.budget_s was spent before its results could be checked"
                winner = incumbent
            else:
                winner = results_verdict(incumbent, winner, base, trial, float(self.settings["tolerance"]))
        for c in choices:
            c.chosen = c is winner
        self.rows += choices
        return next((label, values) for label, values in knob.choices if label == winner.label)

    def compare(self, best: list[str]) -> tuple[Choice, Choice]:
        """`accel=tuned` (tuned.yaml as written with `best`: they are in the results' key) against
        `accel=default`."""
        default = Choice("final", "accel=default", ["accel=default"])
        tuned = Choice("final", f"accel={TUNED}", [f"accel={TUNED}"])
        self.final = True
        self.measure([default, tuned], extra=json.dumps(best))
        return default, tuned


def _seal(key: list[Any], result: Any) -> str:
    return hashlib.sha256(json.dumps([key, result], sort_keys=True).encode()).hexdigest()


def _measured(result: dict) -> bool:
    """A measurement's shape: samples/s, a number above 0 (speed.json's is None without a timed step)."""
    rate = result.get("samples_per_s")
    return is_number(rate) and 0 < rate < float("inf")


def _checked(result: dict) -> bool:
    """A results check's shape, as check_metric returns it."""
    value = result.get("value")
    mode, metric = result.get("mode"), result.get("metric")
    return mode in ("min", "max") and isinstance(metric, str) and is_number(value) and math.isfinite(value)


def check_metric(overrides: list[str], folder: Path, timeout: float | None = None) -> dict:
    """A short training's monitored metric at its best checkpoint (summary.json), or {"error": its line}."""
    cmd = [*measuring.train_command(), *overrides, *CHECK_RUN, f"hydra.run.dir={folder}"]
    if error := measuring.run_process(cmd, folder, timeout):
        return error
    summary = read_json(folder / "summary.json", within=folder)
    if not isinstance(summary, dict):
        return {"error": f"error: the check run wrote no summary.json: see {folder}.log", "exit": 3}
    found = re.fullmatch(r"(\S+) \((min|max)\)", summary.get("monitor") or "")
    metrics = summary.get("metrics", {})
    value = metrics.get(f"{found[1]}@best", metrics.get(found[1])) if found else None
    if value is None:
        return {"error": f"the check run logged no monitored metric ({summary.get('monitor')})"}
    return {"metric": found[1], "mode": found[2], "value": float(value)}


def table_lines(rows: list[Choice]) -> list[str]:
    """The measured table in Markdown: tune.md and the header of tuned.yaml."""
    lines = [
        "| knob | value | samples/s (median) | spread | peak memory | chosen | why |",
        "|---|---|---:|---:|---:|:---:|---|",
    ]
    for c in rows:
        rate = f"{c.median:,.0f}" if c.rates else "-"
        peak = f"{c.peak_gib:.2f} GiB" if c.peak_gib is not None else "-"
        lines.append(
            f"| {c.knob} | {c.label} | {rate} | {c.spread} ({len(c.rates)}x) | {peak} "
            f"| {'yes' if c.chosen else ''} | {c.reason} |"
        )
    return lines


def tuned_yaml(overrides: list[str], header: list[str]) -> str:
    """The accel option: `default` with every tuned knob set explicitly; its header is what was measured."""
    values = OmegaConf.to_yaml(OmegaConf.from_dotlist(overrides)) if overrides else ""
    lines = [
        tuned_file.HEAD.rstrip("\n"),
        *(f"# {line}".rstrip() for line in header),
        "defaults:",
        "  - default",
        "",
    ]
    return "\n".join(lines) + values + tuned_file.END


def _title(user: list[str], rows: list[Choice], found: dict[str, Any]) -> str:
    """When its results were measured (the latest, so that a rerun that measures nothing says the same)."""
    dates = [str(r["measured_on"]) for c in rows for r in c.runs if "measured_on" in r]
    when = f"{max(dates, default='-')}, {found['device']}, torch {torch.__version__}"
    return f"`make tune` {when}, for: {' '.join(user) or '(the default)'}"


def write_chart(rows: list[Choice], title: str, path: Path) -> None:
    if (plt := figures.pyplot(path, print)) is None:
        return
    ok = [c for c in rows if c.rates][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(ok) + 1.4))
    errors = [[c.median - c.rates[0] for c in ok], [c.rates[-1] - c.median for c in ok]]
    colors = ["#3b7dd8" if c.chosen else "#999999" for c in ok]
    bars = ax.barh([f"{c.knob} = {c.label}" for c in ok], [c.median for c in ok], xerr=errors, color=colors)
    ax.bar_label(bars, fmt="{:,.0f}", padding=3, fontsize=7)
    ax.margins(x=0.18)
    ax.set_xlabel("samples/s: median, and the spread of the repeats (blue: chosen)")
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    figures.save(fig, path, dpi=110)


def parse(argv: list[str]) -> tuple[dict[str, Any], list[str]] | str:
    """The tune.<key>=<value> settings apart from the training overrides, or the one-line error."""
    settings = {key: default for key, (default, _, _) in SETTINGS.items()}
    user = []
    for arg in argv:
        if arg.startswith("-"):  # Hydra's flags would make a measured run print and end, not train
            return f"{arg}: make tune takes overrides and tune.<key>=<value>, no flags (see its --help)"
        if not arg.startswith("tune."):
            user.append(arg)
            continue
        key, eq, raw = arg.removeprefix("tune.").partition("=")
        if key not in SETTINGS or not eq:
            keys = ", ".join(SETTINGS)
            return f"{arg}: not a setting of make tune; use tune.<key>=<value> with a key of {keys}"
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        if not SETTINGS[key][1](value):
            return f"tune.{key}={raw!r} is invalid: use {SETTINGS[key][2]}"
        settings[key] = value
    return settings, user


def facts(user: list[str]) -> tuple[dict[str, Any], Path]:
    """What the knobs depend on, from the config the runs compose: the device, the batch, the precision; and
    its paths.log_dir, as `make train` with these overrides would write there (from the conf/ files too)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lightspeed.speed import accel

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=user)
    device = accel.device_type(cfg)
    precision = str(cfg.trainer.precision)
    return {
        "cuda": device == "cuda",
        "device": device_facts.name(torch.device(device)),
        "cpus": device_facts.cpu_count(),
        "batch": int(cfg.data.batch_size),
        "accumulate": int(cfg.trainer.get("accumulate_grad_batches") or 1),
        "precision": accel.auto_precision(device) if precision == "auto" else precision,
    }, Path(str(cfg.paths.log_dir))


# radon C: writes each of the five outputs from the same rows; a line each
def report(tuner: Tuner, best: list[str], found: dict[str, Any], console: Console) -> Path:
    """tuned.yaml (best, or default when best is not faster), tune.md, tune.json, tune.png and the table."""
    notes = [f"not measured (tune.budget_s spent): {', '.join(tuner.unmeasured)}"] if tuner.unmeasured else []
    target = CONF_DIR / "accel" / f"{TUNED}.yaml"
    pending = "not yet measured against accel=default: make tune was stopped before; run it again to finish"
    title = _title(tuner.user, tuner.rows, found)
    write_text_atomically(
        target, tuned_yaml(best, [title, "", *table_lines(tuner.rows), *notes, "", pending])
    )
    default, tuned = tuner.compare(best)
    faster = bool(tuned.rates and default.rates and tuned.rates[0] > default.rates[-1])
    verdict = f"accel={TUNED} against accel=default: {tuned.spread} against {default.spread} samples/s" + (
        f" ({tuned.median / default.median:.2f}x)" if default.median else ""
    )
    verdict += (
        ": faster, kept" if faster else ": not faster by more than the spread, so tuned.yaml keeps default"
    )
    tuned.chosen, default.chosen = faster, not faster
    tuned.reason = "faster than accel=default by more than the spread" if faster else "not faster: not kept"
    rows = [*tuner.rows, default, tuned]
    title = _title(tuner.user, rows, found)
    write_text_atomically(
        target, tuned_yaml(best if faster else [], [title, "", *table_lines(rows), *notes, "", verdict])
    )
    record = {"overrides": tuner.user, "settings": tuner.settings, **found, "torch": torch.__version__}
    record |= {"tuned": best if faster else [], "verdict": verdict, "unmeasured": tuner.unmeasured}
    write_text_atomically(
        tuner.out / "tune.json",
        json.dumps({**record, "rows": [vars(c) for c in rows]}, indent=2, default=str),
    )
    write_text_atomically(
        tuner.out / "tune.md",
        "\n".join([f"# Lightspeed tune\n\n{title}\n", *table_lines(rows), "", *notes, verdict, ""]),
    )
    try:
        write_chart(rows, title, tuner.out / "tune.png")
    except ImportError:
        console.print("tune: no tune.png: matplotlib is missing (pip install -e '.[bench]')")
    table = Table(title="Lightspeed: make tune", title_justify="left")
    for column in ("knob", "value", "samples/s", "spread", "peak memory", "chosen", "why"):
        table.add_column(column, overflow="fold", ratio=4 if column == "why" else None)
    for line in table_lines(rows)[2:]:
        table.add_row(*(cell.strip() for cell in line.strip("|").split("|")))
    console.print(
        table, *notes, f"tune: {verdict}", f"tune: wrote {target} (make train accel={TUNED})", sep="\n"
    )
    return target


@bounded("tune")
def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "-h" in args or "--help" in args:
        print(__doc__)
        return 0
    parsed = parse(args)
    if isinstance(parsed, str):
        print(f"error: {parsed}", file=sys.stderr)
        return 2
    try:
        return tune_here(*parsed)
    except OSError as err:  # a folder or a file where tune writes one, a full disk, a folder it may not write
        print(
            f"error: make tune cannot write {err.filename} ({err.strerror}): move it, or set paths.log_dir",
            file=sys.stderr,
        )
        return 2


def tune_here(settings: dict[str, Any], user: list[str]) -> int:
    """Tune into <paths.log_dir>/tune/<overrides>-<hash>/, and report: 0, or the exit code of its one line."""
    console = Console(width=None if sys.stdout.isatty() else 160)
    try:
        found, log_dir = facts(user)
    except Exception:  # the run itself says what is wrong with the overrides, in the engine's one line
        return _refused(user)
    # the folder is the measurements' identity: what they depend on (not the budget, repeats or checks),
    # the training measured (a project's train.py) included
    tag = hashlib.sha256(
        json.dumps(
            [user, settings["steps"], found, torch.__version__, measuring.train_command()[-1]]
        ).encode()
    ).hexdigest()[:8]
    out = log_dir / "tune" / f"{'_'.join(_words(user)) or 'default'}-{tag}"
    all_knobs = knobs(found, bool(settings["numerics"]))
    console.print(
        f"tune: {found['device']}, torch {torch.__version__}; {len(all_knobs)} knobs, each choice "
        f"{settings['repeats']} x {settings['steps']} timed steps in a process of its own; "
        f"budget {settings['budget_s']} s; {out}"
    )
    columns = (TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        tuner = Tuner(user, settings, out, progress=progress)
        try:
            best = tuner.tune(all_knobs)
        except BaselineFailed as failed:  # the run's own line, which names the setting
            print(f"error: {failed.args[0]['error'].removeprefix('error: ')}", file=sys.stderr)
            return _exit_code(failed.args[0].get("exit"))
        if not tuner.rows:
            each = f"a measurement takes {tuner.durations[0]:.0f} s" if tuner.durations else "none ended"
            print(
                f"error: tune.budget_s={settings['budget_s']} was spent before one knob was measured ({each} "
                "here): give it more, or fewer tune.steps",
                file=sys.stderr,
            )
            return 2
        if not any(c.rates for c in tuner.rows):
            print(f"error: make tune: every run failed; the first: {tuner.rows[0].error}", file=sys.stderr)
            return 3
        report(tuner, best, found, console)
    return 0


def _refused(user: list[str]) -> int:
    """What `make train` says of overrides that do not compose: a short run's own line."""
    with tempfile.TemporaryDirectory(prefix="lightspeed-tune-") as scratch:
        result = measuring.measure(user, 10, "0", Path(scratch) / "check")
    print(
        f"error: {result.get('error', 'these overrides do not compose').removeprefix('error: ')}",
        file=sys.stderr,
    )
    return 2


def _exit_code(code: Any) -> int:
    """The run's own exit code (2: a setting it refused), or 3 where it had none of its own (a signal's)."""
    return code if is_int(code) and 0 < code < 128 else 3


def _words(user: list[str]) -> list[str]:
    return [re.sub(r"[^A-Za-z0-9.-]+", "_", u).strip("_")[:40] for u in user[:3]]


if __name__ == "__main__":
    raise SystemExit(main())
