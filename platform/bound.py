"""Lower bounds on held-out episodes, computed on a Ray pool of solver workers.

  python platform/bound.py --instance inst.json --episodes 128 --horizon 50 --out runs/bound
  python platform/bound.py --kind decomposition --instance inst.json --out runs/decomposition

--kind perfect-information (the default): each episode's deterministic JRP with its realised demand
known in advance. Writes summary.json (policy 'perfect-information-bound'; mean and s.e. of the
per-episode bound), costs.parquet (episode, discounted_cost = that episode's proven lower bound) and
bounds.parquet (status, which bound, MILP dual bound, uncapacitated DP bound, incumbent, gap, seconds).
With --trace, steps.parquet and items.parquet show the best anticipative plan found (not a policy). The
bound is a proven dual bound, never an incumbent, even when the time limit stops a solve. Journal:
DIR/bounds.jsonl, identity: the instance's content hash, --seed, --horizon, --solver, --time-limit, --threads.

--kind decomposition: the joint setup cost K split into per-item shares, each item solved exactly by
the n = 1 dynamic program, at the best split (to --tolerance) and at equal shares K/n (in
DIR/equal-shares). summary.json holds the DP's value (dp_value), its grid-converged estimate and the
conservative figure; costs.parquet the relaxed policies' simulated cost per episode (for paired
comparisons); split.parquet every item's share, values and order counts. Journal: DIR/split.jsonl,
identity: the instance's content hash, --seed, --horizon, --episodes and the grid settings.
docs/methods.md says what each figure is and how far it can be trusted.

Re-running the same command resumes (the perfect-information bound also with more --episodes); a
re-run into the same --out with other settings is refused. Ctrl-C or SIGTERM keeps the journal.
"""

import argparse

from envs.cli import horizon, positive_int, positive_real, run_cli, seed, time_limit
from envs.evaluation import EVAL_HORIZON
from envs.exogenous import HELDOUT_EPISODES, HELDOUT_SEED, check_cost_range
from envs.instance import Instance
from envs.job_output import out_argument, resolve_out
from solver_workers.backends import SOLVERS, SolverOptions
from solver_workers.decomposition import DecompositionOptions, certificate_note
from solver_workers.ray_session import init_ray, stop_ray
from solver_workers.runs import bound_journal, decomposition_journal, run_bound, run_decomposition_bound

KINDS = ("perfect-information", "decomposition")
DEFAULTS = DecompositionOptions()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instance", required=True, help="instance JSON file")
    parser.add_argument("--kind", default=KINDS[0], choices=KINDS, help="which bound (default perfect-information)")
    parser.add_argument("--episodes", type=positive_int, default=HELDOUT_EPISODES, help="episodes (default 128)")
    parser.add_argument("--horizon", type=horizon, default=EVAL_HORIZON, help="steps per episode (default 50)")
    parser.add_argument("--seed", type=seed, default=HELDOUT_SEED, help=f"exogenous-path seed (default: held-out {HELDOUT_SEED})")
    parser.add_argument("--solver", default="highs", choices=SOLVERS, help="perfect-information: MILP solver (default highs)")
    parser.add_argument("--time-limit", type=time_limit, default=300.0, help="perfect-information: seconds per episode (default 300)")
    parser.add_argument("--threads", type=positive_int, default=1, help="perfect-information: solver threads per worker (default 1)")
    parser.add_argument(
        "--trace", action="store_true", help="perfect-information: also write the best anticipative plan's steps.parquet and items.parquet"
    )
    parser.add_argument(
        "--factor-points",
        type=positive_int,
        default=DEFAULTS.factor_points,
        help=f"decomposition: factor grid points of the reported values (default {DEFAULTS.factor_points})",
    )
    parser.add_argument(
        "--coarse-points",
        type=positive_int,
        default=DEFAULTS.coarse_points,
        help=f"decomposition: factor grid points of the split search and the convergence check (default {DEFAULTS.coarse_points})",
    )
    parser.add_argument(
        "--tolerance",
        type=positive_real,
        default=DEFAULTS.tolerance,
        help=f"decomposition: relative tolerance of the best split's value (default {DEFAULTS.tolerance:g})",
    )
    parser.add_argument("--workers", type=positive_int, default=2, help="solver-worker actors (default 2)")
    parser.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else an embedded Ray)")
    parser.add_argument("--out", type=out_argument, required=True, help="output directory")
    args = parser.parse_args()
    instance = Instance.load(args.instance)
    check_cost_range(instance, args.horizon)  # before Ray starts
    out = resolve_out(args.out)
    if args.kind == "decomposition":
        options = DecompositionOptions(factor_points=args.factor_points, coarse_points=args.coarse_points, tolerance=args.tolerance)
        journal = decomposition_journal(out, instance, args.seed, args.horizon, args.episodes, options)
        init_ray(args.workers, args.address)
        s = run_decomposition_bound(out, instance, journal, options, args.seed, args.episodes, args.horizon, args.workers, vars(args))
        stop_ray()
        print(
            f"decomposition bound: {s['dp_value']:.2f} at the best split (conservative {s['conservative_value']:.2f}), "
            f"{s['equal_shares']['value']:.2f} at equal shares (conservative {s['equal_shares']['conservative']:.2f}); "
            f"relaxed policies simulated: mean {s['mean']:.2f} ± {s['se']:.2f} over {s['episodes']} episodes; "
            f"{certificate_note(s['search'])}"
        )
        return
    options = SolverOptions(args.solver, args.time_limit, 0.0, args.threads)
    journal = bound_journal(out, instance, args.seed, args.horizon, options)
    init_ray(args.workers, args.address)
    summary = run_bound(out, instance, journal, options, args.seed, args.episodes, args.horizon, args.workers, args.trace, vars(args))
    stop_ray()
    optimal = summary["episodes_solved_to_optimality"]
    print(
        f"perfect-information bound: mean {summary['mean']:.2f} ± {summary['se']:.2f} over {summary['episodes']} episodes "
        f"({optimal} solved to optimality; the rest report proven dual bounds)"
    )


if __name__ == "__main__":
    run_cli(main)
