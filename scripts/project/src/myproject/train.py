"""`make train [KEY=VALUE ...]` (`python -m myproject.train`): train the model conf/ names on its data,
test the best checkpoint, print the summary. Each object is built from its config node, as Hydra's
`instantiate` builds it (lightspeed's refuses a bad setting in one line naming the key); the engine's part
is the plan (`Run`: the checks, the run's folder and lock, the autos resolved into `run.cfg`, the seed, the
checkpoint to resume) and the callbacks. `cfg` stays as Hydra composed it; `run.cfg` is read-only. Edit what
you need, or add callbacks of your own to CALLBACKS."""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
from omegaconf import DictConfig

from lightspeed.run.entry import hydra_entry
from lightspeed.train import Run, TrainResult, instantiate, train_or_search

#: Your own callbacks, beside those conf/callbacks/ configures (e.g. a StochasticWeightAveraging).
CALLBACKS: list[L.Callback] = []


def train(cfg: DictConfig, callbacks: Sequence[L.Callback] = ()) -> TrainResult:
    with Run(cfg) as run:  # checks the config, takes the run's folder, resolves the autos, seeds
        dm = instantiate(run.cfg.data)  # conf/data: your LightningDataModule (data/)
        model = instantiate(run.model_node(dm))  # conf/model: your LightningModule, given dm.model_args()
        trainer = instantiate(
            run.cfg.trainer,  # conf/trainer: Lightning's Trainer
            callbacks=run.callbacks([*CALLBACKS, *callbacks]),  # conf/callbacks, and the guards
            logger=run.loggers(),  # conf/logger
            plugins=run.plugins(),  # checkpoints written whole or not at all
        )
        run.fit(trainer, model, dm)  # trainer.fit, continuing this run's newest checkpoint, if any
        return run.finish(trainer, model, dm)  # tests the best checkpoint, writes the summary


main = hydra_entry("train", lambda cfg: train_or_search(cfg, train))  # hparams_search=<name>: a search

if __name__ == "__main__":
    main()
