"""Lightning callbacks that Lightspeed adds to every run."""

from lightspeed.callbacks.rank_seed import RankSeed

__all__ = ["RankSeed"]
