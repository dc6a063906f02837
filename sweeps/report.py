"""What the report on a sweep's results directory says, computed (sweeps/render.py writes it out): each
method's evaluations at each size, paired comparisons against classical-best, the training curves (the
paper's Figure 1) and their reference lines, and the decision time against the MILP.

  report = build_report("results/quick", opening="greedy")     reads sweeps.results_dir.read_results
  time_decisions(report, device="cpu")                          the decision times (a separate step: it loads and runs policies)

The paper's conventions, and the choices where it is silent (which seeds and episodes a cell averages, which
entries are ranked and paired, how Figure 1 is smoothed and its reference lines recomputed, the decomposition bound's
column, how decisions are timed): docs/findings.md, "How the report computes its figures".
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from envs.evaluation import evaluate, paired_comparison, standard_error
from envs.exogenous import sample_paths
from plumbing.errors import InputError
from policies.classical import CLASSICAL_BEST
from policies.decomposition import EXACT_OPTIMUM, run_tightest_bound
from policies.decomposition import NAME as DECOMPOSITION
from policies.dp_optimal import NAME as DP_OPTIMAL
from policies.joint_dp import SWEEP_ITEMS, lower_figure
from run_results.records import read_evaluation
from sweeps.results_dir import FINISHED, OPENINGS, Results, baseline_folder, read_results, seconds_per_decision, trial_folder
from sweeps.spec import SweepSpec, Trial
from trainers.config import MethodName
from trainers.registry import METHODS

REFERENCE_DECISIONS = 10
MOVING_AVERAGE = 10
CURVE_BINS = 24
REPEATS = 7


# ---- each method at each size ---------------------------------------------------------------------


class Run(NamedTuple):
    """One evaluation: a seed's (learned) or the baseline's; `evaluation` as read by read_evaluation."""

    seed: int | None
    folder: Path
    evaluation: dict[str, Any]

    @property
    def summary(self) -> dict[str, Any]:
        return self.evaluation["summary"]


@dataclass
class Entry:
    """One method (learned or a baseline) at one size: its evaluations and what became of its seeds."""

    n: int
    column: str
    kind: str
    """learned, baseline or bound."""
    runs: list[Run] = field(default_factory=list)
    seeds: int = 0
    """Seeds of the sweep at this size (learned)."""
    statuses: Counter = field(default_factory=Counter)
    """Trial statuses of those seeds (learned)."""
    absent: str | None = None
    """The cell of a baseline without an evaluation: '—' (not in the sweep at this size) or 'missing'."""
    own_evaluation: bool = False
    """Evaluated on other episodes or another horizon than the sweep's."""

    @property
    def mean(self) -> float | None:
        return float(np.mean([r.summary["mean"] for r in self.runs])) if self.runs else None

    @property
    def se(self) -> float | None:
        """Across seeds with two or more; else the one evaluation's s.e. over episodes."""
        if not self.runs:
            return None
        return standard_error(np.array([r.summary["mean"] for r in self.runs])) if len(self.runs) > 1 else float(self.runs[0].summary["se"])

    @property
    def expected_cost_se(self) -> float | None:
        """The s.e. of `mean` as an estimate of the policy's expected cost: the held-out episodes' (the runs' mean s.e. over
        episodes: every seed is evaluated on the same episodes, so the spread across seeds leaves their luck out) and, with
        several seeds, the spread across them too."""
        if not self.runs:
            return None
        episodes = float(np.mean([r.summary["se"] for r in self.runs]))
        return float(np.hypot(episodes, self.se)) if len(self.runs) > 1 else episodes

    @property
    def one_seed(self) -> bool:
        return self.kind == "learned" and len(self.runs) == 1

    @property
    def horizon(self) -> int | None:
        return self.runs[0].summary["horizon"] if self.runs else None

    @property
    def on_heldout_set(self) -> bool:
        """Evaluated on the sweep's episodes and horizon: ranked, and in the reduction and gap tables."""
        return bool(self.runs) and not self.own_evaluation

    @property
    def diverged(self) -> int:
        return self.statuses.get("diverged", 0)

    @property
    def unfinished(self) -> dict[str, int]:
        """Seeds per trial status other than finished, by status (learned)."""
        return {status: count for status, count in sorted(self.statuses.items()) if status not in FINISHED}

    @property
    def without_runs(self) -> str:
        """What stands for an entry with no evaluation: its seeds' statuses (learned), else `absent` or 'missing'."""
        if self.kind == "learned":
            return ", ".join(f"{status} ({count} of {self.seeds} seeds)" for status, count in self.unfinished.items())
        return self.absent or "missing"


