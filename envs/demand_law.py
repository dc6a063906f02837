"""The demand law, the one place that says how demand arises from the common factors: item i's rate given the
factors, eq. (conditional_demand_rate) at the item's exposure (envs.instance.exposure), and its demand given the
rate, eq. (conditional_demand): Poisson, or with overdispersion phi_i the negative binomial of mean rate and variance
rate + phi_i rate^2 (the gamma-Poisson mixture, docs/model.md). Everything that uses a rate, a draw, a probability or
a moment of demand asks this module (the simulator, the gym env, the MILP's scenarios, the DP and its certificate,
the tuned rules, the fit, its checks and the backtest's filter): a new demand model is written here.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from scipy.special import betainc, gammaln, logsumexp, pdtr

from envs.instance import Instance, TensorInstance, as_loadings, exposure, loading_norms, unit_directions

# ---- rates given the factors ---------------------------------------------------------------------


def demand_rate(lam, beta, factor):
    """lam_{i,t} = lam_i exp(beta_i F_t - beta_i^2 / 2), eq. (conditional_demand_rate).

    `factor` broadcasts against the trailing item axis: pass it with a trailing singleton axis.
    """
    exp = torch.exp if isinstance(factor, torch.Tensor) else np.exp
    return lam * exp(beta * factor - 0.5 * beta * beta)


def item_rates(instance: Instance | TensorInstance, factor):
    """lam_{i,t} of every item given F_t ([...] at k = 1, else [..., k]; NumPy for an Instance, torch for a
    TensorInstance): eq. (conditional_demand_rate) at item i's exposure u_i,t (envs.instance.exposure). [..., n]."""
    return demand_rate(instance.lam, instance.beta, exposure(instance.directions, factor))


