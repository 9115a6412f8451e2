"""Any task through the same machinery: a regression and a small transformer train, resume, are judged by
their own monitored metric, evaluated and predicted from their checkpoints alone, and swept; what does not
fit a task is one line before any training. Each test performs what a user tried (issue 22)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import TINY
from lightspeed.core.config import ConfigError
from lightspeed.eval import run as evaluate
from lightspeed.resilience.identity import DATA_CONFIG_KEY, MODEL_CONFIG_KEY
from lightspeed.run.restore import _repository_class, user_packages
from lightspeed.train import train

QUIET = [o for o in TINY if "batches" not in o and "max_epochs" not in o]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_a_classifier_on_regression_data_is_one_line_naming_the_models_that_fit(train_cfg, capsys) -> None:
    """`make train data=diabetes model=mlp`: float targets into a classifier were a RuntimeError traceback."""
    with pytest.raises(SystemExit) as stop:
        train(train_cfg("data=diabetes", "model=mlp"))
    assert stop.value.code == 2
    line = one_line(capsys)  # what it lacks (num_classes), what the data gives, and the models that fit
    assert line.startswith("error: model=mlp (Classifier) is built from num_classes, which data=diabetes")
    assert (
        "input_shape, num_targets, target_mean, target_std" in line
        and "(model=linear, model=regressor)" in line
    )


def test_class_labels_are_checked_against_num_classes_before_training(train_cfg, capsys) -> None:
    """A data set that declares num_classes but gives float targets, or labels out of range: one line."""
    floats = ["~data", "+data._target_=probes.DiabetesAsClasses", "model=mlp"]
    with pytest.raises(SystemExit) as stop:
        train(train_cfg(*floats, *QUIET))
    assert stop.value.code == 2
    assert one_line(capsys) == (
        "error: data: DiabetesAsClasses declares num_classes=10, but its train labels are torch.float32: "
        "give int64 class labels 0..9; for other targets (continuous, multi-hot) declare what your model is "
        "built from instead, e.g. num_targets for model=regressor"
    )
    with pytest.raises(SystemExit):
        train(train_cfg("~data", "+data._target_=probes.LabelsFromOne", *QUIET))
    assert one_line(capsys) == (
        "error: data: LabelsFromOne's train labels range over 1..10, outside 0..9 for num_classes=10: set "
        "num_classes to the number of classes, or fix the labels"
    )
    from lightspeed.data import DigitsDataModule

    class PartlyLabelled(DigitsDataModule):  # -100: cross_entropy's ignore_index, no class
        def load_arrays(self) -> tuple[torch.Tensor, torch.Tensor]:
            x, y = super().load_arrays()
            return x, y.index_fill(0, torch.arange(0, len(y), 7), -100)

    PartlyLabelled().setup("fit")  # accepted


def test_tabular_inputs_are_standardised_per_feature(train_cfg) -> None:
    """The diabetes features are in unrelated units (age in years, blood pressure in mm Hg): each is
    standardised by its own train statistics; one mean and std for all (`true`) leaves them far apart."""
    from lightspeed.run import build
    from lightspeed.speed import accel

    def train_split(normalize: str) -> torch.Tensor:
        cfg = train_cfg("data=diabetes", f"data.normalize={normalize}")
        accel.resolve(cfg)  # the loader's autos, as a run resolves them
        dm = build.datamodule(cfg)
        dm.setup("fit")
        return dm.splits["train"].tensors[0]

    x = train_split("per_feature")
    assert torch.allclose(x.mean(0), torch.zeros(10), atol=1e-5) and torch.allclose(x.std(0), torch.ones(10))
    assert train_split("true").std(0).max() / train_split("true").std(0).min() > 10


def test_val_and_test_are_standardised_by_the_train_split_and_a_constant_feature_stays_finite() -> None:
    """The train split's statistics for every split (no peek at the test set), and a feature that does not
    vary in train (a rare one-hot column) divided by 1, not by ~0."""
    from lightspeed.data.base import ArrayDataModule, sample_ids

    g = torch.Generator().manual_seed(0)
    train_x = torch.cat([torch.zeros(100, 1), 5 + 3 * torch.randn(100, 1, generator=g)], dim=1)
    test_x = torch.cat([torch.ones(20, 1), 5 + 3 * torch.randn(20, 1, generator=g)], dim=1)

    class Columns(ArrayDataModule):
        def load_arrays(self) -> dict:
            return {"train": (train_x, torch.zeros(100)), "test": (test_x, torch.zeros(20))}

    dm = Columns(normalize="per_feature", val_fraction=0.2, batch_size=8)
    dm.setup("fit")
    raw = train_x[torch.isin(sample_ids(train_x), dm.sample_ids["train"])]  # the rows the train split kept
    mean, std = raw.mean(0), raw.std(0)
    assert std[0] == 0 and len(raw) == 80
    expected = (test_x - mean) / torch.tensor([1.0, float(std[1])])
    assert torch.allclose(dm.splits["test"].tensors[0], expected, atol=1e-5)  # 1 - 0 stays 1, not ~1e8


@pytest.fixture(scope="module")
def regression(tmp_path_factory) -> dict:
    """One regression run monitored by val/r2 (its mode from the name: max, where the regressor's own
    monitor, val/mse, is min), then its best checkpoint evaluated and predicted with no option but
    predict=true."""
    from lightspeed.run.entry import compose_config

    logs = tmp_path_factory.mktemp("regression")
    overrides = ["experiment=diabetes_mlp", "trainer.max_epochs=12", "monitor.metric=val/r2", *QUIET]
    result = train(compose_config("train", overrides, logs))
    evaluated = evaluate(compose_config("eval", ["predict=true", "trainer.enable_progress_bar=false"], logs))
    return {"logs": logs, "result": result, "evaluated": evaluated}


def test_the_monitor_picks_names_and_tests_the_best_checkpoint_in_its_own_direction(regression) -> None:
    """val/mae with the classifier's mode (max) picked the worst epoch's checkpoint, silently: here the
    mode comes from the metric's name, and the best checkpoint is the epoch of the highest val/r2."""
    result, logs = regression["result"], regression["logs"]
    rows = [
        r
        for r in csv.DictReader(next((logs / "train/runs/test/csv").glob("*/metrics.csv")).open())
        if r["val/r2"]
    ]
    highest = max(rows, key=lambda r: float(r["val/r2"]))
    best = Path(result.best_checkpoint).name
    assert best == f"epoch{int(highest['epoch']):03d}-val_r2_{float(highest['val/r2']):.4f}.ckpt"
    assert result.score == pytest.approx(float(highest["val/r2"]))
    assert result.metrics["val/r2@best"] == pytest.approx(float(highest["val/r2"]))
    summary = json.loads((logs / "train/runs/test/summary.json").read_text())
    assert summary["monitor"] == "val/r2 (max)" and summary["tested"] == "best checkpoint"


