"""Decisions for states that a user sends: the state format, the check that a state is one the instance can
produce, and `Decider`, which answers a batch of states with any policy (a checkpoint of a learned method,
a tuned classical policy, the n = 1 optimum or the decomposition lookahead; made by trainers/resolver.py).
platform/decide.py and the decision service (serving.app) go through here.

A state is {"inventory": [I_1..I_n], "in_transit": [[P_11, P_12, P_13], ...], "factor": F}, with F a number for an
instance of one factor and a list of k numbers [F_1..F_k] for one of k >= 2 factors. It must be one the instance can
produce; anything else is refused, naming the state and field:
* in_transit[i][l] (P_{i,l+1}, arriving in l + 1 periods) is in [0, qbar_i]: each slot holds one
  period's order O = Y Q <= qbar_i (envs/dynamics.py shifts the slots down and puts the new order in
  slot L_i - 1 only), and it is 0 in slots l >= L_i - 1: an item with lead time L_i has only L_i - 1
  occupied slots (none for L_i = 1, whose order goes straight to inventory).
* |inventory[i]| <= 10^4 (qbar_i + lam_i): inventory rises by at most one order (<= qbar_i) per period
  and a backlog grows by the period's demand (mean lam_i), so this is more than 10^4 periods (200 times
  the evaluation horizon) of ordering the maximum with no demand, or of unserved demand, from I_0 = mu_i.
* |factor| <= 10 (each of the k coordinates): each is stationary N(0, 1) (F_0 ~ N(0, 1), AR(1) with innovation
  variance 1 - rho^2), so |F_j| > 10 has probability below 2e-23 per period.
* Every value is a finite number (not a string, boolean or NaN).
Inside these bounds the networks' inputs stay far from float32 overflow; a decision that is still not
finite (for example from a checkpoint with NaN weights) is an error too (`PolicyError`), never an answer.

An answer per state: open (Y), open_probability (p = P(Y = 1); Y itself for a classical policy or the DP,
whose rule is deterministic), quantity (Q, proposed) and order (O = Y Q, what is actually placed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
import torch

from envs.dynamics import State
from envs.exogenous import FACTOR_BOUND
from envs.instance import LMAX, Instance, exact_keys
from plumbing import validate
from plumbing.errors import InputError
from plumbing.files import file_sha256
from policies.names import PolicySpec
from trainers.resolver import resolve

KEYS = ("factor", "in_transit", "inventory")
INVENTORY_PERIODS = 10_000
QBAR_ROUNDING = 1e-6  # relative slack on in_transit <= qbar_i: states copied from float32 simulations


# ---- states -------------------------------------------------------------------------------------


def finite_array(rows: list[list]) -> np.ndarray | None:
    """`rows` (lists of one length) as float64 [len(rows), length] when every entry is a finite JSON number (not bool,
    not text): the service's hot path, one conversion for all of them; None otherwise."""
    if not all(type(x) in (int, float) for row in rows for x in row):
        return None
    try:
        array = np.array(rows, dtype=float)
    except OverflowError:  # an integer beyond float64
        return None
    return array if np.isfinite(array).all() else None


def numbers(value, length: int, where: str, what: str) -> np.ndarray:
    """`value` as a list of `length` finite numbers (float64 [length]). A list of finite JSON numbers is taken at once
    (finite_array); anything else goes number by number through plumbing.validate, which names the culprit."""
    if not isinstance(value, list) or len(value) != length:
        raise InputError(f"{where}: expected {length} {what}, got {validate.describe(value)}")
    array = finite_array([value])
    if array is not None:
        return array[0]
    return np.array([validate.real(x, f"{where}[{j}]") for j, x in enumerate(value)])


def read_factor(value, where: str, instance: Instance) -> float | np.ndarray:
    """A state's factor F_t: a number for one factor, k numbers (float64 [k]) for k >= 2 factors; each within
    |F_j| <= FACTOR_BOUND (module docstring)."""
    k = instance.factors
    if k == 1:
        if isinstance(value, list):
            raise InputError(
                f"{where}: expected a number (k = 1: the instance has {instance.demand_model()}), got {validate.describe(value)}"
            )
        factor = np.array([validate.real(value, where)])
    else:
        factor = numbers(value, k, where, f"numbers [F_1..F_{k}] (k = {k}: the instance has {instance.demand_model()})")
    if (bad := np.flatnonzero(np.abs(factor) > FACTOR_BOUND)).size:
        j = bad[0]
        raise InputError(
            f"{where if k == 1 else f'{where}[{j}]'}: {factor[j]:g} is outside [-{FACTOR_BOUND:g}, {FACTOR_BOUND:g}] "
            f"(the factor is stationary N(0, 1); |F| > {FACTOR_BOUND:g} has probability below 2e-23)"
        )
    return float(factor[0]) if k == 1 else factor


