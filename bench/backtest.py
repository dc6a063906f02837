"""Backtest benchmark (platform/backtest.py; the goal: classical-best and the lookahead backtested at 1,024 items x
1,095 periods in <= 2 min after tuning): one JSON line per size and demand model with the machine's load.

The history is episode 0 of seed 1 of the instance over --periods periods (envs.exogenous.sample_paths: a history of
the model). The instances (--models): "paper", the paper instance (n, seed 0), and "k3-nb", the same items with 3
signed factor loadings (drawn N(0, I), scaled to the paper's |beta_i|) and negative-binomial demand of
overdispersion 0.2, whose filter is the Gaussian one (demand.factor_filter.GaussianFilter). The policies are made
first and timed apart ("after tuning"): classical-best tuned on --tuning-episodes training paths of --window steps
(policies.classical.tuned_policy; the evaluator tunes on 64), and the decomposition lookahead's stationary tables,
of which --items sampled items are built (policies.decomposition.item_table at their first-guess share) and
repeated to n items, as bench/lookahead.py does: a decision's work depends on the items' lattice sizes, not on their
values; c = 1. Then timed, wall-clock and CPU: the causal factor filter over the whole history
(demand.factor_filter.causal_factor) and each policy's replay on the history's windows (envs.history_replay.replay);
`backtest_seconds` is the filter plus both replays, the figure against the goal. Reference in the same run: each
policy's evaluation (envs.evaluation.evaluate) on simulated paths of the same shape (as many episodes as windows,
--window steps), and the ratio replay / evaluation; each policy runs one window untimed first (warm-up).

  python bench/backtest.py [--sizes 64 1024] [--models paper k3-nb] [--periods 1095] [--window 50] [--tuning-episodes 16]
                           [--items 32]
"""

import argparse
import json
import os
import time

import torch

from demand.factor_filter import causal_factor
from envs.evaluation import evaluate
from envs.exogenous import sample_paths
from envs.history_replay import replay, window_count
from envs.instance import Instance, paper_instance, with_factors
from policies import lookahead
from policies.classical import tuned_policy
from policies.decomposition import DecompositionOptions, guess_shares, item_table


def timed(work, *args, **kwargs):
    """(result, wall seconds, CPU seconds) of work(*args, **kwargs)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = work(*args, **kwargs)
    return result, time.perf_counter() - wall, time.process_time() - cpu


MODELS = ("paper", "k3-nb")
K3_OVERDISPERSION = 0.2
"""phi_i of every item of the "k3-nb" instance: variance rate + 0.2 rate^2, 2.4 times the Poisson's at rate 7."""


def bench_instance(model: str, n: int) -> Instance:
    """The paper instance (n, seed 0), or ("k3-nb") its items with 3 signed factors (envs.instance.with_factors) and
    overdispersion K3_OVERDISPERSION."""
    instance = paper_instance(n, 0)
    return instance if model == "paper" else with_factors(instance, 3, K3_OVERDISPERSION, 0)


def stationary_tables(instance, items: int, horizon: int) -> list:
    """The stationary lookahead tables of the first `items` items at their first-guess shares."""
    shares = guess_shares(instance)
    return [item_table(instance, i, float(shares[i]), horizon, DecompositionOptions(), forms=lookahead.FORMS[1:]) for i in range(items)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 1024], help="items n (default 64 1024)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="demand models (default: both)")
    parser.add_argument("--periods", type=int, default=1095, help="periods of the history (default 1095: three years of days)")
    parser.add_argument("--window", type=int, default=50, help="periods per window (default 50)")
    parser.add_argument("--tuning-episodes", type=int, default=16, help="training paths classical-best is tuned on (default 16)")
    parser.add_argument("--items", type=int, default=32, help="items whose lookahead tables are built, repeated to n (default 32)")
    args = parser.parse_args()
    for n, model in ((n, model) for n in args.sizes for model in args.models):
        instance = bench_instance(model, n)
        tensors = instance.to_torch()
        demand = sample_paths(instance, 1, 1, args.periods).demand[0].double().numpy()  # [T, n]
        record = {
            "n": n,
            "model": model,
            "demand_model": instance.demand_model(),
            "periods": args.periods,
            "window": args.window,
            "windows": window_count(args.periods, args.window),
        }
        (classical, parameters), wall, cpu = timed(
            tuned_policy, instance, "classical-best", args.window, episodes=args.tuning_episodes, refinement=False
        )
        record |= {"classical_best": parameters["family"], "tuning_wall_seconds": round(wall, 1), "tuning_cpu_seconds": round(cpu, 1)}
        sample = min(n, args.items)
        built, wall, cpu = timed(stationary_tables, instance, sample, args.window)
        record |= {"tables_sampled_items": sample, "tables_wall_seconds": round(wall, 1), "tables_cpu_seconds": round(cpu, 1)}
        tables = lookahead.LookaheadTables.from_items([built[i % sample] for i in range(n)], lookahead.FORMS[1], None, "")
        policies = {"classical_best": classical, "lookahead": lookahead.LookaheadPolicy(tables)}
        factor, wall, cpu = timed(causal_factor, instance, demand)
        record |= {"filter_wall_seconds": round(wall, 2), "filter_cpu_seconds": round(cpu, 2)}
        total_wall, total_cpu = wall, cpu
        paths = sample_paths(instance, 2, record["windows"], args.window)
        for name, policy in policies.items():
            replay(policy, tensors, demand[: args.window], factor[: args.window + 1], args.window)  # warm-up, untimed
            _, wall, cpu = timed(replay, policy, tensors, demand, factor, args.window)
            _, ref_wall, ref_cpu = timed(evaluate, policy, tensors, paths)
            total_wall, total_cpu = total_wall + wall, total_cpu + cpu
            record |= {
                f"{name}_replay_wall_seconds": round(wall, 2),
                f"{name}_replay_cpu_seconds": round(cpu, 2),
                f"{name}_evaluation_wall_seconds": round(ref_wall, 2),
                f"{name}_replay_over_evaluation_cpu": round(cpu / ref_cpu, 2),
            }
        record |= {"backtest_wall_seconds": round(total_wall, 1), "backtest_cpu_seconds": round(total_cpu, 1)}
        record |= {"torch_threads": torch.get_num_threads(), "load_average": [round(x, 1) for x in os.getloadavg()]}
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
