"""The factor known only from the past: E[F_t | D_0..D_{t-1}], the factor that a policy sees when it decides on
actual demand, where the factor itself is never observed (platform/backtest.py, envs/history_replay.py).

`causal_factor` filters under the demand model that the instance states (docs/model.md, "Several factors and
overdispersion"): one factor, whatever its loadings' signs and the demand law, by `GridFilter`, the exact Bayes filter
on a grid; k >= 2 factors, where a grid would need 401^k points, by `GaussianFilter`, a Laplace approximation. Both
are causal: the estimate at t uses D_0..D_{t-1} only, unlike demand.factor_smoother.smooth_factor (the posterior mode given the
whole history, for the fit report), which sees the future.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.demand_law import demand_rate, log_likelihood, score_and_curvature
from envs.instance import Instance
from policies.dp_optimal import tauchen_grid

FILTER_POINTS = 401
"""Grid points of the factor filter: spacing 0.025 over [-FILTER_WIDTH, FILTER_WIDTH], far below the factor's
posterior standard deviation at any history length that a fit accepts."""
FILTER_WIDTH = 5.0
"""The filter's grid spans +-5 standard deviations of the stationary factor N(0, 1) (outside: probability 6e-7)."""
NEWTON_TOLERANCE = 1e-10
"""The Gaussian filter's Newton iterations stop when a step moves the mode by less than this (in factor units)."""
NEWTON_STEPS = 100
"""At most this many Newton steps per period (each halves until the log posterior rises; from the prediction the
mode is typically reached in 3 to 6)."""


@dataclass(frozen=True)
class GridFilter:
    """The Bayes filter of one factor on a grid: the factor's AR(1), eq. (factor_process), discretised by
    policies.dp_optimal.tauchen_grid (its stationary law as the prior of F_0), and the likelihood of every item's
    demand given the rate lam_i exp(beta_i F - beta_i^2 / 2), eq. (conditional_demand_rate), with beta_i the item's
    signed loading: Poisson, eq. (conditional_demand), or negative binomial with `overdispersion` phi_i."""

    lam: np.ndarray
    beta: np.ndarray
    rho: float
    overdispersion: np.ndarray | None = None
    points: int = FILTER_POINTS
    width: float = FILTER_WIDTH

    def log_likelihoods(self, demand: np.ndarray, points: np.ndarray) -> np.ndarray:
        """log L_t(f) [T, M] at the grid's points, less the terms without f: f sum_i beta_i D_i,t - sum_i rate_i(f)
        (Poisson), and for a negative-binomial item - (D_i,t + 1 / phi_i) log(1 + phi_i rate_i(f)) in place of
        - rate_i(f) (`log_likelihood`; D log rate contributes its f-term f beta_i D_i,t)."""
        exposure = demand @ self.beta  # [T] sum_i beta_i D_i,t
        rates = demand_rate(self.lam, self.beta, points[:, None])  # [M, n]
        if self.overdispersion is None:
            return exposure[:, None] * points[None, :] - rates.sum(axis=1)[None, :]
        positive = self.overdispersion > 0
        safe = np.where(positive, self.overdispersion, 1.0)
        spread = np.where(positive, np.log1p(safe * rates), 0.0)  # [M, n] log(1 + phi_i rate_i(f)), 0 for Poisson items
        penalty = np.where(positive, spread / safe, rates).sum(axis=1)  # [M]
        return exposure[:, None] * points[None, :] - demand @ spread.T - penalty[None, :]

    def predictive_means(self, demand: np.ndarray) -> np.ndarray:
        """E[F_t | D_0..D_{t-1}] for t = 0..T: [T + 1] from demand [T, n] (t = 0: the prior mean, 0).

        With p_t the law of F_t on the grid given D_<t: p_{t+1} = (p_t * L_t) P / sum(p_t * L_t), where
        P is the grid's transition matrix and L_t(f) the likelihood of D_t at F_t = f (`log_likelihoods`)."""
        grid = tauchen_grid(self.rho, self.points, self.width)
        demand = np.asarray(demand, dtype=np.float64)
        log_likelihood = self.log_likelihoods(demand, grid.points)  # [T, M]
        law = grid.initial.copy()
        means = np.empty(demand.shape[0] + 1)
        for t in range(demand.shape[0]):
            means[t] = law @ grid.points
            weights = law * np.exp(log_likelihood[t] - log_likelihood[t].max())
            law = (weights / weights.sum()) @ grid.transition
        means[-1] = law @ grid.points
        return means


