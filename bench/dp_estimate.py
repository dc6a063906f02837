"""How well a solve's announced time matches the solve: policies.dp_optimal.estimated_seconds (every phase: the demand law,
the lead-time sums, the expected loss, the backward pass) beside the wall seconds of dp_optimal.solve, with their ratio,
for items whose preparation is a large part of the solve (a heavy tail at retail volumes; a small cap under a large
loading). One JSON line per item and horizon, with the machine's load.

  OMP_NUM_THREADS=1 python bench/dp_estimate.py
"""

import json
import os
import time

import torch

from envs.instance import Instance
from policies import dp_optimal

ITEMS = {
    "lam 10000, phi 10, beta 2, lead 4, cap 40000": dict(lam=[10000.0], beta=[2.0], lead=[4], qbar=[40000.0], overdispersion=[10.0]),
    "lam 500, phi 2, beta 0.3, lead 2, cap 1500": dict(lam=[500.0], beta=[0.3], lead=[2], qbar=[1500.0], overdispersion=[2.0]),
    "lam 3.43, phi 10, beta 1.31, lead 3, cap 4": dict(lam=[3.43], beta=[1.31], lead=[3], qbar=[4.0], overdispersion=[10.0]),
}
HORIZONS = (5, 12)


def main() -> None:
    torch.set_num_threads(1)
    for name, columns in ITEMS.items():
        item = Instance(h=[1.0], b=[9.0], K=20.0, gamma=0.95, rho=0.8, **columns)
        for horizon in HORIZONS:
            positions, estimate = dp_optimal.estimated_seconds(item, horizon)
            start = time.perf_counter()
            dp_optimal.solve(item, horizon)
            seconds = time.perf_counter() - start
            line = {"item": name, "horizon": horizon, "positions": positions, "estimate_s": round(estimate, 2)}
            line |= {"solve_s": round(seconds, 2), "estimate_over_solve": round(estimate / seconds, 2)}
            print(json.dumps(line | {"load": [round(x, 2) for x in os.getloadavg()]}), flush=True)


if __name__ == "__main__":
    main()
