"""Hybrid pathwise training (paper appendix "Hybrid pathwise training", algorithm
"OR-Transformer hybrid pathwise training"), shared by OR-Transformer and HPO.

Per update: B parallel rollouts of T_roll steps continue from the previous update's states (I and P
detached). Y ~ Bernoulli(p) is trained by the score loss on standardised GAE advantages
(eqs. td_residual - discrete_loss), the quantities by the pathwise loss through the simulator with a
frozen-critic terminal value (eq. pathwise_loss), the critic by regression (eq. critic_loss); the total
is eq. (total_loss). Costs are normalised by c_ref (eq. cost_normalization).

Memory: the open and critic networks see only detached states, so they need not sit in the rollout's graph.
An update draws its exogenous steps first, then goes through its rollouts in micro-batches (`hybrid_losses`):
the rollout with the quantity network in the graph and the backward pass of its pathwise term, then the critic
and the open network on the stored tokens, in micro-batches of their own; the gradients add up to those of the
one-graph update. The micro-batches come from the config's memory budget (trainers.memory). An update runs with
TF32 as the config says, restored after it (`matmul_tf32`), and with `compile` or `cuda_graphs` on compiled
networks.

The update is written for data-parallel use: when torch.distributed is initialised (a Ray Train
worker), rank k simulates rollouts k B/W .. (k+1) B/W - 1 of the B, the advantage statistics, the
gradients and the metrics are averaged across ranks, and the single-process run is the one-worker case.
Rollout b's randomness depends on (seed, b), not on the world size W: every rank draws the whole batch's
exogenous steps and open-decision uniforms from the common streams and keeps its rows (trainers.streams),
and a checkpoint holds the whole batch's rollout state. So 1 and W workers give the same curve (to float reduction), and a
checkpoint resumes on any W that divides B.

The run's config and schedules are trainers/pathwise_config.py, the collectives trainers/collectives.py, and the
optional warm start by imitation (not the paper's) trainers/warm_start.py.

Also not the paper's: after each update a rollout whose stock or backorders left |I_i| <= restart_periods lam_i +
qbar_i starts again from the initial state (`restart_runaways`), and the process that writes the run folder scores
the greedy policy on the validation set and keeps the best network (trainers.model_selection; `PathwiseRun.validate`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch.func import functional_call
from torch.nn.attention import sdpa_kernel

from envs.dynamics import State, initial_state, step
from envs.exogenous import FactorDemandStream
from envs.features import global_token, item_tokens
from envs.instance import Instance, TensorInstance
from plumbing.errors import InputError
from trainers.collectives import all_gather_rows, average_gradients, global_sum, rank_and_world, shard_rows
from trainers.config import ConfigError, MethodName, divergence_reason
from trainers.flops import UpdateArithmetic
from trainers.imitation import (
    actor_imitation,
)
from trainers.memory import MemoryPlan, StateBytes, accumulate, default_budget, release_freed_memory, saved_bytes
from trainers.model_selection import Score, Validation, due, validation_record
from trainers.networks import ThreeNetworks, autocast
from trainers.pathwise_config import (
    ATTENTION_KERNELS,
    TrainConfig,
    anchor_weight,
    build_network,
    entropy_weight,
    learning_rate,
    load_initial_weights,
)
from trainers.run_folder import MethodRun, OnUpdate, train_run
from trainers.streams import OPEN_UNIFORMS, PAPER_STREAM, exogenous_step, stream_seed
from trainers.warm_start import warm_start

COMPILE_BACKEND = "inductor"
"""torch.compile's backend under `compile` or `cuda_graphs` (the tests count graphs with "aot_eager")."""


