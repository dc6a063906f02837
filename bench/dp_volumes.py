"""One item's DP at real volumes (policies/dp_optimal.py, docs/methods.md "The DP at real volumes"): the bound's
split-search solve (`expected_costs`: 5 setup costs, T = 50, the coarse factor grid of 21 points, the relaxed
integer cap, one torch and BLAS thread) for lam from 1 to 10,000, phi from 0 to 10 and leads 2 and 4, on the lattice
the DP chooses, and its certificate (policies/dp_certificate.py: a proven lower bound on the exact lattice's value),
against the exact lattice in the same run wherever the exact lattice spans at most --exact-span units
(`domain_span`'s bound; above it the exact DP takes minutes and gigabytes, and is not run). Per item: wall seconds,
peak traced memory (tracemalloc), the lattice step, the certificate's seconds and how far it lies below the value,
and against the exact lattice the value's relative difference, the certificate's shortfall and whether it stayed
below. One JSON line per item, with the machine's load; the last line the largest times and memory and the goals
(<= 1 s, <= 256 MiB for the DP).

  OMP_NUM_THREADS=1 python bench/dp_volumes.py [--lams 1 5 32 100 300 507 2000 10000] [--phis 0 1 10] [--leads 2 4] [--exact-span 20000]
      [--beta 0.4] [--cap CAP]   (a loading and a fixed cap instead of 0.4 and ceil(4 lam): the |beta| >= 1, small-cap items)
"""

import argparse
import json
import os
import time
import tracemalloc

import numpy as np
import torch

from envs.instance import Instance
from policies import dp_certificate, dp_optimal
from policies.decomposition import DecompositionOptions

HORIZON = 50
SETUPS = [5.0, 20.0, 80.0, 320.0, 1280.0]


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def retail_item(lam: float, phi: float, lead: int, beta: float = 0.4, cap: float | None = None) -> Instance:
    """A weekly retail item: h 1, b 9, loading `beta` (0.4), the cap `cap` (ceil(4 lam)), K 100 (the setups are the bench's)."""
    return Instance(
        h=[1.0],
        b=[9.0],
        lam=[lam],
        beta=[beta],
        lead=[lead],
        qbar=[float(np.ceil(4 * lam)) if cap is None else cap],
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
    parser.add_argument("--leads", type=int, nargs="+", default=[2, 4], help="lead times of the items (default 2 4)")
    parser.add_argument("--exact-span", type=int, default=20000, help="run the exact lattice up to this domain width (units)")
    parser.add_argument("--beta", type=float, default=0.4, help="the items' loading (default 0.4)")
    parser.add_argument("--cap", type=float, default=None, help="the items' cap (default ceil(4 lam))")
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = DecompositionOptions()
    settings = options.dp_settings(options.coarse_points)
    worst = {"seconds": 0.0, "peak_mib": 0.0, "certificate_seconds": 0.0}
    for lead in args.leads:
        for lam in args.lams:
            for phi in args.phis:
                one = retail_item(lam, phi, lead, args.beta, args.cap)
                values, seconds, peak = measured(dp_optimal.expected_costs, one, HORIZON, SETUPS, **settings)
                certified, certificate_seconds, _ = measured(dp_certificate.certified_costs, one, HORIZON, SETUPS, values, **settings)
                lattice = dp_optimal.check_item(one, HORIZON, **settings)
                row = {"lam": lam, "phi": phi, "lead": lead, "step": lattice.step}
                row |= {"seconds": round(seconds, 3), "peak_mib": round(peak, 1), "certificate_seconds": round(certificate_seconds, 3)}
                row["certificate_below_value"] = float(np.max((values - certified) / values))
                worst = {key: max(worst[key], row[key]) for key in worst}
                span = dp_optimal.item_span(one, **settings)
                row["exact_span"] = round(span)
                if lattice.step > 1 and span <= args.exact_span:
                    exact, exact_seconds, exact_peak = measured(dp_optimal.expected_costs, one, HORIZON, SETUPS, step=1, **settings)
                    row |= {
                        "exact_seconds": round(exact_seconds, 3),
                        "exact_peak_mib": round(exact_peak, 1),
                        "speedup": round(exact_seconds / seconds, 1),
                        "relative_difference": float(np.max(np.abs(values - exact) / exact)),
                        "certificate_below_exact": float(np.max((exact - certified) / exact)),
                        "certificate_valid": bool(np.all(certified <= exact + 1e-9 * np.abs(exact))),
                    }
                print(json.dumps({**row, "load": load()}), flush=True)
    print(json.dumps({"figure": "largest", **worst, "goal_seconds": 1.0, "goal_peak_mib": 256, "load": load()}))


if __name__ == "__main__":
    main()