def test_a_word_that_turns_a_metric_s_sense_around_leaves_its_mode_to_the_user(tmp_path: Path) -> None:
    """val/neg_mse is higher-better although it holds `mse`: its name says nothing sure, so no mode is
    taken from it (nor a mode=max refused as contradicting it); a plain name still gives its mode."""
    from lightspeed.run.entry import compose_config
    from lightspeed.run.monitor import settle

    def settled(*overrides: str):
        cfg = compose_config("train", ["experiment=diabetes_mlp", *overrides], tmp_path)
        settle(cfg)
        return cfg.monitor.mode

    for name in ("val/neg_mse", "val/mse_improvement", "val/negative_loss"):
        with pytest.raises(ConfigError, match=rf"name of monitor.metric={name} does not say whether higher"):
            settled(f"monitor.metric={name}")
        assert settled(f"monitor.metric={name}", "monitor.mode=max") == "max"
    assert settled("monitor.metric=val/mae") == "min" and settled("monitor.metric=val/r2") == "max"


def test_eval_and_predict_follow_the_checkpoint_with_no_extra_option(regression) -> None:
    """eval built the classifier whatever trained the checkpoint, and predict wrote the classifier's
    columns: here the regressor, its target and prediction in the targets' own units."""
    result, evaluated, logs = regression["result"], regression["evaluated"], regression["logs"]
    assert evaluated["test/r2"] == pytest.approx(result.metrics["test/r2"], abs=1e-6)  # the same model, data
    rows = list(csv.DictReader((logs / "eval/runs/test/predictions.csv").open()))
    assert list(rows[0]) == ["index", "target", "pred"]
    dm = result.trainer.datamodule
    targets = dm.splits["test"].tensors[1]
    assert [float(r["target"]) for r in rows] == pytest.approx(targets.tolist(), rel=1e-5)  # its own units
    pred = torch.tensor([float(r["pred"]) for r in rows])
    assert (
        evaluated["test/r2"] > 0.3 and abs(float(pred.mean() - targets.mean())) < 20
    )  # learnt, in its units
    r2 = 1 - ((pred - targets) ** 2).sum() / ((targets - targets.mean()) ** 2).sum()
    assert float(r2) == pytest.approx(evaluated["test/r2"], abs=1e-3)  # predictions undo the standardisation
    assert not (logs / "eval/runs/test/confusion_matrix.csv").exists()  # a classifier's, not a regressor's