@contextmanager
def matmul_tf32(on: bool):
    """Inside the block the float32 matrix products on a GPU use TF32 or not (`on`); after it the process's flags
    are as they were: torch.backends.cuda.matmul's allow_tf32, and its fp32_precision where torch has one (setting
    allow_tf32 sets it too)."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32, getattr(matmul, "fp32_precision", None)
    matmul.allow_tf32 = on
    try:
        yield
    finally:
        matmul.allow_tf32 = before[0]
        if before[1] is not None:
            matmul.fp32_precision = before[1]


def attention_kernel(name: str):
    """Inside the block the networks' attention runs on the kernel `name` (ATTENTION_KERNELS; "auto": torch's choice)."""
    kernel = ATTENTION_KERNELS[name]
    return sdpa_kernel(kernel) if kernel is not None else nullcontext()


def tokens(instance: TensorInstance, state: State):
    return item_tokens(instance, state), global_token(instance, state)


class RolloutDraws(NamedTuple):
    """The exogenous steps and open-decision uniforms of one update's rollouts (this rank's rows), drawn before
    the rollouts: they do not depend on the decisions, so the micro-batches can take their rows in any order."""

    demand: torch.Tensor  # [T, b, n]  D_t
    factor: torch.Tensor  # [T, b]     F_{t+1}
    uniform: torch.Tensor  # [T, b]    U_t of Y_t = 1{U_t < p_t}

    def rows(self, rows: slice) -> RolloutDraws:
        return RolloutDraws(self.demand[:, rows], self.factor[:, rows], self.uniform[:, rows])


def draw_rollouts(stream: FactorDemandStream, factor: torch.Tensor, generator: torch.Generator, steps: int, rows: slice) -> RolloutDraws:
    """`steps` steps from F_t of the whole batch (`factor`, [B]): every rank draws the whole batch's demands,
    factors and uniforms from the common streams and keeps its `rows` (trainers.streams)."""
    demands, factors, uniforms = [], [], []
    for _ in range(steps):
        uniforms.append(torch.rand(factor.shape, generator=generator, device=factor.device, dtype=factor.dtype)[rows])
        demand, factor = exogenous_step(stream, factor, rows)
        demands.append(demand)
        factors.append(factor[rows])
    return RolloutDraws(torch.stack(demands), torch.stack(factors), torch.stack(uniforms))


class Stored(NamedTuple):
    """What the critic and open passes need of rollouts, detached."""

    items: torch.Tensor  # [b, T, n, 11]  item tokens of s_t
    glob: torch.Tensor  # [b, T, 4]       global token of s_t
    normalized_cost: torch.Tensor  # [b, T]  C~_t
    open_order: torch.Tensor  # [b, T]  sampled Y_t
    bootstrap_value: torch.Tensor  # [b]  V_psi(s_T)


class Rollout(NamedTuple):
    """One micro-batch of rollouts: the pathwise term with its graph, the rest detached for the later passes."""

    pathwise: torch.Tensor  # []  sum over the rollouts of sum_t gamma^t C~_t + gamma^T V_{sg(psi)}(s_T), eq. (pathwise_loss)
    stored: Stored
    final_state: State  # detached


def rollout(model: ThreeNetworks, instance: TensorInstance, state: State, draws: RolloutDraws, precision: str = "float32") -> Rollout:
    """Simulates the rollouts of `state` over `draws`; returns the pathwise term with its graph and the rest detached. Q = qbar * fraction
    carries the graph; Y = 1{U < p(s_t)} is sampled without one (its log-probability is taken on the stored tokens in `hybrid_losses`);
    the terminal value uses the frozen critic sg(psi), its gradient flowing into s_T only. The networks run under `precision`, the
    simulator in the instance's dtype."""
    gamma, steps = instance.gamma, draws.demand.shape[0]
    items_kept, globs_kept, costs, opens = [], [], [], []
    pathwise = torch.zeros((), device=state.inv.device, dtype=state.inv.dtype)
    for t in range(steps):
        items, glob = tokens(instance, state)
        items_kept.append(items.detach())
        globs_kept.append(glob.detach())
        with torch.no_grad(), autocast(precision, items.device):
            p = torch.sigmoid(model.open_logit(items_kept[-1], globs_kept[-1]).to(items.dtype))
        open_order = (draws.uniform[t] < p).to(items.dtype)
        with autocast(precision, items.device):
            quantity = instance.qbar * model.quantity_fraction(items, glob).to(items.dtype)
        state, cost = step(instance, state, open_order, quantity, draws.demand[t], draws.factor[t])
        pathwise = pathwise + gamma**t * (cost / instance.c_ref).sum()
        costs.append(cost.detach() / instance.c_ref)
        opens.append(open_order)
    items, glob = tokens(instance, state)
    frozen = {name: p.detach() for name, p in model.critic_net.named_parameters()}
    with autocast(precision, items.device):
        terminal_value = functional_call(model.critic_net, frozen, (items, glob)).to(items.dtype)
    stack = lambda xs: torch.stack(xs, dim=1)  # noqa: E731
    pathwise = pathwise + gamma**steps * terminal_value.sum()
    stored = Stored(stack(items_kept), stack(globs_kept), stack(costs), stack(opens), terminal_value.detach())
    return Rollout(pathwise, stored, state.detach())


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


