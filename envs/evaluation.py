"""Policy evaluation on fixed exogenous paths: per-episode discounted cost sum_{t<T} gamma^t C_t
(eq. policy_objective truncated at T), mean with standard error, and paired comparisons.

Every method (classical, learned, MILP) is judged by `evaluate` on the same `ExogenousPaths`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from tqdm.auto import tqdm

from envs.dynamics import State, initial_state, step
from envs.exogenous import ExogenousPaths
from envs.instance import TensorInstance

Policy = Callable[[State, TensorInstance], "tuple[torch.Tensor, torch.Tensor]"]
"""A policy maps (state, instance) to (Y [B] in {0,1}, Q [B, n] in [0, qbar]); it sees only s_t."""

EVAL_HORIZON = 50


@dataclass
class Trace:
    """Per-step records of an evaluation (NumPy). inventory is I before demand at step t; quantity
    is the proposed Q_t, executed only where open == 1 (a learned policy proposes 0 where it does not open:
    trainers.policy)."""

    factor: np.ndarray  # [E, T], or [E, T, k] with k factors
    open: np.ndarray  # [E, T]
    cost: np.ndarray  # [E, T]
    inventory: np.ndarray  # [E, T, n]
    demand: np.ndarray  # [E, T, n]
    quantity: np.ndarray  # [E, T, n]


@dataclass
class Evaluation:
    discounted_cost: np.ndarray  # [E] float64
    episodes: tuple[int, ...]
    horizon: int
    trace: Trace | None = None

    @property
    def mean(self) -> float:
        return float(self.discounted_cost.mean())

    @property
    def se(self) -> float:
        return standard_error(self.discounted_cost)


SE_MIN_VALUES = 2
"""Fewest values a standard error is estimated from (the sample standard deviation needs two): with fewer the
evaluation format holds 0, and the backtest and report.py say that none exists."""


def standard_error(values: np.ndarray) -> float:
    """Standard error of the mean (sample std with ddof=1, over sqrt(E)); 0 below SE_MIN_VALUES values."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.std(ddof=1) / math.sqrt(values.size)) if values.size >= SE_MIN_VALUES else 0.0


def rollout_costs(
    policy: Policy,
    instance: TensorInstance,
    factor: torch.Tensor,
    demand: torch.Tensor,
    record: dict | None = None,
    progress: str | None = None,
    repeats: int = 1,
) -> torch.Tensor:
    """Roll `policy` from the initial state over factor [E, T+1] (or [E, T+1, k]) and demand [E, T, n]; return the
    discounted cost per row [B] (float64), B = repeats * E with row r on episode r % E (the paths
    are tiled per step, not copied whole). A policy with a `reset()` method is reset first.
    With `record`, append per-step tensors to its lists."""
    horizon = demand.shape[1]
    if hasattr(policy, "reset"):
        policy.reset()

    def tiled(x: torch.Tensor) -> torch.Tensor:  # rows repeated `repeats` times: [E, ...] -> [repeats * E, ...]
        return x.repeat(repeats, *(1,) * (x.dim() - 1))

    state = initial_state(instance, tiled(factor[:, 0]))
    total = torch.zeros(state.batch, dtype=torch.float64, device=demand.device)
    for t in tqdm(range(horizon), desc=progress, disable=progress is None, leave=False):
        open_order, quantity = policy(state, instance)
        next_state, cost = step(instance, state, open_order, quantity, tiled(demand[:, t]), tiled(factor[:, t + 1]))
        total += (instance.gamma**t) * cost.double()
        if record is not None:
            for key, value in (("open", open_order), ("cost", cost), ("inventory", state.inv), ("quantity", quantity)):
                record.setdefault(key, []).append(value.detach().cpu())
        state = next_state
    return total


@torch.no_grad()
def evaluate(
    policy: Policy, instance: TensorInstance, paths: ExogenousPaths, trace: bool = False, progress: str | None = None
) -> Evaluation:
    """Evaluate `policy` on every episode of `paths` in one batch."""
    record = {} if trace else None
    costs = rollout_costs(policy, instance, paths.factor, paths.demand, record, progress)
    result = Evaluation(costs.cpu().numpy(), paths.episodes, paths.horizon)
    if trace:
        stacked = {key: torch.stack(values, dim=1).double().numpy() for key, values in record.items()}
        result.trace = Trace(
            factor=paths.factor[:, :-1].double().cpu().numpy(),
            demand=paths.demand.double().cpu().numpy(),
            **stacked,
        )
    return result


@dataclass(frozen=True)
class PairedComparison:
    """Mean of (cost_a - cost_b) over the same episodes, with its standard error and 95% t-interval."""

    mean_difference: float
    se: float
    ci_low: float
    ci_high: float
    episodes: int

    @property
    def significant(self) -> bool:
        return self.ci_low > 0 or self.ci_high < 0


def paired_comparison(cost_a: np.ndarray, cost_b: np.ndarray, level: float = 0.95) -> PairedComparison:
    cost_a, cost_b = np.asarray(cost_a, np.float64), np.asarray(cost_b, np.float64)
    if cost_a.shape != cost_b.shape or cost_a.ndim != 1:
        raise ValueError(f"paired comparison needs two per-episode cost vectors of equal length, got {cost_a.shape} and {cost_b.shape}")
    diff = cost_a - cost_b
    se = standard_error(diff)
    half = float(stats.t.ppf(0.5 + level / 2, df=max(diff.size - 1, 1))) * se
    mean = float(diff.mean())
    return PairedComparison(mean, se, mean - half, mean + half, int(diff.size))
