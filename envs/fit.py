"""Fit the demand model of docs/model.md to a user's sales history (platform/fit.py; docs/fitting.md).

Model, eqs. (factor_process), (conditional_demand): D_{i,t} | F_t ~ Poisson(lam_i exp(beta_i F_t - beta_i^2 / 2)) with
F a stationary AR(1), F_{t+1} = rho F_t + sqrt(1 - rho^2) eps. Its moments (E exp(beta F - beta^2/2) = 1):

    E D_i = lam_i,   Cov(D_{i,t}, D_{j,t+k}) = lam_i lam_j (exp(beta_i beta_j rho^k) - 1) + 1{i = j, k = 0} lam_i.

So with m_i the sample mean and C^k the sample lag-k covariance matrix, the normalised moments
M^k_ij = log(1 + (C^k_ij - 1{i = j, k = 0} m_i) / (m_i m_j)) equal rho^k beta_i beta_j for every pair (i, j) and lag
k = 0..LAGS. The estimator (`estimate`): lam_i = m_i, and (beta, rho) minimise the weighted least squares
sum_k sum_ij (w_i w_j)^2 (M^k_ij - rho^k beta_i beta_j)^2 over all pairs and lags, w_i = m_i / sd_i: the squared
residual of w_i w_j M^k_ij, which is about the lag-k correlation of items i and j (each pair on the scale of a
correlation). It is consistent: the factor is a stationary, mixing Gaussian AR(1) and demand is a
function of it and independent noise, so m and C^k converge almost surely to their expectations; at those the
objective is zero exactly at the true (beta, rho) and positive elsewhere (beta_i beta_j for all pairs fixes beta
>= 0; the ratio of lag k + 1 to lag k fixes rho when some beta_i > 0), and the minimiser is continuous in the
moments. With b_i = w_i beta_i and A(rho) = sum_k rho^k N^k, N^k_ij = w_i w_j sym(M^k)_ij, the minimiser over b
for a given rho is the leading eigenvector of A(rho) scaled to |b|^2 = lambda_max / sum_k rho^2k (LAPACK up to
n = 64, power iteration above, O(n^2) per step), and rho given b minimises a polynomial on [0, RHO_MAX]; the two
steps alternate until rho settles, at most ALTERNATIONS times (`Estimate.converged` says whether it did).

Standard errors: a parametric bootstrap (`bootstrap`): histories drawn from the fitted model, fitted again.
The factor path: the posterior mode of F given the history and the fitted parameters (`smooth_factor`, Newton's
method as an iterated Kalman smoother), with its Laplace standard deviation.

What the model cannot represent is said in `Estimate.notes`: an item whose variance is at most its mean
(underdispersed) or whose loading comes out negative gets beta_i = 0. What it may represent wrongly is flagged in
the report: statistics off, rho at its cap, a drift of an item's mean between the halves of the history
(`mean_drift`) and a hold-out coverage below its interval.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import re
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import pdtr
from scipy.stats import norm
from tqdm.auto import tqdm

from envs import validate
from envs.exogenous import FACTOR_BOUND, demand_rate, factor_step, innovation_scale
from envs.instance import FIELD_RANGES, InstanceError, check_item_column, exact_keys, number_column, read_table

LAGS = 4
"""Lags k = 0..LAGS of the moment equations: lag 0 fixes beta, lags >= 1 fix rho (their ratio) and add precision."""
RHO_MAX = 0.99
"""The fitted rho lies in [0, RHO_MAX]: the instance needs rho < 1 (a unit root has no stationary factor)."""
ALTERNATIONS = 50
"""Most alternations of the estimator's two steps (beta's direction for rho, rho for that direction)."""
MIN_PERIODS = 50
"""Fewest periods a history may have: with T periods a lag-1 autocorrelation has standard error about 1/sqrt(T),
0.14 at T = 50, and the hold-out check keeps 20% (10 periods) aside."""
HOLDOUT_SHARE = 0.2
INTERVAL = 0.8
"""The central predictive interval of the hold-out check (80%)."""
CONFIDENCE = 0.95
"""Level of the parameter intervals (estimate +- 1.96 bootstrap standard errors, within the parameter's range)."""
REPLICATES = 100
"""Default number of bootstrap replicates: standard errors to about 7% (relative) at a small cost."""
CHECK_SE = 3.0
"""An observed statistic more than this many bootstrap standard errors from the model's value is flagged, and so is
a hold-out coverage this many standard errors below its nominal rate."""
RHO_AT_CAP = 1e-3
"""A fitted rho within this of RHO_MAX is flagged: the factor then stands in for a trend or a change of level."""
DRIFT_LEVEL = 0.01
"""Level of the drift test: the chance that a history of the fitted model flags the drift of any item's mean
(two-sided, Bonferroni over the items)."""
HISTORY_COLUMNS = ("item", "period", "demand")
ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
COST_COLUMNS = ("item", "h", "b", "lead")
"""The cost table's required columns; `qbar` is optional (default QBAR_PER_LAM lam_i, the paper's rule)."""
QBAR_PER_LAM = 4.0
BETA_MAX = FIELD_RANGES["beta"][2]


# ---- reading and checking the history ---------------------------------------------------------------------------


@dataclass(frozen=True)
class History:
    """demand [T, n] (float64 counts), item names (the cost table's order), period labels (T strings), the step
    ('1 period', '1 day', '7 days', '1 month') and the SHA-256 of the file."""

    demand: np.ndarray
    items: list[str]
    periods: list[str]
    step: str
    sha256: str


@dataclass(frozen=True)
class Costs:
    items: list[str]
    h: np.ndarray
    b: np.ndarray
    lead: np.ndarray
    qbar: np.ndarray | None


def _bad(path, item, period, what: str) -> InstanceError:
    return InstanceError(f"history '{path}' item '{item}' period {period}: {what}")


def _file_sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _periods(column, path, items: np.ndarray) -> tuple[np.ndarray, str, callable]:
    """(integer period keys, unit, label of a key): integers as they are, dates as days since 1970-01-01, or as
    months when every date falls on the same day of the month at least 28 days apart."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        column = _text_periods(column, path, items)
        kind = column.type
    if pa.types.is_integer(kind):
        return column.to_numpy().astype(np.int64), "period", str
    if pa.types.is_date(kind) or pa.types.is_timestamp(kind):
        days = pc.cast(pc.cast(column, pa.timestamp("s")), pa.int64()).to_numpy() // 86_400
        dates = days.astype("datetime64[D]")
        months = dates.astype("datetime64[M]")
        day_of_month = (dates - months).astype(np.int64)
        distinct = np.unique(days)
        if np.all(day_of_month == day_of_month[0]) and distinct.size > 1 and np.diff(distinct).min() >= 28:
            day = int(day_of_month[0])
            return months.astype(np.int64), "month", lambda m: str(np.datetime64(int(m), "M").astype("datetime64[D]") + day)
        return days, "day", lambda d: str(np.datetime64(int(d), "D"))
    first = column.to_pylist()[0]
    raise InstanceError(
        f"history '{path}' column 'period': expected consecutive integers or dates (YYYY-MM-DD) at one frequency, "
        f"got {kind} values (first: {first!r} for item '{items[0]}')"
    )


def _text_periods(column, path, items: np.ndarray):
    """A text period column (a Parquet string column, or a CSV column with a value that is not a date or an integer) as
    dates (YYYY-MM-DD) or integers, whichever its first value is; an InstanceError naming the first row that is not."""
    import pyarrow as pa

    values = column.to_pylist()
    as_dates = bool(ISO_DATE.fullmatch(values[0].strip()))
    parsed = []
    for row, value in enumerate(values):
        text = value.strip()
        try:
            period = (datetime.date.fromisoformat(text) if ISO_DATE.fullmatch(text) else None) if as_dates else int(text)
        except ValueError:  # 2024-02-30, or not an integer
            period = None
        if period is None:
            expected = "a date (YYYY-MM-DD) of the calendar, like the history's first period" if as_dates else "an integer"
            raise InstanceError(
                f"history '{path}' item '{items[row]}' data row {row + 1}: column 'period': expected {expected}, got {value!r} "
                "(periods are consecutive integers or dates at one frequency)"
            )
        parsed.append(period)
    return pa.array(parsed, type=pa.date32() if as_dates else pa.int64())


def _is_number_text(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def read_history(path) -> tuple[np.ndarray, np.ndarray, np.ndarray, str, callable, str]:
    """Check a long-form history (columns item, period, demand) row by row; return (item names [R], period keys [R],
    demand [R], unit, period label, sha256). Every refusal names the item and the period."""
    import pyarrow as pa

    header = "a header line item,period,demand and one row per item and period"
    path, table = read_table(path, "history", header, {"item": pa.string()})
    exact_keys(set(table.column_names), set(HISTORY_COLUMNS), f"history '{path}' columns")
    if table.num_rows == 0:
        raise InstanceError(f"history '{path}' has no rows; expected {header}")
    item_column = table.column("item").cast(pa.string())
    if item_column.null_count:
        row = int(np.argmax(item_column.is_null().to_numpy(zero_copy_only=False))) + 1
        raise InstanceError(f"history '{path}' data row {row}: the item is missing")
    items = np.asarray(item_column.to_pylist(), dtype=object)
    period_column = table.column("period")
    if period_column.null_count:
        row = int(np.argmax(period_column.is_null().to_numpy(zero_copy_only=False)))
        raise InstanceError(f"history '{path}' item '{items[row]}' data row {row + 1}: the period is missing")
    keys, unit, label = _periods(period_column, path, items)
    demand_column = table.column("demand")
    if not (pa.types.is_integer(demand_column.type) or pa.types.is_floating(demand_column.type)):
        values = demand_column.to_pylist()
        row = next((r for r, v in enumerate(values) if not _is_number_text(v)), 0)
        raise _bad(path, items[row], label(keys[row]), f"demand: expected a non-negative integer, got {values[row]!r}")
    demand = demand_column.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls become NaN
    bad = ~np.isfinite(demand) | (demand < 0) | (demand != np.round(demand))
    if bad.any():
        row = int(np.argmax(bad))
        got = "nothing (a missing value)" if np.isnan(demand[row]) else f"{demand[row]:g}"
        raise _bad(path, items[row], label(keys[row]), f"demand: expected a non-negative integer (units sold), got {got}")
    return items, keys, demand, unit, label, _file_sha256(path)


def history_matrix(path) -> History:
    """The history as a complete [T, n] matrix: every item has one row in every period of one common grid from the
    first to the last period; items in order of first appearance."""
    items, keys, demand, unit, label, digest = read_history(path)
    names, first = np.unique(items, return_index=True)
    names = names[np.argsort(first)]
    code = {name: k for k, name in enumerate(names)}
    item_code = np.fromiter((code[x] for x in items), dtype=np.int64, count=items.size)
    order = np.lexsort((keys, item_code))
    item_code, keys, demand = item_code[order], keys[order], demand[order]
    same_item = item_code[1:] == item_code[:-1]
    gaps = np.diff(keys)
    duplicate = same_item & (gaps == 0)
    if duplicate.any():
        r = int(np.argmax(duplicate))
        raise _bad(
            path, names[item_code[r]], label(keys[r]), "a second row for the same item and period; write one row per item and period"
        )
    step_of_item = np.full(names.size, np.iinfo(np.int64).max)
    np.minimum.at(step_of_item, item_code[1:][same_item], gaps[same_item])
    step = int(np.bincount(np.minimum(step_of_item, 10**6)[step_of_item < np.iinfo(np.int64).max]).argmax()) if same_item.any() else 1
    word = {"period": "period", "day": "day", "month": "month"}[unit]
    mixed = np.flatnonzero((step_of_item != step) & (step_of_item < np.iinfo(np.int64).max))
    irregular = same_item & (gaps % step != 0)
    if mixed.size:  # an item recorded at another frequency than most: name its first period at that spacing
        k = int(mixed[0])
        irregular = same_item & (item_code[1:] == k) & (gaps == step_of_item[k])
    if irregular.any():
        r = int(np.argmax(irregular)) + 1
        raise _bad(
            path,
            names[item_code[r]],
            label(keys[r]),
            f"comes {gaps[r - 1]} {word}(s) after the item's previous period, while most items' periods are {step} {word}(s) apart: "
            "dates at mixed frequencies; give every item the same frequency",
        )
    start, end = int(keys.min()), int(keys.max())
    periods = (end - start) // step + 1
    index = (keys - start) // step
    counts = np.bincount(item_code, minlength=names.size)
    if (counts < periods).any():
        k = int(np.argmax(counts < periods))
        rows = np.flatnonzero(same_item & (item_code[1:] == k))  # gap r: from row r to row r + 1, both of item k
        spacing = gaps[rows]
        run = (spacing[:-2] != step) & (spacing[:-2] == spacing[1:-1]) & (spacing[1:-1] == spacing[2:])
        if run.any():  # three gaps in a row at another spacing than the step: a stretch at another frequency, not missing rows
            r = int(rows[np.argmax(run)]) + 1
            raise _bad(
                path,
                names[k],
                label(keys[r]),
                f"comes {gaps[r - 1]} {word}(s) after the item's previous period, and so do the next ones, while its other periods "
                f"are {step} {word}(s) apart: dates at mixed frequencies; give every period the same frequency (sum the finer "
                "periods into the coarser ones)",
            )
        present = np.zeros(periods, bool)
        present[index[item_code == k]] = True
        missing = start + step * int(np.argmin(present))
        raise _bad(
            path,
            names[k],
            label(missing),
            f"no row (the history runs from {label(start)} to {label(end)}); write 0 for a period without sales",
        )
    if periods < MIN_PERIODS:
        raise InstanceError(
            f"history '{path}': expected at least {MIN_PERIODS} periods, got {periods} ({label(start)} to {label(end)}) "
            f"(a lag-1 autocorrelation from T periods has standard error about 1/sqrt(T))"
        )
    matrix = np.zeros((periods, names.size))
    matrix[index, item_code] = demand
    silent = matrix.sum(axis=0) == 0
    if silent.any():
        k = int(np.argmax(silent))
        raise _bad(path, names[k], f"{label(start)} to {label(end)}", "no sales in any period; the model needs lam_i > 0 (remove the item)")
    names = list(names)
    unit_text = f"{step} {word}" + ("s" if step > 1 else "")
    return History(matrix, names, [label(start + step * t) for t in range(periods)], unit_text, digest)


def read_costs(path) -> Costs:
    """The cost table: columns item, h, b, lead and optionally qbar, one row per item."""
    import pyarrow as pa

    header = "a header line item,h,b,lead (and optionally qbar) and one row per item"
    path, table = read_table(path, "cost table", header, {"item": pa.string()})
    validate.keys(set(table.column_names), f"cost table '{path}' columns", {*COST_COLUMNS, "qbar"}, COST_COLUMNS, error=InstanceError)
    if table.num_rows == 0:
        raise InstanceError(f"cost table '{path}' has no rows; expected {header}")
    item_column = table.column("item").cast(pa.string())
    if item_column.null_count:
        raise InstanceError(f"cost table '{path}' column 'item': {item_column.null_count} missing values")
    items = item_column.to_pylist()
    seen = set()
    for item in items:
        if item in seen:
            raise InstanceError(f"cost table '{path}' item '{item}': a second row for the same item; write one row per item")
        seen.add(item)
    numbers = {
        name: np.asarray(number_column(table, name, path), dtype=np.float64)
        for name in ("h", "b", "lead", "qbar")
        if name in table.column_names
    }
    for name, values in numbers.items():  # the instance's ranges, said in the cost table's terms
        check_item_column(name, values, f"cost table '{path}' column '{name}'", lambda i: f"item '{items[i]}'")
    return Costs(items, numbers["h"], numbers["b"], numbers["lead"], numbers.get("qbar"))


def match_items(history_items: list[str], costs: Costs, history_path, costs_path) -> None:
    """Refuse an item in the history but not in the cost table, or the reverse, naming it."""
    in_costs = set(costs.items)
    for item in history_items:
        if item not in in_costs:
            raise InstanceError(f"history '{history_path}' item '{item}': not in the cost table '{costs_path}'; add its h, b, lead there")
    in_history = set(history_items)
    for item in costs.items:
        if item not in in_history:
            raise InstanceError(
                f"cost table '{costs_path}' item '{item}': not in the history '{history_path}'; every item needs a demand history"
            )


# ---- the estimator -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """lam [n], beta [n], rho, what the model could not represent (item index -> what was done and why), and
    whether the alternation converged (if not, beta is still the best for the rho returned)."""

    lam: np.ndarray
    beta: np.ndarray
    rho: float
    notes: dict[int, str] = field(default_factory=dict)
    converged: bool = True


def lagged_covariances(demand: np.ndarray, lags: int = LAGS, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """(m [n], C [lags + 1, n, n]): sample means and C^k_ij = (1/T) sum_t (D_i,t - m_i)(D_j,t+k - m_j)."""
    periods = demand.shape[0]
    mean = demand.mean(axis=0)
    centred = (demand - mean).astype(dtype)
    cov = np.stack([centred[: periods - k].T @ centred[k:] for k in range(lags + 1)]) / dtype(periods)
    return mean, cov


def estimate(mean: np.ndarray, cov: np.ndarray) -> Estimate:
    """The least-squares moment estimator of the module docstring, from m [n] and C [K + 1, n, n]."""
    n = mean.size
    var = np.diagonal(cov[0]).copy()
    notes = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in np.flatnonzero(~(var > mean)):
            notes[int(i)] = f"beta = 0: variance {var[i]:.3g} <= mean {mean[i]:.3g} (underdispersed; a factor can only add variance)"
    active = np.flatnonzero(var > mean)
    beta, rho, converged = np.zeros(n), 0.0, True
    if active.size:
        m = mean[active]
        normalised = cov[:, active][:, :, active] if active.size < n else cov.copy()  # [K + 1, a, a], then in place:
        normalised /= np.outer(m, m).astype(normalised.dtype)
        normalised[0].flat[:: active.size + 1] -= (1.0 / m).astype(normalised.dtype)  # the Poisson part of Var D_i
        np.maximum(normalised, -0.9, out=normalised)  # log(1 + x) needs x > -1: a covariance that negative is noise
        np.log1p(normalised, out=normalised)
        normalised[1:] = 0.5 * (normalised[1:] + normalised[1:].transpose(0, 2, 1))
        weight = m / np.sqrt(var[active])
        normalised *= np.outer(weight, weight).astype(normalised.dtype)
        b, rho, converged = _rank_one(normalised)
        beta[active] = np.minimum(b / weight, BETA_MAX)
        for j, i in enumerate(active):
            if b[j] <= 0:
                others = active[active != i]
                correlation = cov[0][i, others] / np.sqrt(var[i] * var[others]) if others.size else np.zeros(0)
                notes[int(i)] = (
                    f"beta = 0: its variance {var[i]:.3g} above its mean {mean[i]:.3g} is not shared with the other items through "
                    f"the common factor (its loading came out <= 0; its average correlation with them is {correlation.mean():+.2f}): "
                    "variance of its own (e.g. negative-binomial demand), or a move against them, which the model cannot represent"
                )
            elif b[j] / weight[j] > BETA_MAX:
                notes[int(i)] = f"beta = {BETA_MAX:g}: its loading {b[j] / weight[j]:.3g} is above the instance's upper bound"
        if not (beta > 0).any():
            rho = 0.0
    return Estimate(mean.copy(), beta, float(rho), notes, converged)


def _rank_one(normalised: np.ndarray) -> tuple[np.ndarray, float, bool]:
    """(b >= 0, rho, converged) minimising sum_k |N^k - rho^k b b^T|^2 (Frobenius), N [K + 1, n, n] symmetric per lag.

    For a given rho the minimum over b is sum_k |N^k|^2 - lambda^2 / c(rho), lambda the largest eigenvalue of
    A(rho) = sum_k rho^k N^k and c(rho) = sum_k rho^2k, at b = sqrt(lambda / c) v (v its unit eigenvector, positive
    for a positive factor structure; a negative entry is cut to 0). So rho maximises lambda^2 / c on [0, RHO_MAX].
    The two steps alternate (an ascent of lambda^2 / c) until rho moves less than 1e-6, at most ALTERNATIONS times;
    the eigenpair returned is always the one at the rho returned."""
    lags = np.arange(normalised.shape[0])

    def leading(rho: float, start: np.ndarray) -> tuple[float, np.ndarray]:
        a = normalised[0].copy()
        for k in lags[1:]:
            a += normalised.dtype.type(rho**k) * normalised[k]
        return _top_eigen(a, start)

    rho = 0.0
    value, v = leading(rho, np.ones(normalised.shape[1]) / math.sqrt(normalised.shape[1]))
    converged = lags.size == 1
    for _ in range(ALTERNATIONS if lags.size > 1 else 0):
        quad = np.array([float(v @ (nk @ v)) for nk in normalised])  # v^T N^k v
        new = float(minimize_scalar(_profile_loss, args=(lags, quad), bounds=(0.0, RHO_MAX), method="bounded", options={"xatol": 1e-7}).x)
        converged = abs(new - rho) < 1e-6
        if converged:
            break
        rho = new
        value, v = leading(rho, v)
    v = v if v.sum() >= 0 else -v
    return np.maximum(v, 0.0) * math.sqrt(max(value, 0.0) / float(np.sum(rho ** (2 * lags)))), rho, converged


def _profile_loss(r: float, lags: np.ndarray, quad: np.ndarray) -> float:
    """-(v^T A(r) v)^2 / c(r) for a fixed unit vector v, from quad_k = v^T N^k v."""
    return -(max(float(np.sum(r**lags * quad)), 0.0) ** 2) / float(np.sum(r ** (2 * lags)))


def _top_eigen(a: np.ndarray, start: np.ndarray, iterations: int = 300) -> tuple[float, np.ndarray]:
    """The largest eigenvalue of the symmetric `a` and its unit eigenvector: LAPACK for n <= 64, else power iteration
    warm-started at `start` (the profile over rho moves it little), with LAPACK's answer when power iteration ends on
    a negative eigenvalue (one of larger magnitude than the largest)."""
    if a.shape[0] <= 64:
        values, vectors = np.linalg.eigh(a)
        return float(values[-1]), vectors[:, -1]
    tol = 1e-10 if a.dtype == np.float64 else 1e-5  # what the precision allows
    v, value = (start / np.linalg.norm(start)).astype(a.dtype), 0.0
    for _ in range(iterations):
        w = a @ v
        new_value = float(v @ w)
        v = w / max(np.linalg.norm(w), 1e-300)
        if abs(new_value - value) <= tol * max(abs(new_value), 1e-300):
            break
        value = new_value
    if new_value < 0:
        values, vectors = np.linalg.eigh(a)
        return float(values[-1]), vectors[:, -1]
    return float(v @ a @ v), v


def fit_moments(demand: np.ndarray, dtype=np.float64) -> Estimate:
    return estimate(*lagged_covariances(demand, dtype=dtype))


# ---- standard errors ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bootstrap:
    """Replicates of the parameters (lam [R, n], beta [R, n], rho [R]) and of the observed statistics of the
    fit report (variance [R, n], lag-1 autocorrelation [R, n], average cross-item correlation [R])."""

    lam: np.ndarray
    beta: np.ndarray
    rho: np.ndarray
    variance: np.ndarray
    autocorrelation: np.ndarray
    cross_correlation: np.ndarray


def observed_statistics(cov: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(variance [n], lag-1 autocorrelation [n], mean correlation over pairs i < j) from C [K + 1, n, n]."""
    var = np.diagonal(cov[0]).copy()
    sd = np.sqrt(np.maximum(var, 1e-300))
    acf = np.diagonal(cov[1]) / sd**2
    return var, acf, _mean_off_diagonal(cov[0] / np.outer(sd, sd))


def _mean_off_diagonal(matrix: np.ndarray) -> float:
    n = matrix.shape[0]
    return float((matrix.sum() - np.trace(matrix)) / (n * (n - 1))) if n > 1 else float("nan")


def simulate_demand(lam: np.ndarray, beta: np.ndarray, rho: float, periods: int, rng: np.random.Generator) -> np.ndarray:
    """One demand path [T, n] of the model: F_0 ~ N(0, 1), then eq. (factor_process), and Poisson demand."""
    noise = rng.standard_normal(periods)
    factor = np.empty(periods)
    factor[0] = noise[0]
    for t in range(1, periods):
        factor[t] = factor_step(rho, factor[t - 1], noise[t])
    return rng.poisson(demand_rate(lam, beta, factor[:, None])).astype(np.float64)


def bootstrap(demand: np.ndarray, fitted: Estimate, replicates: int = REPLICATES, seed: int = 0, progress: bool = False) -> Bootstrap:
    """A parametric bootstrap: `replicates` histories of the same length drawn from the fitted model, each fitted
    again (float32 products: the bootstrap's own noise is far above their rounding). Their spread is the sampling
    distribution of every estimate and observed statistic if the model holds, also where the factor's persistence
    makes a history's mean wander (a resampling of periods in blocks misses that for rho near 1); whether the
    model holds is what the report's checks test against these spreads."""
    rng = np.random.default_rng([0x46495420, seed])
    rows = {name: [] for name in ("lam", "beta", "rho", "variance", "autocorrelation", "cross_correlation")}
    for _ in tqdm(range(replicates), desc="bootstrap", disable=not progress, leave=False):
        mean, cov = lagged_covariances(simulate_demand(fitted.lam, fitted.beta, fitted.rho, demand.shape[0], rng), dtype=np.float32)
        again = estimate(mean, cov)
        var, acf, cross = observed_statistics(cov)
        for name, value in zip(rows, (again.lam, again.beta, again.rho, var, acf, cross)):
            rows[name].append(value)
    return Bootstrap(**{name: np.asarray(value) for name, value in rows.items()})


def interval(estimate_value, se, low: float, high: float, z: float | None = None):
    """estimate +- z se (z of CONFIDENCE, two-sided), cut to the parameter's range [low, high]."""
    z = norm.ppf(0.5 + CONFIDENCE / 2) if z is None else z
    return np.clip(estimate_value - z * se, low, high), np.clip(estimate_value + z * se, low, high)


# ---- the factor path --------------------------------------------------------------------------------------------


def smooth_factor(demand: np.ndarray, lam: np.ndarray, beta: np.ndarray, rho: float, iterations: int = 50) -> dict:
    """Posterior mode of F_0..F_{T-1} given the history (Newton's method: each step is a Kalman filter and RTS
    smoother of the pseudo-observations of the Poisson log-likelihood linearised at the current path) with its
    Laplace standard deviation; also the filtered mean and variance of the last period (for forecasts)."""
    periods = demand.shape[0]
    path = np.zeros(periods)
    q = innovation_scale(rho) ** 2
    for _ in range(iterations):
        rate = demand_rate(lam, beta, path[:, None])  # [T, n]
        gradient = (beta * (demand - rate)).sum(axis=1)
        precision = (beta * beta * rate).sum(axis=1)
        info = precision * path + gradient  # precision x pseudo-observation
        filt_m, filt_p, pred_m, pred_p = (np.empty(periods) for _ in range(4))
        m, p = 0.0, 1.0  # F_0 ~ N(0, 1)
        for t in range(periods):
            if t:
                m, p = rho * filt_m[t - 1], rho * rho * filt_p[t - 1] + q
            pred_m[t], pred_p[t] = m, p
            filt_p[t] = 1.0 / (1.0 / p + precision[t])
            filt_m[t] = filt_p[t] * (m / p + info[t])
        smooth_m, smooth_p = filt_m.copy(), filt_p.copy()
        for t in range(periods - 2, -1, -1):
            gain = filt_p[t] * rho / pred_p[t + 1]
            smooth_m[t] = filt_m[t] + gain * (smooth_m[t + 1] - pred_m[t + 1])
            smooth_p[t] = filt_p[t] + gain * gain * (smooth_p[t + 1] - pred_p[t + 1])
        new = np.clip(path + np.clip(smooth_m - path, -2.0, 2.0), -FACTOR_BOUND, FACTOR_BOUND)  # damped: no overshoot
        done = np.max(np.abs(new - path)) < 1e-9
        path = new
        if done:
            break
    return {"mean": path, "sd": np.sqrt(smooth_p), "last_mean": float(filt_m[-1]), "last_var": float(filt_p[-1])}


# ---- the model's statistics, the drift test and the hold-out check ------------------------------------------------


def model_statistics(lam: np.ndarray, beta: np.ndarray, rho: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(variance [n], lag-1 autocorrelation [n], mean cross-item correlation over i < j) the model implies."""
    var = lam + lam**2 * np.expm1(beta**2)
    acf = lam**2 * np.expm1(beta**2 * rho) / var
    cov = np.outer(lam, lam) * np.expm1(np.outer(beta, beta))
    sd = np.sqrt(var)
    return var, acf, _mean_off_diagonal(cov / np.outer(sd, sd))


def mean_drift(demand: np.ndarray, lam: np.ndarray, beta: np.ndarray, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """(d [n], sd [n]): the mean of the last T // 2 periods minus that of the first T // 2, and its standard deviation
    under the model, Var d_i = sum_{s,t} w_s w_t Cov(D_i,s, D_i,t) with w = +-1 / (T // 2) and the lag-k
    autocovariance of the module docstring (k = |s - t|)."""
    periods = demand.shape[0]
    half = periods // 2
    w = np.zeros(periods)
    w[:half], w[periods - half :] = -1.0 / half, 1.0 / half
    pairs = np.correlate(w, w, "full")[periods - 1 :]  # [T] sum_t w_t w_t+k
    lag = np.arange(periods)[:, None]
    autocov = lam**2 * np.expm1(beta**2 * rho**lag) + (lag == 0) * lam  # [T, n]
    variance = pairs[0] * autocov[0] + 2 * pairs[1:] @ autocov[1:]
    return demand[periods - half :].mean(axis=0) - demand[:half].mean(axis=0), np.sqrt(variance)


def coverage_se(inside: np.ndarray) -> float:
    """Standard error of the mean of the hold-out's indicators inside [H, n] about the nominal INTERVAL, from the
    per-period coverage: Newey-West, Bartlett weights up to lag floor(4 (H / 100)^(2/9)) (the factor's forecast
    errors tie neighbouring periods together)."""
    per_period = inside.mean(axis=1) - INTERVAL  # [H]
    periods = per_period.size
    lags = min(int(4 * (periods / 100) ** (2 / 9)), periods - 1)
    autocov = [float(per_period[: periods - k] @ per_period[k:]) / periods for k in range(lags + 1)]
    return math.sqrt(max(autocov[0] + 2 * sum((1 - k / (lags + 1)) * autocov[k] for k in range(1, lags + 1)), 0.0) / periods)


def holdout_check(demand: np.ndarray, seed: int = 0) -> dict:
    """Fit on the first 80% of the periods, forecast the last 20% from the factor's filtered state at the end of
    the first part (F_{T0+h} ~ N(rho^h m, rho^2h P + 1 - rho^2h)), and count how often what happened lies in the
    central 80% predictive interval: per item and period, and of the total over items. Demand is discrete, so the
    interval is the randomised one (PIT u = P(D < d) + V P(D = d), V uniform, inside [0.1, 0.9]), whose coverage is
    exactly 80% under the model."""
    periods = demand.shape[0]
    train = int(round(periods * (1 - HOLDOUT_SHARE)))
    fitted = fit_moments(demand[:train])
    state = smooth_factor(demand[:train], fitted.lam, fitted.beta, fitted.rho)
    ahead = np.arange(1, periods - train + 1)
    decay = fitted.rho**ahead
    mean = decay * state["last_mean"]
    sd = np.sqrt(decay**2 * state["last_var"] + 1 - decay**2)
    nodes, weights = np.polynomial.hermite_e.hermegauss(20)
    weights = weights / weights.sum()
    factor = mean[:, None] + sd[:, None] * nodes  # [H, Q]
    rate = demand_rate(fitted.lam, fitted.beta, factor[:, :, None])  # [H, Q, n]
    held = demand[train:]
    rng = np.random.default_rng([0x484F4C44, seed])

    def pit(observed, rates):  # observed [H, ...], rates [H, Q, ...]
        w = weights.reshape((1, -1) + (1,) * (rates.ndim - 2))
        below = (w * np.where(observed[:, None] > 0, pdtr(np.maximum(observed[:, None] - 1, 0), rates), 0.0)).sum(axis=1)  # P(D <= d - 1)
        upto = (w * pdtr(observed[:, None], rates)).sum(axis=1)
        u = below + rng.uniform(size=below.shape) * (upto - below)
        low = (1 - INTERVAL) / 2
        return (u >= low) & (u <= 1 - low)

    inside = pit(held, rate)  # [H, n]
    total_inside = pit(held.sum(axis=1), rate.sum(axis=2))  # [H]
    predicted_mean = (weights[None, :, None] * rate).sum(axis=1)  # [H, n]
    return {
        "train_periods": train,
        "holdout_periods": periods - train,
        "interval": INTERVAL,
        "item_coverage": float(inside.mean()),
        "item_coverage_se": coverage_se(inside),
        "item_coverage_per_item": inside.mean(axis=0),
        "total_coverage": float(total_inside.mean()),
        "observed_mean": held.mean(axis=0),
        "predicted_mean": predicted_mean.mean(axis=0),
    }


# ---- the whole fit and its report --------------------------------------------------------------------------------


def fit_history(
    history_path,
    costs_path,
    K: float | None = None,
    gamma: float = 0.95,
    replicates: int = REPLICATES,
    seed: int = 0,
    progress: bool = False,
):
    """(Instance, report): every check of the inputs first, then the estimate, its bootstrap, the factor path,
    the fit checks and the hold-out check. K defaults to the paper family's 10 n."""
    from envs.instance import Instance

    costs = read_costs(costs_path)
    history = history_matrix(history_path)
    match_items(history.items, costs, history_path, costs_path)
    column = {name: k for k, name in enumerate(history.items)}
    history = History(history.demand[:, [column[x] for x in costs.items]], list(costs.items), history.periods, history.step, history.sha256)
    demand = history.demand
    n = demand.shape[1]
    mean, cov = lagged_covariances(demand)
    fitted = estimate(mean, cov)
    qbar = costs.qbar if costs.qbar is not None else QBAR_PER_LAM * fitted.lam
    source = {
        "fitted_by": "platform/fit.py",
        "history": str(history_path),
        "history_sha256": history.sha256,
        "cost_table": str(costs_path),
        "cost_table_sha256": _file_sha256(costs_path),
        "periods": len(history.periods),
        "first_period": history.periods[0],
        "last_period": history.periods[-1],
        "step": history.step,
        "item_names": history.items,
    }
    instance = Instance(
        h=costs.h, b=costs.b, lam=fitted.lam, beta=fitted.beta, lead=costs.lead, qbar=qbar,
        K=10.0 * n if K is None else K, gamma=gamma, rho=min(fitted.rho, RHO_MAX), source=source,
    )  # fmt: skip
    boot = bootstrap(demand, fitted, replicates, seed, progress)
    factor = smooth_factor(demand, fitted.lam, fitted.beta, fitted.rho)
    holdout = holdout_check(demand, seed)
    report = _report(history, fitted, cov, boot, factor, holdout, source, instance.qbar)
    return instance, report


def _report(
    history: History, fitted: Estimate, cov: np.ndarray, boot: Bootstrap, factor: dict, holdout: dict, source: dict, qbar: np.ndarray
) -> dict:
    """The numbers of the fit report (JSON-ready); `qbar` the instance's order caps."""
    se = {
        name: getattr(boot, name).std(axis=0, ddof=1) for name in ("lam", "beta", "rho", "variance", "autocorrelation", "cross_correlation")
    }
    lam_low, lam_high = interval(fitted.lam, se["lam"], 0.0, math.inf)
    beta_low, beta_high = interval(fitted.beta, se["beta"], 0.0, BETA_MAX)
    rho_low, rho_high = interval(fitted.rho, se["rho"], 0.0, RHO_MAX)
    obs_var, obs_acf, obs_cross = observed_statistics(cov)
    model_var, model_acf, model_cross = model_statistics(fitted.lam, fitted.beta, fitted.rho)
    var_off = np.abs(obs_var - model_var) > CHECK_SE * se["variance"]
    acf_off = np.abs(obs_acf - model_acf) > CHECK_SE * se["autocorrelation"]
    cross_off = bool(abs(obs_cross - model_cross) > CHECK_SE * se["cross_correlation"]) if len(history.items) > 1 else False
    rho_at_cap = fitted.rho >= RHO_MAX - RHO_AT_CAP
    drift, drift_sd = mean_drift(history.demand, fitted.lam, fitted.beta, fitted.rho)
    drift_z = norm.ppf(1 - DRIFT_LEVEL / (2 * len(history.items)))
    drift_off = np.abs(drift) > drift_z * drift_sd
    coverage_low = INTERVAL - CHECK_SE * holdout["item_coverage_se"]
    holdout_below = holdout["item_coverage"] < coverage_low
    cap_below = qbar < fitted.lam  # Instance.caps_below_demand: no policy keeps up with the item's demand
    items = []
    for i, name in enumerate(history.items):
        items.append(
            {
                "item": name,
                "lam": float(fitted.lam[i]), "lam_se": float(se["lam"][i]), "lam_interval": [float(lam_low[i]), float(lam_high[i])],
                "beta": float(fitted.beta[i]), "beta_se": float(se["beta"][i]), "beta_interval": [float(beta_low[i]), float(beta_high[i])],
                "observed_mean": float(history.demand[:, i].mean()), "model_mean": float(fitted.lam[i]),
                "observed_variance": float(obs_var[i]), "model_variance": float(model_var[i]), "variance_se": float(se["variance"][i]),
                "observed_autocorrelation": float(obs_acf[i]), "model_autocorrelation": float(model_acf[i]),
                "autocorrelation_se": float(se["autocorrelation"][i]),
                "half_mean_drift": float(drift[i]), "half_mean_drift_sd": float(drift_sd[i]),
                "variance_off": bool(var_off[i]), "autocorrelation_off": bool(acf_off[i]), "drift_off": bool(drift_off[i]),
                "holdout_coverage": float(holdout["item_coverage_per_item"][i]),
                "holdout_observed_mean": float(holdout["observed_mean"][i]), "holdout_predicted_mean": float(holdout["predicted_mean"][i]),
                "note": fitted.notes.get(i, ""),
            }
        )  # fmt: skip
    return {
        "source": source,
        "estimator": f"moments over all pairs and lags 0..{LAGS}, weighted least squares (envs/fit.py)",
        "confidence": CONFIDENCE,
        "bootstrap": {"kind": "parametric", "replicates": int(boot.rho.size)},
        "rho": {"estimate": fitted.rho, "se": float(se["rho"]), "interval": [float(rho_low), float(rho_high)]},
        "items": items,
        "cross_correlation": {"observed": obs_cross, "model": model_cross, "se": float(se["cross_correlation"]), "off": cross_off},
        "checks": {
            "flag_at_se": CHECK_SE,
            "variance_off": [history.items[i] for i in np.flatnonzero(var_off)],
            "autocorrelation_off": [history.items[i] for i in np.flatnonzero(acf_off)],
            "cross_correlation_off": cross_off,
            "rho_at_cap": bool(rho_at_cap),
            "drift_level": DRIFT_LEVEL,
            "drift": [history.items[i] for i in np.flatnonzero(drift_off)],
            "holdout_below": bool(holdout_below),
            "cap_below_demand": [history.items[i] for i in np.flatnonzero(cap_below)],
        },
        "holdout": {
            **{
                key: holdout[key]
                for key in ("train_periods", "holdout_periods", "interval", "item_coverage", "item_coverage_se", "total_coverage")
            },
            "item_coverage_low": coverage_low,
        },
        "notes": [
            *(
                []
                if fitted.converged
                else [f"the estimator did not converge in {ALTERNATIONS} alternations; beta is the best for the rho given"]
            ),
            *(f"item '{history.items[i]}': {why}" for i, why in sorted(fitted.notes.items())),
        ],
        "flags": [
            *(f"item '{history.items[i]}': variance off" for i in np.flatnonzero(var_off)),
            *(f"item '{history.items[i]}': lag-1 autocorrelation off" for i in np.flatnonzero(acf_off)),
            *(["average cross-item correlation off"] if cross_off else []),
            *([f"rho {fitted.rho:.3f} at its cap {RHO_MAX:g}: a trend or a change of level?"] if rho_at_cap else []),
            *(
                f"item '{history.items[i]}': mean drifts by {drift[i]:+.3g} between the halves ({drift[i] / drift_sd[i]:+.1f} s.d.)"
                for i in np.flatnonzero(drift_off)
            ),
            *(
                [f"hold-out coverage {100 * holdout['item_coverage']:.1f}% below its interval (from {100 * coverage_low:.1f}%)"]
                if holdout_below
                else []
            ),
            *(
                f"item '{history.items[i]}': order cap qbar {qbar[i]:g} below its mean demand lam {fitted.lam[i]:.3g} per period: "
                "no policy keeps up (the backlog grows without bound); the decomposition bound and lookahead refuse it"
                for i in np.flatnonzero(cap_below)
            ),
        ],
        "factor": {"period": history.periods, "mean": factor["mean"].tolist(), "sd": factor["sd"].tolist()},
        "total_demand": history.demand.sum(axis=1).tolist(),
        "total_model_given_factor": demand_rate(fitted.lam, fitted.beta, factor["mean"][:, None]).sum(axis=1).tolist(),
    }


def markdown_cell(text: str) -> str:
    """`text` for a cell of a Markdown table: a '|' escaped, so that it does not end the cell."""
    return text.replace("|", "\\|")


def report_markdown(report: dict, figure_name: str) -> str:
    """The fit report as Markdown (the numbers of `report`)."""
    source, rho, hold, cross = report["source"], report["rho"], report["holdout"], report["cross_correlation"]
    level = f"{100 * report['confidence']:g}%"
    lines = [
        "# Demand model fit",
        "",
        f"History `{source['history']}` (SHA-256 `{source['history_sha256'][:16]}…`): {source['periods']} periods of "
        f"{source['step']} from {source['first_period']} to {source['last_period']}, {len(report['items'])} items. "
        f"Estimator: {report['estimator']}. Standard errors: parametric bootstrap "
        f"({report['bootstrap']['replicates']} histories of the same length drawn from the fitted model and fitted again); "
        f"intervals: {level}, estimate ± z s.e. within the parameter's range.",
        "",
        f"**rho = {rho['estimate']:.3f}** (s.e. {rho['se']:.3f}, {level} interval [{rho['interval'][0]:.3f}, {rho['interval'][1]:.3f}])",
        "",
        f"![factor path and total demand]({figure_name})",
        "",
        "## Checks",
        "",
        f"A statistic is flagged (`off`) when observed and model differ by more than {report['checks']['flag_at_se']:g} bootstrap "
        "standard errors of the observed value. The model's mean is the observed mean by construction.",
        "",
        f"* Average cross-item correlation: observed {cross['observed']:.4f}, model {cross['model']:.4f} (s.e. {cross['se']:.4f})"
        + (" **off**" if cross["off"] else ""),
        f"* Items whose variance is off: {len(report['checks']['variance_off'])}"
        + (f" ({', '.join(report['checks']['variance_off'][:20])})" if report["checks"]["variance_off"] else ""),
        f"* Items whose lag-1 autocorrelation is off: {len(report['checks']['autocorrelation_off'])}"
        + (f" ({', '.join(report['checks']['autocorrelation_off'][:20])})" if report["checks"]["autocorrelation_off"] else ""),
        f"* Hold-out (fit on the first {hold['train_periods']} periods, forecast the last {hold['holdout_periods']}): "
        f"{100 * hold['interval']:g}% predictive intervals hold {100 * hold['item_coverage']:.1f}% of the item-periods "
        f"(s.e. {100 * hold['item_coverage_se']:.1f}) and {100 * hold['total_coverage']:.1f}% of the periods' total demand "
        f"(the model says {100 * hold['interval']:g}%)" + (" **below its interval**" if report["checks"]["holdout_below"] else "") + ".",
        f"* rho at its cap: {'**yes**' if report['checks']['rho_at_cap'] else 'no'}",
        f"* Items whose mean drifts between the first and the second half (level {report['checks']['drift_level']:g} over all items): "
        f"{len(report['checks']['drift'])}" + (f" ({', '.join(report['checks']['drift'][:20])})" if report["checks"]["drift"] else ""),
        f"* Items whose order cap qbar is below their mean demand lam: {len(report['checks']['cap_below_demand'])}"
        + (f" ({', '.join(report['checks']['cap_below_demand'][:20])})" if report["checks"]["cap_below_demand"] else ""),
        "",
    ]
    if report["flags"]:
        lines += ["## Flags", "", *[f"* {flag}" for flag in report["flags"]], ""]
    if report["notes"]:
        lines += ["## What the model cannot represent", "", *[f"* {note}" for note in report["notes"]], ""]
    lines += [
        "## Items",
        "",
        "| item | lam (s.e.) | beta (s.e.) | mean obs / model | variance obs / model | lag-1 autocorr. obs / model | hold-out coverage |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["items"]:
        lines.append(
            f"| {markdown_cell(row['item'])} | {row['lam']:.3f} ({row['lam_se']:.3f}) | {row['beta']:.3f} ({row['beta_se']:.3f}) | "
            f"{row['observed_mean']:.3f} / {row['model_mean']:.3f} | {row['observed_variance']:.2f} / {row['model_variance']:.2f}"
            f"{' **off**' if row['variance_off'] else ''} | {row['observed_autocorrelation']:.3f} / {row['model_autocorrelation']:.3f}"
            f"{' **off**' if row['autocorrelation_off'] else ''} | {100 * row['holdout_coverage']:.0f}% |"
        )
    return "\n".join(lines) + "\n"


def report_figure(report: dict, path) -> None:
    """One PNG: the smoothed factor path with +-2 s.d., and the total demand against the model's expected total given
    that path; the hold-out periods shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mean, sd = np.asarray(report["factor"]["mean"]), np.asarray(report["factor"]["sd"])
    t = np.arange(mean.size)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    top.fill_between(t, mean - 2 * sd, mean + 2 * sd, color="tab:blue", alpha=0.25, label="±2 s.d.")
    top.plot(t, mean, color="tab:blue", lw=1, label="smoothed factor F_t")
    top.set_ylabel("factor")
    top.legend(loc="upper right")
    bottom.plot(t, report["total_demand"], color="black", lw=0.8, label="total demand (observed)")
    bottom.plot(t, report["total_model_given_factor"], color="tab:orange", lw=1, label="model: sum_i lam_i exp(beta_i F_t - beta_i^2/2)")
    bottom.set_ylabel("units per period")
    bottom.set_xlabel(f"period (0 = {report['source']['first_period']}, step {report['source']['step']})")
    bottom.legend(loc="upper right")
    for axis in (top, bottom):
        axis.axvspan(report["holdout"]["train_periods"], mean.size, color="grey", alpha=0.12)
    top.set_title(f"fitted factor (rho = {report['rho']['estimate']:.3f}); shaded: hold-out periods")
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)


def simulate_history(instance, seed: int, periods: int, start: str = "2024-01-01", names: list[str] | None = None):
    """(history table, cost table) as pyarrow Tables: one episode of `periods` daily periods from `start`, drawn by
    the project's own sampler (envs.exogenous.sample_paths: episode 0 of `seed`), and the instance's h, b, lead, qbar.
    Items are named by `names` (default item-000, item-001, ...)."""
    import pyarrow as pa

    from envs.exogenous import sample_paths

    names = names or [f"item-{i:03d}" for i in range(instance.n)]
    demand = sample_paths(instance, seed, 1, periods).demand[0].numpy().astype(np.int64)  # [T, n]
    dates = np.datetime64(start, "D") + np.arange(periods)
    history = pa.table(
        {
            "item": np.repeat(np.asarray(names, dtype=object), periods),
            "period": pa.array(np.tile(dates, instance.n), type=pa.date32()),
            "demand": demand.T.ravel(),
        }
    )
    costs = pa.table({"item": names, "h": instance.h, "b": instance.b, "lead": instance.lead.astype(np.int64), "qbar": instance.qbar})
    return history, costs
