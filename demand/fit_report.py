"""The fit report (docs/fitting.md, "The fit report"): its numbers (JSON-ready: the parameters with standard errors
and intervals, the choice of k, the groups of items and their correlations, the checks and their flags, the factor
path), its Markdown and its figure."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from demand.bootstrap import CONFIDENCE, Bootstrap, interval, mean_off_diagonal, observed_statistics
from demand.fit_checks import (
    CHECK_SE,
    DISPERSION_LEVEL,
    DRIFT_LEVEL,
    HOLDOUT_SHARE,
    INTERVAL,
    LIKELIHOOD_MARGIN,
    OUTLIER_LEVEL,
    RHO_AT_CAP,
    SEASON_LEVEL,
    mean_drift,
    model_correlation,
    model_statistics,
    outlying_cells,
)
from demand.moment_estimator import ALTERNATIONS, BETA_MAX, LAGS, RHO_MAX, Estimate, model_loadings
from demand.sales_history import History
from envs.demand_law import loading_rates
from envs.instance import OVERDISPERSION_MAX


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


@dataclass(frozen=True)
class _CheckOutcomes:
    """The fit's checks of the instance's model against the history: the statistics compared and what each flags ([n] per item)."""

    observed_variance: np.ndarray
    model_variance: np.ndarray
    observed_autocorrelation: np.ndarray
    model_autocorrelation: np.ndarray
    observed_cross: float
    model_cross: float
    variance_off: np.ndarray
    autocorrelation_off: np.ndarray
    cross_off: bool
    rho_at_cap: bool
    drift: np.ndarray
    """Each item's change of mean between the halves of the history (drift_sd: its standard deviation under the model)."""
    drift_sd: np.ndarray
    drift_off: np.ndarray
    season_checked: bool
    season_off: np.ndarray
    season_effect: str | None
    coverage_low: float
    """The lower end of the interval of the hold-out coverage of the item-periods (total_coverage_low: of the periods' totals)."""
    total_coverage_low: float
    holdout_below: bool
    total_holdout_below: bool
    outliers: list[tuple[int, int, float]]
    overdispersion_at_cap: np.ndarray
    beta_at_cap: np.ndarray
    cap_below: np.ndarray
    cap_below_one: np.ndarray


def report_numbers(
    history: History,
    fitted: Estimate,
    model: Estimate,
    cov: np.ndarray,
    boot: Bootstrap,
    factor: dict,
    holdout: dict,
    periodic: dict,
    choice: dict,
    source: dict,
    qbar: np.ndarray,
) -> dict:
    """The numbers of the fit report (JSON-ready): `fitted` the estimate, `model` the instance's model (the estimate
    with each phi_i not above its test's threshold set to 0), `periodic` the periodic check (`periodic_check`); `qbar`
    the instance's order caps."""
    names = history.items
    se = _standard_errors(boot)
    checks = _check_outcomes(history, fitted, model, cov, se, holdout, periodic, qbar)
    observed_corr, model_corr = _correlation_matrices(model, cov, checks.observed_variance)
    groups = loading_groups(model.loadings)
    return {
        "source": source,
        "estimator": f"moments over all pairs and lags 0..{LAGS} (the lag-0 diagonal left out), "
        "weighted least squares of rank k (demand/moment_estimator.py)",
        "confidence": CONFIDENCE,
        "bootstrap": {"kind": "parametric", "replicates": int(boot.rho.size)},
        "factors": _factors_section(choice),
        "rho": _rho_section(fitted, se),
        "lam_shared": _lam_shared_section(fitted, boot),
        "items": _item_rows(history, fitted, model, se, checks, groups, periodic, holdout),
        "cross_correlation": _cross_correlation_section(checks, se),
        "groups": _groups_section(groups, observed_corr, model_corr),
        "correlation": _heatmap_section(names, model, groups, observed_corr, model_corr),
        "checks": _checks_section(history, checks, periodic),
        "holdout": _holdout_section(holdout, checks.coverage_low),
        "notes": _notes(names, fitted, model, holdout["dispersion"]),
        "flags": [*_input_flags(history, fitted, checks, qbar), *_check_flags(names, fitted, checks, periodic, holdout)],
        **_factor_path(history, model, factor),
    }


