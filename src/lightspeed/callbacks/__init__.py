"""Lightning callbacks that Lightspeed adds to every run."""

from lightspeed.callbacks.exact_resume import ExactResume
from lightspeed.callbacks.nonfinite import NonFiniteGuard
from lightspeed.callbacks.preemption import Preemption
from lightspeed.callbacks.progress import ProgressBar
from lightspeed.callbacks.rank_seed import RankSeed
from lightspeed.callbacks.speed import SpeedReport
from lightspeed.compat.callbacks import EarlyStopping, ModelCheckpoint

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
