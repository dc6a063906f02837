"""Exogenous factor and demand paths, eqs. (factor_process), (conditional_demand), (conditional_demand_rate), and
the range of costs they can drive an instance to over a horizon (`check_cost_range`, run by `sample_paths`).

Every factor step is `factor_step`, here and in the other simulators (envs.gym_env, policies.dp_optimal,
solver_workers.model); every demand rate and draw is envs.demand_law's (Poisson, or negative binomial with
overdispersion). With k factors F_t has k independent coordinates, each the
AR(1) of eq. (factor_process) with the one rho (docs/model.md). Two samplers use them:

* `sample_paths` draws fixed episode sets (evaluation, tuning) as common random numbers. Episode e
  uses its own NumPy stream keyed by (stream tag, seed, e), so its path depends only on
  (instance, seed, e): any subset of episodes, or a longer horizon, regenerates the same prefix on
  any worker. Sampling happens on the CPU and the result is moved to the requested device, so CPU
  and GPU runs are judged on identical episodes.
* `FactorDemandStream` draws fresh exogenous steps for training rollouts with a `torch.Generator`
  on the training device (fast; reproducible for the same seed, batch size and device).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from envs.demand_law import demand_rate, draw_demand, draw_demand_torch, item_rates
from envs.instance import Instance, InstanceError, TensorInstance, factor_shape
from plumbing import validate
from plumbing.errors import InputError

HELDOUT_SEED = 20_260_128
"""Seed of the held-out evaluation set (128 episodes). No training or tuning code may use it."""
HELDOUT_EPISODES = 128
TUNING_SEED = 7
"""Seed of the training paths that classical policies are tuned on (disjoint from HELDOUT_SEED)."""
VALIDATION_SEED = 90_210
"""Seed of the validation paths on which a training run scores its networks and keeps the best (trainers.model_selection);
disjoint from HELDOUT_SEED and TUNING_SEED."""

_PATH_STREAM = 0x45584F  # tag mixed into every episode key, so other NumPy streams never coincide
FACTOR_BOUND = 10.0
"""|F_t| stays within this: the factor is stationary N(0, 1), and |F| > 10 has probability below 2e-23."""
COST_LIMIT = 1e30
"""The largest one-step cost an instance may reach over the simulated horizon (`check_cost_range`): simulations
run in float32, whose largest value is 3.4e38, and this leaves room for sums of 10^8 step costs."""


def innovation_scale(rho: float) -> float:
    """sqrt(1 - rho^2): the s.d. of the factor's innovation, which keeps F_t ~ N(0, 1), eq. (factor_process)."""
    return math.sqrt(1.0 - rho**2)


def factor_step(rho: float, factor, noise):
    """F_{t+1} = rho F_t + sqrt(1 - rho^2) eps_{t+1}, eq. (factor_process), for floats, arrays or tensors
    `factor` and standard normal `noise` of the same shape."""
    return rho * factor + innovation_scale(rho) * noise


def factor_path(rho: float, noise: np.ndarray) -> np.ndarray:
    """F_0..F_T from standard normal `noise` [T + 1, ...]: F_0 = noise[0] ~ N(0, 1), the stationary law, then `factor_step`
    with noise[t + 1] (each coordinate of k factors its own AR(1))."""
    path = np.empty_like(noise)
    path[0] = noise[0]
    for t in range(noise.shape[0] - 1):
        path[t + 1] = factor_step(rho, path[t], noise[t + 1])
    return path


def check_cost_range(instance: Instance, horizon: int) -> None:
    """Refuse, naming the field, an instance whose one-step cost C_t, eq. (one_step_cost), can exceed COST_LIMIT
    within `horizon` steps. In T steps |Z_{i,t}| <= mu_i + T (qbar_i + d_i): the initial inventory mu_i = lam_i (L_i + 1),
    at most one order of qbar_i and one demand per step, with d_i the demand rate at the factor's bound (Poisson draws
    stay within a small multiple of it; the limit leaves 10^8 of room). So C_t <= K + sum_i max(h_i, b_i) (mu_i + T (qbar_i + d_i))."""
    with np.errstate(over="ignore"):
        demand = demand_rate(instance.lam, instance.beta, FACTOR_BOUND)  # [n]
        reach = instance.mu + horizon * (instance.qbar + demand)  # [n] units of inventory or backlog
        rate = np.maximum(instance.h, instance.b)  # [n] cost per unit and step
        terms = rate * reach
        bound = instance.K + terms.sum()
    if bound <= COST_LIMIT:
        return
    why = f"the simulations run in float32 (largest value 3.4e+38) and hold one-step costs up to {COST_LIMIT:g}"
    if not instance.K <= COST_LIMIT:
        raise InstanceError(f"instance field 'K': {instance.K:g} is above {COST_LIMIT:g}; {why}")
    i = int(np.argmax(terms))
    if rate[i] >= reach[i] / horizon:
        field = "h" if instance.h[i] >= instance.b[i] else "b"
    elif instance.qbar[i] >= demand[i]:
        field = "qbar"
    else:
        with np.errstate(over="ignore"):
            field = "lam" if instance.lam[i] ** 2 >= demand[i] else "beta"  # lam_i against the factor's multiplier d_i / lam_i
    raise InstanceError(
        f"instance field '{field}' (item {i}): a cost of max(h_{i}, b_{i}) = {rate[i]:g} per unit and step on the "
        f"{reach[i]:g} units of inventory or backlog that {horizon} steps can reach (mu_{i} + T (qbar_{i} + the demand "
        f"rate at factor {FACTOR_BOUND:g})) gives one-step costs up to {bound:g}; {why}"
    )


