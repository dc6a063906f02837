"""The decision API: a trained network as a policy (state, instance) -> (Y, Q) for the shared evaluator,
and `decide`, which also returns the opening probability p (what platform/decide.py reports). A checkpoint
of any method loads as its policy through trainers.registry.load_policy.

Decisions run under torch.inference_mode; a Transformer's open encoder updates only h_0 in its
last block (trainers/networks.py). As a policy (`__call__`) the quantity network runs only on the states
that open on a CPU (on a GPU on every state, then masked: no host synchronisation): the evaluator executes
O = Y Q, so Q of a state with Y = 0 is never used and is returned as 0."""

from __future__ import annotations

from typing import NamedTuple

import torch

from envs.dynamics import State
from envs.features import global_token, item_tokens
from envs.instance import TensorInstance
from trainers.networks import ThreeNetworks

MODES = ("greedy", "sampled")


class Decision(NamedTuple):
    """One decision per state of a batch: Y [B] in {0, 1}, p = P(Y = 1) [B], proposed Q [B, n] in [0, qbar]
    (0 on the states with Y = 0 when decided with opened_only)."""

    open: torch.Tensor
    probability: torch.Tensor
    quantity: torch.Tensor


class LearnedPolicy:
    """Y = 1{p > 0.5} (greedy) or Y ~ Bernoulli(p) (sampled); Q = qbar * fraction, eq. (policy_outputs_main)."""

    def __init__(self, model: ThreeNetworks, mode: str = "greedy", seed: int = 0):
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {list(MODES)}, got '{mode}'")
        self.model = model.eval()
        self.mode = mode
        self.seed = seed
        self.generator: torch.Generator | None = None

    def reset(self) -> None:
        """Restart the sampling stream, so a sampled evaluation is reproducible."""
        device = next(self.model.parameters()).device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(self.seed)

    @torch.inference_mode()
    def decide(self, state: State, instance: TensorInstance, opened_only: bool = False) -> Decision:
        """Y, p and Q for every state; with `opened_only` the quantity network runs only on the states with
        Y = 1 (a greedy decision that does not open needs one encoder instead of two) and Q is 0 elsewhere."""
        items, glob = item_tokens(instance, state), global_token(instance, state)
        p = torch.sigmoid(self.model.open_logit(items, glob))
        if self.mode == "greedy":
            open_order = (p > 0.5).to(p.dtype)
        else:
            if self.generator is None:
                self.reset()
            open_order = torch.bernoulli(p, generator=self.generator)
        if not opened_only:
            fraction = self.model.quantity_fraction(items, glob).to(items.dtype)  # bfloat16 under a caller's autocast
        elif items.device.type != "cpu":
            # on a GPU, selecting the rows that open would wait for Y on the host: every row, then a mask
            fraction = open_order[:, None] * self.model.quantity_fraction(items, glob).to(items.dtype)
        else:
            rows = open_order.nonzero()[:, 0]
            fraction = torch.zeros_like(items[..., 0])
            if rows.numel():
                fraction[rows] = self.model.quantity_fraction(items[rows], glob[rows]).to(fraction.dtype)
        return Decision(open_order, p, instance.qbar * fraction)

    def __call__(self, state: State, instance: TensorInstance):
        open_order, _, quantity = self.decide(state, instance, opened_only=True)
        return open_order, quantity
