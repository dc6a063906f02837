"""The number of factors k of the demand model (`choose_factors`): each k = 1..K_max fitted on the first 80% of the
periods, the one whose model best predicts the last 20%'s normalised moments (the estimator's objective out of sample;
the smallest k within CHOICE_TOLERANCE of the best)."""

from __future__ import annotations

import numpy as np

from demand.fit_checks import training_periods
from demand.moment_estimator import LAGS, estimate, lagged_covariances, normalised_moments

MAX_FACTORS = 4
"""Default largest number of factors k the hold-out chooses among (platform/fit.py --max-factors)."""


CHOICE_TOLERANCE = 0.01
"""`choose_factors` takes the smallest k whose hold-out error is within this share of the smallest: a factor that
improves the predicted correlations by less than 1% is not worth its n loadings."""


def choose_factors(demand: np.ndarray, max_factors: int = MAX_FACTORS, dtype=np.float64) -> tuple[int, list[dict]]:
    """(k, one row per k = 1..max_factors): each k's model fitted on the first 80% of the periods and scored by the estimator's
    own objective on the last 20%'s normalised moments (training weights, lag-0 diagonal left out); k is the smallest within
    CHOICE_TOLERANCE of the smallest error (docs/fitting.md, "Choosing the number of factors")."""
    periods, n = demand.shape
    train = training_periods(periods)
    mean, cov = lagged_covariances(demand[:train], dtype=dtype)
    held_mean, held_cov = lagged_covariances(demand[train:], dtype=dtype)
    usable = (held_mean > 0) & (np.diagonal(cov[0]) > 0)
    held = normalised_moments(np.where(usable, held_mean, 1.0), held_cov)
    weight = np.where(usable, mean / np.sqrt(np.maximum(np.diagonal(cov[0]), 1e-300)), 0.0)
    pair_weight = np.outer(weight, weight) ** 2
    off_diagonal = ~np.eye(n, dtype=bool)
    rows = []
    for factors in range(1, min(max_factors, n) + 1):
        fitted = estimate(mean, cov, factors)
        shared = fitted.loadings @ fitted.loadings.T
        error = 0.0
        for lag in range(LAGS + 1):
            squares = pair_weight * (held[lag] - fitted.rho**lag * shared) ** 2
            error += float(squares[off_diagonal].sum() if lag == 0 else squares.sum())
        rows.append({"factors": factors, "holdout_error": error / ((LAGS + 1) * n * n - n), "rho": fitted.rho})
    best = min(row["holdout_error"] for row in rows)
    chosen = next(row["factors"] for row in rows if row["holdout_error"] <= (1 + CHOICE_TOLERANCE) * best)
    return chosen, rows