def columns(spec: SweepSpec) -> list[tuple[str, str]]:
    """(column, kind) in the paper's order: learned methods (in the registry's order), classical-best, each MILP,
    dp-optimal, the decomposition lookahead, the bounds."""
    b = spec.baselines
    result = [(m, "learned") for m in METHODS if m in spec.methods]
    result += [(CLASSICAL_BEST, "baseline")] if b.classical_best else []
    result += [(m.name, "baseline") for m in b.milp]
    result += [("dp-optimal", "baseline")] if b.dp_optimal and spec.has_dp_optimal else []
    result += [("decomposition-lookahead", "baseline")] if b.lookahead else []
    result += [("bound", "bound")] if b.bound is not None else []
    result += [(DECOMPOSITION, "bound")] if b.decomposition is not None else []
    return result


def _check_instance(results: Results, run: Run, n: int) -> None:
    if run.summary["instance_hash"] != results.record["instance_hashes"][f"n{n}"]:
        raise InputError(
            f"results folder '{run.folder}' evaluates another instance than the sweep's n = {n} (instance hash "
            f"{run.summary['instance_hash'][:12]}, the sweep's {results.record['instance_hashes'][f'n{n}'][:12]})"
        )


def learned_entry(results: Results, method: str, n: int, opening: str, notes: list[str]) -> Entry:
    rows = {(r["method"], r["n"], r["seed"]): r for r in results.trials}
    seeds = results.spec.seeds_per_size.get(n, results.spec.seeds)
    entry = Entry(n, method, "learned", seeds=len(seeds))
    for seed in seeds:
        trial = Trial(method, n, seed)
        row = rows.get((method, n, seed))
        status = row["status"] if row else "pending"
        entry.statuses[status] += 1
        if status not in FINISHED:
            if row and row["reason"]:
                notes.append(f"{trial.name} {status}: {row['reason']}")
            continue
        folder = trial_folder(results.root, trial) / opening
        try:
            run = Run(seed, folder, read_evaluation(folder))
        except InputError as exc:
            raise InputError(
                f"trial {trial.name} is {status} in trials.parquet, but its {opening} evaluation does not read: {exc}"
            ) from None
        _check_instance(results, run, n)
        entry.runs.append(run)
    entry.own_evaluation = any(
        (r.summary["episodes"], r.summary["horizon"]) != (results.spec.episodes, results.spec.horizon) for r in entry.runs
    )
    return entry


def baseline_entry(results: Results, column: str, kind: str, n: int, notes: list[str]) -> Entry:
    spec = results.spec
    entry = Entry(n, column, kind)
    milp = {m.name: m for m in spec.baselines.milp}.get(column)
    if (column == DP_OPTIMAL and n > SWEEP_ITEMS) or (milp is not None and milp.sizes is not None and n not in milp.sizes):
        entry.absent = "—"
        return entry
    folder = baseline_folder(results.root, n, column)
    try:
        run = Run(None, folder, read_evaluation(folder))
    except InputError as exc:
        notes.append(f"{column} at n = {n} is missing: {exc}")
        return entry
    _check_instance(results, run, n)
    entry.runs.append(run)
    entry.own_evaluation = (run.summary["episodes"], run.summary["horizon"]) != (spec.episodes, spec.horizon)
    return entry


@dataclass
class Report:
    results: Results
    opening: str
    entries: dict[tuple[int, str], Entry]
    notes: list[str]
    """Failed trials' reasons and missing baselines."""
    paired: list[dict[str, Any]]
    """paired_rows against classical-best."""
    relaxed_differences: list[dict[str, Any]]
    """paired_rows against the decomposition bound's relaxed policies (empty without the bound)."""
    reductions: dict[tuple[int, str], float]
    """`reductions`."""
    bound_ratios: dict[tuple[int, str], float]
    """`bound_ratios`."""
    references: dict[int, dict[str, float]]
    reference_notes: list[str]
    milp_times: dict[int, dict[str, float]]
    tightest: dict[int, dict[str, Any]]
    """`tightest_bounds`."""
    device: str | None = None
    timings: list[dict[str, Any]] | None = None
    """decision_times on `device`, once `time_decisions` has run (None before)."""

    @property
    def columns(self) -> list[tuple[str, str]]:
        return columns(self.results.spec)

    def ranked(self, n: int) -> list[Entry]:
        """The policies at size n evaluated on the sweep's held-out set, cheapest first."""
        entries = [self.entries[(n, c)] for c, kind in self.columns if kind != "bound"]
        return sorted((e for e in entries if e.on_heldout_set), key=lambda e: e.mean)


