"""Optimisation: rolling-horizon MILPs, the perfect-information bound, the Ray solver pool and a whole solver run
into a results folder (solver_run.py). Ray itself is reached through ray_access/."""
