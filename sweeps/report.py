"""The report on a sweep's results directory (the contract of sweeps/run.py): the paper's cost table,
paired comparisons against classical-best, the training curves (the paper's Figure 1), the decision time
against the MILP, and one self-contained HTML page. platform/report.py RESULTS_DIR runs it.

  report = build_report("results/quick", opening="greedy")
  write_report(report, "results/quick/report")      table.md, table.csv, curves.png/.svg, decision_time.png, index.html
  results_markdown(report, command)                 the cost table and paired comparisons for docs/results.md

The paper's conventions, and the choices where it is silent:

* Cost table (table "Mean discounted cost over 50 decisions"): a learned method's cell is the mean over
  its finished seeds of each seed's held-out mean, with one standard error across seeds (s.d. with
  ddof 1 over sqrt(seeds)). Finished means completed or diverged: a diverged run keeps its last checkpoint
  and is evaluated, as the paper's table shows its diverged baselines. With one finished seed there is no
  s.e. across seeds: the cell shows that seed's s.e. over the held-out episodes, marked †. A baseline
  (classical-best, a MILP, dp-optimal, the bound) is one evaluation: its s.e. is over held-out episodes.
  Failed, interrupted and pending trials are never averaged and never dropped: the cell counts them
  ("failed (1 of 3 seeds)"). table.csv holds the same cells in long form, one row per size and column.
* Only cells over the sweep's evaluation horizon are ranked (best bold, second underlined), and enter the
  reduction and bound-gap tables; the bound is a lower bound, not a policy, and is never ranked. A
  baseline evaluated on its own episodes or horizon is shown, marked ‡.
* Paired comparisons (envs.evaluation.paired_comparison: the 95% t-interval of cost - classical-best's
  cost) pair two evaluations only of the same instance, episodes and horizon.
* Figure 1 (`binned_curve`): per seed, a ten-update trailing moving average of cost10 (over fewer updates
  at the start), then the mean within 24 logarithmically spaced bins of the update range; the line is
  the mean over seeds, the band one s.e. across seeds, or with one seed the 10th-90th percentile of the
  smoothed values in the bin. Reference lines: the cost sum_{t<10} gamma^t C_t of the first 10 decisions
  from the initial states of the held-out episodes. The evaluation folders hold each episode's total
  only, so the report recomputes it: classical-best from its stored tuned parameters on 10 steps of the
  same held-out paths (a path's prefix does not depend on its length), a MILP by replaying the first 10
  decisions recorded in its decisions.parquet on those paths (a MILP run of fewer decisions gets no line).
* Decision time: the policy of the first finished seed on `device`, the median of REPEATS timed calls
  after a warm-up, on one state (the first held-out episode's initial state) and on the batch of every
  held-out episode's initial state; a MILP's time is the mean of solve_seconds + build_seconds over its
  decisions.parquet (the model is rebuilt at every decision).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
import yaml

from envs.errors import InputError
from envs.evaluation import evaluate, paired_comparison, standard_error
from envs.exogenous import sample_paths
from envs.instance import Instance, atomic_write, atomic_write_text, paper_instance
from envs.results import read_evaluation, read_record
from sweeps.run import BASELINES_SCHEMA, CURVES_SCHEMA, SCHEMA_VERSION, SWEEP_FORMAT, TRIALS_SCHEMA
from sweeps.spec import SweepSpec, Trial

OPENINGS = {"greedy": "Y = 1{p > 0.5}; PPO: the Beta mean", "sampled": "Y ~ Bernoulli(p); PPO: draws from its distribution"}
"""The held-out evaluations of a trial (trainers.experiment)."""
METHOD_LABELS = {"or-transformer": "OR-Transformer", "transformer-ppo": "Transformer-PPO", "hpo": "HPO", "ppo": "PPO"}
"""The learned methods in the paper's column order."""
FINISHED = ("completed", "diverged")
REFERENCE_DECISIONS = 10
MOVING_AVERAGE = 10
CURVE_BINS = 24
REPEATS = 7
ONE_SEED = "†"
OWN_EVALUATION = "‡"


# ---- reading a results directory ------------------------------------------------------------------


@dataclass
class Results:
    root: Path
    record: dict[str, Any]
    """sweep.json: the sweep file, manifest, dates, instance hashes."""
    spec: SweepSpec
    trials: list[dict[str, Any]]
    curves: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]]
    """(method, n, seed) -> (update, cost10) from curves.parquet, by update."""

    def instance(self, n: int) -> Instance:
        """The sweep's instance of size n (the paper's family), checked against sweep.json's hash."""
        inst = paper_instance(n, self.spec.instance_seed)
        if inst.content_hash() != self.record["instance_hashes"][f"n{n}"]:
            raise InputError(f"'{self.root / 'sweep.json'}': the instance hash of n = {n} is not that of the paper instance (n = {n}, "
                             f"seed {self.spec.instance_seed}); the results were written by another version of the instance family")
        return inst


