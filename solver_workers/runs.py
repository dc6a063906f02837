"""A whole solver run into a results folder, for platform/milp.py, platform/bound.py and the sweep's
baselines: the journal with the run's identity (checked before anything starts), the Ray solver pool,
and the evaluation format (envs.results) with the solver's own table. The caller connects to Ray
(solver_workers.ray_session.init_ray) between opening the journal and running."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from envs.cli import Interrupted
from envs.evaluation import Evaluation, evaluate
from envs.exogenous import sample_paths
from envs.instance import Instance
from envs.results import check_run_folder, clear_run, write_evaluation
from policies import lookahead
from solver_workers.backends import SolverOptions
from solver_workers.decomposition import NAME as DECOMPOSITION
from solver_workers.decomposition import TABLE_DTYPE, DecompositionOptions, combine
from solver_workers.pool import (
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


RUN_JOURNALS = {
    "decisions.jsonl": "a rolling-MILP run",
    "bounds.jsonl": "a perfect-information bound",
    "split.jsonl": "a decomposition bound",
}
"""The journal of each kind of solver run (envs.results.RUNS), by file name."""


def open_journal(out: Path, name: str, key, identity: dict[str, Any], overwrite: bool = False) -> Journal:
    """The journal `name` of the run in `out`; a folder that holds another kind of run is refused
    (envs.results.check_run_folder), and with `overwrite` the run it holds is removed first, whatever its kind."""
    check_run_folder(out, RUN_JOURNALS[name], overwrite=overwrite, resumable=True)
    if overwrite:
        clear_run(out)
    return Journal(Path(out) / name, key, identity)


def milp_journal(out: Path, instance: Instance, seed: int, options: RollingOptions, overwrite: bool = False) -> Journal:
    return open_journal(out, "decisions.jsonl", decision_key, rolling_identity(instance, seed, options), overwrite)


def bound_journal(out: Path, instance: Instance, seed: int, horizon: int, options: SolverOptions, overwrite: bool = False) -> Journal:
    return open_journal(out, "bounds.jsonl", episode_key, bound_identity(instance, seed, horizon, options), overwrite)


def decomposition_journal(
    out: Path, instance: Instance, seed: int, horizon: int, episodes: int, options: DecompositionOptions, overwrite: bool = False
) -> Journal:
    identity = decomposition_identity(instance, seed, horizon, episodes, options)
    return open_journal(out, "split.jsonl", split_key, identity, overwrite)


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


def run_milp(
    out: Path,
    instance: Instance,
    journal: Journal,
    options: RollingOptions,
    seed: int,
    episodes: int,
    horizon: int,
    workers: int,
    trace: bool = False,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The rolling-horizon MILP controller on `episodes` x `horizon` of seed `seed`; returns summary.json's content.
    Ctrl-C keeps the journal and ends in envs.cli.Interrupted."""
    paths = sample_paths(instance, seed, episodes, horizon)
    try:
        open_order, quantity = run_rolling(instance, paths, options, Pool(workers), journal)
        records = [journal.records[(e, t)] for e in paths.episodes for t in range(horizon)]
        table = pa.table({c: [r[c] for r in records] for c in DECISION_COLUMNS} | {"quantity": [r["quantity"] for r in records]})
        result = evaluate(ReplayPolicy(open_order, quantity), instance.to_torch(), paths, trace=trace)
        return write_evaluation(
            out,
            f"milp-{options.solver.solver}",
            result,
            seed,
            {**(config or {}), "n": instance.n},
            options.to_dict(),
            decision_summary(records),
            instance=instance,
            tables={"decisions.parquet": table},
        )
    except KeyboardInterrupt:
        done = sum((e, t) in journal for e in paths.episodes for t in range(horizon))
        raise Interrupted(
            f"no results written; journal '{journal.path}' keeps {done} of {episodes * horizon} decisions; "
            "re-run the same command to resume"
        ) from None


