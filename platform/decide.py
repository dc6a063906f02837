"""Answer replenishment decisions for one state or a batch from a trained checkpoint, with latency.

  python platform/decide.py --checkpoint runs/ot16/checkpoint.pt --state state.json [--mode sampled]

state.json: {"inventory": [I_1..I_n], "in_transit": [[P_11, P_12, P_13], ...], "factor": F}, or a list of
such objects for a batch (JSON, or YAML for other suffixes). The instance is the one stored in the
checkpoint, or --instance. Works with checkpoints of every method (or-transformer, hpo, ppo,
transformer-ppo). Prints JSON: open (Y), open_probability (p), quantity (Q, proposed; executed only if
Y = 1), latency. In sampled mode the answer is the first draw of the checkpoint's seeded stream.

A state must be one the instance can produce; anything else is refused, naming the state and field:
* in_transit[i][l] (P_{i,l+1}, arriving in l + 1 periods) is in [0, qbar_i]: each slot holds one
  period's order O = Y Q <= qbar_i (envs/dynamics.py shifts the slots down and puts the new order in
  slot L_i - 1 only), and it is 0 in slots l >= L_i - 1: an item with lead time L_i has only L_i - 1
  occupied slots (none for L_i = 1, whose order goes straight to inventory).
* |inventory[i]| <= 10^4 (qbar_i + lam_i): inventory rises by at most one order (<= qbar_i) per period
  and a backlog grows by the period's demand (mean lam_i), so this is more than 10^4 periods (200 times
  the evaluation horizon) of ordering the maximum with no demand, or of unserved demand, from I_0 = mu_i.
* |factor| <= 10: the factor is stationary N(0, 1) (F_0 ~ N(0, 1), AR(1) with innovation variance
  1 - rho^2), so |F| > 10 has probability below 2e-23 per period.
* Every value is a finite number (not a string, boolean or NaN).
Inside these bounds the networks' inputs stay far from float32 overflow; a decision that is still not
finite (for example from a checkpoint with NaN weights) is an error too, never an answer.
"""

import argparse
import json
import time

import numpy as np
import torch

from envs.cli import device, input_file, read_file, run_cli
from envs.dynamics import State
from envs.errors import InputError
from envs import validate
from envs.exogenous import FACTOR_BOUND
from envs.instance import LMAX, Instance, exact_keys
from trainers.policy import MODES
from trainers.registry import load_policy

KEYS = ("factor", "in_transit", "inventory")
INVENTORY_PERIODS = 10_000
QBAR_ROUNDING = 1e-6  # relative slack on in_transit <= qbar_i: states copied from float32 simulations


def numbers(value, length: int, where: str, what: str) -> np.ndarray:
    """`value` as a list of `length` finite numbers (float64 [length])."""
    if not isinstance(value, list) or len(value) != length:
        raise InputError(f"{where}: expected {length} {what}, got {validate.describe(value)}")
    return np.array([validate.real(x, f"{where}[{j}]") for j, x in enumerate(value)])


