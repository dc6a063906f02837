"""The Ray pool of CPU solver workers: rolling-horizon decisions and bound solves in parallel across
episodes, on an embedded local Ray or a cluster.

Fault tolerance: actors restart after a crash and Ray retries their in-flight call (`max_restarts`,
`max_task_retries`); a worker that stays dead is replaced and its task resubmitted. Retries are at-least-once, so every
result is keyed ((episode, decision) for decisions, episode for bounds) and appended to a JSON-lines journal as it
arrives (flushed and fsynced); the journal keeps the first record per key, and a re-run skips what is done.

A journal's first line is the identity of the run that wrote it (`rolling_identity`, `bound_identity`,
`decomposition_identity`: the instance's hash and every setting a record depends on, never the worker count nor the
Ray address); a re-run with another identity, or a journal without one, is refused with an InputError naming every
field that differs. What each identity holds and why: docs/runs-and-results.md, "Solver runs". Every record carries
the `node_id`, `node_ip`, `node_name` and `pid` of the worker that made it (`where`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from tqdm.auto import tqdm

from envs.dynamics import State, initial_state, step
from envs.exogenous import ExogenousPaths
from envs.instance import Instance
from plumbing import validate
from plumbing.errors import InputError
from plumbing.files import atomic_write_text, read_text
from plumbing.validate import differences
from policies import dp_optimal, joint_dp, lookahead, share_schedule
from policies.decomposition import SCHEDULE, DecompositionOptions, item_figures, item_values, search_split
from ray_access.session import this_node
from run_results.records import append_json_line, json_line
from solver_workers.backends import SolverOptions
from solver_workers.bound import episode_bound
from solver_workers.rolling import RollingOptions, decide

ACTOR_RESTARTS = 3


def solver_identity(options: SolverOptions) -> dict[str, Any]:
    return {
        "solver": options.solver,
        "time_limit": options.time_limit,
        "gap": options.gap,
        "threads": options.threads,
        "warm_start": options.warm_start,
        "solver_seed": options.seed,
    }


def rolling_identity(instance: Instance, seed: int, options: RollingOptions) -> dict[str, Any]:
    """What a rolling-horizon decision record depends on (module docstring)."""
    return {
        "instance_hash": instance.content_hash(),
        "n": instance.n,
        "seed": int(seed),
        "scenarios": options.scenarios,
        "plan_horizon": options.plan_horizon,
        **solver_identity(options.solver),
    }


def bound_identity(instance: Instance, seed: int, horizon: int, options: SolverOptions) -> dict[str, Any]:
    """What an episode's bound record depends on (module docstring)."""
    return {
        "instance_hash": instance.content_hash(),
        "n": instance.n,
        "seed": int(seed),
        "horizon": int(horizon),
        **solver_identity(options),
    }


def decomposition_identity(instance: Instance, seed: int, horizon: int, episodes: int, options: DecompositionOptions) -> dict[str, Any]:
    """What the decomposition bound's records depend on (module docstring)."""
    return {
        "instance_hash": instance.content_hash(),
        "n": instance.n,
        "seed": int(seed),
        "horizon": int(horizon),
        "episodes": int(episodes),
        "lattice_resolution": dp_optimal.RESOLUTION,
        **options.to_dict(),
    }


def decision_key(record: dict) -> tuple[int, int]:
    return record["episode"], record["decision"]


def episode_key(record: dict) -> int:
    return record["episode"]


def outcome(record: dict) -> dict:
    """A decomposition record's figures, without its key (`split_key`)."""
    return {k: v for k, v in record.items() if k not in ("phase", "round", "item")}


def split_key(record: dict) -> tuple[str, int, int]:
    """A decomposition record: ('grid', round, item) for an item's values on a round's shares, ('item', -1, item) for its figures,
    ('schedule', -1, -1) for the schedule search's outcome, ('exact', -1, -1) for the joint optimum of two items."""
    return record["phase"], record["round"], record["item"]


