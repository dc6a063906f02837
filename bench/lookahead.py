"""Decomposition-lookahead benchmark (paper instances, seed 0, T = 50; policies/lookahead.py): per size n, the
tables' build time, their size in memory for both forms, one state's decision time on one torch thread, and
the 128 x 50 held-out evaluation's time, each as wall-clock and as CPU time (one thread: on an idle core the two
agree; on a shared machine the CPU time is the figure to compare). One JSON line per size, with the machine's
load.

Build time: each of `--items` sampled items' tables (policies.decomposition.item_table: the finite
form's fine-grid DP over T and the stationary form's long-horizon DP) is timed at its first-guess share
(guess_shares; the split search is the bound's own work, bench/decomposition.py), and the per-item mean is
scaled to n items (CPU seconds of one worker; the bound's pool spreads them over its workers). Sizes and
times beyond the sampled items come from the sampled items' tables repeated to n items: the work of a
decision and a table's size depend on the items' lattice sizes, not on their values, and the paper family's
items are drawn from one distribution, so the repeated sample stands for the rest (the table size is
scaled from the sampled items' mean, exact when n <= --items).

Loading the stationary form from a bound folder: the n items' tables (both forms, as a decomposition bound run
writes them) are saved in a temporary folder, then read two ways in the same run, `--load-repeats` times each,
alternating: `load_tables(..., "stationary")`, which reads the stationary members only, against the full
load that reads every member of every file and keeps the stationary form (the reference). Figures per way: the
median wall-clock seconds, the bytes read (`rchar` of /proc/self/io: bytes read by system calls, page cache
included; the folder was just written, so both ways read from the page cache) and the peak of the memory
allocated while loading (tracemalloc, numpy's arrays included; measured in a separate pass, tracing slows the
load), and the ratios full / stationary-only (keys read_*).

With `--bound DIR --instance FILE` it measures a decomposition bound run's own tables instead (a fitted instance at
retail volumes, say): the folder's size, each form's size in memory and one state's decision time per form (the
instance's initial state at F = 0), on one torch thread.

With `--thin TOL [TOL ...]` besides, on a bound folder whose finite tables keep every stage (a run whose items all
fit their share of lookahead.FINITE_BUDGET, or one written before stages were left out), it measures leaving stages
out (policies/lookahead.py, "stage_knots") at each tolerance against the tables of every stage (the reference): the
share of stages kept, the finite form's megabytes in memory, and the lookahead's (c = 1) cost on the 128 held-out
episodes of 50 periods, paired with the reference's on the same episodes (mean difference and 95% CI).

  python bench/lookahead.py [--sizes 16 64 1024] [--items 32] [--load-repeats 5]
  python bench/lookahead.py --bound runs/dec --instance fitted.json [--thin 16 64 256 1024]
"""

import argparse
import json
import os
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import torch

from envs.dynamics import initial_state
from envs.evaluation import EVAL_HORIZON, evaluate, paired_comparison
from envs.exogenous import HELDOUT_EPISODES, HELDOUT_SEED, sample_paths
from envs.instance import Instance, paper_instance
from policies import lookahead
from policies.decomposition import DecompositionOptions, guess_shares, item_table

REPEATS = 50


def bytes_read() -> int:
    """rchar of /proc/self/io: the bytes this process has read by system calls."""
    with open("/proc/self/io") as lines:
        return next(int(line.split()[1]) for line in lines if line.startswith("rchar:"))


def full_load(folder: Path, inst) -> lookahead.LookaheadTables:
    """The reference: every item's file read whole (both forms), then the stationary form kept."""
    items = [lookahead.ItemTable.load(folder / lookahead.item_file(i)) for i in range(inst.n)]
    return lookahead.LookaheadTables.from_items(items, "stationary", None, inst.content_hash())


def load_figures(inst, items: list, repeats: int) -> dict:
    """Seconds, bytes read and peak allocation of loading the stationary form alone against the full load (module docstring)."""
    ways = {
        "stationary_only": lambda folder: lookahead.load_tables(folder, inst, "stationary"),
        "full": lambda folder: full_load(folder, inst),
    }
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        for i, table in enumerate(items):
            table.save(folder / lookahead.item_file(i))
        lookahead.write_manifest(folder, inst, EVAL_HORIZON, {})
        record = {"table_folder_megabytes": round(sum(f.stat().st_size for f in folder.iterdir()) / 2**20, 1)}
        seconds, read = {way: [] for way in ways}, {}
        for _ in range(repeats):
            for way, load in ways.items():
                before, tick = bytes_read(), time.perf_counter()
                load(folder)
                seconds[way].append(time.perf_counter() - tick)
                read[way] = bytes_read() - before
        peak = {}
        for way, load in ways.items():
            tracemalloc.start()
            load(folder)
            peak[way] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    for way in ways:
        record[f"read_{way}_seconds"] = round(statistics.median(seconds[way]), 4)
        record[f"read_{way}_megabytes_read"] = round(read[way] / 2**20, 2)
        record[f"read_{way}_peak_megabytes"] = round(peak[way] / 2**20, 2)
    record["read_full_over_stationary_only_seconds"] = round(
        statistics.median(seconds["full"]) / statistics.median(seconds["stationary_only"]), 2
    )
    record["read_full_over_stationary_only_bytes_read"] = round(read["full"] / read["stationary_only"], 2)
    record["read_full_over_stationary_only_peak"] = round(peak["full"] / peak["stationary_only"], 2)
    return record