def read_state(record, k: int, instance: Instance) -> tuple[np.ndarray, np.ndarray, float]:
    """One state object checked against the bounds of the module docstring: (inventory [n], in_transit [n, LMAX-1], factor)."""
    n, slots = instance.n, LMAX - 1
    if not isinstance(record, dict):
        raise InputError(f"state {k}: expected an object with the keys {list(KEYS)}, got {validate.describe(record)}")
    exact_keys(record, set(KEYS), f"state {k}")
    inv = numbers(record["inventory"], n, f"state {k} field 'inventory'", "numbers (one per item)")
    if not isinstance(record["in_transit"], list) or len(record["in_transit"]) != n:
        raise InputError(f"state {k} field 'in_transit': expected {n} lists (one per item) of {slots} numbers, got {validate.describe(record['in_transit'])}")
    pipe = np.stack([numbers(row, slots, f"state {k} field 'in_transit'[{i}]", f"numbers (slots l = 1..{slots})") for i, row in enumerate(record["in_transit"])])
    factor = validate.real(record["factor"], f"state {k} field 'factor'")

    inv_bound = INVENTORY_PERIODS * (instance.qbar + instance.lam)
    if (bad := np.flatnonzero(np.abs(inv) > inv_bound)).size:
        i = bad[0]
        raise InputError(f"state {k} field 'inventory'[{i}]: {inv[i]:g} is outside [-{inv_bound[i]:g}, {inv_bound[i]:g}], "
                         f"the range |I_i| <= {INVENTORY_PERIODS} (qbar_i + lam_i) an inventory can reach (see decide.py --help)")
    if (bad := np.argwhere(pipe < 0)).size:
        i, l = bad[0]
        raise InputError(f"state {k} field 'in_transit'[{i}][{l}]: {pipe[i, l]:g} is negative; an in-transit quantity is in [0, qbar_{i}] = [0, {instance.qbar[i]:g}]")
    if (bad := np.argwhere(pipe > instance.qbar[:, None] * (1 + QBAR_ROUNDING))).size:
        i, l = bad[0]
        raise InputError(f"state {k} field 'in_transit'[{i}][{l}]: {pipe[i, l]:g} exceeds qbar_{i} = {instance.qbar[i]:g}, the largest order one slot can hold")
    lead = instance.lead.astype(int)
    if (bad := np.argwhere((pipe != 0) & (np.arange(slots) >= lead[:, None] - 1))).size:
        i, l = bad[0]
        raise InputError(f"state {k} field 'in_transit'[{i}][{l}]: expected 0, got {pipe[i, l]:g}: item {i} has lead time L = {lead[i]}, "
                         f"so only its first L - 1 = {lead[i] - 1} slots can hold an order")
    if abs(factor) > FACTOR_BOUND:
        raise InputError(f"state {k} field 'factor': {factor:g} is outside [-{FACTOR_BOUND:g}, {FACTOR_BOUND:g}] "
                         f"(the factor is stationary N(0, 1); |F| > {FACTOR_BOUND:g} has probability below 2e-23)")
    return inv, pipe, float(factor)


def read_states(path: str, instance: Instance) -> State:
    """The state file as a batch (float32); every state is checked by `read_state`."""
    data = read_file(path, "state file")
    if isinstance(data, list) and not data:
        raise InputError(f"state file '{path}': an empty list; expected a state object or a non-empty list of them")
    if not isinstance(data, (list, dict)):
        raise InputError(f"state file '{path}': expected a state object or a list of them, got {validate.describe(data)}")
    inv, pipe, factor = zip(*(read_state(rec, k, instance) for k, rec in enumerate(data if isinstance(data, list) else [data])))
    return State(*(torch.tensor(np.array(x), dtype=torch.float32) for x in (inv, pipe, factor)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--state", required=True, help="state JSON (one object or a list)")
    parser.add_argument("--instance", help="instance JSON (default: the checkpoint's)")
    parser.add_argument("--mode", default="greedy", choices=MODES)
    parser.add_argument("--device", default="cpu", type=device, help="torch device: cpu, cuda or cuda:K (default cpu)")
    args = parser.parse_args()
    input_file(args.checkpoint, "checkpoint")
    input_file(args.state, "state file")
    instance = Instance.load(args.instance) if args.instance else None
    policy, ckpt = load_policy(args.checkpoint, args.mode, args.device, instance)
    instance = instance or ckpt["instance"]
    tinst = instance.to_torch(args.device)
    state = read_states(args.state, instance)
    state = State(state.inv.to(args.device), state.pipe.to(args.device), state.factor.to(args.device))
    policy.decide(state, tinst)  # warm-up
    policy.reset()  # the sampled answer is the stream's first draw
    start = time.perf_counter()
    decision = policy.decide(state, tinst)
    if decision.open.is_cuda:
        torch.cuda.synchronize()
    latency = time.perf_counter() - start
    finite = torch.isfinite(decision.probability) & torch.isfinite(decision.quantity).all(-1)
    if not bool(finite.all()):
        k = int((~finite).nonzero()[0])
        raise InputError(f"checkpoint '{args.checkpoint}' (training status '{ckpt['status']}') gives a non-finite open probability or quantity "
                         f"for state {k}: its weights cannot act on this state")
    print(json.dumps({
        "open": decision.open.int().tolist(),
        "open_probability": decision.probability.tolist(),
        "quantity": decision.quantity.tolist(),
        "mode": args.mode,
        "batch": state.batch,
        "latency_ms": latency * 1e3,
    }))


if __name__ == "__main__":
    run_cli(main)
