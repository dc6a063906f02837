"""Decision latency of trained-policy networks, the fast decision path, and update time of the pathwise trainer.

Latency: one state and a batch of 128 at n in {16, 64, 1024}, for the paper-size OR-Transformer
(M=4, d=128) and the cpu preset, both networks on every state (`LearnedPolicy.decide`), against the
factor-aware base-stock decision measured in the same run.
Fast path: one state at n = 1,024, paper network, the distribution of each step of trainers/policy.py
against the reference measured in the same run (both networks on every token under no_grad, the path
before the fast one), timed in turn, round by round; and the policy call in bfloat16 (`LearnedPolicy(precision="bfloat16")`:
autocast inside the policy, see docs/benchmarks.md) with its agreement with float32 on held-out states (a
base-stock rollout on the held-out paths; the untrained network's open bias is set so that half open).
Update time: the cpu preset at n in {4, 16, 64}, OR-Transformer and HPO, against the simulator-only
rollout of the same size (no network). Prints one JSON line per figure.

  python bench/policy.py [--device cuda] [--threads 2] [--figures fast-path bfloat16-agreement latency update-time] [--against REV]

--against REV runs the same figures with the code of git revision REV first (a temporary worktree) and then
prints each time against it: the before and after of a change, on one machine in one run.
"""

import argparse
import contextlib
import copy
import io
import json
import sys
import time

import numpy as np
import torch
from revisions import records_at

from envs.dynamics import State, initial_state, step
from envs.exogenous import HELDOUT_SEED, FactorDemandStream, sample_paths
from envs.features import global_token, item_tokens
from envs.instance import paper_instance
from policies.classical import RULES, make_policy
from trainers.pathwise import PathwiseTrainer
from trainers.pathwise_config import NO_WARM_START, build_network
from trainers.policy import LearnedPolicy
from trainers.registry import method_config

BASE_STOCK = {"reorder_z": -0.5, "cover": 2, "order_up_to_z": 0.5, "cycle_stock": 0.0}
ROUNDS = 100  # timed calls per fast-path variant


def seconds_of(fn) -> float:
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def distribution(seconds) -> dict:
    """Median and tail of call times, in ms."""
    ms = np.asarray(seconds) * 1e3
    return {"ms": round(float(np.median(ms)), 3), **{f"p{q}_ms": round(float(np.percentile(ms, q)), 3) for q in (10, 90, 99)}}


def median_seconds(fn, repeats):
    fn()
    return float(np.median([seconds_of(fn) for _ in range(repeats)]))


def latency(device):
    for n in (16, 64, 1024):
        tinst = paper_instance(n, 0).to_torch(device)
        classical = make_policy(tinst, RULES["base-stock-factor"], BASE_STOCK)
        for batch in (1, 128):
            state = initial_state(tinst, FactorDemandStream(tinst, batch, 0).initial_factor())
            reference = median_seconds(lambda: classical(state, tinst), 20)  # noqa: B023 (called at once, inside the loop)
            for name in ("paper", "cpu"):
                policy = LearnedPolicy(build_network(method_config("or-transformer", name), n).to(device), "greedy")
                seconds = median_seconds(lambda: policy.decide(state, tinst), 5 if n == 1024 and batch == 128 else 20)  # noqa: B023 (called at once, inside the loop)
                print(
                    json.dumps(
                        {
                            "figure": "decision_latency_ms",
                            "network": f"or-transformer/{name}",
                            "n": n,
                            "batch": batch,
                            "device": device,
                            "ms": round(seconds * 1e3, 3),
                            "classical_ms": round(reference * 1e3, 3),
                            "ratio_vs_classical": round(seconds / reference, 1),
                        }
                    ),
                    flush=True,
                )


def reference_decision(model, state, tinst):
    """The decision before the fast path: both networks on every state and every token, under no_grad."""
    with torch.no_grad():
        items, glob = item_tokens(tinst, state), global_token(tinst, state)
        return (torch.sigmoid(model.open_logit(items, glob)) > 0.5).float(), tinst.qbar * model.quantity_fraction(items, glob)


def every_row_decision(model, state, tinst):
    """Both networks under inference mode, with the open encoder's last block still updating every token."""
    with torch.inference_mode():
        items, glob = item_tokens(tinst, state), global_token(tinst, state)
        logit = model.open_net.head(model.open_net.encoder(items, glob)[:, 0])[:, 0]
        return (torch.sigmoid(logit) > 0.5).float(), tinst.qbar * model.quantity_fraction(items, glob)


