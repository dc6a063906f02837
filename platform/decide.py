"""Answer replenishment decisions for one state or a batch from a trained checkpoint, with latency.

  python platform/decide.py --checkpoint runs/ot16/checkpoint.pt --state state.json [--mode sampled]

state.json: {"inventory": [I_1..I_n], "in_transit": [[P_11, P_12, P_13], ...], "factor": F}, or a list of
such objects for a batch. The instance is the one stored in the checkpoint, or --instance.
Prints JSON: open (Y), open_probability (p), quantity (Q, proposed; executed only if Y = 1), latency.
"""

import argparse
import json
import time

import torch

from envs.cli import read_file, run_cli
from envs.dynamics import State
from envs.features import global_token, item_tokens
from envs.instance import LMAX, Instance
from trainers.policy import MODES, load_policy


def read_states(path: str, n: int) -> State:
    data = read_file(path, "state file")
    records = data if isinstance(data, list) else [data]
    inv, pipe, factor = [], [], []
    for k, rec in enumerate(records):
        if not isinstance(rec, dict) or set(rec) != {"inventory", "in_transit", "factor"}:
            raise ValueError(f"state {k}: expected exactly the keys ['factor', 'in_transit', 'inventory']")
        i, p, f = (torch.tensor(rec[key], dtype=torch.float32) for key in ("inventory", "in_transit", "factor"))
        if i.shape != (n,):
            raise ValueError(f"state {k} field 'inventory': expected {n} numbers, got shape {tuple(i.shape)}")
        if p.shape != (n, LMAX - 1) or bool((p < 0).any()):
            raise ValueError(f"state {k} field 'in_transit': expected {n} lists of {LMAX - 1} non-negative numbers, got shape {tuple(p.shape)}")
        if f.ndim != 0 or not all(bool(torch.isfinite(x).all()) for x in (i, p, f)):
            raise ValueError(f"state {k}: expected finite numbers and a scalar 'factor'")
        inv.append(i), pipe.append(p), factor.append(f)
    return State(torch.stack(inv), torch.stack(pipe), torch.stack(factor))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--state", required=True, help="state JSON (one object or a list)")
    parser.add_argument("--instance", help="instance JSON (default: the checkpoint's)")
    parser.add_argument("--mode", default="greedy", choices=MODES)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    instance = Instance.load(args.instance) if args.instance else None
    policy, ckpt = load_policy(args.checkpoint, args.mode, args.device, instance)
    instance = instance or ckpt["instance"]
    tinst = instance.to_torch(args.device)
    state = read_states(args.state, instance.n)
    state = State(state.inv.to(args.device), state.pipe.to(args.device), state.factor.to(args.device))
    policy(state, tinst)  # warm-up
    start = time.perf_counter()
    open_order, quantity = policy(state, tinst)
    if open_order.is_cuda:
        torch.cuda.synchronize()
    latency = time.perf_counter() - start
    with torch.no_grad():
        p = torch.sigmoid(policy.model.open_logit(item_tokens(tinst, state), global_token(tinst, state)))
    print(json.dumps({
        "open": open_order.int().tolist(),
        "open_probability": p.tolist(),
        "quantity": quantity.tolist(),
        "mode": args.mode,
        "batch": state.batch,
        "latency_ms": latency * 1e3,
    }))


if __name__ == "__main__":
    run_cli(main)
