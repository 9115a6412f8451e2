"""Lightspeed: a PyTorch Lightning + Hydra starter that trains fast and says where the time goes.

The engine's half of the config (the groups trainer, accel, callbacks, logger, paths, hydra, debug) ships
inside the package, in `lightspeed/conf/`, and reaches Hydra through the search path that the project's
primary configs name (`hydra.searchpath: [pkg://lightspeed.conf]`). The project's half (train.yaml and
the groups data, model, experiment, hparams_search, local) is the project's `conf/`; a file there with
the name of an engine group's option (conf/trainer/mine.yaml) adds an option to that group, and one with
the same name as the engine's (conf/accel/default.yaml) takes its place, as Hydra's search path orders them.
"""

import os
from pathlib import Path

__version__ = "0.2.0"

#: The engine's config groups, installed with the package.
ENGINE_CONF = Path(__file__).resolve().parent / "conf"


def _project_conf() -> Path:
    """The project's conf/: $LIGHTSPEED_CONF where set; else the nearest conf/ holding train.yaml in the
    working directory or above it (a project run from its root or a folder of it); else the repository's,
    beside this package (an editable install of the template)."""
    if os.environ.get("LIGHTSPEED_CONF"):
        return Path(os.environ["LIGHTSPEED_CONF"]).resolve()
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "conf" / "train.yaml").is_file():
            return folder / "conf"
    return Path(__file__).resolve().parents[2] / "conf"


#: The project's config tree: its primary configs and its own groups.
CONF_DIR = _project_conf()

#: Where Hydra finds each group's options, first match winning: the project's, then the engine's.
CONF_DIRS = (CONF_DIR, ENGINE_CONF)