def run_bound(
    out: Path,
    instance: Instance,
    journal: Journal,
    options: SolverOptions,
    seed: int,
    episodes: int,
    horizon: int,
    workers: int,
    trace: bool = False,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The perfect-information bound of every episode; returns summary.json's content (policy
    'perfect-information-bound', kind 'lower-bound'). Ctrl-C keeps the journal and ends in envs.cli.Interrupted."""
    paths = sample_paths(instance, seed, episodes, horizon)
    try:
        records = run_bounds(instance, paths, options, Pool(workers), journal)
        table = pa.table({c: [r[c] for r in records] for c in BOUND_COLUMNS})
        plan_trace = None
        if trace:
            plan = ReplayPolicy(np.array([r["plan_open"] for r in records]), np.array([r["plan_quantity"] for r in records]))
            plan_trace = evaluate(plan, instance.to_torch(), paths, trace=True).trace
        result = Evaluation(np.array([r["bound"] for r in records]), paths.episodes, horizon, plan_trace)
        extra = {
            "kind": "lower-bound",
            "episodes_solved_to_optimality": sum(r["status"] == "optimal" for r in records),
            "bound_sources": {s: sum(r["source"] == s for r in records) for s in ("facility-location", "uncapacitated-dp")},
        }
        return write_evaluation(
            out,
            "perfect-information-bound",
            result,
            seed,
            {**(config or {}), "n": instance.n},
            {"solver": options.solver, "time_limit": options.time_limit, "threads": options.threads},
            extra,
            instance=instance,
            tables={"bounds.parquet": table},
        )
    except KeyboardInterrupt:
        done = sum(e in journal for e in paths.episodes)
        raise Interrupted(
            f"no results written; journal '{journal.path}' keeps {done} of {episodes} episodes; re-run the same command to resume"
        ) from None


def run_decomposition_bound(
    out: Path,
    instance: Instance,
    journal: Journal,
    options: DecompositionOptions,
    seed: int,
    episodes: int,
    horizon: int,
    workers: int,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The decomposition bound (solver_workers/decomposition.py) at the best split in `out` and at equal
    shares in `out`/equal-shares, both in the evaluation format (policy 'decomposition-bound', kind
    'lower-bound'; costs.parquet holds the relaxed policies' simulated cost per episode, summary.json the
    DP figures), with split.parquet: every item's share, values and order counts, and the lookahead
    tables (policies/lookahead.py) in `out`/lookahead, tables.json written once every item's file is there. Returns summary.json's
    content. Ctrl-C keeps the journal and ends in envs.cli.Interrupted."""
    paths = sample_paths(instance, seed, episodes, horizon)
    try:
        records, split = run_decomposition(instance, paths, options, Pool(workers), journal, Path(out) / lookahead.TABLES_DIR)
    except KeyboardInterrupt:
        raise Interrupted(
            f"no results written; journal '{journal.path}' keeps {len(journal.records)} records (split-search values and items' figures); "
            "re-run the same command to resume"
        ) from None
    lookahead.write_manifest(
        Path(out) / lookahead.TABLES_DIR, instance, horizon, {"finite_dtype": TABLE_DTYPE, "run_identity": journal.identity}
    )
    figures = {name: combine(records, name, options) for name in ("best", "equal")}
    columns = {"item": [r["item"] for r in records]}
    for name in ("best", "equal"):
        for field in ("share", "value", "coarse_value", "orders", "discounted_orders"):
            columns[f"{name}_{field}"] = [r[name][field] for r in records]
    table = pa.table(columns)
    config = {**(config or {}), "n": instance.n}
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
            "extrapolated_value": f["extrapolated"],
            "conservative_value": f["conservative"],
            "cumulative_cost": f["cumulative"].tolist(),
            "task_cpu_seconds": cpu_seconds,
        }

    equal = Evaluation(figures["equal"]["costs"], paths.episodes, horizon)
    write_evaluation(
        Path(out) / EQUAL_SHARES, f"{DECOMPOSITION}-{EQUAL_SHARES}", equal, seed, config, parameters, extra("equal"), instance=instance
    )
    best = Evaluation(figures["best"]["costs"], paths.episodes, horizon)
    return write_evaluation(
        out,
        DECOMPOSITION,
        best,
        seed,
        config,
        parameters,
        {**extra("best"), "search": split, "equal_shares": {k: figures["equal"][k] for k in ("value", "extrapolated", "conservative")}},
        instance=instance,
        tables={"split.parquet": table},
    )
