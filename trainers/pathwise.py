"""Hybrid pathwise training (paper appendix "Hybrid pathwise training", algorithm
"OR-Transformer hybrid pathwise training"), shared by OR-Transformer and HPO.

Per update: B parallel rollouts of T_roll steps continue from the previous update's states (I and P
detached). Y ~ Bernoulli(p) is trained by the score loss on standardised GAE advantages
(eqs. td_residual - discrete_loss), the quantities by the pathwise loss through the simulator with a
frozen-critic terminal value (eq. pathwise_loss), the critic by regression (eq. critic_loss); the total
is eq. (total_loss). Costs are normalised by c_ref (eq. cost_normalization).

The update is written for data-parallel use: when torch.distributed is initialised (a Ray Train
worker), each rank simulates its shard of the B rollouts, the advantage statistics and the gradients
are averaged across ranks, and the single-process run is the one-worker case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import torch
import torch.distributed as dist
from torch.func import functional_call

from envs.dynamics import State, initial_state, step
from envs.exogenous import FactorDemandStream
from envs.features import global_token, item_tokens
from envs.instance import TensorInstance
from trainers.config import ConfigError, TrainerConfig, divergence_reason
from trainers.networks import HPOPerceptron, ORTransformer, ThreeNetworks, TransformerShape

METHODS = ("or-transformer", "hpo")


@dataclass(frozen=True)
class TrainConfig(TrainerConfig):
    """One pathwise run (OR-Transformer or HPO): the shared fields and the hybrid losses' settings."""

    method: str = "or-transformer"
    """or-transformer (three Transformer encoders) or hpo (three perceptrons on the flat input)."""
    pathwise_weight: float = 1.0
    """alpha_PW, >= 0."""
    critic_weight: float = 0.13
    """alpha_V, >= 0."""
    entropy_start: float = 0.01
    """alpha_H at the first update (>= 0), annealed linearly to entropy_end (>= 0) at the last."""
    entropy_end: float = 0.001
    final_learning_rate: float = 3e-5
    """The learning rate is warmed linearly over `warmup` (>= 0) updates to learning_rate, then cosine-decayed to this (> 0)."""
    warmup: int = 40
    adam_eps: float = 1e-5
    """Adam's epsilon, > 0."""
    checkpoint_every: int = 500
    """Updates between checkpoints (>= 0; 0: only at the end). Gradients are clipped for each network separately."""

    def __post_init__(self):
        self.require_choice("method", METHODS)
        self.check_shared_fields()
        for name in ("pathwise_weight", "critic_weight", "entropy_start", "entropy_end"):
            self.require_real(name, 0)
        for name in ("final_learning_rate", "adam_eps"):
            self.require_real(name, 0, low_open=True)
        self.require_int("warmup", 0)
        self.require_int("checkpoint_every", 0)


PRESETS: dict[str, dict[str, Any]] = {
    # The paper's configuration.
    "paper": {},
    # Trains n = 16 in well under 30 minutes on two CPU cores: 8x fewer rollouts per update, 12.5x
    # fewer updates, two blocks of width 64 (4 heads, feed-forward 256) instead of four of 128.
    "cpu": {"batch": 128, "updates": 1280, "blocks": 2, "width": 64, "heads": 4, "feed_forward": 256, "hidden": 256, "checkpoint_every": 250},
}


def preset(name: str, **overrides) -> TrainConfig:
    """The preset's config with `overrides` (config fields) over it."""
    if name not in PRESETS:
        raise ConfigError(f"preset: expected one of {list(PRESETS)}, got {name!r}")
    return TrainConfig.from_dict({**PRESETS[name], **overrides})


def build_network(config: TrainConfig, n: int) -> ThreeNetworks:
    if config.method == "hpo":
        return HPOPerceptron(n, config.hidden)
    return ORTransformer(TransformerShape(config.blocks, config.width, config.heads, config.feed_forward))


def tokens(instance: TensorInstance, state: State):
    return item_tokens(instance, state), global_token(instance, state)


def learning_rate(config: TrainConfig, update: int) -> float:
    """Linear warm-up over `warmup` updates to the peak, then cosine decay to the final rate (update is 0-based)."""
    if update < config.warmup:
        return config.learning_rate * (update + 1) / config.warmup
    span = max(config.updates - config.warmup, 1)
    progress = min((update - config.warmup) / span, 1.0)
    return config.final_learning_rate + 0.5 * (config.learning_rate - config.final_learning_rate) * (1 + math.cos(math.pi * progress))


