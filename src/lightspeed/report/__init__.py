"""Pictures of runs: each run's curves (curves.py), the confusion matrix eval writes (confusion_matrix.py)."""