@dataclass(frozen=True)
class GaussianFilter:
    """A Gaussian (Laplace, or iterated extended Kalman) approximation of the Bayes filter of k factors: F_t given D_<t is
    N(m_t, P_t), predicted by eq. (factor_process), m- = rho m, P- = rho^2 P + (1 - rho^2) I (F_0 ~ N(0, I)), and updated with
    D_t at the mode of the log posterior in the log-rates eta_i = log lam_i + beta_i . F - |beta_i|^2 / 2 (eq.
    (conditional_demand_rate)), P = (P-^-1 + B' W B)^-1 there, W the likelihood's curvature in eta (`score_and_curvature`).
    The posterior is not Gaussian; its error against the exact filter: docs/fitting.md, "Backtest"."""

    lam: np.ndarray
    loadings: np.ndarray
    rho: float
    overdispersion: np.ndarray | None = None

    def update(self, demand_t: np.ndarray, mean: np.ndarray, precision: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The mode of the log posterior given D_t (the prediction N(mean, precision^-1) as the prior) and the
        precision P-^-1 + B' W B there."""
        phi = np.zeros_like(self.lam) if self.overdispersion is None else self.overdispersion
        offset = np.log(self.lam) - 0.5 * (self.loadings**2).sum(axis=1)  # [n] eta_i at F = 0

        def log_posterior(factor):
            gap = factor - mean
            return log_likelihood(demand_t, offset + self.loadings @ factor, phi) - 0.5 * gap @ precision @ gap

        factor, value = mean.copy(), log_posterior(mean)
        for _ in range(NEWTON_STEPS):
            score, curvature = score_and_curvature(demand_t, np.exp(offset + self.loadings @ factor), phi)
            hessian = precision + self.loadings.T @ (curvature[:, None] * self.loadings)
            step = np.linalg.solve(hessian, self.loadings.T @ score - precision @ (factor - mean))
            while True:  # halve the step until the log posterior does not fall (concave: a rise exists on the way)
                candidate = factor + step
                candidate_value = log_posterior(candidate)
                if candidate_value >= value or np.abs(step).max() < NEWTON_TOLERANCE:
                    break
                step = step / 2
            factor, value = candidate, candidate_value
            if np.abs(step).max() < NEWTON_TOLERANCE:
                break
        _, curvature = score_and_curvature(demand_t, np.exp(offset + self.loadings @ factor), phi)
        return factor, precision + self.loadings.T @ (curvature[:, None] * self.loadings)

    def predictive_means(self, demand: np.ndarray) -> np.ndarray:
        """E[F_t | D_0..D_{t-1}] for t = 0..T under the approximation: [T + 1, k] from demand [T, n] (t = 0: 0)."""
        demand = np.asarray(demand, dtype=np.float64)
        factors = self.loadings.shape[1]
        identity = np.eye(factors)
        mean, covariance = np.zeros(factors), identity.copy()
        means = np.empty((demand.shape[0] + 1, factors))
        for t in range(demand.shape[0]):
            means[t] = mean
            posterior_mean, posterior_precision = self.update(demand[t], mean, np.linalg.inv(covariance))
            mean = self.rho * posterior_mean
            covariance = self.rho**2 * np.linalg.inv(posterior_precision) + (1.0 - self.rho**2) * identity
        means[-1] = mean
        return means


def factor_filter(instance: Instance) -> GridFilter | GaussianFilter:
    """The filter of the instance's demand model: GridFilter for one factor (the signed loading of each item, its
    overdispersion), GaussianFilter for k >= 2."""
    if instance.factors == 1:
        beta = instance.beta if instance.loadings is None else instance.loadings[:, 0]
        return GridFilter(instance.lam, beta, instance.rho, instance.overdispersion)
    return GaussianFilter(instance.lam, instance.loadings, instance.rho, instance.overdispersion)


def describe_filter(instance: Instance) -> str:
    """The filter of `instance` in words, for the backtest's summary."""
    law = "negative-binomial" if instance.overdispersion is not None else "Poisson"
    if instance.factors == 1:
        return f"exact Bayes filter of one factor, {law} demand, on {FILTER_POINTS} grid points over +-{FILTER_WIDTH:g}"
    return f"Gaussian (Laplace) approximation of the filter of {instance.factors} factors, {law} demand"


def causal_factor(instance: Instance, demand: np.ndarray) -> np.ndarray:
    """E[F_t | D_0..D_{t-1}] for t = 0..T under the demand model that `instance` states (`factor_filter`): [T + 1] with
    one factor, [T + 1, k] with k >= 2, the shape of the state's factor over the history."""
    return factor_filter(instance).predictive_means(demand)
