"""State, one-step cost and transition: eqs. (post_demand), (one_step_cost), (inventory_transition),
(in_transit_transition).

Timing within step t: the action (Y_t, Q_t) is chosen on s_t; demand D_t is realised; cost is
assessed on Z_t = I_t - D_t; then the slot-1 in-transit quantity arrives, the other slots shift
down, and the new order O_t = Y_t Q_t enters slot L_i - 1 (or inventory directly if L_i = 1).
An order placed at t is therefore first available for demand at t + L_i.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from envs.instance import LMAX, TensorInstance


@dataclass(frozen=True)
class State:
    """s_t = (I_t, P_t, F_t), eq. (state); Theta travels separately as the instance.
    inv: [B, n] net inventory before demand (negative = backlog); pipe: [B, n, LMAX-1] in transit, pipe[..., l-1] = P_{i,l,t} arrives
    at t + l; factor: [B] observed market factor F_t, [B, k] with k factors (docs/model.md)."""

    inv: torch.Tensor
    pipe: torch.Tensor
    factor: torch.Tensor

    @property
    def batch(self) -> int:
        return int(self.inv.shape[0])

    def detach(self) -> State:
        return State(self.inv.detach(), self.pipe.detach(), self.factor.detach())

    def inventory_position(self) -> torch.Tensor:
        """I_i + sum_l P_{i,l}: [B, n]."""
        return self.inv + self.pipe.sum(-1)

    def index(self, rows) -> State:
        return State(self.inv[rows], self.pipe[rows], self.factor[rows])


def initial_state(instance: TensorInstance, factor0: torch.Tensor) -> State:
    """The initial state (the paper is silent; our choice, docs/model.md): I_0 = mu_i = lam_i (L_i + 1),
    P_0 = 0, F_0 from the exogenous path. factor0: [B] or [B, k]."""
    batch = factor0.shape[0]
    inv = instance.mu.expand(batch, instance.n).clone()
    pipe = torch.zeros(batch, instance.n, LMAX - 1, device=instance.device, dtype=instance.dtype)
    return State(inv, pipe, factor0)


def step(
    instance: TensorInstance,
    state: State,
    open_order: torch.Tensor,
    quantity: torch.Tensor,
    demand: torch.Tensor,
    factor_next: torch.Tensor,
) -> tuple[State, torch.Tensor]:
    """One transition. open_order Y: [B] in {0, 1}; quantity Q: [B, n] in [0, qbar]; demand D: [B, n];
    factor_next F_{t+1}: [B] or [B, k]. Returns (s_{t+1}, C_t [B]). Differentiable in Q, I and P."""
    executed = open_order[:, None] * quantity  # O_t = Y_t Q_t  [B, n]
    post_demand = state.inv - demand  # Z_t, eq. (post_demand)  [B, n]
    cost = instance.K * open_order + (  # C_t, eq. (one_step_cost)  [B]
        instance.h * torch.relu(post_demand) + instance.b * torch.relu(-post_demand)
    ).sum(-1)
    inv_next = post_demand + state.pipe[..., 0] + instance.arrives_now * executed  # eq. (inventory_transition)
    shifted = torch.cat([state.pipe[..., 1:], torch.zeros_like(state.pipe[..., :1])], dim=-1)  # P_{l+1}, P_Lmax = 0
    pipe_next = shifted + instance.arrives_in_slot * executed[..., None]  # eq. (in_transit_transition)
    return State(inv_next, pipe_next, factor_next), cost


@cache
def compiled_step(mode: str | None = None, backend: str = "inductor"):
    """`step` under torch.compile, its 18 kernels fused into a few: the same state, costs and gradients to float
    rounding. One per (mode, backend), so its callers share the graphs: one per batch shape and per which inputs need
    a gradient. `mode` "reduce-overhead" also replays each as a CUDA graph (at small n a step is launch-bound)."""
    return torch.compile(step, mode=mode, backend=backend)