def entropy_weight(config: TrainConfig, update: int) -> float:
    """alpha_H annealed linearly from entropy_start to entropy_end over the run."""
    fraction = update / max(config.updates - 1, 1)
    return config.entropy_start + (config.entropy_end - config.entropy_start) * fraction


class Rollout(NamedTuple):
    normalized_cost: torch.Tensor  # [B, T]  C~_t, with gradient to the quantity network
    open_order: torch.Tensor  # [B, T]  sampled Y_t
    log_prob: torch.Tensor  # [B, T]  log pi(Y_t | sg(s_t))
    entropy: torch.Tensor  # [B, T]
    value: torch.Tensor  # [B, T]  V_psi(sg(s_t)), trainable
    terminal_value: torch.Tensor  # [B]  V_{sg(psi)}(s_T), gradient into s_T only
    bootstrap_value: torch.Tensor  # [B]  V_psi(s_T) without gradient
    final_state: State


def rollout(model: ThreeNetworks, instance: TensorInstance, state: State, stream: FactorDemandStream, steps: int, generator: torch.Generator) -> Rollout:
    """Simulate `steps` steps: Q from the quantity network on s_t (pathwise), Y ~ Bernoulli(p(sg(s_t)))."""
    costs, opens, log_probs, entropies, values = [], [], [], [], []
    for _ in range(steps):
        items, glob = tokens(instance, state)
        items_sg, glob_sg = items.detach(), glob.detach()
        logit = model.open_logit(items_sg, glob_sg)
        open_order = torch.bernoulli(torch.sigmoid(logit).detach(), generator=generator)
        distribution = torch.distributions.Bernoulli(logits=logit)
        opens.append(open_order)
        log_probs.append(distribution.log_prob(open_order))
        entropies.append(distribution.entropy())
        values.append(model.value(items_sg, glob_sg))
        quantity = instance.qbar * model.quantity_fraction(items, glob)
        demand = stream.demand(state.factor)
        state, cost = step(instance, state, open_order, quantity, demand, stream.next_factor(state.factor))
        costs.append(cost / instance.c_ref)
    items, glob = tokens(instance, state)
    frozen = {name: p.detach() for name, p in model.critic_net.named_parameters()}  # psi-bar = sg(psi)
    terminal_value = functional_call(model.critic_net, frozen, (items, glob))
    with torch.no_grad():
        bootstrap = model.value(items, glob)
    stack = lambda xs: torch.stack(xs, dim=1)  # noqa: E731
    return Rollout(stack(costs), stack(opens), stack(log_probs), stack(entropies), stack(values), terminal_value, bootstrap, state)