def _read_table(root: Path, name: str, schema: pa.Schema) -> pa.Table:
    path = root / name
    if not path.is_file():
        raise InputError(f"results directory '{root}' has no {name}: the sweep has not finished a run yet (platform/sweep.py writes "
                         "its tables at the end of every run; continue it with --resume)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"'{path}' is not a readable Parquet file ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    missing = [c for c in schema.names if c not in table.column_names]
    if missing:
        raise InputError(f"'{path}' lacks the columns {missing} (expected {schema.names})")
    return table.select(schema.names)


def read_results(root) -> Results:
    """A results directory of platform/sweep.py: sweep.json of this schema version, the spec it ran and
    the trials and curves tables; anything else is one InputError saying what is wrong."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"results directory '{root}' does not exist or is not a directory")
    path = root / "sweep.json"
    if not path.is_file():
        raise InputError(f"'{root}' holds no sweep.json: not a results directory of platform/sweep.py")
    record = read_record(path, SWEEP_FORMAT, SCHEMA_VERSION, "sweep record", "report it with the code that wrote it, or run the sweep again")
    try:
        spec = SweepSpec.from_dict(record.get("sweep"))
    except InputError as exc:
        raise InputError(f"'{path}', field 'sweep': {exc}") from None
    hashes = record.get("instance_hashes")
    if not isinstance(hashes, dict) or any(f"n{n}" not in hashes for n in spec.sizes):
        raise InputError(f"'{path}': field 'instance_hashes' should name the instance of every size {list(spec.sizes)}")
    trials = _read_table(root, "trials.parquet", TRIALS_SCHEMA).to_pylist()
    curves = curve_groups(_read_table(root, "curves.parquet", CURVES_SCHEMA))
    _read_table(root, "baselines.parquet", BASELINES_SCHEMA)  # written with the others; the folders are read whole below
    return Results(root, record, spec, trials, curves)


def curve_groups(table: pa.Table) -> dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]]:
    """Split the curves table (millions of rows in a paper sweep) by (method, n, seed) with one sort."""
    method = table.column("method").combine_chunks().dictionary_encode()
    codes, names = method.indices.to_numpy(zero_copy_only=False), method.dictionary.to_pylist()
    n, seed, update, cost = (table.column(c).to_numpy() for c in ("n", "seed", "update", "cost10"))
    order = np.lexsort((update, seed, n, codes))
    keys = np.stack([codes[order], n[order], seed[order]])
    starts = np.flatnonzero(np.concatenate([[True], (keys[:, 1:] != keys[:, :-1]).any(0)])) if order.size else np.array([], np.int64)
    ends = np.append(starts[1:], order.size)
    return {(names[keys[0, a]], int(keys[1, a]), int(keys[2, a])): (update[order[a:b]].astype(np.float64), cost[order[a:b]].astype(np.float64))
            for a, b in zip(starts, ends)}


# ---- the cost table -------------------------------------------------------------------------------


class Run(NamedTuple):
    """One evaluation: a seed's (learned) or the baseline's; `evaluation` as read by read_evaluation."""

    seed: Optional[int]
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
    absent: Optional[str] = None
    """The cell of a baseline without an evaluation: '—' (not in the sweep at this size) or 'missing'."""
    own_evaluation: bool = False
    """Evaluated on other episodes or another horizon than the sweep's."""

    @property
    def mean(self) -> Optional[float]:
        return float(np.mean([r.summary["mean"] for r in self.runs])) if self.runs else None

    @property
    def se(self) -> Optional[float]:
        """Across seeds with two or more; else the one evaluation's s.e. over episodes."""
        if not self.runs:
            return None
        return standard_error(np.array([r.summary["mean"] for r in self.runs])) if len(self.runs) > 1 else float(self.runs[0].summary["se"])

    @property
    def one_seed(self) -> bool:
        return self.kind == "learned" and len(self.runs) == 1

    @property
    def horizon(self) -> Optional[int]:
        return self.runs[0].summary["horizon"] if self.runs else None

    @property
    def on_heldout_set(self) -> bool:
        """Evaluated on the sweep's episodes and horizon: ranked, and in the reduction and gap tables."""
        return bool(self.runs) and not self.own_evaluation

    @property
    def diverged(self) -> int:
        return self.statuses.get("diverged", 0)


def label(column: str) -> str:
    return METHOD_LABELS.get(column, column)


def decimals(scale: float) -> int:
    """Decimals that show `scale` (an s.e. or a half-width) to two significant digits."""
    return max(0, 1 - math.floor(math.log10(scale))) if scale > 0 else 2


def number(mean: float, se: Optional[float] = None) -> str:
    """mean ± se with the s.e. to two significant digits and the mean to the same decimals."""
    d = decimals(se if se else abs(mean))
    return f"{mean:,.{d}f}" if se is None else f"{mean:,.{d}f} ± {se:,.{d}f}"


def cell(entry: Entry) -> str:
    """The cost table's cell of `entry` (module docstring)."""
    if entry.kind != "learned":
        if not entry.runs:
            return entry.absent or "missing"
        return number(entry.mean, entry.se) + (OWN_EVALUATION if entry.own_evaluation else "")
    others = {status: count for status, count in sorted(entry.statuses.items()) if status not in FINISHED}
    if not entry.runs:
        return ", ".join(f"{status} ({count} of {entry.seeds} seeds)" for status, count in others.items())
    text = number(entry.mean, entry.se) + (ONE_SEED if entry.one_seed else "") + (OWN_EVALUATION if entry.own_evaluation else "")
    if others:
        text += f" ({len(entry.runs)} of {entry.seeds} seeds; " + ", ".join(f"{count} {status}" for status, count in others.items()) + ")"
    return text


def columns(spec: SweepSpec) -> list[tuple[str, str]]:
    """(column, kind) in the paper's order: learned methods, classical-best, each MILP, dp-optimal, the bound."""
    b = spec.baselines
    result = [(m, "learned") for m in METHOD_LABELS if m in spec.methods]
    result += [("classical-best", "baseline")] if b.classical_best else []
    result += [(m.name, "baseline") for m in b.milp]
    result += [("dp-optimal", "baseline")] if b.dp_optimal and 1 in spec.sizes else []
    result += [("bound", "bound")] if b.bound is not None else []
    return result


def _check_instance(results: Results, run: Run, n: int) -> None:
    if run.summary["instance_hash"] != results.record["instance_hashes"][f"n{n}"]:
        raise InputError(f"results folder '{run.folder}' evaluates another instance than the sweep's n = {n} (instance hash "
                         f"{run.summary['instance_hash'][:12]}, the sweep's {results.record['instance_hashes'][f'n{n}'][:12]})")


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
        folder = results.root / "trials" / trial.name / opening
        try:
            run = Run(seed, folder, read_evaluation(folder))
        except InputError as exc:
            raise InputError(f"trial {trial.name} is {status} in trials.parquet, but its {opening} evaluation does not read: {exc}") from None
        _check_instance(results, run, n)
        entry.runs.append(run)
    entry.own_evaluation = any((r.summary["episodes"], r.summary["horizon"]) != (results.spec.episodes, results.spec.horizon) for r in entry.runs)
    return entry


def baseline_entry(results: Results, column: str, kind: str, n: int, notes: list[str]) -> Entry:
    spec = results.spec
    entry = Entry(n, column, kind)
    milp = {m.name: m for m in spec.baselines.milp}.get(column)
    if (column == "dp-optimal" and n != 1) or (milp is not None and milp.sizes is not None and n not in milp.sizes):
        entry.absent = "—"
        return entry
    folder = results.root / "baselines" / f"n{n}" / column
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
class Table:
    """A rendered table: cells as text, `styles` (row, column) -> best | second."""

    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    styles: dict[tuple[int, int], str] = field(default_factory=dict)
    intro: str = ""


@dataclass
class Report:
    results: Results
    opening: str
    device: str
    entries: dict[tuple[int, str], Entry]
    notes: list[str]
    """Failed trials' reasons and missing baselines."""
    paired: list[dict[str, Any]]
    references: dict[int, dict[str, float]]
    reference_notes: list[str]
    timings: list[dict[str, Any]]
    """decision_times."""
    milp_times: dict[int, dict[str, float]]

    @property
    def columns(self) -> list[tuple[str, str]]:
        return columns(self.results.spec)

    def ranked(self, n: int) -> list[Entry]:
        """The policies at size n evaluated on the sweep's held-out set, cheapest first."""
        entries = [self.entries[(n, c)] for c, kind in self.columns if kind != "bound"]
        return sorted((e for e in entries if e.on_heldout_set), key=lambda e: e.mean)


# ---- paired comparisons ---------------------------------------------------------------------------


def paired_rows(results: Results, entries: dict[tuple[int, str], Entry]) -> list[dict[str, Any]]:
    """Every policy against classical-best at each size: per seed the 95% t-interval of the paired
    difference, and the share of seeds whose interval lies below zero."""
    rows = []
    for n in results.spec.sizes:
        reference = entries.get((n, "classical-best"))
        for column, kind in columns(results.spec):
            entry = entries[(n, column)]
            if column == "classical-best" or kind == "bound" or reference is None or entry.absent == "—":
                continue
            row: dict[str, Any] = {"n": n, "column": column, "paired": [], "not_paired": None}
            if not reference.runs:
                row["not_paired"] = "classical-best is missing"
            elif not entry.runs:
                row["not_paired"] = cell(entry)
            for run in entry.runs if reference.runs else []:
                ref = reference.runs[0]
                if run.summary["horizon"] != ref.summary["horizon"] or not np.array_equal(run.evaluation["episodes"], ref.evaluation["episodes"]):
                    row["not_paired"] = (f"not paired: {run.summary['episodes']} episodes x {run.summary['horizon']} decisions, classical-best "
                                         f"{ref.summary['episodes']} x {ref.summary['horizon']}")
                    continue
                row["paired"].append((run.seed, paired_comparison(run.evaluation["cost"], ref.evaluation["cost"])))
            rows.append(row)
    return rows


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
    """Figure 1's statistic of one method at one size from each seed's (update [U] ascending, cost10 [U]):
    the `window`-update moving average of each seed, averaged within `bins` logarithmically spaced bins
    [e_j, e_{j+1}) (the last one closed) over the update range of all seeds. The line is the mean over the
    seeds with points in the bin; the band is one s.e. across them, or with one seed in all the curves the
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
    from envs.classical import policy_from_parameters
    from solver_workers.rolling import ReplayPolicy

    references: dict[int, dict[str, float]] = {}
    notes = []
    milps = [m.name for m in results.spec.baselines.milp]
    for n in results.spec.sizes:
        references[n] = {}
        inst = None
        for column in ["classical-best", *milps]:
            entry = entries.get((n, column))
            if entry is None or not entry.runs:
                continue
            run = entry.runs[0]
            s = run.summary
            if s["horizon"] < REFERENCE_DECISIONS:
                notes.append(f"{column} at n = {n}: no reference line, it ran {s['horizon']} decisions per episode "
                             f"(fewer than {REFERENCE_DECISIONS})")
                continue
            inst = inst or results.instance(n)
            tinst = inst.to_torch()
            paths = sample_paths(inst, s["seed"], run.evaluation["episodes"], REFERENCE_DECISIONS)
            if column == "classical-best":
                try:
                    policy = policy_from_parameters(tinst, s["parameters"])
                except (KeyError, TypeError, ValueError) as exc:
                    raise InputError(f"'{run.folder / 'summary.json'}': field 'parameters' does not hold classical-best's tuned family "
                                     f"and parameters ({exc})") from None
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


def milp_seconds(run: Run) -> float:
    """Mean wall seconds of one MILP decision: building the model and solving it."""
    table = pq.read_table(run.folder / "decisions.parquet", columns=["solve_seconds", "build_seconds"])
    return float(np.mean(table.column("solve_seconds").to_numpy() + table.column("build_seconds").to_numpy()))


def milp_times(results: Results, entries: dict[tuple[int, str], Entry]) -> dict[int, dict[str, float]]:
    """Per size, each MILP's seconds per decision (where it ran)."""
    return {n: {m.name: milp_seconds(entries[(n, m.name)].runs[0]) for m in results.spec.baselines.milp if entries[(n, m.name)].runs}
            for n in results.spec.sizes}


@torch.no_grad()
def decision_times(results: Results, entries: dict[tuple[int, str], Entry], opening: str, device: str) -> list[dict[str, Any]]:
    """Per size and learned method: seconds of one decision on one state and on the held-out batch (None, with
    the cost table's cell as `absent`, for a method with no finished seed)."""
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
                row["absent"] = cell(entry)
                continue
            run = entry.runs[0]
            inst = results.instance(n)
            policy, _ = load_policy(run.folder.parent / "checkpoint.pt", opening, device, inst)
            tinst = inst.to_torch(device)
            factor = sample_paths(inst, run.summary["seed"], run.evaluation["episodes"], 1, device).factor[:, 0]
            batch, one = initial_state(tinst, factor), initial_state(tinst, factor[:1])
            row.update(one_state=timed(lambda: policy(one, tinst), device), batch=timed(lambda: policy(batch, tinst), device), batch_size=batch.batch)
    return rows


# ---- the report -----------------------------------------------------------------------------------


def build_report(root, opening: str = "greedy", device: str = "cpu") -> Report:
    """Read the results directory `root` and compute every table, the curves' reference lines and the decision times."""
    if opening not in OPENINGS:
        raise InputError(f"opening: expected one of {list(OPENINGS)}, got {opening!r}")
    results = read_results(root)
    notes: list[str] = []
    entries = {}
    for n in results.spec.sizes:
        for column, kind in columns(results.spec):
            entries[(n, column)] = (learned_entry(results, column, n, opening, notes) if kind == "learned"
                                    else baseline_entry(results, column, kind, n, notes))
    references, reference_notes = reference_costs(results, entries)
    return Report(results, opening, device, entries, notes, paired_rows(results, entries), references, reference_notes,
                  decision_times(results, entries, opening, device), milp_times(results, entries))


def percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def cost_table(report: Report) -> Table:
    spec = report.results.spec
    cols = report.columns
    table = Table(f"Mean discounted cost over {spec.horizon} decisions ({report.opening} opening)", ["n", *(label(c) for c, _ in cols)], [])
    table.intro = (f"{spec.episodes} held-out episodes of {spec.horizon} decisions per size. Learned methods, {report.opening} opening "
                   f"({OPENINGS[report.opening]}): the mean over finished seeds of each seed's mean, ± one standard error across seeds. "
                   "Baselines: one evaluation, ± one s.e. over its episodes. Lower is better; the best policy of each size is bold, the "
                   "second underlined (the bound is not a policy and is not ranked).")
    for i, n in enumerate(spec.sizes):
        table.rows.append([str(n), *(cell(report.entries[(n, c)]) for c, _ in cols)])
        ranked = report.ranked(n)
        for style, entry in zip(("best", "second"), ranked):
            table.styles[(i, 1 + [c for c, _ in cols].index(entry.column))] = style
    cells = [report.entries[k] for k in report.entries]
    if any(e.one_seed for e in cells):
        table.notes.append(f"{ONE_SEED} one finished seed: no standard error across seeds exists; the s.e. shown is over the held-out "
                           "episodes of that seed.")
    own = [e for e in cells if e.own_evaluation]
    if own:
        table.notes.append(f"{OWN_EVALUATION} evaluated on its own held-out episodes or horizon, so not ranked: " +
                           "; ".join(f"{e.column} at n = {e.n}: {e.runs[0].summary['episodes']} episodes x {e.runs[0].summary['horizon']} decisions"
                                     for e in own))
    if any(e.absent == "—" for e in cells):
        table.notes.append("— not part of the sweep at this size (dp-optimal exists at n = 1 only; a MILP may be limited to some sizes).")
    table.notes += report.notes
    return table


def per_item_table(report: Report) -> Table:
    spec = report.results.spec
    table = Table("Cost per item (mean / n)", ["n", *(label(c) for c, _ in report.columns)], [])
    for n in spec.sizes:
        entries = [report.entries[(n, c)] for c, _ in report.columns]
        table.rows.append([str(n), *(number(e.mean / n, e.se / n) if e.runs else cell(e) for e in entries)])
    return table


def reduction_table(report: Report) -> Optional[Table]:
    """1 - OR-Transformer / method, per size: what OR-Transformer saves against each policy."""
    if "or-transformer" not in report.results.spec.methods:
        return None
    others = [c for c, kind in report.columns if c != "or-transformer" and kind != "bound"]
    table = Table("Cost reduction of OR-Transformer (1 - OR-Transformer / method)", ["n", *(label(c) for c in others)], [])
    for n in report.results.spec.sizes:
        ours = report.entries[(n, "or-transformer")]
        row = [str(n)]
        for c in others:
            other = report.entries[(n, c)]
            row.append(percent(1 - ours.mean / other.mean) if ours.on_heldout_set and other.on_heldout_set else "n/a")
        table.rows.append(row)
    table.notes.append("n/a: one of the two has no evaluation on the sweep's held-out episodes and horizon.")
    return table


def gap_table(report: Report) -> Optional[Table]:
    """method / bound - 1 per size."""
    if report.results.spec.baselines.bound is None:
        return None
    others = [c for c, kind in report.columns if kind != "bound"]
    table = Table("Gap to the perfect-information bound (method / bound - 1)", ["n", *(label(c) for c in others)], [])
    for n in report.results.spec.sizes:
        bound = report.entries[(n, "bound")]
        entries = [report.entries[(n, c)] for c in others]
        table.rows.append([str(n), *(percent(e.mean / bound.mean - 1) if e.on_heldout_set and bound.on_heldout_set else "n/a" for e in entries)])
    table.notes.append("n/a: the method or the bound has no evaluation on the sweep's held-out episodes and horizon.")
    return table


def diverged_table(report: Report) -> Optional[Table]:
    learned = [c for c, kind in report.columns if kind == "learned"]
    if not learned:
        return None
    table = Table("Diverged seeds (of the sweep's seeds)", ["n", *(label(c) for c in learned)], [])
    for n in report.results.spec.sizes:
        entries = [report.entries[(n, c)] for c in learned]
        table.rows.append([str(n), *(f"{e.diverged} of {e.seeds} ({percent(e.diverged / e.seeds)})" for e in entries)])
    return table


def paired_table(report: Report) -> Table:
    table = Table("Paired comparisons against classical-best", ["n", "method", "seeds paired", "mean difference", "95% CI of each seed",
                                                               "CI below zero", "CI above zero"], [])
    table.intro = ("cost - classical-best's cost on the same held-out episodes (envs.evaluation.paired_comparison: the 95% t-interval "
                   "over episodes); a negative difference is cheaper than classical-best. Learned methods: one interval per finished "
                   "seed and the share of seeds whose interval lies below (above) zero.")
    for row in report.paired:
        k = len(row["paired"])
        if not k:
            table.rows.append([str(row["n"]), label(row["column"]), "0", "n/a", row["not_paired"] or "n/a", "n/a", "n/a"])
            continue
        diffs = [c for _, c in row["paired"]]
        d = decimals(float(np.mean([(c.ci_high - c.ci_low) / 2 for c in diffs])))
        seeds = "; ".join(("" if seed is None else f"s{seed}: ") + f"{c.mean_difference:+,.{d}f} [{c.ci_low:+,.{d}f}, {c.ci_high:+,.{d}f}]"
                          for seed, c in row["paired"])
        table.rows.append([str(row["n"]), label(row["column"]), str(k), f"{np.mean([c.mean_difference for c in diffs]):+,.{d}f}", seeds,
                           f"{sum(c.ci_high < 0 for c in diffs)} of {k}", f"{sum(c.ci_low > 0 for c in diffs)} of {k}"])
    if not any(kind == "baseline" and c == "classical-best" for c, kind in report.columns):
        table.notes.append("The sweep has no classical-best baseline: nothing to pair against.")
    table.notes += sorted({r["not_paired"] for r in report.paired if r["paired"] and r["not_paired"]})
    return table


def seconds(value: float) -> str:
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:,.3g} s"


