"""The factor known only from the past: E[F_t | D_0..D_{t-1}], the factor that a policy sees when it decides on
actual demand, where the factor itself is never observed (platform/backtest.py, envs/backtest.py).

`causal_factor` filters under the demand model that the instance states. Today's model, one factor with Poisson
demand (eqs. (factor_process), (conditional_demand), (conditional_demand_rate)), is filtered by `GridFilter`; a model
with another factor law or another demand law plugs in as another filter returned there. The filter is causal:
its estimate at t uses D_0..D_{t-1} only, unlike envs.fit.smooth_factor (the posterior mode given the whole
history, for the fit report), which sees the future.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.exogenous import demand_rate
from envs.instance import Instance
from policies.dp_optimal import tauchen_grid

FILTER_POINTS = 401
"""Grid points of the factor filter: spacing 0.025 over [-FILTER_WIDTH, FILTER_WIDTH], far below the factor's
posterior standard deviation at any history length that a fit accepts."""
FILTER_WIDTH = 5.0
"""The filter's grid spans +-5 standard deviations of the stationary factor N(0, 1) (outside: probability 6e-7)."""


@dataclass(frozen=True)
class GridFilter:
    """The Bayes filter of the one-factor Poisson model on a grid: the factor's AR(1), eq. (factor_process),
    discretised by policies.dp_optimal.tauchen_grid (its stationary law as the prior of F_0), and the Poisson
    likelihood of every item's demand given the rate lam_i exp(beta_i F - beta_i^2 / 2), eq. (conditional_demand_rate)."""

    lam: np.ndarray
    beta: np.ndarray
    rho: float
    points: int = FILTER_POINTS
    width: float = FILTER_WIDTH

    def predictive_means(self, demand: np.ndarray) -> np.ndarray:
        """E[F_t | D_0..D_{t-1}] for t = 0..T: [T + 1] from demand [T, n] (t = 0: the prior mean, 0).

        With p_t the law of F_t on the grid given D_<t: p_{t+1} = (p_t * L_t) P / sum(p_t * L_t), where
        P is the grid's transition matrix and L_t(f) = prod_i Poisson(D_i,t; rate_i(f)); only the terms of
        log L_t that depend on f are kept, f sum_i beta_i D_i,t - sum_i rate_i(f)."""
        grid = tauchen_grid(self.rho, self.points, self.width)
        demand = np.asarray(demand, dtype=np.float64)
        exposure = demand @ self.beta  # [T] sum_i beta_i D_i,t
        total_rate = demand_rate(self.lam, self.beta, grid.points[:, None]).sum(axis=1)  # [M] sum_i rate_i(f)
        log_likelihood = exposure[:, None] * grid.points[None, :] - total_rate[None, :]  # [T, M]
        law = grid.initial.copy()
        means = np.empty(demand.shape[0] + 1)
        for t in range(demand.shape[0]):
            means[t] = law @ grid.points
            weights = law * np.exp(log_likelihood[t] - log_likelihood[t].max())
            law = (weights / weights.sum()) @ grid.transition
        means[-1] = law @ grid.points
        return means


def causal_factor(instance: Instance, demand: np.ndarray) -> np.ndarray:
    """E[F_t | D_0..D_{t-1}] for t = 0..T ([T + 1]) under the demand model that `instance` states: today's one factor
    with Poisson demand (GridFilter)."""
    return GridFilter(instance.lam, instance.beta, instance.rho).predictive_means(demand)
