"""The decomposition lower bound: the joint setup cost K split into per-item shares k_i >= 0 with
sum_i k_i <= K, each item solved exactly by the n = 1 dynamic program (policies/dp_optimal.py); and the decomposition
lookahead's per-item tables (policies/lookahead.py) made from it. Pure numerics, no Ray: the solver pool
(solver_workers/pool.py, solver_run.py) only spreads these items' tasks over its workers.

Every split is a bound: K 1{some item orders} >= sum_i k_i 1{item i orders}, and the relaxed problem separates by
item with the factor (or the item's exposure, under several factors: `item_instance`, `item_paths`) in each item's
state, so its optimum is sum_i V_i(k_i). V_i is concave in k: `split_grid`, `best_split` (the chords' greedy split, a
lower bound) and `split_upper_bound` (Lagrange duality over the extended chords) bracket the best split, and `refine`
adds shares until they meet. `combine` reports the fine grid's values at the chosen split and at equal shares, the
coarse grid's as a Richardson check of the factor grid, and for items on a coarse lattice the certified values of
policies/dp_certificate.py. Each item's relaxed policy is simulated on the held-out episodes for paired comparisons.
The argument, the figures and how far each is a bound: docs/methods.md, "Decomposition bound".
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from envs.evaluation import EVAL_HORIZON, evaluate
from envs.exogenous import TUNING_SEED, ExogenousPaths, sample_paths
from envs.instance import ITEM_COLUMNS, Instance, exposure
from plumbing import validate
from plumbing.errors import InputError
from policies import dp_certificate, dp_optimal, lookahead
from policies.classical import TUNING_EPISODES

NAME = "decomposition-bound"
RELAXED_POLICIES = "decomposition bound's relaxed policies"
"""What the bound's costs.parquet and its mean and s.e. are: the relaxed policies simulated on the held-out episodes."""
PAIRED_DIFFERENCE = (
    "Paired difference to the relaxed policies: a policy's cost minus the decomposition bound's relaxed policies' cost on the "
    "same held-out episodes, with its 95% t-interval over the episodes. It estimates the policy's expected cost minus the relaxed "
    "policies' expected cost, which is at most the policy's distance to the bound, since a relaxed policy costs at least the "
    "relaxation's optimum. The bound itself is the DP value, an expected cost (its conservative figure is the one to quote); "
    "a held-out mean minus the DP value would mix the episodes' luck with an expectation."
)
"""The one definition of the decomposition bound's paired figure, for every table, page and docs/methods.md."""


def dp_figures(value: float, conservative: float) -> str:
    """The bound's certified figures as the reports write them."""
    return f"DP value {value:,.1f}, conservatively {conservative:,.1f}"


CONSTANT_SPLIT = "constant split"
SCHEDULE = "shares by period and factor"
EXACT_OPTIMUM = "exact optimum"
"""The names under which the reports give each relaxation's figure: the best split's DP value, the schedule search's
(policies/share_schedule.py) and, at two items, the joint DP's with the caps raised (policies/joint_dp.py)."""
SCHEDULE_ROUNDS = 30
"""Rounds for which the schedule search is worth asking (--schedule-rounds): on the paper's instances (n = 16, 64) all 30
still gained. It is off by default: it tightens the bound by 0.8-0.9% there at one to three times the split's own time,
and costs tens of minutes at retail volumes, where each item's order frequencies take seconds a round."""
ONE_SIDED_95 = 1.6449
"""The standard normal's 95% quantile: a policy's expected cost lies below its mean + this x s.e. with 95% confidence."""


def tightest_bound(split_value: float, schedule: dict | None, exact: dict | None = None) -> dict:
    """A decomposition run's tightest figure on its factor grid, named: the joint optimum with the caps raised where it was
    solved (two items), else the schedule search's value (its summary) where it ran and gained, else the constant split's DP
    value."""
    found = {"value": float(split_value), "relaxation": CONSTANT_SPLIT}
    for figure, name in ((schedule, SCHEDULE), (exact, EXACT_OPTIMUM)):
        if figure is not None and figure.get("value") is not None and figure["value"] > found["value"]:
            found = {"value": float(figure["value"]), "relaxation": name}
    return found


def run_tightest_bound(summary: dict) -> dict:
    """A decomposition run's summary's `tightest_bound`; a run written without one has its best split's DP value."""
    return summary.get("tightest_bound") or tightest_bound(summary["dp_value"], None)


def tightest_text(bound: dict) -> str:
    """A `tightest_bound` as the reports write it."""
    return f"{bound['value']:,.1f} ({bound['relaxation']})"


