"""Decomposition-lookahead benchmark (paper instances, seed 0, T = 50; policies/lookahead.py): per size n, the
tables' build time, their size in memory for both forms, one state's decision time on one torch thread, and
the 128 x 50 held-out evaluation's time, each as wall-clock and as CPU time (one thread: on an idle core the two
agree; on a shared machine the CPU time is the figure to compare). One JSON line per size, with the machine's
load.

Build time: each of `--items` sampled items' tables (solver_workers.decomposition.item_table: the finite
form's fine-grid DP over T and the stationary form's long-horizon DP) is timed at its first-guess share
(guess_shares; the split search is the bound's own work, bench/decomposition.py), and the per-item mean is
scaled to n items (CPU seconds of one worker; the bound's pool spreads them over its workers). Sizes and
times beyond the sampled items come from the sampled items' tables repeated to n items: the work of a
decision and a table's size depend on the items' lattice sizes, not on their values, and the paper family's
items are drawn from one distribution, so the repeated sample stands for the rest (the table size is
scaled from the sampled items' mean, exact when n <= --items).

  python bench/lookahead.py [--sizes 16 64 1024] [--items 32]
"""

import argparse
import json
import os
import time

import numpy as np
import torch

from envs.dynamics import initial_state
from envs.evaluation import EVAL_HORIZON, evaluate
from envs.exogenous import HELDOUT_EPISODES, HELDOUT_SEED, sample_paths
from envs.instance import paper_instance
from policies import lookahead
from solver_workers.decomposition import DecompositionOptions, guess_shares, item_table

REPEATS = 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 1024], help="instance sizes (default 16 64 1024)")
    parser.add_argument("--items", type=int, default=32, help="items whose tables are built and timed per size (default 32)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = DecompositionOptions()
    for n in args.sizes:
        inst = paper_instance(n, 0)
        shares = guess_shares(inst)
        sample = min(n, args.items)
        start = time.process_time()
        built = [item_table(inst, i, float(shares[i]), EVAL_HORIZON, options) for i in range(sample)]
        per_item = (time.process_time() - start) / sample
        items = [built[i % sample] for i in range(n)]
        record = {"n": n, "sampled_items": sample, "build_cpu_seconds_per_item": round(per_item, 3)}
        record["build_cpu_seconds_all_items"] = round(per_item * n, 1)
        tinst = inst.to_torch()
        state = initial_state(tinst, torch.zeros(1))
        forms = {form: lookahead.LookaheadTables.from_items(items, form, EVAL_HORIZON, "") for form in lookahead.FORMS}
        for form, tables in forms.items():
            sampled_bytes = sum(getattr(t, form).nbytes + t.positions.nbytes for t in built)
            record[f"{form}_table_megabytes"] = round(sampled_bytes / sample * n / 2**20, 1)
            policy = lookahead.LookaheadPolicy(tables)
            policy(state, tinst)  # tables onto the device once
            wall, cpu = [], []
            for _ in range(REPEATS):
                policy.reset()
                tick, tock = time.perf_counter(), time.process_time()
                policy(state, tinst)
                wall.append(time.perf_counter() - tick)
                cpu.append(time.process_time() - tock)
            record[f"{form}_decision_ms"] = round(1e3 * float(np.median(wall)), 3)
            record[f"{form}_decision_cpu_ms"] = round(1e3 * float(np.median(cpu)), 3)
        paths = sample_paths(inst, HELDOUT_SEED, HELDOUT_EPISODES, EVAL_HORIZON)
        tick, tock = time.perf_counter(), time.process_time()
        evaluate(lookahead.LookaheadPolicy(forms["finite"]), tinst, paths)
        record["evaluation_seconds_128x50_finite"] = round(time.perf_counter() - tick, 1)
        record["evaluation_cpu_seconds_128x50_finite"] = round(time.process_time() - tock, 1)
        record["load"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