def _standard_errors(boot: Bootstrap) -> dict[str, np.ndarray]:
    """The bootstrap standard error of each parameter and statistic the report gives one for, by name."""
    return {
        name: getattr(boot, name).std(axis=0, ddof=1)
        for name in ("lam", "beta", "rho", "overdispersion", "variance", "autocorrelation", "cross_correlation")
    }


def _check_outcomes(
    history: History, fitted: Estimate, model: Estimate, cov: np.ndarray, se: dict, holdout: dict, periodic: dict, qbar: np.ndarray
) -> _CheckOutcomes:
    """The outcomes of the fit's checks of `model` against `history` (`se` from `_standard_errors`)."""
    n = len(history.items)
    loadings = model_loadings(model)
    obs_var, obs_acf, obs_cross = observed_statistics(cov)
    model_var, model_acf, model_cross = model_statistics(model.lam, loadings, model.rho, model.overdispersion)
    drift, drift_sd = mean_drift(history.demand, model.lam, loadings, model.rho, model.overdispersion)
    drift_z = norm.ppf(1 - DRIFT_LEVEL / (2 * n))
    checked = periodic["why_not"] is None
    season_off = periodic["off"] if checked else np.zeros(n, dtype=bool)
    coverage_low = INTERVAL - CHECK_SE * holdout["item_coverage_se"]
    total_coverage_low = INTERVAL - CHECK_SE * holdout["total_coverage_se"]
    return _CheckOutcomes(
        observed_variance=obs_var,
        model_variance=model_var,
        observed_autocorrelation=obs_acf,
        model_autocorrelation=model_acf,
        observed_cross=obs_cross,
        model_cross=model_cross,
        variance_off=np.abs(obs_var - model_var) > CHECK_SE * se["variance"],
        autocorrelation_off=np.abs(obs_acf - model_acf) > CHECK_SE * se["autocorrelation"],
        cross_off=bool(abs(obs_cross - model_cross) > CHECK_SE * se["cross_correlation"]) if n > 1 else False,
        rho_at_cap=fitted.rho >= RHO_MAX - RHO_AT_CAP,
        drift=drift,
        drift_sd=drift_sd,
        drift_off=np.abs(drift) > drift_z * drift_sd,
        season_checked=checked,
        season_off=season_off,
        season_effect=_season_effect(periodic, fitted.rho, season_off, n),
        coverage_low=coverage_low,
        total_coverage_low=total_coverage_low,
        holdout_below=holdout["item_coverage"] < coverage_low,
        total_holdout_below=holdout["total_coverage"] < total_coverage_low,
        outliers=outlying_cells(history.demand),
        overdispersion_at_cap=fitted.overdispersion >= OVERDISPERSION_MAX * (1 - 1e-9),
        beta_at_cap=fitted.beta >= BETA_MAX * (1 - 1e-9),
        cap_below=qbar < fitted.lam,  # Instance.caps_below_demand: no policy keeps up with the item's demand
        cap_below_one=qbar < 1.0,  # the DP-based policies order on lattices of whole units or tenths: policies.dp_optimal.CapBelowStep
    )


def _season_effect(periodic: dict, rho: float, season_off: np.ndarray, n: int) -> str | None:
    """How the periodic pattern of the items `season_off` biases the fitted `rho`; None where no item has one."""
    if not season_off.any():
        return None
    biased_down = periodic["rho_without"] > rho
    return (
        f"a pattern over the {periodic['season']} in {int(season_off.sum())} of {n} items: the fit reads its swing as "
        + ("variation shared by the items that does not persist (noise at lags 1..4)" if biased_down else "persistence of the factors")
        + f", so rho {rho:.3f} is biased {'down' if biased_down else 'up'} ({periodic['rho_without']:.3f} with each "
        f"item's means per {periodic['season']} divided out)"
    )


