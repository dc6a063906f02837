"""Draw a demand history from an instance with the project's own model, as the input of platform/fit.py: a check
that the fit recovers the instance that made the data (docs/fitting.md).

  python platform/simulate_history.py --instance inst.json --periods 730 --seed 1 --out history.csv --costs costs.csv

Writes the history (item, period, demand) and the cost table (item, h, b, lead, qbar), each as CSV (.csv) or Parquet
(.parquet, .pq), the formats fit.py and backtest.py read; another suffix is refused. The history is episode 0 of
--seed (envs.exogenous.sample_paths), drawn from the instance's own demand model: k factors with signed loadings and
negative-binomial demand where the instance has them (docs/model.md). An instance fitted by fit.py lends the history
its item names and its step (source.item_names, source.step: days, weeks, months or integer periods from --start);
any other instance gives items item-000, item-001, ... and daily dates. An existing --out or --costs is refused
unless --overwrite is given; the instance file is never written over.
"""

from pathlib import Path

from cli.output_folders import out_argument, resolve_out
from cli.scripts import horizon, run_cli, script_parser, seed
from demand.simulation import simulate_history
from envs.instance import Instance
from plumbing.files import atomic_write
from plumbing.tables import table_format


def write_table(table, path: Path) -> None:
    """`table` as the file `path`, in the format its suffix names (plumbing.tables.table_format)."""
    import pyarrow.csv
    import pyarrow.parquet

    if table_format(path, "output table") == "parquet":
        atomic_write(path, lambda tmp: pyarrow.parquet.write_table(table, tmp))
    else:
        atomic_write(path, lambda tmp: pyarrow.csv.write_csv(table, tmp, pyarrow.csv.WriteOptions(quoting_style="none")))


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--instance", required=True, help="instance JSON file")
    parser.add_argument("--periods", type=horizon, required=True, help="number of periods (at the fitted history's step, else days)")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the demand path (default 0)")
    parser.add_argument(
        "--start", help="first period: a date YYYY-MM-DD (default 2024-01-01), or an integer (default 1) for a history in integer periods"
    )
    parser.add_argument("--out", type=out_argument, required=True, help="history file (.csv, .parquet or .pq)")
    parser.add_argument("--costs", type=out_argument, required=True, help="cost table file (.csv, .parquet or .pq)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out and --costs")
    args = parser.parse_args()
    inputs = {"--instance": args.instance}
    table_format(args.out, "--out")
    table_format(args.costs, "--costs")
    paths = [
        resolve_out(args.out, is_file=True, overwrite=args.overwrite, inputs=inputs),
        resolve_out(args.costs, "--costs", is_file=True, overwrite=args.overwrite, inputs=inputs | {"--out": args.out}),
    ]
    instance = Instance.load(args.instance)
    history, costs = simulate_history(instance, args.seed, args.periods, args.start)
    write_table(history, paths[0])
    write_table(costs, paths[1])
    periods = history.column("period")
    print(
        f"wrote {paths[0]} ({history.num_rows} rows: {instance.n} items x {args.periods} periods, {periods[0]} to "
        f"{periods[args.periods - 1]}) and {paths[1]}"
    )


if __name__ == "__main__":
    run_cli(main)
