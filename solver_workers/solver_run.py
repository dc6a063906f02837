"""A whole solver run into a results folder, for platform/milp.py, platform/bound.py and the sweep's
baselines: the journal with the run's identity (checked before anything starts), the Ray solver pool,
and the evaluation format (run_results.records) with the solver's own table. The caller connects to Ray
(ray_access.session.init_ray) between opening the journal and running."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from envs.evaluation import Evaluation, evaluate
from envs.exogenous import ExogenousPaths, sample_paths
from envs.instance import Instance
from plumbing.errors import Interrupted
from policies import lookahead
from policies.decomposition import NAME as DECOMPOSITION
from policies.decomposition import TABLE_DTYPE, DecompositionOptions, combine, tightest_bound
from run_results.records import check_run_folder, clear_run, write_evaluation
from solver_workers.backends import SolverOptions
from solver_workers.pool import (
    InProcessPool,
    Journal,
    Pool,
    bound_identity,
    decision_key,
    decomposition_identity,
    episode_key,
    rolling_identity,
    run_bounds,
    run_decomposition,
    run_rolling,
    split_key,
)
from solver_workers.rolling import ReplayPolicy, RollingOptions

DECISION_COLUMNS = [
    "episode",
    "decision",
    "open",
    "status",
    "solve_seconds",
    "build_seconds",
    "objective",
    "bound",
    "gap",
    "time_limited",
    "fallback",
    "rows",
    "columns",
    "nonzeros",
]
BOUND_COLUMNS = ["episode", "bound", "source", "status", "mip_bound", "uncapacitated_bound", "incumbent", "gap", "seconds"]


@dataclass(frozen=True)
class SolverRun:
    """What every solver run shares: its results folder, the held-out paths it is evaluated on (`seed`, `episodes` x
    `horizon`), the Ray solver pool's actors, whether to write the traces, and the settings summary.json records."""

    out: Path
    seed: int
    episodes: int
    horizon: int
    workers: int
    trace: bool = False
    config: dict[str, Any] | None = None

    @classmethod
    def from_args(cls, out: Path, args) -> SolverRun:
        """The run of a script's parsed flags (cli.scripts.held_out_flags with the solver pool, and --trace), all recorded."""
        return cls(out, args.seed, args.episodes, args.horizon, args.workers, args.trace, vars(args))

    def paths(self, instance: Instance) -> ExogenousPaths:
        return sample_paths(instance, self.seed, self.episodes, self.horizon)

    def recorded_config(self, instance: Instance) -> dict[str, Any]:
        """summary.json's config: the given settings and the instance's size."""
        return {**(self.config or {}), "n": instance.n}


RUN_JOURNALS = {
    "decisions.jsonl": "a rolling-MILP run",
    "bounds.jsonl": "a perfect-information bound",
    "split.jsonl": "a decomposition bound",
}
"""The journal of each kind of solver run (run_results.records.RUNS), by file name."""


def open_journal(out: Path, name: str, key, identity: dict[str, Any], overwrite: bool = False) -> Journal:
    """The journal `name` of the run in `out`; a folder that holds another kind of run is refused
    (run_results.records.check_run_folder), and with `overwrite` the run it holds is removed first, whatever its kind."""
    check_run_folder(out, RUN_JOURNALS[name], overwrite=overwrite, resumable=True)
    if overwrite:
        clear_run(out)
    return Journal(Path(out) / name, key, identity)


def milp_journal(run: SolverRun, instance: Instance, options: RollingOptions, overwrite: bool = False) -> Journal:
    return open_journal(run.out, "decisions.jsonl", decision_key, rolling_identity(instance, run.seed, options), overwrite)


def bound_journal(run: SolverRun, instance: Instance, options: SolverOptions, overwrite: bool = False) -> Journal:
    return open_journal(run.out, "bounds.jsonl", episode_key, bound_identity(instance, run.seed, run.horizon, options), overwrite)