def ratio(value: float) -> str:
    return f"{value:,.0f}x" if value >= 100 else f"{value:.2g}x"


def decision_table(report: Report) -> Table:
    milps = [m.name for m in report.results.spec.baselines.milp]
    header = ["n", "policy", "one state", "held-out batch", *(h for m in milps for h in (f"{m} per decision", f"{m} / one state"))]
    table = Table(f"Decision time ({report.device}, median of {REPEATS} calls)", header, [])
    table.intro = ("Wall time of one decision of each learned policy (the first finished seed's checkpoint) on one state and on the "
                   "initial states of every held-out episode at once, against each MILP's mean build + solve seconds per decision "
                   "(its decisions.parquet), and their ratio.")
    for row in report.timings:
        if row["absent"]:
            cells = [row["absent"], "n/a"]
        else:
            cells = [seconds(row["one_state"]), f"{seconds(row['batch'])} ({row['batch_size']} states)"]
        for m in milps:
            t = report.milp_times[row["n"]].get(m)
            cells += [seconds(t) if t is not None else "n/a", ratio(t / row["one_state"]) if t is not None and row["one_state"] else "n/a"]
        table.rows.append([str(row["n"]), label(row["column"]), *cells])
    return table


def tables(report: Report) -> list[Table]:
    return [t for t in (cost_table(report), per_item_table(report), reduction_table(report), gap_table(report), diverged_table(report),
                        paired_table(report), decision_table(report)) if t is not None]


