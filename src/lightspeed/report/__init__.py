"""Pictures of runs: each run's curves (curves.py), several runs on one chart (compare.py)."""