def _correlation_matrices(model: Estimate, cov: np.ndarray, observed_variance: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(observed, model) correlations [n, n] of the items' demand in one period."""
    sd = np.sqrt(np.maximum(observed_variance, 1e-300))
    return cov[0] / np.outer(sd, sd), model_correlation(model.lam, model_loadings(model), model.overdispersion)


def _factors_section(choice: dict) -> dict:
    """The report's "factors": the choice of k, its criterion and the rotation of the loadings."""
    return {
        **choice,
        "criterion": "hold-out error of the lagged correlations: the estimator's weighted squares on the last "
        f"{100 * HOLDOUT_SHARE:g}% of the periods, of the model fitted on the first {100 * (1 - HOLDOUT_SHARE):g}%",
        "rotation": "varimax (the loadings are identified up to a rotation of the factors)",
    }


def _rho_section(fitted: Estimate, se: dict) -> dict:
    """The report's "rho": the estimate, its standard error and interval."""
    rho_low, rho_high = interval(fitted.rho, se["rho"], 0.0, RHO_MAX)
    return {"estimate": fitted.rho, "se": float(se["rho"]), "interval": [float(rho_low), float(rho_high)]}


def _lam_shared_section(fitted: Estimate, boot: Bootstrap) -> dict:
    """The report's "lam_shared": the mean correlation of the items' lam errors, and the total rate with its s.e. and interval."""
    total_se = float(boot.lam.sum(axis=1).std(ddof=1))  # the replicates' lam_i share their history's factor path
    total_low, total_high = interval(float(fitted.lam.sum()), total_se, 0.0, math.inf)
    return {
        "error_correlation": mean_off_diagonal(np.corrcoef(boot.lam, rowvar=False)) if fitted.lam.size > 1 else float("nan"),
        "total": float(fitted.lam.sum()),
        "total_se": total_se,
        "total_interval": [float(total_low), float(total_high)],
    }


def _item_rows(
    history: History,
    fitted: Estimate,
    model: Estimate,
    se: dict,
    checks: _CheckOutcomes,
    groups: np.ndarray,
    periodic: dict,
    holdout: dict,
) -> list[dict]:
    """The report's "items": each item's parameters with standard errors and intervals, statistics, checks and note."""
    lam_low, lam_high = interval(fitted.lam, se["lam"], 0.0, math.inf)
    beta_low, beta_high = interval(fitted.beta, se["beta"], 0.0, BETA_MAX)
    phi_low, phi_high = interval(fitted.overdispersion, se["overdispersion"], 0.0, OVERDISPERSION_MAX)
    items = []
    for i, name in enumerate(history.items):
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
                "observed_variance": float(checks.observed_variance[i]), "model_variance": float(checks.model_variance[i]),
                "variance_se": float(se["variance"][i]),
                "observed_autocorrelation": float(checks.observed_autocorrelation[i]),
                "model_autocorrelation": float(checks.model_autocorrelation[i]), "autocorrelation_se": float(se["autocorrelation"][i]),
                "half_mean_drift": float(checks.drift[i]), "half_mean_drift_sd": float(checks.drift_sd[i]),
                "variance_off": bool(checks.variance_off[i]), "autocorrelation_off": bool(checks.autocorrelation_off[i]),
                "drift_off": bool(checks.drift_off[i]),
                "season_statistic": float(periodic["statistic"][i]) if checks.season_checked else None,
                "season_off": bool(checks.season_off[i]),
                "holdout_coverage": float(holdout["item_coverage_per_item"][i]),
                "holdout_observed_mean": float(holdout["observed_mean"][i]), "holdout_predicted_mean": float(holdout["predicted_mean"][i]),
                "note": fitted.notes.get(i, ""),
            }
        )  # fmt: skip
    return items


def _cross_correlation_section(checks: _CheckOutcomes, se: dict) -> dict:
    """The report's "cross_correlation": the average correlation over pairs of items, observed and model, and its check."""
    return {"observed": checks.observed_cross, "model": checks.model_cross, "se": float(se["cross_correlation"]), "off": checks.cross_off}


def _groups_section(groups: np.ndarray, observed_corr: np.ndarray, model_corr: np.ndarray) -> dict:
    """The report's "groups": the rule, each group's size, and the mean correlations within and between groups."""
    observed_within, observed_between = group_correlations(observed_corr, groups)
    model_within, model_between = group_correlations(model_corr, groups)
    return {
        "rule": "each item in the group of its largest varimax loading and that loading's sign (+F1, -F1, +F2, ...)",
        "sizes": {group_name(int(g)): int((groups == g).sum()) for g in np.unique(groups)},
        "within": {"observed": observed_within, "model": model_within},
        "between": {"observed": observed_between, "model": model_between},
    }


