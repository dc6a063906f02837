"""Throughput of the batched step (item-steps per second) at B = 1024 over a 10-step rollout,
forward alone and forward + backward, against a plain per-episode NumPy loop of the same step
measured in the same run; with --compile also the compiled step (envs.dynamics.compiled_step) forward, after its
compile, and on a GPU replayed as CUDA graphs, each against the eager step of the same run. Prints one JSON line
per n and a summary line.

  python bench/simulator.py [--n 16 64 1024] [--device cpu] [--compile]
"""

import argparse
import json
import time

import numpy as np
import torch

from envs.dynamics import compiled_step, initial_state, step
from envs.exogenous import FactorDemandStream
from envs.instance import LMAX, paper_instance

B, T = 1024, 10


def rollout(tinst, quantity, opens, demand, factor, simulate=step):
    state = initial_state(tinst, factor)
    total = 0.0
    for t in range(T):
        state, cost = simulate(tinst, state, opens[t], quantity[t], demand[t], factor)
        total = total + tinst.gamma**t * cost
    return total.sum()


def time_it(fn, repeats):
    fn()  # warm-up
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def numpy_loop(inst, quantity, opens, demand, episodes):
    """The same step, one episode at a time, NumPy over items."""
    h, b, lead, K = inst.h, inst.b, inst.lead.astype(int), inst.K
    now = lead == 1
    slot = np.zeros((inst.n, LMAX - 1))
    slot[np.nonzero(lead >= 2)[0], lead[lead >= 2] - 2] = 1
    for e in range(episodes):
        inv = inst.mu
        pipe = np.zeros((inst.n, LMAX - 1))
        for t in range(T):
            o = opens[t, e] * quantity[t, e]
            z = inv - demand[t, e]
            _ = K * opens[t, e] + np.sum(h * np.maximum(z, 0) + b * np.maximum(-z, 0))
            inv = z + pipe[:, 0] + now * o
            pipe = np.concatenate([pipe[:, 1:], np.zeros((inst.n, 1))], axis=1) + slot * o[:, None]


def compiled_forward(tinst, args, mode, repeats):
    """Seconds of a compiled forward rollout (the first call, which compiles, timed apart) and its greatest cost
    difference from the eager rollout's."""
    simulate = compiled_step(mode)

    def forward():
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            return rollout(tinst, *args, simulate=simulate).clone()

    started = time.perf_counter()
    compiled = forward()
    warm_up = time.perf_counter() - started
    with torch.no_grad():
        difference = (compiled - rollout(tinst, *args)).abs().item() / max(compiled.abs().item(), 1.0)
    return time_it(forward, repeats), warm_up, difference


def bench(n, device, compile_modes=()):
    inst = paper_instance(n, 0)
    tinst = inst.to_torch(device)
    stream = FactorDemandStream(tinst, B, seed=0)
    factor = stream.initial_factor()
    demand = torch.stack([stream.demand(factor) for _ in range(T)])  # [T, B, n]
    opens = (torch.rand(T, B, generator=stream.generator, device=device) < 0.5).to(tinst.dtype)
    quantity = torch.rand(T, B, n, generator=stream.generator, device=device) * tinst.qbar
    item_steps = B * T * n
    repeats = max(2, int(2e8 // (item_steps * 10)))
    with torch.no_grad():
        forward = time_it(lambda: rollout(tinst, quantity, opens, demand, factor), repeats)

    def forward_backward():
        q = quantity.clone().requires_grad_(True)
        rollout(tinst, q, opens, demand, factor).backward()

    both = time_it(forward_backward, repeats)
    episodes = max(4, min(B, int(3e5 // (n * T))))
    np_args = [x.cpu().double().numpy() for x in (quantity, opens, demand)]
    start = time.perf_counter()
    numpy_loop(inst, *np_args, episodes)
    loop = (time.perf_counter() - start) / (episodes * T * n)
    row = {
        "n": n,
        "B": B,
        "T": T,
        "device": str(device),
        "forward_item_steps_per_s": item_steps / forward,
        "forward_backward_item_steps_per_s": item_steps / both,
        "numpy_loop_item_steps_per_s": 1 / loop,
        "forward_speedup_vs_loop": loop * item_steps / forward,
        "forward_backward_speedup_vs_loop": loop * item_steps / both,
    }
    for mode in compile_modes:
        key = "cuda_graphs" if mode == "reduce-overhead" else "compiled"
        seconds, warm_up, difference = compiled_forward(tinst, (quantity, opens, demand, factor), mode, repeats)
        row |= {
            f"{key}_forward_item_steps_per_s": item_steps / seconds,
            f"{key}_vs_eager_forward": forward / seconds,
            f"{key}_warm_up_s": warm_up,
            f"{key}_relative_cost_difference": difference,
        }
    print(json.dumps({k: (round(v, 1) if isinstance(v, float) and "difference" not in k else v) for k, v in row.items()}), flush=True)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[16, 64, 1024])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true", help="also the compiled step, and on a GPU its CUDA graphs")
    args = parser.parse_args()
    modes = ((None, "reduce-overhead") if args.device.startswith("cuda") else (None,)) if args.compile else ()
    rows = [bench(n, args.device, modes) for n in args.n]
    goal = next((r for r in rows if r["n"] == 64), None)
    if goal:
        print(json.dumps({"goal": ">= 200x the NumPy loop at n=64 (forward)", "measured": round(goal["forward_speedup_vs_loop"], 1)}))


if __name__ == "__main__":
    main()
