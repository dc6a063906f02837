"""Decision latency of trained-policy networks and update time of the pathwise trainer.

Latency: one state and a batch of 128 at n in {16, 64, 1024}, for the paper-size OR-Transformer
(M=4, d=128) and the cpu preset, against the tuned-classical decision (factor-aware base-stock)
measured in the same run. Update time: the cpu preset at n in {4, 16, 64}, OR-Transformer and HPO,
against the simulator-only rollout of the same size (no network). Prints one JSON line per figure.

  python bench/policy.py [--device cuda] [--threads 2]
"""

import argparse
import json
import time

import torch

from envs.classical import make_policy
from envs.dynamics import initial_state
from envs.exogenous import FactorDemandStream
from envs.instance import paper_instance
from trainers.pathwise import PathwiseTrainer, build_network
from trainers.policy import LearnedPolicy
from trainers.registry import method_config


def median_seconds(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def latency(device):
    for n in (16, 64, 1024):
        tinst = paper_instance(n, 0).to_torch(device)
        classical = make_policy(tinst, "base-stock-factor", {"reorder_z": -0.5, "cover": 2, "order_up_to_z": 0.5})
        for batch in (1, 128):
            state = initial_state(tinst, FactorDemandStream(tinst, batch, 0).initial_factor())
            reference = median_seconds(lambda: classical(state, tinst), 20)
            for name in ("paper", "cpu"):
                model = build_network(method_config("or-transformer", name), n).to(device)
                policy = LearnedPolicy(model, "greedy")
                seconds = median_seconds(lambda: policy(state, tinst), 5 if n == 1024 and batch == 128 else 20)
                print(json.dumps({"figure": "decision_latency_ms", "network": f"or-transformer/{name}", "n": n, "batch": batch, "device": device,
                                  "ms": round(seconds * 1e3, 3), "classical_ms": round(reference * 1e3, 3), "ratio_vs_classical": round(seconds / reference, 1)}), flush=True)


def update_time(device):
    for n in (4, 16, 64):
        tinst = paper_instance(n, 0).to_torch(device)
        for method in ("or-transformer", "hpo"):
            cfg = method_config(method, "cpu", {"device": device})
            trainer = PathwiseTrainer(cfg, tinst)
            seconds = median_seconds(trainer.step, 5)
            model_free = median_seconds(lambda: _simulate(tinst, cfg.batch, cfg.rollout), 5)
            print(json.dumps({"figure": "update_seconds", "preset": "cpu", "method": method, "n": n, "batch": cfg.batch, "rollout": cfg.rollout,
                              "device": device, "seconds": round(seconds, 4), "simulator_only_seconds": round(model_free, 5),
                              "ratio_vs_simulator": round(seconds / model_free, 1), "transitions_per_s": round(cfg.batch * cfg.rollout / seconds)}), flush=True)


def _simulate(tinst, batch, steps):
    from envs.dynamics import step
    stream = FactorDemandStream(tinst, batch, 0)
    state = initial_state(tinst, stream.initial_factor())
    ones = torch.ones(batch, device=tinst.device)
    for _ in range(steps):
        state, _ = step(tinst, state, ones, tinst.qbar.expand(batch, -1) * 0.5, stream.demand(state.factor), stream.next_factor(state.factor))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    latency(args.device)
    update_time(args.device)


if __name__ == "__main__":
    main()
