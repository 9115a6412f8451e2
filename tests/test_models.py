"""Nets and the classifier: shapes, plain hyperparameters, optimizer and schedule from config."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer

from lightspeed.core.config import ConfigError
from lightspeed.models.classifier import Classifier
from lightspeed.models.nets import NETS, build_net

OPT = {"name": "AdamW", "lr": 1e-3}


def test_nets_are_found_by_name_and_unknown_ones_are_refused() -> None:
    build_net({"name": "mlp"}, input_shape=(1, 8, 8), num_outputs=10)
    with pytest.raises(ConfigError) as refused:
        build_net({"name": "resnet9000"}, input_shape=(1, 8, 8), num_outputs=10)
    known = ", ".join(sorted(NETS))  # every registered net, yours included: an unknown name imports all
    said = str(refused.value)
    assert f"model.net.name='resnet9000' is not a known net: use one of {known}, or model" in said
    assert {"cnn", "mlp", "resnet"} <= set(NETS)
    with pytest.raises(ConfigError, match=r"^model\.net \(mlp\)"):
        build_net({"name": "mlp", "widths": [3]}, input_shape=(1, 8, 8), num_outputs=10)


def test_any_nn_module_is_a_net_by_target_and_gets_what_its_constructor_takes() -> None:
    """A library's class needs no wrapper: torch.nn.Linear takes in_features from the config and nothing
    the data offers; the GPT takes the data's vocab_size and block_size and leaves the rest."""
    offered = {"input_shape": [10], "num_outputs": 1, "vocab_size": 4, "block_size": 7}
    linear = build_net({"_target_": "torch.nn.Linear", "in_features": 10, "out_features": 1}, **offered)
    assert isinstance(linear, torch.nn.Linear) and linear.weight.shape == (1, 10)
    gpt = build_net({"_target_": "lightspeed.models.gpt.GPT", "n_layer": 1, "n_embd": 16}, **offered)
    assert gpt(torch.zeros(3, 7, dtype=torch.long)).shape == (3, 7, 4)
    with pytest.raises(ConfigError, match=r"^model\.net\._target_=collections\.Counter made a Counter, not"):
        build_net({"_target_": "collections.Counter"}, **offered)
    with pytest.raises(ConfigError, match=r"^model\.net \(torch\.nn\.Linear\): .*in_features"):
        build_net({"_target_": "torch.nn.Linear"}, **offered)


def test_hyperparameters_are_plain_data() -> None:
    model = Classifier(
        net={"name": "mlp", "hidden": [8]},
        optimizer=OPT,
        scheduler={"name": "none"},
        num_classes=10,
        input_shape=[1, 8, 8],
    )

    def plain(v: object) -> bool:
        if isinstance(v, dict):
            return all(isinstance(k, str) and plain(x) for k, x in v.items())
        if isinstance(v, list):
            return all(plain(x) for x in v)
        return isinstance(v, (int, float, str, bool, type(None)))

    assert plain(dict(model.hparams))


@pytest.mark.parametrize(
    ("scheduler", "kind"),
    [
        ({"name": "none"}, None),
        ({"name": "cosine"}, "CosineAnnealingLR"),
        ({"name": "onecycle", "pct_start": 0.3}, "OneCycleLR"),
    ],
)
def test_optimizer_and_schedule_come_from_config(scheduler: dict, kind: str | None) -> None:
    model = Classifier(
        net={"name": "mlp", "hidden": [8]},
        optimizer={"name": "SGD", "lr": 0.5, "momentum": 0.9},
        scheduler=scheduler,
        num_classes=10,
        input_shape=[1, 8, 8],
    )
    model.trainer = Trainer(max_steps=40, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    out = model.configure_optimizers()
    opt = out if isinstance(out, torch.optim.Optimizer) else out["optimizer"]
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9
    if kind is not None:
        assert type(out["lr_scheduler"]["scheduler"]).__name__ == kind
        assert out["lr_scheduler"]["interval"] == "step"


def test_unknown_optimizer_or_schedule_is_a_config_error() -> None:
    model = Classifier(
        net={"name": "mlp"},
        optimizer={"name": "Adamm", "lr": 1e-3},
        scheduler={"name": "none"},
        num_classes=10,
        input_shape=[1, 8, 8],
    )
    with pytest.raises(ConfigError, match=r"^model\.optimizer\.name='Adamm'"):
        model.configure_optimizers()


def test_accuracy_matches_torchmetrics_and_sums_batches() -> None:
    from torchmetrics.classification import MulticlassAccuracy

    from lightspeed.models.metrics import Accuracy

    gen = torch.Generator().manual_seed(0)
    ours, theirs = Accuracy(), MulticlassAccuracy(7, average="micro")
    for size in (5, 64, 33):
        logits, target = torch.randn(size, 7, generator=gen), torch.randint(0, 7, (size,), generator=gen)
        ours.update(logits, target)
        theirs.update(logits, target)
    assert int(ours.total) == 102
    assert torch.allclose(ours.compute(), theirs.compute())
    ours.reset()
    assert float(ours.compute()) == 0.0 and int(ours.total) == 0


def test_a_second_fit_of_the_same_module_logs_its_training_accuracy_again() -> None:
    from lightspeed.data import DigitsDataModule

    model = Classifier(
        {"name": "mlp", "hidden": [16]}, {"name": "SGD", "lr": 0.1}, {"name": "none"}, 10, [1, 8, 8]
    )
    dm = DigitsDataModule(batch_size=64, num_workers=0)
    for _ in range(2):
        trainer = Trainer(
            max_epochs=1,
            limit_train_batches=3,
            limit_val_batches=0,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(model, datamodule=dm)
        assert "train/acc" in trainer.callback_metrics  # registered, logged and reset at the epoch's end
        assert int(model.train_acc.total) == 0


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_classifier_logs_its_loss_at_every_step_the_logger_writes(tmp_path, accumulate: int) -> None:
    """Plain Lightning, no engine internals: the module logs at the first and last batch of each epoch and
    where the logger writes (every log_every_n_steps optimizer steps), so every row the logger writes has
    that step's training loss, not an earlier step's."""
    import csv

    from lightning.pytorch import Callback
    from lightning.pytorch.loggers import CSVLogger

    from lightspeed.data import DigitsDataModule

    class Written(Callback):
        """Step -> the loss of the batch at whose end the logger writes (Lightning's own test of that; with
        accumulation, each batch of the window writes at the same step: the last one's stays)."""

        def __init__(self) -> None:
            self.losses: dict[int, float] = {}

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            if trainer._logger_connector.should_update_logs:
                self.losses[trainer.fit_loop.epoch_loop._batches_that_stepped] = (
                    float(outputs["loss"]) * trainer.accumulate_grad_batches
                )  # scaled for backward

    model = Classifier(
        {"name": "mlp", "hidden": [16]}, {"name": "SGD", "lr": 0.1}, {"name": "none"}, 10, [1, 8, 8]
    )
    trainer = Trainer(
        max_epochs=2,
        limit_train_batches=12,
        limit_val_batches=0,
        log_every_n_steps=2,
        accumulate_grad_batches=accumulate,
        logger=CSVLogger(tmp_path, name="csv", version=0),
        callbacks=[written := Written()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=32, num_workers=0))
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    logged = {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}
    assert len(written.losses) == 2 * 12 // accumulate // 2  # optimizer steps / log_every_n_steps
    assert sorted(logged) == sorted(written.losses)
    assert [logged[s] for s in sorted(logged)] == pytest.approx([written.losses[s] for s in sorted(logged)])
