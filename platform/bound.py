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

from envs.cli import horizon, positive_int, run_cli, seed, time_limit
from envs.evaluation import EVAL_HORIZON
from envs.exogenous import HELDOUT_EPISODES, HELDOUT_SEED, check_cost_range
from envs.instance import Instance
from envs.job_output import out_argument, resolve_out
from solver_workers.backends import SOLVERS, SolverOptions
from solver_workers.ray_session import init_ray, stop_ray
from solver_workers.runs import bound_journal, run_bound


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instance", required=True, help="instance JSON file")
    parser.add_argument("--episodes", type=positive_int, default=HELDOUT_EPISODES, help="episodes (default 128)")
    parser.add_argument("--horizon", type=horizon, default=EVAL_HORIZON, help="steps per episode (default 50)")
    parser.add_argument("--seed", type=seed, default=HELDOUT_SEED, help=f"exogenous-path seed (default: held-out {HELDOUT_SEED})")
    parser.add_argument("--solver", default="highs", choices=SOLVERS, help="MILP solver (default highs)")
    parser.add_argument("--time-limit", type=time_limit, default=300.0, help="seconds per episode (default 300)")
    parser.add_argument("--threads", type=positive_int, default=1, help="solver threads per worker (default 1)")
    parser.add_argument("--workers", type=positive_int, default=2, help="solver-worker actors (default 2)")
    parser.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else an embedded Ray)")
    parser.add_argument("--out", type=out_argument, required=True, help="output directory")
    parser.add_argument("--trace", action="store_true", help="also write the best anticipative plan's steps.parquet and items.parquet")
    args = parser.parse_args()
    instance = Instance.load(args.instance)
    check_cost_range(instance, args.horizon)  # before Ray starts
    out = resolve_out(args.out)
    options = SolverOptions(args.solver, args.time_limit, 0.0, args.threads)
    journal = bound_journal(out, instance, args.seed, args.horizon, options)
    init_ray(args.workers, args.address)
    summary = run_bound(out, instance, journal, options, args.seed, args.episodes, args.horizon, args.workers, args.trace, vars(args))
    stop_ray()
    optimal = summary["episodes_solved_to_optimality"]
    print(f"perfect-information bound: mean {summary['mean']:.2f} ± {summary['se']:.2f} over {summary['episodes']} episodes "
          f"({optimal} solved to optimality; the rest report proven dual bounds)")


if __name__ == "__main__":
    run_cli(main)
