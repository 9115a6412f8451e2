"""How a command runs: Hydra composes the config (`entry`), and `build` turns it into the DataModule,
model, callbacks and Trainer that `train.py` and `eval.py` use."""
