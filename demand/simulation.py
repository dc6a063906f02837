"""Demand of the fitted model as a history: one demand path of the model (the fit's
bootstrap draws its histories with it), and a history file's table drawn from an instance by the project's own sampler
(platform/simulate_history.py), its period labels those that the history reader reads back at the instance's step."""

from __future__ import annotations

import re

import numpy as np

from demand.sales_history import ISO_DATE
from envs.demand_law import draw_demand, loading_rates
from envs.exogenous import factor_path
from envs.instance import InstanceError
from plumbing import validate


def simulate_demand(
    lam: np.ndarray, beta: np.ndarray, rho: float, periods: int, rng: np.random.Generator, overdispersion: np.ndarray | None = None
) -> np.ndarray:
    """One demand path [T, n] of the model: F_0 ~ N(0, I), then eq. (factor_process) in each of the k coordinates
    (envs.exogenous.factor_path; `beta` [n] for one factor, [n, k] for k), and Poisson or negative-binomial demand
    (envs.demand_law.draw_demand)."""
    factor = factor_path(rho, rng.standard_normal(periods if beta.ndim == 1 else (periods, beta.shape[1])))
    phi = None if overdispersion is None or not np.any(overdispersion) else overdispersion
    return draw_demand(loading_rates(lam, beta, factor), phi, rng).astype(np.float64)


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
        why = (
            f" (an integer start is for an instance fitted on a history in periods; this instance's step is '{step}')"
            if validate.DECIMAL_INTEGER.fullmatch(text)
            else ""
        )
        raise InstanceError(f"start (--start): expected a date YYYY-MM-DD, got '{start}'{why}")
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
    """(history table, cost table) as pyarrow Tables: one episode of `periods` periods from envs.exogenous.sample_paths (episode
    0 of `seed`), and the instance's h, b, lead, qbar. The periods are `period_labels` from `start` at the step of the
    history the instance was fitted on (source.step; daily without one); items are named `names`, else
    Instance.item_names, else item-000, item-001, ..."""
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
