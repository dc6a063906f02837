"""The perfect-information lower bound on held-out episodes: each episode's deterministic JRP with its
realised demand known in advance, solved in parallel by a Ray pool of solver workers.

  python platform/bound.py --instance inst.json --episodes 128 --horizon 50 --out runs/bound

Writes summary.json (policy 'perfect-information-bound'; mean and s.e. of the per-episode bound),
costs.parquet (episode, discounted_cost = that episode's proven lower bound) and bounds.parquet
(status, which bound, MILP dual bound, uncapacitated DP bound, incumbent, gap, seconds). With --trace,
steps.parquet and items.parquet show the best anticipative plan found (not a policy). The bound is a
proven dual bound, never an incumbent, even when the time limit stops a solve.

Bounds are journalled in DIR/bounds.jsonl as they finish, under the run's identity (the instance's
content hash, --seed, --horizon, --solver, --time-limit, --threads; see solver_workers/pool.py).
Re-running the same command resumes, also with more --episodes (the journal is extended); a re-run
into the same --out with other settings is refused. Ctrl-C or SIGTERM keeps the journal.
"""

import argparse

import numpy as np
import pyarrow as pa

from envs.cli import Interrupted, output_dir, positive_float, positive_int, run_cli, seed
from envs.evaluation import EVAL_HORIZON, Evaluation, evaluate
from envs.exogenous import HELDOUT_EPISODES, HELDOUT_SEED, sample_paths
from envs.instance import Instance
from envs.results import write_evaluation
from solver_workers.backends import SOLVERS, SolverOptions
from solver_workers.pool import Journal, Pool, bound_identity, episode_key, run_bounds
from solver_workers.ray_session import init_ray
from solver_workers.rolling import ReplayPolicy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instance", required=True, help="instance JSON file")
    parser.add_argument("--episodes", type=positive_int, default=HELDOUT_EPISODES, help="episodes (default 128)")
    parser.add_argument("--horizon", type=positive_int, default=EVAL_HORIZON, help="steps per episode (default 50)")
    parser.add_argument("--seed", type=seed, default=HELDOUT_SEED, help=f"exogenous-path seed (default: held-out {HELDOUT_SEED})")
    parser.add_argument("--solver", default="highs", choices=SOLVERS, help="MILP solver (default highs)")
    parser.add_argument("--time-limit", type=positive_float, default=300.0, help="seconds per episode (default 300)")
    parser.add_argument("--threads", type=positive_int, default=1, help="solver threads per worker (default 1)")
    parser.add_argument("--workers", type=positive_int, default=2, help="solver-worker actors (default 2)")
    parser.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else an embedded Ray)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--trace", action="store_true", help="also write the best anticipative plan's steps.parquet and items.parquet")
    args = parser.parse_args()
    instance = Instance.load(args.instance)
    out = output_dir(args.out)
    options = SolverOptions(args.solver, args.time_limit, 0.0, args.threads)
    journal = Journal(out / "bounds.jsonl", episode_key, bound_identity(instance, args.seed, args.horizon, options))
    paths = sample_paths(instance, args.seed, args.episodes, args.horizon)
    try:
        init_ray(args.workers, args.address)
        records = run_bounds(instance, paths, options, Pool(args.workers), journal)
        columns = ["episode", "bound", "source", "status", "mip_bound", "uncapacitated_bound", "incumbent", "gap", "seconds"]
        table = pa.table({c: [r[c] for r in records] for c in columns})
        trace = None
        if args.trace:
            plan = ReplayPolicy(np.array([r["plan_open"] for r in records]), np.array([r["plan_quantity"] for r in records]))
            trace = evaluate(plan, instance.to_torch(), paths, trace=True).trace
        result = Evaluation(np.array([r["bound"] for r in records]), paths.episodes, args.horizon, trace)
        optimal = sum(r["status"] == "optimal" for r in records)
        extra = {"kind": "lower-bound", "episodes_solved_to_optimality": optimal,
                 "bound_sources": {s: sum(r["source"] == s for r in records) for s in ("facility-location", "uncapacitated-dp")}}
        summary = write_evaluation(out, "perfect-information-bound", result, args.seed, {**vars(args), "n": instance.n},
                                   {"solver": args.solver, "time_limit": args.time_limit, "threads": args.threads}, extra, instance=instance, tables={"bounds.parquet": table})
    except KeyboardInterrupt:
        done = sum(e in journal for e in paths.episodes)
        raise Interrupted(f"no results written; journal '{journal.path}' keeps {done} of {len(paths.episodes)} episodes; "
                          "re-run the same command to resume") from None
    print(f"perfect-information bound: mean {summary['mean']:.2f} ± {summary['se']:.2f} over {summary['episodes']} episodes "
          f"({optimal} solved to optimality; the rest report proven dual bounds)")


if __name__ == "__main__":
    run_cli(main)
