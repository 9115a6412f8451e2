"""`make train [KEY=VALUE ...]` (`python -m myproject.train`): train the model conf/ names on its data.

The engine (lightspeed.train) composes conf/train.yaml with the command line, checks the config, takes
the run's folder, builds the DataModule (data/), the model (models/), the callbacks, the loggers and the
Trainer from conf/, resumes an interrupted run, fits, tests the best checkpoint and prints the summary.
Callbacks of your own go in CALLBACKS (or as a file in conf/callbacks/, an option beside the engine's).
"""

from __future__ import annotations

import lightning as L
from omegaconf import DictConfig

from lightspeed.run.entry import hydra_entry
from lightspeed.train import train_or_search

#: Your own callbacks, beside those conf/callbacks/ configures (e.g. a StochasticWeightAveraging).
CALLBACKS: list[L.Callback] = []


def train(cfg: DictConfig) -> float | None:
    """One run, or with `hparams_search=<name>` a search of runs: the score Hydra's sweepers read."""
    return train_or_search(cfg, CALLBACKS)


main = hydra_entry("train", train)

if __name__ == "__main__":
    main()
