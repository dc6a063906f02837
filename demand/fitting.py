"""Fit the demand model of docs/model.md to a user's sales history (platform/fit.py; docs/fitting.md): `fit_history`
checks every input, chooses the number of factors, estimates the model, bootstraps its standard errors, smooths the
factor path, runs the checks and gives the instance and the numbers of its report.

The parts: reading the history and the cost table (demand/sales_history.py), the moment estimator
(demand/moment_estimator.py), the choice of k (demand/factor_choice.py), the standard errors (demand/bootstrap.py), the
factor path (demand/factor_smoother.py), the checks (demand/fit_checks.py), the report and its figure
(demand/fit_report.py), and histories drawn from the model (demand/simulation.py)."""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

from demand.bootstrap import REPLICATES, bootstrap
from demand.factor_choice import MAX_FACTORS, choose_factors
from demand.factor_smoother import smooth_factor
from demand.fit_checks import DISPERSION_LEVEL, holdout_check, periodic_check
from demand.fit_report import report_numbers
from demand.moment_estimator import RHO_MAX, Estimate, estimate, lagged_covariances, model_loadings, varimax
from demand.sales_history import History, check_fit_length, default_caps, history_matrix, match_items, read_costs
from envs.instance import check_constant, check_factors_for_items
from plumbing.files import file_sha256


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
    `choose_factors` among 1..max_factors), the estimate, its bootstrap, the factor path, the hold-out check and the
    periodic check; the other checks are made with the report's numbers. K defaults to the paper family's 10 n."""
    from envs.instance import Instance

    if K is not None:
        check_constant("K", K)
    check_constant("gamma", gamma)
    costs = read_costs(costs_path)
    history = history_matrix(history_path)
    check_fit_length(history, history_path)
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
    holdout = holdout_check(demand, seed, factors_used)
    keeps = holdout["dispersion"]["keeps"]  # phi_i also stays where the hold-out's likelihood wants it
    dispersed = (fitted.overdispersion > norm.ppf(1 - DISPERSION_LEVEL / n) * phi_se) | ((fitted.overdispersion > 0) & keeps)
    overdispersion = np.where(dispersed, fitted.overdispersion, 0.0)
    qbar = costs.qbar if costs.qbar is not None else default_caps(fitted.lam, overdispersion, costs.lead)
    source = {
        "fitted_by": "platform/fit.py",
        "history": str(history_path),
        "history_sha256": history.sha256,
        "cost_table": str(costs_path),
        "cost_table_sha256": file_sha256(costs_path),
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
    periodic = periodic_check(demand, history.step, history.periods, model)
    choice = {"chosen": int(factors_used), "forced": factors is not None, "by_holdout": int(chosen), "candidates": candidates}
    report = report_numbers(history, fitted, model, cov, boot, factor, holdout, periodic, choice, source, instance.qbar)
    return instance, report
