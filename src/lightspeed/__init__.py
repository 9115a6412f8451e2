"""Lightspeed: a PyTorch Lightning + Hydra starter that trains fast and says where the time goes."""

from pathlib import Path

__version__ = "0.1.0"

#: The Hydra config tree. It lives beside the package in the repository (`conf/`), so the project is
#: meant to be installed editable (`pip install -e .`), as the Makefile does.
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