def decomposition_journal(run: SolverRun, instance: Instance, options: DecompositionOptions, overwrite: bool = False) -> Journal:
    identity = decomposition_identity(instance, run.seed, run.horizon, run.episodes, options)
    return open_journal(run.out, "split.jsonl", split_key, identity, overwrite)


EQUAL_SHARES = "equal-shares"
"""The subfolder of a decomposition run with the bound at equal shares K/n, in the evaluation format."""


def decision_summary(records: list[dict]) -> dict:
    """The summary.json entry 'decisions': counts of statuses, time limits and fallbacks, solve times."""
    statuses = Counter(r["status"] for r in records)
    solve_seconds = np.array([r["solve_seconds"] for r in records])
    return {
        "decisions": {
            "count": len(records),
            "statuses": dict(statuses),
            "time_limited": sum(r["time_limited"] for r in records),
            "fallback": sum(r["fallback"] for r in records),
            "licence_limit": statuses.get("licence-limit", 0),
            "solve_seconds_mean": float(solve_seconds.mean()),
            "solve_seconds_max": float(solve_seconds.max()),
        }
    }


def run_milp(run: SolverRun, instance: Instance, journal: Journal, options: RollingOptions) -> dict[str, Any]:
    """The rolling-horizon MILP controller on the run's held-out paths; returns summary.json's content.
    Ctrl-C keeps the journal and ends in cli.scripts.Interrupted."""
    paths = run.paths(instance)
    try:
        open_order, quantity = run_rolling(instance, paths, options, Pool(run.workers), journal)
        records = [journal.records[(e, t)] for e in paths.episodes for t in range(run.horizon)]
        table = pa.table({c: [r[c] for r in records] for c in DECISION_COLUMNS} | {"quantity": [r["quantity"] for r in records]})
        result = evaluate(ReplayPolicy(open_order, quantity), instance.to_torch(), paths, trace=run.trace)
        return write_evaluation(
            run.out,
            f"milp-{options.solver.solver}",
            result,
            run.seed,
            run.recorded_config(instance),
            options.to_dict(),
            decision_summary(records),
            instance=instance,
            tables={"decisions.parquet": table},
        )
    except KeyboardInterrupt:
        done = sum((e, t) in journal for e in paths.episodes for t in range(run.horizon))
        raise interrupted(journal, done, f"{done} of {run.episodes * run.horizon} decisions") from None


def interrupted(journal: Journal, done: int, kept: str) -> Interrupted:
    """The one line of a solver run stopped by Ctrl-C or SIGTERM: what its journal keeps (`kept`, `done` of them), or,
    before its first record, that nothing was kept."""
    if done == 0 or not journal.path.is_file():
        return Interrupted("no results written and nothing recorded yet; re-run the same command to start it again")
    return Interrupted(f"no results written; journal '{journal.path}' keeps {kept}; re-run the same command to resume")


def run_bound(run: SolverRun, instance: Instance, journal: Journal, options: SolverOptions) -> dict[str, Any]:
    """The perfect-information bound of every episode; returns summary.json's content (policy
    'perfect-information-bound', kind 'lower-bound'). Ctrl-C keeps the journal and ends in cli.scripts.Interrupted."""
    paths = run.paths(instance)
    try:
        records = run_bounds(instance, paths, options, Pool(run.workers), journal)
        table = pa.table({c: [r[c] for r in records] for c in BOUND_COLUMNS})
        plan_trace = None
        if run.trace:
            plan = ReplayPolicy(np.array([r["plan_open"] for r in records]), np.array([r["plan_quantity"] for r in records]))
            plan_trace = evaluate(plan, instance.to_torch(), paths, trace=True).trace
        result = Evaluation(np.array([r["bound"] for r in records]), paths.episodes, run.horizon, plan_trace)
        extra = {
            "kind": "lower-bound",
            "episodes_solved_to_optimality": sum(r["status"] == "optimal" for r in records),
            "bound_sources": {s: sum(r["source"] == s for r in records) for s in ("facility-location", "uncapacitated-dp")},
        }
        return write_evaluation(
            run.out,
            "perfect-information-bound",
            result,
            run.seed,
            run.recorded_config(instance),
            {"solver": options.solver, "time_limit": options.time_limit, "threads": options.threads},
            extra,
            instance=instance,
            tables={"bounds.parquet": table},
        )
    except KeyboardInterrupt:
        done = sum(e in journal for e in paths.episodes)
        raise interrupted(journal, done, f"{done} of {run.episodes} episodes") from None


