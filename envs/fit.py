"""Fit the demand model of docs/model.md to a user's sales history (platform/fit.py; docs/fitting.md).

Model (docs/model.md, "Several factors and overdispersion"): F_t in R^k, each coordinate the AR(1) of eq.
(factor_process) with one rho, F_0 ~ N(0, I); item i's rate lam_i exp(beta_i . F_t - |beta_i|^2 / 2) with a signed
loading vector beta_i (eq. conditional_demand_rate at the item's exposure); given the rate, D_i,t is negative binomial
with variance rate + phi_i rate^2 (Poisson at phi_i = 0). Its moments (E exp(beta . F - |beta|^2/2) = 1):

    E D_i = lam_i,   Cov(D_{i,t}, D_{j,t+l}) = lam_i lam_j (exp(rho^l beta_i . beta_j) - 1)   unless i = j and l = 0,
    Var D_i = lam_i + lam_i^2 ((1 + phi_i) exp(|beta_i|^2) - 1).

So with m_i the sample mean and C^l the sample lag-l covariance matrix, the normalised moments M^l_ij = log(1 +
C^l_ij / (m_i m_j)) equal rho^l beta_i . beta_j for every pair at lags l = 1..LAGS and for i != j at lag 0, while the
lag-0 diagonal (with the Poisson part m_i taken out) is log(1 + phi_i) + |beta_i|^2. The estimator (`estimate`): lam_i =
m_i; (B [n, k], rho) minimise the weighted least squares sum_l sum_ij (w_i w_j)^2 (M^l_ij - rho^l (B B^T)_ij)^2 over
every pair and lag but the lag-0 diagonal, w_i = m_i / sd_i: the squared residual of w_i w_j M^l_ij, which is about the
lag-l correlation of items i and j (each pair on the scale of a correlation); then phi_i = exp(M^0_ii - |beta_i|^2) - 1
from each item's variance, clipped at 0 (an item at most Poisson-dispersed; `Estimate.poisson_items`). It is
consistent: the factors are a stationary, mixing Gaussian AR(1) and demand a function of them and independent noise,
so m and C^l converge almost surely to their expectations; at those the objective is zero exactly at B B^T and rho of
the truth (the lags >= 1 fix the diagonal of B B^T, lag 0 its off-diagonal, their ratio rho), and the minimiser is
continuous in the moments. B itself is identified only up to a rotation of the k factors (F ~ N(0, I) is
rotation-invariant): the fit reports |beta_i|, B B^T and the subspace of B, and shows B after a varimax rotation.
With b_i = w_i beta_i, A(rho) = sum_l rho^l N^l and N^l_ij = w_i w_j sym(M^l)_ij, the minimiser over B for a given rho
is the top k eigenvectors of A(rho) (the lag-0 diagonal imputed by the model's own value, an EM step), each scaled to
|b|^2 = lambda_j / sum_l rho^2l (`_low_rank`; LAPACK up to n = 64, subspace iteration above), and rho given B
maximises a polynomial ratio on [0, RHO_MAX]; the steps alternate until rho and the imputed diagonal settle, at most
ALTERNATIONS times (`Estimate.converged` says whether they did). At k = 1 this is the paper model's rank-one fit
(the top eigenvector), with the loadings kept non-negative as the paper's model has them: a loading that comes out
negative is cut to 0 and said in the notes (a move against the other items needs signed loadings, k >= 2, which the
hold-out chooses where the data show it).

The number of factors (`choose_factors`): each k = 1..K_max fitted on the first 80% of the periods, the one whose
model best predicts the last 20%'s normalised moments (the estimator's objective out of sample; the smallest k within
CHOICE_TOLERANCE of the best).

Standard errors: a parametric bootstrap (`bootstrap`): histories drawn from the fitted model, fitted again with the
same k; intervals for lam, rho, phi and |beta_i| (rotation-free). An item's phi_i enters the instance only where it is
above its test's threshold (DISPERSION_LEVEL). The factor path: the posterior mode of F given the history and the
fitted parameters (`smooth_factor`, Fisher scoring as an iterated Kalman smoother), with its Laplace standard deviation.

What the model cannot represent is said in `Estimate.notes`: an item whose variance is at most its mean
(underdispersed) gets beta_i = 0. What it may represent wrongly is flagged in the report: statistics off, rho at its
cap, a drift of an item's mean between the halves of the history (`mean_drift`) and a hold-out coverage below its
interval."""

from __future__ import annotations

import datetime
import hashlib
import math
import re
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import betainc, pdtr
from scipy.stats import nbinom, norm, poisson, qmc
from tqdm.auto import tqdm

from envs import validate
from envs.exogenous import FACTOR_BOUND, demand_rate, draw_demand, factor_path, innovation_scale
from envs.instance import (
    FIELD_RANGES,
    OVERDISPERSION_MAX,
    InstanceError,
    check_constant,
    check_factors_for_items,
    check_item_column,
    exact_keys,
    exposure,
    loading_norms,
    number_column,
    read_table,
    table_format,
    unit_directions,
)

LAGS = 4
"""Lags l = 0..LAGS of the moment equations: lag 0 fixes the loadings' cross products, lags >= 1 their norms and rho."""
RHO_MAX = 0.99
"""The fitted rho lies in [0, RHO_MAX]: the instance needs rho < 1 (a unit root has no stationary factor)."""
ALTERNATIONS = 50
"""Most alternations of the estimator's two steps (beta's direction for rho, rho for that direction)."""
MIN_PERIODS = 50
"""Fewest periods a history may have: with T periods a lag-1 autocorrelation has standard error about 1/sqrt(T),
0.14 at T = 50, and the hold-out check keeps 20% (10 periods) aside."""
HOLDOUT_SHARE = 0.2
MAX_FACTORS = 4
"""Default largest number of factors k the hold-out chooses among (platform/fit.py --max-factors)."""
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
DEMAND_MAX = FIELD_RANGES["lam"][2]
"""The most units one cell of a history may hold: an item's mean demand becomes its lam in the instance, whose upper
bound this is, so that a history the reader accepts never gives an instance that the instance's ranges refuse."""
INTEGER_TEXT = r"^[+-]?\d+$"
"""A CSV demand cell written as an integer (regular expression over the whole cell, trimmed)."""
NUMBER_TEXT = f"^(?:{validate.NUMBER_LITERAL.pattern})$"
"""A CSV demand cell written as a number of any form (2, 2.0, 2e3)."""
ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
COST_COLUMNS = ("item", "h", "b", "lead")
"""The cost table's required columns; `qbar` is optional (default `default_caps`)."""
QBAR_PER_LAM = 4.0
CAP_QUANTILE = 0.999
"""The default cap covers this quantile of an item's lead-time demand (`default_caps`)."""