def test_a_checkpoint_that_does_not_fit_the_data_says_what_differs(regression, eval_cfg, capsys) -> None:
    best = regression["result"].best_checkpoint
    with pytest.raises(SystemExit) as stop:
        evaluate(eval_cfg(f"ckpt_path={best}", "data=digits"))
    assert stop.value.code == 2
    assert one_line(capsys) == (
        "error: data: DigitsDataModule gives no num_targets, target_mean, target_std (its model_args()), "
        "which the checkpoint's model (Regressor) was built from: pass the data it was trained on (data=...)"
    )
    with pytest.raises(SystemExit):
        evaluate(eval_cfg(f"ckpt_path={best}", "~data", "+data._target_=probes.TwelveFeatures"))
    assert "(input_shape [10] in training, [12] here)" in capsys.readouterr().err


def test_the_mode_follows_the_metric_not_the_model_s_default(train_cfg) -> None:
    """The classifier's own monitor is val/acc (max); another metric takes its mode from its name."""
    from lightspeed.run import monitor

    for metric, mode in (("val/mae", "min"), ("val/loss", "min"), ("val/f1", "max"), ("val/acc", "max")):
        cfg = train_cfg("model=mlp", f"monitor.metric={metric}")
        monitor.settle(cfg)
        assert (cfg.monitor.mode, cfg.callbacks.early_stopping.mode) == (mode, mode), metric
    cfg = train_cfg("experiment=sort_gpt")  # a module's own default, where the config sets none
    monitor.settle(cfg)
    assert (cfg.monitor.metric, cfg.monitor.mode) == ("val/exact_match", "max")


