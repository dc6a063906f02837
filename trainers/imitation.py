"""Warm start by imitation of a teacher policy, before the paper's first update (not part of the paper:
`imitation_updates` = 0, the default, runs none of this).

A teacher is a policy found by name (`teacher_policy`): a Policy (state, instance) -> (Y, Q) whose Q is its
proposal for every item of every state, also where Y = 0 (a classical policy's Q = clip(S - IP, 0, qbar), the
decomposition lookahead's y_i* - x_i where item i gains, clipped to [0, qbar_i]); the placed order is Y Q, so
the proposal is a target wherever the student is asked for one.

One imitation update: B rollouts continue T_roll steps from where the previous update left them, and the
three networks are fitted on those B T_roll states by
  open      binary cross-entropy of the open logit (eq. order_head) against the teacher's Y;
  quantity  squared error of the fraction (eq. quantity_head) against Q_teacher / qbar, on every item of
            every state;
  critic    0.5 (V(s_t) - G_t)^2 (eq. value_head) with G_t = sum_k gamma^k C_{t+k} / c_ref the discounted
            cost-to-go of the policy that acts, in the units of eq. (cost_normalization), simulated
            `cost_to_go_steps` steps past the last state of the update and truncated there (gamma^k <= TAIL: at
            most 1% of the tail's value).
In a plain update the teacher acts. In a DAgger update (Ross et al. 2011) a `StudentMix` acts: in each row and
step the student's greedy decision with probability `share`, else the teacher's; the teacher labels every
state the rollout visits, so the student learns what the teacher would do in the states its own mistakes
lead to, and the critic learns the cost-to-go of the mix (the student's own at share 1), acted by the
student of the update that keeps the state.
The steps simulated past an update are kept ahead for the next plain update, which simulates only its own T
new ones (`TeacherRollouts`); a DAgger update simulates its steps past the update again, since its student
is new.
The three networks have disjoint parameters, so the sum of the three losses trains each on its own loss.

The rollouts draw their exogenous steps, and a mix its uniforms, for the whole batch (trainers.streams), so
the phase does not depend on the number of workers (to float reduction).
"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from envs.dynamics import State, step
from envs.evaluation import EVAL_HORIZON, Policy
from envs.exogenous import FactorDemandStream
from envs.features import global_token, item_tokens
from envs.instance import Instance, TensorInstance
from plumbing.errors import InputError
from policies.named_policies import named_policy
from policies.names import NAMED_POLICIES, PolicySpec, parse_policy
from trainers.memory import accumulate
from trainers.networks import ThreeNetworks, autocast
from trainers.streams import exogenous_step


def is_teacher(name) -> bool:
    """Whether `name` (a spec, or text parsed here) names a policy a run may imitate: a tuned rule or classical-best,
    or the lookahead (its tables computed, or a bound run's: decomposition-lookahead:DIR); not `zero` (it tunes no
    rule: nothing to learn) nor dp-optimal (its tables end at a horizon, the teacher's rollouts do not)."""
    try:
        spec = parse_policy(name)
    except InputError:
        return False
    return spec.lookahead or bool(spec.rules)


TEACHERS = tuple(name for name in NAMED_POLICIES if is_teacher(name))
"""The named policies a run may imitate (`is_teacher`)."""


TAIL = 0.01
"""The cost-to-go is simulated until the discount gamma^k falls to this."""


def teacher_policy(
    source: Instance, name: PolicySpec | str, device="cpu", progress: bool = False, threshold: float | None = None
) -> tuple[Policy, dict]:
    """Returns (policy, parameters for the record) of the teacher `name` (`is_teacher`; a spec, or a name parsed here) on `source`, as
    evaluate.py builds it (policies.named_policies): a classical family tuned on the training paths for the evaluation horizon, or the
    decomposition lookahead in its stationary form (the rollouts outlast any finite table), its threshold `threshold` or tuned when None."""
    return named_policy(source, parse_policy(name), EVAL_HORIZON, device, form="stationary", progress=progress, threshold=threshold)


@dataclass
class StudentMix:
    """The policy that acts in a DAgger update: per row and step the student's decision (its greedy policy,
    trainers.policy.LearnedPolicy) with probability `share`, else the teacher's. The uniforms are drawn for the
    whole batch from `generator` (the rollout stream's), this rank keeping its `rows`."""

    student: Policy
    share: float
    generator: torch.Generator
    rows: slice

    def act(self, state: State, instance: TensorInstance, teacher_open: torch.Tensor, teacher_quantity: torch.Tensor, batch: int):
        """The executed (Y, Q) of this rank's rows, given the teacher's decision on them; `batch`: the whole batch's B."""
        uniform = torch.rand(batch, generator=self.generator, device=state.inv.device, dtype=state.inv.dtype)[self.rows]
        student_open, student_quantity = self.student(state, instance)
        student = uniform < self.share
        return torch.where(student, student_open, teacher_open), torch.where(student[:, None], student_quantity, teacher_quantity)


def cost_to_go_steps(gamma: float) -> int:
    """Steps simulated past an update's last state for its cost-to-go: the least k >= 1 with gamma^k <= TAIL
    (90 at gamma = 0.95)."""
    return max(1, math.ceil(math.log(TAIL) / math.log(gamma)))


class TeacherSteps(NamedTuple):
    """States of the teacher's rollouts (this rank's rows) and the targets on them, flattened over (row, step)."""

    items: torch.Tensor  # [b T, n, 11]  item tokens of s_t
    glob: torch.Tensor  # [b T, 4]      global token of s_t
    open_order: torch.Tensor  # [b T]   the teacher's Y_t
    fraction: torch.Tensor  # [b T, n]  the teacher's Q_t / qbar
    cost_to_go: torch.Tensor  # [b T]   G_t in c_ref units


class SimulatedStep(NamedTuple):
    """One step u of the rollouts: where it starts (enough to simulate again from it), the teacher's label and
    the cost of the decision executed."""

    state: State  # s_u, this rank's rows
    factor: torch.Tensor  # [B]  F_u of the whole batch
    rng: torch.Tensor  # the stream's generator before step u's draws
    teacher: Policy  # a copy of the teacher before its call at s_u (its clock)
    open_order: torch.Tensor  # [b]     the teacher's Y_u
    quantity: torch.Tensor  # [b, n]    the teacher's Q_u
    cost: torch.Tensor  # [b]           C_u / c_ref


class Frontier(NamedTuple):
    """Where the next imitation update starts: s_t (this rank's rows), F_t (the whole batch) and the stream's
    generator state; the teacher's clock there counts the steps kept so far."""

    state: State
    factor: torch.Tensor
    rng: torch.Tensor


class TeacherRollouts:
    """The B rollouts of a warm start, continued by each imitation update (`next_update`). An update of T steps simulates T +
    `cost_to_go_steps` steps (G_t is truncated there); in a plain update the steps past the T kept stay `ahead` for the next one, which
    simulates only T new ones (its targets are those simulating again would give); a DAgger update drops them (`rewind`) and simulates
    them again with its own student.

    Memory: `ahead` holds each step's state and the teacher's Q, 5 numbers per row, item and step (LMAX = 4), for T + cost_to_go_steps
    steps (2 GB in float32 at 1,024 rows of n = 1,024 and 100 steps); the item tokens are made for the T steps kept only."""

    def __init__(self, teacher: Policy, instance: TensorInstance, stream: FactorDemandStream, start: Frontier, rows: slice):
        """`start`: the first update's state; the stream's generator is set to its `rng`."""
        self.teacher, self.instance, self.stream, self.rows = teacher, instance, stream, rows
        self.state, self.factor = start.state, start.factor  # after the last step simulated
        stream.generator.set_state(start.rng)
        self.ahead: deque[SimulatedStep] = deque()

    def frontier(self) -> Frontier:
        """Where the next update starts (the first step not kept yet)."""
        if self.ahead:
            first = self.ahead[0]
            return Frontier(first.state, first.factor, first.rng)
        return Frontier(self.state, self.factor, self.stream.generator.get_state())

    def rewind(self) -> None:
        """Drop the steps ahead: the rollouts, the stream and the teacher's clock go back to the frontier."""
        if self.ahead:
            first = self.ahead[0]
            self.state, self.factor, self.teacher = first.state, first.factor, first.teacher
            self.stream.generator.set_state(first.rng)
            self.ahead.clear()

    def simulate(self, mix: StudentMix | None) -> None:
        """One more step past the last one simulated: the teacher labels it, the teacher or `mix` acts."""
        state, factor, instance = self.state, self.factor, self.instance
        rng, teacher = self.stream.generator.get_state(), copy.copy(self.teacher)
        open_order, quantity = self.teacher(state, instance)
        executed_open, executed_quantity = open_order, quantity
        if mix is not None:
            executed_open, executed_quantity = mix.act(state, instance, open_order, quantity, factor.shape[0])
        demand, self.factor = exogenous_step(self.stream, factor, self.rows)
        self.state, cost = step(instance, state, executed_open, executed_quantity, demand, self.factor[self.rows])
        self.ahead.append(SimulatedStep(state, factor, rng, teacher, open_order, quantity, cost / instance.c_ref))

    def next_update(self, steps: int, mix: StudentMix | None = None) -> TeacherSteps:
        """The states and targets of the next `steps` steps; the teacher acts, or `mix` does (a DAgger update),
        and the teacher labels every state."""
        instance = self.instance
        if mix is not None:
            self.rewind()  # steps ahead acted by the teacher or an earlier student
        with torch.no_grad():
            while len(self.ahead) < steps + cost_to_go_steps(instance.gamma):
                self.simulate(mix)
            simulated = list(self.ahead)
            cost_to_go, running = [], torch.zeros_like(simulated[0].cost)
            for t in reversed(range(len(simulated))):
                running = simulated[t].cost + instance.gamma * running
                if t < steps:
                    cost_to_go.append(running)
            kept = [self.ahead.popleft() for _ in range(steps)]
            if mix is not None:
                self.rewind()
            items = [item_tokens(instance, s.state) for s in kept]
            globs = [global_token(instance, s.state) for s in kept]
        flat = lambda xs: torch.stack(xs, dim=1).flatten(0, 1)  # noqa: E731  [b, T, ...] -> [b T, ...]
        return TeacherSteps(
            flat(items),
            flat(globs),
            flat([s.open_order for s in kept]),
            flat([s.quantity / instance.qbar for s in kept]),
            flat(cost_to_go[::-1]),
        )


def replay_clock(teacher: Policy, calls: int, state: State, instance: TensorInstance) -> None:
    """Bring a newly built teacher's clock to where `calls` calls leave it: the clocks a teacher may hold (the
    periodic review's, the lookahead's period) count its calls, so `calls` calls on one row of `state` do it
    (a resumed warm start)."""
    one_row = state.index(slice(0, 1))
    with torch.no_grad():
        for _ in range(calls):
            teacher(one_row, instance)


class ImitationLosses(NamedTuple):
    total: torch.Tensor
    open: torch.Tensor
    quantity: torch.Tensor
    critic: torch.Tensor
    agreement: torch.Tensor
    """The share of states whose greedy Y = 1{p > 0.5} is the teacher's (no gradient)."""


def actor_imitation(
    logit: torch.Tensor, fraction: torch.Tensor, open_target: torch.Tensor, fraction_target: torch.Tensor, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The open network's binary cross-entropy to `open_target` (decisions, or probabilities) and the quantity
    network's squared error to `fraction_target`, each summed over these states (and items) and divided by `count`
    states (and their items): a micro-batch's share of the means over `count` states."""
    open_loss = F.binary_cross_entropy_with_logits(logit, open_target, reduction="sum") / count
    quantity = F.mse_loss(fraction, fraction_target, reduction="sum") / (count * fraction.shape[-1])
    return open_loss, quantity


def imitation_losses(
    model: ThreeNetworks, batch: TeacherSteps, chunks: list[slice] | None = None, precision: str = "float32", backward: bool = False
) -> ImitationLosses:
    """The three supervised losses of the module docstring, each a mean over the batch's states (and items), with
    the networks under `precision` (trainers.networks.autocast). With `backward` their gradients are added into
    the parameters' .grad one micro-batch of states (`chunks`; default: all at once) at a time: each adds its sum
    divided by the batch's count, so the gradient is the whole batch's with one micro-batch's activations."""
    count = batch.open_order.shape[0]
    dtype = batch.cost_to_go.dtype
    sums = torch.zeros(4, dtype=torch.float64, device=batch.cost_to_go.device)
    for rows in chunks or [slice(None)]:
        items, glob = batch.items[rows], batch.glob[rows]
        with torch.enable_grad() if backward else torch.no_grad(), autocast(precision, items.device):
            logit = model.open_logit(items, glob).to(dtype)
            fraction = model.quantity_fraction(items, glob).to(dtype)
            value = model.value(items, glob).to(dtype)
        open_loss, quantity = actor_imitation(logit, fraction, batch.open_order[rows].to(dtype), batch.fraction[rows], count)
        critic = 0.5 * F.mse_loss(value, batch.cost_to_go[rows], reduction="sum") / count
        if backward:
            accumulate(open_loss + quantity + critic)
        agreement = ((logit.detach() > 0).to(dtype) == batch.open_order[rows]).to(dtype).sum() / count
        sums += torch.stack([open_loss.detach(), quantity.detach(), critic.detach(), agreement]).double()
    open_loss, quantity, critic, agreement = sums.to(dtype)
    return ImitationLosses(open_loss + quantity + critic, open_loss, quantity, critic, agreement)
