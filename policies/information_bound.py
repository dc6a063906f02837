"""The information-relaxation bound (Brown, Smith and Sun 2010; for weakly coupled DPs, Ye, Zhu and Zhou 2014) with the
decomposition's penalty: on each of many paths sampled from the factor chain and the demand laws of the item DPs, the
deterministic joint problem with every future demand known, less a penalty that charges the knowledge.

The penalty is built from the decomposition's item values V_i (policies/dp_optimal.py at the best split's shares k_i):
at decision t with post-order position y_i, pi_i,t = gamma (V_i,t+1(y_i - d_i,t, f_t+1) - E[V_i,t+1(y_i - D, F') | f_t]), the
expectation taken on the same chain and laws the paths are drawn from, so it has mean zero under every non-anticipative
policy and E[min over actions of (cost - penalty)] is a lower bound on the optimum on the chain, whatever V_i's quality.
With the expected charge gamma^L_i G_i(y, f_t) for the realised one (another zero-mean term), item i's reward at t is
W_i,t(y, f_t) - gamma V_i,t+1(y - d_i,t, f_t+1). Below each item's DP domain V_i is the DP's own linear extrapolation and
W_i,t its exact charge plus the expectation's linear extension (exact there), so every reachable position has its terms.

The inner problem on a path is a deterministic JRP. Its optimum is bounded below, path by path, by splitting K into shares
kappa_i,t >= 0 with sum_i kappa_i,t <= K that may depend on the whole path (the inner problem is deterministic): each item
is then a deterministic lot-sizing DP. With kappa = k every item's inner value is its DP value (the penalty is then the
ideal one of its relaxed problem), so the bound starts at the decomposition bound; a projected supergradient ascent per
path moves the shares to the items that order alone, and each path keeps its best value. The figure is a Monte Carlo mean:
its standard error and a one-sided 95% lower figure are reported. The argument and the figures: docs/methods.md,
"The information-relaxation bound".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from envs.instance import Instance
from plumbing.errors import InputError
from policies import dp_optimal
from policies.decomposition import DecompositionOptions, item_instance, names_the_item
from policies.joint_dp import decision_steps

NAME = "information-bound"
ONE_SIDED_95 = 1.6448536269514722


@dataclass
class ItemTables:
    """One item's DP at its share on the inner domain (its DP domain extended downwards): W [T_i, M, N], V [T_i + 1, M, N]
    (V_T_i = 0), the post-demand shift of one demand step in positions (`classes`), its window, the expected cost of its
    steps before its lead time, sunk [M], and `start` the index of x_0. Factor indices are the item's own: a negative
    loading reads the path's factor axis reversed."""

    W: np.ndarray
    V: np.ndarray
    classes: int
    window: int
    sunk: np.ndarray
    start: int


@names_the_item
def item_paths(
    instance: Instance, item: int, share: float, horizon: int, options: DecompositionOptions, factor: np.ndarray, rng: np.random.Generator
) -> tuple[ItemTables, np.ndarray]:
    """The item's demands on the paths of its factor indices `factor` [P, T + 1] (in lattice steps, [P, T]), and its DP (the
    bound's settings: caps raised, one period's demand below x_0) at `share`, on its domain extended below by the largest
    demand a path adds up (module docstring)."""
    one = item_instance(instance, item, 0.0)
    problem = dp_optimal._prepare(one, horizon, **options.dp_settings())
    demand = sample_demand(problem.pmf, factor[:, :-1], rng)
    extra_units = int(demand.sum(1).max()) + 1
    lattice = problem.lattice
    if lattice.rest:
        raise InputError(f"{NAME}: {instance.item_name(item)} is on a coarse lattice whose window stops short of its cap")
    positions, _, action_value, sunk, k0 = dp_optimal._solve(problem, np.array([share]), None)
    W = action_value[:, 0]  # [T_i, M, N]
    T, M, N = W.shape
    c, step = lattice.classes, lattice.step
    V = np.zeros((T + 1, M, N))
    V[:T] = np.minimum(W, share + dp_optimal.window_min(W, lattice.window))
    lead = int(one.lead[0])
    below = lattice.positions(problem.low_unit - extra_units, problem.low_unit - 1)  # [extra c] positions under the domain
    reach = (below - positions[0]) / step  # in lattice steps from the domain's first position (<= -1)
    charge_below = one.gamma**lead * dp_optimal.expected_loss(problem.sums[lead], below, float(one.h[0]), float(one.b[0]), step)
    charge = one.gamma**lead * dp_optimal.expected_loss(problem.sums[lead], positions[: c + 1], float(one.h[0]), float(one.b[0]), step)
    expectation = (W[..., : c + 1] - charge) / one.gamma  # E[V_t+1(y - D, F') | f] at the first positions: [T, M, c + 1]
    expectation_below = expectation[..., :1] + (expectation[..., c : c + 1] - expectation[..., :1]) * reach
    W = np.concatenate([charge_below + one.gamma * expectation_below, W], axis=-1)
    V = np.concatenate([V[..., :1] + (V[..., c : c + 1] - V[..., :1]) * reach, V], axis=-1)  # the DP's extrapolation below
    return ItemTables(W, V, c, lattice.window, sunk, k0 + below.size), demand