def loading_rates(lam: np.ndarray, beta: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """lam_i exp(beta_i . F_t - |beta_i|^2 / 2), eq. (conditional_demand_rate) with k factors, [..., n]: `beta` [n] with
    `factor` [...] (one factor, `demand_rate` itself), or `beta` [n, k] with `factor` [..., k], through
    item i's exposure u_i,t and |beta_i| (envs.instance.exposure) as `item_rates` computes an instance's."""
    if beta.ndim == 1:
        return demand_rate(lam, beta, factor[..., None])
    exposures = exposure(unit_directions(beta), factor[..., 0] if beta.shape[1] == 1 else factor)  # F_t [...] at k = 1
    return demand_rate(lam, loading_norms(beta), exposures)


# ---- demand given the rate -----------------------------------------------------------------------


def conditional_variance(rate, overdispersion):
    """Var(D | rate) = rate + phi rate^2 (Poisson at phi = 0), elementwise."""
    return rate + overdispersion * rate * rate


def gamma_multiplier(overdispersion: np.ndarray, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """G_i ~ Gamma(1 / phi_i, phi_i), mean 1 and variance phi_i (G_i = 1 where phi_i = 0), for `shape` [..., n]: the
    rate multiplier that makes Poisson(rate G) the negative binomial of mean rate and variance rate + phi rate^2."""
    positive = overdispersion > 0
    concentration = np.where(positive, 1.0 / np.where(positive, overdispersion, 1.0), 1.0)
    return np.where(positive, rng.gamma(concentration, np.where(positive, overdispersion, 1.0), size=shape), 1.0)


def draw_demand(
    rate: np.ndarray, overdispersion: np.ndarray | None, rng: np.random.Generator, mixing_rng: np.random.Generator | None = None
) -> np.ndarray:
    """D_{i,t} given its rate ([..., n]): Poisson, eq. (conditional_demand), or, with overdispersion phi_i, the
    gamma-Poisson mixture Poisson(rate G_i) (`gamma_multiplier`), a negative binomial (docs/model.md). The multipliers
    come from `mixing_rng` (default `rng`): a stream of their own keeps each stream's draws in time order, so that a
    longer horizon extends the same path (`sample_paths`)."""
    if overdispersion is None:
        return rng.poisson(rate)
    return rng.poisson(rate * gamma_multiplier(overdispersion, np.shape(rate), rng if mixing_rng is None else mixing_rng))


def draw_demand_torch(rate: torch.Tensor, overdispersion: torch.Tensor | None, generator: torch.Generator) -> torch.Tensor:
    """`draw_demand`'s law in torch, every draw from `generator`: Poisson(rate G) with G ~ Gamma(1 / phi_i, phi_i) where
    phi_i > 0 (torch's own gamma sampler, torch.distributions.Gamma's). [..., n] like `rate`."""
    if overdispersion is not None:
        positive = overdispersion > 0
        safe = torch.where(positive, overdispersion, torch.ones_like(overdispersion))
        concentration = (1.0 / safe).expand_as(rate).contiguous()
        multiplier = torch._standard_gamma(concentration, generator=generator) * safe
        rate = rate * torch.where(positive, multiplier, torch.ones_like(multiplier))
    return torch.poisson(rate, generator=generator)


def period_laws(rates: np.ndarray, overdispersion: float):
    """scipy's law of one period's demand at each rate [M, 1], and the law whose cdf at m - 1 gives E[D; D <= m] / rate
    (Poisson: itself; negative binomial: the shape one larger), for a pmf split onto a coarse lattice (policies.dp_optimal.demand_law)."""
    if overdispersion > 0:
        shape, success = 1.0 / overdispersion, 1.0 / (1.0 + overdispersion * rates[:, None])
        return stats.nbinom(shape, success), stats.nbinom(shape + 1.0, success)
    return stats.poisson(rates[:, None]), stats.poisson(rates[:, None])


def demand_top(rates: np.ndarray, overdispersion: float, tail: float) -> int:
    """dmax: one past the point where one period's demand law ([M] rates, `demand_law`) has an upper tail below `tail`
    at the largest rate."""
    if overdispersion > 0:
        return int(stats.nbinom.isf(tail, 1.0 / overdispersion, 1.0 / (1.0 + overdispersion * rates.max()))) + 1
    return int(stats.poisson.isf(tail, rates.max())) + 1


def demand_cdf(count: np.ndarray, rate: np.ndarray, overdispersion) -> np.ndarray:
    """P(D <= count) for D Poisson(rate) (phi = 0) or negative binomial of mean rate and variance rate + phi rate^2:
    the regularised incomplete beta I_p(1 / phi, count + 1), p = 1 / (1 + phi rate). Broadcasts; 0 below count 0."""
    phi = np.broadcast_to(
        np.asarray(overdispersion, dtype=np.float64), np.broadcast_shapes(np.shape(count), np.shape(rate), np.shape(overdispersion))
    )
    count = np.broadcast_to(count, phi.shape)
    safe = np.maximum(count, 0)
    dispersed = phi > 0
    shape = 1.0 / np.where(dispersed, phi, 1.0)
    value = np.where(dispersed, betainc(shape, safe + 1.0, 1.0 / (1.0 + np.where(dispersed, phi, 0.0) * rate)), pdtr(safe, rate))
    return np.where(count >= 0, value, 0.0)


def log_pmf(demand, rate, overdispersion):
    """log P(D = demand | rate), elementwise: the Poisson's at phi = 0, else the negative binomial's, lgamma(d + r) -
    lgamma(r) - lgamma(d + 1) - r log(1 + phi rate) + d log(phi rate / (1 + phi rate)) with r = 1 / phi."""
    rate = np.maximum(rate, 1e-300)
    phi = np.broadcast_to(overdispersion, np.broadcast_shapes(np.shape(rate), np.shape(overdispersion)))
    safe = np.where(phi > 0, phi, 1.0)
    shape, spread = 1.0 / safe, np.log1p(safe * rate)
    coefficient = gammaln(demand + shape) - gammaln(shape) - gammaln(demand + 1)
    negative_binomial = coefficient - shape * spread + demand * (np.log(safe * rate) - spread)
    poisson = demand * np.log(rate) - rate - gammaln(demand + 1)
    return np.where(phi > 0, negative_binomial, poisson)


def marginal_loglik(demand: np.ndarray, lam: np.ndarray, norms: np.ndarray, overdispersion: np.ndarray) -> np.ndarray:
    """Each item's log-likelihood of its periods [T, n] under its marginal law, summed over the periods [n]: the rate
    lam_i exp(|beta_i| z - |beta_i|^2 / 2) with z ~ N(0, 1) the stationary exposure (20 Gauss-Hermite nodes), and
    `log_pmf` given it."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(20)
    rate = demand_rate(lam, norms, nodes[:, None])  # [Q, n]
    phi = np.broadcast_to(overdispersion, lam.shape)
    return logsumexp(log_pmf(demand[:, None, :], rate, phi) + np.log(weights / weights.sum())[:, None], axis=1).sum(axis=0)


def periods_quantile(level: float, rate: np.ndarray, overdispersion: np.ndarray, periods) -> np.ndarray:
    """The `level` quantile of the demand of `periods` periods at a constant rate (the factor held still): Poisson(periods
    rate) at phi = 0, else the negative binomial of shape periods / phi (a sum of independent periods' laws)."""
    return np.where(
        overdispersion > 0,
        stats.nbinom.ppf(level, periods / np.maximum(overdispersion, 1e-300), 1.0 / (1.0 + overdispersion * rate)),
        stats.poisson.ppf(level, periods * rate),
    )


def score_and_curvature(demand, rate, overdispersion):
    """d/d eta and -d^2/d eta^2 of the log-likelihood of D given the log-rate eta = log rate: (D - rate) / (1 + phi rate)
    and rate (1 + phi D) / (1 + phi rate)^2 for the negative binomial of mean rate and variance rate + phi rate^2,
    which are D - rate and rate for the Poisson of eq. (conditional_demand) at phi = 0."""
    spread = 1.0 + overdispersion * rate
    return (demand - rate) / spread, rate * (1.0 + overdispersion * demand) / spread**2


def log_likelihood(demand, log_rate, overdispersion):
    """The log-likelihood of D given its log-rate eta, less the terms without eta: D eta - (D + 1 / phi) log(1 + phi
    e^eta) for the negative binomial (phi > 0), D eta - e^eta for the Poisson (phi = 0, its limit). Summed over items."""
    rate = np.exp(log_rate)
    positive = overdispersion > 0
    safe = np.where(positive, overdispersion, 1.0)
    penalty = np.where(positive, (demand + 1.0 / safe) * np.log1p(safe * rate), rate)
    return (demand * log_rate - penalty).sum(axis=-1)


# ---- moments over the factor's law --------------------------------------------------------------


def model_variance(lam: np.ndarray, beta: np.ndarray, overdispersion: np.ndarray | None = None) -> np.ndarray:
    """Var D_i,t = lam_i + lam_i^2 ((1 + phi_i) exp(|beta_i|^2) - 1) [n], the model's (`beta` [n] for one factor or the
    loadings [n, k])."""
    phi = 0.0 if overdispersion is None else overdispersion
    return lam + lam**2 * ((1 + phi) * np.exp((as_loadings(beta) ** 2).sum(axis=1)) - 1)


def model_autocovariance(lam: np.ndarray, beta: np.ndarray, rho: float, overdispersion: np.ndarray | None, periods: int) -> np.ndarray:
    """[T, n] Cov(D_i,t, D_i,t+l) of the model at lags l = 0..T-1: lam_i^2 (exp(|beta_i|^2 rho^l) - 1), plus
    lam_i + phi_i lam_i^2 exp(|beta_i|^2) at l = 0 (`beta` [n] for one factor or the loadings [n, k])."""
    lag = np.arange(periods)[:, None]
    norm2 = (as_loadings(beta) ** 2).sum(axis=1)
    phi = 0.0 if overdispersion is None else overdispersion
    return lam**2 * np.expm1(norm2 * rho**lag) + (lag == 0) * (lam + phi * lam**2 * np.exp(norm2))


class DemandMoments:
    """Mean and variance of D_t + ... + D_{t+p-1} for p = 1..J, per item, given F_t or stationary, exact under eq.
    (conditional_demand_rate): rate lam exp(beta u_j - beta^2/2), beta = |beta_i|, u_j = u_{i,t+j} the item's exposure
    (envs.instance.exposure, an AR(1) of unit variance), overdispersion phi. With A_j = E[u_j], C_jk = Cov(u_j, u_k)
    (given F_t: A_j = rho^j u_{i,t}, C_jk = rho^|j-k| - rho^(j+k); stationary: A_j = 0, C_jk = rho^|j-k|) and
    m_j = exp(beta A_j + beta^2 (C_jj - 1) / 2),
        E[sum_j D_j] = lam sum_j m_j,
        Var(sum_j D_j) = lam^2 sum_jk m_j m_k (exp(beta^2 C_jk) - 1) + lam sum_j m_j + phi lam^2 sum_j m_j^2 exp(beta^2 C_jj)."""

    def __init__(self, instance: TensorInstance, periods: int):
        self.instance = instance
        j = torch.arange(periods, device=instance.device, dtype=instance.dtype)
        self.rho_j = instance.rho**j  # [J]
        lag = (j[:, None] - j[None, :]).abs()
        stationary_cov = instance.rho**lag  # [J, J]
        conditional_cov = stationary_cov - instance.rho ** (j[:, None] + j[None, :])
        beta2 = (instance.beta**2)[:, None, None]  # [n, 1, 1]
        self._gain = {  # exp(beta^2 C) - 1: [n, J, J]
            aware: torch.expm1(beta2 * cov) for aware, cov in ((False, stationary_cov), (True, conditional_cov))
        }
        self._gain_below = {aware: torch.tril(gain, -1) for aware, gain in self._gain.items()}  # G_jk for k < j
        self._var_drift = {aware: torch.diagonal(cov) - 1 for aware, cov in ((False, stationary_cov), (True, conditional_cov))}
        self._stationary = self._cumulative(None)  # constant: computed once

    def over(self, factor: torch.Tensor | None, batch: int, *periods: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per entry of `periods` ([B or 1, n], long, 1..J): the mean and s.d. of the demand over that many
        periods for each of `batch` rows, given each row's F_t (factor [B], or [B, k] with k factors) or stationary
        (None): [B, n] each."""
        if factor is None:
            (cum_mean, cum_var), row = self._stationary, torch.zeros(batch, dtype=torch.long, device=self.rho_j.device)
        else:  # rows that share an episode share F_t (tuning runs many candidates per episode)
            distinct, row = distinct_rows(factor)
            cum_mean, cum_var = self._cumulative(self.instance.exposure(distinct))
        n, J = cum_mean.shape[1:]
        start = (row[:, None] * n + torch.arange(n, device=row.device)[None, :]) * J - 1  # flat index of period 0: [B, n]
        return [(cum_mean.take(start + p), cum_var.take(start + p).clamp_min(0).sqrt()) for p in periods]

    def _cumulative(self, exposure: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Cumulative means and variances [U, n, J] given the exposures u_{i,t} ([U, n], or [U, 1] for every item
        alike), or stationary (None, U = 1)."""
        inst = self.instance
        aware = exposure is not None
        mean_u = (exposure[:, :, None] * self.rho_j) if aware else torch.zeros_like(self.rho_j)[None, None]  # A_j: [U, n or 1, J]
        beta = inst.beta[None, :, None]  # [1, n, 1]
        m = torch.exp(beta * mean_u + 0.5 * beta**2 * self._var_drift[aware])  # [U, n, J]
        gain = self._gain[aware]
        cross = torch.einsum("njk,bnk->bnj", self._gain_below[aware], m)  # sum_{k<j} G_jk m_k
        lam = inst.lam[None, :, None]
        increment = lam * m + lam**2 * (2 * m * cross + m * m * torch.diagonal(gain, dim1=-2, dim2=-1))
        if inst.overdispersion is not None:  # phi E[rate_j^2] = phi lam^2 m_j^2 (1 + G_jj)
            increment = increment + inst.overdispersion[None, :, None] * lam**2 * m * m * (1 + torch.diagonal(gain, dim1=-2, dim2=-1))
        return lam * m.cumsum(-1), increment.cumsum(-1)


def distinct_rows(factor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct, row) with factor = distinct[row], for factors [B] or [B, k]. Rows of k factors are keyed on their first
    coordinate (torch.unique over whole rows is several times slower), checked, and keyed on whole rows only where two
    distinct rows share a first coordinate."""
    if factor.dim() == 1:
        return torch.unique(factor, return_inverse=True)
    first, row = torch.unique(factor[:, 0], return_inverse=True)
    distinct = factor.new_zeros(first.shape[0], factor.shape[1]).index_copy_(0, row, factor)
    if torch.equal(distinct[row], factor):
        return distinct, row
    return torch.unique(factor, dim=0, return_inverse=True)