EQUAL_SHARES_FIGURES = ("value", "certified", "extrapolated", "conservative")
"""The figures of the equal-shares split that the best split's summary.json repeats under `equal_shares`."""


def run_decomposition_bound(
    run: SolverRun, instance: Instance, journal: Journal, options: DecompositionOptions, pool: Pool | InProcessPool | None = None
) -> dict[str, Any]:
    """Writes the decomposition bound (policies/decomposition.py) at the best split in `out` and at equal shares in `out`/equal-shares, in
    the evaluation format (policy 'decomposition-bound', kind 'lower-bound'; costs.parquet: the relaxed policies' simulated cost per
    episode; summary.json: the DP figures), with split.parquet (each item's share, values and order counts) and the lookahead tables
    (policies/lookahead.py) in `out`/lookahead, tables.json once every item's file is there. Returns summary.json's content. Ctrl-C keeps
    the journal and ends in cli.scripts.Interrupted. `pool` runs its tasks (default: a pool of `run.workers` actors)."""
    out = Path(run.out)
    paths = run.paths(instance)
    try:
        records, split = run_decomposition(instance, paths, options, pool or Pool(run.workers), journal, out / lookahead.TABLES_DIR)
    except KeyboardInterrupt:
        done = len(journal.records)
        raise interrupted(journal, done, f"{done} records (split-search values and items' figures)") from None
    lookahead.write_manifest(
        out / lookahead.TABLES_DIR,
        instance,
        run.horizon,
        {
            "finite_dtype": TABLE_DTYPE,
            "finite_budget": lookahead.FINITE_BUDGET,
            "stage_tolerance": lookahead.STAGE_TOLERANCE,
            "run_identity": journal.identity,
        },
    )
    figures = {name: combine(records, name, options) for name in ("best", "equal")}
    columns = {"item": [r["item"] for r in records], "lattice_step": [r["lattice_step"] for r in records]}
    for name in ("best", "equal"):
        for field in ("share", "value", "coarse_value", "certified_value", "orders", "discounted_orders"):
            columns[f"{name}_{field}"] = [r[name][field] for r in records]
    table = pa.table(columns)
    config = run.recorded_config(instance)
    parameters = options.to_dict()
    cpu_seconds = float(
        sum(r["cpu_seconds"] for r in records) + sum(r["cpu_seconds"] for key, r in journal.records.items() if key[0] == "grid")
    )

    def extra(name: str) -> dict[str, Any]:
        f = figures[name]
        return {
            "kind": "lower-bound",
            "split": "best" if name == "best" else "equal shares",
            "dp_value": f["value"],
            "coarse_value": f["coarse_value"],
            "certified_value": f["certified"],
            "extrapolated_value": f["extrapolated"],
            "conservative_value": f["conservative"],
            "cumulative_cost": f["cumulative"].tolist(),
            "task_cpu_seconds": cpu_seconds,
        }

    equal = Evaluation(figures["equal"]["costs"], paths.episodes, run.horizon)
    write_evaluation(
        out / EQUAL_SHARES, f"{DECOMPOSITION}-{EQUAL_SHARES}", equal, run.seed, config, parameters, extra("equal"), instance=instance
    )
    best = Evaluation(figures["best"]["costs"], paths.episodes, run.horizon)
    return write_evaluation(
        out,
        DECOMPOSITION,
        best,
        run.seed,
        config,
        parameters,
        {
            **extra("best"),
            "search": split,
            "equal_shares": {k: figures["equal"][k] for k in EQUAL_SHARES_FIGURES},
            "tightest_bound": tightest_bound(figures["best"]["value"], split.get("schedule"), split.get("exact")),
        },
        instance=instance,
        tables={"split.parquet": table},
    )
