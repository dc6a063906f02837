"""The factor path of a history under the fitted model: the posterior mode of F_0..F_{T-1} given the history and the
fitted parameters (Fisher scoring as an iterated Kalman smoother) with its Laplace standard deviation, for the fit
report's figure, and the filtered state of the last period, from which the hold-out check forecasts."""

from __future__ import annotations

import numpy as np

from envs.demand_law import loading_rates
from envs.exogenous import FACTOR_BOUND, innovation_scale
from envs.instance import as_loadings


def smooth_factor(
    demand: np.ndarray, lam: np.ndarray, beta: np.ndarray, rho: float, overdispersion: np.ndarray | None = None, iterations: int = 50
) -> dict:
    """{"mean", "sd"}: the posterior mode of F_0..F_{T-1} given the history (Fisher scoring: each step a Kalman filter and RTS
    smoother of the linearised log-likelihood's pseudo-observations) and its Laplace standard deviation, [T] for `beta` [n]
    (one factor) or [T, k] for [n, k]; and "last_mean" [k], "last_cov" [k, k], the last period's filtered state (for forecasts)."""
    loadings = as_loadings(beta)
    periods, factors = demand.shape[0], loadings.shape[1]
    phi = np.zeros(lam.size) if overdispersion is None else overdispersion
    identity = np.eye(factors)
    inverse = np.linalg.inv if factors > 1 else np.reciprocal  # a 1 x 1 matrix's inverse is its reciprocal, ten times faster
    path = np.zeros((periods, factors))
    q = innovation_scale(rho) ** 2
    for _ in range(iterations):
        rate = loading_rates(lam, loadings, path)  # [T, n]
        damping = 1.0 / (1.0 + phi * rate)
        gradient = ((demand - rate) * damping) @ loadings  # [T, k]
        precision = np.einsum("ti,ij,il->tjl", rate * damping, loadings, loadings)  # [T, k, k]
        info = np.einsum("tjl,tl->tj", precision, path) + gradient  # precision x pseudo-observation
        filt_m, pred_m = np.empty((periods, factors)), np.empty((periods, factors))
        filt_p, pred_p = np.empty((periods, factors, factors)), np.empty((periods, factors, factors))
        m, p = np.zeros(factors), identity  # F_0 ~ N(0, I)
        for t in range(periods):
            if t:
                m, p = rho * filt_m[t - 1], rho * rho * filt_p[t - 1] + q * identity
            pred_m[t], pred_p[t] = m, p
            prior_precision = inverse(p)
            filt_p[t] = inverse(prior_precision + precision[t])
            filt_m[t] = filt_p[t] @ (prior_precision @ m + info[t])
        smooth_m, smooth_p = filt_m.copy(), filt_p.copy()
        for t in range(periods - 2, -1, -1):
            gain = rho * filt_p[t] @ inverse(pred_p[t + 1])
            smooth_m[t] = filt_m[t] + gain @ (smooth_m[t + 1] - pred_m[t + 1])
            smooth_p[t] = filt_p[t] + gain @ (smooth_p[t + 1] - pred_p[t + 1]) @ gain.T
        new = np.clip(path + np.clip(smooth_m - path, -2.0, 2.0), -FACTOR_BOUND, FACTOR_BOUND)  # damped: no overshoot
        done = np.max(np.abs(new - path)) < 1e-9
        path = new
        if done:
            break
    sd = np.sqrt(np.diagonal(smooth_p, axis1=1, axis2=2))
    shape = (lambda x: x[:, 0]) if beta.ndim == 1 else (lambda x: x)
    return {"mean": shape(path), "sd": shape(sd), "last_mean": filt_m[-1], "last_cov": filt_p[-1]}