def _heatmap_section(names: list[str], model: Estimate, groups: np.ndarray, observed_corr: np.ndarray, model_corr: np.ndarray) -> dict:
    """The report's "correlation": the heat maps' items (HEATMAP_ITEMS at most, by group, then by the leading loading) and matrices."""
    shown = np.sort(np.argsort(-model.beta, kind="stable")[:HEATMAP_ITEMS])
    order = shown[np.lexsort((-np.abs(model.loadings[shown]).max(axis=1), groups[shown]))]
    return {
        "items": [names[i] for i in order],
        "observed": np.round(observed_corr[np.ix_(order, order)], 3).tolist(),
        "model": np.round(model_corr[np.ix_(order, order)], 3).tolist(),
    }


def _checks_section(history: History, checks: _CheckOutcomes, periodic: dict) -> dict:
    """The report's "checks": the items (or the verdict) of each check, with its level."""
    names = history.items
    return {
        "flag_at_se": CHECK_SE,
        "variance_off": [names[i] for i in np.flatnonzero(checks.variance_off)],
        "autocorrelation_off": [names[i] for i in np.flatnonzero(checks.autocorrelation_off)],
        "cross_correlation_off": checks.cross_off,
        "rho_at_cap": bool(checks.rho_at_cap),
        "drift_level": DRIFT_LEVEL,
        "drift": [names[i] for i in np.flatnonzero(checks.drift_off)],
        "season": _season_section(names, checks, periodic),
        "holdout_below": bool(checks.holdout_below),
        "total_holdout_below": bool(checks.total_holdout_below),
        "outlier_level": OUTLIER_LEVEL,
        "outlying_cells": [
            {"item": names[i], "period": str(history.periods[t]), "demand": float(history.demand[t, i]), "p": p}
            for i, t, p in checks.outliers
        ],
        "overdispersion_at_cap": [names[i] for i in np.flatnonzero(checks.overdispersion_at_cap)],
        "beta_at_cap": [names[i] for i in np.flatnonzero(checks.beta_at_cap)],
        "cap_below_demand": [names[i] for i in np.flatnonzero(checks.cap_below)],
        "cap_below_one": [names[i] for i in np.flatnonzero(checks.cap_below_one)],
    }


def _season_section(names: list[str], checks: _CheckOutcomes, periodic: dict) -> dict:
    """The report's "checks"/"season": whether the periodic check ran (or why not), its items and its effect on rho."""
    checked = checks.season_checked
    return {
        "season": periodic["season"],
        "checked": checked,
        "why_not": periodic["why_not"],
        "level": SEASON_LEVEL,
        "degrees_of_freedom": periodic["seasons"] - 1 if checked else None,
        "threshold": periodic["threshold"] if checked else None,
        "items": [names[i] for i in np.flatnonzero(checks.season_off)],
        "rho_without": periodic["rho_without"] if checked else None,
        "effect": checks.season_effect,
    }


def _holdout_section(holdout: dict, coverage_low: float) -> dict:
    """The report's "holdout": the hold-out check's periods and coverages, and the lower end of the items' coverage interval."""
    keys = ("train_periods", "holdout_periods", "interval", "item_coverage", "item_coverage_se", "total_coverage", "total_coverage_se")
    return {**{key: holdout[key] for key in keys}, "item_coverage_low": coverage_low}


def _notes(names: list[str], fitted: Estimate, model: Estimate, likelihood: dict) -> list[str]:
    """The report's "notes": an estimator that did not converge, each item's note, the items of phi = 0 in the instance, and
    those whose phi the hold-out's likelihood kept (fit_checks.dispersion_likelihood)."""
    n = len(names)
    dispersed_out = [names[i] for i in np.flatnonzero((fitted.overdispersion > 0) & (model.overdispersion == 0))]
    kept = np.flatnonzero(likelihood["keeps"] & (model.overdispersion > 0))
    gains = likelihood["with_phi"] - likelihood["poisson"]
    return [
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
        *(
            [
                f"phi kept for {len(kept)} item(s) whose hold-out log-likelihood with it beats Poisson demand by more than "
                f"{likelihood['margin']:.2f} ({LIKELIHOOD_MARGIN:g} + log n; the model fitted on the first 80% of the periods): "
                + ", ".join(f"{names[i]} (+{gains[i]:,.1f})" for i in kept[:20])
            ]
            if kept.size
            else []
        ),
    ]


