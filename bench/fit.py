"""Fit time and memory of platform/fit.py's pipeline at scale, with k = 4 factors beside the one-factor fit, measured in
the same run: two histories of N items x D daily periods written as CSV by demand.simulation.simulate_history, each fitted end
to end (reading and checking the file, the choice of k among 1..4, the estimate, the bootstrap, the smoothed factors,
the fit checks and the hold-out check):

- "k=1": the paper instance (n = N, seed 0; one factor, Poisson), fitted with --factors 1 (the workload of the
  one-factor fit this benchmark measured before several factors existed);
- "k=4": the same items with 4 factors of signed loadings (item i loads on factor i mod 4 with the paper instance's
  beta_i, plus N(0, 0.1^2) on the others; every fourth item against its factor) and overdispersion phi_i ~ U(0.05, 0.3),
  fitted with --factors 4.

Prints one JSON line per fit (wall and CPU seconds, user + system over all threads; the recovery of the truth) and a
summary line with the ratio of the k = 4 fit's CPU time to the k = 1 fit's, and the peak resident memory.

  python bench/fit.py [--items 1024] [--days 1095] [--replicates 100] [--against REV]

--against REV also runs REV's own bench/fit.py (a temporary worktree; a revision before several factors fits the
paper instance's history, the "k=1" workload) first, and the summary adds the k = 4 fit's CPU time over REV's.
"""

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.csv
from revisions import records_at
from scipy.linalg import subspace_angles

from demand.fitting import fit_history
from demand.simulation import simulate_history
from envs.instance import Instance, paper_instance

FACTORS = 4


def four_factor_instance(base: Instance) -> Instance:
    """`base` with 4 factors of signed loadings and overdispersion (the module docstring's "k=4")."""
    rng = np.random.default_rng(4)
    loadings = rng.normal(0.0, 0.1, (base.n, FACTORS))
    loadings[np.arange(base.n), np.arange(base.n) % FACTORS] += base.beta
    loadings[::4] *= -1
    items = base.to_dict()["items"]
    del items["beta"]
    return Instance(
        **items, beta=None, loadings=loadings, overdispersion=rng.uniform(0.05, 0.3, base.n), K=base.K, gamma=base.gamma, rho=base.rho
    )


def timed_fit(name: str, instance: Instance, factors: int, days: int, replicates: int, folder: Path) -> dict:
    history, costs = simulate_history(instance, 0, days)
    pyarrow.csv.write_csv(history, folder / f"{name}-history.csv")
    pyarrow.csv.write_csv(costs, folder / f"{name}-costs.csv")
    start, cpu_start = time.perf_counter(), time.process_time()
    fitted, report = fit_history(folder / f"{name}-history.csv", folder / f"{name}-costs.csv", replicates=replicates, factors=factors)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    truth = instance.loadings if instance.loadings is not None else instance.beta[:, None]
    fitted_loadings = fitted.loadings if fitted.loadings is not None else fitted.beta[:, None]
    return {
        "fit": name,
        "items": instance.n,
        "days": days,
        "replicates": replicates,
        "fit_seconds": round(seconds, 1),
        "fit_cpu_seconds": round(cpu, 1),
        "k_by_holdout": report["factors"]["by_holdout"],
        "rho": round(fitted.rho, 4),
        "rho_true": instance.rho,
        "max_abs_norm_error": round(float(np.abs(fitted.beta - instance.beta).max()), 3),
        "subspace_angle_degrees": round(float(np.degrees(subspace_angles(fitted_loadings, truth)).max()), 2),
        "median_rel_lam_error": round(float(np.median(np.abs(fitted.lam / instance.lam - 1))), 4),
        "holdout_item_coverage": round(report["holdout"]["item_coverage"], 3),
        "holdout_total_coverage": round(report["holdout"]["total_coverage"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1024)
    parser.add_argument("--days", type=int, default=1095)
    parser.add_argument("--replicates", type=int, default=100)
    parser.add_argument("--against", metavar="REV", help="also run git revision REV's bench/fit.py first, and print the ratio to it")
    args = parser.parse_args()
    before = None
    if args.against:
        sizes = ["--items", str(args.items), "--days", str(args.days), "--replicates", str(args.replicates)]
        before = records_at(args.against, [sys.executable, "bench/fit.py", *sizes], "bench/fit.py")[-1]
        print(json.dumps({"revision": args.against, **before}), flush=True)
    base = paper_instance(args.items, 0)
    records = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, instance, factors in (("k=1", base, 1), ("k=4", four_factor_instance(base), FACTORS)):
            records[name] = timed_fit(name, instance, factors, args.days, args.replicates, Path(folder))
            print(json.dumps(records[name]), flush=True)
    print(
        json.dumps(
            {
                "bench": "fit",
                "items": args.items,
                "days": args.days,
                "replicates": args.replicates,
                "k4_fit_cpu_seconds": records["k=4"]["fit_cpu_seconds"],
                "k1_fit_cpu_seconds": records["k=1"]["fit_cpu_seconds"],
                "k4_over_k1_cpu": round(records["k=4"]["fit_cpu_seconds"] / max(records["k=1"]["fit_cpu_seconds"], 1e-9), 2),
                **(
                    {
                        f"k1_fit_cpu_seconds_at_{args.against}": before["fit_cpu_seconds"],
                        f"k4_over_{args.against}_cpu": round(records["k=4"]["fit_cpu_seconds"] / max(before["fit_cpu_seconds"], 1e-9), 2),
                    }
                    if before
                    else {}
                ),
                "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