# ---- paired comparisons ---------------------------------------------------------------------------


def paired_rows(results: Results, entries: dict[tuple[int, str], Entry], reference_column: str = CLASSICAL_BEST) -> list[dict[str, Any]]:
    """Every policy against the reference (classical-best, or the decomposition bound's relaxed policies) at each
    size: per seed the 95% t-interval of the paired difference cost - the reference's cost (`paired`), their mean
    over the paired seeds (`mean`) and that mean in parts of the reference's mean (`share`); None without a pair."""
    rows = []
    for n in results.spec.sizes:
        reference = entries.get((n, reference_column))
        for column, kind in columns(results.spec):
            entry = entries[(n, column)]
            if column == reference_column or kind == "bound" or reference is None or entry.absent == "—":
                continue
            row: dict[str, Any] = {"n": n, "column": column, "paired": [], "not_paired": None}
            if not reference.runs:
                row["not_paired"] = f"{reference_column} is missing"
            elif not entry.runs:
                row["not_paired"] = entry.without_runs
            for run in entry.runs if reference.runs else []:
                ref = reference.runs[0]
                if run.summary["horizon"] != ref.summary["horizon"] or not np.array_equal(
                    run.evaluation["episodes"], ref.evaluation["episodes"]
                ):
                    row["not_paired"] = (
                        f"not paired: {run.summary['episodes']} episodes x {run.summary['horizon']} decisions, {reference_column} "
                        f"{ref.summary['episodes']} x {ref.summary['horizon']}"
                    )
                    continue
                row["paired"].append((run.seed, paired_comparison(run.evaluation["cost"], ref.evaluation["cost"])))
            row["mean"] = float(np.mean([c.mean_difference for _, c in row["paired"]])) if row["paired"] else None
            row["share"] = row["mean"] / reference.mean if row["paired"] and reference.mean else None
            rows.append(row)
    return rows


def reductions(results: Results, entries: dict[tuple[int, str], Entry]) -> dict[tuple[int, str], float]:
    """(n, column) -> 1 - OR-Transformer's mean / the policy's mean, what OR-Transformer saves against each policy, where
    both are on the sweep's held-out set (empty without OR-Transformer)."""
    found = {}
    for n in results.spec.sizes:
        ours = entries.get((n, MethodName.OR_TRANSFORMER))
        for column, kind in columns(results.spec):
            other = entries[(n, column)]
            if (
                ours is not None
                and column != MethodName.OR_TRANSFORMER
                and kind != "bound"
                and ours.on_heldout_set
                and other.on_heldout_set
            ):
                found[(n, column)] = 1 - ours.mean / other.mean
    return found


def tightest_bounds(results: Results, entries: dict[tuple[int, str], Entry]) -> dict[int, dict[str, Any]]:
    """n -> the highest lower bound on the optimum at size n, named (policies.decomposition.tightest_bound): the decomposition
    run's tightest figure, and at n <= SWEEP_ITEMS dp-optimal's (policies.joint_dp.lower_figure, the exact optimum); sizes
    without either are left out."""
    found = {}
    for n in results.spec.sizes:
        candidates = []
        bound = entries.get((n, DECOMPOSITION))
        if bound is not None and bound.runs:
            candidates.append(run_tightest_bound(bound.runs[0].summary))
        exact = entries.get((n, "dp-optimal"))
        if exact is not None and exact.runs and (value := lower_figure(exact.runs[0].summary.get("parameters") or {})) is not None:
            candidates.append({"value": value, "relaxation": EXACT_OPTIMUM})
        if candidates:
            found[n] = max(candidates, key=lambda c: c["value"])
    return found


def bound_ratios(results: Results, entries: dict[tuple[int, str], Entry]) -> dict[tuple[int, str], float]:
    """(n, column) -> the policy's mean / the perfect-information bound's mean - 1, where both are on the sweep's held-out
    set (empty without the bound)."""
    found = {}
    for n in results.spec.sizes:
        bound = entries.get((n, "bound"))
        for column, kind in columns(results.spec):
            entry = entries[(n, column)]
            if bound is not None and kind != "bound" and entry.on_heldout_set and bound.on_heldout_set:
                found[(n, column)] = entry.mean / bound.mean - 1
    return found


# ---- training curves (Figure 1) --------------------------------------------------------------------


class BinnedCurve(NamedTuple):
    """Per non-empty bin: its centre (geometric mean of its edges), the line and the band."""

    update: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    seeds: np.ndarray


