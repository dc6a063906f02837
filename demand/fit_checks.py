"""What the fit report checks, and the level of each test under the fitted model: the model's statistics (variance,
lag-1 autocorrelation, correlations) against the history's, a drift of an item's mean between the halves of the
history (`mean_drift`), a periodic pattern in the items' means over the day of the week, the week or the month of the
year (`periodic_check`), and the hold-out check (the model fitted on the first 80% of the periods forecasting the last
20%: `holdout_check`). What the model cannot represent is said in the estimate's notes (demand/moment_estimator.py);
what it may represent wrongly is flagged here: statistics off, rho at its cap, a drift, a periodic pattern, a
hold-out coverage below its interval (of the items' cells, and of the total) and a cell that alone drives its item's
fit (`outlying_cells`)."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import chi2, norm, qmc

from demand.bootstrap import mean_off_diagonal
from demand.factor_smoother import smooth_factor
from demand.moment_estimator import Estimate, fit_moments, model_loadings
from envs.demand_law import demand_cdf, loading_rates, marginal_loglik, model_autocovariance, model_variance
from envs.instance import OVERDISPERSION_MAX, as_loadings

HOLDOUT_SHARE = 0.2


def training_periods(periods: int) -> int:
    """The first periods of a history that the hold-out checks fit on: all but the last HOLDOUT_SHARE."""
    return int(round(periods * (1 - HOLDOUT_SHARE)))


INTERVAL = 0.8
"""The central predictive interval of the hold-out check (80%)."""


CHECK_SE = 3.0
"""An observed statistic more than this many bootstrap standard errors from the model's value is flagged, and so is
a hold-out coverage this many standard errors below its nominal rate."""
RHO_AT_CAP = 1e-3
"""A fitted rho within this of RHO_MAX is flagged: the factor then stands in for a trend or a change of level."""
DRIFT_LEVEL = 0.01
"""Level of the drift test: the chance that a history of the fitted model flags the drift of any item's mean
(two-sided, Bonferroni over the items)."""


DISPERSION_LEVEL = 0.05
"""Level of the test that keeps an item's overdispersion in the instance: phi_i is kept where its estimate exceeds
z_{1 - DISPERSION_LEVEL / n} bootstrap standard errors (one-sided, Bonferroni over the items), else the item's demand
is Poisson: a history of Poisson demand keeps every phi_i = 0 with chance at least 95%."""


LIKELIHOOD_MARGIN = 3.0
"""`dispersion_likelihood` keeps an item's phi where its hold-out log-likelihood (summed over the hold-out's periods)
beats phi = 0 by more than this + log n: a likelihood ratio of 20 n. For a ratio whose alternative was fitted without the
hold-out, Markov's inequality gives each item a chance of at most 1 / (20 n) to pass by luck, 5% over the n items (the
periods' marginal laws stand in for their joint one, so that chance is approximate)."""


def dispersion_likelihood(demand: np.ndarray, fitted: Estimate) -> dict:
    """Whether each item's overdispersion earns its place out of sample, and whether the factors do: `fitted` the model
    fitted on the first 80% of the periods (`training_periods`, as holdout_check fits it), and the last 20%'s log-likelihood
    (`marginal_loglik`) with each item's fitted phi_i (`with_phi`), with phi_i = 0 (`poisson`), and of overdispersion alone
    (`alone`: no loading, phi_i from the item's own mean and variance on the first 80%, `alone_phi`). `keeps` [n]: phi_i
    beats 0 by more than LIKELIHOOD_MARGIN + log n (a history whose variance the factors took for theirs, as independent
    heavy-tailed items are, keeps its overdispersion even where its bootstrap test cannot tell phi_i from 0).
    `factors_worse` [n]: overdispersion alone beats the model by the same margin, a flag."""
    n = demand.shape[1]
    train = training_periods(demand.shape[0])
    norms = np.sqrt((fitted.loadings**2).sum(axis=1))
    held = demand[train:]
    with_phi = marginal_loglik(held, fitted.lam, norms, fitted.overdispersion)
    poisson = marginal_loglik(held, fitted.lam, norms, np.zeros_like(fitted.lam))
    mean, variance = demand[:train].mean(axis=0), demand[:train].var(axis=0, ddof=1)
    alone_phi = np.clip(np.divide(variance - mean, mean**2, out=np.zeros(n), where=mean > 0), 0.0, OVERDISPERSION_MAX)
    alone = marginal_loglik(held, fitted.lam, np.zeros(n), alone_phi)
    margin = LIKELIHOOD_MARGIN + math.log(n)
    return {
        "with_phi": with_phi,
        "poisson": poisson,
        "alone": alone,
        "alone_phi": alone_phi,
        "margin": margin,
        "keeps": (fitted.overdispersion > 0) & (with_phi > poisson + margin),
        "factors_worse": alone > np.maximum(with_phi, poisson) + margin,
    }