def with_open_bias(model, shift: float):
    """A copy of `model` whose open head's bias is shifted by `shift`."""
    shifted = copy.deepcopy(model)
    with torch.no_grad():
        shifted.open_net.head.bias += shift
    return shifted


def fast_path(device, n=1024):
    """One state: each step of the fast path against the reference, timed in turn over ROUNDS rounds."""
    tinst = paper_instance(n, 0).to_torch(device)
    state = initial_state(tinst, FactorDemandStream(tinst, 1, 0).initial_factor())
    model = build_network(method_config("or-transformer", "paper"), n).to(device).eval()
    opens, closes = with_open_bias(model, +50.0), with_open_bias(model, -50.0)  # |open logit| of the untrained network is O(1)
    policies = {1: LearnedPolicy(opens), 0: LearnedPolicy(closes)}
    halves = {1: LearnedPolicy(opens, precision="bfloat16"), 0: LearnedPolicy(closes, precision="bfloat16")}
    assert all(policy(state, tinst)[0].item() == y for y, policy in policies.items())
    variants = {
        "reference (no_grad, both networks, every token)": lambda: reference_decision(opens, state, tinst),
        "inference_mode, both networks, every token": lambda: every_row_decision(opens, state, tinst),
        "+ last open block on h_0 only (decide: both networks)": lambda: policies[1].decide(state, tinst),
        "+ quantity network only if Y = 1 (policy call), Y = 1": lambda: policies[1](state, tinst),
        "+ quantity network only if Y = 1 (policy call), Y = 0": lambda: policies[0](state, tinst),
        "policy call under bfloat16 autocast, Y = 1": lambda: halves[1](state, tinst),
        "policy call under bfloat16 autocast, Y = 0": lambda: halves[0](state, tinst),
    }
    times = {name: [] for name in variants}
    for fn in variants.values():
        fn()
    for _ in range(ROUNDS):
        for name, fn in variants.items():
            times[name].append(seconds_of(fn))
    reference = float(np.median(times[next(iter(variants))]))
    for name, seconds in times.items():
        print(
            json.dumps(
                {
                    "figure": "fast_decision_ms",
                    "network": "or-transformer/paper",
                    "n": n,
                    "batch": 1,
                    "device": device,
                    "threads": torch.get_num_threads(),
                    "path": name,
                    "calls": ROUNDS,
                    **distribution(seconds),
                    "ratio_vs_reference": round(float(np.median(seconds)) / reference, 3),
                }
            ),
            flush=True,
        )


def heldout_states(instance, tinst, episodes, horizon) -> State:
    """The states a base-stock rollout visits on the first `episodes` held-out paths (episodes * horizon states)."""
    paths = sample_paths(instance, HELDOUT_SEED, episodes, horizon, tinst.device)
    classical = make_policy(tinst, RULES["base-stock-factor"], BASE_STOCK)
    state, visited = initial_state(tinst, paths.factor[:, 0]), []
    for t in range(horizon):
        visited.append(state)
        open_order, quantity = classical(state, tinst)
        state, _ = step(tinst, state, open_order, quantity, paths.demand[:, t], paths.factor[:, t + 1])
    return State(*(torch.cat([getattr(s, key) for s in visited]) for key in ("inv", "pipe", "factor")))


def bfloat16_agreement(device, n=1024, episodes=8, horizon=50, chunk=50):
    """Open logit and quantities of both networks under bfloat16 autocast against float32, on held-out states."""
    instance = paper_instance(n, 0)
    tinst = instance.to_torch(device)
    states = heldout_states(instance, tinst, episodes, horizon)
    model = build_network(method_config("or-transformer", "paper"), n).to(device).eval()
    items, glob = item_tokens(tinst, states).split(chunk), global_token(tinst, states).split(chunk)

    def outputs(precision):
        """(open logit [S], Q [S, n]) in float32 numbers."""
        with torch.inference_mode(), torch.autocast(tinst.device.type, torch.bfloat16, enabled=precision == "bfloat16"):
            logit = torch.cat([model.open_logit(i, g).float() for i, g in zip(items, glob)])
            return logit, tinst.qbar * torch.cat([model.quantity_fraction(i, g).float() for i, g in zip(items, glob)])

    (logit, quantity), (logit16, quantity16) = outputs("float32"), outputs("bfloat16")
    threshold = logit.median()  # the open bias that makes half of the states open in float32
    relative = (quantity16 - quantity).abs() / quantity
    print(
        json.dumps(
            {
                "figure": "bfloat16_agreement",
                "network": "or-transformer/paper (untrained, open bias at the median logit)",
                "n": n,
                "states": states.batch,
                "device": device,
                "float32_open_fraction": round(float((logit > threshold).double().mean()), 3),
                "open_agreement": round(float(((logit16 > threshold) == (logit > threshold)).double().mean()), 4),
                "max_relative_quantity_difference": round(float(relative.max()), 5),
                "median_relative_quantity_difference": round(float(relative.median()), 5),
                "max_open_logit_difference": round(float((logit16 - logit).abs().max()), 5),
                "open_logit_sd": round(float(logit.std()), 5),
            }
        ),
        flush=True,
    )


