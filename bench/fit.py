"""Fit time and memory of platform/fit.py's pipeline at scale: a history of N items x D daily periods drawn from
the paper instance (n = N, seed 0) by envs.fit.simulate_history, written as CSV, then fitted end to end (reading
and checking the file, the estimate, the bootstrap, the smoothed factor, the fit checks and the hold-out check).
Prints one JSON line per stage and a summary line: wall and CPU seconds (user + system, all threads) of the fit,
and the peak resident memory of the process.

  python bench/fit.py [--items 1024] [--days 1095] [--replicates 100]
"""

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.csv

from envs.fit import fit_history, simulate_history
from envs.instance import paper_instance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1024)
    parser.add_argument("--days", type=int, default=1095)
    parser.add_argument("--replicates", type=int, default=100)
    args = parser.parse_args()
    instance = paper_instance(args.items, 0)
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        history, costs = simulate_history(instance, 0, args.days)
        pyarrow.csv.write_csv(history, Path(folder) / "history.csv")
        pyarrow.csv.write_csv(costs, Path(folder) / "costs.csv")
        size = (Path(folder) / "history.csv").stat().st_size
        print(
            json.dumps(
                {
                    "stage": "simulate+write",
                    "rows": history.num_rows,
                    "csv_mb": round(size / 2**20, 1),
                    "seconds": round(time.perf_counter() - start, 2),
                }
            )
        )
        start, cpu_start = time.perf_counter(), time.process_time()
        fitted, report = fit_history(Path(folder) / "history.csv", Path(folder) / "costs.csv", replicates=args.replicates, progress=True)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    print(
        json.dumps(
            {
                "bench": "fit",
                "items": args.items,
                "days": args.days,
                "rows": args.items * args.days,
                "replicates": args.replicates,
                "fit_seconds": round(seconds, 1),
                "fit_cpu_seconds": round(cpu, 1),
                "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
                "rho": round(fitted.rho, 4),
                "rho_true": instance.rho,
                "max_abs_beta_error": round(float(np.abs(fitted.beta - instance.beta).max()), 3),
                "median_rel_lam_error": round(float(np.median(np.abs(fitted.lam / instance.lam - 1))), 4),
                "holdout_item_coverage": round(report["holdout"]["item_coverage"], 3),
                "holdout_total_coverage": round(report["holdout"]["total_coverage"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
