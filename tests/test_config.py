"""One-line errors for bad values, before any work (every option composing: test_registry.py)."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
import torch
from omegaconf import OmegaConf

from conftest import command_line
from lightspeed import CONF_DIR
from lightspeed.core.config import ConfigError, validate_train
from lightspeed.train import train
from test_registry import options


def test_an_unknown_option_is_named_with_the_options_there_are(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        command_line(["trainer=foo"], tmp_path)  # Hydra's refusal, reworded
    assert (
        str(err.value) == f"trainer=foo is not an option: use one of {', '.join(options('trainer'))} "
        "(or add conf/trainer/foo.yaml)"
    )


def test_eval_config_composes(eval_cfg) -> None:
    cfg = eval_cfg("predict=true")
    assert cfg.ckpt_path == "latest" and cfg.predict is True
    OmegaConf.to_container(cfg, resolve=True)


def test_command_line_values_reach_the_config(train_cfg) -> None:
    cfg = train_cfg(
        "trainer.precision=bf16-mixed", "trainer.accumulate_grad_batches=4", "trainer.benchmark=true"
    )
    assert (cfg.trainer.precision, cfg.trainer.accumulate_grad_batches, cfg.trainer.benchmark) == (
        "bf16-mixed",
        4,
        True,
    )
    validate_train(cfg)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("resume=maybe", "resume"),
        ("run_name=a/b", "run_name"),
        ("run_name='" + "é" * 101 + "'", "run_name"),  # 202 bytes: past what a file system takes, with room
        ("callbacks.nonfinite.action=ignore", "callbacks.nonfinite.action"),
        ("callbacks.exact_resume.signals=[SIGKILL]", "callbacks.exact_resume.signals"),
        ("callbacks.exact_resume.check_every_n_steps=0", "callbacks.exact_resume.check_every_n_steps"),
        ("trainer.max_epochs=abc", "trainer.max_epochs"),
        ("trainer.max_epochs=-3", "trainer.max_epochs"),
        ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches"),
        ("trainer.gradient_clip_val=-1", "trainer.gradient_clip_val"),
        ("data.batch_size=0", "data.batch_size"),
        ("data.batch_size=1.5", "data.batch_size"),
        ("data.num_workers=-1", "data.num_workers"),
        ("data.pin_memory=sometimes", "data.pin_memory"),
        ("data.val_fraction=1.5", "data.val_fraction"),
        ("model.optimizer.lr=-0.1", "model.optimizer.lr"),
        ("seed=abc", "seed"),
    ],
)
def test_bad_values_name_the_key(train_cfg, override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}=") as err:
        validate_train(train_cfg(override))
    assert "\n" not in str(err.value) and "use " in str(err.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.augment.crop_padding=-1", "^data.augment.crop_padding=-1 is invalid"),
        ("data.prefetch_factor=0", "^data.prefetch_factor=0 is invalid"),
        (
            "accel.matmul_precision=low",
            "^accel.matmul_precision='low' is invalid: use one of highest, high, medium",
        ),
        ("accel.optimizer_impl=turbo", "^accel.optimizer_impl='turbo' is invalid"),
        ("data.on_device=sometimes", "^data.on_device='sometimes' is invalid: use auto, true or false"),
    ],
)
def test_more_bad_values_fail_before_any_work(train_cfg, override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_train(train_cfg(override))


@pytest.mark.parametrize(
    ("override", "start"),
    [
        ("ckpt_path=/no/such/file.ckpt", "error: ckpt_path=/no/such/file.ckpt does not exist: pass the path"),
        ("ckpt_path=false", "error: ckpt_path=False does not exist: pass the path of a .ckpt"),
        ("ckpt_path=''", "error: ckpt_path=. is a folder"),
    ],
)
def test_a_missing_ckpt_path_fails_before_any_work(train_cfg, capsys, override: str, start: str) -> None:
    assert refused(train_cfg(override), capsys).startswith(start)


@pytest.mark.parametrize(
    ("override", "start"),
    [
        (
            "~model._target_",
            "error: model (model=cnn) names no LightningModule to build in _target_ (a mapping",
        ),
        ("~data._target_", "error: data (data=digits) names no LightningDataModule to build in _target_ (a"),
    ],
)
def test_a_group_naming_no_class_to_build_is_one_line(train_cfg, capsys, override: str, start: str) -> None:
    assert refused(train_cfg(override), capsys).startswith(start)


def test_an_unwritable_log_dir_fails_before_any_work(train_cfg, tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(
        ConfigError, match=r"^paths.log_dir=.*a-file/logs cannot be written .*not a writable folder"
    ):
        validate_train(train_cfg(f"paths.log_dir={blocker / 'logs'}"))


def test_splits_that_leave_no_training_data_are_refused(train_cfg) -> None:
    with pytest.raises(ConfigError, match="leaves no training data"):
        validate_train(train_cfg("data.val_fraction=0.5", "data.test_fraction=0.5"))


def refused(cfg, capsys) -> str:
    """The one line (exit 2) that training `cfg` ends in."""
    with pytest.raises(SystemExit) as stop:
        train(cfg)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert stop.value.code == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trainer.precision=15", "trainer.precision"),
        ("trainer.accelerator=tpu9", "trainer.accelerator"),
        ("trainer.benchmark=maybe", "trainer.benchmark"),
        ("trainer.devices=0", "trainer.devices"),
        ("trainer.strategy=ddp_turbo", "trainer.strategy"),
        ("+trainer.gradient_clip_algorithm=x", "trainer.gradient_clip_algorithm"),
        ("+trainer.limit_predict_batches=-2", "trainer.limit_predict_batches"),
    ],
)
def test_values_lightning_refuses_are_its_line_naming_the_key(
    train_cfg, capsys, override: str, key: str
) -> None:
    """Lightning's own checks, reworded where they are raised (not pre-empted): one line naming the key,
    before any training."""
    assert re.match(rf"error: {key}=\S+( is invalid)?: ", refused(train_cfg(override), capsys))


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["trainer=cpu", "trainer.enable_progress_bar=maybe"],  # Lightning would take it, as true
            "trainer.enable_progress_bar=maybe is invalid: lightning.pytorch.Trainer takes "
            "enable_progress_bar: Optional[bool]",
        ),
        (
            ["experiment=sort_gpt", "model.net.n_embd=abc"],  # a nested _target_
            "model.net.n_embd=abc is invalid: lightspeed.models.gpt.GPT takes n_embd: int",
        ),
        (
            ["trainer.enable_checkpointing=no"],  # OmegaConf reads "no" as false; the Trainer gets the string
            "trainer.enable_checkpointing=no is invalid: lightning.pytorch.Trainer takes "
            "enable_checkpointing: Optional[bool]",
        ),
        (
            ["callbacks.speed_report.data_wait_warn=abc"],  # would fail as the fit ends
            "callbacks.speed_report.data_wait_warn=abc is invalid: lightspeed.callbacks.SpeedReport takes "
            "data_wait_warn: float",
        ),
    ],
)
def test_a_value_that_its_constructors_annotation_refuses_is_one_line_before_anything_is_built(
    train_cfg, capsys, overrides: list[str], line: str
) -> None:
    """The types live on the constructor: each `_target_` node's values are checked against the annotations
    of the parameters they go to (OmegaConf's structured-config check), before it is built."""
    assert refused(train_cfg(*overrides), capsys).startswith(f"error: {line} (")


@dataclass
class Theme:
    colour: str = "red"


class Thing:
    """A constructor in a common idiom: a `None` default without Optional, a dataclass argument; and a hint
    that cannot be a dict key (a Literal of a list)."""

    def __init__(
        self,
        weights: str = None,  # noqa: RUF013
        theme: Theme | None = None,
        sizes: list[int] = (1,),
        scale: Literal[[1, 2], 3] = 3,
    ) -> None:
        self.weights, self.theme, self.sizes, self.scale = weights, theme, sizes, scale


@pytest.mark.parametrize(
    ("values", "refused_key"),
    [
        ({"weights": None}, None),  # a None default makes it optional, as Python reads it
        ({"theme": {"_target_": "test_config.Theme", "colour": "blue"}}, None),  # a node that builds it
        ({"sizes": [1, 2]}, None),
        ({"sizes": [1, "a"]}, "sizes"),  # inside a list: the parameter is named
        ({"weights": 3}, None),  # a number where a string goes: OmegaConf's str takes it
        ({"scale": 3}, None),
    ],
)
def test_the_annotation_check_takes_what_the_constructor_takes(values: dict, refused_key: str | None) -> None:
    from lightspeed.run.build import check_arguments

    node = OmegaConf.create({"thing": {"_target_": "test_config.Thing", **values}}).thing
    if refused_key is None:
        check_arguments(node, "thing")
    else:
        with pytest.raises(
            ConfigError, match=rf"^thing\.{refused_key}=.* is invalid: test_config.Thing takes"
        ):
            check_arguments(node, "thing")


def test_lightning_refusing_more_gpus_than_visible_names_trainer_devices_and_a_bug_keeps_its_traceback() -> (
    None
):
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from lightspeed.run.build_errors import _refusal

    node = OmegaConf.create({"trainer": {"accelerator": "gpu", "devices": 4}}).trainer
    said = "You requested gpu: [0, 1, 2, 3]\n But your machine only has: [0]"
    line = _refusal(MisconfigurationException(said), said.splitlines()[0], node, "trainer")
    assert (
        line is not None
        and line.startswith("trainer.devices=4: You requested gpu")
        and "only has: [0]" in line
    )
    try:  # a bug of code of the user's own that the Trainer's node builds (its strategy): not a setting
        sorted(None)  # type: ignore[call-overload]
    except TypeError as bug:
        assert _refusal(bug, str(bug), node, "trainer") is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
@pytest.mark.parametrize("trainer", ["trainer=gpu", "trainer=ddp", "trainer.accelerator=cuda"])
def test_asking_for_a_gpu_without_one_is_an_error_not_a_cpu_run(train_cfg, capsys, trainer: str) -> None:
    line = refused(train_cfg(trainer), capsys)
    assert re.match(r"error: trainer.accelerator=\w+: .*no CUDA GPU.*trainer=cpu", line)


def test_an_optional_local_config_is_picked_up(tmp_path: Path) -> None:
    """On a copy of conf/ (tests run in parallel: the checkout's conf/ is never written)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf, ignore=lambda folder, _: ["local"] if folder == str(CONF_DIR) else [])
    (conf / "local").mkdir()

    def seed() -> int:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            return compose("train").seed

    without = seed()
    (conf / "local" / "default.yaml").write_text("# @package _global_\nseed: 1234\n")
    assert without != 1234 and seed() == 1234


def test_eval_checks_the_shared_settings_too(eval_cfg) -> None:
    from lightspeed.core.config import validate_common

    with pytest.raises(ConfigError, match=r"^data\.batch_size=0 is invalid"):
        validate_common(eval_cfg("data.batch_size=0"))
    with pytest.raises(ConfigError, match=r"^predict='maybe' is invalid: use true or false"):
        validate_common(eval_cfg("predict=maybe"))


@pytest.mark.parametrize(
    ("override", "key"), [("tolerance=abc", "tolerance"), ("check_batch=x", "check_batch")]
)
def test_export_checks_its_own_settings(tmp_path: Path, override: str, key: str) -> None:
    from lightspeed.core.config import validate_common
    from lightspeed.run.entry import compose_config

    with pytest.raises(ConfigError, match=rf"^{key}='\w+' is invalid: use"):
        validate_common(compose_config("export", [override], tmp_path))


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (
            ["seed=${nope}"],
            r"^seed cannot be read \(Interpolation key 'nope' not found\): fix the \$\{\.\.\.\}",
        ),
        (
            ["model.optimizer.lr=${oc.env:UNSET_FOR_THE_TEST}"],
            r"^model\.optimizer\.lr cannot be read \(.*UNSET",
        ),
        (
            ["~model.optimizer", "+model.optimizer=[1]"],
            r"^model\.optimizer=\[1\] is no mapping of settings \(list\), but model\.optimizer\.\w+",
        ),
    ],
)
def test_a_reference_that_cannot_resolve_or_a_node_of_another_shape_is_one_line(
    train_cfg, overrides, said
) -> None:
    """Each named for what it is (a second reading found the first said "another shape" for both)."""
    with pytest.raises(ConfigError, match=said):
        validate_train(train_cfg(*overrides))


def test_the_shipped_models_rules_apply_to_the_shipped_models_only(train_cfg) -> None:
    """`model.net.dropout` in [0, 1) is the shipped nets' rule; a module of the user's own may mean
    another thing by it (a dropout per layer), and its constructor's annotations are what is checked."""
    from lightspeed.core.config import ConfigError, validate_train

    per_layer = ["model.net.dropout=[0.1,0.5]", "model.optimizer.lr=0"]
    with pytest.raises(ConfigError, match=r"model\.net\.dropout"):
        validate_train(train_cfg(*per_layer))
    validate_train(train_cfg("model._target_=probes.UntestedClassifier", *per_layer))