def decision_figures(tables: lookahead.LookaheadTables, tinst, state) -> dict:
    """Median wall and CPU milliseconds of one decision on `tables` (REPEATS calls, after one that copies the tables)."""
    policy = lookahead.LookaheadPolicy(tables)
    policy(state, tinst)  # tables onto the device once
    wall, cpu = [], []
    for _ in range(REPEATS):
        policy.reset()
        tick, tock = time.perf_counter(), time.process_time()
        policy(state, tinst)
        wall.append(time.perf_counter() - tick)
        cpu.append(time.process_time() - tock)
    return {"decision_ms": round(1e3 * float(np.median(wall)), 3), "decision_cpu_ms": round(1e3 * float(np.median(cpu)), 3)}


def bound_figures(folder: Path, instance_file: str) -> dict:
    """A bound run's tables (module docstring): folder megabytes, and per form its megabytes in memory and decision times."""
    inst = Instance.load(instance_file)
    tinst = inst.to_torch()
    state = initial_state(tinst, torch.zeros(1))
    files = list((folder / lookahead.TABLES_DIR).iterdir())
    record = {"n": inst.n, "bound": str(folder), "table_folder_megabytes": round(sum(f.stat().st_size for f in files) / 2**20, 1)}
    for form in lookahead.FORMS:
        tables = lookahead.load_tables(folder, inst, form, EVAL_HORIZON)
        record[f"{form}_table_megabytes"] = round(tables.nbytes / 2**20, 1)
        record |= {f"{form}_{key}": value for key, value in decision_figures(tables, tinst, state).items()}
    return record


def thinning_figures(folder: Path, instance_file: str, tolerances: list[float]) -> list[dict]:
    """Stages left out at each of `tolerances` against the bound folder's every-stage finite tables (module docstring)."""
    inst = Instance.load(instance_file)
    items = [lookahead.ItemTable.load(folder / lookahead.TABLES_DIR / lookahead.item_file(i), forms=("finite",)) for i in range(inst.n)]
    if any(t.finite_stages.size != t.finite.shape[0] for t in items):
        raise SystemExit(f"--thin: the finite tables in {str(folder)!r} leave stages out already; it needs tables of every stage")
    tinst, paths = inst.to_torch(), sample_paths(inst, HELDOUT_SEED, HELDOUT_EPISODES, EVAL_HORIZON)

    def cost(tables):
        return evaluate(lookahead.LookaheadPolicy(tables), tinst, paths).discounted_cost

    reference = cost(lookahead.LookaheadTables.from_items(items, "finite", EVAL_HORIZON, inst.content_hash()))
    records = []
    for tolerance in tolerances:
        kept = [t.kept_at(tolerance) for t in items]
        tables = lookahead.LookaheadTables.from_items(kept, "finite", EVAL_HORIZON, inst.content_hash())
        paired = paired_comparison(cost(tables), reference)
        records.append(
            {
                "n": inst.n,
                "tolerance": tolerance,
                "stages_kept": round(sum(t.finite_stages.size for t in kept) / sum(t.finite.shape[0] for t in items), 4),
                "finite_table_megabytes": round(tables.nbytes / 2**20, 1),
                "reference_mean": round(float(reference.mean()), 1),
                "paired_difference": round(paired.mean_difference, 1),
                "paired_ci": [round(paired.ci_low, 1), round(paired.ci_high, 1)],
                "load": [round(x, 2) for x in os.getloadavg()],
            }
        )
        print(json.dumps(records[-1]), flush=True)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 1024], help="instance sizes (default 16 64 1024)")
    parser.add_argument("--items", type=int, default=32, help="items whose tables are built and timed per size (default 32)")
    parser.add_argument("--load-repeats", type=int, default=5, help="loads of the stationary form timed per way and size (default 5)")
    parser.add_argument("--bound", type=Path, help="a decomposition bound run's folder: measure its tables instead (with --instance)")
    parser.add_argument("--instance", help="the instance file of --bound")
    parser.add_argument("--thin", type=float, nargs="+", help="with --bound: measure leaving stages out at these tolerances")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if (args.bound is None) != (args.instance is None):
        parser.error("--bound and --instance go together")
    if args.thin and args.bound is None:
        parser.error("--thin needs --bound and --instance")
    if args.bound is not None:
        if args.thin:
            thinning_figures(args.bound, args.instance, args.thin)
            return
        print(json.dumps({**bound_figures(args.bound, args.instance), "load": [round(x, 2) for x in os.getloadavg()]}))
        return
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
            record |= {f"{form}_{key}": value for key, value in decision_figures(tables, tinst, state).items()}
        paths = sample_paths(inst, HELDOUT_SEED, HELDOUT_EPISODES, EVAL_HORIZON)
        tick, tock = time.perf_counter(), time.process_time()
        evaluate(lookahead.LookaheadPolicy(forms["finite"]), tinst, paths)
        record["evaluation_seconds_128x50_finite"] = round(time.perf_counter() - tick, 1)
        record["evaluation_cpu_seconds_128x50_finite"] = round(time.process_time() - tock, 1)
        record |= load_figures(inst, items, args.load_repeats)
        record["load"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