def default_caps(lam: np.ndarray, overdispersion: np.ndarray, lead: np.ndarray) -> np.ndarray:
    """The order cap of an item whose cost table gives none: the least whole number of units that is at least the paper's
    QBAR_PER_LAM lam_i, at least the CAP_QUANTILE quantile of its lead-time demand (L_i + 1 periods at its mean rate,
    the factor held still: Poisson((L + 1) lam), or the negative binomial of shape (L + 1) / phi) and at least 1.
    A slow mover's 4 lam is below one unit (0.15-1.9 on a weekly panel), and the DP-based policies order on a lattice
    of whole units there; a heavy-tailed item's 4 lam can be below what one lead time sells."""
    periods = lead + 1.0
    quantile = np.where(
        overdispersion > 0,
        nbinom.ppf(CAP_QUANTILE, periods / np.maximum(overdispersion, 1e-300), 1.0 / (1.0 + overdispersion * lam)),
        poisson.ppf(CAP_QUANTILE, periods * lam),
    )
    return np.ceil(np.maximum.reduce([QBAR_PER_LAM * lam, quantile, np.ones_like(lam)]) - 1e-9)


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
    calendar months since 1970-01 when every date falls on the same day of its month (month starts, the 15th) or on the
    last day of its month (month ends: 2024-01-31, 2024-02-29, ...). Dates about a month apart (a median gap of 28
    days or more) that are mostly, but not all, on one such grid are refused at the earliest date off it."""
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
        month_end = dates + 1 == (months + 1).astype("datetime64[D]")
        distinct = np.unique(days)
        if distinct.size > 1 and np.median(np.diff(distinct)) >= 28:
            day = int(np.bincount(day_of_month).argmax())
            same_day = day_of_month == day
            if np.all(month_end):
                return months.astype(np.int64), "month", lambda m: str(np.datetime64(int(m) + 1, "M").astype("datetime64[D]") - 1)
            if np.all(same_day):
                return months.astype(np.int64), "month", lambda m: str(np.datetime64(int(m), "M").astype("datetime64[D]") + day)
            on_grid, grid = (
                (month_end, "the last day of its month") if month_end.sum() > same_day.sum() else (same_day, f"day {day + 1} of its month")
            )
            if on_grid.mean() > 0.5:
                off = np.flatnonzero(~on_grid)
                row = int(off[np.argmin(days[off])])
                raise _bad(
                    path,
                    items[row],
                    str(dates[row]),
                    f"not {grid}, unlike most of the history's dates: monthly periods fall on one day of every month (or on "
                    "every month's last day)",
                )
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


def _demand(table, path, items: np.ndarray, keys: np.ndarray, label) -> np.ndarray:
    """The demand column as float64 counts [R]: integers as the file writes them (digits in a CSV, whose column is read
    as text; an integer column in Parquet: 2, never 2.0) in [0, DEMAND_MAX]. The first row that is not is one
    InstanceError naming its item and period, the column and the value as the file shows it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = table.column("demand")
    csv = table_format(path, "history") == "csv"
    if csv:
        text = pc.utf8_trim_whitespace(column.fill_null(""))
        is_number = pc.match_substring_regex(text, NUMBER_TEXT).to_numpy(zero_copy_only=False)
        is_integer = pc.match_substring_regex(text, INTEGER_TEXT).to_numpy(zero_copy_only=False)
        demand = np.full(len(text), np.nan)
        demand[is_number] = pc.cast(text.filter(is_number), pa.float64()).to_numpy()
        missing = pc.equal(text, "").to_numpy(zero_copy_only=False)
    else:
        numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
        demand = column.to_numpy(zero_copy_only=False).astype(np.float64) if numeric else np.full(len(column), np.nan)
        missing = column.is_null().to_numpy(zero_copy_only=False)
        is_number = numeric & ~missing
        is_integer = is_number & pa.types.is_integer(column.type)
    whole = is_number & (demand >= 0) & (demand == np.floor(demand))
    bad = ~whole | (demand > DEMAND_MAX) | ~is_integer
    if not bad.any():
        return demand
    row = int(np.argmax(bad))
    value = text[row].as_py() if csv else column[row].as_py()
    got, why = (repr(value) if isinstance(value, str) and not is_number[row] else str(value)), ""
    if missing[row]:
        got = "nothing (a missing value)"
    elif whole[row] and demand[row] > DEMAND_MAX:
        why = f"an item's mean demand is its lam in the instance, at most {DEMAND_MAX:g}: {FIELD_RANGES['lam'][3]}"
    elif whole[row] and csv:
        why = "a count is written as an integer, without a decimal point or an exponent"
    elif whole[row]:
        why = f"a count is an integer; the Parquet column holds {column.type} values: store it as an integer column"
    where = f"history '{path}' item '{items[row]}' period {label(keys[row])}: column 'demand'"
    raise validate.refuse(where, f"a non-negative integer (units sold) up to {DEMAND_MAX:,.0f}", got, why, InstanceError)


def read_history(path) -> tuple[np.ndarray, np.ndarray, np.ndarray, str, callable, str]:
    """Check a long-form history (columns item, period, demand) row by row; return (item names [R], period keys [R],
    demand [R], unit, period label, sha256). Every refusal names the item and the period."""
    import pyarrow as pa

    header = "a header line item,period,demand and one row per item and period"
    path, table = read_table(path, "history", header, {"item": pa.string(), "demand": pa.string()})
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
    return items, keys, _demand(table, path, items, keys, label), unit, label, _file_sha256(path)


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
    """lam [n], the signed loadings [n, k] of k factors, rho, the overdispersion phi [n] (>= 0), what the model could
    not represent (item index -> what was done and why), the items whose phi was clipped at 0 (their variance at most
    what the factor and Poisson noise give), and whether the alternation converged (if not, the loadings are still the
    best for the rho returned). The loadings are identified up to a rotation of the factors (`beta`, their norms, and
    the subspace they span are not)."""

    lam: np.ndarray
    loadings: np.ndarray
    rho: float
    overdispersion: np.ndarray
    notes: dict[int, str] = field(default_factory=dict)
    converged: bool = True
    poisson_items: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def beta(self) -> np.ndarray:
        """|beta_i| [n], the norms of the items' loadings (the loading itself at one non-negative factor)."""
        return loading_norms(self.loadings)

    @property
    def factors(self) -> int:
        return int(self.loadings.shape[1])


