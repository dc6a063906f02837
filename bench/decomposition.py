"""Decomposition-bound benchmark (paper instance, seed 0, T = 50): the per-item DP work of the split
search, batched over setup costs on the integer-cap lattice, against the reference measured in the same
run: one unbatched solve per setup cost on the exact 1/m lattice (the n = 1 DP as it was before the
bound, at the same factor grid). Then the whole bound at size n run serially (split search and every
item's figures, 128 held-out episodes), in CPU seconds: on the 2-worker pool the wall-clock is about
half of that on a quiet machine. Then the same whole bound on k factors (default 3) with signed loadings of the
same norms |beta_i| (envs.instance.with_factors, seed 0; same h, b, lam, lead, qbar, K, gamma, rho), against the one-factor
figure of the same run: each item's DP is still over one factor, its exposure (the goal: within 1.2x). One JSON
line per figure, with the machine's load (os.getloadavg). Before the whole bound, the n = 1 DP of one paper item under
each --overdispersion phi against its Poisson DP: the heavier tail lengthens the position domain.

  python bench/decomposition.py [--n 64] [--items 8] [--factors 3]
"""

import argparse
import json
import os
import time
import tracemalloc

import numpy as np
import torch

from envs.exogenous import HELDOUT_SEED, sample_paths
from envs.instance import Instance, paper_instance, with_factors
from policies import dp_optimal
from policies.decomposition import DecompositionOptions, guess_shares, item_figures, item_instance, item_values, search_split


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=64, help="instance size of the whole-bound figure (default 64)")
    parser.add_argument("--items", type=int, default=8, help="items of the per-item figure (default 8)")
    parser.add_argument("--factors", type=int, default=3, help="factors of the signed-loadings figure (default 3)")
    parser.add_argument(
        "--overdispersion", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0, 5.0], help="phi values of the one-item DP figure"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = DecompositionOptions()
    inst = paper_instance(args.n, 0)
    guess = guess_shares(inst)
    items = range(min(args.items, args.n))
    setups = [sorted(set(float(s) for s in guess[i] * np.array(options.multiples)) | {inst.K / inst.n}) for i in items]

    start = time.process_time()
    batched = [item_values(inst, i, s, 50, options.coarse_points, options) for i, s in zip(items, setups)]
    batched_seconds = time.process_time() - start
    start = time.process_time()
    reference = [
        [dp_optimal.solve(item_instance(inst, i, k), 50, factor_points=options.coarse_points).expected_cost for k in s]
        for i, s in zip(items, setups)
    ]
    reference_seconds = time.process_time() - start
    relaxation = max(float(np.max((np.array(r) - b) / np.array(r))) for r, b in zip(reference, batched))
    print(
        json.dumps(
            {
                "figure": "per-item DP over the first round's setup costs",
                "n": args.n,
                "items": len(setups),
                "setup_costs": sum(len(s) for s in setups),
                "factor_points": options.coarse_points,
                "cpu_seconds_batched": round(batched_seconds, 2),
                "cpu_seconds_reference": round(reference_seconds, 2),
                "speedup": round(reference_seconds / batched_seconds, 2),
                "largest_relative_relaxation": relaxation,
                "load": load(),
            }
        )
    )

    for phi in args.overdispersion:
        print(json.dumps({"figure": "the n = 1 DP under overdispersion", **overdispersed_dp(phi), "load": load()}))

    one = whole_bound(inst, options)
    print(json.dumps({"figure": "whole bound, serial", "n": args.n, **one, "load": load()}))
    several = whole_bound(with_factors(inst, args.factors, 0.0, seed=0), options)
    print(
        json.dumps(
            {
                "figure": f"whole bound, serial, {args.factors} factors with signed loadings of the same norms against one factor",
                "n": args.n,
                "cpu_seconds_one_factor": one["cpu_seconds_total"],
                f"cpu_seconds_{args.factors}_factors": several["cpu_seconds_total"],
                "ratio": round(several["cpu_seconds_total"] / one["cpu_seconds_total"], 3),
                "wall_seconds_one_factor": one["wall_seconds"],
                f"wall_seconds_{args.factors}_factors": several["wall_seconds"],
                f"value_{args.factors}_factors": several["value"],
                "load": load(),
            }
        )
    )


def overdispersed_dp(phi: float) -> dict:
    """The n = 1 DP of the paper's first item (seed 11, T = 12, 121 factor points, one setup cost) with overdispersion
    phi: the positions, CPU seconds and the peak of NumPy's allocations (tracemalloc), against the same item's Poisson
    DP measured in the same call."""
    item = paper_instance(1, seed=11)
    figures = {}
    for name, instance in (("poisson", item), ("phi", with_factors(item, 1, phi, seed=0))):
        tracemalloc.start()
        start = time.process_time()
        solution = dp_optimal.solve(instance, 12)
        figures[name] = (time.process_time() - start, tracemalloc.get_traced_memory()[1] / 2**30, solution)
        tracemalloc.stop()
    seconds, peak, solution = figures["phi"]
    return {
        "phi": phi,
        "positions": int(solution.positions.size),
        "cpu_seconds": round(seconds, 2),
        "peak_gib": round(peak, 2),
        "cpu_ratio_to_poisson": round(seconds / figures["poisson"][0], 1),
        "peak_ratio_to_poisson": round(peak / figures["poisson"][1], 1),
        "value": round(solution.expected_cost, 2),
    }


def whole_bound(inst: Instance, options: DecompositionOptions) -> dict:
    """The bound run serially (split search, then every item's figures on 128 held-out episodes of T = 50): its
    figures and CPU and wall-clock seconds."""
    start, wall = time.process_time(), time.perf_counter()

    def values_of(round_, grids):
        return [item_values(inst, i, g, 50, options.coarse_points, options) if g else [] for i, g in enumerate(grids)]

    search = search_split(inst, options, values_of)
    search_seconds = time.process_time() - start
    paths = sample_paths(inst, HELDOUT_SEED, 128, 50)
    records = [
        item_figures(
            inst,
            i,
            {"best": float(search.split.shares[i]), "equal": inst.K / inst.n},
            50,
            paths,
            options,
            dict(zip(search.setups[i], search.values[i])),
        )
        for i in range(inst.n)
    ]
    total = time.process_time() - start
    return {
        "rounds": search.rounds,
        "certified_gap": search.summary(options.tolerance)["relative_gap"],
        "cpu_seconds_search": round(search_seconds, 1),
        "cpu_seconds_items": round(total - search_seconds, 1),
        "cpu_seconds_total": round(total, 1),
        "wall_seconds": round(time.perf_counter() - wall, 1),
        "value": sum(r["best"]["value"] for r in records),
        "equal_shares_value": sum(r["equal"]["value"] for r in records),
    }


if __name__ == "__main__":
    main()
