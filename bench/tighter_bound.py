"""How far from optimal, exactly: the lower bounds beside the exact optimum where it exists, and beside the decomposition
lookahead's expected cost where it does not. Every figure is on the same Tauchen grid (--points), horizon 50 and instance:

* exact: the joint DP with the caps raised to whole units (policies/joint_dp.py; the relaxation the bounds' item DPs make);
* decomposition: the constant split of K over items (policies/decomposition.py, searched on the same grid);
* schedule: shares that depend on the period and the factor (policies/share_schedule.py, from that split);
* information: the information relaxation with the decomposition's penalty (policies/information_bound.py; 200 paths of the
  chain, 40 rounds of the per-path share ascent; a Monte Carlo figure with its s.e.);
* groups: K split over pairs of items, each pair by the joint DP (policies/group_bound.py; its split searched on 11 points).

  python bench/tighter_bound.py --pairs                  # the five two-item instances, 21 points (about 6 minutes)
  python bench/tighter_bound.py --n 4 16 --points 41     # the paper's instances, with the lookahead on 2,000 episodes
  python bench/tighter_bound.py --pairs --policies       # and the exact policy against the lookahead and classical-best
  python bench/tighter_bound.py --pairings --search-points 5   # the group bound of each of paper(4, 0)'s three pairings

With --policies each two-item line also has the exact policy (dp-optimal: the joint DP with the caps lowered, on --points),
the decomposition lookahead and classical-best on the same --episodes held-out episodes: means, and each policy's paired
difference to the exact policy in % of its mean with its 95% interval.

One JSON line per instance, each bound with its value, seconds and relative gap to the exact optimum (or, without one, the
gap of the lookahead's mean to the bound); the reference of every line is the decomposition bound measured in the same run.
"""

import argparse
import json
import os
import time

import torch

from envs.evaluation import evaluate, paired_comparison
from envs.exogenous import HELDOUT_SEED, sample_paths
from envs.instance import paper_instance
from policies import group_bound, information_bound, joint_dp, share_schedule
from policies.classical import RULES_OF, tuned_policy
from policies.decomposition import DecompositionOptions, item_values, lookahead_policy, search_split

HORIZON = 50
PAIRS = [(f"paper(2, {seed})", paper_instance(2, seed), None) for seed in range(3)]
PAIRS += [("paper(4, 0) items 2-3", paper_instance(4, 0), (2, 3)), ("paper(16, 0) items 8-9", paper_instance(16, 0), (8, 9))]


def timed(function, *args, **kwargs):
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start


def bounds(instance, points: int, groups: bool, search_points: int = group_bound.SEARCH_POINTS) -> dict:
    """The decomposition, schedule and (with `groups`) group bounds of `instance` on `points` factor points."""
    options = DecompositionOptions(factor_points=points, coarse_points=min(21, points - 1))

    def values_of(round_, grids):
        return [item_values(instance, i, g, HORIZON, points, options) if g else [] for i, g in enumerate(grids)]

    search, seconds = timed(search_split, instance, options, values_of)
    figures = {"decomposition": {"value": search.split.value, "seconds": seconds}}
    schedule, seconds = timed(share_schedule.search_schedule, instance, HORIZON, search.split.shares, options)
    figures["schedule"] = {"value": schedule.value, "seconds": seconds, "rounds": len(schedule.values)}
    information = information_bound.information_bound(instance, HORIZON, search.split.shares, options, paths=200, rounds=40)
    figures["information"] = {"value": information.value, "se": information.se, "seconds": information.seconds}
    if groups:
        grouped = group_bound.group_bound(instance, HORIZON, options, search_points=search_points)
        figures["groups"] = {"value": grouped.value, "seconds": grouped.seconds, "groups": [list(g) for g in grouped.groups]}
    return figures