def lagged_covariances(demand: np.ndarray, lags: int = LAGS, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """(m [n], C [lags + 1, n, n]): sample means and C^l_ij = (1/T) sum_t (D_i,t - m_i)(D_j,t+l - m_j)."""
    periods = demand.shape[0]
    mean = demand.mean(axis=0)
    centred = (demand - mean).astype(dtype)
    cov = np.stack([centred[: periods - k].T @ centred[k:] for k in range(lags + 1)]) / dtype(periods)
    return mean, cov


def normalised_moments(mean: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """M [L + 1, n, n] = log(1 + (C^l_ij - 1{i = j, l = 0} m_i) / (m_i m_j)), lags >= 1 symmetrised: rho^l beta_i . beta_j
    under the model, but at lag 0 on the diagonal, which is log(1 + phi_i) + |beta_i|^2 (module docstring). A new array."""
    normalised = cov / np.outer(mean, mean).astype(cov.dtype)
    normalised[0].flat[:: mean.size + 1] -= (1.0 / mean).astype(cov.dtype)  # the Poisson part of Var D_i
    np.maximum(normalised, -0.9, out=normalised)  # log(1 + x) needs x > -1: a covariance that negative is noise
    np.log1p(normalised, out=normalised)
    normalised[1:] = 0.5 * (normalised[1:] + normalised[1:].transpose(0, 2, 1))
    return normalised


def estimate(mean: np.ndarray, cov: np.ndarray, factors: int = 1) -> Estimate:
    """The least-squares moment estimator of the module docstring with `factors` = k, from m [n] and C [L + 1, n, n]."""
    n = mean.size
    var = np.diagonal(cov[0]).copy()
    notes = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in np.flatnonzero(~(var > mean)):
            notes[int(i)] = f"beta = 0: variance {var[i]:.3g} <= mean {mean[i]:.3g} (underdispersed; a factor can only add variance)"
    active = np.flatnonzero(var > mean)
    loadings, phi, rho, converged = np.zeros((n, factors)), np.zeros(n), 0.0, True
    poisson_items = np.zeros(0, dtype=np.int64)
    if active.size:
        m = mean[active]
        normalised = normalised_moments(m, cov[:, active][:, :, active] if active.size < n else cov)
        excess = np.diagonal(normalised[0]).copy()  # log(1 + phi_i) + |beta_i|^2
        weight = m / np.sqrt(var[active])
        normalised *= np.outer(weight, weight).astype(normalised.dtype)
        scaled, rho, converged = _low_rank(normalised, factors)
        fitted = np.zeros((active.size, factors))
        fitted[:, : scaled.shape[1]] = scaled / weight[:, None]  # k above the active items: zero columns
        if factors == 1:  # one factor: the paper's non-negative loadings (signed loadings come with k >= 2)
            for j, i in enumerate(active):
                if fitted[j, 0] <= 0:
                    others = active[active != i]
                    correlation = cov[0][i, others] / np.sqrt(var[i] * var[others]) if others.size else np.zeros(1)
                    notes[int(i)] = (
                        f"beta = 0: its loading came out {fitted[j, 0]:.3g} <= 0 (its average correlation with the other items is "
                        f"{correlation.mean():+.2f}): a move against them, which one factor with non-negative loadings cannot "
                        "represent (a model of k >= 2 factors has signed loadings)"
                    )
            fitted = np.maximum(fitted, 0.0)
        norms = loading_norms(fitted)
        for j in np.flatnonzero(norms > BETA_MAX):
            notes[int(active[j])] = f"|beta| = {BETA_MAX:g}: its loadings' norm {norms[j]:.3g} is above the instance's upper bound"
        fitted *= np.minimum(1.0, BETA_MAX / np.maximum(norms, 1e-300))[:, None]
        loadings[active] = fitted
        raw_phi = np.expm1(excess - (fitted**2).sum(axis=1))  # Var D_i = lam + lam^2 ((1 + phi) exp(|beta|^2) - 1)
        poisson_items = active[raw_phi <= 0]
        phi[active] = np.clip(raw_phi, 0.0, OVERDISPERSION_MAX)
        if not (loadings != 0).any():
            rho = 0.0
    return Estimate(mean.copy(), loadings, float(rho), phi, notes, converged, poisson_items)


def _low_rank(normalised: np.ndarray, factors: int) -> tuple[np.ndarray, float, bool]:
    """(B [n, k], rho, converged) minimising sum_l sum_ij (N^l_ij - rho^l (B B^T)_ij)^2 over every entry but the lag-0
    diagonal (which carries the overdispersion), N [L + 1, n, n] symmetric per lag; `normalised`'s lag-0 diagonal is
    overwritten.

    The left-out diagonal is imputed by the model's own value (B B^T)_ii, which makes its residual zero (an EM step:
    the objective never rises). With it, for a given rho the minimum over B is sum_l |N^l|^2 - sum_j lambda_j^2 / c(rho),
    lambda_1..k the k largest eigenvalues of A(rho) = sum_l rho^l N^l and c(rho) = sum_l rho^2l, at B = V diag(lambda /
    c)^(1/2) (V their unit eigenvectors; a negative lambda_j gives a zero column). So rho maximises |V^T A(rho) V|^2 / c
    on [0, RHO_MAX] for the V found (the eigenvalues of V^T A V, each at least 0, squared). The steps alternate until
    rho moves less than 1e-6 and the imputed diagonal less than 1e-9 of its largest value (1e-5 in float32, the
    bootstrap's precision), at most ALTERNATIONS times;
    the eigenpairs returned are always those at the rho returned. At k = 1 and without the imputation this is the
    paper model's rank-one fit."""
    lags = np.arange(normalised.shape[0])
    size = normalised.shape[1]
    lag0 = normalised[0]  # a view: its diagonal holds the imputed values from here on

    def top(rho: float, block: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a = lag0.copy()
        for k in lags[1:]:
            a += normalised.dtype.type(rho**k) * normalised[k]
        return _top_eigen(a, factors, block)

    def loadings_at(rho: float, values: np.ndarray, vectors: np.ndarray) -> np.ndarray:
        return vectors * np.sqrt(np.maximum(values, 0.0) / float(np.sum(rho ** (2 * lags))))

    rho = 0.0
    values, vectors, block = top(rho, None)
    converged = False
    settled = 1e-9 if normalised.dtype == np.float64 else 1e-5  # what the precision allows
    for _ in range(ALTERNATIONS):
        loadings = loadings_at(rho, values, vectors)
        imputed = (loadings**2).sum(axis=1)
        moved = float(np.max(np.abs(imputed - np.diagonal(lag0))))
        lag0.flat[:: size + 1] = imputed
        quad = np.stack([vectors.T @ (nk @ vectors) for nk in normalised])  # [L + 1, k, k] V^T N^l V
        new = rho
        if lags.size > 1:
            new = float(
                minimize_scalar(_profile_loss, args=(lags, quad), bounds=(0.0, RHO_MAX), method="bounded", options={"xatol": 1e-7}).x
            )
        converged = abs(new - rho) < 1e-6 and moved <= settled * max(float(imputed.max(initial=0.0)), 1e-12)
        if converged:
            break
        rho = new
        values, vectors, block = top(rho, block)
    loadings = loadings_at(rho, values, vectors)
    return loadings * np.where(loadings.sum(axis=0) >= 0, 1.0, -1.0), rho, converged


def _profile_loss(r: float, lags: np.ndarray, quad: np.ndarray) -> float:
    """-|V^T A(r) V|^2 / c(r) for a fixed orthonormal V, from quad_l = V^T N^l V: the sum of the squared non-negative
    eigenvalues of V^T A(r) V (at k = 1, (v^T A(r) v)^2 where positive)."""
    projected = np.tensordot(r**lags, quad, axes=1)
    eigenvalues = np.linalg.eigvalsh(projected) if projected.shape[0] > 1 else projected.ravel()
    return -float(np.sum(np.maximum(eigenvalues, 0.0) ** 2)) / float(np.sum(r ** (2 * lags)))


OVERSAMPLE = 8
"""Extra vectors of the subspace iteration above n = 64: it converges at the ratio of the (k + OVERSAMPLE + 1)-th
largest eigenvalue in magnitude to the k-th largest."""


def _top_eigen(a: np.ndarray, factors: int, block: np.ndarray | None, iterations: int = 300) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the `factors` largest eigenvalues of the symmetric `a` in decreasing order, their unit eigenvectors [n, k], the
    subspace-iteration block to start the next call from): LAPACK for n <= 64, else subspace iteration with
    Rayleigh-Ritz on k + OVERSAMPLE vectors, warm-started at `block` (the profile over rho moves it little); the Ritz
    values are ordered by value, so an eigenvalue of large magnitude but negative is never taken."""
    size = a.shape[0]
    if size <= 64:
        values, vectors = np.linalg.eigh(a)
        return values[::-1][:factors], vectors[:, ::-1][:, :factors], None
    width = min(factors + OVERSAMPLE, size)
    if block is None:
        block = np.random.default_rng(0x46414354).standard_normal((size, width)).astype(a.dtype)
    tol = 1e-12 if a.dtype == np.float64 else 1e-6  # what the precision allows
    previous = None
    for _ in range(iterations):
        basis, _ = np.linalg.qr(a @ block)
        values, rotation = np.linalg.eigh(basis.T @ a @ basis)
        order = np.argsort(values)[::-1]
        values, block = values[order], basis @ rotation[:, order]
        scale = max(float(np.abs(values[:factors]).max()), 1e-300)
        if previous is not None and float(np.max(np.abs(values[:factors] - previous))) <= tol * scale:
            break
        previous = values[:factors]
    return values[:factors].astype(np.float64), block[:, :factors], block


def fit_moments(demand: np.ndarray, dtype=np.float64, factors: int = 1) -> Estimate:
    return estimate(*lagged_covariances(demand, dtype=dtype), factors)


# ---- standard errors ------------------------------------------------------------------------------------------


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
    return var, acf, _mean_off_diagonal(cov[0] / np.outer(sd, sd))


def _mean_off_diagonal(matrix: np.ndarray) -> float:
    n = matrix.shape[0]
    return float((matrix.sum() - np.trace(matrix)) / (n * (n - 1))) if n > 1 else float("nan")


def model_loadings(fitted: Estimate) -> np.ndarray:
    """The loadings as the model's functions take them: [n] for one factor (the paper's, non-negative), else [n, k]."""
    return fitted.loadings[:, 0] if fitted.factors == 1 else fitted.loadings


def rates(lam: np.ndarray, beta: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """lam_i exp(beta_i . F_t - |beta_i|^2 / 2), eq. (conditional_demand_rate) with k factors, [..., n]: `beta` [n] with
    `factor` [...] (one factor, envs.exogenous.demand_rate itself), or `beta` [n, k] with `factor` [..., k], through
    item i's exposure u_i,t and |beta_i| (envs.instance.exposure) as envs.exogenous.item_rates computes an instance's."""
    if beta.ndim == 1:
        return demand_rate(lam, beta, factor[..., None])
    exposures = exposure(unit_directions(beta), factor[..., 0] if beta.shape[1] == 1 else factor)  # F_t [...] at k = 1
    return demand_rate(lam, loading_norms(beta), exposures)


def simulate_demand(
    lam: np.ndarray, beta: np.ndarray, rho: float, periods: int, rng: np.random.Generator, overdispersion: np.ndarray | None = None
) -> np.ndarray:
    """One demand path [T, n] of the model: F_0 ~ N(0, I), then eq. (factor_process) in each of the k coordinates
    (envs.exogenous.factor_path; `beta` [n] for one factor, [n, k] for k), and Poisson or negative-binomial demand
    (envs.exogenous.draw_demand)."""
    factor = factor_path(rho, rng.standard_normal(periods if beta.ndim == 1 else (periods, beta.shape[1])))
    phi = None if overdispersion is None or not np.any(overdispersion) else overdispersion
    return draw_demand(rates(lam, beta, factor), phi, rng).astype(np.float64)


def bootstrap(demand: np.ndarray, fitted: Estimate, replicates: int = REPLICATES, seed: int = 0, progress: bool = False) -> Bootstrap:
    """A parametric bootstrap: `replicates` histories of the same length drawn from the fitted model (its k factors
    and overdispersion), each fitted again with the same k (float32 products: the bootstrap's own noise is far above
    their rounding). Their spread is the sampling distribution of every estimate and observed statistic if the model
    holds, also where the factor's persistence makes a history's mean wander (a resampling of periods in blocks
    misses that for rho near 1); whether the model holds is what the report's checks test against these spreads.
    The loadings themselves are identified only up to a rotation of the factors: their norms |beta_i| are kept."""
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


# ---- the factor path --------------------------------------------------------------------------------------------


def _as_loadings(beta: np.ndarray) -> np.ndarray:
    """Loadings as [n, k]: one factor's [n] as a column."""
    return beta[:, None] if beta.ndim == 1 else beta


def smooth_factor(
    demand: np.ndarray, lam: np.ndarray, beta: np.ndarray, rho: float, overdispersion: np.ndarray | None = None, iterations: int = 50
) -> dict:
    """Posterior mode of F_0..F_{T-1} given the history (Newton's method, Fisher scoring: each step is a Kalman filter
    and RTS smoother of the pseudo-observations of the log-likelihood linearised at the current path; the negative
    binomial's score in the log rate is (D - rate) / (1 + phi rate), its information rate / (1 + phi rate), Poisson's
    at phi = 0) with its Laplace standard deviation; also the filtered mean [k] and covariance [k, k] of the last
    period (for forecasts). `beta` [n] (one factor: mean and sd [T]) or [n, k] (k factors: [T, k])."""
    loadings = _as_loadings(beta)
    periods, factors = demand.shape[0], loadings.shape[1]
    phi = np.zeros(lam.size) if overdispersion is None else overdispersion
    identity = np.eye(factors)
    path = np.zeros((periods, factors))
    q = innovation_scale(rho) ** 2
    for _ in range(iterations):
        rate = rates(lam, loadings, path)  # [T, n]
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
            prior_precision = np.linalg.inv(p)
            filt_p[t] = np.linalg.inv(prior_precision + precision[t])
            filt_m[t] = filt_p[t] @ (prior_precision @ m + info[t])
        smooth_m, smooth_p = filt_m.copy(), filt_p.copy()
        for t in range(periods - 2, -1, -1):
            gain = rho * filt_p[t] @ np.linalg.inv(pred_p[t + 1])
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


# ---- the model's statistics, the drift test and the hold-out check ------------------------------------------------


def model_variance(lam: np.ndarray, beta: np.ndarray, overdispersion: np.ndarray | None = None) -> np.ndarray:
    """Var D_i,t = lam_i + lam_i^2 ((1 + phi_i) exp(|beta_i|^2) - 1) [n], the model's (`beta` [n] for one factor or the
    loadings [n, k])."""
    phi = 0.0 if overdispersion is None else overdispersion
    return lam + lam**2 * ((1 + phi) * np.exp((_as_loadings(beta) ** 2).sum(axis=1)) - 1)


def model_correlation(lam: np.ndarray, beta: np.ndarray, overdispersion: np.ndarray | None = None) -> np.ndarray:
    """[n, n] the correlation of D_i,t and D_j,t the model implies: Cov = lam_i lam_j (exp(beta_i . beta_j) - 1) off the
    diagonal, the variances `model_variance`."""
    loadings = _as_loadings(beta)
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
    norm2 = (_as_loadings(beta) ** 2).sum(axis=1)
    var = model_variance(lam, beta, overdispersion)
    acf = lam**2 * np.expm1(norm2 * rho) / var
    return var, acf, _mean_off_diagonal(model_correlation(lam, beta, overdispersion))


def mean_drift(
    demand: np.ndarray, lam: np.ndarray, beta: np.ndarray, rho: float, overdispersion: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(d [n], sd [n]): the mean of the last T // 2 periods minus that of the first T // 2, and its standard deviation
    under the model, Var d_i = sum_{s,t} w_s w_t Cov(D_i,s, D_i,t) with w = +-1 / (T // 2) and the lag-l
    autocovariance lam_i^2 (exp(|beta_i|^2 rho^l) - 1), plus lam_i + phi_i lam_i^2 exp(|beta_i|^2) at l = 0."""
    periods = demand.shape[0]
    half = periods // 2
    w = np.zeros(periods)
    w[:half], w[periods - half :] = -1.0 / half, 1.0 / half
    pairs = np.correlate(w, w, "full")[periods - 1 :]  # [T] sum_t w_t w_t+k
    lag = np.arange(periods)[:, None]
    norm2 = (_as_loadings(beta) ** 2).sum(axis=1)
    phi = 0.0 if overdispersion is None else overdispersion
    autocov = lam**2 * np.expm1(norm2 * rho**lag) + (lag == 0) * (lam + phi * lam**2 * np.exp(norm2))  # [T, n]
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


QUASI_POINTS = 128
"""Points of the k-dimensional factor forecast (scrambled Sobol, k >= 2) over which the hold-out's total is averaged;
one factor uses the 20 Gauss-Hermite nodes."""


def holdout_check(demand: np.ndarray, seed: int = 0, factors: int = 1) -> dict:
    """Fit the model of `factors` = k on the first 80% of the periods, forecast the last 20% from the factors'
    filtered state at the end of the first part (F_{T0+h} ~ N(rho^h m, rho^2h P + (1 - rho^2h) I)), and count how
    often what happened lies in the central 80% predictive interval: per item and period (item i's exposure
    beta_i . F is one-dimensional: 20 Gauss-Hermite nodes), and of the total over items (the k-dimensional forecast at
    Gauss-Hermite nodes for k = 1, QUASI_POINTS quasi-random points for k >= 2; given F the total is Poisson, or with
    overdispersion the negative binomial of its mean and variance, sum_i rate_i and sum_i rate_i + phi_i rate_i^2).
    Demand is discrete, so the interval is the randomised one (PIT u = P(D < d) + V P(D = d), V uniform, inside
    [0.1, 0.9]), whose coverage is exactly 80% under the model (for the total, up to its two-moment match)."""
    periods = demand.shape[0]
    train = int(round(periods * (1 - HOLDOUT_SHARE)))
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
    total_rates = rates(fitted.lam, loadings, factor_points)  # [H, Q', n]
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
        "observed_mean": held.mean(axis=0),
        "predicted_mean": predicted_mean.mean(axis=0),
    }


# ---- the number of factors ---------------------------------------------------------------------------------------


CHOICE_TOLERANCE = 0.01
"""`choose_factors` takes the smallest k whose hold-out error is within this share of the smallest: a factor that
improves the predicted correlations by less than 1% is not worth its n loadings."""


def choose_factors(demand: np.ndarray, max_factors: int = MAX_FACTORS, dtype=np.float64) -> tuple[int, list[dict]]:
    """(k, one row per k = 1..max_factors): the k whose model, fitted on the first 80% of the periods, best predicts
    the normalised moments of the last 20%. The criterion is the estimator's own objective out of sample: the mean
    over lags l = 0..LAGS and pairs (i, j), the lag-0 diagonal left out, of (w_i w_j)^2 (H^l_ij - rho^l beta_i . beta_j)^2,
    H the hold-out's normalised moments (`normalised_moments` of its own means and lagged covariances) and w_i =
    m_i / sd_i the training weights: about the squared error of the predicted lag-l correlations. A factor fitted
    to the training part's noise predicts nothing of the hold-out's and adds its square to the criterion; a factor of
    little weight changes the criterion little either way, so the smallest k within CHOICE_TOLERANCE of the smallest
    error is chosen."""
    periods, n = demand.shape
    train = int(round(periods * (1 - HOLDOUT_SHARE)))
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


# ---- the whole fit and its report --------------------------------------------------------------------------------


def varimax(loadings: np.ndarray, iterations: int = 100) -> np.ndarray:
    """The loadings [n, k] rotated to the varimax criterion (Kaiser 1958: most variance of the squared loadings per
    factor, so each item loads mostly on one factor), each column oriented to a non-negative sum. The model is the same
    under any rotation (F ~ N(0, I) is rotation-invariant); the rotation only makes the factors readable."""
    factors = loadings.shape[1]
    rotation = np.eye(factors)
    if factors > 1 and np.any(loadings):
        for _ in range(iterations):
            rotated = loadings @ rotation
            u, _, vt = np.linalg.svd(loadings.T @ (rotated**3 - rotated @ np.diag((rotated**2).mean(axis=0))))
            new = u @ vt
            done = np.abs(new - rotation).max() < 1e-10
            rotation = new
            if done:
                break
    rotated = loadings @ rotation
    return rotated * np.where(rotated.sum(axis=0) >= 0, 1.0, -1.0)


def loading_groups(loadings: np.ndarray) -> np.ndarray:
    """[n] each item's group: its largest loading (in magnitude) and that loading's sign, coded 2 j (+) or 2 j + 1 (-)
    for factor j; -1 for an item with no loading."""
    largest = np.abs(loadings).argmax(axis=1)
    negative = loadings[np.arange(loadings.shape[0]), largest] < 0
    return np.where(np.abs(loadings).max(axis=1) > 0, 2 * largest + negative, -1)


def group_name(code: int) -> str:
    return "none" if code < 0 else f"{'+-'[code % 2]}F{code // 2 + 1}"


def group_correlations(correlation: np.ndarray, groups: np.ndarray) -> tuple[float, float]:
    """(mean correlation over pairs i != j of one group, over pairs of two groups); NaN where there is no such pair."""
    same = groups[:, None] == groups[None, :]
    off = ~np.eye(groups.size, dtype=bool)
    within, between = correlation[same & off], correlation[~same]
    return (float(within.mean()) if within.size else float("nan")), (float(between.mean()) if between.size else float("nan"))


HEATMAP_ITEMS = 200
"""Most items in the report's correlation heat maps (those of the largest |beta_i|); the group means use every item."""
DISPERSION_LEVEL = 0.05
"""Level of the test that keeps an item's overdispersion in the instance: phi_i is kept where its estimate exceeds
z_{1 - DISPERSION_LEVEL / n} bootstrap standard errors (one-sided, Bonferroni over the items), else the item's demand
is Poisson: a history of Poisson demand keeps every phi_i = 0 with chance at least 95%."""


def fit_history(
    history_path,
    costs_path,
    K: float | None = None,
    gamma: float = 0.95,
    replicates: int = REPLICATES,
    seed: int = 0,
    progress: bool = False,
    factors: int | None = None,
    max_factors: int = MAX_FACTORS,
):
    """(Instance, report): every check of the inputs first (K and gamma, the cost table, the history and its cells,
    the items of both, `factors` against the items), then the number of factors (`factors`, or chosen by
    `choose_factors` among 1..max_factors), the estimate, its bootstrap, the factor path, the fit checks and the
    hold-out check. K defaults to the paper family's 10 n."""
    from envs.instance import Instance

    if K is not None:
        check_constant("K", K)
    check_constant("gamma", gamma)
    costs = read_costs(costs_path)
    history = history_matrix(history_path)
    match_items(history.items, costs, history_path, costs_path)
    column = {name: k for k, name in enumerate(history.items)}
    history = History(history.demand[:, [column[x] for x in costs.items]], list(costs.items), history.periods, history.step, history.sha256)
    demand = history.demand
    n = demand.shape[1]
    if factors is not None:
        check_factors_for_items(factors, n, "number of factors (--factors)", "the history's number of items")
    chosen, candidates = choose_factors(demand, max(max_factors, factors or 0))
    factors_used = factors or chosen
    mean, cov = lagged_covariances(demand)
    raw = estimate(mean, cov, factors_used)
    fitted = Estimate(raw.lam, varimax(raw.loadings), raw.rho, raw.overdispersion, raw.notes, raw.converged, raw.poisson_items)
    boot = bootstrap(demand, fitted, replicates, seed, progress)
    phi_se = boot.overdispersion.std(axis=0, ddof=1)
    dispersed = fitted.overdispersion > norm.ppf(1 - DISPERSION_LEVEL / n) * phi_se
    overdispersion = np.where(dispersed, fitted.overdispersion, 0.0)
    qbar = costs.qbar if costs.qbar is not None else default_caps(fitted.lam, overdispersion, costs.lead)
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
        h=costs.h, b=costs.b, lam=fitted.lam, beta=None, loadings=fitted.loadings, lead=costs.lead, qbar=qbar,
        K=10.0 * n if K is None else K, gamma=gamma, rho=min(fitted.rho, RHO_MAX), source=source,
        overdispersion=overdispersion,
    )  # fmt: skip
    model = Estimate(
        fitted.lam, fitted.loadings, fitted.rho, np.where(dispersed, fitted.overdispersion, 0.0), fitted.notes, fitted.converged
    )
    factor = smooth_factor(demand, model.lam, model_loadings(model), model.rho, model.overdispersion)
    holdout = holdout_check(demand, seed, factors_used)
    choice = {"chosen": int(factors_used), "forced": factors is not None, "by_holdout": int(chosen), "candidates": candidates}
    report = _report(history, fitted, model, cov, boot, factor, holdout, choice, source, instance.qbar)
    return instance, report


def _report(
    history: History,
    fitted: Estimate,
    model: Estimate,
    cov: np.ndarray,
    boot: Bootstrap,
    factor: dict,
    holdout: dict,
    choice: dict,
    source: dict,
    qbar: np.ndarray,
) -> dict:
    """The numbers of the fit report (JSON-ready): `fitted` the estimate, `model` the instance's model (the estimate
    with each phi_i not above its test's threshold set to 0); `qbar` the instance's order caps."""
    names = history.items
    n = len(names)
    se = {
        name: getattr(boot, name).std(axis=0, ddof=1)
        for name in ("lam", "beta", "rho", "overdispersion", "variance", "autocorrelation", "cross_correlation")
    }
    lam_low, lam_high = interval(fitted.lam, se["lam"], 0.0, math.inf)
    beta_low, beta_high = interval(fitted.beta, se["beta"], 0.0, BETA_MAX)
    rho_low, rho_high = interval(fitted.rho, se["rho"], 0.0, RHO_MAX)
    phi_low, phi_high = interval(fitted.overdispersion, se["overdispersion"], 0.0, OVERDISPERSION_MAX)
    loadings = model_loadings(model)
    obs_var, obs_acf, obs_cross = observed_statistics(cov)
    model_var, model_acf, model_cross = model_statistics(model.lam, loadings, model.rho, model.overdispersion)
    var_off = np.abs(obs_var - model_var) > CHECK_SE * se["variance"]
    acf_off = np.abs(obs_acf - model_acf) > CHECK_SE * se["autocorrelation"]
    cross_off = bool(abs(obs_cross - model_cross) > CHECK_SE * se["cross_correlation"]) if n > 1 else False
    rho_at_cap = fitted.rho >= RHO_MAX - RHO_AT_CAP
    drift, drift_sd = mean_drift(history.demand, model.lam, loadings, model.rho, model.overdispersion)
    drift_z = norm.ppf(1 - DRIFT_LEVEL / (2 * n))
    drift_off = np.abs(drift) > drift_z * drift_sd
    coverage_low = INTERVAL - CHECK_SE * holdout["item_coverage_se"]
    holdout_below = holdout["item_coverage"] < coverage_low
    cap_below = qbar < fitted.lam  # Instance.caps_below_demand: no policy keeps up with the item's demand
    cap_below_one = qbar < 1.0  # the DP-based policies order on lattices of whole units or tenths: policies.dp_optimal.CapBelowStep
    sd = np.sqrt(np.maximum(obs_var, 1e-300))
    observed_corr = cov[0] / np.outer(sd, sd)
    model_corr = model_correlation(model.lam, loadings, model.overdispersion)
    groups = loading_groups(model.loadings)
    shown = np.sort(np.argsort(-model.beta, kind="stable")[:HEATMAP_ITEMS])
    order = shown[np.lexsort((-np.abs(model.loadings[shown]).max(axis=1), groups[shown]))]  # by group, then by the leading loading
    observed_within, observed_between = group_correlations(observed_corr, groups)
    model_within, model_between = group_correlations(model_corr, groups)
    dispersed_out = [names[i] for i in np.flatnonzero((fitted.overdispersion > 0) & (model.overdispersion == 0))]
    items = []
    for i, name in enumerate(names):
        items.append(
            {
                "item": name,
                "lam": float(fitted.lam[i]), "lam_se": float(se["lam"][i]), "lam_interval": [float(lam_low[i]), float(lam_high[i])],
                "beta": float(fitted.beta[i]), "beta_se": float(se["beta"][i]), "beta_interval": [float(beta_low[i]), float(beta_high[i])],
                "loadings": [float(x) for x in model.loadings[i]], "group": group_name(int(groups[i])),
                "overdispersion": float(fitted.overdispersion[i]), "overdispersion_se": float(se["overdispersion"][i]),
                "overdispersion_interval": [float(phi_low[i]), float(phi_high[i])],
                "overdispersion_in_instance": float(model.overdispersion[i]),
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
    factor_mean = np.asarray(factor["mean"]).reshape(len(history.periods), -1)
    return {
        "source": source,
        "estimator": f"moments over all pairs and lags 0..{LAGS} (the lag-0 diagonal left out), "
        "weighted least squares of rank k (envs/fit.py)",
        "confidence": CONFIDENCE,
        "bootstrap": {"kind": "parametric", "replicates": int(boot.rho.size)},
        "factors": {
            **choice,
            "criterion": "hold-out error of the lagged correlations: the estimator's weighted squares on the last "
            f"{100 * HOLDOUT_SHARE:g}% of the periods, of the model fitted on the first {100 * (1 - HOLDOUT_SHARE):g}%",
            "rotation": "varimax (the loadings are identified up to a rotation of the factors)",
        },
        "rho": {"estimate": fitted.rho, "se": float(se["rho"]), "interval": [float(rho_low), float(rho_high)]},
        "items": items,
        "cross_correlation": {"observed": obs_cross, "model": model_cross, "se": float(se["cross_correlation"]), "off": cross_off},
        "groups": {
            "rule": "each item in the group of its largest varimax loading and that loading's sign (+F1, -F1, +F2, ...)",
            "sizes": {group_name(int(g)): int((groups == g).sum()) for g in np.unique(groups)},
            "within": {"observed": observed_within, "model": model_within},
            "between": {"observed": observed_between, "model": model_between},
        },
        "correlation": {
            "items": [names[i] for i in order],
            "observed": np.round(observed_corr[np.ix_(order, order)], 3).tolist(),
            "model": np.round(model_corr[np.ix_(order, order)], 3).tolist(),
        },
        "checks": {
            "flag_at_se": CHECK_SE,
            "variance_off": [names[i] for i in np.flatnonzero(var_off)],
            "autocorrelation_off": [names[i] for i in np.flatnonzero(acf_off)],
            "cross_correlation_off": cross_off,
            "rho_at_cap": bool(rho_at_cap),
            "drift_level": DRIFT_LEVEL,
            "drift": [names[i] for i in np.flatnonzero(drift_off)],
            "holdout_below": bool(holdout_below),
            "cap_below_demand": [names[i] for i in np.flatnonzero(cap_below)],
            "cap_below_one": [names[i] for i in np.flatnonzero(cap_below_one)],
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
                else [f"the estimator did not converge in {ALTERNATIONS} alternations; the loadings are the best for the rho given"]
            ),
            *(f"item '{names[i]}': {why}" for i, why in sorted(fitted.notes.items())),
            *(
                [
                    f"phi = 0 (Poisson demand) in the instance for {len(fitted.poisson_items) + len(dispersed_out)} item(s): "
                    f"{len(fitted.poisson_items)} with a variance at most what the factors and Poisson noise give"
                    f"{' (' + ', '.join(names[i] for i in fitted.poisson_items[:20]) + ')' if len(fitted.poisson_items) else ''}, "
                    f"{len(dispersed_out)} with an overdispersion within {norm.ppf(1 - DISPERSION_LEVEL / n):.2f} s.e. of 0 "
                    f"(level {DISPERSION_LEVEL:g} over all items){' (' + ', '.join(dispersed_out[:20]) + ')' if dispersed_out else ''}"
                ]
                if len(fitted.poisson_items) or dispersed_out
                else []
            ),
        ],
        "flags": [
            *(f"item '{names[i]}': variance off" for i in np.flatnonzero(var_off)),
            *(f"item '{names[i]}': lag-1 autocorrelation off" for i in np.flatnonzero(acf_off)),
            *(["average cross-item correlation off"] if cross_off else []),
            *([f"rho {fitted.rho:.3f} at its cap {RHO_MAX:g}: a trend or a change of level?"] if rho_at_cap else []),
            *(
                f"item '{names[i]}': mean drifts by {drift[i]:+.3g} between the halves ({drift[i] / drift_sd[i]:+.1f} s.d.)"
                for i in np.flatnonzero(drift_off)
            ),
            *(
                [f"hold-out coverage {100 * holdout['item_coverage']:.1f}% below its interval (from {100 * coverage_low:.1f}%)"]
                if holdout_below
                else []
            ),
            *(
                f"item '{names[i]}': order cap qbar {qbar[i]:g} below its mean demand lam {fitted.lam[i]:.3g} per period: "
                "no policy keeps up (the backlog grows without bound); the decomposition bound and lookahead refuse it"
                for i in np.flatnonzero(cap_below)
            ),
            *(
                f"item '{names[i]}': order cap qbar {qbar[i]:g} below one unit: orders of a fraction of a unit only; dp-optimal, "
                "the decomposition bound and its lookahead order on a lattice and refuse a cap below one step of it"
                for i in np.flatnonzero(cap_below_one & ~cap_below)
            ),
        ],
        "factor": {"period": history.periods, "mean": np.asarray(factor["mean"]).tolist(), "sd": np.asarray(factor["sd"]).tolist()},
        "total_demand": history.demand.sum(axis=1).tolist(),
        "total_model_given_factor": rates(model.lam, model.loadings, factor_mean).sum(axis=1).tolist(),
    }


def markdown_cell(text: str) -> str:
    """`text` for a cell of a Markdown table: a '|' escaped, so that it does not end the cell."""
    return text.replace("|", "\\|")


def _figure(value: float) -> str:
    return "none (no such pair)" if math.isnan(value) else f"{value:.3f}"


def report_markdown(report: dict, figure_name: str) -> str:
    """The fit report as Markdown (the numbers of `report`)."""
    source, rho, hold, cross = report["source"], report["rho"], report["holdout"], report["cross_correlation"]
    choice, groups = report["factors"], report["groups"]
    level = f"{100 * report['confidence']:g}%"
    k = choice["chosen"]
    how = "forced by --factors" if choice["forced"] else f"chosen among 1..{len(choice['candidates'])} by the hold-out"
    lines = [
        "# Demand model fit",
        "",
        f"History `{source['history']}` (SHA-256 `{source['history_sha256'][:16]}…`): {source['periods']} periods of "
        f"{source['step']} from {source['first_period']} to {source['last_period']}, {len(report['items'])} items. "
        f"Estimator: {report['estimator']}. Standard errors: parametric bootstrap "
        f"({report['bootstrap']['replicates']} histories of the same length drawn from the fitted model and fitted again); "
        f"intervals: {level}, estimate ± z s.e. within the parameter's range.",
        "",
        f"**k = {k} factor{'s' if k > 1 else ''}** ({how}), **rho = {rho['estimate']:.3f}** (s.e. {rho['se']:.3f}, {level} interval "
        f"[{rho['interval'][0]:.3f}, {rho['interval'][1]:.3f}])",
        "",
        f"![factor path, total demand and correlations]({figure_name})",
        "",
        "## Number of factors",
        "",
        f"Criterion: {choice['criterion']} (smaller is better). Loadings: {choice['rotation']}.",
        "",
        "| k | hold-out error | rho |",
        "| --- | --- | --- |",
        *(
            f"| {row['factors']}{' (chosen)' if row['factors'] == k else ''} | {row['holdout_error']:.5g} | {row['rho']:.3f} |"
            for row in choice["candidates"]
        ),
        "",
        "## Correlations",
        "",
        f"Groups: {groups['rule']}; sizes " + ", ".join(f"{name} {size}" for name, size in groups["sizes"].items()) + ".",
        "Mean correlation within a group: "
        + " / ".join(_figure(groups["within"][key]) for key in ("observed", "model"))
        + " (observed / model); between groups: "
        + " / ".join(_figure(groups["between"][key]) for key in ("observed", "model"))
        + ".",
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
        f"* Items whose order cap qbar is below one unit: {len(report['checks']['cap_below_one'])}"
        + (f" ({', '.join(report['checks']['cap_below_one'][:20])})" if report["checks"]["cap_below_one"] else ""),
        "",
    ]
    if report["flags"]:
        lines += ["## Flags", "", *[f"* {flag}" for flag in report["flags"]], ""]
    if report["notes"]:
        lines += ["## Notes: what the fit did, and what the model cannot represent", "", *[f"* {note}" for note in report["notes"]], ""]
    lines += [
        "## Items",
        "",
        "|beta| is the norm of the item's loadings (rotation-free); phi its overdispersion (Var D = rate + phi rate^2 given the "
        "rate), the instance's value after the test of 0 in brackets where it differs.",
        "",
        "| item | group | lam (s.e.) | \\|beta\\| (s.e.) | phi (s.e.) | mean obs / model | variance obs / model | "
        "lag-1 autocorr. obs / model | hold-out coverage |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["items"]:
        in_instance = "" if row["overdispersion_in_instance"] == row["overdispersion"] else f" [{row['overdispersion_in_instance']:g}]"
        lines.append(
            f"| {markdown_cell(row['item'])} | {row['group']} | {row['lam']:.3f} ({row['lam_se']:.3f}) | "
            f"{row['beta']:.3f} ({row['beta_se']:.3f}) | "
            f"{row['overdispersion']:.3f} ({row['overdispersion_se']:.3f}){in_instance} | "
            f"{row['observed_mean']:.3f} / {row['model_mean']:.3f} | {row['observed_variance']:.2f} / {row['model_variance']:.2f}"
            f"{' **off**' if row['variance_off'] else ''} | {row['observed_autocorrelation']:.3f} / {row['model_autocorrelation']:.3f}"
            f"{' **off**' if row['autocorrelation_off'] else ''} | {100 * row['holdout_coverage']:.0f}% |"
        )
    return "\n".join(lines) + "\n"


def report_figure(report: dict, path) -> None:
    """One PNG: the smoothed factor paths with +-2 s.d., the total demand against the model's expected total given
    those paths (the hold-out periods shaded), and the observed beside the model's correlation matrix (two heat maps,
    items ordered by group and leading loading)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    periods = len(report["factor"]["period"])
    mean = np.asarray(report["factor"]["mean"]).reshape(periods, -1)
    sd = np.asarray(report["factor"]["sd"]).reshape(periods, -1)
    t = np.arange(periods)
    fig = plt.figure(figsize=(10, 11))
    grid = fig.add_gridspec(3, 2, height_ratios=[1, 1, 1.6])
    top, middle = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, :])
    for j in range(mean.shape[1]):
        top.fill_between(t, mean[:, j] - 2 * sd[:, j], mean[:, j] + 2 * sd[:, j], color=f"C{j}", alpha=0.2)
        top.plot(t, mean[:, j], color=f"C{j}", lw=1, label=f"smoothed factor F{j + 1}" + (" (±2 s.d.)" if j == 0 else ""))
    top.set_ylabel("factor")
    top.legend(loc="upper right")
    middle.plot(t, report["total_demand"], color="black", lw=0.8, label="total demand (observed)")
    middle.plot(
        t, report["total_model_given_factor"], color="tab:orange", lw=1, label="model: sum_i lam_i exp(beta_i . F_t - |beta_i|^2/2)"
    )
    middle.set_ylabel("units per period")
    middle.set_xlabel(f"period (0 = {report['source']['first_period']}, step {report['source']['step']})")
    middle.legend(loc="upper right")
    for axis in (top, middle):
        axis.axvspan(report["holdout"]["train_periods"], periods, color="grey", alpha=0.12)
    k = report["factors"]["chosen"]
    top.set_title(f"fitted factors (k = {k}, rho = {report['rho']['estimate']:.3f}); shaded: hold-out periods")
    for column, key in enumerate(("observed", "model")):
        axis = fig.add_subplot(grid[2, column])
        image = axis.imshow(np.asarray(report["correlation"][key]), vmin=-1, vmax=1, cmap="RdBu_r", interpolation="nearest")
        axis.set_title(f"{key} correlation ({len(report['correlation']['items'])} items by group)")
        axis.set_xticks([])
        axis.set_yticks([])
    fig.colorbar(image, ax=axis, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)


STEP = re.compile(r"([1-9]\d*) (day|month|period)s?")
"""A history's step as History.step (and so an instance's source.step) writes it: '1 day', '7 days', '1 month',
'3 months', '1 period' (integer periods)."""


def period_labels(step: str, start: str | None, periods: int):
    """`periods` consecutive period labels at `step` (STEP) as a pyarrow array that history_matrix reads back at that
    step: dates from `start` (YYYY-MM-DD, default 2024-01-01; a monthly step's on the day of the month of `start`, or
    on month ends when `start` is the last day of its month), or integers from `start` (default 1) for a step in
    periods. A step or a start that cannot be is one InstanceError naming it."""
    import pyarrow as pa

    match = STEP.fullmatch(step) if isinstance(step, str) else None
    if match is None:
        raise validate.refuse(
            "instance field 'source.step'",
            "'N days', 'N months' or 'N periods' (the history's step)",
            validate.describe(step),
            error=InstanceError,
        )
    size, unit = int(match.group(1)), match.group(2)
    offsets = size * np.arange(periods)
    if unit == "period":
        if start is not None and not validate.DECIMAL_INTEGER.fullmatch(start):
            raise InstanceError(f"start (--start): expected an integer, the first period of a history in periods, got '{start}'")
        return pa.array(int(start or 1) + offsets, type=pa.int64())
    text = "2024-01-01" if start is None else start
    try:
        first = np.datetime64(text, "D") if ISO_DATE.fullmatch(text) else None
    except ValueError:  # a month or a day the calendar does not have: 2024-13-01, 2024-02-30
        first = None
    if first is None:
        raise InstanceError(f"start (--start): expected a date YYYY-MM-DD, got '{start}'")
    if unit == "day":
        return pa.array(first + offsets, type=pa.date32())
    month = first.astype("datetime64[M]")
    day = first - month.astype("datetime64[D]")
    months = month + offsets
    if day <= np.timedelta64(27, "D"):
        return pa.array(months.astype("datetime64[D]") + day, type=pa.date32())
    if first + 1 == (month + 1).astype("datetime64[D]"):
        return pa.array((months + 1).astype("datetime64[D]") - 1, type=pa.date32())
    raise InstanceError(
        f"start (--start): expected a day of the month up to the 28th or a month's last day (a monthly history's periods "
        f"fall on one day of every month), got '{start}'"
    )


def simulate_history(instance, seed: int, periods: int, start: str | None = None, names: list[str] | None = None):
    """(history table, cost table) as pyarrow Tables: one episode of `periods` periods, drawn by the project's own
    sampler (envs.exogenous.sample_paths: episode 0 of `seed`), and the instance's h, b, lead, qbar. The periods are
    `period_labels` from `start` at the step of the history the instance was fitted on (source.step), daily for an
    instance without one. Items are named by `names`, by default the instance's own (a fitted instance's,
    Instance.item_names), else item-000, item-001, ..."""
    import pyarrow as pa

    from envs.exogenous import sample_paths

    labels = period_labels((instance.source or {}).get("step", "1 day"), start, periods)
    names = names or instance.item_names or [f"item-{i:03d}" for i in range(instance.n)]
    demand = sample_paths(instance, seed, 1, periods).demand[0].numpy().astype(np.int64)  # [T, n]
    history = pa.table(
        {
            "item": np.repeat(np.asarray(names, dtype=object), periods),
            "period": pa.concat_arrays([labels] * instance.n),
            "demand": demand.T.ravel(),
        }
    )
    costs = pa.table({"item": names, "h": instance.h, "b": instance.b, "lead": instance.lead.astype(np.int64), "qbar": instance.qbar})
    return history, costs
