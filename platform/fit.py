"""Fit the demand model to a sales history and write an instance file with a fit report next to it (docs/fitting.md).

  python platform/fit.py --history demand.csv --items costs.csv --out inst.json

--history: long form, columns item, period, demand (units sold: integers 0..1,000,000, written as integers); one
row per item and period (0 for a period without sales); periods consecutive integers or dates (YYYY-MM-DD, as dates
or text) at one frequency (daily, weekly, monthly on one day of the month or on month ends, ...); at least 50
periods. --items: columns item, h, b, lead and optionally qbar (default: the least whole number at least
4 lam_i, the paper's rule, the 0.999 quantile of the item's lead-time demand and 1); one row per item
of the history. CSV or Parquet for both. Units are per period of the history (a day for a daily one): h and b per
unit per period, lead in periods, qbar in units per order (the fitted lam is units per period; a qbar below lam is
flagged). docs/formats.md has the formats.

--factors k forces the number of common factors; by default k is chosen among 1..--max-factors (default 4) by the
hold-out (demand.factor_choice.choose_factors: the error of the last 20% of the periods' lagged correlations as the model fitted
on the first 80% predicts them). The report shows each k's criterion.

Writes OUT (a .json file; an ordinary instance file: rho and every item's lam_i and loadings (beta_i at one factor,
loadings beyond), and overdispersion where an item has it, fitted; it records the history's SHA-256, the periods
used, their step ('1 day', '7 days', '1 month', '1 period') and the item names under 'source') and, next to it,
OUT-stem.fit.json (the report's numbers and the smoothed factor path), .fit.md (the report) and .fit.png (its
figure). An existing OUT or report file is refused unless --overwrite is given; a history or cost table is never
written over. Every input (the flags, the cost table, every cell of the history) is checked before the estimation
starts.
"""

import json
from pathlib import Path

from cli.output_folders import out_argument, resolve_out
from cli.scripts import factors, replicates, run_cli, script_parser, seed
from demand.bootstrap import REPLICATES
from demand.factor_choice import MAX_FACTORS
from demand.fit_report import report_figure, report_markdown
from demand.fitting import fit_history
from envs.instance import check_constant
from plumbing.errors import InputError
from plumbing.files import atomic_write, atomic_write_text


def report_paths(out: Path) -> dict[str, Path]:
    """The report files next to the instance file OUT: OUT-stem.fit.json, .fit.md, .fit.png."""
    return {suffix: out.with_name(f"{out.stem}.fit.{suffix}") for suffix in ("json", "md", "png")}


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--history", required=True, help="CSV or Parquet demand history: item, period, demand")
    parser.add_argument("--items", required=True, help="CSV or Parquet cost table: item, h, b, lead [, qbar]")
    parser.add_argument("--K", type=float, help="joint setup cost K >= 0 (default 10 n, the paper family's)")
    parser.add_argument("--gamma", type=float, default=0.95, help="discount factor in (0, 1) (default 0.95)")
    parser.add_argument(
        "--replicates", type=replicates, default=REPLICATES, help=f"bootstrap replicates, at least 2 (default {REPLICATES})"
    )
    parser.add_argument(
        "--seed", type=seed, default=0, help="seed of the bootstrap and of the hold-out check's randomised intervals (default 0)"
    )
    parser.add_argument(
        "--factors", type=factors, help="number of common factors k, forced (default: chosen among 1..--max-factors by the hold-out)"
    )
    parser.add_argument(
        "--max-factors", type=factors, help=f"largest k the hold-out chooses among (default {MAX_FACTORS}; not with --factors)"
    )
    parser.add_argument("--out", type=out_argument, required=True, help="output instance JSON file (.json)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out and its report files")
    args = parser.parse_args()
    if args.factors is not None and args.max_factors is not None:
        raise InputError(
            f"--max-factors {args.max_factors} bounds the hold-out's choice of k, which --factors {args.factors} makes: give one of them"
        )
    args.max_factors = MAX_FACTORS if args.max_factors is None else args.max_factors
    if args.K is not None:
        check_constant("K", args.K, "--K")
    check_constant("gamma", args.gamma, "--gamma")
    inputs = {"--history": args.history, "--items": args.items}
    out = resolve_out(args.out, is_file=True, suffix=".json", overwrite=args.overwrite, inputs=inputs)
    for path in report_paths(out).values():
        resolve_out(path, "--out's report", is_file=True, overwrite=args.overwrite, inputs=inputs)
    instance, report = fit_history(
        args.history,
        args.items,
        args.K,
        args.gamma,
        args.replicates,
        args.seed,
        progress=True,
        factors=args.factors,
        max_factors=args.max_factors,
    )
    paths = report_paths(out)
    atomic_write_text(paths["json"], json.dumps(report, indent=1) + "\n")
    atomic_write_text(paths["md"], report_markdown(report, paths["png"].name))
    atomic_write(paths["png"], lambda tmp: report_figure(report, tmp))
    instance.save(out)
    rho, choice = report["rho"], report["factors"]
    how = "forced" if choice["forced"] else f"chosen by the hold-out among 1..{len(choice['candidates'])}"
    print(
        f"wrote {out}: n={instance.n}, k={instance.factors} ({how}), {instance.demand_model()}, "
        f"rho={rho['estimate']:.3f} ± {rho['se']:.3f} (s.e.), K={instance.K:g}, gamma={instance.gamma:g}; "
        f"report {paths['md']} ({len(report['notes'])} notes, {len(report['flags'])} flags; hold-out coverage of 80% intervals: "
        f"items {100 * report['holdout']['item_coverage']:.1f}%, total {100 * report['holdout']['total_coverage']:.1f}%)"
        + (f"; first flag: {report['flags'][0]}" if report["flags"] else "")
        + (f"; {effect}" if (effect := report["checks"]["season"]["effect"]) and effect != report["flags"][0] else "")
    )


if __name__ == "__main__":
    run_cli(main)
