"""Evaluate the rolling-horizon stochastic MILP controller on held-out episodes with a Ray pool of
solver workers (embedded local Ray, or a cluster under `ray job submit`).

  python platform/milp.py --instance inst.json --solver highs --scenarios 100 --plan-horizon 50 \\
      --time-limit 600 --episodes 128 --horizon 50 --workers 2 --out runs/milp
  ray job submit --working-dir . -- python platform/milp.py --instance /mnt/shared/inst.json --workers 32 --out /mnt/shared/runs/milp

Writes summary.json, costs.parquet (and with --trace steps.parquet, items.parquet) like
platform/evaluate.py, plus decisions.parquet: one row per (episode, decision) with status, solve
seconds, objective, bound, gap, time_limited and fallback. Decisions are journalled in
DIR/decisions.jsonl as they finish, under the run's identity (the instance's content hash and every
setting a decision depends on: --seed, --scenarios, --plan-horizon, --solver, --time-limit, --gap,
--threads, --no-warm-start, --solver-seed; see solver_workers/pool.py). Re-running the same command
resumes, also with more --episodes or a longer --horizon (the journal is extended); a re-run into the
same --out with other settings is refused, and so is a folder that holds another kind of run (an evaluation, a
bound, a training run); --overwrite replaces what --out holds, removing every file of it. Ctrl-C or SIGTERM keeps
the journal.
"""

import json

from cli.output_folders import resolve_out
from cli.scripts import held_out_flags, horizon, mip_gap, positive_int, run_cli, scenarios, script_parser, seed, time_limit
from envs.exogenous import check_cost_range
from envs.history_replay import check_window
from envs.instance import Instance
from ray_access.session import init_ray, stop_ray
from solver_workers.backends import SOLVERS, SolverOptions, licence_note
from solver_workers.model import check_size, stock_columns
from solver_workers.rolling import RollingOptions
from solver_workers.solver_run import SolverRun, milp_journal, run_milp


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--instance", required=True, help="instance JSON file")
    parser.add_argument("--solver", default="highs", choices=SOLVERS, help="MILP solver (default highs)")
    parser.add_argument("--scenarios", type=scenarios, default=100, help="demand scenarios S (default 100)")
    parser.add_argument("--plan-horizon", type=horizon, default=50, help="planning horizon H (default 50)")
    parser.add_argument("--time-limit", type=time_limit, default=600.0, help="seconds per decision (default 600)")
    parser.add_argument("--gap", type=mip_gap, default=0.005, help="relative MIP gap (default 0.005)")
    parser.add_argument("--threads", type=positive_int, default=1, help="solver threads per worker (default 1)")
    parser.add_argument("--no-warm-start", action="store_true", help="do not supply the all-zero plan as the initial incumbent")
    parser.add_argument("--solver-seed", type=seed, default=0, help="seed of the scenario sampling and the solver (default 0)")
    held_out_flags(parser, solver_pool=True)
    parser.add_argument("--trace", action="store_true", help="also write steps.parquet and items.parquet")
    args = parser.parse_args()
    out = resolve_out(args.out, inputs={"--instance": args.instance})
    instance = Instance.load(args.instance)
    check_cost_range(instance, args.horizon)  # before Ray starts
    check_window(args.plan_horizon, instance.lead, args.instance, "--plan-horizon", "a plan", "every plan orders nothing")
    options = RollingOptions(
        args.scenarios,
        args.plan_horizon,
        SolverOptions(args.solver, args.time_limit, args.gap, args.threads, not args.no_warm_start, args.solver_seed),
    )
    check_size(instance.n, args.scenarios, args.plan_horizon, f"--instance '{args.instance}' with --scenarios and --plan-horizon")
    run = SolverRun.from_args(out, args)
    journal = milp_journal(run, instance, options, args.overwrite)
    if note := licence_note(args.solver, stock_columns(instance.n, args.scenarios, args.plan_horizon)):
        print(note, flush=True)
    init_ray(args.workers, args.address)
    summary = run_milp(run, instance, journal, options)
    stop_ray()
    d = summary["decisions"]
    print(
        f"milp-{args.solver}: mean {summary['mean']:.2f} ± {summary['se']:.2f} over {summary['episodes']} episodes; "
        f"{d['count']} decisions, {d['time_limited']} time-limited, {d['fallback']} fallbacks (zero order), statuses "
        f"{json.dumps(d['statuses'])}"
    )


if __name__ == "__main__":
    run_cli(main)