def sample_chain(grid: dp_optimal.FactorGrid, paths: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """Factor grid indices [P, steps + 1] of paths of the Tauchen chain from its initial law."""
    index = np.empty((paths, steps + 1), dtype=np.int64)
    index[:, 0] = rng.choice(grid.points.size, size=paths, p=grid.initial)
    cdf = np.cumsum(grid.transition, axis=1)
    for t in range(steps):
        index[:, t + 1] = np.minimum((rng.random(paths)[:, None] > cdf[index[:, t]]).sum(1), grid.points.size - 1)
    return index


def sample_demand(pmf: np.ndarray, factor: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Demand in lattice steps [P, T] drawn from the item's laws pmf [M, J+1] at the factor indices [P, T]."""
    cdf = np.cumsum(pmf, axis=1)
    return np.minimum((rng.random(factor.shape)[..., None] > cdf[factor]).sum(-1), pmf.shape[1] - 1)


def inner_item(tables: ItemTables, factor: np.ndarray, demand: np.ndarray, kappa: np.ndarray, gamma: float):
    """Item i's deterministic problem on each path with setup costs kappa [P, T_i]: min over its orders of sum_t gamma^t
    (kappa_t 1{order at t} + W_t(y_t, f_t) - gamma V_t+1(y_t - d_t, f_t+1)), from x_0, by a DP over positions. Returns the
    values [P] and the discounted order indicators gamma^t 1{order at t} of an optimal plan [P, T_i] (a supergradient)."""
    W, V, c, window = tables.W, tables.V, tables.classes, tables.window
    T, P, N = W.shape[0], factor.shape[0], W.shape[-1]
    rows = np.arange(P)[:, None]
    index = np.arange(N)[None, :]
    later = np.zeros((P, N))  # J_t+1
    stay_values, best_values = [], []
    for t in range(T - 1, -1, -1):
        after = np.maximum(index - demand[:, t, None] * c, 0)  # y - d_t (unreachable states clamped at the bottom)
        u = W[t, factor[:, t]] + gamma * (later[rows, after] - V[t + 1, factor[:, t + 1]][rows, after])
        best = dp_optimal.window_min(u, window)
        later = np.minimum(u, kappa[:, t, None] + best)
        stay_values.append(u)
        best_values.append(best)
    value = later[:, tables.start]
    orders = np.zeros((P, T))
    x = np.full(P, tables.start)
    for t in range(T):
        u = stay_values[T - 1 - t]
        opens = kappa[:, t] + best_values[T - 1 - t][np.arange(P), x] < u[np.arange(P), x]
        window_values = u[rows, np.minimum(x[:, None] + np.arange(window + 1)[None, :], N - 1)]
        y = np.where(opens, x + window_values.argmin(1), x)
        orders[:, t] = gamma**t * opens
        x = np.maximum(y - demand[:, t] * c, 0)
    return value, orders


@dataclass
class InformationBound:
    """The bound's Monte Carlo figures: `value` (the decomposition bound `start`, the ascent's first iterate, whose expectation
    the item DPs give exactly, plus the mean over paths of what the ascent gained), its `se`, `lower` (value - 1.645 se, a
    one-sided 95% lower figure); `plain` and `plain_se`, the paths' mean without that control variate (the same expectation
    when the penalty has mean zero: a check of it); paths, rounds, seconds."""

    value: float
    se: float
    start: float
    plain: float
    plain_se: float
    paths: int
    rounds: int
    seconds: float

    @property
    def lower(self) -> float:
        return self.value - ONE_SIDED_95 * self.se

    def summary(self) -> dict:
        return {
            "value": self.value,
            "se": self.se,
            "lower_95": self.lower,
            "start": self.start,
            "plain": self.plain,
            "plain_se": self.plain_se,
            "paths": self.paths,
            "rounds": self.rounds,
            "seconds": self.seconds,
        }


def information_bound(
    instance: Instance,
    horizon: int,
    shares: np.ndarray,
    options: DecompositionOptions,
    paths: int = 200,
    rounds: int = 30,
    seed: int = 0,
    progress: bool = False,
) -> InformationBound:
    """The information-relaxation bound (module docstring) on `paths` paths of the chain on options.factor_points points, from
    the decomposition's `shares` [n], with `rounds` rounds of the per-path share ascent."""
    start_time = time.perf_counter()
    if instance.n > 1 and instance.factors > 1:
        raise InputError(f"{NAME}: the paths share one factor; this instance has {instance.factors}")
    n, K, gamma = instance.n, instance.K, instance.gamma
    rng = np.random.default_rng([0x1B0D, seed])
    grid = dp_optimal.tauchen_grid(instance.rho, options.factor_points, options.factor_width)
    steps = decision_steps(instance, horizon)
    factor = sample_chain(grid, paths, max(steps, 1), rng)
    M = grid.points.size
    items, demands, item_factors = [], [], []
    for i in range(n):
        flip = instance.directions is not None and instance.directions[i, 0] < 0
        own = M - 1 - factor if flip else factor
        tables, demand = item_paths(instance, i, float(shares[i]), horizon, options, own, rng)
        items.append(tables)
        demands.append(demand)
        item_factors.append(own)
    kappa = np.broadcast_to(np.asarray(shares, np.float64)[:, None, None], (n, paths, max(steps, 1))).copy()
    base = sum(t.sunk[f[:, 0]] for t, f in zip(items, item_factors))  # [P]
    best = np.full(paths, -np.inf)
    first = None
    bar = tqdm(range(rounds), desc=f"{NAME}: rounds", disable=not progress, leave=False)
    for r in bar:
        total = base.copy()
        supergradient = np.zeros_like(kappa)
        for i, (tables, demand, own) in enumerate(zip(items, demands, item_factors)):
            T = tables.W.shape[0]
            value, orders = inner_item(tables, own[:, : T + 1], demand[:, :T], kappa[i, :, :T], gamma)
            total += value
            supergradient[i, :, :T] = orders
        best = np.maximum(best, total)
        first = total.copy() if first is None else first
        step = K / math.sqrt(r + 1)
        kappa = project_simplex(kappa + step * supergradient, K)
    # the first iterate's value on a path is sum_i (sunk_i + V_i,0(x_0, f_0)), whose expectation the DPs know exactly: the
    # decomposition bound. As a control variate it leaves the mean of the ascent's gain, which varies far less than f_0 does.
    exact_first = sum(float(grid.initial @ (t.sunk + t.V[0][:, t.start])) for t in items)
    gain = best - first
    se = float(gain.std(ddof=1) / math.sqrt(paths)) if paths > 1 else math.inf
    plain, plain_se = float(best.mean()), float(best.std(ddof=1) / math.sqrt(paths)) if paths > 1 else math.inf
    return InformationBound(
        exact_first + float(gain.mean()), se, exact_first, plain, plain_se, paths, rounds, time.perf_counter() - start_time
    )


def project_simplex(kappa: np.ndarray, K: float) -> np.ndarray:
    """The Euclidean projection of each column kappa[:, p, t] onto {k >= 0, sum_i k_i <= K}."""
    clipped = np.maximum(kappa, 0.0)
    over = clipped.sum(0) > K
    if not over.any():
        return clipped
    v = np.moveaxis(kappa, 0, -1)[over]  # [m, n] columns to project onto sum = K
    u = -np.sort(-v, axis=1)
    cumulative = np.cumsum(u, axis=1) - K
    ranks = np.arange(1, v.shape[1] + 1)
    rho = (u - cumulative / ranks > 0).sum(1)
    theta = cumulative[np.arange(v.shape[0]), rho - 1] / rho
    projected = np.moveaxis(clipped, 0, -1).copy()
    projected[over] = np.maximum(v - theta[:, None], 0.0)
    return np.moveaxis(projected, -1, 0)