def restart_runaways(state: State, instance: TensorInstance, periods: float) -> tuple[State, torch.Tensor]:
    """The rollouts of `state` in which some item's stock or backorders |I_i| exceed `periods` lam_i + qbar_i start
    again from the initial state (envs.dynamics.initial_state; the factor runs on, as it is exogenous): returns the
    new state and how many restarted ([] tensor). A rollout that ran away (a policy that stopped ordering, or orders
    far above demand) would otherwise stay away for the rest of the run, its costs growing with every update."""
    away = (state.inv.abs() > periods * instance.lam + instance.qbar).any(-1)  # [b]
    fresh = initial_state(instance, state.factor)
    inv = torch.where(away[:, None], fresh.inv, state.inv)
    pipe = torch.where(away[:, None, None], fresh.pipe, state.pipe)
    return State(inv, pipe, state.factor), away.sum()


def standardize(advantage: torch.Tensor) -> torch.Tensor:
    """Eq. (standardized_advantage) over all B T_roll pairs (of every rank when data-parallel)."""
    count = advantage.new_full((), float(advantage.numel()))  # filled on the device: no host-to-device copy, no sync
    stats = global_sum(torch.stack([advantage.sum(), (advantage**2).sum(), count]))
    mean = stats[0] / stats[2]
    std = (stats[1] / stats[2] - mean**2).clamp_min(0).sqrt()
    return (advantage - mean) / (std + 1e-8)


class Losses(NamedTuple):
    total: torch.Tensor
    score: torch.Tensor
    pathwise: torch.Tensor
    critic: torch.Tensor
    entropy: torch.Tensor
    anchor: torch.Tensor


class Anchor(NamedTuple):
    """The anchor term of an update (`anchor_losses`): the network the paper phase started from and its weight."""

    network: ThreeNetworks
    weight: float


def anchor_losses(model: ThreeNetworks, anchor: ThreeNetworks, items: torch.Tensor, glob: torch.Tensor, logit: torch.Tensor, count: int):
    """How far the actor is from `anchor` on these states (not the paper's): the open network's Bernoulli KL
    divergence from the anchor's, KL(p_anchor || p) = BCE(logit, p_anchor) - H(p_anchor), and the squared error of the
    quantity fractions (trainers.imitation.actor_imitation, the warm start's terms with the anchor as teacher), each a
    micro-batch's share of the means over `count` states. `logit` is the model's open logit on the states."""
    with torch.no_grad():
        anchor_logit = anchor.open_logit(items, glob).to(logit.dtype)
        anchor_fraction = anchor.quantity_fraction(items, glob).to(logit.dtype)
        target = torch.sigmoid(anchor_logit)
        own_entropy = F.binary_cross_entropy_with_logits(anchor_logit, target, reduction="sum") / count
    fraction = model.quantity_fraction(items, glob).to(logit.dtype)
    cross_entropy, quantity = actor_imitation(logit, fraction, target, anchor_fraction, count)
    return cross_entropy - own_entropy + quantity


class UpdateResult(NamedTuple):
    losses: Losses  # no gradient; each a mean over this rank's rollouts (and steps)
    discounted_cost: torch.Tensor  # [b]  sum_t gamma^t C_t in cost units
    open_rate: torch.Tensor  # []  mean Y_t
    final_state: State