# ---- rendering ------------------------------------------------------------------------------------


TEXT_COLUMNS = ("method", "policy", "95% CI of each seed")


def markdown(table: Table, command: Optional[str] = None) -> str:
    styled = {"best": "**{}**", "second": "<ins>{}</ins>"}
    lines = [f"## {table.title}", ""]
    if command:
        lines += ["Regenerate with:", "", "```", command, "```", ""]
    if table.intro:
        lines += [table.intro, ""]
    lines += ["| " + " | ".join(table.header) + " |", "|" + "".join(" --- |" if h in TEXT_COLUMNS else " ---: |" for h in table.header)]
    for i, row in enumerate(table.rows):
        cells = [styled[table.styles[(i, j)]].format(c) if (i, j) in table.styles else c for j, c in enumerate(row)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if table.notes:
        lines += [""] + [f"- {note}" for note in table.notes]
    return "\n".join(lines) + "\n"


def manifest_lines(results: Results) -> list[str]:
    r = results.record
    commit = r.get("git_commit") or "unknown"
    return [f"results directory: {results.root}", f"git commit: {commit}" + (" (with uncommitted changes)" if r.get("git_dirty") else ""),
            f"started {r.get('started', '?')}, finished {r.get('finished') or 'not finished'}",
            "versions: " + ", ".join(f"{k} {v}" for k, v in (r.get("versions") or {}).items() if v),
            "hardware: " + ", ".join(f"{k} {v}" for k, v in (r.get("hardware") or {}).items() if v)]


def markdown_report(report: Report) -> str:
    head = [f"# Report on the sweep in {report.results.root}", "", *(f"- {line}" for line in manifest_lines(report.results)), ""]
    return "\n".join(head) + "\n" + "\n".join(markdown(t) for t in tables(report))


def results_markdown(report: Report, command: str) -> str:
    """The cost table and the paired comparisons as Markdown for docs/results.md, with `command` (the one that
    regenerates them) written above each table."""
    head = [f"# Results of the sweep in `{report.results.root}`", "", "Generated by `platform/report.py`; do not edit by hand.", "",
            *(f"- {line}" for line in manifest_lines(report.results)), ""]
    return "\n".join(head) + "\n" + "\n".join(markdown(t, command) for t in (cost_table(report), paired_table(report)))


def csv_text(report: Report) -> str:
    """The cost table in long form: one row per size and column, with every number behind the cell."""
    spec = report.results.spec
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["n", "column", "kind", "opening", "cell", "mean", "se", "se_over", "per_item_mean", "seeds", "finished_seeds", "diverged_seeds",
                     "not_finished", "episodes", "horizon", "rank", "reduction_by_or_transformer", "gap_to_bound"])
    for n in spec.sizes:
        ranked = [e.column for e in report.ranked(n)]
        ours, bound = report.entries.get((n, "or-transformer")), report.entries.get((n, "bound"))
        for column, kind in report.columns:
            e = report.entries[(n, column)]
            over = "" if not e.runs else "episodes" if kind != "learned" else "seeds" if len(e.runs) > 1 else "episodes of one seed"
            reduction = (1 - ours.mean / e.mean) if ours is not None and column != "or-transformer" and kind != "bound" and ours.on_heldout_set \
                and e.on_heldout_set else None
            gap = (e.mean / bound.mean - 1) if bound is not None and kind != "bound" and e.on_heldout_set and bound.on_heldout_set else None
            writer.writerow([n, column, kind, report.opening if kind == "learned" else "", cell(e), e.mean, e.se, over,
                             None if e.mean is None else e.mean / n, e.seeds if kind == "learned" else "", len(e.runs) if kind == "learned" else "",
                             e.diverged if kind == "learned" else "",
                             "; ".join(f"{c} {s}" for s, c in sorted(e.statuses.items()) if s not in FINISHED),
                             e.runs[0].summary["episodes"] if e.runs else None, e.horizon,
                             ranked.index(column) + 1 if column in ranked else None, reduction, gap])
    return out.getvalue()