class Journal:
    """Append-only JSON-lines results of one run, keyed by `key(record)`, first line {"identity": identity}; a torn last line is ignored.
    Opening a journal of another identity, or without one, raises InputError; the file is created at the first record, the identity
    line written first (atomically)."""

    def __init__(self, path: str | os.PathLike, key: Callable[[dict], Any], identity: dict[str, Any]):
        self.path, self.key = Path(path), key
        self.identity = json.loads(json.dumps(identity))
        self.records: dict[Any, dict] = {}
        self.started = self.path.exists()
        if not self.started:
            return
        text = read_text(self.path, "journal")
        lines = text.splitlines()
        header = json_line(lines[0]) if lines else None
        if not (isinstance(header, dict) and isinstance(header.get("identity"), dict)):
            raise InputError(
                f"journal '{self.path}' has no run identity (it was written before identities were recorded, or it is not a journal), "
                f"so it cannot be checked against this run's settings; start anew with --overwrite or another --out"
            )
        if changed := differences(header["identity"], self.identity):
            raise InputError(
                f"journal '{self.path}' belongs to a run with other settings ({'; '.join(changed)}); "
                f"re-run with its settings to resume it, or start anew with --overwrite or another --out"
            )
        for line in lines[1:]:
            record = json_line(line)
            if isinstance(record, dict):
                self.records.setdefault(self.key(record), record)

    def __contains__(self, key) -> bool:
        return key in self.records

    def add(self, record: dict) -> bool:
        """Append `record` unless its key is already there; returns whether it was new."""
        key = self.key(record)
        if key in self.records:
            return False
        if not self.started:
            atomic_write_text(self.path, json.dumps({"identity": self.identity}) + "\n")
            self.started = True
        append_json_line(self.path, record)
        self.records[key] = record
        return True

    def check(self, identity: dict[str, Any]) -> None:
        """Refuse to store results of a computation with another identity (a caller's bug, not bad input)."""
        if json.loads(json.dumps(identity)) != self.identity:
            raise ValueError(f"journal '{self.path}' was opened with another identity than this computation's")


class SolverWorker:
    """What a solver worker does, one task at a time (one solver thread by default): a rolling MILP decision, an
    episode's bound, the decomposition's per-item work. `SolverActor` is it as a Ray actor (the dashboard and the logs
    name it SolverWorker); `InProcessPool` runs it in the calling process."""

    def __init__(self):
        torch.set_num_threads(1)

        self.where = this_node()  # added to every record it returns

    def pid(self) -> int:
        return os.getpid()

    def decide(
        self, instance: Instance, inventory, in_transit, factor: float | list[float], episode: int, decision: int, options: RollingOptions
    ) -> dict:
        return decide(instance, inventory, in_transit, factor, episode, decision, options) | self.where

    def bound(self, instance: Instance, demand, inventory, in_transit, episode: int, options: SolverOptions) -> dict:
        return {"episode": int(episode), **episode_bound(instance, demand, inventory, in_transit, options), **self.where}

    def split_values(self, instance: Instance, item: int, setups: list, horizon: int, round_: int, options: DecompositionOptions) -> dict:
        start, cpu = time.perf_counter(), time.process_time()
        values = item_values(instance, item, setups, horizon, options.coarse_points, options)
        return {
            "phase": "grid",
            "round": round_,
            "item": item,
            "setups": setups,
            "values": values.tolist(),
            "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu,
            **self.where,
        }

    def split_item(
        self,
        instance: Instance,
        item: int,
        shares: dict,
        horizon: int,
        paths: ExogenousPaths,
        options: DecompositionOptions,
        known: dict,
        tables: str | None = None,
    ) -> dict:
        return {"phase": "item", "round": -1, **item_figures(instance, item, shares, horizon, paths, options, known, tables), **self.where}

    def joint_optimum(self, instance: Instance, horizon: int, options: DecompositionOptions) -> dict:
        """The joint DP's value with the caps raised (policies/joint_dp.py) on the bound's factor grid, or why it was not run."""
        start = time.perf_counter()
        record = {"phase": "exact", "round": -1, "item": -1}
        try:
            solution = joint_dp.solve(instance, horizon, "raised", options.factor_points, options.factor_width, tables=False)
        except InputError as exc:  # several factors, or a joint lattice too large for this worker's memory
            return record | {"value": None, "not_run": str(exc), **self.where}
        return record | {"value": solution.expected_cost, "states": solution.states, "seconds": time.perf_counter() - start, **self.where}

    def schedule_item(self, instance: Instance, item: int, schedule: np.ndarray, horizon: int, options: DecompositionOptions) -> dict:
        """The item's value and order frequencies under its setup-cost schedule [T_dec, M] (policies/share_schedule.py)."""
        result = share_schedule.item_result(instance, item, schedule, horizon, options)
        return {"item": item, "value": result.value, "frequencies": result.frequencies}


SolverActor = ray.remote(num_cpus=1, max_restarts=ACTOR_RESTARTS, max_task_retries=ACTOR_RESTARTS)(SolverWorker)


