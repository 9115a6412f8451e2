"""Code written for Lightning and Hydra runs unchanged: a module in lightning-hydra-template's idiom (a net
and `_partial_` optimizer and scheduler built by Hydra, kept by `save_hyperparameters`), factories such as
`timm.create_model` as a net, and checkpoints that stay plain data and rebuild the module from its node."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml

import lht_style
from conftest import QUIET, TINY
from lightspeed.core.config import ConfigError
from lightspeed.eval import run as evaluate
from lightspeed.export import run as export
from lightspeed.resilience.identity import MODEL_CONFIG_KEY
from lightspeed.run import restore
from lightspeed.run.entry import compose_config
from lightspeed.train import train

QUIET_EVAL = ["trainer.enable_progress_bar=false", "++trainer.limit_test_batches=2"]  # as TINY tests


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> list[str]:
    """A project's conf/ with LHT-style `model=lht` and `data=lht` options: the overrides that add it."""
    conf = tmp_path / "conf"
    for group, text in (("model", lht_style.MODEL_YAML), ("data", lht_style.DATA_YAML)):
        (conf / group).mkdir(parents=True)
        (conf / group / "lht.yaml").write_text(text)
    monkeypatch.setattr(restore, "CONF_DIRS", (*restore.CONF_DIRS, conf))  # what a checkpoint may name
    return [f"paths.data_dir={tmp_path / 'data'}", f"hydra.searchpath=[pkg://lightspeed.conf,file://{conf}]"]


def compose(tmp_path: Path, task: str, *overrides: str) -> object:
    return compose_config(task, list(overrides), tmp_path / "logs")


def test_a_module_in_lht_s_idiom_trains_checkpoints_plain_data_and_eval_rebuilds_it(
    tmp_path: Path, project: list[str]
) -> None:
    result = train(compose(tmp_path, "train", *project, "model=lht", "data=lht", *TINY))
    assert isinstance(result.model.net, lht_style.DenseNet)  # built by Hydra, as LHT's module expects
    assert result.trainer.optimizers[0].__class__ is torch.optim.Adam
    checkpoints = sorted((tmp_path / "logs").rglob("*.ckpt"))
    assert len(checkpoints) >= 2
    for path in checkpoints:
        stored = torch.load(path, weights_only=True)  # the net and the partials are left out
        assert stored["hyper_parameters"] == {"compile": False}
        assert stored[MODEL_CONFIG_KEY]["net"]["_target_"] == "lht_style.DenseNet"
        assert stored["datamodule_hyper_parameters"]["batch_size"] == 128
    tested = evaluate(compose(tmp_path, "eval", *project, "predict=true", *QUIET_EVAL))
    assert tested["test/loss"] == pytest.approx(result.metrics["test/loss"])
    rows = list(csv.DictReader(next((tmp_path / "logs" / "eval").rglob("predictions.csv")).open()))
    assert len(rows) == 360 and {"target", "pred"} <= set(rows[0])  # its DataModule's test set


def test_a_checkpoint_s_model_node_names_only_what_conf_or_its_run_s_command_line_names(
    tmp_path: Path, project: list[str], capsys
) -> None:
    """Each crafted node is one line and runs nothing: a class no conf/ names (a record of the run's command
    line beside it vouching for it only in a comment), a resolver that would build one past the check, a
    `_partial_` that builds no module; a fixed data folder is refused to export too."""
    result = train(compose(tmp_path, "train", *project, "model=lht", "data=lht", *TINY))
    stored = torch.load(result.best_checkpoint, weights_only=True)
    marker, crafted = tmp_path / "ran", Path(result.best_checkpoint).parent / "x.ckpt"  # in the run's folder
    run = f"{{_target_: subprocess.getoutput, cmd: 'touch {marker}'}}"
    (Path(result.best_checkpoint).parent.parent / ".hydra").mkdir()
    (Path(result.best_checkpoint).parent.parent / ".hydra" / "overrides.yaml").write_text(
        "# model.net._target_=subprocess.getoutput\n- model=lht\n"
    )
    for net, said in (
        ({"_target_": "subprocess.getoutput", "cmd": f"touch {marker}"}, "net._target_=subprocess.getoutput"),
        (f"${{oc.create:'{run}'}}", "holds an interpolation"),
    ):
        torch.save({**stored, MODEL_CONFIG_KEY: {**stored[MODEL_CONFIG_KEY], "net": net}}, crafted)
        with pytest.raises(SystemExit) as stop:
            evaluate(compose(tmp_path, "eval", *project, f"ckpt_path={crafted}", *QUIET_EVAL))
        err = capsys.readouterr().err.strip().splitlines()
        assert stop.value.code == 2 and len(err) == 1 and said in err[0] and not marker.exists(), err
    torch.save({**stored, MODEL_CONFIG_KEY: {**stored[MODEL_CONFIG_KEY], "_partial_": True}}, crafted)
    with pytest.raises(SystemExit) as stop:
        evaluate(compose(tmp_path, "eval", *project, f"ckpt_path={crafted}", *QUIET_EVAL))
    assert stop.value.code == 2 and "not a module" in capsys.readouterr().err
    fixed = {**stored["data_config"], "data_dir": str(tmp_path / "chosen")}
    torch.save({**stored, "data_config": fixed}, crafted)
    with pytest.raises(SystemExit) as stop:
        export(compose(tmp_path, "export", *project, f"ckpt_path={crafted}"))
    assert (
        stop.value.code == 2
        and "fixed path" in capsys.readouterr().err
        and not (tmp_path / "chosen").exists()
    )


