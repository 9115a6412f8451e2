"""`make shards data=<name>` / `python -m lightspeed.shards data=<name>`: write a data set's splits as
LitData shards, once, for `make train data=shards data.path=<the folder>` (data larger than memory)."""

from __future__ import annotations

import json
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_info
from omegaconf import DictConfig

from lightspeed.core.config import ConfigError, exit_on_config_error, validate_common
from lightspeed.core.logs import silence_known_noise
from lightspeed.data.base import ArrayDataModule
from lightspeed.data.shards import META, ShardsDataModule, write_shards
from lightspeed.run import build
from lightspeed.run.entry import hydra_entry


def convert(cfg: DictConfig) -> Path:
    silence_known_noise()
    with exit_on_config_error():
        validate_common(cfg)
        dm = build.datamodule(cfg)
        if not isinstance(dm, ArrayDataModule) or isinstance(dm, ShardsDataModule):
            raise ConfigError(
                f"data: make shards converts data sets held in memory or in files; "
                f"{type(dm).__name__} is not one"
            )
        out = write_shards(dm, Path(cfg.shards.out), cfg.shards.chunk_bytes)
    counts = json.loads((out / META).read_text())["samples"]
    rank_zero_info(
        f"shards: {', '.join(f'{s} {n}' for s, n in counts.items())} samples in {out}; "
        f"train on them: make train data=shards data.path={out}"
    )
    return out


#: Console entry point: `python -m lightspeed.shards`.
main = hydra_entry("shards", convert)

if __name__ == "__main__":
    main()
