"""`make train [KEY=VALUE ...]` (`python -m myproject.train`): train the model conf/ names on its data,
test the best checkpoint, print the summary. Each step is one call of the engine (lightspeed.train.Run);
edit what you need between them (`cfg` stays as Hydra composed it; `run.cfg`, the run's copy with its
autos resolved, is read-only inside the block, and `run.plan` holds what was decided), or add callbacks of
your own to CALLBACKS."""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
from omegaconf import DictConfig

from lightspeed.run.entry import hydra_entry
from lightspeed.train import Run, TrainResult, train_or_search

#: Your own callbacks, beside those conf/callbacks/ configures (e.g. a StochasticWeightAveraging).
CALLBACKS: list[L.Callback] = []


def train(cfg: DictConfig, callbacks: Sequence[L.Callback] = ()) -> TrainResult:
    with Run(cfg) as run:  # checks the config, takes the run's folder, resolves accel's autos, seeds
        dm = run.datamodule()  # conf/data: your LightningDataModule (data/)
        model = run.model(dm)  # conf/model: your LightningModule (models/), with dm.model_args()
        trainer = run.trainer([*CALLBACKS, *callbacks])  # conf/trainer, callbacks, logger; the guards
        run.fit(trainer, model, dm)  # resumes this run's newest checkpoint, if any
        return run.finish(trainer, model, dm)  # tests the best checkpoint, writes the summary


main = hydra_entry("train", lambda cfg: train_or_search(cfg, train))  # hparams_search=<name>: a search

if __name__ == "__main__":
    main()
