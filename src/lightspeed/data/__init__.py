"""DataModules: `base.ArrayDataModule` holds the shared logic, one file per data set adds the arrays."""

from importlib import import_module
from typing import Any

__all__ = ["ArrayDataModule", "DigitsDataModule", "SyntheticDataModule"]
_MODULES = {"ArrayDataModule": "base", "DigitsDataModule": "digits", "SyntheticDataModule": "synthetic"}


def __getattr__(name: str) -> Any:
    """Each DataModule imported when first asked for: a run loads its own data set's module, no other."""
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"lightspeed.data.{_MODULES[name]}"), name)
