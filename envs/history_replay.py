"""A backtest: every policy decides on the actual demand of a user's history (platform/backtest.py; docs/fitting.md).

The history's periods are cut into consecutive windows of W periods; each window is one episode of the simulator's
dynamics (envs.dynamics.step: orders, lead times, the costs h, b, K and the discount gamma of the instance), started
from the simulator's initial state (envs.dynamics.initial_state: I_0 = mu_i, nothing in transit) with the factor
estimated at the window's start, and judged by its discounted cost sum_{t<W} gamma^t C_t, as envs.evaluation judges
an episode. The last T mod W periods, too few for a window, are not replayed. An order placed at t is on hand at t + L_i,
so a window of W <= min_i L_i periods ends before any order arrives: every decision could only add setup costs, so
such a window is refused (`check_window`); so is a history shorter than one window (`window_count`). With one window
there is no spread to estimate a standard error from: it is None (null in backtest.json), never 0 (`window_se`).

The policy never sees the future: the factor in its state at period t is given by the caller, the causal estimate
E[F_t | D_0..D_{t-1}] of demand.factor_filter.causal_factor under the demand model that the instance states
(platform/backtest.py), never the smoothed path of demand.factor_smoother.smooth_factor, which conditions on the whole history.
"""

from __future__ import annotations

import numpy as np
import torch

from envs.evaluation import SE_MIN_VALUES, Evaluation, Policy, evaluate, paired_comparison
from envs.exogenous import ExogenousPaths
from envs.instance import TensorInstance
from plumbing.errors import InputError


def window_count(periods: int, window: int, what: str = "the history") -> int:
    """How many whole windows of `window` periods `periods` periods hold; an InputError when not one (a backtest replays
    whole windows, so a history of at least one window is all it needs)."""
    if window > periods:
        raise InputError(
            f"--window: {window} periods is longer than {what} ({periods} periods): a backtest replays whole windows; give "
            f"--window {periods} or less"
        )
    return periods // window


def check_window(
    window: int,
    lead: np.ndarray,
    instance_path: str,
    flag: str = "--window",
    span: str = "a window",
    so: str = "no decision could lower a window's cost",
) -> None:
    """Refuse a window that ends before any order can arrive (module docstring): every policy's cost there is the zero
    policy's plus the setups it opens, whatever it decides. `flag`, `span` and `so` word it for another such span (the
    MILP's planning horizon: its plans then never order)."""
    shortest = int(np.min(lead)) + 1  # an order placed at period 0 is on hand at period min_i L_i
    if window < shortest:
        leads = f"{shortest - 1}" if np.ptp(lead) == 0 else f"{shortest - 1} to {int(np.max(lead))}"
        raise InputError(
            f"{flag} {window}: no order arrives within {span} of {window} period{'s' if window > 1 else ''} (an order placed at "
            f"period t is on hand at t + L_i, and the instance '{instance_path}' has lead times L_i of {leads}), so {so}; "
            f"give {flag} {shortest} or more"
        )


def window_se(se: float, windows: int) -> float | None:
    """A standard error over `windows` windows, None with fewer than envs.evaluation.SE_MIN_VALUES (the evaluation gives
    0 there, which would read as a mean known exactly)."""
    return se if windows >= SE_MIN_VALUES else None


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
    its standard error and 95% t-interval (envs.evaluation.paired_comparison; None, all three, with one window)."""
    labels = list(costs)
    rows = []
    for k, a in enumerate(labels):
        for b in labels[k + 1 :]:
            cmp = paired_comparison(costs[a], costs[b])
            se = window_se(cmp.se, cmp.episodes)
            low, high = (cmp.ci_low, cmp.ci_high) if se is not None else (None, None)
            rows.append(
                {"a": a, "b": b, "mean_difference": cmp.mean_difference, "se": se, "ci_low": low, "ci_high": high, "windows": cmp.episodes}
            )  # fmt: skip
    return rows


class RecordedOrders:
    """The orders a history records (its `ordered` column), replayed as they were placed: in window e's period t the
    quantities orders[e, t] [n], an order opening (and paying K) where any is positive. Quantities are not capped at
    qbar (they are what was ordered). `reset` restarts the clock (the evaluator calls it per rollout)."""

    def __init__(self, orders: torch.Tensor):
        self.orders = orders  # [E, W, n]
        self.clock = 0

    def reset(self) -> None:
        self.clock = 0

    def __call__(self, state, instance: TensorInstance) -> tuple[torch.Tensor, torch.Tensor]:
        if state.batch != self.orders.shape[0]:
            raise ValueError(f"recorded orders: {self.orders.shape[0]} windows, asked for {state.batch} rows")
        quantity = self.orders[:, self.clock].to(state.inv.dtype)
        self.clock += 1
        return (quantity > 0).any(-1).to(quantity.dtype), quantity


def recorded_orders(ordered: np.ndarray, window: int, device="cpu") -> RecordedOrders:
    """The history's orders [T, n] cut into its whole windows, as `window_paths` cuts its demand: [E, W, n]."""
    windows = window_count(ordered.shape[0], window)
    steps = window * np.arange(windows)[:, None] + np.arange(window)
    return RecordedOrders(torch.as_tensor(ordered[steps], device=device))
