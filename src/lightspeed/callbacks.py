"""The Lightning callbacks Lightspeed adds to runs, under the one import path that the callbacks group
names them by: a saved run's config keeps working however the package is laid out inside."""

from lightspeed.compat import callbacks
from lightspeed.resilience.exact_resume import ExactResume
from lightspeed.resilience.nonfinite import NonFiniteGuard
from lightspeed.run.monitor import ChecksMonitor
from lightspeed.speed.progress import ProgressBar
from lightspeed.speed.report import SpeedReport


class ModelCheckpoint(ChecksMonitor, callbacks.ModelCheckpoint):
    """Lightning's, cheaper per step and aware of resumed runs (`compat.callbacks`); its monitor checked."""


class EarlyStopping(ChecksMonitor, callbacks.EarlyStopping):
    """Lightning's, a stopped run staying stopped when resumed (`compat.callbacks`); its monitor checked."""


__all__ = [
    "EarlyStopping",
    "ExactResume",
    "ModelCheckpoint",
    "NonFiniteGuard",
    "ProgressBar",
    "SpeedReport",
]