def read_state(record, k: int, instance: Instance) -> tuple[np.ndarray, np.ndarray, float | np.ndarray]:
    """One state object checked against the bounds of the module docstring: (inventory [n], in_transit [n, LMAX-1],
    factor: a number, or [k] with k >= 2 factors)."""
    n, slots = instance.n, LMAX - 1
    if not isinstance(record, dict):
        raise InputError(f"state {k}: expected an object with the keys {list(KEYS)}, got {validate.describe(record)}")
    exact_keys(record, set(KEYS), f"state {k}")
    inv = numbers(record["inventory"], n, f"state {k} field 'inventory'", "numbers (one per item)")
    if not isinstance(record["in_transit"], list) or len(record["in_transit"]) != n:
        raise InputError(
            f"state {k} field 'in_transit': expected {n} lists (one per item) of {slots} numbers, got "
            f"{validate.describe(record['in_transit'])}"
        )
    rows = record["in_transit"]
    pipe = finite_array(rows) if all(isinstance(row, list) and len(row) == slots for row in rows) else None
    if pipe is None:  # row by row, naming the culprit
        pipe = np.stack(
            [numbers(row, slots, f"state {k} field 'in_transit'[{i}]", f"numbers (slots l = 1..{slots})") for i, row in enumerate(rows)]
        )

    factor = read_factor(record["factor"], f"state {k} field 'factor'", instance)

    inv_bound = INVENTORY_PERIODS * (instance.qbar + instance.lam)
    if (bad := np.flatnonzero(np.abs(inv) > inv_bound)).size:
        i = bad[0]
        raise InputError(
            f"state {k} field 'inventory'[{i}]: {inv[i]:g} is outside [-{inv_bound[i]:g}, {inv_bound[i]:g}], "
            f"the range |I_i| <= {INVENTORY_PERIODS} (qbar_i + lam_i) an inventory can reach (docs/formats.md, decision states)"
        )
    if (bad := np.argwhere(pipe < 0)).size:
        i, slot = bad[0]
        raise InputError(
            f"state {k} field 'in_transit'[{i}][{slot}]: {pipe[i, slot]:g} is negative; an in-transit quantity is in [0, "
            f"qbar_{i}] = [0, {instance.qbar[i]:g}]"
        )
    if (bad := np.argwhere(pipe > instance.qbar[:, None] * (1 + QBAR_ROUNDING))).size:
        i, slot = bad[0]
        raise InputError(
            f"state {k} field 'in_transit'[{i}][{slot}]: {pipe[i, slot]:g} exceeds qbar_{i} = {instance.qbar[i]:g}, the largest "
            f"order one slot can hold"
        )
    lead = instance.lead.astype(int)
    if (bad := np.argwhere((pipe != 0) & (np.arange(slots) >= lead[:, None] - 1))).size:
        i, slot = bad[0]
        raise InputError(
            f"state {k} field 'in_transit'[{i}][{slot}]: expected 0, got {pipe[i, slot]:g}: item {i} has lead time L = {lead[i]}, "
            f"so only its first L - 1 = {lead[i] - 1} slots can hold an order"
        )
    return inv, pipe, factor


def read_states(data, instance: Instance, where: str) -> State:
    """A state object or a non-empty list of them (`where` names the source: a file, a request body) as a batch
    (float32; the factor [B], or [B, k] with k >= 2 factors); every state is checked by `read_state`."""
    if isinstance(data, list) and not data:
        raise InputError(f"{where}: an empty list; expected a state object or a non-empty list of them")
    if not isinstance(data, (list, dict)):
        raise InputError(f"{where}: expected a state object or a list of them, got {validate.describe(data)}")
    inv, pipe, factor = zip(*(read_state(rec, k, instance) for k, rec in enumerate(data if isinstance(data, list) else [data])))
    return State(*(torch.tensor(np.array(x), dtype=torch.float32) for x in (inv, pipe, factor)))


# ---- answering ----------------------------------------------------------------------------------


class PolicyError(InputError):
    """The policy gives a non-finite decision for a valid state (a checkpoint whose weights cannot act on it)."""


class Answer(NamedTuple):
    """Per state of a batch: Y [B] in {0, 1}, p [B], proposed Q [B, n], placed order O = Y Q [B, n]."""

    open: torch.Tensor
    probability: torch.Tensor
    quantity: torch.Tensor
    order: torch.Tensor

    def records(self) -> list[dict[str, Any]]:
        """One JSON object per state."""
        return [
            {"open": int(y), "open_probability": p, "quantity": q, "order": o}
            for y, p, q, o in zip(self.open.tolist(), self.probability.tolist(), self.quantity.tolist(), self.order.tolist())
        ]

    def to_json(self, single: bool) -> dict[str, Any] | list[dict[str, Any]]:
        """The answer as decide.py prints it and POST /decide returns it: one object for a request that was one state
        object (`single`), else a list of objects in the order of the states (docs/formats.md)."""
        records = self.records()
        return records[0] if single else records