def test_a_module_that_takes_nothing_from_the_data_trains_on_data_that_offers_it(
    tmp_path: Path, project: list[str]
) -> None:
    """data=digits offers num_classes and input_shape (its model_args()): a module that takes neither is
    built without them, not refused."""
    result = train(compose(tmp_path, "train", *project, "model=lht", "data=digits", *TINY))
    assert result.trainer.global_step == 10 and "test/acc" in result.metrics


def test_a_nested_node_is_replaced_as_hydra_users_expect(tmp_path: Path, project: list[str]) -> None:
    layers = "[{_target_: torch.nn.Flatten}, {_target_: torch.nn.Linear, in_features: 64, out_features: 10}]"
    net = ["~model.net", f"+model.net={{_target_: torch.nn.Sequential, _args_: {layers}}}"]
    result = train(compose(tmp_path, "train", *project, "model=lht", "data=lht", *net, *TINY))
    assert [type(m) for m in result.model.net] == [torch.nn.Flatten, torch.nn.Linear]


@pytest.mark.parametrize("model", ["lht", pytest.param("cnn", marks=pytest.mark.slow)])  # cnn: ~5 s
def test_timm_s_factory_is_a_net(tmp_path: Path, project: list[str], model: str) -> None:
    """`timm.create_model` names a net as everywhere timm is used: built by Hydra for a module that takes
    a net (lht), or by the shipped classifier, which builds its own net from its settings (cnn)."""
    timm = pytest.importorskip("timm")
    net = "+model.net={_target_: timm.create_model, model_name: resnet10t, num_classes: 10, in_chans: 1}"
    result = train(
        compose(tmp_path, "train", *project, f"model={model}", "data=digits", "~model.net", net, *TINY)
    )
    assert isinstance(result.model.net, timm.models.ResNet)
    # no conf/ yaml names timm.create_model: its run's command line did, as Hydra records it in a real run
    record = Path(result.best_checkpoint).parent.parent / ".hydra" / "overrides.yaml"
    record.parent.mkdir()
    with pytest.raises(SystemExit) as stop:
        evaluate(compose(tmp_path, "eval", *project, *QUIET_EVAL))
    assert stop.value.code == 2
    record.write_text(yaml.safe_dump([f"model={model}", "~model.net", net]))  # as Hydra writes it
    tested = evaluate(compose(tmp_path, "eval", *project, *QUIET_EVAL))
    assert tested["test/loss"] == pytest.approx(result.metrics["test/loss"])


@pytest.mark.parametrize(
    ("precision", "plugin"), [("16", "bf16-mixed"), ("bf16", "bf16-mixed"), ("bf16-true", "bf16-true")]
)
def test_every_precision_lightning_accepts_trains(tmp_path: Path, precision: str, plugin: str) -> None:
    """Lightning's legacy names (16 is bf16-mixed on a CPU) as Lightning reads them; bf16-true's weights
    meet the summary's example input in their own precision."""
    summary = "callbacks.speed_report.summary_depth=1"  # its example input through the weights
    result = train(compose(tmp_path, "train", f"trainer.precision={precision}", "debug=fdr", *QUIET, summary))
    assert result.trainer.precision == plugin


