"""Create an instance file: the paper family (--n, --seed) or an imported item table (--items).

python platform/instance.py --n 16 --seed 0 --out inst.json
python platform/instance.py --items items.csv --K 160 --gamma 0.95 --rho 0.8 --out inst.json

An existing --out is refused unless --overwrite is given; the item table is never written over.
"""

import argparse

from envs.cli import positive_int, run_cli, seed
from envs.instance import Instance, paper_instance
from envs.job_output import out_argument, resolve_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--n", type=positive_int, help="number of items of a paper-family instance")
    source.add_argument("--items", help="CSV or Parquet item table with columns h, b, lam, beta, lead, qbar")
    parser.add_argument("--seed", type=seed, default=0, help="paper family: the instance seed (default 0)")
    parser.add_argument("--K", type=float, help="with --items: joint setup cost K >= 0")
    parser.add_argument("--gamma", type=float, help="with --items: discount factor in (0, 1)")
    parser.add_argument("--rho", type=float, help="with --items: factor autocorrelation in [0, 1)")
    parser.add_argument("--out", type=out_argument, required=True, help="output JSON file (.json)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args()
    resolve_out(args.out, is_file=True, suffix=".json", overwrite=args.overwrite, inputs={"--items": args.items})
    if args.items:
        missing = [f"--{k}" for k in ("K", "gamma", "rho") if getattr(args, k) is None]
        if missing:
            parser.error(f"--items needs {', '.join(missing)}")
        instance = Instance.from_table(args.items, K=args.K, gamma=args.gamma, rho=args.rho)
    else:
        instance = paper_instance(args.n, args.seed)
    instance.save(args.out)
    print(f"wrote {args.out}: n={instance.n}, K={instance.K:g}, gamma={instance.gamma:g}, rho={instance.rho:g}")


if __name__ == "__main__":
    run_cli(main)
