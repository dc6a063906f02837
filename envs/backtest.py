"""A backtest: every policy decides on the actual demand of a user's history (platform/backtest.py; docs/fitting.md).

The history's periods are cut into consecutive windows of W periods; each window is one episode of the simulator's
dynamics (envs.dynamics.step: orders, lead times, the costs h, b, K and the discount gamma of the instance), started
from the simulator's initial state (envs.dynamics.initial_state: I_0 = mu_i, nothing in transit) with the factor
estimated at the window's start, and judged by its discounted cost sum_{t<W} gamma^t C_t, as envs.evaluation judges
an episode. The last T mod W periods, too few for a window, are not replayed.

The policy never sees the future: the factor in its state at period t is given by the caller, the causal estimate
E[F_t | D_0..D_{t-1}] of policies.factor_filter.causal_factor under the demand model that the instance states
(platform/backtest.py), never the smoothed path of envs.fit.smooth_factor, which conditions on the whole history.
"""

from __future__ import annotations

import numpy as np
import torch

from envs.errors import InputError
from envs.evaluation import Evaluation, Policy, evaluate, paired_comparison
from envs.exogenous import ExogenousPaths
from envs.instance import TensorInstance


def window_count(periods: int, window: int, what: str = "the history") -> int:
    """How many whole windows of `window` periods `periods` periods hold; an InputError when not one."""
    if window > periods:
        raise InputError(f"--window: {window} periods is longer than {what} ({periods} periods); give --window {periods} or less")
    return periods // window


def window_paths(demand: np.ndarray, factor: np.ndarray, window: int, device="cpu") -> ExogenousPaths:
    """The history's whole windows as episodes: demand [T, n] and the policy's factor [T + 1], or [T + 1, k] with k
    factors (factor[t] is what the state shows at period t), cut into factor [E, W + 1] or [E, W + 1, k] (the window's
    W periods and the one after) and demand [E, W, n]."""
    windows = window_count(demand.shape[0], window)
    starts = window * np.arange(windows)
    steps = starts[:, None] + np.arange(window + 1)  # [E, W + 1]
    return ExogenousPaths(
        factor=torch.as_tensor(factor[steps], device=device).float(),
        demand=torch.as_tensor(demand[steps[:, :-1]], device=device).float(),
        seed=0,
        episodes=tuple(range(windows)),
    )


def replay(
    policy: Policy, instance: TensorInstance, demand: np.ndarray, factor: np.ndarray, window: int, trace: bool = False, progress=None
) -> Evaluation:
    """The policy's discounted cost in every whole window of the history (module docstring): the evaluator's rollout
    (envs.evaluation.evaluate) on the windows as episodes, from the simulator's initial state."""
    return evaluate(policy, instance, window_paths(demand, factor, window, instance.device), trace=trace, progress=progress)


def paired_comparisons(costs: dict[str, np.ndarray]) -> list[dict]:
    """Every pair (a, b) of the policies in the given order, a before b: the mean over windows of cost_a - cost_b,
    its standard error and 95% t-interval (envs.evaluation.paired_comparison)."""
    labels = list(costs)
    rows = []
    for k, a in enumerate(labels):
        for b in labels[k + 1 :]:
            cmp = paired_comparison(costs[a], costs[b])
            rows.append(
                {"a": a, "b": b, "mean_difference": cmp.mean_difference, "se": cmp.se, "ci_low": cmp.ci_low, "ci_high": cmp.ci_high,
                 "windows": cmp.episodes}
            )  # fmt: skip
    return rows