def update_time(device):
    for n in (4, 16, 64):
        tinst = paper_instance(n, 0).to_torch(device)
        for method in ("or-transformer", "hpo"):
            cfg = method_config(method, "cpu", {"device": device, **NO_WARM_START})  # the update alone, without the warm start
            trainer = PathwiseTrainer(cfg, tinst)
            seconds = median_seconds(trainer.step, 5)
            model_free = median_seconds(lambda: _simulate(tinst, cfg.batch, cfg.rollout), 5)  # noqa: B023 (called at once, inside the loop)
            print(
                json.dumps(
                    {
                        "figure": "update_seconds",
                        "preset": "cpu",
                        "method": method,
                        "n": n,
                        "batch": cfg.batch,
                        "rollout": cfg.rollout,
                        "device": device,
                        "seconds": round(seconds, 4),
                        "simulator_only_seconds": round(model_free, 5),
                        "ratio_vs_simulator": round(seconds / model_free, 1),
                        "transitions_per_s": round(cfg.batch * cfg.rollout / seconds),
                    }
                ),
                flush=True,
            )


def _simulate(tinst, batch, steps):
    stream = FactorDemandStream(tinst, batch, 0)
    state = initial_state(tinst, stream.initial_factor())
    ones = torch.ones(batch, device=tinst.device)
    for _ in range(steps):
        state, _ = step(
            tinst, state, ones, tinst.qbar.expand(batch, -1) * 0.5, stream.demand(state.factor), stream.next_factor(state.factor)
        )


FIGURES = {"fast-path": fast_path, "bfloat16-agreement": bfloat16_agreement, "latency": latency, "update-time": update_time}


KEYS = ("figure", "network", "method", "path", "n", "batch")
"""What names one record, for the comparison with another commit's."""
TIMES = ("seconds", "ms")


def compare(records: list[dict], before: list[dict], revision: str) -> None:
    """One line per record that both runs made: this code's time against `revision`'s."""
    theirs = {tuple(r.get(k) for k in KEYS): r for r in before}
    for record in records:
        other = theirs.get(tuple(record.get(k) for k in KEYS))
        unit = next((u for u in TIMES if u in record), None)
        if other is None or unit is None or unit not in other:
            continue
        named = {k: record[k] for k in KEYS if k in record}
        print(
            json.dumps(
                {
                    **named,
                    "figure": f"{record['figure']}_against",
                    "against": revision,
                    unit: record[unit],
                    f"{unit}_before": other[unit],
                    "ratio_vs_before": round(record[unit] / other[unit], 3),
                }
            ),
            flush=True,
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--figures", nargs="+", choices=list(FIGURES), default=list(FIGURES), help="which figures (default: all)")
    parser.add_argument(
        "--against", metavar="REV", help="also run the same figures with the code of git revision REV first, and print each time's ratio"
    )
    args = parser.parse_args()
    before = []
    if args.against:
        arguments = ["--device", args.device, "--figures", *args.figures, *(["--threads", str(args.threads)] if args.threads else [])]
        before = records_at(args.against, [sys.executable, "bench/policy.py", *arguments], "bench/policy.py")
        for record in before:
            print(json.dumps({**record, "code": args.against}), flush=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    records = []
    for name in args.figures:
        torch.manual_seed(0)  # the untrained networks' weights
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            FIGURES[name](args.device)
        for line in printed.getvalue().splitlines():
            print(line, flush=True)
            records.append(json.loads(line))
    if before:
        compare(records, before, args.against)


if __name__ == "__main__":
    main()
