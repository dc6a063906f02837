"""Evaluate a policy on held-out exogenous paths and write summary.json, costs.parquet (and traces).

  python platform/evaluate.py --instance inst.json --policy classical-best --out runs/eval

POLICY is one of: {rules} (tuned rules, policies/classical.py), dp-optimal (instances of 1 to 3 items under one factor:
the dynamic-programming optimum for this horizon; at n = 1 policies/dp_optimal.py, exact for an item whose domain spans at
most 2,000 units, on a coarse lattice above that, as its summary's exact_lattice and lattice_step say; at n = 2 or 3 the
joint DP of policies/joint_dp.py, its orders in whole units within the caps, its summary's relaxed_expected_cost a lower
figure on the optimum where a cap is fractional, and refused with its size where it does not fit), decomposition-lookahead (the
joint rule on the decomposition bound's per-item values, policies/lookahead.py: its tables computed now) or
decomposition-lookahead:DIR (the tables of a decomposition bound run, platform/bound.py --kind
decomposition --out DIR, with the same --horizon), checkpoint:PATH (a trained policy; --mode greedy or
sampled), or user-rule:PATH (the user's own rule: per item an (s, S) or a review period and S from the rule table
PATH, policies/user_rule.py; docs/formats.md). Classical families and the lookahead's threshold are tuned on training paths (a seed disjoint
from the held-out one) before the evaluation. --seed picks the exogenous paths; its default is the
documented held-out seed. An --out that holds a run (an evaluation, a bound, a MILP or a training run) is refused;
--overwrite replaces it, removing every file of it. An --out inside the policy's folder (decomposition-lookahead:DIR,
checkpoint:PATH) or inside another run's folder (a bound's equal-shares/, a backtest's policy folder) is refused, with
--overwrite too.
"""

import textwrap

from cli.output_folders import resolve_out
from cli.scripts import device, held_out_flags, learned_policy_flags, run_cli, script_parser
from envs.evaluation import evaluate
from envs.exogenous import sample_paths
from envs.instance import Instance
from policies.classical import POLICY_NAMES
from policies.lookahead import FORMS
from policies.lookahead import NAME as LOOKAHEAD
from policies.names import TABLES_PREFIX, policy_spec
from run_results.records import EVALUATION, check_run_folder, clear_run, write_evaluation
from trainers.resolver import resolve


def main() -> None:
    rules = textwrap.fill(", ".join(POLICY_NAMES), 100, initial_indent=" " * 18, break_on_hyphens=False).strip()
    parser = script_parser(__doc__.format(rules=rules))
    parser.add_argument("--instance", required=True, help="instance JSON file")
    parser.add_argument("--policy", required=True, type=policy_spec, metavar="POLICY", help="policy name (see above)")
    learned_policy_flags(parser, "checkpoint:PATH")
    parser.add_argument(
        "--lookahead-form",
        choices=FORMS,
        help="for decomposition-lookahead: finite-horizon tables for --horizon, or the stationary ones (default finite)",
    )
    held_out_flags(parser, solver_pool=False)
    parser.add_argument("--trace", action="store_true", help="also write steps.parquet and items.parquet")
    parser.add_argument("--device", default="cpu", type=device, help="torch device: cpu, cuda or cuda:K (default cpu)")
    args = parser.parse_args()
    if args.lookahead_form is not None and not args.policy.lookahead:
        parser.error(f"--lookahead-form: applies to {LOOKAHEAD} and {TABLES_PREFIX}DIR only, not to --policy {args.policy}")
    read = {"--policy": args.policy.path}
    tables = read if args.policy.lookahead else {}  # a checkpoint's folder is a run's
    resolve_out(args.out, inputs={"--instance": args.instance} | read, folders=tables)
    check_run_folder(args.out, EVALUATION, overwrite=args.overwrite, resumable=False)
    instance = Instance.load(args.instance)
    paths = sample_paths(instance, args.seed, args.episodes, args.horizon, args.device)  # first: it checks the cost range
    form = args.lookahead_form or FORMS[0]
    resolved = resolve(args.policy, instance, args.horizon, args.mode, form, args.device, progress=True, precision=args.precision)
    label, parameters = resolved.label, resolved.parameters
    result = evaluate(resolved.policy, instance.to_torch(args.device), paths, trace=args.trace, progress="evaluate")
    config = {**vars(args), "policy": args.policy.name, "lookahead_form": form if args.policy.lookahead else None, "n": instance.n}
    if args.overwrite:
        clear_run(args.out)
    summary = write_evaluation(args.out, label, result, args.seed, config, parameters, instance=instance)
    print(
        f"{label}{resolved.network_note()}: mean {summary['mean']:.2f} ± {summary['se']:.2f} (s.e.) over "
        f"{summary['episodes']} episodes of {summary['horizon']} steps -> {args.out}"
    )


if __name__ == "__main__":
    run_cli(main)
