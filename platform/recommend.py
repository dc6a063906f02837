"""A catalogue's answer in one command: what to do for each supplier's items, and what it would have saved.

  python platform/recommend.py --history H.csv --costs C.csv --suppliers S.csv [--rules R.csv] --out runs/catalogue

--history: as platform/fit.py reads it (item, period, demand), optionally with an `ordered` column (the units you
ordered of each item in each period: replayed as they ran, "your orders"). --costs: fit.py's cost table with a
`supplier` column (each item's supplier); --suppliers: the supplier table (supplier, K and optionally lead: the
fixed ordering cost each order from the supplier pays, and a lead time for all its items); --rules: your own reorder
rule, one (s, S) or (R, S) per item (docs/formats.md). Items without a supplier are refused by name, or join the
supplier --unassigned names.

It fits the demand model once over every item, then for each supplier (a Ray task: an embedded Ray here, a cluster
with --address or under `ray job submit`): the decomposition bound with its certificate, classical-best, the
decomposition lookahead and your rule on --episodes held-out episodes, and the backtest of the three and of your orders
on the history in windows of --window periods. It writes under --out: fit/ (the fitted instance and its report),
suppliers/<name>/ (instance.json, bound/, held-out/, backtest/, supplier.json; written under <name>.partial and renamed
when whole), catalogue.md and index.html (the page: per supplier and in total the recommended policy, its expected
cost, its proven distance above the tightest bound, its backtest savings against your rule and orders with paired
intervals, the fit's flags and the command that serves it) and catalogue.json. A plan line with the predicted time
comes first. Re-running the same command keeps the fit and every whole supplier and says so; other inputs or settings
in the same --out are refused, or replaced with --overwrite.
"""

from pathlib import Path

from catalogue.flow import CatalogueInputs, CatalogueOptions, run_catalogue
from cli.output_folders import out_argument, resolve_out
from cli.scripts import horizon, positive_int, ray_address, replicates, run_cli, script_parser, seed
from demand.bootstrap import REPLICATES
from envs.evaluation import EVAL_HORIZON
from envs.exogenous import HELDOUT_EPISODES, HELDOUT_SEED, check_path_size


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--history", required=True, help="CSV or Parquet history: item, period, demand [, ordered]")
    parser.add_argument("--costs", required=True, help="CSV or Parquet cost table: item, h, b, lead, supplier [, qbar]")
    parser.add_argument("--suppliers", required=True, help="CSV or Parquet supplier table: supplier, K [, lead]")
    parser.add_argument("--rules", help="CSV or Parquet rule table: item, order_up_to, reorder_point or review_period")
    parser.add_argument("--unassigned", metavar="SUPPLIER", help="the supplier the items without one join (default: refused)")
    parser.add_argument("--episodes", type=positive_int, default=HELDOUT_EPISODES, help=f"held-out episodes (default {HELDOUT_EPISODES})")
    parser.add_argument("--horizon", type=horizon, default=EVAL_HORIZON, help=f"periods per held-out episode (default {EVAL_HORIZON})")
    parser.add_argument("--window", type=positive_int, default=EVAL_HORIZON, help=f"periods per backtest window (default {EVAL_HORIZON})")
    parser.add_argument("--seed", type=seed, default=HELDOUT_SEED, help=f"held-out seed (default {HELDOUT_SEED})")
    parser.add_argument(
        "--replicates", type=replicates, default=REPLICATES, help=f"the fit's bootstrap replicates, at least 2 (default {REPLICATES})"
    )
    parser.add_argument("--workers", type=positive_int, default=2, help="CPUs for the suppliers' tasks (default 2)")
    parser.add_argument("--address", type=ray_address, help="Ray cluster address (default: RAY_ADDRESS, else an embedded Ray)")
    parser.add_argument("--out", type=out_argument, required=True, help="output folder")
    parser.add_argument("--overwrite", action="store_true", help="replace a catalogue of other inputs or settings that --out holds")
    args = parser.parse_args()
    inputs = CatalogueInputs(args.history, args.costs, args.suppliers, args.rules, args.unassigned)
    read = {"--history": args.history, "--costs": args.costs, "--suppliers": args.suppliers} | (
        {"--rules": args.rules} if args.rules else {}
    )
    out = resolve_out(args.out, inputs=read)
    options = CatalogueOptions(args.episodes, args.horizon, args.seed, args.window)
    check_path_size(1, args.episodes, args.horizon, "--episodes")
    summary = run_catalogue(inputs, Path(out), options, {"replicates": args.replicates}, args.workers, args.address, args.overwrite)
    total = summary["total"]
    print(
        f"catalogue: expected cost {total['mean']:,.1f} ± {total['se']:,.1f} (s.e.) per episode, "
        f"{100 * total['above_bound']:+.2f}% above the tightest bound (at most {100 * total['above_bound_95']:+.2f}%); "
        f"{summary['seconds']:.0f} s (predicted {summary['predicted_seconds']:.0f} s) -> {out / 'index.html'}"
    )


if __name__ == "__main__":
    run_cli(main)
