"""The decomposition bound with shares that depend on the period and the factor: a schedule k_i(t, f) >= 0 with
sum_i k_i(t, f) <= K at every decision step t and factor grid point f, each item solved by the n = 1 DP
(policies/dp_optimal.py) with the setup cost k_i(t, F_t).

It is a relaxation whatever the schedule: at every period and factor, K 1{some item orders} >= sum_i k_i(t, F_t) 1{item i
orders}, and the relaxed problem separates by item, so sum_i V_i(k_i) lies below the joint optimum on the same chain. The
constant split of policies/decomposition.py is one schedule; a schedule can only be better. V_i is concave in the schedule
(a minimum over policies of expected costs that are linear in it), with supergradient the item's discounted probability
of ordering at (t, f) under its optimal policy (`order_frequencies`). The search (`search_schedule`) starts from the best
constant split and moves each (t, f)'s shares towards the items that order there most often, by mirror ascent on each
simplex {k >= 0, sum_i k_i = K}; every schedule it visits is a valid bound and it keeps the highest. The frequencies only
steer the search: an inexact one costs tightness, never validity. The argument and the figures: docs/methods.md,
"Shares that depend on the period and the factor".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy.signal import fftconvolve
from tqdm import tqdm

from envs.instance import Instance
from policies import dp_optimal
from policies.decomposition import DecompositionOptions, item_instance, names_the_item
from policies.joint_dp import decision_steps

NAME = "schedule-bound"
STEP = 0.5
"""The mirror ascent's first step: each (t, f)'s shares move by up to exp(STEP) per round towards the items that order most."""
SHORTEST_STEP = 5
"""A round that loses halves the step; the search stops when it has been halved this many times."""
FLOOR = 1e-3
"""Every item keeps at least this fraction of K / n at every (t, f), so that a multiplicative step can move its share up."""


@dataclass
class ItemResult:
    """One item under its schedule: its DP value and its discounted order probabilities g[t, f] (the supergradient)."""

    value: float
    frequencies: np.ndarray  # [T_dec, M]


@names_the_item
def item_problem(instance: Instance, item: int, horizon: int, options: DecompositionOptions):
    """The item's DP problem (policies.dp_optimal._prepare) with the bound's settings, whatever its setup costs."""
    return dp_optimal._prepare(item_instance(instance, item, 0.0), horizon, **options.dp_settings())


@names_the_item
def item_result(
    instance: Instance, item: int, schedule: np.ndarray, horizon: int, options: DecompositionOptions, problem=None
) -> ItemResult:
    """V_item under the setup-cost schedule [T_dec, M] on the fine factor grid, and its discounted order frequencies;
    `problem` is its `item_problem` where the caller keeps it."""
    one = item_instance(instance, item, 0.0)
    problem = item_problem(instance, item, horizon, options) if problem is None else problem
    steps = max(horizon - int(one.lead[0]), 0)
    own = schedule[None, :steps]  # [1, T_i, M]: the steps after T_i can no longer count for this item
    _, initial_value, action_value, sunk, k0 = dp_optimal._solve(problem, own, None)
    value = float((sunk + initial_value[0, :, k0]) @ problem.grid.initial)
    frequencies = np.zeros_like(schedule)
    frequencies[:steps] = order_frequencies(problem, action_value[:, 0], own[0], k0, one.gamma)
    return ItemResult(value, frequencies)


def order_frequencies(problem, action_value: np.ndarray, schedule: np.ndarray, start: int, gamma: float) -> np.ndarray:
    """gamma^t P(the item orders at t with F_t = f_m) under the DP's policy from its initial state: [T, M], by carrying the
    law of (F_t, position) forward (action_value W_t [T, M, N]; targets on the window's lattice points; mass that demand
    carries below the domain's bottom held there)."""
    lattice, grid, pmf = problem.lattice, problem.grid, problem.pmf
    T, M, N = action_value.shape
    c, window = lattice.classes, lattice.window
    law = np.zeros((M, N))
    law[:, start] = grid.initial
    result = np.zeros((T, M))
    rows = np.arange(M)[:, None]
    for t in range(T):
        w = action_value[t]
        padded = np.concatenate([w, np.full((M, window), np.inf)], axis=1)
        windows = sliding_window_view(padded, window + 1, axis=1)  # [M, N, window + 1]
        offset = windows.argmin(axis=2)
        best = np.take_along_axis(windows, offset[..., None], axis=2)[..., 0]
        opens = schedule[t][:, None] + best < w
        result[t] = gamma**t * (law * opens).sum(1)
        target = np.where(opens, np.arange(N)[None, :] + offset, np.arange(N)[None, :])
        moved = np.bincount((rows * N + target).ravel(), weights=law.ravel(), minlength=M * N).reshape(M, N)
        units = moved.reshape(M, N // c, c)  # position index = unit * c + class; a demand of d steps moves the unit down d
        U, D = units.shape[1], pmf.shape[1]
        # after[u] = sum_d pmf[d] units[u + d]: a correlation, by FFT (its round-off only steers the search)
        after = fftconvolve(units, pmf[:, ::-1, None], axes=1)[:, D - 1 : D - 1 + U]
        below = np.concatenate([np.zeros((M, 1, c)), np.cumsum(units, axis=1)], axis=1)  # [M, U + 1, c]: the first u units' mass
        after[:, 0] += np.einsum("md,mdc->mc", pmf, below[:, np.minimum(np.arange(D), U)])  # demand below the bottom stays there
        law = grid.transition.T @ np.clip(after, 0.0, None).reshape(M, N)
    return result


@dataclass
class ScheduleSearch:
    """The best schedule found: its value (the bound, on the fine factor grid), the constant split's value it started from,
    the schedule [n, T_dec, M], each round's value and the seconds taken."""

    value: float
    start_value: float
    schedule: np.ndarray
    values: list[float]
    seconds: float

    def summary(self) -> dict:
        return {
            "value": self.value,
            "constant_split_value": self.start_value,
            "gain": self.value / self.start_value - 1.0,
            "rounds": len(self.values),
            "seconds": self.seconds,
        }


def search_schedule(
    instance: Instance,
    horizon: int,
    shares: np.ndarray,
    options: DecompositionOptions,
    tolerance: float = 1e-5,
    results_of: Callable[[np.ndarray], list[ItemResult]] | None = None,
    progress: bool = False,
) -> ScheduleSearch:
    """Mirror ascent over schedules from the constant split `shares` [n] (module docstring), on options.factor_points grid
    points, for at most options.schedule_rounds rounds (at least the constant split's), until three gaining rounds gain less
    than `tolerance` of the value each, or until losing rounds have halved the step SHORTEST_STEP times.
    results_of(schedule [n, T_dec, M]) gives each item's ItemResult (default: in this process, item by item; the solver
    pool passes its own)."""
    start = time.perf_counter()
    n, K, rounds = instance.n, instance.K, max(options.schedule_rounds, 1)
    steps, M = decision_steps(instance, horizon), options.factor_points
    if results_of is None:
        problems = [item_problem(instance, i, horizon, options) for i in range(n)]

        def results_of(schedule):
            return [item_result(instance, i, schedule[i], horizon, options, problems[i]) for i in range(n)]

    floor = FLOOR * K / n
    schedule = np.broadcast_to(np.asarray(shares, np.float64)[:, None, None], (n, steps, M)).copy()
    results = results_of(schedule)
    values = [sum(r.value for r in results)]
    best_value, best_schedule, best_results, step, stalls = values[0], schedule, results, STEP, 0
    bar = tqdm(total=rounds, desc=f"{NAME}: rounds", disable=not progress, leave=False)
    for _ in range(rounds - 1):
        g = np.stack([r.frequencies for r in best_results])  # [n, T_dec, M]
        mean = (best_schedule * g).sum(0) / K  # the shares' weighted frequency at each (t, f)
        relative = (g - mean) / np.where(mean > 0, mean, 1.0)
        # at most e^step per round in every cell: where the items almost never come, mean is near 0 and `relative` huge
        relative /= np.maximum(np.abs(relative).max(axis=0), 1.0)
        base = np.maximum(best_schedule, floor)
        trial = base * np.exp(step * relative)
        trial *= K / trial.sum(0, keepdims=True)
        results = results_of(trial)
        value = sum(r.value for r in results)
        values.append(value)
        bar.update()
        if value > best_value:
            stalls = stalls + 1 if value - best_value < tolerance * abs(best_value) else 0
            best_value, best_schedule, best_results = value, trial, results
        else:
            step /= 2
        if stalls >= 3 or step < STEP / 2**SHORTEST_STEP:
            break
    bar.close()
    return ScheduleSearch(best_value, values[0], best_schedule, values, time.perf_counter() - start)