def test_a_checkpoint_cannot_name_code_to_run_as_its_model_or_its_net(
    regression, eval_cfg, tmp_path, capsys
) -> None:
    """The module class and the net come from the checkpoint (data): only classes a yaml file of conf/
    names (Lightspeed's own helpers, which no yaml names, are refused too)."""
    stored = torch.load(regression["result"].best_checkpoint, weights_only=True)
    for where, target, said in (
        ("model", "shutil.rmtree", "crafted.ckpt names model._target_=shutil.rmtree, a class that no yaml"),
        ("model", "lightspeed.resilience.checkpoint.AtomicCheckpointIO", "names model._target_=lightspeed."),
        ("net", "lightspeed.bench.main", "names model.net._target_=lightspeed.bench.main, a class"),
        ("hparams", "this.Nothing", "names model.net._target_=this.Nothing, a class"),
        ("module_arguments", "this.Nothing", "names model.net._target_=this.Nothing, a class"),
        ("node", "os.system", "crafted.ckpt names model.net._target_=os.system, a class that no yaml"),
        # conf/ names these loggers, but for no model or data node: an MLflow store appeared outside the run
        ("net", "lightning.pytorch.loggers.CSVLogger", "names model.net._target_=lightning.pytorch.loggers."),
        (
            "data",
            "lightning.pytorch.loggers.MLFlowLogger",
            "data config names data.logger._target_=lightning.",
        ),
    ):
        crafted = {**stored, "identity": json.loads(json.dumps(stored["identity"]))}
        crafted["hyper_parameters"] = json.loads(json.dumps(stored["hyper_parameters"]))
        crafted.pop(MODEL_CONFIG_KEY)  # from before checkpoints kept the model's node: its hyperparameters
        if where == "model":
            crafted["identity"]["config"]["model"]["_target_"] = target
        elif where == "net":
            crafted["hyper_parameters"]["net"] = {"_target_": target}
        elif where == "node":
            crafted[MODEL_CONFIG_KEY] = {**stored[MODEL_CONFIG_KEY], "net": {"_target_": target}}
        elif where == "data":
            store = {"_target_": target, "tracking_uri": f"sqlite:///{tmp_path / 'store.db'}"}
            crafted[DATA_CONFIG_KEY] = {**stored[DATA_CONFIG_KEY], "logger": store}
        else:  # Lightning's older names for the hyperparameters, which it merges in when it loads
            crafted[where] = {"net": {"_target_": target}}
        torch.save(crafted, tmp_path / "crafted.ckpt")
        with pytest.raises(SystemExit) as stop:
            evaluate(eval_cfg(f"ckpt_path={tmp_path / 'crafted.ckpt'}"))
        assert stop.value.code == 2 and said in one_line(capsys)
        assert not (tmp_path / "store.db").exists()  # refused before anything was built