def hybrid_losses(
    model: ThreeNetworks,
    instance: TensorInstance,
    state: State,
    draws: RolloutDraws,
    config: TrainConfig,
    alpha_entropy: float,
    chunks: list[slice],
    readout_chunks: list[slice] | None = None,
    backward: bool = True,
    actor: bool = True,
    anchor: Anchor | None = None,
) -> UpdateResult:
    """Eqs. (discrete_loss), (pathwise_loss), (critic_loss), (total_loss) of this rank's rollouts; with `backward`, their gradients are
    added into the parameters' .grad one micro-batch at a time, in three passes:

    1. per micro-batch of `chunks`: the rollouts (`rollout`) and the backward pass of their share of alpha_PW L_PW; their tokens, costs
       and open decisions are stored for the whole shard;
    2. per micro-batch of `readout_chunks` (default `chunks`): the critic on the stored states, GAE (eqs. td_residual - gae, within each
       rollout) and the backward pass of their share of alpha_V L_V;
    3. the advantages standardised over the whole batch of every rank (eq. standardized_advantage), then per micro-batch of
       `readout_chunks` the open network's log-probabilities and entropies and the backward pass of their share of L_Y - alpha_H H.

    Each micro-batch adds its sum divided by the shard's count, so the gradient is the whole batch's one-graph gradient to float rounding
    (in bfloat16 the rollout's p, which samples Y, can round differently from the score term's: docs/methods.md, "Memory").
    Without `actor` (the critic's warm-up) only the critic's gradient is computed; the score, pathwise and entropy terms are metrics.
    With an `anchor` the open pass adds its weight times `anchor_losses` to L_Y - alpha_H H."""
    shard, steps = state.batch, draws.demand.shape[0]
    per_state = shard * steps
    precision = config.precision
    actor = actor and backward
    with torch.enable_grad() if backward else torch.no_grad():
        pathwise, stored, finals = torch.zeros((), device=state.inv.device, dtype=state.inv.dtype), None, []
        for rows in chunks:
            with torch.enable_grad() if actor else torch.no_grad():
                ro = rollout(model, instance, state.index(rows), draws.rows(rows), precision)
            if actor:
                accumulate(config.pathwise_weight * ro.pathwise / shard)
            pathwise = pathwise + ro.pathwise.detach()
            if stored is None:  # the whole shard's, filled micro-batch by micro-batch
                stored = Stored(*(x.new_empty((shard, *x.shape[1:])) for x in ro.stored))
            for whole, part in zip(stored, ro.stored):
                whole[rows] = part
            finals.append(ro.final_state)
        release_freed_memory(pathwise.device)  # the rollout pass's heap, before the critic pass (trainers.memory)
        pathwise = pathwise / shard
        readout = [Stored(*(x[rows] for x in stored)) for rows in readout_chunks or chunks]
        critic, advantages = torch.zeros_like(pathwise), []
        for part in readout:
            with autocast(precision, part.items.device):
                value = model.value(part.items.flatten(0, 1), part.glob.flatten(0, 1)).to(pathwise.dtype).view(part.open_order.shape)
            advantage, target = gae(part.normalized_cost, value, part.bootstrap_value, instance.gamma, config.gae_lambda)
            loss = 0.5 * ((value - target) ** 2).sum() / per_state
            if backward:
                accumulate(config.critic_weight * loss)
            critic = critic + loss.detach()
            advantages.append(advantage)
        release_freed_memory(pathwise.device)  # the critic pass's heap, before the open pass
        standardized = standardize(torch.cat(advantages)).split([part.open_order.shape[0] for part in readout])
        score, entropy, anchored = torch.zeros_like(pathwise), torch.zeros_like(pathwise), torch.zeros_like(pathwise)
        weight = anchor.weight if anchor else 0.0
        for part, advantage in zip(readout, standardized):
            items, glob = part.items.flatten(0, 1), part.glob.flatten(0, 1)
            with torch.enable_grad() if actor else torch.no_grad(), autocast(precision, part.items.device):
                logit = model.open_logit(items, glob).to(pathwise.dtype)
                anchor_part = anchor_losses(model, anchor.network, items, glob, logit, per_state) if anchor else torch.zeros_like(pathwise)
                distribution = torch.distributions.Bernoulli(logits=logit.view(part.open_order.shape), validate_args=False)  # no host sync
                score_part = (distribution.log_prob(part.open_order) * advantage).sum() / per_state
                entropy_part = distribution.entropy().sum() / per_state
            if actor:
                accumulate(score_part - alpha_entropy * entropy_part + weight * anchor_part)
            score, entropy, anchored = score + score_part.detach(), entropy + entropy_part.detach(), anchored + anchor_part.detach()
    total = score + config.pathwise_weight * pathwise + config.critic_weight * critic - alpha_entropy * entropy + weight * anchored
    discount = instance.gamma ** torch.arange(steps, device=pathwise.device, dtype=torch.float64)
    final = State(*(torch.cat([getattr(f, name) for f in finals]) for name in ("inv", "pipe", "factor")))
    return UpdateResult(
        Losses(total, score, pathwise, critic, entropy, anchored),
        (stored.normalized_cost.double() * instance.c_ref * discount).sum(1),
        stored.open_order.double().mean(),
        final,
    )