def model_correlation(lam: np.ndarray, beta: np.ndarray, overdispersion: np.ndarray | None = None) -> np.ndarray:
    """[n, n] the correlation of D_i,t and D_j,t the model implies: Cov = lam_i lam_j (exp(beta_i . beta_j) - 1) off the
    diagonal, the variances `model_variance`."""
    loadings = as_loadings(beta)
    cov = np.outer(lam, lam) * np.expm1(loadings @ loadings.T)
    sd = np.sqrt(model_variance(lam, loadings, overdispersion))
    correlation = cov / np.outer(sd, sd)
    np.fill_diagonal(correlation, 1.0)
    return correlation


def model_statistics(
    lam: np.ndarray, beta: np.ndarray, rho: float, overdispersion: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, float]:
    """(variance [n], lag-1 autocorrelation [n], mean cross-item correlation over i < j) the model implies (`beta` [n]
    for one factor or the loadings [n, k])."""
    norm2 = (as_loadings(beta) ** 2).sum(axis=1)
    var = model_variance(lam, beta, overdispersion)
    acf = lam**2 * np.expm1(norm2 * rho) / var
    return var, acf, mean_off_diagonal(model_correlation(lam, beta, overdispersion))


def mean_drift(
    demand: np.ndarray, lam: np.ndarray, beta: np.ndarray, rho: float, overdispersion: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(d [n], sd [n]): the mean of the last T // 2 periods minus that of the first T // 2, and its standard deviation
    under the model, Var d_i = sum_{s,t} w_s w_t Cov(D_i,s, D_i,t) with w = +-1 / (T // 2) and the model's
    autocovariances (`model_autocovariance`)."""
    periods = demand.shape[0]
    half = periods // 2
    w = np.zeros(periods)
    w[:half], w[periods - half :] = -1.0 / half, 1.0 / half
    pairs = np.correlate(w, w, "full")[periods - 1 :]  # [T] sum_t w_t w_t+k
    autocov = model_autocovariance(lam, beta, rho, overdispersion, periods)  # [T, n]
    variance = pairs[0] * autocov[0] + 2 * pairs[1:] @ autocov[1:]
    return demand[periods - half :].mean(axis=0) - demand[:half].mean(axis=0), np.sqrt(variance)


SEASONS = {
    "1 day": ("day of the week", 7, "week"),
    "7 days": ("week of the year", 52, "year"),
    "1 month": ("month of the year", 12, "year"),
}
"""The calendar season checked at each step (History.step): its name, its number of seasons S and the cycle they make up."""
SEASON_CYCLES = 3
"""The periodic check runs where every season holds at least this many periods: a weekly history of 3 years (156
weeks) for the week of the year; a daily history's day of the week and a monthly one's month of the year always do
(MIN_PERIODS)."""
SEASON_LEVEL = 0.01
"""Level of the periodic check: the chance that a history of the fitted model flags a periodic pattern in any item's
mean (chi-square, Bonferroni over the items)."""


def calendar_seasons(step: str, periods: list[str]) -> np.ndarray | None:
    """Each period's season [T] in 0..S-1 (SEASONS) of a history at `step` whose period labels are `periods`: the day
    of the week of a daily history (Monday 0), the week of the year of a weekly one (the day of the year // 7; the
    year's last day or two fall in week 51), the month of the year of a monthly one; None at any other step."""
    if step not in SEASONS:
        return None
    dates = np.array(periods, dtype="datetime64[D]")
    if step == "1 day":
        return (dates.astype(np.int64) + 3) % 7  # 1970-01-01 was a Thursday
    if step == "7 days":
        return np.minimum((dates - dates.astype("datetime64[Y]")).astype(np.int64) // 7, 51)
    return dates.astype("datetime64[M]").astype(np.int64) % 12


def season_means(demand: np.ndarray, season: np.ndarray, seasons: int) -> tuple[np.ndarray, np.ndarray]:
    """(each season's mean demand [S, n], its number of periods [S]) of a history `demand` [T, n] whose periods fall in
    the seasons `season` [T]."""
    indicator = (season == np.arange(seasons)[:, None]).astype(np.float64)  # [S, T]
    counts = indicator.sum(axis=1)
    return indicator @ demand / counts[:, None], counts


def season_statistic(
    demand: np.ndarray, season: np.ndarray, seasons: int, lam: np.ndarray, beta: np.ndarray, rho: float, overdispersion=None
) -> np.ndarray:
    """Q [n], each item's Wald statistic of equal season means: Q_i = (C y_i)^T (C Sigma_i C^T)^-1 C y_i, y_i [S] its demand
    summed per season, C [S - 1, S] the contrasts of each season's mean with the last's, Sigma_i = sum_l gamma_i(l) G_l its
    model covariance (gamma_i: `model_autocovariance`; G_l [S, S]: pairs of periods l apart by their seasons, both orders for
    l >= 1). Chi-square on S - 1 degrees of freedom under the model, as far as the season means are normal."""
    periods, n = demand.shape
    pairs = np.stack(
        [np.bincount(season[: periods - lag] * seasons + season[lag:], minlength=seasons**2) for lag in range(periods)]
    ).reshape(periods, seasons, seasons)
    pairs = pairs + np.concatenate([np.zeros((1, seasons, seasons), np.int64), pairs[1:].transpose(0, 2, 1)])  # G_l
    autocov = model_autocovariance(lam, beta, rho, overdispersion, periods)  # [T, n]
    sigma = (autocov.T @ pairs.reshape(periods, -1)).reshape(n, seasons, seasons)
    means, counts = season_means(demand, season, seasons)
    contrast = np.hstack([np.diag(1.0 / counts[:-1]), np.full((seasons - 1, 1), -1.0 / counts[-1])])  # [S - 1, S]
    contrasts = (means[:-1] - means[-1]).T  # [n, S - 1] = C y_i
    covariance = contrast @ sigma @ contrast.T  # [n, S - 1, S - 1]
    return np.einsum("ns,ns->n", contrasts, np.linalg.solve(covariance, contrasts[..., None])[..., 0])


def periodic_check(demand: np.ndarray, step: str, periods: list[str], model: Estimate) -> dict:
    """The test of a periodic pattern in the items' means: `season_statistic` at the model's parameters against its
    chi-square quantile at level SEASON_LEVEL over the items, where the history's step has a calendar season
    (`calendar_seasons`) and every season holds at least SEASON_CYCLES periods; with rho fitted again (same k) to the
    history with each item's season means divided out (a multiplicative profile: what the pattern does to rho)."""
    season = calendar_seasons(step, periods)
    if season is None:
        return {
            "season": None,
            "why_not": "integer periods have no calendar"
            if step.endswith(("period", "periods"))
            else f"no season is checked at a step of {step}",
        }
    name, seasons, cycle = SEASONS[step]
    counts = np.bincount(season, minlength=seasons)
    if counts.min() < SEASON_CYCLES:
        return {
            "season": name,
            "why_not": f"some {name.split(' of ')[0]} of the {cycle} occurs {counts.min()} time(s) in the history; the check needs each "
            f"{SEASON_CYCLES} times ({SEASON_CYCLES} {cycle}s)",
        }
    n = demand.shape[1]
    statistic = season_statistic(demand, season, seasons, model.lam, model_loadings(model), model.rho, model.overdispersion)
    threshold = float(chi2.ppf(1 - SEASON_LEVEL / n, seasons - 1))
    profile = (season_means(demand, season, seasons)[0] / demand.mean(axis=0))[season]  # [T, n]
    adjusted = np.divide(demand, profile, out=demand.copy(), where=profile > 0)
    return {
        "season": name,
        "seasons": seasons,
        "why_not": None,
        "statistic": statistic,
        "threshold": threshold,
        "off": statistic > threshold,
        "rho_without": fit_moments(adjusted, factors=model.factors).rho,
    }


def coverage_se(inside: np.ndarray) -> float:
    """Standard error of the mean of the hold-out's indicators inside [H, n] about the nominal INTERVAL, from the
    per-period coverage: Newey-West, Bartlett weights up to lag floor(4 (H / 100)^(2/9)) (the factor's forecast
    errors tie neighbouring periods together)."""
    per_period = inside.mean(axis=1) - INTERVAL  # [H]
    periods = per_period.size
    lags = min(int(4 * (periods / 100) ** (2 / 9)), periods - 1)
    autocov = [float(per_period[: periods - k] @ per_period[k:]) / periods for k in range(lags + 1)]
    return math.sqrt(max(autocov[0] + 2 * sum((1 - k / (lags + 1)) * autocov[k] for k in range(1, lags + 1)), 0.0) / periods)


OUTLIER_LEVEL = 1e-3
"""Level of the outlying-cell test: the chance that a history of the fitted model flags any of its cells (Bonferroni
over the items' cells)."""


def outlying_cells(demand: np.ndarray) -> list[tuple[int, int, float]]:
    """(item, period, p) of each item's largest cell whose tail p is below OUTLIER_LEVEL / (n T). p is the smallest upper
    tail P(D >= v) over the values v of the fixed ladder OUTLIER_LADDER^k up to the cell's own, v in the cell's place, each
    under the negative binomial of the mean of the item's other periods and the overdispersion of all its periods with v
    among them (Poisson where they show none): the cell's own dispersion is the most generous to it, and the minimum over
    a ladder that only grows with the cell makes the test monotone (a larger cell is never flagged less than a smaller one,
    which the cell's own dispersion alone breaks: it grows with the cell). p = 0 for any sale of an item whose other
    periods are all 0 (docs/fitting.md, "The fit report")."""
    periods, n = demand.shape
    demand = np.asarray(demand, dtype=np.float64)
    worst = demand.argmax(axis=0)  # [n]: under the other periods' mean, the largest cell has the smallest tail
    cell = demand[worst, np.arange(n)]
    others = demand.sum(axis=0) - cell  # the other periods' total and sum of squares
    squares = (demand**2).sum(axis=0) - cell**2
    mean = others / (periods - 1)
    rungs = math.ceil(math.log(max(float(cell.max()), 1.0)) / math.log(OUTLIER_LADDER)) + 1
    values = np.unique(np.floor(OUTLIER_LADDER ** np.arange(rungs)))[:, None]  # [G, 1]
    everything = (others + values) / periods  # [G, n]
    variance = (squares + values**2 - periods * everything**2) / (periods - 1)
    phi = np.clip(np.divide(variance - everything, everything**2, out=np.zeros_like(everything), where=everything > 0), 0.0, None)
    tail = np.where(mean > 0, 1.0 - demand_cdf(values - 1, np.where(mean > 0, mean, 1.0), phi), 0.0)
    p = np.where(values <= cell, tail, 1.0).min(axis=0)
    level = OUTLIER_LEVEL / (periods * n)
    return [(i, int(worst[i]), float(p[i])) for i in range(n) if p[i] < level]


OUTLIER_LADDER = 2 ** (1 / 16)
"""The ratio between the values that `outlying_cells` puts in a cell's place (about 4.4%)."""


QUASI_POINTS = 128
"""Points of the k-dimensional factor forecast (scrambled Sobol, k >= 2) over which the hold-out's total is averaged;
one factor uses the 20 Gauss-Hermite nodes."""


def holdout_check(demand: np.ndarray, seed: int = 0, factors: int = 1) -> dict:
    """Fit the model of `factors` = k on the first 80% of the periods, forecast the last 20% from the factors' filtered state
    there (F_{T0+h} ~ N(rho^h m, rho^2h P + (1 - rho^2h) I)) and return how often what happened lies in the central 80%
    predictive interval, per item and period and of the total over items, with standard errors. The interval is the randomised
    one (PIT u = P(D < d) + V P(D = d), V uniform), whose coverage is exactly 80% under the model (for the total, up to its
    two-moment match); docs/fitting.md, "The fit report". Its `dispersion` is `dispersion_likelihood` on the same fit."""
    periods = demand.shape[0]
    train = training_periods(periods)
    fitted = fit_moments(demand[:train], factors=factors)
    loadings, phi = fitted.loadings, fitted.overdispersion
    state = smooth_factor(demand[:train], fitted.lam, loadings, fitted.rho, phi)
    ahead = np.arange(1, periods - train + 1)
    decay = fitted.rho**ahead
    mean = decay[:, None] * state["last_mean"]  # [H, k]
    cov = decay[:, None, None] ** 2 * state["last_cov"] + (1 - decay[:, None, None] ** 2) * np.eye(fitted.factors)  # [H, k, k]
    nodes, weights = np.polynomial.hermite_e.hermegauss(20)
    weights = weights / weights.sum()
    exposure_mean = mean @ loadings.T  # [H, n]: beta_i . F's forecast mean and s.d.
    exposure_sd = np.sqrt(np.maximum(np.einsum("ij,hjl,il->hi", loadings, cov, loadings), 0.0))
    norm2 = (loadings**2).sum(axis=1)
    rate = fitted.lam * np.exp(exposure_mean[:, None] + exposure_sd[:, None] * nodes[:, None] - 0.5 * norm2)  # [H, Q, n]
    if fitted.factors == 1:
        total_points, total_weights = nodes[:, None], weights
    else:
        sobol = qmc.Sobol(fitted.factors, scramble=True, seed=np.random.default_rng([0x514D43, seed])).random(QUASI_POINTS)
        total_points, total_weights = norm.ppf(sobol), np.full(QUASI_POINTS, 1.0 / QUASI_POINTS)
    factor_points = mean[:, None] + np.einsum("hjl,ql->hqj", np.linalg.cholesky(cov), total_points)  # [H, Q', k]
    total_rates = loading_rates(fitted.lam, loadings, factor_points)  # [H, Q', n]
    total_rate = total_rates.sum(axis=2)
    total_phi = (phi * total_rates**2).sum(axis=2) / np.maximum(total_rate, 1e-300) ** 2
    held = demand[train:]
    rng = np.random.default_rng([0x484F4C44, seed])

    def pit(observed, rates_at, phi_at, w):  # observed [H, ...], rates_at [H, Q, ...], w [Q]
        w = w.reshape((1, -1) + (1,) * (rates_at.ndim - 2))
        below = (w * demand_cdf(observed[:, None] - 1, rates_at, phi_at)).sum(axis=1)  # P(D <= d - 1)
        upto = (w * demand_cdf(observed[:, None], rates_at, phi_at)).sum(axis=1)
        u = below + rng.uniform(size=below.shape) * (upto - below)
        low = (1 - INTERVAL) / 2
        return (u >= low) & (u <= 1 - low)

    inside = pit(held, rate, phi, weights)  # [H, n]
    total_inside = pit(held.sum(axis=1), total_rate, total_phi, total_weights)  # [H]
    predicted_mean = (weights[None, :, None] * rate).sum(axis=1)  # [H, n]
    return {
        "train_periods": train,
        "holdout_periods": periods - train,
        "interval": INTERVAL,
        "item_coverage": float(inside.mean()),
        "item_coverage_se": coverage_se(inside),
        "item_coverage_per_item": inside.mean(axis=0),
        "total_coverage": float(total_inside.mean()),
        "total_coverage_se": coverage_se(total_inside[:, None]),
        "observed_mean": held.mean(axis=0),
        "predicted_mean": predicted_mean.mean(axis=0),
        "dispersion": dispersion_likelihood(demand, fitted),
    }