def moving_average(values: np.ndarray, window: int = MOVING_AVERAGE) -> np.ndarray:
    """Trailing mean over the last `window` values (over all values so far, for the first window - 1)."""
    sums = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    end = np.arange(1, len(values) + 1)
    start = np.maximum(end - window, 0)
    return (sums[end] - sums[start]) / (end - start)


def binned_curve(curves: list[tuple[np.ndarray, np.ndarray]], bins: int = CURVE_BINS, window: int = MOVING_AVERAGE) -> BinnedCurve:
    """Figure 1's statistic of one method at one size (docs/findings.md) from each seed's (update [U] ascending, cost10 [U]): each seed's
    `window`-update moving average, averaged within `bins` log-spaced bins [e_j, e_{j+1}) (the last closed) over all seeds' update range.
    The line is the mean over the seeds with points in the bin; the band one s.e. across them, or with one seed in all the curves the
    10th-90th percentile of its smoothed values in the bin (NaN where one of several seeds reaches the bin)."""
    first = min(float(u[0]) for u, _ in curves)
    last = max(float(u[-1]) for u, _ in curves)
    edges = np.geomspace(first, last, bins + 1) if last > first else np.array([first, first])
    per_seed = []
    for updates, costs in curves:
        smooth = moving_average(np.asarray(costs, np.float64), window)
        index = np.clip(np.searchsorted(edges, updates, side="right") - 1, 0, len(edges) - 2)
        per_seed.append([smooth[index == j] for j in range(len(edges) - 1)])
    centre, mean, low, high, seeds = [], [], [], [], []
    for j in range(len(edges) - 1):
        values = [seed[j] for seed in per_seed if seed[j].size]
        if not values:
            continue
        means = np.array([v.mean() for v in values])
        centre.append(math.sqrt(edges[j] * edges[j + 1]))
        mean.append(means.mean())
        seeds.append(len(values))
        if len(curves) == 1:
            low.append(np.percentile(values[0], 10))
            high.append(np.percentile(values[0], 90))
        else:
            se = standard_error(means) if len(values) > 1 else math.nan
            low.append(means.mean() - se)
            high.append(means.mean() + se)
    return BinnedCurve(*(np.array(a, dtype=np.float64) for a in (centre, mean, low, high)), np.array(seeds, dtype=np.int64))


def seed_curves(results: Results, entry: Entry) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each finished seed's (update, cost10) from curves.parquet, without non-finite or non-positive costs (log axes)."""
    curves = []
    for run in entry.runs:
        update, cost = results.curves.get((entry.column, entry.n, run.seed), (np.zeros(0), np.zeros(0)))
        keep = np.isfinite(cost) & (cost > 0) & (update >= 1)
        if keep.any():
            curves.append((update[keep], cost[keep]))
    return curves


def reference_costs(results: Results, entries: dict[tuple[int, str], Entry]) -> tuple[dict[int, dict[str, float]], list[str]]:
    """Per size, the mean cost of the first REFERENCE_DECISIONS decisions of classical-best and of each MILP
    on the held-out episodes (module docstring), and a note for each baseline that gets no line."""
    from policies.classical import policy_from_parameters
    from solver_workers.rolling import ReplayPolicy

    references: dict[int, dict[str, float]] = {}
    notes = []
    milps = [m.name for m in results.spec.baselines.milp]
    for n in results.spec.sizes:
        references[n] = {}
        inst = None
        bound = entries.get((n, DECOMPOSITION))
        if bound is not None and bound.runs and bound.horizon >= REFERENCE_DECISIONS:  # its relaxed policies' mean cumulative cost by step
            references[n][DECOMPOSITION] = float(bound.runs[0].summary["cumulative_cost"][REFERENCE_DECISIONS - 1])
        for column in [CLASSICAL_BEST, *milps]:
            entry = entries.get((n, column))
            if entry is None or not entry.runs:
                continue
            run = entry.runs[0]
            s = run.summary
            if s["horizon"] < REFERENCE_DECISIONS:
                notes.append(
                    f"{column} at n = {n}: no reference line, it ran {s['horizon']} decisions per episode "
                    f"(fewer than {REFERENCE_DECISIONS})"
                )
                continue
            inst = inst or results.instance(n)
            tinst = inst.to_torch()
            paths = sample_paths(inst, s["seed"], run.evaluation["episodes"], REFERENCE_DECISIONS)
            if column == CLASSICAL_BEST:
                try:
                    policy = policy_from_parameters(tinst, s["parameters"])
                except (KeyError, TypeError, ValueError) as exc:
                    raise InputError(
                        f"'{run.folder / 'summary.json'}': field 'parameters' does not hold classical-best's tuned family "
                        f"and parameters ({exc})"
                    ) from None
            else:
                table = pq.read_table(run.folder / "decisions.parquet", columns=["episode", "decision", "open", "quantity"])
                decisions = table.filter(pc.less(table.column("decision"), REFERENCE_DECISIONS)).to_pylist()
                row = {e: k for k, e in enumerate(paths.episodes)}
                open_order = np.zeros((len(row), REFERENCE_DECISIONS))
                quantity = np.zeros((len(row), REFERENCE_DECISIONS, inst.n))
                for r in decisions:
                    open_order[row[r["episode"]], r["decision"]] = r["open"]
                    quantity[row[r["episode"]], r["decision"]] = r["quantity"]
                policy = ReplayPolicy(open_order, quantity)
            references[n][column] = evaluate(policy, tinst, paths).mean
    return references, notes