def gae(normalized_cost: torch.Tensor, value: torch.Tensor, bootstrap: torch.Tensor, gamma: float, lam: float):
    """Cost advantages and targets, eqs. (td_residual), (cost_advantage), (gae): all [B, T], no gradient."""
    cost, value = normalized_cost.detach(), value.detach()
    next_value = torch.cat([value[:, 1:], bootstrap[:, None]], dim=1)
    delta = cost + gamma * next_value - value
    advantage = torch.zeros_like(delta)
    running = torch.zeros_like(delta[:, 0])
    for t in reversed(range(delta.shape[1])):
        running = delta[:, t] + gamma * lam * running
        advantage[:, t] = running
    return advantage, advantage + value


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of this data-parallel worker; (0, 1) in a single process."""
    return (dist.get_rank(), dist.get_world_size()) if _distributed() else (0, 1)


def _global_sum(x: torch.Tensor) -> torch.Tensor:
    if _distributed():
        x = x.clone()
        dist.all_reduce(x)
    return x


def standardize(advantage: torch.Tensor) -> torch.Tensor:
    """Eq. (standardized_advantage) over all B T_roll pairs (of every rank when data-parallel)."""
    stats = _global_sum(torch.stack([advantage.sum(), (advantage**2).sum(), torch.tensor(float(advantage.numel()), device=advantage.device, dtype=advantage.dtype)]))
    mean = stats[0] / stats[2]
    std = (stats[1] / stats[2] - mean**2).clamp_min(0).sqrt()
    return (advantage - mean) / (std + 1e-8)


class Losses(NamedTuple):
    total: torch.Tensor
    score: torch.Tensor
    pathwise: torch.Tensor
    critic: torch.Tensor
    entropy: torch.Tensor


def losses(ro: Rollout, gamma: float, config: TrainConfig, alpha_entropy: float) -> Losses:
    """Eqs. (discrete_loss), (pathwise_loss), (critic_loss), (total_loss)."""
    advantage, target = gae(ro.normalized_cost, ro.value, ro.bootstrap_value, gamma, config.gae_lambda)
    score = (ro.log_prob * standardize(advantage)).mean()
    T = ro.normalized_cost.shape[1]
    discount = gamma ** torch.arange(T, device=ro.normalized_cost.device, dtype=ro.normalized_cost.dtype)
    pathwise = ((ro.normalized_cost * discount).sum(1) + gamma**T * ro.terminal_value).mean()
    critic = 0.5 * ((ro.value - target) ** 2).mean()
    entropy = ro.entropy.mean()
    total = score + config.pathwise_weight * pathwise + config.critic_weight * critic - alpha_entropy * entropy
    return Losses(total, score, pathwise, critic, entropy)


class PathwiseTrainer:
    """Holds the model, optimiser, the continuing rollout state and the random streams of one run."""

    def __init__(self, config: TrainConfig, instance: TensorInstance):
        self.config = config
        self.instance = instance
        rank, world = rank_and_world()
        if config.batch % world:
            raise ConfigError(f"config field 'batch': {config.batch} rollouts do not split evenly over {world} workers")
        self.shard = config.batch // world
        torch.manual_seed(config.seed)  # identical initial weights on every rank
        self.model = build_network(config, instance.n).to(device=instance.device, dtype=instance.dtype)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.learning_rate, eps=config.adam_eps)
        self.stream = FactorDemandStream(instance, self.shard, seed=config.seed * 1_000_003 + rank)
        self.generator = torch.Generator(device=instance.device)
        self.generator.manual_seed(config.seed * 1_000_003 + rank + 7919)
        self.state = initial_state(instance, self.stream.initial_factor())
        self.update = 0

    def step(self) -> dict[str, float]:
        """One update; returns its metrics (cost10 is the rollout's discounted cost sum_{t<T} gamma^t C_t)."""
        config, gamma = self.config, self.instance.gamma
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(config, self.update)
        alpha_entropy = entropy_weight(config, self.update)
        ro = rollout(self.model, self.instance, self.state, self.stream, config.rollout, self.generator)
        loss = losses(ro, gamma, config, alpha_entropy)
        self.optimizer.zero_grad(set_to_none=True)
        loss.total.backward()
        _, world = rank_and_world()
        norms = {}
        for name, params in self.model.networks().items():
            grads = [p for p in params if p.grad is not None]
            if world > 1:
                for p in grads:
                    dist.all_reduce(p.grad)
                    p.grad /= world
            norms[name] = float(torch.nn.utils.clip_grad_norm_(grads, config.grad_clip)) if grads else 0.0
        self.optimizer.step()
        self.state = ro.final_state.detach()  # truncated backpropagation through time
        self.update += 1
        discount = gamma ** torch.arange(config.rollout, dtype=torch.float64, device=self.instance.device)
        step_cost = ro.normalized_cost.detach().double() * self.instance.c_ref
        cost10 = _global_sum((step_cost * discount).sum(1).mean()) / world
        return {
            "update": self.update,
            "cost10": float(cost10),
            **{name: float(value.detach()) for name, value in zip(("loss", "score_loss", "pathwise_loss", "critic_loss", "entropy"), loss)},
            "open_rate": float(ro.open_order.mean()),
            "learning_rate": learning_rate(config, self.update - 1),
            **{f"grad_norm_{k}": v for k, v in norms.items()},
        }

    def diverged(self, metrics: dict[str, float]) -> Optional[str]:
        return divergence_reason(metrics, self.instance.c_ref, self.instance.gamma, self.config.rollout, self.config.divergence_cost)

    # ---- checkpoint state (plain tensors and primitives only) ----------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "update": self.update,
            "rollout_state": {"inv": self.state.inv, "pipe": self.state.pipe, "factor": self.state.factor},
            "stream_rng": self.stream.generator.get_state(),
            "open_rng": self.generator.get_state(),
        }

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.model.load_state_dict(data["model"])
        self.optimizer.load_state_dict(data["optimizer"])
        self.update = int(data["update"])
        s = data["rollout_state"]
        self.state = State(s["inv"].to(self.instance.device), s["pipe"].to(self.instance.device), s["factor"].to(self.instance.device))
        self.stream.generator.set_state(data["stream_rng"])
        self.generator.set_state(data["open_rng"])

