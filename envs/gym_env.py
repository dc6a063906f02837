"""Gymnasium interfaces over the same batched step: `JRPEnv` (one episode) and `JRPVectorEnv`
(one object stepping B episodes at once, for RLlib's vectorised sampling).

Observation: the flat 11n + 4 features (item tokens item-major, then the global token).
Action: Tuple(Discrete(2), Box(0, 1, (n,))): (Y, u) with proposed quantity Q = u * qbar.
Reward: -C_t (times `reward_scale`, 1 by default; learners may pass 1 / c_ref, eq. cost_normalization).
Episodes are truncated after `horizon` steps and start from the initial state of
`envs.dynamics.initial_state` with F_0 ~ N(0, 1). Demand is `envs.demand_law.draw_demand`'s (Poisson, or negative
binomial with overdispersion) at `item_rates` (loadings of either sign); one factor only, as the networks' features
hold one (`envs.features.check_one_factor`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from envs.demand_law import draw_demand, item_rates
from envs.dynamics import State, initial_state, step
from envs.exogenous import factor_step
from envs.features import GLOBAL_FEATURES, ITEM_FEATURES, check_one_factor, flat_features
from envs.instance import Instance
from plumbing import validate


def jrp_spaces(n: int) -> tuple[spaces.Box, spaces.Tuple]:
    observation = spaces.Box(-np.inf, np.inf, (ITEM_FEATURES * n + GLOBAL_FEATURES,), np.float32)
    action = spaces.Tuple((spaces.Discrete(2), spaces.Box(0.0, 1.0, (n,), np.float32)))
    return observation, action


class _BatchedJRP:
    """B episodes advanced together; NumPy in, NumPy out, torch (CPU) inside."""

    def __init__(self, instance: Instance, batch: int, horizon: int, reward_scale: float = 1.0):
        validate.integer(horizon, "horizon", 1)
        check_one_factor(instance, "the gym environment (its observation is the network's features)")
        self.instance = instance
        self.reward_scale = reward_scale
        self.tinst = instance.to_torch("cpu")
        self.batch = batch
        self.horizon = horizon
        self.rng = np.random.default_rng()
        self.state: State | None = None
        self.t = 0

    def observe(self) -> np.ndarray:
        return flat_features(self.tinst, self.state).numpy().astype(np.float32)

    def reset(self, rng: np.random.Generator) -> np.ndarray:
        self.rng = rng
        self.t = 0
        self.state = initial_state(self.tinst, torch.as_tensor(rng.standard_normal(self.batch), dtype=self.tinst.dtype))
        return self.observe()

    def step(self, open_order: np.ndarray, fraction: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
        inst, state = self.instance, self.state
        factor = state.factor.double().numpy()
        demand = draw_demand(item_rates(inst, factor), inst.overdispersion, self.rng)  # [B, n]
        factor_next = factor_step(inst.rho, factor, self.rng.standard_normal(self.batch))
        as_t = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float64), dtype=self.tinst.dtype)  # noqa: E731
        quantity = as_t(np.clip(fraction, 0.0, 1.0)) * self.tinst.qbar
        self.state, cost = step(self.tinst, state, as_t(open_order), quantity, as_t(demand), as_t(factor_next))
        self.t += 1
        return self.observe(), -self.reward_scale * cost.double().numpy(), self.t >= self.horizon


class JRPEnv(gym.Env):
    """A single JRP episode as a gymnasium.Env."""

    metadata = {"render_modes": []}

    def __init__(self, instance: Instance, horizon: int = 50):
        self.sim = _BatchedJRP(instance, 1, horizon)
        self.observation_space, self.action_space = jrp_spaces(instance.n)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return self.sim.reset(self.np_random)[0], {}

    def step(self, action):
        open_order, fraction = action
        obs, reward, truncated = self.sim.step(np.asarray([open_order]), np.asarray(fraction)[None])
        return obs[0], float(reward[0]), False, truncated, {}


class JRPVectorEnv(gym.vector.VectorEnv):
    """B synchronised JRP episodes stepped by one batched call (autoreset on the next step)."""

    metadata = {"render_modes": [], "autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, instance: Instance, num_envs: int, horizon: int = 50, reward_scale: float = 1.0):
        self.sim = _BatchedJRP(instance, num_envs, horizon, reward_scale)
        self.num_envs = num_envs
        self.single_observation_space, self.single_action_space = jrp_spaces(instance.n)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._needs_reset = False

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._np_random, self._np_random_seed = gym.utils.seeding.np_random(seed)
        self._needs_reset = False
        return self.sim.reset(self.np_random), {}

    def step(self, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        done = np.zeros(self.num_envs, dtype=bool)
        if self._needs_reset:  # every episode ended on the previous step (they run in lock-step)
            obs, info = self.reset()
            return obs, np.zeros(self.num_envs), done, done.copy(), info
        open_order, fraction = actions
        obs, reward, truncated = self.sim.step(np.asarray(open_order), np.asarray(fraction))
        self._needs_reset = truncated
        return obs, reward, done, np.full(self.num_envs, truncated), {}