def test_a_mode_the_metric_s_name_contradicts_is_refused_unless_asserted(train_cfg, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        train(train_cfg("experiment=diabetes_mlp", "monitor.metric=val/mae", "monitor.mode=max"))
    assert stop.value.code == 2
    assert one_line(capsys) == (
        "error: monitor.mode=max contradicts monitor.metric=val/mae (lower is better by its name): use "
        "monitor.mode=min, or monitor.check_mode=false if max is really meant"
    )
    cfg = train_cfg(
        "experiment=diabetes_mlp", "monitor.metric=val/mae", "monitor.mode=max", "monitor.check_mode=false"
    )
    result = train(cfg, [])
    assert result.trainer.checkpoint_callback.mode == "max"  # asserted: taken as meant


@pytest.mark.slow  # over 9 s on the 2-core CI machine: make test stays within 4 minutes
def test_a_sweep_of_a_regression_shows_its_own_metrics_and_marks_the_best(tmp_path: Path) -> None:
    from conftest import run_module

    proc = run_module(
        "lightspeed.train",
        "-m",
        "experiment=diabetes_linear",
        "trainer.max_epochs=3",
        "model.optimizer.lr=0.001,0.03",
        *QUIET,
        f"paths.log_dir={tmp_path}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for summary in tmp_path.glob("train/runs/*/summary.json"):  # each run names itself as its folder is named
        assert json.loads(summary.read_text())["config"]["run_name"] == summary.parent.name
    (table,) = tmp_path.glob("train/sweeps/*.md")
    header, _, *rows = table.read_text().splitlines()[2:]
    assert header.startswith("| overrides | run | status | val/mse (min, best ckpt) | val/loss | val/mae |")
    assert "test/r2" in header and "acc" not in header
    scores = [float(row.split(" | ")[3].rstrip(" *")) for row in rows]
    assert [" *" in row.split(" | ")[3] for row in rows] == [s == min(scores) for s in scores]  # lowest mse


def test_the_sort_data_set_holds_distinct_sequences_and_their_sorted_answers() -> None:
    """Listed (4^5 sequences) or drawn (4^40): no sequence twice, so no test sequence is a training one."""
    from lightspeed.core.config import ConfigError
    from lightspeed.data.sort import IGNORE, SortDataModule

    for length in (5, 40):
        dm = SortDataModule(num_samples=600, length=length, num_digits=4, split_seed=1)
        dm.setup("fit")
        x, y = (torch.cat([dm.splits[s].tensors[i] for s in ("train", "val", "test")]) for i in (0, 1))
        prompts = x[:, :length]
        assert len(prompts.unique(dim=0)) == 600 and x.shape[1] == dm.block_size == 2 * length - 1
        assert torch.equal(y[:, length - 1 :], prompts.sort(dim=1).values)  # the answer: the prompt, sorted
        assert (y[:, : length - 1] == IGNORE).all()  # the prompt's next digits are not scored
    with pytest.raises(
        ConfigError, match=r"^data\.num_samples=2000 is more than the 1024 distinct sequences"
    ):
        SortDataModule(num_samples=2000, length=5, num_digits=4).setup("fit")


def test_the_transformer_trains_with_the_presets_and_its_flops_are_counted(train_cfg, run_dir: Path) -> None:
    """bf16 autocast, the fused optimizer and the speed report's FLOPs, on token inputs. FLOPs against the
    count of its matmuls by hand: linear layers 2·P·tokens forward, attention scores and weighted values
    4·T·d per token and layer, backward twice the forward."""
    b, t, d, layers, vocab = 16, 7, 32, 2, 3
    net = ["model.net.n_embd=32", "model.net.n_head=2", f"model.net.n_layer={layers}"]
    data = ["data=sort", "data.length=4", "data.num_digits=3", "data.num_samples=80", f"data.batch_size={b}"]
    cfg = train_cfg(
        *data, "model=gpt", *net, "trainer.precision=bf16-mixed", "accel.optimizer_impl=fused", *TINY
    )
    result = train(cfg)
    assert result.model.hparams["vocab_size"] == vocab and result.model.hparams["block_size"] == t
    assert result.trainer.optimizers[0].defaults["fused"] is True
    speed = json.loads((run_dir / "speed.json").read_text())
    linear = layers * (3 * d * d + d * d + 8 * d * d) + d * vocab
    by_hand = 3 * (2 * linear * b * t + layers * 4 * b * t * t * d)
    assert speed["flops_per_batch"] == pytest.approx(by_hand, rel=0.01) and speed["precision"] == "bf16-mixed"
    assert math.isfinite(result.metrics["test/exact_match"])


@pytest.mark.slow  # ~4 s on 2 CPU cores: make test stays within 4 minutes (test_resume.py's are make test's)
def test_the_transformer_resumes_bit_exactly(train_cfg, tmp_path: Path) -> None:
    from conftest import assert_resumes_exactly

    data = ["data=sort", "data.length=4", "data.num_digits=3", "data.num_samples=80", "data.batch_size=8"]
    small = ["model=gpt", "model.net.n_embd=16", "model.net.n_head=2", "model.net.n_layer=1"]
    assert_resumes_exactly(train_cfg, tmp_path, [*TINY, *data, *small], at=3, steps=10)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("experiment", "metric", "reached"),
    [
        ("sort_gpt", "test/exact_match", 0.99),
        ("diabetes_mlp", "test/r2", 0.55),
        ("diabetes_linear", "test/r2", 0.55),
    ],
)
def test_the_example_experiments_reach_their_stated_figures(train_cfg, experiment, metric, reached) -> None:
    """conf/experiment/*.yaml state these (data.split_seed=0 for the regressions)."""
    result = train(train_cfg(f"experiment={experiment}", *QUIET))
    assert result.metrics[metric] >= reached, result.metrics


@pytest.mark.slow
def test_make_bench_runs_on_the_transformer(tmp_path: Path) -> None:
    from conftest import run_module

    out = tmp_path / "bench"
    proc = run_module(
        "lightspeed.bench",
        "experiment=sort_gpt",
        "--steps",
        "10",
        "--warmup",
        "3",
        "--repeats",
        "1",
        "--configs",
        "hand,default,max",
        "--out",
        str(out),
        cwd=tmp_path,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in (out / "bench.md").read_text().splitlines()}
    assert {"hand", "default", "max"} <= set(rows)  # max: bf16-mixed, compiled, fused where it can
    assert "error" not in (out / "bench.md").read_text()


def test_a_net_of_the_repository_s_models_named_on_the_command_line_is_evaluated_from_its_checkpoint(
    train_cfg, eval_cfg
) -> None:
    """The checkpoint names it (data), no yaml of conf/ does: it is one of the repository's own nets, so eval
    rebuilds it with no option."""
    net = ["~model.net.name", "+model.net._target_=lightspeed.models.nets.mlp.MLP"]
    result = train(train_cfg("experiment=diabetes_mlp", *net, "trainer.max_epochs=2", *QUIET))
    tested = evaluate(eval_cfg("trainer.enable_progress_bar=false"))
    assert tested["test/mse"] == pytest.approx(result.metrics["test/mse"], rel=1e-5)


def test_a_project_s_own_models_and_data_may_be_named_by_a_checkpoint_and_nothing_else_of_it(
    tmp_path: Path, monkeypatch
) -> None:
    """A project made by new-project names its package in conf/ (acme.models...): a checkpoint may then
    name any net, module or DataModule of acme's models/ and data/, as it may name lightspeed's own; never
    another class of that package, or a package conf/ names outside models/ and data/ (torch)."""
    package = tmp_path / "acme" / "models"
    package.mkdir(parents=True)
    (tmp_path / "acme" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(
        "import os\nfrom torch import nn\nfrom torch.nn import Bilinear\n"
        "from acme.tools import Net as ToolNet\n\nclass Net(nn.Linear): ...\n\nrun = os.system\n"
    )
    (tmp_path / "acme" / "tools.py").write_text("from torch import nn\n\nclass Net(nn.Linear): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    prefixes = user_packages(frozenset({"acme.models.classifier.Classifier", "torch.nn.Linear"}))
    assert set(prefixes) == {"acme.models.", "acme.data.", "lightspeed.models.", "lightspeed.data."}
    assert _repository_class("acme.models.nets.Net", prefixes)
    assert not _repository_class("acme.models.nets.run", prefixes)  # not a class
    assert not _repository_class("acme.models.nets.os.system", prefixes)
    assert not _repository_class("acme.models.nets.Bilinear", prefixes)  # imported there, defined by torch
    assert not _repository_class("acme.models.nets.ToolNet", prefixes)  # imported there from outside models/
    assert not _repository_class("acme.tools.Net", prefixes)  # outside models/ and data/
    assert not _repository_class("torch.nn.Linear", prefixes)


def test_only_the_model_class_s_own_missing_arguments_are_said_as_the_data_s(train_cfg) -> None:
    """The module's own required parameters that neither conf/model nor the data gives are found from its
    signature before it is built, and said as the data's; a layer it builds (torch.nn.Linear missing
    out_features) fails as it is built, a setting of conf/model (the generic line)."""
    from lightspeed.data import DigitsDataModule
    from lightspeed.models.classifier import Classifier
    from lightspeed.run.build import _missing
    from lightspeed.run.build_errors import unfit

    cfg, dm = train_cfg(), DigitsDataModule()
    own = OmegaConf.to_container(cfg.model)
    assert _missing(Classifier, cfg.model) == ["num_classes", "input_shape"]  # what model_args() gives
    assert _missing(Classifier, OmegaConf.create({**own, "num_classes": 10, "input_shape": [1]})) == []
    assert _missing(Classifier, OmegaConf.create({**own, "_args_": [0, 0, 0, 0]})) == ["input_shape"]
    line = unfit(["num_classes"], cfg, dm, {"input_shape": [1, 8, 8]}, Classifier)
    assert "(Classifier) is built from num_classes, which data=digits (DigitsDataModule) does not" in line


def test_a_class_that_cannot_be_imported_is_one_line_saying_why(train_cfg, capsys) -> None:
    """A typo in a `_target_`: the module that lacks the name, or the missing module, in one line (Hydra's
    get_object printed its own ERROR lines first, and the last line of its message was the error)."""
    for target, why in (
        ("lightspeed.models.classifier.Classifer", "lightspeed.models.classifier has no Classifer"),
        ("nothere.Classifier", "no module named nothere"),
    ):
        with pytest.raises(SystemExit) as stop:
            train(train_cfg(*QUIET, f"model._target_={target}"))
        assert stop.value.code == 2
        assert one_line(capsys) == f"error: model._target_={target} cannot be imported ({why})"
