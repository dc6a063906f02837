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
DIR/equal-shares), with --schedule-rounds R shares by period and factor searched from the best split for up to R rounds,
and at two items the joint optimum itself. summary.json holds the DP's value (dp_value), its grid-converged estimate, the
conservative figure and the tightest figure, named (tightest_bound); costs.parquet the relaxed policies'
simulated cost per episode (for paired comparisons); split.parquet every item's share, values and order counts. Journal: DIR/split.jsonl,
identity: the instance's content hash, --seed, --horizon, --episodes and the grid settings. With k factors and
overdispersion each item's DP is over its own exposure u_i,t with |beta_i| and its phi_i (policies/decomposition.py),
and its relaxed policy runs on its exposure path. docs/methods.md says what each figure is and how far it can be trusted.

Re-running the same command resumes (the perfect-information bound also with more --episodes); a
re-run into the same --out with other settings is refused, and so is a folder that holds another kind of run (the
other kind of bound, a MILP run, an evaluation, a training run), and a flag of the other kind; --overwrite replaces
what --out holds, removing every file of it. Ctrl-C or SIGTERM keeps the journal.
"""

import argparse

from cli.output_folders import resolve_out
from cli.scripts import held_out_flags, non_negative_int, positive_int, positive_real, run_cli, script_parser, time_limit
from envs.exogenous import check_cost_range
from envs.instance import Instance
from plumbing.errors import InputError
from policies import lookahead
from policies.decomposition import SCHEDULE_ROUNDS, DecompositionOptions, certificate_note, check_items, tightest_text
from policies.dp_optimal import LONG_SOLVE
from ray_access.session import init_ray, stop_ray
from solver_workers.backends import SOLVERS, SolverOptions
from solver_workers.bound import solved_note
from solver_workers.solver_run import SolverRun, bound_journal, decomposition_journal, run_bound, run_decomposition_bound

KINDS = ("perfect-information", "decomposition")
DEFAULTS = DecompositionOptions()
KIND_DEFAULTS = {
    "perfect-information": {"solver": "highs", "time_limit": 300.0, "threads": 1, "trace": False},
    "decomposition": {
        "factor_points": DEFAULTS.factor_points,
        "coarse_points": DEFAULTS.coarse_points,
        "tolerance": DEFAULTS.tolerance,
        "schedule_rounds": DEFAULTS.schedule_rounds,
    },
}
"""The settings of one kind of bound, with their defaults: the other kind has no use for them."""


def check_kind_flags(args: argparse.Namespace) -> None:
    """Refuse a flag of the other kind of bound (it would be ignored); fill in the defaults of this kind's."""
    for kind, defaults in KIND_DEFAULTS.items():
        for dest, default in defaults.items():
            if getattr(args, dest) is None:
                setattr(args, dest, default)
            elif kind != args.kind:
                flag = "--" + dest.replace("_", "-")
                raise InputError(
                    f"{flag} is a setting of --kind {kind}; this run is --kind {args.kind}, which has no use for it: drop {flag}"
                )


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--instance", required=True, help="instance JSON file")
    parser.add_argument("--kind", default=KINDS[0], choices=KINDS, help="which bound (default perfect-information)")
    solver = parser.add_argument_group("--kind perfect-information")
    solver.add_argument("--solver", choices=SOLVERS, help="MILP solver (default highs)")
    solver.add_argument("--time-limit", type=time_limit, help="seconds per episode (default 300)")
    solver.add_argument("--threads", type=positive_int, help="solver threads per worker (default 1)")
    solver.add_argument(
        "--trace", action="store_true", default=None, help="also write the best anticipative plan's steps.parquet and items.parquet"
    )
    split = parser.add_argument_group("--kind decomposition")
    split.add_argument(
        "--factor-points", type=positive_int, help=f"factor grid points of the reported values (default {DEFAULTS.factor_points})"
    )
    split.add_argument(
        "--coarse-points",
        type=positive_int,
        help=f"factor grid points of the split search and the convergence check (default {DEFAULTS.coarse_points})",
    )
    split.add_argument(
        "--tolerance", type=positive_real, help=f"relative tolerance of the best split's value (default {DEFAULTS.tolerance:g})"
    )
    split.add_argument(
        "--schedule-rounds",
        type=non_negative_int,
        help=f"rounds of the search over shares by period and factor from the best split, e.g. {SCHEDULE_ROUNDS}; 0: none "
        f"(default {DEFAULTS.schedule_rounds}: it tightens the paper's bounds by 0.8-0.9%% at one to three times the split's "
        "own time, far longer at retail volumes)",
    )
    held_out_flags(parser, solver_pool=True)
    args = parser.parse_args()
    check_kind_flags(args)
    out = resolve_out(args.out, inputs={"--instance": args.instance})
    instance = Instance.load(args.instance)
    check_cost_range(instance, args.horizon)  # before Ray starts
    run = SolverRun.from_args(out, args)
    if args.kind == "decomposition":
        options = DecompositionOptions(
            factor_points=args.factor_points,
            coarse_points=args.coarse_points,
            tolerance=args.tolerance,
            schedule_rounds=args.schedule_rounds,
        )
        item, seconds = check_items(instance, args.horizon, options, f"--instance '{args.instance}'", lookahead.FORMS)  # before Ray starts
        if seconds > LONG_SOLVE:
            print(
                f"decomposition bound: {instance.item_name(item)}'s DP is the largest, about {seconds:,.0f} s a solve on "
                f"{options.factor_points} factor points; each item takes a solve per split round and a few for its figures and tables",
                flush=True,
            )
        journal, compute, result_line = (
            decomposition_journal(run, instance, options, args.overwrite),
            run_decomposition_bound,
            decomposition_line,
        )
    else:
        options = SolverOptions(args.solver, args.time_limit, 0.0, args.threads)
        journal, compute, result_line = bound_journal(run, instance, options, args.overwrite), run_bound, perfect_information_line
    init_ray(args.workers, args.address)
    summary = compute(run, instance, journal, options)
    stop_ray()
    print(result_line(summary))


def decomposition_line(s: dict) -> str:
    """What a decomposition bound's summary says, on one line."""
    return (
        f"decomposition bound: {s['dp_value']:.2f} at the best split (conservative {s['conservative_value']:.2f}), "
        f"{s['equal_shares']['value']:.2f} at equal shares (conservative {s['equal_shares']['conservative']:.2f}); "
        f"relaxed policies simulated: mean {s['mean']:.2f} ± {s['se']:.2f} over {s['episodes']} episodes; "
        f"{certificate_note(s['search'])}; tightest: {tightest_text(s['tightest_bound'])}"
    )


def perfect_information_line(s: dict) -> str:
    """What a perfect-information bound's summary says, on one line."""
    return (
        f"perfect-information bound: mean {s['mean']:.2f} ± {s['se']:.2f} over {s['episodes']} episodes "
        f"({solved_note(s['episodes_solved_to_optimality'], s['episodes'])})"
    )


if __name__ == "__main__":
    run_cli(main)