def _check_flags(names: list[str], fitted: Estimate, checks: _CheckOutcomes, periodic: dict, holdout: dict) -> list[str]:
    """The flags of the checks the model fails: statistics off, rho at its cap, drift, a periodic pattern, hold-out coverage."""
    return [
        *(
            f"item '{names[i]}': variance off: observed {checks.observed_variance[i]:,.4g}, the model's {checks.model_variance[i]:,.4g} "
            f"(observed / model {checks.observed_variance[i] / checks.model_variance[i]:.2f}; more than {CHECK_SE:g} bootstrap s.e. apart)"
            for i in np.flatnonzero(checks.variance_off)
        ),
        *(
            f"item '{names[i]}': overdispersion alone (phi {likelihood['alone_phi'][i]:.3g}, no factor) predicts its hold-out better "
            f"than the model (log-likelihood +{likelihood['alone'][i] - max(likelihood['with_phi'][i], likelihood['poisson'][i]):,.1f}): "
            f"the factors took its variance for theirs, and the instance's tails are not its own (variance observed / model "
            f"{checks.observed_variance[i] / checks.model_variance[i]:.2f})"
            for likelihood in [holdout["dispersion"]]
            for i in np.flatnonzero(likelihood["factors_worse"])
        ),
        *(f"item '{names[i]}': lag-1 autocorrelation off" for i in np.flatnonzero(checks.autocorrelation_off)),
        *(["average cross-item correlation off"] if checks.cross_off else []),
        *([f"rho {fitted.rho:.3f} at its cap {RHO_MAX:g}: a trend or a change of level?"] if checks.rho_at_cap else []),
        *(
            f"item '{names[i]}': mean drifts by {checks.drift[i]:+.3g} between the halves "
            f"({checks.drift[i] / checks.drift_sd[i]:+.1f} s.d.)"
            for i in np.flatnonzero(checks.drift_off)
        ),
        *(
            f"item '{names[i]}': its mean varies with the {periodic['season']} (chi-square {periodic['statistic'][i]:.1f} on "
            f"{periodic['seasons'] - 1} d.f., above {periodic['threshold']:.1f})"
            for i in np.flatnonzero(checks.season_off)
        ),
        *([checks.season_effect] if checks.season_effect else []),
        *(
            [f"hold-out coverage {100 * holdout['item_coverage']:.1f}% below its interval (from {100 * checks.coverage_low:.1f}%)"]
            if checks.holdout_below
            else []
        ),
        *(
            [
                f"hold-out coverage of the total {100 * holdout['total_coverage']:.1f}% below its interval "
                f"(from {100 * checks.total_coverage_low:.1f}%)"
            ]
            if checks.total_holdout_below
            else []
        ),
    ]


def _input_flags(history: History, fitted: Estimate, checks: _CheckOutcomes, qbar: np.ndarray) -> list[str]:
    """The flags of the inputs: outlying cells of the history, parameters at their caps, order caps below the demand or one unit."""
    names = history.items
    return [
        *(
            f"item '{names[i]}': period {history.periods[t]} sold {history.demand[t, i]:,.0f}, beyond everything else it sold "
            f"(p = {p:.2g} under its other periods): this one cell drives its lam, phi and default cap; check the history"
            for i, t, p in checks.outliers
        ),
        *(f"item '{names[i]}': overdispersion phi at its cap {OVERDISPERSION_MAX:g}" for i in np.flatnonzero(checks.overdispersion_at_cap)),
        *(f"item '{names[i]}': loading |beta| at its cap {BETA_MAX:g}" for i in np.flatnonzero(checks.beta_at_cap)),
        *(
            f"item '{names[i]}': order cap qbar {qbar[i]:g} below its mean demand lam {fitted.lam[i]:.3g} per period: "
            "no policy keeps up (the backlog grows without bound); the decomposition bound and lookahead refuse it"
            for i in np.flatnonzero(checks.cap_below)
        ),
        *(
            f"item '{names[i]}': order cap qbar {qbar[i]:g} below one unit: orders of a fraction of a unit only; dp-optimal, "
            "the decomposition bound and its lookahead order on a lattice and refuse a cap below one step of it"
            for i in np.flatnonzero(checks.cap_below_one & ~checks.cap_below)
        ),
    ]