class InProcessPool:
    """The pool's `run` in the calling process, one task after another (a task that is itself one of many on a cluster:
    a catalogue's supplier, catalogue/flow.py). Object references among a task's arguments are fetched first, as an
    actor call would."""

    def __init__(self, progress: bool = True, report: Callable[[str, int, int], None] | None = None):
        self.worker = SolverWorker()
        self.progress = progress
        self.report = report  # called with (desc, done, total) after each task

    def run(self, tasks, on_result, total: int, done: int, desc: str, leave: bool = True) -> None:
        pending = list(tasks)
        with tqdm(total=total, initial=done, desc=desc, unit="task", smoothing=0.1, leave=leave, disable=not self.progress) as bar:
            while pending:
                method, args = pending.pop(0)
                args = [ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args]
                pending.extend(on_result(getattr(self.worker, method)(*args)))
                bar.update(1)
                done += 1  # a disabled bar counts nothing
                if self.report is not None:
                    self.report(desc, done, total)


class Pool:
    """`workers` solver actors (SolverActor); `run` keeps each busy and replaces the ones that stay dead."""

    def __init__(self, workers: int):
        validate.integer(workers, "workers", 1)
        self.actors = [SolverActor.remote() for _ in range(workers)]

    def run(
        self,
        tasks: Iterable[tuple[str, tuple]],
        on_result: Callable[[dict], Iterable[tuple[str, tuple]]],
        total: int,
        done: int,
        desc: str,
        leave: bool = True,
    ) -> None:
        """Run (method, args) tasks; `on_result` stores a result and returns follow-up tasks. The progress bar stays on the
        console when done with `leave`."""
        pending = list(tasks)
        in_flight: dict[ray.ObjectRef, tuple[int, str, tuple]] = {}
        idle = list(range(len(self.actors)))
        with tqdm(total=total, initial=done, desc=desc, unit="task", smoothing=0.1, leave=leave) as bar:
            while pending or in_flight:
                while pending and idle:
                    slot = idle.pop()
                    method, args = pending.pop(0)
                    in_flight[getattr(self.actors[slot], method).remote(*args)] = (slot, method, args)
                ready, _ = ray.wait(list(in_flight), num_returns=1)
                slot, method, args = in_flight.pop(ready[0])
                try:
                    result = ray.get(ready[0])
                except ray.exceptions.RayTaskError as exc:
                    if isinstance(exc.cause, InputError):  # bad input found in a worker: its one line, not the worker's traceback
                        raise exc.cause from None
                    raise
                except ray.exceptions.RayActorError:
                    self.actors[slot] = SolverActor.remote()  # restarts exhausted: replace, retry the task
                    pending.insert(0, (method, args))
                    idle.append(slot)
                    continue
                idle.append(slot)
                pending.extend(on_result(result))
                bar.update(1)


def run_rolling(
    instance: Instance, paths: ExogenousPaths, options: RollingOptions, pool: Pool, journal: Journal
) -> tuple[np.ndarray, np.ndarray]:
    """Run the rolling-horizon controller on every episode of `paths`, resuming from `journal`.
    Returns the executed actions open [E, T] and quantity [E, T, n]."""
    journal.check(rolling_identity(instance, paths.seed, options))
    E, T, n = paths.num_episodes, paths.horizon, instance.n
    tinst = instance.to_torch(dtype=torch.float64)
    factor = paths.factor.double().numpy()
    demand = paths.demand.double().numpy()
    open_order, quantity = np.zeros((E, T)), np.zeros((E, T, n))
    ref = ray.put(instance)

    def advance(row: int, state: State, record: dict) -> State:
        t = record["decision"]
        open_order[row, t], quantity[row, t] = record["open"], record["quantity"]
        nxt, _ = step(
            tinst,
            state,
            torch.tensor([float(record["open"])], dtype=torch.float64),
            torch.tensor([record["quantity"]], dtype=torch.float64),
            torch.tensor(demand[row, t][None]),
            torch.tensor(factor[row, t + 1 : t + 2]),  # [1] or [1, k]
        )
        return nxt

    states: dict[int, State] = {}
    next_decision: dict[int, int] = {}
    for row, e in enumerate(paths.episodes):  # replay what the journal already holds
        state, t = initial_state(tinst, torch.tensor(factor[row, :1])), 0
        while t < T and (e, t) in journal:
            state, t = advance(row, state, journal.records[(e, t)]), t + 1
        states[row], next_decision[row] = state, t
    row_of = {e: row for row, e in enumerate(paths.episodes)}

    def task(row: int):
        s, t = states[row], next_decision[row]
        return ("decide", (ref, s.inv[0].numpy(), s.pipe[0].numpy(), s.factor[0].tolist(), paths.episodes[row], t, options))

    def on_result(record: dict):
        journal.add(record)
        row = row_of[record["episode"]]
        states[row] = advance(row, states[row], journal.records[(record["episode"], record["decision"])])
        next_decision[row] += 1
        return [task(row)] if next_decision[row] < T else []

    done = sum(next_decision.values())
    pool.run([task(row) for row in range(E) if next_decision[row] < T], on_result, E * T, done, "MILP decisions")
    return open_order, quantity