def html_table(table: Table) -> str:
    tags = {"best": "strong", "second": "u"}
    rows = ["<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in table.header) + "</tr>"]
    for i, row in enumerate(table.rows):
        cells = []
        for j, text in enumerate(row):
            body = html.escape(text)
            if (i, j) in table.styles:
                tag = tags[table.styles[(i, j)]]
                body = f"<{tag}>{body}</{tag}>"
            cells.append(f"<td>{body}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in table.notes)
    return (f"<h2>{html.escape(table.title)}</h2>\n" + (f"<p>{html.escape(table.intro)}</p>\n" if table.intro else "") +
            "<table>\n" + "\n".join(rows) + "\n</table>\n" + (f"<ul class='notes'>{notes}</ul>\n" if notes else ""))


STYLE = ("body{font-family:sans-serif;max-width:80em;margin:2em auto;padding:0 1em}table{border-collapse:collapse;margin:1em 0}"
         "td,th{border:1px solid #bbb;padding:.25em .6em;text-align:right}th{background:#eee}img{max-width:100%}"
         "pre{background:#f6f6f6;padding:1em;overflow:auto}.notes{font-size:.9em;color:#444}")


def html_page(report: Report, images: dict[str, bytes]) -> str:
    """One self-contained page: every table, the figures as data: URIs (PNG) and the sweep's manifest."""
    results = report.results
    figures = "".join(f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{base64.b64encode(images[name]).decode()}'>"
                      f"<figcaption>{html.escape(caption)}</figcaption></figure>\n" for name, caption in FIGURES.items())
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.reference_notes)
    body = [f"<h1>Report on the sweep in {html.escape(str(results.root))}</h1>",
            "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in manifest_lines(results)) + "</ul>",
            *(html_table(t) for t in tables(report)), "<h2>Figures</h2>", figures, f"<ul class='notes'>{notes}</ul>" if notes else "",
            "<h2>Sweep file</h2>", f"<pre>{html.escape(yaml.safe_dump(results.record['sweep'], sort_keys=False))}</pre>",
            "<h2>Instances (content hashes)</h2>",
            "<ul>" + "".join(f"<li>{html.escape(k)}: {html.escape(str(v))}</li>" for k, v in results.record["instance_hashes"].items()) + "</ul>"]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>Sweep report</title>"
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


FIGURES = {"curves.png": "Training curves: cost10 against update, ten-update moving average in 24 log-spaced bins; line the mean over seeds, "
                         "band one s.e. across seeds (one seed: 10th-90th percentile in the bin); dashed: the baselines' cost over the first "
                         "10 held-out decisions.",
           "decision_time.png": "Seconds per decision: each learned policy on one state against each MILP."}


# ---- figures --------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_bytes(figure, fmt: str) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format=fmt, dpi=120, bbox_inches="tight", metadata={"Date": None} if fmt == "svg" else None)
    return buffer.getvalue()


def curves_figure(report: Report):
    """Figure 1: one panel per size, log-log cost10 against update, the baselines' 10-decision costs as lines."""
    plt = _pyplot()
    spec = report.results.spec
    learned = [c for c, kind in report.columns if kind == "learned"]
    figure, axes = plt.subplots(1, len(spec.sizes), figsize=(4.2 * len(spec.sizes), 3.6), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, n in zip(axes[0], spec.sizes):
        drawn = False
        for k, method in enumerate(learned):
            curves = seed_curves(report.results, report.entries[(n, method)])
            if not curves:
                continue
            binned = binned_curve(curves)
            color = colors[k % len(colors)]
            ax.plot(binned.update, binned.mean, color=color, label=f"{label(method)} ({len(curves)} seed{'s' if len(curves) > 1 else ''})")
            ax.fill_between(binned.update, binned.low, binned.high, color=color, alpha=0.25, linewidth=0)
            drawn = True
        for k, (name, value) in enumerate(report.references[n].items()):
            ax.axhline(value, color="black" if name == "classical-best" else colors[(len(learned) + k) % len(colors)], linestyle="--",
                       linewidth=1, label=f"{name} (first {REFERENCE_DECISIONS} decisions)")
        if drawn:
            ax.set_xscale("log")
            ax.set_yscale("log")
        else:
            ax.text(0.5, 0.5, "no training curve", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"n = {n}")
        ax.set_xlabel("update")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[0][0].set_ylabel(f"cost over {REFERENCE_DECISIONS} steps (cost10)")
    figure.tight_layout()
    return figure


def decision_figure(report: Report):
    """Seconds per decision (log scale), grouped by size: each learned policy on one state, and each MILP."""
    plt = _pyplot()
    sizes = report.results.spec.sizes
    series = {label(c): {r["n"]: r["one_state"] for r in report.timings if r["column"] == c} for c, kind in report.columns if kind == "learned"}
    series |= {m.name: {n: report.milp_times[n].get(m.name) for n in sizes} for m in report.results.spec.baselines.milp}
    figure, ax = plt.subplots(figsize=(max(5.0, 0.5 * len(sizes) * max(1, len(series))), 3.6))
    width = 0.8 / max(1, len(series))
    for k, (name, values) in enumerate(series.items()):
        ax.bar(np.arange(len(sizes)) + k * width, [np.nan if values.get(n) is None else values[n] for n in sizes], width, label=name)
    ax.set_xticks(np.arange(len(sizes)) + width * (len(series) - 1) / 2, [f"n = {n}" for n in sizes])
    ax.set_yscale("log")
    ax.set_ylabel("seconds per decision")
    if series:
        ax.legend(fontsize=7)
    figure.tight_layout()
    return figure


def write_report(report: Report, out, markdown_file=None, command: Optional[str] = None) -> dict[str, Path]:
    """Write every output into `out` (each file atomically); with `markdown_file`, also results_markdown there."""
    plt = _pyplot()
    out = Path(out)
    curves, decisions = curves_figure(report), decision_figure(report)
    images = {"curves.png": figure_bytes(curves, "png"), "curves.svg": figure_bytes(curves, "svg"),
              "decision_time.png": figure_bytes(decisions, "png")}
    plt.close(curves)
    plt.close(decisions)
    texts = {"table.md": markdown_report(report), "table.csv": csv_text(report), "index.html": html_page(report, images)}
    written = {}
    for name, data in images.items():
        atomic_write(out / name, lambda tmp, data=data: tmp.write_bytes(data))
        written[name] = out / name
    for name, text in texts.items():
        atomic_write_text(out / name, text)
        written[name] = out / name
    if markdown_file is not None:
        atomic_write_text(Path(markdown_file), results_markdown(report, command or f"python platform/report.py {report.results.root}"))
        written["markdown"] = Path(markdown_file)
    return written
