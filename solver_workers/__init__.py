"""Optimisation: rolling-horizon MILPs, the perfect-information bound, the Ray solver pool."""