def _factor_path(history: History, model: Estimate, factor: dict) -> dict:
    """The report's "factor" (the smoothed path), "total_demand" and "total_model_given_factor", the figure's series."""
    factor_mean = np.asarray(factor["mean"]).reshape(len(history.periods), -1)
    return {
        "factor": {"period": history.periods, "mean": np.asarray(factor["mean"]).tolist(), "sd": np.asarray(factor["sd"]).tolist()},
        "total_demand": history.demand.sum(axis=1).tolist(),
        "total_model_given_factor": loading_rates(model.lam, model.loadings, factor_mean).sum(axis=1).tolist(),
    }


def markdown_cell(text: str) -> str:
    """`text` for a cell of a Markdown table: a '|' escaped, so that it does not end the cell."""
    return text.replace("|", "\\|")


def _figure(value: float) -> str:
    return "none (no such pair)" if math.isnan(value) else f"{value:.3f}"


def _counted(names: list[str]) -> str:
    """How many `names`, and the first 20 of them in brackets where there are any."""
    return f"{len(names)}" + (f" ({', '.join(names[:20])})" if names else "")


def report_markdown(report: dict, figure_name: str) -> str:
    """The fit report as Markdown (the numbers of `report`)."""
    lines = [
        *_summary_lines(report, figure_name),
        *_factor_lines(report["factors"]),
        *_correlation_lines(report["groups"]),
        *_check_lines(report),
        *_bullet_section("## Flags", report["flags"]),
        *_bullet_section("## Notes: what the fit did, and what the model cannot represent", report["notes"]),
        *_item_lines(report["items"]),
    ]
    return "\n".join(lines) + "\n"


def _summary_lines(report: dict, figure_name: str) -> list[str]:
    """The report's title, what was fitted to which history and how, k and rho, and the figure."""
    source, rho, choice = report["source"], report["rho"], report["factors"]
    level = f"{100 * report['confidence']:g}%"
    k = choice["chosen"]
    how = "forced by --factors" if choice["forced"] else f"chosen among 1..{len(choice['candidates'])} by the hold-out"
    return [
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
        *_lam_shared_lines(report),
        f"![factor path, total demand and correlations]({figure_name})",
        "",
    ]


def _lam_shared_lines(report: dict) -> list[str]:
    """The paragraph on the items' lam errors moving together, and their total's interval; none for one item."""
    if len(report["items"]) <= 1:
        return []
    shared = report["lam_shared"]
    level = f"{100 * report['confidence']:g}%"
    return [
        f"lam's errors are shared across items: over the bootstrap's histories the items' lam errors correlate "
        f"{shared['error_correlation']:.2f} on average over pairs (a history's factor path moves the means of the items that "
        "load on a factor together), so those items' intervals hold or miss the truth together, and the count of items "
        f"inside their intervals is not one of independent trials. The items' common level, their total "
        f"rate sum_i lam_i = {shared['total']:.4g}, has the {level} interval [{shared['total_interval'][0]:.4g}, "
        f"{shared['total_interval'][1]:.4g}] (s.e. {shared['total_se']:.3g}).",
        "",
    ]


def _factor_lines(choice: dict) -> list[str]:
    """The section "Number of factors": the criterion, and each candidate k's hold-out error and rho."""
    k = choice["chosen"]
    return [
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
    ]


def _correlation_lines(groups: dict) -> list[str]:
    """The section "Correlations": the groups' sizes, and the mean correlations within and between groups."""
    return [
        "## Correlations",
        "",
        f"Groups: {groups['rule']}; sizes " + ", ".join(f"{name} {size}" for name, size in groups["sizes"].items()) + ".",
        "Mean correlation within a group: "
        + " / ".join(_figure(groups["within"][key]) for key in ("observed", "model"))
        + " (observed / model); between groups: "
        + " / ".join(_figure(groups["between"][key]) for key in ("observed", "model"))
        + ".",
        "",
    ]


