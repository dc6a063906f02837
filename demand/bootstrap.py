"""Standard errors of the fit: a parametric bootstrap (histories drawn from the fitted model, fitted again with the
same k), its replicates of every parameter (lam, |beta_i|, rho, phi: rotation-free) and of the statistics that the fit
report's checks compare with the model's, and the parameter intervals."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm
from tqdm.auto import tqdm

from demand.moment_estimator import Estimate, estimate, lagged_covariances, model_loadings
from demand.simulation import simulate_demand

CONFIDENCE = 0.95
"""Level of the parameter intervals (estimate +- 1.96 bootstrap standard errors, within the parameter's range)."""
REPLICATES = 100
"""Default number of bootstrap replicates: standard errors to about 7% (relative) at a small cost."""
REPLICATES_MAX = 100_000
"""The most replicates a fit takes: a bootstrap standard error's own relative error is about 1/sqrt(2 R), 0.2% at this R,
below what the report shows, and every replicate refits the model."""


@dataclass(frozen=True)
class Bootstrap:
    """Replicates of the parameters (lam [R, n], |beta| [R, n], rho [R], phi [R, n]) and of the observed statistics of
    the fit report (variance [R, n], lag-1 autocorrelation [R, n], average cross-item correlation [R])."""

    lam: np.ndarray
    beta: np.ndarray
    rho: np.ndarray
    overdispersion: np.ndarray
    variance: np.ndarray
    autocorrelation: np.ndarray
    cross_correlation: np.ndarray


def observed_statistics(cov: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(variance [n], lag-1 autocorrelation [n], mean correlation over pairs i < j) from C [K + 1, n, n]."""
    var = np.diagonal(cov[0]).copy()
    sd = np.sqrt(np.maximum(var, 1e-300))
    acf = np.diagonal(cov[1]) / sd**2
    return var, acf, mean_off_diagonal(cov[0] / np.outer(sd, sd))


def mean_off_diagonal(matrix: np.ndarray) -> float:
    n = matrix.shape[0]
    return float((matrix.sum() - np.trace(matrix)) / (n * (n - 1))) if n > 1 else float("nan")


def bootstrap(demand: np.ndarray, fitted: Estimate, replicates: int = REPLICATES, seed: int = 0, progress: bool = False) -> Bootstrap:
    """A parametric bootstrap: `replicates` histories of the same length drawn from the fitted model (its k factors and
    overdispersion), each fitted again with the same k (float32 products), giving the sampling distribution of every estimate
    and observed statistic if the model holds (docs/fitting.md, "Standard errors and intervals"). Loadings are identified
    only up to a rotation, so their norms |beta_i| are kept."""
    rng = np.random.default_rng([0x46495420, seed])
    rows = {name: [] for name in ("lam", "beta", "rho", "overdispersion", "variance", "autocorrelation", "cross_correlation")}
    for _ in tqdm(range(replicates), desc="bootstrap", disable=not progress, leave=False):
        path = simulate_demand(fitted.lam, model_loadings(fitted), fitted.rho, demand.shape[0], rng, fitted.overdispersion)
        mean, cov = lagged_covariances(path, dtype=np.float32)
        again = estimate(mean, cov, fitted.factors)
        var, acf, cross = observed_statistics(cov)
        for name, value in zip(rows, (again.lam, again.beta, again.rho, again.overdispersion, var, acf, cross)):
            rows[name].append(value)
    return Bootstrap(**{name: np.asarray(value) for name, value in rows.items()})


def interval(estimate_value, se, low: float, high: float, z: float | None = None):
    """estimate +- z se (z of CONFIDENCE, two-sided), cut to the parameter's range [low, high]."""
    z = norm.ppf(0.5 + CONFIDENCE / 2) if z is None else z
    return np.clip(estimate_value - z * se, low, high), np.clip(estimate_value + z * se, low, high)
