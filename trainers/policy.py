"""The decision API: a trained network as a policy (state, instance) -> (Y, Q) for the shared evaluator,
and `decide`, which also returns the opening probability p (what platform/decide.py reports). A checkpoint
of any method loads as its policy through trainers.registry.load_policy.

Decisions run under torch.inference_mode; a Transformer's open encoder updates only h_0 in its
last block (trainers/networks.py). As a policy (`__call__`) the quantity network runs only on the states
that open on a CPU (on a GPU on every state, then masked: no host synchronisation): the evaluator executes
O = Y Q, so Q of a state with Y = 0 is never used and is returned as 0.

`precision` "bfloat16" runs the networks under bfloat16 autocast (p and Q return in the state's dtype): a greedy
opening can flip only where p is within bfloat16's rounding of 0.5. `cuda_graphs` (a CUDA device) replays the two
networks' forwards as one CUDA graph per batch shape, captured at the shape's first decision (`CapturedForward`):
a decision is then one replay instead of a launch per kernel. An autocast around a call has no effect: the policy's
`precision` decides."""

from __future__ import annotations

from typing import NamedTuple

import torch

from envs.dynamics import State
from envs.features import global_token, item_tokens
from envs.instance import TensorInstance
from trainers.networks import ThreeNetworks, autocast

MODES = ("greedy", "sampled")
PRECISIONS = ("float32", "bfloat16")


class Decision(NamedTuple):
    """One decision per state of a batch: Y [B] in {0, 1}, p = P(Y = 1) [B], proposed Q [B, n] in [0, qbar]
    (0 on the states with Y = 0 when decided with opened_only)."""

    open: torch.Tensor
    probability: torch.Tensor
    quantity: torch.Tensor


class LearnedPolicy:
    """Y = 1{p > 0.5} (greedy) or Y ~ Bernoulli(p) (sampled); Q = qbar * fraction, eq. (policy_outputs_main)."""

    def __init__(self, model: ThreeNetworks, mode: str = "greedy", seed: int = 0, precision: str = "float32", cuda_graphs: bool = False):
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {list(MODES)}, got '{mode}'")
        if precision not in PRECISIONS:
            raise ValueError(f"precision: expected one of {list(PRECISIONS)}, got '{precision}'")
        device = next(model.parameters()).device
        if cuda_graphs and device.type != "cuda":
            raise ValueError(f"cuda_graphs: CUDA graphs need the network on a cuda device, it is on '{device}'")
        self.model = model.eval()
        self.mode = mode
        self.seed = seed
        self.precision = precision
        self.generator: torch.Generator | None = None
        self.captured: dict[tuple[int, ...], CapturedForward] | None = {} if cuda_graphs else None
        """The captured forwards by item-token shape (module docstring); None without CUDA graphs."""

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
        if self.captured is not None:
            shape = tuple(items.shape)
            if shape not in self.captured:
                self.captured[shape] = CapturedForward(self._networks, items, glob)
            logit, every_fraction = self.captured[shape](items, glob)
        else:
            with autocast(self.precision, items.device):
                logit = self.model.open_logit(items, glob)
        p = torch.sigmoid(logit.to(items.dtype))
        if self.mode == "greedy":
            open_order = (p > 0.5).to(p.dtype)
        else:
            if self.generator is None:
                self.reset()
            open_order = torch.bernoulli(p, generator=self.generator)
        if self.captured is not None:
            fraction = every_fraction.to(items.dtype) * (open_order[:, None] if opened_only else 1.0)
        elif not opened_only:
            fraction = self._fraction(items, glob)
        elif items.device.type != "cpu":
            # on a GPU, selecting the rows that open would wait for Y on the host: every row, then a mask
            fraction = open_order[:, None] * self._fraction(items, glob)
        else:
            rows = open_order.nonzero()[:, 0]
            fraction = torch.zeros_like(items[..., 0])
            if rows.numel():
                fraction[rows] = self._fraction(items[rows], glob[rows])
        return Decision(open_order, p, instance.qbar * fraction)

    def _fraction(self, items: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
        """The quantity fractions at the policy's precision, in the tokens' dtype: [B, n]."""
        with autocast(self.precision, items.device):
            return self.model.quantity_fraction(items, glob).to(items.dtype)

    def _networks(self, items: torch.Tensor, glob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The open logit [B] and the quantity fractions [B, n] at the policy's precision (autocast's weight cache off,
        as a CUDA graph's capture needs)."""
        with autocast(self.precision, items.device, cache_enabled=False):
            return self.model.open_logit(items, glob), self.model.quantity_fraction(items, glob)

    def __call__(self, state: State, instance: TensorInstance):
        open_order, _, quantity = self.decide(state, instance, opened_only=True)
        return open_order, quantity


class CapturedForward:
    """A function of (items, glob) on a CUDA device captured as a CUDA graph for one input shape: each call copies the
    inputs into the graph's own, replays it and returns copies of its outputs (a later replay overwrites them)."""

    WARM_UP = 3
    """Calls on a side stream before the capture (the kernels' lazy set-up must not be captured)."""

    def __init__(self, forward, items: torch.Tensor, glob: torch.Tensor):
        self.items, self.glob = items.clone(), glob.clone()
        side = torch.cuda.Stream(device=items.device)
        side.wait_stream(torch.cuda.current_stream(items.device))
        with torch.cuda.stream(side):
            for _ in range(self.WARM_UP):
                forward(self.items, self.glob)
        torch.cuda.current_stream(items.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = forward(self.items, self.glob)

    def __call__(self, items: torch.Tensor, glob: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.items.copy_(items)
        self.glob.copy_(glob)
        self.graph.replay()
        return tuple(output.clone() for output in self.outputs)