def policies(instance, points: int, episodes: int) -> dict:
    """The exact policy, the lookahead and classical-best on the same held-out episodes: means and paired differences."""
    paths = sample_paths(instance, HELDOUT_SEED, episodes, HORIZON)
    exact = evaluate(joint_dp.JointDPPolicy(joint_dp.solve(instance, HORIZON, "lowered", points)), instance.to_torch(), paths)
    figures = {"dp-optimal": {"mean": exact.mean, "se": exact.se}}
    for name, (policy, _) in (
        ("decomposition-lookahead", lookahead_policy(instance, HORIZON)),
        ("classical-best", tuned_policy(instance, "classical-best", RULES_OF["classical-best"], HORIZON)),
    ):
        result = evaluate(policy, instance.to_torch(), paths)
        paired = paired_comparison(result.discounted_cost, exact.discounted_cost)
        share = [100 * x / exact.mean for x in (paired.mean_difference, paired.ci_low, paired.ci_high)]
        figures[name] = {"mean": result.mean, "se": result.se, "above_exact_percent": share}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", action="store_true", help="the five two-item instances against their exact optimum")
    parser.add_argument("--n", type=int, nargs="*", default=[], help="paper instances (seed 0) against the lookahead")
    parser.add_argument("--points", type=int, default=21, help="factor grid points of every figure (default 21)")
    parser.add_argument("--episodes", type=int, default=2000, help="held-out episodes of the lookahead (default 2000)")
    parser.add_argument("--groups-up-to", type=int, default=16, help="the group bound at sizes up to this (default 16)")
    parser.add_argument("--policies", action="store_true", help="with --pairs: the exact policy against the lookahead and classical-best")
    parser.add_argument("--pairings", action="store_true", help="the group bound of each pairing of paper(4, 0), one line each")
    parser.add_argument(
        "--search-points", type=int, default=group_bound.SEARCH_POINTS, help="factor points of the group bound's split search"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = [round(x, 2) for x in os.getloadavg()]
    if args.pairings:
        instance = paper_instance(4, 0)
        options = DecompositionOptions(factor_points=args.points, coarse_points=min(21, args.points - 1))
        for groups in ([(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 3), (1, 2)]):
            grouped = group_bound.group_bound(instance, HORIZON, options, groups, args.search_points)
            print(json.dumps({"instance": "paper(4, 0)", "points": args.points, **grouped.summary(), "load": load}), flush=True)
    for name, instance, items in PAIRS if args.pairs else []:
        pair = instance if items is None else group_bound.group_instance(instance, items, 10.0 * len(items))
        exact, seconds = timed(joint_dp.solve, pair, HORIZON, "raised", args.points, tables=False)
        figures = bounds(pair, args.points, groups=False)
        for figure in figures.values():
            figure["below_exact"] = 1.0 - figure["value"] / exact.expected_cost
        line = {"instance": name, "points": args.points, "exact": exact.expected_cost, "exact_seconds": seconds, **figures, "load": load}
        if args.policies:
            line["policies"] = policies(pair, args.points, args.episodes)
        print(json.dumps(line), flush=True)
    for n in args.n:
        instance = paper_instance(n, 0)
        figures = bounds(instance, args.points, groups=n <= args.groups_up_to, search_points=args.search_points)
        (policy, _), seconds = timed(lookahead_policy, instance, HORIZON)
        result = evaluate(policy, instance.to_torch(), sample_paths(instance, HELDOUT_SEED, args.episodes, HORIZON))
        for figure in figures.values():
            figure["lookahead_above"] = result.mean / figure["value"] - 1.0
        lookahead = {"mean": result.mean, "se": result.se, "episodes": args.episodes, "seconds": seconds}
        line = {"instance": f"paper({n}, 0)", "points": args.points, "lookahead": lookahead, **figures, "load": load}
        tightest = max(figures, key=lambda k: figures[k]["value"])
        print(json.dumps(line | {"tightest": tightest}), flush=True)


if __name__ == "__main__":
    main()
