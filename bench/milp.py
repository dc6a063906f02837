"""MILP benchmarks: build time and size against a per-variable build (n in {16, 64}, S = 100, H = 50);
HiGHS time to the first incumbent better than the zero plan and the gap after 60 s (n in {1, 4, 16},
paper settings); perfect-information bound time (n in {64, 1024}). One JSON line per figure.

  python bench/milp.py [--quick]
"""

import argparse
import json
import time

import numpy as np
import torch

from envs.dynamics import initial_state
from envs.exogenous import HELDOUT_SEED, sample_paths
from envs.instance import paper_instance
from solver_workers.backends import SolverOptions, load_highs, solve
from solver_workers.bound import episode_bound
from solver_workers.model import build_model, sample_scenarios


def build_per_variable(inst, inventory, in_transit, demand):
    """The same model built the straightforward way: one variable and one row at a time into HiGHS
    (addVar / addRow), returning the loaded solver."""
    import highspy

    S, H, n = demand.shape
    lead = inst.lead.astype(int)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    col = {}

    def var(key, cost, upper=np.inf, integer=False):
        col[key] = len(col)
        h.addVar(0.0, upper)
        h.changeColCost(col[key], cost)
        if integer:
            h.changeColIntegrality(col[key], highspy.HighsVarType.kInteger)

    last_open = H - lead.min()
    for w in range(S):
        for u in range(last_open):
            if (u == 0 and w == 0) or u > 0:
                var(("Y", w, u), inst.K if u == 0 else inst.K * inst.gamma**u / S, 1.0, True)
        for i in range(n):
            for u in range(H - lead[i]):
                if (u == 0 and w == 0) or u > 0:
                    var(("O", w, i, u), 0.0, inst.qbar[i])
    for kind, c in (("R+", inst.h), ("R-", inst.b)):
        for w in range(S):
            for i in range(n):
                for u in range(H):
                    var((kind, w, i, u), inst.gamma**u * c[i] / S)
    rows = 0
    for w in range(S):
        for i in range(n):
            for u in range(H):
                entries = {col[("R+", w, i, u)]: 1.0, col[("R-", w, i, u)]: -1.0}
                if u > 0:
                    entries[col[("R+", w, i, u - 1)]] = -1.0
                    entries[col[("R-", w, i, u - 1)]] = 1.0
                src = u - lead[i]
                if src >= 0 and ("O", 0 if src == 0 else w, i, src) in col:
                    entries[col[("O", 0 if src == 0 else w, i, src)]] = -1.0
                rhs = (inventory[i] if u == 0 else (in_transit[i, u - 1] if u <= 3 else 0.0)) - demand[w, u, i]
                h.addRow(rhs, rhs, len(entries), np.array(list(entries), dtype=np.int32), np.array(list(entries.values())))
                rows += 1
    for kind, *key in list(col):
        if kind == "O":
            w, i, u = key
            index = np.array([col[("O", w, i, u)], col[("Y", 0 if u == 0 else w, u)]], dtype=np.int32)
            h.addRow(-np.inf, 0.0, 2, index, np.array([1.0, -inst.qbar[i]]))
            rows += 1
    return h, rows, len(col)


def emit(**row):
    print(json.dumps(row), flush=True)


def bench_build(sizes):
    for n in sizes:
        inst = paper_instance(n, 0)
        start = initial_state(inst.to_torch(), torch.zeros(1))
        inventory, in_transit = start.inv[0].double().numpy(), start.pipe[0].double().numpy()
        demand = sample_scenarios(inst, 0.0, 100, 50, np.random.default_rng(0))
        t0 = time.perf_counter()
        model = build_model(inst, inventory, in_transit, demand)
        arrays = time.perf_counter() - t0
        load_highs(model, SolverOptions())  # what the back end does: the arrays passed to HiGHS in one call
        arrays_loaded = time.perf_counter() - t0
        t0 = time.perf_counter()
        _, loop_rows, loop_cols = build_per_variable(inst, inventory, in_transit, demand)
        loop = time.perf_counter() - t0
        rows, cols, nnz = model.shape
        emit(
            figure="build",
            n=n,
            S=100,
            H=50,
            rows=rows,
            columns=cols,
            nonzeros=nnz,
            array_build_seconds=round(arrays, 3),
            array_build_and_load_seconds=round(arrays_loaded, 3),
            per_variable_highs_seconds=round(loop, 2),
            speedup=round(loop / arrays_loaded, 1),
            same_size=(loop_rows, loop_cols) == (rows, cols),
        )


def bench_highs(sizes, seconds):
    for n in sizes:
        inst = paper_instance(n, 0)
        inventory = inst.mu
        demand = sample_scenarios(inst, 0.0, 100, 50, np.random.default_rng(0))
        model = build_model(inst, inventory, np.zeros((n, 3)), demand)
        result = solve(model, SolverOptions(time_limit=seconds, gap=0.005, threads=1))
        warm = model.cost @ model.warm_start
        better = [t for t, obj in result.incumbents if obj < warm - 1e-6 * abs(warm)]
        emit(
            figure="highs_paper_settings",
            n=n,
            S=100,
            H=50,
            time_limit=seconds,
            status=result.status,
            seconds=round(result.seconds, 1),
            first_incumbent_better_than_zero_plan_s=round(better[0], 2) if better else None,
            gap=result.gap,
            objective=result.objective,
            bound=result.bound,
            zero_plan_objective=warm,
        )


def bench_bound(sizes, seconds):
    for n in sizes:
        inst = paper_instance(n, 0)
        paths = sample_paths(inst, HELDOUT_SEED, 1, 50)
        record = episode_bound(
            inst, paths.demand[0].double().numpy(), inst.mu, np.zeros((n, 3)), SolverOptions(time_limit=seconds, gap=0.0)
        )
        emit(
            figure="perfect_information_bound",
            n=n,
            T=50,
            time_limit=seconds,
            seconds=round(record["seconds"], 1),
            status=record["status"],
            bound=record["bound"],
            source=record["source"],
            mip_bound=record["mip_bound"],
            uncapacitated_bound=record["uncapacitated_bound"],
            incumbent=record["incumbent"],
            gap_to_incumbent=None if not record["incumbent"] else round(record["incumbent"] / record["bound"] - 1, 5),
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes and short limits (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        bench_build([4]), bench_highs([1], 5), bench_bound([8], 10)
    else:
        bench_build([16, 64]), bench_highs([1, 4, 16], 60), bench_bound([64, 1024], 300)


if __name__ == "__main__":
    main()
