"""The decision API: a trained network as a policy (state, instance) -> (Y, Q) for the shared evaluator,
and `decide`, which also returns the opening probability p (what platform/decide.py reports)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from envs.dynamics import State
from envs.features import global_token, item_tokens
from envs.instance import Instance, TensorInstance
from trainers.checkpoint import PPO_METHODS, CheckpointError, load_checkpoint
from trainers.networks import ThreeNetworks
from trainers.pathwise import build_network

MODES = ("greedy", "sampled")


class Decision(NamedTuple):
    """One decision per state of a batch: Y [B] in {0, 1}, p = P(Y = 1) [B], proposed Q [B, n] in [0, qbar]."""

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
        self.generator: Optional[torch.Generator] = None

    def reset(self) -> None:
        """Restart the sampling stream, so a sampled evaluation is reproducible."""
        device = next(self.model.parameters()).device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(self.seed)

    @torch.no_grad()
    def decide(self, state: State, instance: TensorInstance) -> Decision:
        items, glob = item_tokens(instance, state), global_token(instance, state)
        p = torch.sigmoid(self.model.open_logit(items, glob))
        if self.mode == "greedy":
            open_order = (p > 0.5).to(p.dtype)
        else:
            if self.generator is None:
                self.reset()
            open_order = torch.bernoulli(p, generator=self.generator)
        return Decision(open_order, p, instance.qbar * self.model.quantity_fraction(items, glob))

    def __call__(self, state: State, instance: TensorInstance):
        open_order, _, quantity = self.decide(state, instance)
        return open_order, quantity


def load_policy(path, mode: str = "greedy", device="cpu", instance: Optional[Instance] = None) -> tuple[LearnedPolicy, dict]:
    """Load a checkpoint as a policy. With `instance`, check its item count where the network has a fixed
    input of 11n + 4 features (the perceptrons and the RLlib modules); OR-Transformer acts on any n."""
    ckpt = load_checkpoint(path, device)
    config, trained_on = ckpt["config"], ckpt["instance"]
    n = trained_on.n
    fixed_size = config.method == "hpo" or config.method in PPO_METHODS
    if instance is not None and fixed_size and instance.n != n:
        raise CheckpointError(f"checkpoint '{path}': a {config.method} policy for n = {n} items cannot act on an instance with n = {instance.n}")
    if config.method in PPO_METHODS:
        from trainers.rllib_ppo import RLModulePolicy, build_module

        model = build_module(config, n).to(device)
    else:
        model = build_network(config, n).to(device)
    try:
        model.load_state_dict(ckpt["trainer"]["model"])
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint '{path}': weights do not match its config ({str(exc).splitlines()[0]})") from None
    if config.method in PPO_METHODS:
        return RLModulePolicy(model, mode, config.seed), ckpt
    return LearnedPolicy(model, mode, config.seed), ckpt
