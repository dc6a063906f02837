"""Create an instance file: the paper family (--n, --seed) or an imported item table (--items).

python platform/instance.py --n 16 --seed 0 --out inst.json
python platform/instance.py --n 16 --seed 0 --factors 3 --overdispersion 0.2 --out inst.json
python platform/instance.py --items items.csv --K 160 --gamma 0.95 --rho 0.8 --out inst.json

--factors is at most --n (n items' loadings span at most n factors, as platform/fit.py has it); --K, --gamma and
--rho go with --items. An existing --out is refused unless --overwrite is given; the item table is never written over.
An item whose cap is below its mean demand is written as given, with a warning.
"""

import sys

from cli.output_folders import out_argument, resolve_out
from cli.scripts import factors, overdispersion, positive_int, run_cli, script_parser, seed
from envs.instance import Instance, check_constant, check_factors_for_items, paper_instance, with_factors


def main() -> None:
    parser = script_parser(__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--n", type=positive_int, help="number of items of a paper-family instance")
    source.add_argument("--items", help="CSV or Parquet item table with columns h, b, lam, beta, lead, qbar")
    parser.add_argument("--seed", type=seed, default=0, help="paper family: the instance seed (default 0)")
    parser.add_argument(
        "--factors",
        type=factors,
        default=1,
        help="paper family: k common factors, each item's loading of the paper's size in a random direction (default 1)",
    )
    parser.add_argument(
        "--overdispersion",
        type=overdispersion,
        default=0.0,
        help="paper family: phi >= 0, negative-binomial demand of variance rate + phi rate^2 (default 0: Poisson)",
    )
    parser.add_argument("--K", type=float, help="with --items: joint setup cost K >= 0")
    parser.add_argument("--gamma", type=float, help="with --items: discount factor in (0, 1)")
    parser.add_argument("--rho", type=float, help="with --items: factor autocorrelation in [0, 1)")
    parser.add_argument("--out", type=out_argument, required=True, help="output JSON file (.json)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args()
    constants = ("K", "gamma", "rho")
    if args.items:
        missing = [f"--{k}" for k in constants if getattr(args, k) is None]
        if missing:
            parser.error(f"--items needs {', '.join(missing)}")
        if args.factors != 1 or args.overdispersion != 0:
            parser.error(
                "--factors and --overdispersion draw a paper-family instance (--n); an item table states its own model in its columns"
            )
        for name in constants:
            check_constant(name, getattr(args, name), f"--{name}")
    else:
        given = [f"--{k}" for k in constants if getattr(args, k) is not None]
        if given:
            parser.error(f"{', '.join(given)}: only with --items (the paper family, --n, has K = 10 n, gamma 0.95, rho 0.8)")
        check_factors_for_items(args.factors, args.n, "--factors", "the number of items --n")
    resolve_out(args.out, is_file=True, suffix=".json", overwrite=args.overwrite, inputs={"--items": args.items})
    if args.items:
        instance = Instance.from_table(args.items, K=args.K, gamma=args.gamma, rho=args.rho)
    else:
        instance = with_factors(paper_instance(args.n, args.seed), args.factors, args.overdispersion, args.seed)
    instance.save(args.out)
    print(f"wrote {args.out}: n={instance.n}, K={instance.K:g}, gamma={instance.gamma:g}, rho={instance.rho:g}; {instance.demand_model()}")
    if (short := instance.caps_below_demand()).size:
        item = int(short[0])
        more = f" (and {short.size - 1} more)" if short.size > 1 else ""
        print(
            f"warning: {instance.item_name(item)}{more}: order cap qbar {instance.qbar[item]:g} below its mean demand lam "
            f"{instance.lam[item]:g} per period: no policy keeps up with its demand; dp-optimal, the decomposition bound and its "
            "lookahead refuse such an item (the instance is written as given)",
            file=sys.stderr,
        )


if __name__ == "__main__":
    run_cli(main)