def run_bounds(instance: Instance, paths: ExogenousPaths, options: SolverOptions, pool: Pool, journal: Journal) -> list[dict]:
    """The perfect-information bound of every episode of `paths` (initial state as in evaluation)."""
    journal.check(bound_identity(instance, paths.seed, paths.horizon, options))
    tinst = instance.to_torch(dtype=torch.float64)
    ref = ray.put(instance)
    demand = paths.demand.double().numpy()
    start = initial_state(tinst, torch.zeros(1, dtype=torch.float64))
    inventory, in_transit = start.inv[0].numpy(), start.pipe[0].numpy()
    tasks = [("bound", (ref, demand[row], inventory, in_transit, e, options)) for row, e in enumerate(paths.episodes) if e not in journal]

    def on_result(record: dict):
        journal.add(record)
        return []

    pool.run(tasks, on_result, paths.num_episodes, paths.num_episodes - len(tasks), "bounds")
    return [journal.records[e] for e in paths.episodes]


def run_decomposition(
    instance: Instance, paths: ExogenousPaths, options: DecompositionOptions, pool: Pool, journal: Journal, tables: Path | None = None
) -> tuple[list[dict], dict]:
    """The decomposition bound (policies/decomposition.py) on the pool, one task per item and round, resuming from `journal`: the split
    search on the coarse factor grid, then each item's figures at the best split and at equal shares, and its lookahead tables at the best
    split in `tables` (an item journalled without its table file runs again). Returns the items' figure records and the search's summary."""
    journal.check(decomposition_identity(instance, paths.seed, paths.horizon, paths.num_episodes, options))
    n, horizon = instance.n, paths.horizon
    ref = ray.put(instance)

    def store(record: dict):
        journal.add(record)
        return []

    def values_of(round_: int, grids: list) -> list:
        tasks = [
            ("split_values", (ref, i, grids[i], horizon, round_, options))
            for i in range(n)
            if grids[i] and ("grid", round_, i) not in journal
        ]
        pool.run(tasks, store, n, n - len(tasks), f"split round {round_ + 1}")
        return [journal.records[("grid", round_, i)]["values"] if grids[i] else [] for i in range(n)]

    search = search_split(instance, options, values_of)
    paths_ref = ray.put(paths)
    tasks = [
        (
            "split_item",
            (
                ref,
                i,
                {"best": float(search.split.shares[i]), "equal": instance.K / n},
                horizon,
                paths_ref,
                options,
                dict(zip(search.setups[i], search.values[i])),
                None if tables is None else str(tables),
            ),
        )
        for i in range(n)
        if ("item", -1, i) not in journal or (tables is not None and not (Path(tables) / lookahead.item_file(i)).exists())
    ]
    pool.run(tasks, store, n, n - len(tasks), "items")
    summary = search.summary(options.tolerance)
    if options.schedule_rounds:
        summary["schedule"] = run_schedule(instance, horizon, search.split.shares, options, pool, journal)
    if 2 <= n <= joint_dp.SWEEP_ITEMS:  # the exact optimum itself, where its joint lattice fits
        if ("exact", -1, -1) not in journal:
            pool.run([("joint_optimum", (ref, horizon, options))], store, 1, 0, "exact optimum")
        summary["exact"] = outcome(journal.records[("exact", -1, -1)])
    return [journal.records[("item", -1, i)] for i in range(n)], summary


def run_schedule(
    instance: Instance, horizon: int, shares: np.ndarray, options: DecompositionOptions, pool: Pool, journal: Journal
) -> dict[str, Any]:
    """The search over shares that depend on the period and the factor (policies.share_schedule.search_schedule) from the best
    constant split `shares`, each round's items as pool tasks. The journal keeps its outcome, not its rounds (each round's
    schedules and frequencies are n x T x M numbers): an interrupted search starts again from the split."""
    if ("schedule", -1, -1) in journal:
        return outcome(journal.records[("schedule", -1, -1)])
    ref = ray.put(instance)
    rounds = [0]

    def results_of(schedule: np.ndarray) -> list[share_schedule.ItemResult]:
        found: dict[int, share_schedule.ItemResult] = {}

        def keep(record: dict):
            found[record["item"]] = share_schedule.ItemResult(record["value"], record["frequencies"])
            return []

        rounds[0] += 1
        tasks = [("schedule_item", (ref, i, schedule[i], horizon, options)) for i in range(instance.n)]
        pool.run(tasks, keep, instance.n, 0, f"{SCHEDULE}: round {rounds[0]}", leave=False)
        return [found[i] for i in range(instance.n)]

    result = share_schedule.search_schedule(instance, horizon, shares, options, results_of=results_of).summary()
    journal.add({"phase": "schedule", "round": -1, "item": -1, **result})
    return result