class PathwiseTrainer:
    """Holds the model, optimiser, the continuing rollout state (this rank's rows) and the random streams of one run."""

    def __init__(self, config: TrainConfig, instance: TensorInstance, fresh: bool = True, validation: Validation | None = None):
        """`fresh`: a run's start, from config.initial_weights when it names a checkpoint; False when a checkpoint of
        this run replaces the weights at once (load_state_dict), so a resumed fine-tune needs no initial_weights file.
        `validation`: the run's validation set and best network (trainers.model_selection; on the process that writes the
        run folder), kept in the checkpoint state."""
        self.config = config
        self.instance = instance
        _, world = rank_and_world()
        if config.batch % world:
            raise ConfigError(f"config field 'batch': {config.batch} rollouts do not split evenly over {world} workers")
        self.shard = config.batch // world
        self.rows = shard_rows(self.shard)
        torch.manual_seed(config.seed)  # identical initial weights on every rank
        self.model = build_network(config, instance.n).to(device=instance.device, dtype=instance.dtype)
        if fresh and config.initial_weights:  # every rank loads the same file
            load_initial_weights(self.model, config)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.learning_rate, eps=config.adam_eps)
        # the same streams on every rank, drawn for the whole batch (module docstring)
        self.stream = FactorDemandStream(instance, config.batch, seed=stream_seed(config.seed, PAPER_STREAM))
        self.generator = torch.Generator(device=instance.device)
        self.generator.manual_seed(stream_seed(config.seed, OPEN_UNIFORMS))
        self.state = initial_state(instance, self.stream.initial_factor()[self.rows])
        self.update = 0
        self.warm_start_record: dict[str, Any] | None = None
        """What the warm start did (teacher, final losses, seconds), once it is done; part of the checkpoint."""
        self.imitation: dict[str, Any] | None = None
        """A warm start under way (from a checkpoint, or after an imitation update but the last): its checkpoint
        state (imitation updates done, the imitation optimizer, the rollouts' next state and stream, the
        teacher's parameters, seconds), written by trainers.warm_start."""
        if config.checkpoint_activations:
            self.model.quantity_net.encoder.checkpoint_blocks = True
        self.memory = self._memory_plan()
        """The micro-batches of an update and of an imitation update (trainers.memory)."""
        self.arithmetic = (
            UpdateArithmetic.of(config, instance.n, instance.device, world) if config.method == MethodName.OR_TRANSFORMER else None
        )
        """An OR-Transformer update's FLOPs on this rank and the card's peak: each update's MFU (trainers.flops)."""
        if config.compile or config.cuda_graphs:  # after the plan, which measures the eager networks
            self.model.compile_networks(mode="reduce-overhead" if config.cuda_graphs else None, backend=COMPILE_BACKEND)
        self.validation = validation
        self.anchor: ThreeNetworks | None = None
        """The network the paper phase started from, frozen, while the anchor term lasts (`anchor_losses`)."""

    def _anchor_network(self, weights: dict[str, torch.Tensor]) -> ThreeNetworks:
        network = build_network(self.config, self.instance.n).to(device=self.instance.device, dtype=self.instance.dtype)
        network.load_state_dict(weights)
        return network.requires_grad_(False).eval()

    def _anchor(self) -> Anchor | None:
        """This update's anchor term, its network taken from the model at the paper phase's first update (after any
        warm start); None where its weight is 0, and the network is let go once the term has ended."""
        weight = anchor_weight(self.config, self.update)
        if not weight:
            if self.update >= self.config.critic_warmup_updates:
                self.anchor = None
            return None
        if self.anchor is None:
            if self.update > self.config.critic_warmup_updates:
                raise RuntimeError(
                    f"the anchor network is missing at update {self.update}: a checkpoint without it cannot resume the anchor term"
                )
            self.anchor = self._anchor_network(self.model.state_dict())
        return Anchor(self.anchor, weight)

    def _memory_plan(self) -> MemoryPlan:
        """Measure what one state keeps for each network (one state's forwards, trainers.memory) and choose the
        micro-batches for the config's budget. A rollout of one row is measured over one and over two steps: the
        difference is one step (quantity network, features, simulator), the rest the frozen critic on s_T. What the
        update stores of a state are its tokens and draws, its cost and its open decision."""
        config, instance, model = self.config, self.instance, self.model
        state = self.state.index(slice(0, 1))
        items, glob = (x.detach() for x in tokens(instance, state))

        def one_row_draws(steps: int) -> RolloutDraws:
            return RolloutDraws(
                torch.zeros_like(state.inv).expand(steps, -1, -1),
                state.factor.expand(steps, -1),
                torch.ones_like(state.factor).expand(steps, -1),
            )

        def one_row_rollout(steps: int) -> int:
            draws = one_row_draws(steps)
            return saved_bytes(lambda: rollout(model, instance, state, draws, config.precision).pathwise, model.parameters())

        def network(forward):
            with autocast(config.precision, instance.device):
                return saved_bytes(lambda: forward(items, glob), model.parameters())

        with attention_kernel(config.attention):  # what a kernel keeps for its backward pass differs (math: S x S)
            one, two = one_row_rollout(1), one_row_rollout(2)
            recomputed = 0
            if config.checkpoint_activations:
                model.quantity_net.encoder.checkpoint_blocks = False
                recomputed = network(model.quantity_fraction) // config.blocks
                model.quantity_net.encoder.checkpoint_blocks = True
            anchored = network(model.quantity_fraction) if config.anchor_weight else 0
            per_state = [two - one, 2 * one - two, network(model.open_logit), network(model.value), recomputed]
        stored = sum(x.nbytes for x in (items, glob, *one_row_draws(1))) + 2 * state.inv.element_size()  # and C~_t, Y_t
        per_state = StateBytes(*per_state, stored, anchored)
        if config.memory_budget:
            budget, source = config.memory_budget, "config field 'memory_budget'"
        else:
            budget, source = default_budget(instance.device)
        return MemoryPlan.choose(budget, source, per_state, self.shard, config.rollout, config.micro_batch)

    def warm_start_due(self) -> bool:
        return self.config.imitation_updates + self.config.imitation_dagger_updates > 0 and self.warm_start_record is None

    def step(self) -> dict[str, float]:
        """One update; returns its metrics, averaged over the ranks (cost10 is the rollouts' mean discounted cost
        sum_{t<T} gamma^t C_t)."""
        if self.warm_start_due():
            raise RuntimeError(
                "config field 'imitation_updates' or 'imitation_dagger_updates' is > 0: call warm_start(instance) before the first update"
            )
        config, instance = self.config, self.instance
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(config, self.update)
        alpha_entropy = entropy_weight(config, self.update)
        actor = self.update >= config.critic_warmup_updates
        anchor = self._anchor()
        streams = (self.stream.generator.get_state(), self.generator.get_state())
        started = time.perf_counter()
        try:
            draws = draw_rollouts(self.stream, all_gather_rows(self.state.factor), self.generator, config.rollout, self.rows)
            self.optimizer.zero_grad(set_to_none=True)
            chunks = (self.memory.rollout_chunks(), self.memory.readout_chunks())
            with self.update_settings():
                result = hybrid_losses(self.model, instance, self.state, draws, config, alpha_entropy, *chunks, actor=actor, anchor=anchor)
        except Exception:  # e.g. out of memory: the trainer stays at its last update (trainers.run_folder saves it there)
            self.stream.generator.set_state(streams[0])
            self.generator.set_state(streams[1])
            self.optimizer.zero_grad(set_to_none=True)
            raise
        norms = self.gradient_step(self.optimizer)
        _, world = rank_and_world()
        self.state = result.final_state  # truncated backpropagation through time: detached
        restarted = torch.zeros((), device=instance.device)
        if config.restart_periods:
            self.state, restarted = restart_runaways(self.state, instance, config.restart_periods)
        self.update += 1
        local = torch.stack([result.discounted_cost.mean(), *(value.double() for value in result.losses), result.open_rate])
        mean = global_sum(local) / world  # every shard holds B / W rollouts: the mean of the means
        figures = torch.cat([mean, global_sum(restarted.double())[None], torch.stack([norm.double() for norm in norms.values()])])
        figures = figures.tolist()  # the update's one host synchronisation: every kernel of the update has run
        seconds = time.perf_counter() - started
        utilisation = self.arithmetic.utilisation(seconds) if self.arithmetic else None
        return {
            "update": self.update,
            **dict(zip(("cost10", "loss", "score_loss", "pathwise_loss", "critic_loss", "entropy", "anchor_loss", "open_rate"), figures)),
            "restarted": int(figures[len(local)]),
            "learning_rate": learning_rate(config, self.update - 1),
            **{f"grad_norm_{name}": value for name, value in zip(norms, figures[len(local) + 1 :])},
            "update_seconds": seconds,
            **({"mfu": utilisation} if utilisation is not None else {}),
        }

    def gradient_step(self, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
        """Average the accumulated gradients over the ranks, clip each network's gradient norm to grad_clip and
        step `optimizer`; returns each network's norm before clipping ([] tensors: no host synchronisation)."""
        _, world = rank_and_world()
        if world > 1:
            average_gradients(list(self.model.parameters()), world)
        norms = {}
        for name, params in self.model.networks().items():
            grads = [p for p in params if p.grad is not None]
            norms[name] = (
                torch.nn.utils.clip_grad_norm_(grads, self.config.grad_clip) if grads else torch.zeros((), device=self.instance.device)
            )
        optimizer.step()
        return norms

    @contextmanager
    def update_settings(self):
        """The settings an update's networks run under: TF32 as the config says (`matmul_tf32`), the config's attention
        kernel, and with CUDA graphs a new step of the compiled graphs' replays (the previous update's outputs may be
        overwritten)."""
        if self.config.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with matmul_tf32(self.config.uses_tf32), attention_kernel(self.config.attention):
            yield

    def diverged(self, metrics: dict[str, float]) -> str | None:
        return divergence_reason(metrics, self.instance.c_ref, self.instance.gamma, self.config.rollout, self.config.divergence_cost)

    # ---- checkpoint state (plain tensors and primitives only) ----------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The run's state with the whole batch's rollout state, gathered from every rank (a collective: every
        rank calls it), so a checkpoint does not depend on the number of workers."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "update": self.update,
            "rollout_state": {
                "inv": all_gather_rows(self.state.inv),
                "pipe": all_gather_rows(self.state.pipe),
                "factor": all_gather_rows(self.state.factor),
            },
            "stream_rng": self.stream.generator.get_state(),
            "open_rng": self.generator.get_state(),
            "warm_start": self.warm_start_record,
            **({"imitation": self.imitation} if self.imitation else {}),
            **({"validation": self.validation.state()} if self.validation else {}),
            **({"anchor": self.anchor.state_dict()} if self.anchor is not None else {}),
        }

    def load_state_dict(self, data: dict[str, Any]) -> None:
        """Load a checkpoint's state; this rank takes its rows of the whole batch's rollout state."""
        s = data["rollout_state"]
        if s["inv"].shape[0] != self.config.batch:
            raise InputError(
                f"checkpoint: its rollout state holds {s['inv'].shape[0]} rollouts, this run's config field 'batch' is {self.config.batch}"
            )
        self.model.load_state_dict(data["model"])
        self.optimizer.load_state_dict(data["optimizer"])
        self.update = int(data["update"])
        device = self.instance.device
        self.state = State(s["inv"][self.rows].to(device), s["pipe"][self.rows].to(device), s["factor"][self.rows].to(device))
        self.stream.generator.set_state(data["stream_rng"])
        self.generator.set_state(data["open_rng"])
        self.warm_start_record = data.get("warm_start")  # absent from checkpoints older than the warm start
        self.imitation = data.get("imitation") or None  # a warm start under way
        if self.validation is not None and data.get("validation"):  # absent from checkpoints older than validation
            self.validation.load_state(data["validation"])
        self.anchor = self._anchor_network(data["anchor"]) if data.get("anchor") else None


