"""The Lightning callbacks Lightspeed adds to runs, under the one import path that the callbacks group
names them by: a saved run's config keeps working however the package is laid out inside."""

from lightspeed.compat.callbacks import EarlyStopping, ModelCheckpoint
from lightspeed.resilience.exact_resume import ExactResume
from lightspeed.resilience.nonfinite import NonFiniteGuard
from lightspeed.resilience.preemption import Preemption
from lightspeed.resilience.rank_seed import RankSeed
from lightspeed.speed.progress import ProgressBar
from lightspeed.speed.report import SpeedReport

__all__ = [
    "EarlyStopping",
    "ExactResume",
    "ModelCheckpoint",
    "NonFiniteGuard",
    "Preemption",
    "ProgressBar",
    "RankSeed",
    "SpeedReport",
]