def above_bound(mean: float, se: float, bound: float) -> tuple[float, float]:
    """A policy's distance above a lower bound, mean / bound - 1, and its one-sided 95% upper figure (mean + 1.645 s.e.):
    the policy's distance to the optimum on the same chain is at most the upper figure, with 95% confidence."""
    return mean / bound - 1.0, (mean + ONE_SIDED_95 * se) / bound - 1.0


def above_text(mean: float, se: float, bound: float) -> str:
    """`above_bound` as the reports write it."""
    distance, upper = above_bound(mean, se, bound)
    return f"{100 * distance:+.2f}% (95% at most {100 * upper:+.2f}%)"


TAUCHEN_BYTES = 50
"""Peak bytes per factor_points^2 of building the Tauchen table ([M, M+1] normal probabilities, their
temporaries and differences), measured: `python -c "import tracemalloc; from policies.dp_optimal import tauchen_grid;
tracemalloc.start(); tauchen_grid(0.5, 3000, 4.0); print(tracemalloc.get_traced_memory()[1] / 3000**2)"` printed 50.01."""


@dataclass(frozen=True)
class DecompositionOptions:
    """Settings that change the bound's figures (all in the run identity)."""

    factor_points: int = 41
    """Tauchen points of the reported values and of the simulated policies."""
    coarse_points: int = 21
    """Tauchen points of the split search and of the convergence check (fewer than factor_points)."""
    factor_width: float = dp_optimal.DEFAULT_FACTOR_WIDTH
    """The grids span +-factor_width stationary standard deviations."""
    multiples: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
    """The first round's shares, as multiples of each item's guess (`guess_shares`)."""
    rounds: int = 8
    """Grid rounds at most (the first included); the paper instances certify within 6 (docs/methods.md)."""
    tolerance: float = 1e-4
    """Stop when the best split's value is certified within this fraction of the found split's value."""
    max_positions: int = dp_optimal.MAX_POSITIONS
    """An item whose exact lattice would have more positions goes on a coarse lattice (policies.dp_optimal.lattice_step)."""
    schedule_rounds: int = 0
    """Rounds of the search over shares that depend on the period and the factor (policies/share_schedule.py), from the best
    constant split; 0 (the default) reports the constant split only. SCHEDULE_ROUNDS is the search's own length."""

    def __post_init__(self):
        self.check_grid(self.factor_points, self.coarse_points, self.tolerance)
        for name, ok, allowed in (
            ("factor_width", self.factor_width > 0, "a number > 0"),
            ("rounds", self.rounds >= 1, "an integer >= 1"),
            ("max_positions", isinstance(self.max_positions, int) and self.max_positions >= 1, "an integer >= 1"),
            ("schedule_rounds", isinstance(self.schedule_rounds, int) and self.schedule_rounds >= 0, "an integer >= 0"),
            ("multiples", len(self.multiples) >= 3 and min(self.multiples) > 0, "at least 3 numbers > 0"),
        ):
            if not ok:
                raise InputError(f"{NAME} {name}: expected {allowed}, got {getattr(self, name)!r}")

    @staticmethod
    def check_grid(
        factor_points, coarse_points, tolerance, where: Callable[[str], str] = lambda field: f"{NAME} {field}", error=InputError
    ) -> dict:
        """The rules of the user's grid settings (bound.py's flags, a sweep file's baselines.decomposition), in one place:
        factor_points in [3, what half of physical memory holds of its Tauchen table], coarse_points in [2, factor_points - 1],
        tolerance > 0. Returns them as int, int, float; raises `error`, naming each field as `where(field)` writes it."""
        memory = dp_optimal.physical_memory()
        why = (
            f"building the factor grid's transition table takes {TAUCHEN_BYTES} x factor_points^2 bytes, at most half of this "
            f"machine's {memory / 2**30:.1f} GiB of memory"
        )
        largest = math.isqrt(memory // (2 * TAUCHEN_BYTES))  # half the memory: the DP's own arrays need the rest
        factor_points = validate.integer(factor_points, where("factor_points"), 3, largest, why=why, error=error)
        if validate.integer(coarse_points, where("coarse_points"), 2, error=error) >= factor_points:
            raise validate.refuse(
                where("coarse_points"), f"an integer in [2, factor_points - 1 = {factor_points - 1}]", str(coarse_points), error=error
            )
        # > 0: the search certifies upper - value <= tolerance |value| on rounded sums, which 0 meets only by coincidence:
        # every round would run and the split stay uncertified (`rounds`, not the tolerance, bounds the search)
        tolerance = validate.real(tolerance, where("tolerance"), 0, low_open=True, error=error)
        return {"factor_points": factor_points, "coarse_points": int(coarse_points), "tolerance": tolerance}

    def dp_settings(self, points: int | None = None, integer_cap: bool = True) -> dict:
        """The item DP's settings (policies.dp_optimal.solve's) on `points` factor points (default factor_points): the
        bound's relaxed cap ceil(qbar) with `integer_cap`, the domain's floor one period's demand below x_0."""
        return {
            "factor_points": points or self.factor_points,
            "factor_width": self.factor_width,
            "integer_cap": integer_cap,
            "floor_periods": 1,
            "max_positions": self.max_positions,
        }

    def to_dict(self) -> dict:
        return {**asdict(self), "multiples": list(self.multiples)}

    @property
    def step_ratio(self) -> float:
        """r = coarse grid step / fine grid step."""
        return (self.factor_points - 1) / (self.coarse_points - 1)


def check_caps(instance: Instance, where: str) -> None:
    """Refuse, before any solve, an instance with an item whose order cap is below its mean demand
    (Instance.caps_below_demand): its backlog grows without bound, and so does its DP's order-up-to position."""
    short = instance.caps_below_demand()
    if short.size:
        item = int(short[0])
        more = f" ({short.size} items in all)" if short.size > 1 else ""
        raise InputError(
            f"{where}: {instance.item_name(item)}: its order cap qbar {instance.qbar[item]:g} is below its mean demand lam "
            f"{instance.lam[item]:g} per period{more}, so no policy keeps up with its demand, its backlog grows without bound and its "
            "DP has no finite optimum; give it a qbar of at least its lam (the cost table's qbar column, or the instance's items.qbar)"
        )


def check_items(
    instance: Instance, horizon: int, options: DecompositionOptions, where: str, forms: tuple[str, ...] = ()
) -> tuple[int, float]:
    """Refuse, before Ray starts, an instance with an item whose DP would not fit in memory or cannot order under its cap
    (policies.dp_optimal.check_item, milliseconds an item): the bound's fine solve of two shares with W_t kept, and the
    lookahead tables of `forms` (`item_table`'s solves). One InputError naming the item and what to change. Returns the
    item whose fine solve takes longest and its estimated seconds (policies.dp_optimal.estimated_seconds)."""
    check_caps(instance, where)
    long = lookahead.stationary_horizon(instance.gamma)
    slowest = (0, 0.0)
    for item in range(instance.n):
        one = item_instance(instance, item, 0.0)
        relax = tables_relax_cap(float(instance.qbar[item]))
        plans = [(horizon, 2, None, True)]  # (horizon, setups, stages kept, integer_cap)
        plans += [(horizon, 1, None, relax)] if lookahead.FORMS[0] in forms else []
        plans += [(long, 1, 1, relax)] if lookahead.FORMS[1] in forms else []
        try:
            for steps, setups, stages, integer_cap in plans:
                dp_optimal.check_item(one, steps, setups, stages, **options.dp_settings(integer_cap=integer_cap))
        except (dp_optimal.TooLarge, dp_optimal.CapBelowStep) as exc:
            raise InputError(f"{where}: {instance.item_name(item)}: {exc}") from None
        seconds = dp_optimal.estimated_seconds(one, horizon, 2, **options.dp_settings())[1]
        slowest = max(slowest, (item, seconds), key=lambda pair: pair[1])
    return slowest


def names_the_item(solve_item: Callable) -> Callable:
    """Wrap a function of (instance, item, ...) that solves the item's DP: an item without a finite optimum
    (policies.dp_optimal.NoFiniteOptimum) or whose DP does not fit in memory (TooLarge) is refused naming the item,
    as the user's instance names it."""

    @functools.wraps(solve_item)
    def solve(instance: Instance, item: int, *args, **kwargs):
        try:
            return solve_item(instance, item, *args, **kwargs)
        except (dp_optimal.NoFiniteOptimum, dp_optimal.TooLarge, dp_optimal.CapBelowStep) as exc:
            raise InputError(f"{instance.item_name(item)}: {exc}") from None

    return solve


def item_instance(instance: Instance, item: int, setup: float) -> Instance:
    """Item `item` of `instance` alone over its own factor, with setup cost `setup` (gamma and rho of the instance): one
    factor, the item's exposure u_i,t (envs.instance.exposure), with beta = |beta_i| and the item's overdispersion phi_i.
    The item sees the factors only through u_i,t, an AR(1) with the same rho (docs/model.md), so this is its problem."""
    phi = None if instance.overdispersion is None else instance.overdispersion[item : item + 1]
    return Instance(
        *(getattr(instance, name)[item : item + 1] for name in ITEM_COLUMNS),
        K=float(setup),
        gamma=instance.gamma,
        rho=instance.rho,
        overdispersion=phi,
    )


def item_paths(instance: Instance, item: int, paths: ExogenousPaths) -> ExogenousPaths:
    """Item `item`'s part of `paths`, the paths of `item_instance`: its exposure path u_i,t [E, T+1] (F_t itself for the
    paper's model) and its demands [E, T, 1]."""
    directions = instance.directions
    if directions is not None:
        directions = torch.as_tensor(directions[item : item + 1], dtype=paths.factor.dtype, device=paths.factor.device)  # [1, k]
    factor = exposure(directions, paths.factor)[..., 0]  # [E, T+1]
    return ExogenousPaths(factor, paths.demand[:, :, item : item + 1], paths.seed, paths.episodes)


def guess_shares(instance: Instance) -> np.ndarray:
    """A first guess of the best split: shares in proportion to h_i lam_i, which equalises the order
    frequencies sqrt(h_i lam_i / (2 k_i)) of the economic order quantity: [n], summing to K."""
    weight = instance.h * instance.lam
    return instance.K * weight / weight.sum()


@names_the_item
def item_values(instance: Instance, item: int, setups, horizon: int, points: int, options: DecompositionOptions) -> np.ndarray:
    """V_item(k) for every k in `setups` on a grid of `points` factor points: [G]."""
    return dp_optimal.expected_costs(item_instance(instance, item, 0.0), horizon, setups, **options.dp_settings(points))


@names_the_item
def certified_values(instance: Instance, item: int, solutions: list, horizon: int, options: DecompositionOptions) -> list[float]:
    """Proven lower bounds on item `item`'s exact-lattice values at the shares of its fine-grid `solutions`: the values
    themselves on the exact lattice (step 1), else policies.dp_certificate's bound on the same lattice and grid."""
    if solutions[0].lattice.step == 1:
        return [solution.expected_cost for solution in solutions]
    one = item_instance(instance, item, 0.0)
    setups, values = [s.setup for s in solutions], [s.expected_cost for s in solutions]
    return [float(v) for v in dp_certificate.certified_costs(one, horizon, setups, values, **options.dp_settings())]


# ---- the split ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    """A feasible split (sum <= K) and the chords' value there (a lower bound on sum_i V_i(shares_i))."""

    shares: np.ndarray  # [n]
    value: float
    slope: float  # the slope of the last chord taken (the common derivative, to the grid's resolution)


def _sorted_points(setups: list, values: list) -> list[tuple[np.ndarray, np.ndarray]]:
    points = []
    for k, v in zip(setups, values):
        k, v = np.asarray(k, np.float64), np.asarray(v, np.float64)
        order = np.argsort(k)
        k, keep = np.unique(k[order], return_index=True)
        points.append((k, v[order][keep]))
    return points


SLOPE_RTOL = 1e-9
"""Chord slopes within this relative difference are one slope to `best_split` (last-bit differences of the DP's
BLAS and FFT results must not decide the order in which equal slopes are taken)."""


def _chord_order(points: list[tuple[np.ndarray, np.ndarray]]) -> Callable[[tuple], tuple]:
    """The sort key of `best_split`'s chords (slope, item, end share): decreasing slope, slopes within SLOPE_RTOL of each other
    (chained) tying, then item index, then left to right within the item."""
    ranked = []
    for i, (k, v) in enumerate(points):
        # slopes as their running minimum: an item's chords go left to right even where rounding makes a concave item's
        # slopes rise by a last bit (a chord taken before the one on its left would move the share backwards)
        ranked += [(s, i, float(end)) for s, end in zip(np.minimum.accumulate(np.diff(v) / np.diff(k)), k[1:])]
    ranked.sort(key=lambda c: -c[0])
    level, previous, rank = 0, None, {}
    for s, i, end in ranked:
        if previous is not None and previous - s > SLOPE_RTOL * max(abs(previous), abs(s)):
            level += 1
        rank[i, end], previous = level, s
    return lambda chord: (rank[chord[1], chord[2]], chord[1], chord[2])


def best_split(setups: list, values: list, K: float) -> Split:
    """The best split of K over the chords of each item's values (setups[i], values[i]: item i's grid,
    G_i >= 2 points): every item starts at its smallest grid share, then the chords are taken in order
    of decreasing slope while the budget lasts, the last one in part. Exact for the piecewise-linear
    functions through the points (they are concave when the V_i are)."""
    points = _sorted_points(setups, values)
    shares = np.array([k[0] for k, _ in points])
    value = float(sum(v[0] for _, v in points))
    budget = K - shares.sum()
    if budget < -1e-9 * max(1.0, K):
        raise ValueError(f"the smallest grid shares sum to {shares.sum():g} > K = {K:g}")
    chords = [
        (float((v[g + 1] - v[g]) / (k[g + 1] - k[g])), i, float(k[g + 1])) for i, (k, v) in enumerate(points) for g in range(k.size - 1)
    ]
    slope = 0.0
    for s, i, end in sorted(chords, key=_chord_order(points)):
        if budget <= 0 or s <= 0:
            break
        step = min(end - shares[i], budget)
        shares[i] = end if step == end - shares[i] else shares[i] + step  # a whole chord ends on its grid share exactly
        value += s * step
        budget -= step
        slope = s
    return Split(shares, value, slope)


def _upper_envelope(k: np.ndarray, v: np.ndarray, x: np.ndarray) -> np.ndarray:
    """An upper bound on a concave function through the points (k, v) at x [P]: on each segment the
    lower of the neighbouring chords extended (beyond the ends, the end chord extended)."""
    slopes = np.diff(v) / np.diff(k)  # [G-1]
    g = np.clip(np.searchsorted(k, x, side="right") - 1, 0, k.size - 2)  # the segment of x (end segments beyond the ends)
    inside = (x >= k[0]) & (x <= k[-1])
    bound = np.full(x.shape, np.inf)
    for neighbour in (g - 1, g + 1):
        ok = (neighbour >= 0) & (neighbour < slopes.size)
        j = np.clip(neighbour, 0, slopes.size - 1)
        bound = np.where(ok & inside, np.minimum(bound, v[j] + slopes[j] * (x - k[j])), bound)
    outside = v[g] + slopes[g] * (x - k[g])  # beyond an end: the end chord extended
    return np.where(inside, bound, outside)


def split_upper_bound(setups: list, values: list, K: float) -> float:
    """An upper bound on max sum_i V_i(k_i) over k >= 0, sum k <= K, for concave nondecreasing V_i known
    at the points (each item needs G_i >= 3 points): min over mu >= 0 of
    mu K + sum_i max_{0 <= k <= K} (U_i(k) - mu k), with U_i >= V_i (`_upper_envelope`); the inner maximum
    of a piecewise-linear function sits at a kink or an end, and the outer function is convex in mu."""
    candidates = []
    for k, v in _sorted_points(setups, values):
        if k.size < 3:
            raise ValueError("the upper bound needs at least 3 grid points per item")
        slopes = np.diff(v) / np.diff(k)
        # kinks: the grid points and, inside each segment, where its two neighbouring chords cross
        cross = [
            (v[g + 1] - slopes[g + 1] * k[g + 1] - v[g - 1] + slopes[g - 1] * k[g - 1]) / (slopes[g - 1] - slopes[g + 1])
            for g in range(1, slopes.size - 1)
            if slopes[g - 1] != slopes[g + 1]
        ]
        x = np.clip(np.concatenate([[0.0, K], k, cross]), 0.0, K)
        candidates.append((x, _upper_envelope(k, v, x)))

    def dual(mu: float) -> float:
        return mu * K + sum(float(np.max(u - mu * x)) for x, u in candidates)

    mus = np.unique(np.concatenate([[0.0], *[np.maximum(np.diff(v) / np.diff(k), 0.0) for k, v in _sorted_points(setups, values)]]))
    lo, hi = 0, mus.size - 1
    while hi - lo > 2:  # ternary search over the sorted candidates of a convex function
        a, b = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        if dual(mus[a]) <= dual(mus[b]):
            hi = b
        else:
            lo = a
    return min(dual(mus[j]) for j in range(lo, hi + 1))


def refine(setups, share: float, K: float) -> list[float]:
    """New grid shares around an item's `share`: at a grid point, the midpoints of the segments on either
    side (beyond an end of the grid, half the share or 1.5 times it, at most K); inside a segment, the
    share itself and the midpoints of its two parts."""
    k = np.unique(np.asarray(setups, np.float64))
    j = int(np.argmin(np.abs(k - share)))
    if np.isclose(k[j], share, rtol=1e-9, atol=1e-12):
        new = [0.5 * (k[j - 1] + share) if j > 0 else 0.5 * share, 0.5 * (share + k[j + 1]) if j + 1 < k.size else min(1.5 * share, K)]
    else:
        below, above = k[k < share].max(initial=0.0), k[k > share].min(initial=K)
        new = [share, 0.5 * (below + share), 0.5 * (share + above)]
    return [float(s) for s in new if 0 <= s <= K and not np.any(np.isclose(k, s, rtol=1e-9, atol=1e-12))]


@dataclass(frozen=True)
class Search:
    """The outcome of `search_split`."""

    split: Split
    upper: float  # the certified upper bound on the best split's value (same grid)
    rounds: int
    setups: list  # every item's grid shares and its values there
    values: list

    def summary(self, tolerance: float) -> dict:
        gap = (self.upper - self.split.value) / abs(self.split.value)
        return {
            "rounds": self.rounds,
            "chord_value": self.split.value,
            "upper_bound": self.upper,
            "relative_gap": gap,
            "certified": bool(gap <= tolerance),
            "tolerance": tolerance,
            "common_slope": self.split.slope,
            "grid_points": sum(len(s) for s in self.setups),
        }


def certificate_note(search: dict) -> str:
    """How far the best split is certified, from `Search.summary`: a split search that stops at its round limit
    uncertified still gives a valid bound, but a better split may exist (by at most the gap)."""
    if search["certified"]:
        return f"best split certified to {search['relative_gap']:.1e} of its value"
    gap, rounds, tolerance = 100 * search["relative_gap"], search["rounds"], search["tolerance"]
    return f"best split not certified (gap {gap:.3g}% at the round limit {rounds}, tolerance {tolerance:g})"


def search_split(
    instance: Instance, options: DecompositionOptions, values_of: Callable[[int, list], list], guess: np.ndarray | None = None
) -> Search:
    """The best split of K to the tolerance: round 0 evaluates each unit on its guess times the multiples and on K/n; each
    further round on `refine`'s shares, until the split is certified or the rounds run out. The units are the items, with
    `guess_shares` as their guesses, or any others that share K (policies/group_bound.py's groups) with their `guess` [n].
    values_of(round, grids) returns unit i's values at grids[i] (empty lists included)."""
    guess = guess_shares(instance) if guess is None else np.asarray(guess, np.float64)
    n, K = guess.size, instance.K
    grids = [sorted(set(float(s) for s in guess[i] * np.array(options.multiples)) | {K / n}) for i in range(n)]
    setups: list[list[float]] = [[] for _ in range(n)]
    values: list[list[float]] = [[] for _ in range(n)]
    for round_ in range(options.rounds):
        for i, v in enumerate(values_of(round_, grids)):
            setups[i] += grids[i]
            values[i] += list(v)
        split = best_split(setups, values, K)
        upper = split_upper_bound(setups, values, K)
        if upper - split.value <= options.tolerance * abs(split.value) or round_ + 1 == options.rounds:
            break
        grids = [refine(setups[i], split.shares[i], K) for i in range(n)]
    return Search(split, upper, round_ + 1, setups, values)


# ---- one item's figures at the chosen shares --------------------------------------------------------


@names_the_item
def item_figures(
    instance: Instance,
    item: int,
    shares: dict[str, float],
    horizon: int,
    paths: ExogenousPaths,
    options: DecompositionOptions,
    known: dict[float, float] | None = None,
    tables: str | None = None,
) -> dict:
    """The item's record: per named share (best split, equal shares) its fine-grid, coarse-grid (taken from `known`, by share,
    where given) and certified values, and the fine-grid policy on `paths`: costs [E] (discounted), mean and mean discounted
    orders per episode, cumulative [T] (mean of sum_{s<=t} gamma^s C_s); and the task's wall-clock and CPU seconds. With
    `tables` (a folder), writes the first share's lookahead tables there (`item_table`, from the same fine-grid solution)."""
    start, cpu = time.perf_counter(), time.process_time()
    names, setups = list(shares), [float(s) for s in shares.values()]
    one = item_instance(instance, item, 0.0)
    solutions = dp_optimal.solve(one, horizon, setups=setups, **options.dp_settings())
    known = known or {}
    missing = [s for s in setups if s not in known]
    known = {
        **known,
        **dict(zip(missing, item_values(instance, item, missing, horizon, options.coarse_points, options) if missing else [])),
    }
    coarse = [known[s] for s in setups]
    step = solutions[0].lattice.step
    certified = certified_values(instance, item, solutions, horizon, options)
    own_paths = item_paths(instance, item, paths)
    discount = instance.gamma ** np.arange(horizon)
    record = {"item": int(item), "lattice_step": int(step)}
    for name, setup, solution, value, floor in zip(names, setups, solutions, coarse, certified):
        result = evaluate(
            dp_optimal.DPOptimalPolicy(solution), item_instance(instance, item, setup).to_torch(dtype=torch.float64), own_paths, trace=True
        )
        orders = result.trace.open * (result.trace.quantity[..., 0] > 0)  # [E, T]
        record[name] = {
            "share": setup,
            "value": solution.expected_cost,
            "coarse_value": float(value),
            "certified_value": floor,
            "costs": result.discounted_cost.tolist(),
            "orders": float(orders.sum(1).mean()),
            "discounted_orders": float((orders @ discount).mean()),
            "cumulative": np.cumsum(result.trace.cost * discount, axis=1).mean(0).tolist(),
        }
    if tables is not None:
        table_start = time.perf_counter()
        item_table(instance, item, setups[0], horizon, options, solutions[0]).save(Path(tables) / lookahead.item_file(item))
        record["table_seconds"] = time.perf_counter() - table_start
    record["seconds"], record["cpu_seconds"] = time.perf_counter() - start, time.process_time() - cpu
    return record


RELAXED_CAP_LIMIT = 1.25
"""The lookahead's tables keep the bound's relaxed cap ceil(qbar) while it is at most this many times the item's own cap
(every item of the paper's family: qbar >= 8); an item with a smaller fractional cap gets tables on its own cap's
lattice (`tables_relax_cap`)."""


def tables_relax_cap(qbar: float) -> bool:
    """Whether an item's lookahead tables use the relaxed cap ceil(qbar) (the bound's own solution, one solve less)
    or the item's own cap qbar (policies.dp_optimal.make_lattice without integer_cap): a cap of 0.6 relaxed to 1 makes
    the tables expect orders the policy cannot place, where with its own cap the lookahead is the DP's optimum at
    n = 1."""
    return dp_optimal.whole_cap(qbar, up=True) <= RELAXED_CAP_LIMIT * qbar


TABLE_DTYPE = "float16"
"""The finite-horizon lookahead tables' storage type (policies/lookahead.py: the excess rows are small where a
decision is taken; measured against float32 in docs/methods.md)."""


@names_the_item
def item_table(
    instance: Instance,
    item: int,
    share: float,
    horizon: int,
    options: DecompositionOptions,
    solution: dp_optimal.DPSolution | None = None,
    dtype: str = TABLE_DTYPE,
    forms: tuple[str, ...] = lookahead.FORMS,
) -> lookahead.ItemTable:
    """The lookahead tables (policies/lookahead.py) of one item at setup cost `share`, of `forms` only (ValueError unless a non-empty
    subset of lookahead.FORMS), on the fine factor grid: the finite form from the fine-grid DP over `horizon` (`solution`, when
    already solved), at the stages `lookahead.stage_tolerance` asks for at the instance's n; the stationary form from W_0 of a
    long horizon (lookahead.stationary_horizon), a solve of its own, so a form not asked for is not solved."""
    if not forms or not set(forms) <= set(lookahead.FORMS):
        raise ValueError(f"forms: expected a non-empty subset of {lookahead.FORMS}, got {forms!r}")
    one = item_instance(instance, item, share)
    settings = options.dp_settings(integer_cap=tables_relax_cap(float(instance.qbar[item])))
    if not settings["integer_cap"]:
        solution = None  # the bound's solution has the relaxed cap ceil(qbar)
    finite = (solution or dp_optimal.solve(one, horizon, **settings)) if lookahead.FORMS[0] in forms else None
    long = None
    if lookahead.FORMS[1] in forms:  # W_0 of a long horizon alone
        long = dp_optimal.solve(one, lookahead.stationary_horizon(instance.gamma), stages=1, **settings)
    solved = [solution for solution in (finite, long) if solution is not None]
    widest = max(solved, key=lambda solution: solution.positions.size)  # the first of equal ones: the finite form's lattice
    stationary = None
    if long is not None:
        stationary = long.action_value[0] if long.action_value.shape[0] else np.zeros((long.grid.points.size, long.positions.size))
    tolerance = None
    if finite is not None:
        tolerance = lookahead.stage_tolerance(finite.action_value.size * np.dtype(lookahead.DTYPES[dtype]).itemsize, instance.n)
    return lookahead.ItemTable.from_values(
        widest.positions,
        widest.grid.points,
        finite.action_value if finite is not None else None,
        stationary,
        share,
        widest.window,
        dtype,
        tolerance,
    )


def combine(records: list[dict], name: str, options: DecompositionOptions) -> dict:
    """The bound's figures for split `name`, summed over the items' records: `value` (fine grid), `coarse_value`, `extrapolated`
    (Richardson), `certified` (the items' proven lower bounds), `conservative` (certified less twice the factor grid's estimated
    error, each item's own: items whose grid errors have opposite signs do not cancel; docs/methods.md, "Decomposition bound"),
    and the relaxed policies' `costs` [E] and `cumulative` discounted cost [T]."""
    fine = sum(r[name]["value"] for r in records)
    coarse = sum(r[name]["coarse_value"] for r in records)
    remaining = sum(abs(r[name]["coarse_value"] - r[name]["value"]) for r in records) / (options.step_ratio**2 - 1)
    certified = sum(r[name]["certified_value"] for r in records)
    return {
        "value": fine,
        "coarse_value": coarse,
        "certified": certified,
        "extrapolated": fine - (coarse - fine) / (options.step_ratio**2 - 1),
        "conservative": certified - 2 * remaining,
        "costs": np.sum([r[name]["costs"] for r in records], axis=0),
        "cumulative": np.sum([r[name]["cumulative"] for r in records], axis=0),
    }


# ---- the decomposition lookahead's tables in this process ---------------------------------------------------
# Its tables come from a decomposition bound run's folder (platform/bound.py --kind decomposition writes them under
# lookahead/), or, without one, from the same computation here (the split search on the coarse grid, then each item's
# DP at its share on the fine grid, no Ray). The threshold c (open iff sum_i g_i > c K) is tuned on the training paths
# like every classical policy: each of THRESHOLDS is simulated on the same TUNING_EPISODES training episodes
# (TUNING_SEED, common random numbers) and c = 1, the exact one-step lookahead, is kept unless another is cheaper there.

THRESHOLDS = (0.5, 0.75, 1.0, 1.25, 1.5)
SPLITS = ("best", "equal")
DEFAULT_OPTIONS = DecompositionOptions()


def item_tables(
    instance: Instance,
    horizon: int,
    options: DecompositionOptions = DEFAULT_OPTIONS,
    split: str = "best",
    dtype: str = "float16",
    progress: bool = False,
    forms: tuple[str, ...] = lookahead.FORMS,
) -> list[lookahead.ItemTable]:
    """Every item's tables of `forms` in this process (a form not asked for is not solved): at the best split of
    the bound's search (`split` = "best") or at equal shares K/n ("equal")."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
    check_items(instance, horizon, options, lookahead.NAME, forms)
    n = instance.n
    if split == "best":

        def values_of(round_: int, grids: list) -> list:
            return [
                item_values(instance, i, g, horizon, options.coarse_points, options) if g else []
                for i, g in enumerate(tqdm(grids, desc=f"split round {round_ + 1}", disable=not progress, leave=False))
            ]

        shares = search_split(instance, options, values_of).split.shares
    else:
        shares = np.full(n, instance.K / n)
    return [
        item_table(instance, i, float(shares[i]), horizon, options, dtype=dtype, forms=forms)
        for i in tqdm(range(n), desc="lookahead tables", disable=not progress, leave=False)
    ]


def tune_threshold(tables: lookahead.LookaheadTables, instance: Instance, horizon: int, device="cpu") -> tuple[float, dict]:
    """c from THRESHOLDS by the mean discounted cost on the training paths; c = 1 unless another is cheaper. The
    policies share the tables' device copy (`LookaheadTables.on`)."""
    paths = sample_paths(instance, TUNING_SEED, TUNING_EPISODES, horizon, device)
    tinst = instance.to_torch(device)
    means = {c: float(evaluate(lookahead.LookaheadPolicy(tables, c), tinst, paths).discounted_cost.mean()) for c in THRESHOLDS}
    best = min(means, key=means.get)
    return (best if means[best] < means[1.0] else 1.0), means


def lookahead_policy(
    instance: Instance,
    horizon: int = EVAL_HORIZON,
    device="cpu",
    form: str = "finite",
    bound: str | Path | None = None,
    threshold: float | None = None,
    split: str = "best",
    options: DecompositionOptions = DEFAULT_OPTIONS,
    progress: bool = False,
) -> tuple[lookahead.LookaheadPolicy, dict]:
    """(policy, parameters for a summary) of the decomposition lookahead on `instance`: tables of `form`
    from the bound run folder `bound` (that form read alone), else computed here (`item_tables`, that form
    solved alone); c = `threshold`, or tuned on the
    training paths (`tune_threshold`) when None."""
    start = time.perf_counter()
    if bound is not None:
        tables = lookahead.load_tables(bound, instance, form, horizon)
    else:
        items = item_tables(instance, horizon, options, split, progress=progress, forms=(form,))
        tables = lookahead.LookaheadTables.from_items(items, form, horizon, instance.content_hash())
    built = time.perf_counter() - start
    tuning = {}
    if threshold is None:
        threshold, tuning = tune_threshold(tables, instance, horizon, device)
    parameters = {
        "form": form,
        "threshold": threshold,
        "tuning_means": {str(c): m for c, m in tuning.items()},
        "split": split if bound is None else "best",
        "tables": str(bound) if bound is not None else "built in process",
        "table_bytes": tables.nbytes,
        "build_seconds": built,
        "tuning_seconds": time.perf_counter() - start - built,
    }
    return lookahead.LookaheadPolicy(tables, threshold), parameters
