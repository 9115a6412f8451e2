"""DataModules: `base.ArrayDataModule` holds the shared logic, one file per data set adds the arrays."""

from lightspeed.data.base import ArrayDataModule
from lightspeed.data.digits import DigitsDataModule
from lightspeed.data.synthetic import SyntheticDataModule

__all__ = ["ArrayDataModule", "DigitsDataModule", "SyntheticDataModule"]