def test_the_shipped_nets_rules_are_theirs_alone(tmp_path: Path, project: list[str], capsys) -> None:
    """`model.net.hidden` is a list of widths for the shipped MLP, checked where it is built; a net of the
    user's may give the key another meaning (an int here), and the config does not refuse it."""
    with pytest.raises(SystemExit):  # DenseNet takes no hidden: its own error, not a rule of the config's
        train(compose(tmp_path, "train", *project, "model=lht", "data=lht", "+model.net.hidden=64", *TINY))
    assert "unexpected keyword argument 'hidden'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train(compose(tmp_path, "train", "model=mlp", "model.net.hidden=64", *TINY))
    assert "model.net.hidden=64 is invalid: use a non-empty list of integers" in capsys.readouterr().err


def test_a_module_without_validation_is_told_what_to_monitor_then_trains_on_it(
    tmp_path: Path, project: list[str], capsys
) -> None:
    """No val/loss to judge it by: one line naming what it logs in training (was EarlyStopping's traceback
    at the first epoch's end); monitor.metric=train/loss then picks its best checkpoint."""
    module = ["model=lht", "data=lht", "model._target_=lht_style.WithoutValidation", "model.scheduler=null"]
    module += TINY
    with pytest.raises(SystemExit) as stop:
        train(compose(tmp_path, "train", *project, *module))
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "did you mean monitor.metric=train/loss?" in err[0]
    again = ["monitor.metric=train/loss", "run_name=again"]
    result = train(compose(tmp_path, "train", *project, *module, *again))
    assert result.best_checkpoint and "test/acc" in result.metrics


def test_a_mapping_given_for_a_node_says_how_to_replace_it(tmp_path: Path, capsys) -> None:
    """Hydra merges `model.net={...}` into the node it has (a key that node lacks is refused): the line says
    so and gives the replacement, not "not a setting ... +model.net=", which Hydra refuses too."""
    from lightspeed.run.entry import run as run_entry

    net = "model.net={_target_: timm.create_model, model_name: resnet10t}"
    with (
        mock.patch.object(sys, "argv", ["train", net, f"paths.log_dir={tmp_path}"]),
        pytest.raises(ConfigError) as err,
    ):
        run_entry("train", lambda cfg: None)
    assert "is merged into the model.net the config has" in str(err.value)
    assert f"~model.net '+{net}'" in str(err.value)


def test_options_a_search_path_on_the_command_line_adds_are_options(tmp_path: Path) -> None:
    """`hydra.searchpath=[...,file://<conf>]` adds `model=lht`, as Hydra composes it (the engine's check of
    group options before Hydra ran knew conf/ and `--config-dir` alone: "model=lht is not an option")."""
    from lightspeed.run.entry import run as run_entry

    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "lht.yaml").write_text(lht_style.MODEL_YAML)
    seen = []
    search = f"hydra.searchpath=[pkg://lightspeed.conf,file://{tmp_path / 'conf'}]"
    with mock.patch.object(sys, "argv", ["train", search, "model=lht", f"paths.log_dir={tmp_path}"]):
        run_entry("train", lambda cfg: seen.append(cfg.model._target_))
    assert seen == ["lht_style.DigitsLitModule"]


def test_a_net_class_passing_its_keyword_arguments_on_gets_the_data_s() -> None:
    from lightspeed.models.nets import build_net

    net = build_net({"_target_": "probes.ForwardingMLP", "hidden": [8]}, input_shape=[4], num_outputs=2)
    assert net(torch.zeros(3, 4)).shape == (3, 2)


def test_a_resume_on_another_number_of_ranks_gives_each_rank_its_own_stream() -> None:
    from types import SimpleNamespace

    from lightspeed.resilience.rank_seed import RankSeed, capture

    guard = RankSeed(seed=7)
    guard.on_load_checkpoint(None, None, {"rank_rng": {"ranks": [capture()]}})  # one process saved it
    with pytest.warns(UserWarning, match="fresh seeds"):
        guard.on_fit_start(SimpleNamespace(world_size=2, global_rank=1), None)
    assert torch.initial_seed() == 8  # seed + rank, not the saved stream on every rank
