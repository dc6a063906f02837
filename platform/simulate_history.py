"""Draw a demand history from an instance with the project's own model, as the input of platform/fit.py: a check
that the fit recovers the instance that made the data (docs/fitting.md).

  python platform/simulate_history.py --instance inst.json --periods 730 --seed 1 --out history.csv --costs costs.csv

Writes the history (item, period, demand) and the cost table (item, h, b, lead, qbar), each as CSV (.csv) or Parquet
(.parquet, .pq), the formats fit.py and backtest.py read; another suffix is refused. The history is episode 0 of
--seed (envs.exogenous.sample_paths), drawn from the instance's own demand model: k factors with signed loadings and
negative-binomial demand where the instance has them (docs/model.md). An instance fitted by fit.py lends the history
its item names and its step (source.item_names, source.step: days, weeks, months or integer periods from --start);
any other instance gives items item-000, item-001, ... and daily dates.

A catalogue for platform/recommend.py (catalogue/practice.py): --suppliers S cuts the items into S suppliers
(contiguous blocks, each with K = the instance's K times its share of the items), adds their `supplier` column to
the cost table and writes the supplier table to --supplier-table; --rules PATH writes a rule of thumb per item
(s_i = ceil(lam_i (L_i + 1)), S_i = s_i + ceil(3 lam_i)); --orders adds an `ordered` column: every 7 periods, a week's
mean demand rounded up to cases of 6. An existing output file is refused unless --overwrite is given; the instance
file is never written over.
"""

from pathlib import Path

import numpy as np
import pyarrow as pa

from catalogue.practice import rule_of_thumb, supplier_rows, weekly_orders
from cli.output_folders import out_argument, resolve_out
from cli.scripts import horizon, positive_int, run_cli, script_parser, seed
from demand.simulation import simulate_history
from envs.instance import Instance
from plumbing.errors import InputError
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
    parser.add_argument("--suppliers", type=positive_int, help="cut the items into this many suppliers (with --supplier-table)")
    parser.add_argument("--supplier-table", type=out_argument, help="supplier table file to write (supplier, K)")
    parser.add_argument("--rules", type=out_argument, help="rule table file to write: a rule of thumb per item")
    parser.add_argument("--orders", action="store_true", help="add an ordered column: a weekly habit's orders")
    parser.add_argument("--overwrite", action="store_true", help="replace existing output files")
    args = parser.parse_args()
    if (args.suppliers is None) != (args.supplier_table is None):
        parser.error("--suppliers and --supplier-table: give both (the cost table's supplier column and the supplier table) or neither")
    outputs = {"--out": args.out, "--costs": args.costs, "--supplier-table": args.supplier_table, "--rules": args.rules}
    outputs = {flag: path for flag, path in outputs.items() if path is not None}
    paths, written = {}, {"--instance": args.instance}
    for flag, path in outputs.items():
        table_format(path, flag)
        paths[flag] = resolve_out(path, flag, is_file=True, overwrite=args.overwrite, inputs=dict(written))
        written[flag] = path
    instance = Instance.load(args.instance)
    if args.suppliers is not None and args.suppliers > instance.n:
        raise InputError(f"--suppliers {args.suppliers}: at most the instance's {instance.n} items (every supplier has one)")
    history, costs = simulate_history(instance, args.seed, args.periods, args.start)
    names = costs.column("item").to_pylist()
    if args.orders:  # the history's rows run item by item, each over every period
        history = history.append_column("ordered", pa.array(weekly_orders(instance, args.periods).T.reshape(-1).astype(np.int64)))
    if args.suppliers is not None:
        assigned, rows = supplier_rows(instance, args.suppliers)
        costs = costs.append_column("supplier", pa.array(assigned))
        write_table(pa.table({"supplier": [r[0] for r in rows], "K": [r[1] for r in rows]}), paths["--supplier-table"])
    if args.rules is not None:
        rules = rule_of_thumb(instance)
        table = {"item": names, "reorder_point": [r[0] for r in rules], "order_up_to": [r[1] for r in rules]}
        write_table(pa.table(table), paths["--rules"])
    write_table(history, paths["--out"])
    write_table(costs, paths["--costs"])
    periods = history.column("period")
    print(
        f"wrote {paths['--out']} ({history.num_rows} rows: {instance.n} items x {args.periods} periods, {periods[0]} to "
        f"{periods[args.periods - 1]}) and " + ", ".join(str(paths[flag]) for flag in outputs if flag != "--out")
    )


if __name__ == "__main__":
    run_cli(main)