def _check_lines(report: dict) -> list[str]:
    """The section "Checks": each check's outcome, what it flags in bold."""
    checks, cross, hold = report["checks"], report["cross_correlation"], report["holdout"]
    return [
        "## Checks",
        "",
        f"A statistic is flagged (`off`) when observed and model differ by more than {checks['flag_at_se']:g} bootstrap "
        "standard errors of the observed value. The model's mean is the observed mean by construction.",
        "",
        f"* Average cross-item correlation: observed {cross['observed']:.4f}, model {cross['model']:.4f} (s.e. {cross['se']:.4f})"
        + (" **off**" if cross["off"] else ""),
        f"* Items whose variance is off: {_counted(checks['variance_off'])}",
        f"* Items whose lag-1 autocorrelation is off: {_counted(checks['autocorrelation_off'])}",
        f"* Hold-out (fit on the first {hold['train_periods']} periods, forecast the last {hold['holdout_periods']}): "
        f"{100 * hold['interval']:g}% predictive intervals hold {100 * hold['item_coverage']:.1f}% of the item-periods "
        f"(s.e. {100 * hold['item_coverage_se']:.1f}) and {100 * hold['total_coverage']:.1f}% of the periods' total demand "
        f"(the model says {100 * hold['interval']:g}%)" + (" **below its interval**" if checks["holdout_below"] else "") + ".",
        f"* rho at its cap: {'**yes**' if checks['rho_at_cap'] else 'no'}",
        f"* Items whose mean drifts between the first and the second half (level {checks['drift_level']:g} over all items): "
        f"{_counted(checks['drift'])}",
        _season_line(checks["season"], report["rho"]),
        f"* Items whose order cap qbar is below their mean demand lam: {_counted(checks['cap_below_demand'])}",
        f"* Items whose order cap qbar is below one unit: {_counted(checks['cap_below_one'])}",
        "",
    ]


def _season_line(season: dict, rho: dict) -> str:
    """The check for a periodic pattern: the items it flags and rho without the pattern, or why it did not run."""
    if not season["checked"]:
        return f"* Periodic pattern in the items' means: not checked ({season['why_not']})"
    return (
        f"* Items whose mean varies with the {season['season']} (chi-square on {season['degrees_of_freedom']} d.f. of the "
        f"differences between its means per {season['season']}, their covariance the fitted model's; level {season['level']:g} "
        f"over all items): {_counted(season['items'])}. "
        f"rho fitted again with each item's means per {season['season']} divided out: {season['rho_without']:.3f} "
        f"(as fitted: {rho['estimate']:.3f})"
    )


def _bullet_section(title: str, entries: list[str]) -> list[str]:
    """The section `title` with one bullet per entry; none without entries."""
    return [title, "", *[f"* {entry}" for entry in entries], ""] if entries else []


def _item_lines(items: list[dict]) -> list[str]:
    """The section "Items": the table of each item's parameters, statistics and hold-out coverage."""
    return [
        "## Items",
        "",
        "|beta| is the norm of the item's loadings (rotation-free); phi its overdispersion (Var D = rate + phi rate^2 given the "
        "rate), the instance's value after the test of 0 in brackets where it differs.",
        "",
        "| item | group | lam (s.e.) | \\|beta\\| (s.e.) | phi (s.e.) | mean obs / model | variance obs / model | "
        "lag-1 autocorr. obs / model | hold-out coverage |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *(_item_row(row) for row in items),
    ]


def _item_row(row: dict) -> str:
    """The row of the items' table of one item of the report."""
    in_instance = "" if row["overdispersion_in_instance"] == row["overdispersion"] else f" [{row['overdispersion_in_instance']:g}]"
    return (
        f"| {markdown_cell(row['item'])} | {row['group']} | {row['lam']:.3f} ({row['lam_se']:.3f}) | "
        f"{row['beta']:.3f} ({row['beta_se']:.3f}) | "
        f"{row['overdispersion']:.3f} ({row['overdispersion_se']:.3f}){in_instance} | "
        f"{row['observed_mean']:.3f} / {row['model_mean']:.3f} | {row['observed_variance']:.2f} / {row['model_variance']:.2f}"
        f"{' **off**' if row['variance_off'] else ''} | {row['observed_autocorrelation']:.3f} / {row['model_autocorrelation']:.3f}"
        f"{' **off**' if row['autocorrelation_off'] else ''} | {100 * row['holdout_coverage']:.0f}% |"
    )


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