@dataclass
class Decider:
    """One policy on one instance, answering batches of states. A learned policy answers each batch from the start
    of its seeded stream (sampled mode: the first draw, as decide.py), a classical policy from the start of its
    review clock (the periodic family: a review period), the DP optimum as at the first period of its horizon; so
    an answer depends on the state alone, never on earlier requests."""

    policy: Any
    instance: Instance
    learned: bool
    mode: str
    label: str
    """Names the policy in errors: "checkpoint 'PATH' (training status 'completed')", "policy 'classical-best'"."""
    info: dict[str, Any]
    """What the service's GET /info reports: method, mode, n, instance_hash, checkpoint_sha256, parameters."""
    device: str = "cpu"
    forward_passes: int = field(default=0, init=False)
    """Policy calls made by this copy (a replica's own count)."""

    @property
    def shares_batches(self) -> bool:
        """Whether states of different requests can share one policy call: not in sampled mode, where each
        request's answer is the first draw of the seeded stream."""
        return not (self.learned and self.mode == "sampled")

    @cached_property
    def tensor_instance(self):
        return self.instance.to_torch(self.device)

    def decide(self, state: State) -> Answer:
        """Y, p, Q and O for every state of the batch; a PolicyError if any of them is not finite."""
        answer, finite = self.answer(state)
        return self.checked(answer, finite)

    def decide_many(self, states: list[State]) -> list[Answer | PolicyError]:
        """The answers to several requests' batches: one policy call for all of them (`shares_batches`), else one each.
        Each request is checked on its own: one whose decision is not finite gets its PolicyError (naming the state
        by its index in that request) in place of its answer, and the other requests get theirs."""
        if not self.shares_batches:
            return [self.outcome(*self.answer(s)) for s in states]
        merged, finite = self.answer(State(*(torch.cat(parts) for parts in zip(*((s.inv, s.pipe, s.factor) for s in states)))))
        ends = np.cumsum([s.batch for s in states])
        return [
            self.outcome(Answer(*(x[end - s.batch : end] for x in merged)), finite[end - s.batch : end]) for s, end in zip(states, ends)
        ]

    def answer(self, state: State) -> tuple[Answer, torch.Tensor]:
        """One policy call: Y, p, Q and O for every state of the batch (on the CPU), and which of them are finite [B]."""
        tinst = self.tensor_instance
        state = State(state.inv.to(self.device), state.pipe.to(self.device), state.factor.to(self.device))
        if hasattr(self.policy, "reset"):
            self.policy.reset()
        self.forward_passes += 1
        if self.learned:
            open_order, probability, quantity = self.policy.decide(state, tinst)
        else:
            open_order, quantity = self.policy(state, tinst)
            probability = open_order
        finite = torch.isfinite(probability) & torch.isfinite(quantity).all(-1)
        open_order, probability, quantity, finite = (x.cpu() for x in (open_order, probability, quantity, finite))
        return Answer(open_order.int(), probability, quantity, open_order[:, None] * quantity), finite

    def checked(self, answer: Answer, finite: torch.Tensor) -> Answer:
        """`answer`, or a PolicyError naming the first state (its index in `answer`) whose decision is not finite."""
        if not bool(finite.all()):
            k = int((~finite).nonzero()[0])
            raise PolicyError(
                f"{self.label} gives a non-finite open probability or quantity for state {k}: its weights cannot act on this state"
            )
        return answer

    def outcome(self, answer: Answer, finite: torch.Tensor) -> Answer | PolicyError:
        """`checked`, with the error returned instead of raised (one request's outcome in a shared batch)."""
        try:
            return self.checked(answer, finite)
        except PolicyError as error:
            return error


def load_decider(
    policy: PolicySpec | str,
    instance: Instance | None = None,
    mode: str = "greedy",
    device="cpu",
    progress: bool = False,
    precision: str = "float32",
) -> Decider:
    """The Decider of `policy` (trainers.resolver): checkpoint:PATH on its own instance unless `instance` is given,
    or a named policy on `instance`, tuned or solved now (the decomposition lookahead in its stationary form: a
    state carries no period)."""
    resolved = resolve(policy, instance, mode=mode, form="stationary", device=device, progress=progress, precision=precision)
    instance = resolved.instance
    if resolved.learned:
        path = resolved.checkpoint_file  # a run folder: its best.pt
        status = resolved.parameters["training_status"]
        label = f"checkpoint '{path}' (training status '{status}')"
        info = {"method": resolved.parameters["method"], "checkpoint_sha256": file_sha256(path), "training_status": status}
        info |= {"precision": precision} if precision != "float32" else {}
    else:
        label = f"policy '{resolved.spec}'"
        info = {"method": resolved.spec.name, "checkpoint_sha256": None, "parameters": resolved.parameters}
    info = {**info, "mode": resolved.mode, "n": instance.n, "instance_hash": instance.content_hash()}
    return Decider(resolved.policy, instance, resolved.learned, resolved.mode, label, info, device)