class PathwiseRun(MethodRun):
    """OR-Transformer and HPO (trainers.pathwise) on `device` (default: the config's)."""

    def __init__(self, config: TrainConfig, instance: Instance, device: str | torch.device | None = None):
        self.config, self.instance = config, instance
        self.device = config.device if device is None else device
        self.checkpoint_every = config.checkpoint_every
        self.trainer: PathwiseTrainer | None = None

    def check(self) -> None:
        if self.config.initial_weights:
            load_initial_weights(build_network(self.config, self.instance.n), self.config)

    def build(self, out: Path, checkpoint: dict[str, Any] | None) -> PathwiseTrainer:
        config = self.config
        validation = None
        if self.lead and config.validate_every:
            validation = Validation(
                self.instance, config.validation_episodes, config.validation_horizon, self.device, config.validation_margin
            )
        self.trainer = PathwiseTrainer(config, self.instance.to_torch(self.device), fresh=checkpoint is None, validation=validation)
        if checkpoint is not None:
            self.trainer.load_state_dict(checkpoint["trainer"])
        return self.trainer

    @property
    def warm_start_record(self) -> dict[str, Any] | None:
        return self.trainer.warm_start_record

    def warm_start(self, progress: bool = False, after_update: Callable[[int], bool] | None = None) -> bool:
        if not self.trainer.warm_start_due():
            return False
        return warm_start(self.trainer, self.instance, progress, after_update) is not None

    def describe(self) -> str:
        return self.trainer.memory.describe()

    def validate(self, last: int) -> Score | None:
        validation, update = self.trainer.validation, self.trainer.update
        if validation is None or not due(update, self.config.validate_every, last) or validation.scored(update):
            return None
        return validation.score(self.trainer.model, update)

    @property
    def validation_record(self) -> dict[str, Any] | None:
        validation = self.trainer.validation if self.trainer else None
        return validation_record(self.config, validation.state()) if validation else None

    @property
    def saves_after_failure(self) -> bool:
        """In one process: a failed step restores its streams (PathwiseTrainer.step). Not data-parallel, where saving
        gathers every rank's rollouts and a rank that failed alone would leave the others waiting."""
        return rank_and_world()[1] == 1

    def checkpoint_state(self) -> dict[str, Any]:
        """On every rank of a data-parallel run: the state gathers the whole batch's rollout state."""
        return self.trainer.state_dict()


def train(
    config: TrainConfig,
    instance: Instance,
    out_dir: str | Path,
    mode: str = "new",
    progress: bool = True,
    on_update: OnUpdate = None,
) -> dict[str, Any]:
    """Train a pathwise run (OR-Transformer or HPO) in this process in `out_dir`: a new run, the resumption of
    the run there, or a new run over it (`mode`: trainers.run_folder); `on_update`: trainers.run_folder.RunAttempt. Returns
    training.json's content."""
    return train_run(out_dir, mode, config, instance, PathwiseRun(config, instance), progress, on_update)