@dataclass(frozen=True)
class ExogenousPaths:
    """Factor and demand for E episodes of T steps: factor [E, T+1] (one factor) or [E, T+1, k], F_0..F_T (the last is the factor of the
    state after the final step); demand [E, T, n], D_{i,t}."""

    factor: torch.Tensor
    demand: torch.Tensor
    seed: int
    episodes: tuple[int, ...]

    @property
    def horizon(self) -> int:
        return int(self.demand.shape[1])

    @property
    def num_episodes(self) -> int:
        return int(self.demand.shape[0])


PATH_VALUES_MAX = 2**28
"""Most demand values (episodes x steps x items) one set of exogenous paths may hold: they take 12 bytes each while
drawn (float64, then float32), 3 GiB at this limit (5,242 episodes of 50 steps at n = 1,024; the paper holds out 128)."""


def check_path_size(n: int, episodes: int, horizon: int, where: str = "episodes", error: type[Exception] = InputError) -> None:
    """Refuse paths of more than PATH_VALUES_MAX demand values before anything is drawn or trained."""
    values = episodes * horizon * n
    if values > PATH_VALUES_MAX:
        raise error(
            f"{where}: {episodes:,} episodes x {horizon:,} steps x {n:,} items = {values:,} demand values, above {PATH_VALUES_MAX:,} "
            f"(the paths take 12 bytes per value while drawn, {12 * values / 2**30:.1f} GiB); use at most "
            f"{PATH_VALUES_MAX // (horizon * n):,} episodes of {horizon:,} steps, or evaluate in parts"
        )


def sample_paths(
    instance: Instance,
    seed: int,
    episodes: int | Sequence[int],
    horizon: int,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> ExogenousPaths:
    """Sample episodes (a count E meaning 0..E-1, or explicit indices) of `horizon` steps."""
    validate.integer(horizon, "horizon", 1)
    if isinstance(episodes, (int, np.integer)):
        check_path_size(instance.n, int(episodes), horizon)  # before a tuple of a billion indices is built
    episode_ids = tuple(range(episodes)) if isinstance(episodes, (int, np.integer)) else tuple(int(e) for e in episodes)
    if not episode_ids or min(episode_ids) < 0:
        raise ValueError(f"episodes: expected a positive count or non-negative indices, got {episodes!r}")
    check_path_size(instance.n, len(episode_ids), horizon)
    check_cost_range(instance, horizon)
    shape = factor_shape(instance.factors)
    factor = np.empty((len(episode_ids), horizon + 1, *shape))
    demand = np.empty((len(episode_ids), horizon, instance.n))
    for row, e in enumerate(episode_ids):
        # the third stream, the negative binomial's gamma multipliers, leaves the first two (the paper's model) as they were
        factor_rng, demand_rng, mixing_rng = (np.random.default_rng(s) for s in np.random.SeedSequence([_PATH_STREAM, seed, e]).spawn(3))
        # Draws are consumed in time order, so a longer horizon extends the same path.
        f = factor_path(instance.rho, factor_rng.standard_normal((horizon + 1, *shape)))
        factor[row] = f
        demand[row] = draw_demand(item_rates(instance, f[:horizon]), instance.overdispersion, demand_rng, mixing_rng)
    return ExogenousPaths(
        factor=torch.as_tensor(factor, device=device).to(dtype),
        demand=torch.as_tensor(demand, device=device).to(dtype),
        seed=int(seed),
        episodes=episode_ids,
    )


class FactorDemandStream:
    """Fresh exogenous draws for B parallel training rollouts, on the instance's device. Rollout b's draws depend on the seed and b only
    when every draw is made for the whole batch (torch.poisson's use of the generator depends on the rates), so a data-parallel worker
    steps the whole batch's factor path and demands and keeps its rows (trainers.pathwise)."""

    def __init__(self, instance: TensorInstance, batch: int, seed: int):
        self.instance = instance
        self.generator = torch.Generator(device=instance.device)
        self.generator.manual_seed(int(seed))
        self.batch = batch

    def initial_factor(self) -> torch.Tensor:
        """F_0 ~ N(0, I): [B], or [B, k] with k factors."""
        shape = (self.batch, *factor_shape(self.instance.factors))
        return torch.randn(shape, generator=self.generator, device=self.instance.device, dtype=self.instance.dtype)

    def next_factor(self, factor: torch.Tensor) -> torch.Tensor:
        """F_{t+1} (factor_step): the shape of `factor`."""
        eps = torch.randn(factor.shape, generator=self.generator, device=factor.device, dtype=factor.dtype)
        return factor_step(self.instance.rho, factor, eps)

    def demand(self, factor: torch.Tensor) -> torch.Tensor:
        """D_{i,t} | F_t, eq. (conditional_demand) (envs.demand_law.draw_demand_torch, with this stream's generator): [B, n]."""
        return draw_demand_torch(item_rates(self.instance, factor), self.instance.overdispersion, self.generator)
