"""One item's DP at real volumes (policies/dp_optimal.py, docs/methods.md "The DP at real volumes"): the bound's
split-search solve (`expected_costs`: 5 setup costs, T = 50, the coarse factor grid of 21 points, the relaxed
integer cap, one torch and BLAS thread) for lam from 1 to 10,000 and phi from 0 to 10, on the lattice the DP
chooses, against the exact lattice in the same run wherever the exact lattice spans at most --exact-span units
(`domain_span`'s bound; above it the exact DP takes minutes and gigabytes, and is not run). Per item: wall seconds,
peak traced memory (tracemalloc), the lattice step, the value's relative difference to the exact lattice and the
estimated lattice error the bound subtracts. One JSON line per item, with the machine's load; the last line the
largest time and memory and the goals (<= 1 s, <= 256 MiB).

  OMP_NUM_THREADS=1 python bench/dp_volumes.py [--lams 1 5 32 100 300 507 2000 10000] [--phis 0 1 10] [--exact-span 20000]
"""

import argparse
import json
import os
import time
import tracemalloc

import numpy as np
import torch

from envs.instance import Instance
from policies import dp_optimal
from policies.decomposition import DecompositionOptions, lattice_error

HORIZON = 50
SETUPS = [5.0, 20.0, 80.0, 320.0, 1280.0]


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def retail_item(lam: float, phi: float, lead: int) -> Instance:
    """A weekly retail item: h 1, b 9, loading 0.4, the cap ceil(4 lam), K 100 (the setups are the bench's)."""
    return Instance(
        h=[1.0],
        b=[9.0],
        lam=[lam],
        beta=[0.4],
        lead=[lead],
        qbar=[float(np.ceil(4 * lam))],
        K=100.0,
        gamma=0.95,
        rho=0.8,
        overdispersion=[phi] if phi else None,
    )


def measured(function, *args, **kwargs):
    """(result, wall seconds, peak traced MiB) of function(*args, **kwargs)."""
    tracemalloc.start()
    start = time.perf_counter()
    result = function(*args, **kwargs)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return result, seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lams", type=float, nargs="+", default=[1, 5, 32, 100, 300, 507, 2000, 10000])
    parser.add_argument("--phis", type=float, nargs="+", default=[0, 1, 10])
    parser.add_argument("--lead", type=int, default=2, help="lead time of every item (default 2)")
    parser.add_argument("--exact-span", type=int, default=20000, help="run the exact lattice up to this domain width (units)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = DecompositionOptions()
    settings = options.dp_settings(options.coarse_points)
    worst = {"seconds": 0.0, "peak_mib": 0.0}
    for lam in args.lams:
        for phi in args.phis:
            one = retail_item(lam, phi, args.lead)
            values, seconds, peak = measured(dp_optimal.expected_costs, one, HORIZON, SETUPS, **settings)
            lattice = dp_optimal.check_item(one, HORIZON, **settings)
            row = {"lam": lam, "phi": phi, "lead": args.lead, "step": lattice.step}
            row |= {"seconds": round(seconds, 3), "peak_mib": round(peak, 1)}
            worst = {key: max(worst[key], row[key]) for key in worst}
            if lattice.step > 1:
                error = lattice_error(one, 0, SETUPS, HORIZON, lattice.step, options)
                row["estimated_relative_error"] = float(np.max(error / values))
                span = dp_optimal.item_span(one, **settings)
                row["exact_span"] = round(span)
                if span <= args.exact_span:
                    exact, exact_seconds, exact_peak = measured(dp_optimal.expected_costs, one, HORIZON, SETUPS, step=1, **settings)
                    row |= {
                        "exact_seconds": round(exact_seconds, 3),
                        "exact_peak_mib": round(exact_peak, 1),
                        "speedup": round(exact_seconds / seconds, 1),
                        "relative_difference": float(np.max(np.abs(values - exact) / exact)),
                        "within_twice_the_estimate": bool(np.all(np.abs(values - exact) <= 2 * error)),
                    }
            print(json.dumps({**row, "load": load()}), flush=True)
    print(json.dumps({"figure": "largest", **worst, "goal_seconds": 1.0, "goal_peak_mib": 256, "load": load()}))


if __name__ == "__main__":
    main()