# ---- decision time --------------------------------------------------------------------------------


def timed(call, device: str) -> float:
    """Median wall seconds of REPEATS calls, after one warm-up."""
    synchronize = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    call()
    synchronize()
    seconds = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        call()
        synchronize()
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds))


def milp_times(results: Results, entries: dict[tuple[int, str], Entry]) -> dict[int, dict[str, float]]:
    """Per size, each MILP's seconds per decision (where it ran)."""
    return {
        n: {
            m.name: seconds_per_decision(entries[(n, m.name)].runs[0].folder)
            for m in results.spec.baselines.milp
            if entries[(n, m.name)].runs
        }
        for n in results.spec.sizes
    }


@torch.no_grad()
def decision_times(results: Results, entries: dict[tuple[int, str], Entry], opening: str, device: str) -> list[dict[str, Any]]:
    """Per size and learned method: seconds of one decision on one state and on the held-out batch (None, with
    Entry.without_runs as `absent`, for a method with no finished seed)."""
    from envs.dynamics import initial_state
    from trainers.registry import load_policy

    rows = []
    for n in results.spec.sizes:
        for column, kind in columns(results.spec):
            if kind != "learned":
                continue
            entry = entries[(n, column)]
            row = {"n": n, "column": column, "one_state": None, "batch": None, "batch_size": None, "absent": None}
            rows.append(row)
            if not entry.runs:
                row["absent"] = entry.without_runs
                continue
            run = entry.runs[0]
            inst = results.instance(n)
            policy, _ = load_policy(run.folder.parent / "checkpoint.pt", opening, device, inst)
            tinst = inst.to_torch(device)
            factor = sample_paths(inst, run.summary["seed"], run.evaluation["episodes"], 1, device).factor[:, 0]
            batch, one = initial_state(tinst, factor), initial_state(tinst, factor[:1])
            row.update(
                one_state=timed(lambda: policy(one, tinst), device),  # noqa: B023 (called at once, inside the loop)
                batch=timed(lambda: policy(batch, tinst), device),  # noqa: B023 (called at once, inside the loop)
                batch_size=batch.batch,
            )
    return rows


# ---- the report -----------------------------------------------------------------------------------


def time_decisions(report: Report, device: str = "cpu") -> None:
    """Time each learned policy's decisions on `device` (decision_times) into `report.timings`."""
    report.device = device
    report.timings = decision_times(report.results, report.entries, report.opening, device)


def build_report(root, opening: str = "greedy") -> Report:
    """Read the results directory `root` and compute every table's figures and the curves' reference lines (the
    decision times are `time_decisions`)."""
    if opening not in OPENINGS:
        raise InputError(f"opening: expected one of {list(OPENINGS)}, got {opening!r}")
    results = read_results(root)
    notes: list[str] = []
    entries = {}
    for n in results.spec.sizes:
        for column, kind in columns(results.spec):
            entries[(n, column)] = (
                learned_entry(results, column, n, opening, notes) if kind == "learned" else baseline_entry(results, column, kind, n, notes)
            )
    references, reference_notes = reference_costs(results, entries)
    gaps = paired_rows(results, entries, DECOMPOSITION) if results.spec.baselines.decomposition is not None else []
    return Report(
        results,
        opening,
        entries,
        notes,
        paired_rows(results, entries),
        gaps,
        reductions(results, entries),
        bound_ratios(results, entries),
        references,
        reference_notes,
        milp_times(results, entries),
        tightest_bounds(results, entries),
    )
