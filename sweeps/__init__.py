"""Tune sweeps over sizes x seeds x methods, with the baselines of every size (platform/sweep.py)."""
