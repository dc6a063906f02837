"""The dynamic-programming optimum for one item (n = 1): a finite-horizon DP over (inventory position after
ordering, factor on a Tauchen grid), exact for the discretised factor chain; a policy and a test oracle.

The lead-time reduction charges decision t with gamma^L G(y_t, F_t), G(y, f) = E[h (y - S)^+ + b (S - y)^+ | f],
S the demand of L + 1 periods; decisions with t + L >= T never order, and

    W_t(y, f) = gamma^L G(y, f) + gamma E[V_{t+1}(y - D_t, F_{t+1}) | F_t = f],
    V_t(x, f) = min( W_t(x, f),  K + min_{x <= y <= x + qbar} W_t(y, f) ).

Positions live on a lattice that holds the optimum exactly: delta Z with m x_0 and m qbar integers (delta = 1/m), or,
with `integer_cap` (lower bounds), the two classes Z and x_0 + Z with the cap raised to ceil(qbar). Above MAX_POSITIONS
positions the DP works on a coarse lattice x_0 + D Z (`lattice_step`; an approximation, `exact_lattice` False, which
policies/dp_certificate.py bounds from below). `setups` solves several setup costs in one backward pass. The policy
opens iff K + min_window W < W(x) at the nearest lattice point (W interpolated in F) and orders up to the minimiser.
Several factors: the item sees them through its exposure (TensorInstance.exposure), an AR(1) of unit variance.
The derivation, the lattice argument and the domain: docs/methods.md, "The n = 1 optimum".
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from scipy.fft import next_fast_len, rfft
from scipy.ndimage import minimum_filter1d
from scipy.signal import fftconvolve
from tqdm import tqdm

from envs.demand_law import conditional_variance, demand_rate, demand_top, period_laws
from envs.dynamics import State
from envs.exogenous import innovation_scale
from envs.instance import Instance, TensorInstance
from plumbing import validate
from plumbing.errors import InputError

NAME = "dp-optimal"
DEFAULT_FACTOR_POINTS = 121
DEFAULT_FACTOR_WIDTH = 4.0
DEFAULT_MAX_DENOMINATOR = 10
DEFAULT_TAIL = 1e-13


class NoFiniteOptimum(InputError):
    """The item's optimal order-up-to positions leave every domain the DP tries (an order cap below the demand)."""


class CapBelowStep(InputError):
    """The item's order cap is below one step of its lattice: its DP cannot order at all."""


class TooLarge(InputError):
    """The item's DP arrays would take more than half of this machine's memory (a heavy demand tail)."""


WORK_ARRAYS = 10
"""[G, M, N + one period's demand]-sized float64 arrays the backward pass holds at once besides its tables (the mixed
and padded values, the FFT convolution's complex intermediates and output, W, its window minimum, the new values)."""


def physical_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_size(instance: Instance, points: int, dmax: int, lattice: Lattice, positions: int, setups: int, steps: int) -> None:
    """Raise TooLarge, before allocating, when a backward pass's arrays (`WORK_ARRAYS` work arrays and W_t for `steps` decision
    steps, each [setups, points, positions + one period's demand in lattice points]) exceed half of `physical_memory()`."""
    demand_points = -(-dmax // lattice.step) * lattice.classes
    need = 8 * setups * points * ((positions + demand_points) * WORK_ARRAYS + positions * steps)
    memory = physical_memory()
    if need <= memory / 2:
        return
    phi = item_overdispersion(instance)
    law = f"lam {float(instance.lam[0]):g}" + (f" and overdispersion phi {phi:g}" if phi else "")
    grid = f"a lattice step of {lattice.step} units" if lattice.step > 1 else "the exact lattice"
    raise TooLarge(
        f"{NAME}: its DP needs about {need / 2**30:.1f} GiB ({positions:,} inventory positions on {grid} x {points} factor points"
        f"{f' x {steps} steps' if steps else ''}{f' x {setups} setup costs' if setups > 1 else ''}), above half of this machine's "
        f"{memory / 2**30:.1f} GiB: with {law} one period's demand reaches {dmax:,} units (its 1e-13 tail), and the positions "
        "span several periods of it; fewer factor points or a shorter horizon make it fit (docs/methods.md)"
    )


def check_single_item(n: int) -> None:
    if n != 1:
        raise InputError(f"{NAME}: the exact DP exists for one item (n = 1), got n = {n}")


def item_overdispersion(instance: Instance | TensorInstance) -> float:
    """The one item's phi (0 for Poisson demand)."""
    return 0.0 if instance.overdispersion is None else float(instance.overdispersion[0])


def model_key(instance: Instance | TensorInstance) -> list[float]:
    """The item's demand model beyond (lam, |beta|), for comparing instances: its phi, then its direction beta / |beta|
    (empty for one non-negative factor)."""
    directions = instance.directions
    return [item_overdispersion(instance)] + ([] if directions is None else [float(d) for d in directions[0]])


# ---- factor grid ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FactorGrid:
    """Tauchen discretisation of F_{t+1} = rho F_t + sqrt(1 - rho^2) eps (stationary law N(0, 1)).

    points: [M] f_1 < ... < f_M; transition: [M, M] P(f_i -> f_j), rows sum to 1;
    initial: [M] the N(0, 1) mass of each point's cell (the law of F_0)."""

    points: np.ndarray
    transition: np.ndarray
    initial: np.ndarray


def tauchen_grid(rho: float, points: int = DEFAULT_FACTOR_POINTS, width: float = DEFAULT_FACTOR_WIDTH) -> FactorGrid:
    validate.integer(points, f"{NAME} factor_points", 1)
    if points == 1:
        return FactorGrid(np.zeros(1), np.ones((1, 1)), np.ones(1))
    validate.real(width, f"{NAME} factor_width", 0, low_open=True)
    f = np.linspace(-width, width, points)
    edges = np.concatenate([[-np.inf], 0.5 * (f[1:] + f[:-1]), [np.inf]])  # [M+1] cell boundaries
    scale = innovation_scale(rho)
    if scale == 0.0:  # rho = 1 is not an admissible instance; kept for completeness
        raise InputError(f"{NAME}: rho must be < 1, got {rho}")
    cdf = stats.norm.cdf((edges[None, :] - rho * f[:, None]) / scale)  # [M, M+1]
    transition = np.diff(cdf, axis=1)
    transition /= transition.sum(1, keepdims=True)
    initial = np.diff(stats.norm.cdf(edges))
    return FactorGrid(f, transition, initial / initial.sum())


# ---- demand laws on the chain --------------------------------------------------------------------


def demand_law(rates: np.ndarray, overdispersion: float, tail: float, step: int = 1, points: int | None = None) -> np.ndarray:
    """pmf rows [M, ceil(dmax / step) + 1] of one period's demand given each rate [M], eq. (conditional_demand): Poisson at
    overdispersion phi = 0, else the negative binomial of mean rate and variance rate + phi rate^2 (the gamma-Poisson mixture
    envs.demand_law.draw_demand samples), truncated at dmax (`demand_top`) with the tail mass on the last point. With `step`
    D > 1 the law is split onto the multiples of D, keeping its mean (docs/methods.md, "The DP at real volumes"). With
    `points` below that length, its first `points` points alone (the same numbers), the rest of its mass left to `law_tail`."""
    dmax = demand_top(rates, overdispersion, tail)
    length = -(-dmax // step) + 1
    cut = points is not None and points < length
    if step == 1:
        law = period_laws(rates, overdispersion)[0]
        pmf = law.pmf(np.arange(points if cut else dmax + 1)[None, :])
    else:
        intervals = points if cut else length - 1
        edges = step * np.arange(intervals + 1)[None, :]  # [1, J+1] the interval [j D, (j + 1) D) starts at edges[j]
        law, shifted = period_laws(rates, overdispersion)
        below = law.cdf(edges - 1)  # P(D < j D): [M, J+1]
        first = rates[:, None] * shifted.cdf(edges - 2)  # E[D; D < j D]
        mass, moment = np.diff(below, axis=1), np.diff(first, axis=1)  # each interval's P and E[D; interval]: [M, J]
        left = np.clip(edges[:, 1:] * mass - moment, 0.0, None) / step  # to j D
        right = np.clip(moment - edges[:, :-1] * mass, 0.0, None) / step  # to (j + 1) D
        pmf = np.zeros((rates.size, intervals + 1))
        pmf[:, :-1] += left
        pmf[:, 1:] += right
        if cut:
            return pmf[:, :points]
    if cut:
        return pmf
    pmf[:, -1] += np.clip(1.0 - pmf.sum(1), 0.0, None)
    return pmf / pmf.sum(1, keepdims=True) if step > 1 else pmf


def law_means(rates: np.ndarray, overdispersion: float, tail: float, step: int = 1) -> np.ndarray:
    """The mean of `demand_law`'s law at each rate ([M], in units of stock): the law truncated at its last point t (dmax,
    or ceil(dmax / D) D on a coarse lattice), E[D; D < t] + t P(D >= t) (the split onto the multiples of D keeps it)."""
    dmax = demand_top(rates, overdispersion, tail)
    top = dmax if step == 1 else -(-dmax // step) * step
    law, shifted = period_laws(rates, overdispersion)
    return rates * shifted.cdf(top - 2)[:, 0] + top * law.sf(top - 1)[:, 0]


@dataclass(frozen=True)
class LawTail:
    """What a law cut to its first K points (`demand_law`'s `points`) leaves beyond them: mass [M] and first moment [M]
    E[D / D_step; D >= K D_step], in lattice steps. Where the values are linear below the domain an expectation needs no
    more (`DemandExpectation`)."""

    mass: np.ndarray
    moment: np.ndarray

    @staticmethod
    def of(pmf: np.ndarray, means: np.ndarray, step: int) -> LawTail:
        """The tail of the cut law pmf [M, K] whose whole law has the means [M] (units of stock)."""
        support = np.arange(pmf.shape[1], dtype=np.float64)
        mass = np.clip(1.0 - pmf.sum(1), 0.0, None)
        moment = np.clip(means / step - pmf @ support, 0.0, None)
        return LawTail(mass, np.maximum(moment, mass * pmf.shape[1]))


DIRECT_CONVOLUTION = 1_000_000
"""Demand laws whose lengths multiply to at most this are summed by direct convolution, longer ones by FFT."""


def demand_sums(grid: FactorGrid, pmf: np.ndarray, periods: int, points: int | None = None) -> list[np.ndarray]:
    """Law of D_t + ... + D_{t+j-1} given F_t = f_i on the chain, for j = 1..periods: H_j [M, j dmax + 1]; with `points`,
    the first `points` points of each (exact: the sums of a cut law's first points)."""
    laws = [pmf if points is None else pmf[:, :points]]
    for _ in range(periods - 1):
        mixed = grid.transition @ laws[-1]  # law of the later demands given F_t: [M, S]
        if pmf.shape[1] * mixed.shape[1] <= DIRECT_CONVOLUTION:
            laws.append(np.stack([np.convolve(p, q) for p, q in zip(pmf, mixed)]))
        else:  # long laws (a heavy tail at a fine step): by FFT, its round-off below 0 cut
            laws.append(np.clip(fftconvolve(pmf, mixed, axes=1), 0.0, None))
        if points is not None:
            laws[-1] = laws[-1][:, :points]
    return laws


def sum_means(grid: FactorGrid, means: np.ndarray, periods: int, first: int = 0) -> list[np.ndarray]:
    """E[D_{t+first} + ... + D_{t+first+j-1} | F_t = f_i] on the chain for j = 1..periods ([M] each), `means` [M] one
    period's mean demand at each grid point."""
    ahead, total, sums = means.copy(), np.zeros_like(means), []
    for _ in range(first):
        ahead = grid.transition @ ahead
    for _ in range(periods):
        total = total + ahead
        sums.append(total)
        ahead = grid.transition @ ahead
    return sums


def expected_loss(law: np.ndarray, positions: np.ndarray, h: float, b: float, step: int = 1, mean: np.ndarray | None = None) -> np.ndarray:
    """E[h (y - S)^+ + b (S - y)^+] for S ~ law[i] (support 0, D, .., (S-1) D with D = `step`) and every y: [M, N], from
    cumulative sums in O(M (N + S)): in units of D, with k(y) the number of support points s <= y, P = sum_{s<k} p_s
    and Q = sum_{s<k} s p_s, E(y - S)^+ = y P - Q and E(S - y)^+ = (E S - Q) - y (1 - P). With `mean` ([M], units of
    stock) the law may be cut (`demand_sums`' points) above every y: its mass is 1 and its mean `mean`."""
    if step > 1:
        return step * expected_loss(law, positions / step, h, b, mean=None if mean is None else mean / step)
    support = np.arange(law.shape[1], dtype=np.float64)
    mass = np.concatenate([np.zeros((law.shape[0], 1)), np.cumsum(law, axis=1)], axis=1)  # [M, S+1]: P for k = 0..S
    first = np.concatenate([np.zeros((law.shape[0], 1)), np.cumsum(law * support, axis=1)], axis=1)  # [M, S+1]: Q
    below = np.clip(np.floor(positions) + 1, 0, law.shape[1]).astype(np.int64)  # k(y): [N]
    p, q, y = mass[:, below], first[:, below], positions[None, :]
    if mean is None:
        total_mass, total_first = mass[:, -1:], first[:, -1:]
    else:
        assert positions.size == 0 or positions.max() < law.shape[1] - 1, "a cut law must reach above every position"
        total_mass, total_first = 1.0, mean[:, None]
    return h * (y * p - q) + b * ((total_first - q) - y * (total_mass - p))


# ---- lattice ----------------------------------------------------------------------------------------


def lattice_denominator(x0: float, qbar: float, max_denominator: int = DEFAULT_MAX_DENOMINATOR) -> int | None:
    """The smallest m <= max_denominator with m x0 and m qbar integers (to 1e-9), or None."""
    for m in range(1, max_denominator + 1):
        if all(abs(m * v - round(m * v)) <= 1e-9 * max(1.0, abs(m * v)) for v in (x0, qbar)):
            return m
    return None


def _fraction(x: float) -> float:
    """x mod 1, with values within 1e-9 of an integer taken as 0."""
    f = x - math.floor(x)
    return 0.0 if min(f, 1.0 - f) <= 1e-9 * max(1.0, abs(x)) else f


@dataclass(frozen=True)
class Lattice:
    """The DP's positions, step (u + offsets[j]) for integer u (offsets sorted in [0, 1)), and `window`, the largest order in
    lattice steps. `step` is 1 on the exact lattices, D > 1 on a coarse one (docs/methods.md, "The DP at real volumes"); `cap`
    is the order cap it implements, `exact` whether its optimum is the one over real quantities with that cap (never on a
    coarse lattice)."""

    offsets: np.ndarray  # [c]
    window: int
    cap: float
    exact: bool
    step: int = 1

    @property
    def classes(self) -> int:
        return int(self.offsets.size)

    @property
    def rest(self) -> float:
        """The part of the cap beyond the window's last lattice point, in units of stock (0 on the exact lattices, and on
        a coarse one whose step divides the cap): an order reaches the interpolated point `rest` above it."""
        rest = self.cap - self.window * self.step
        return rest if self.step > 1 and rest > 1e-9 * max(1.0, self.cap) else 0.0

    def positions(self, low_unit: int, high_unit: int) -> np.ndarray:
        """Every lattice position of the steps low_unit..high_unit, increasing: [(high - low + 1) c]."""
        return self.step * (np.arange(low_unit, high_unit + 1)[:, None] + self.offsets[None, :]).ravel()


MAX_POSITIONS = 2000
"""The exact lattice is kept while the item's domain spans at most this many units (every item of the paper's family,
and the DP's tests); a wider one goes on a coarse lattice of step D > 1 units (`lattice_step`)."""
SPREAD_POSITIONS = 4
"""The spread's limit on a coarse step gives way where it would take more than this many times MAX_POSITIONS positions."""
RESOLUTION = 20
"""A coarse lattice step is at most 1 / RESOLUTION of the lead-time demand's standard deviation given the current factor
(`lead_time_spread`, `lattice_step`)."""


def domain_span(x0: float, cap: float, dmax: int, lead: int, floor_periods: int) -> float:
    """An upper bound on the width of the position domain (docs/methods.md, "The DP, derived"): from min(x_0, 0) - floor_periods dmax
    to max(x_0, q) + min(cap, q), with q <= (L + 1) dmax (a cap far above the demand adds no more than q: the domain
    grows if an optimal target reaches its top)."""
    top = (lead + 1) * dmax
    return max(x0, top) + min(cap, top) - min(x0, 0.0) + floor_periods * dmax


def lattice_step(span: float, cap: int, spread: float, max_positions: int = MAX_POSITIONS) -> int:
    """D, the item's lattice step in units of stock: 1 (the exact lattice) while `span` (`domain_span` at the cap ceil(qbar) =
    `cap`, floor one period's demand below x_0) is at most max_positions, else the coarse step of docs/methods.md, "The DP at
    real volumes" (`spread`: `lead_time_spread`), at most 2 max_positions positions (2 SPREAD_POSITIONS max_positions where the
    spread asks for a finer step). It depends on the item alone, so dp-optimal, the bound and the lookahead share it."""
    if span <= max_positions:
        return 1
    least = min(max(2, math.ceil(span / max_positions)), math.floor(spread / RESOLUTION))
    least = min(max(least, math.ceil(span / (SPREAD_POSITIONS * max_positions))), cap // 2)
    if least < 2:
        return 1
    divisors = [d for d in range(least, max(2, -(-least // 2)) - 1, -1) if cap % d == 0]
    return divisors[0] if divisors else least


def lead_time_spread(lam: float, overdispersion: float, lead: int, beta: float = 0.0, rho: float = 0.0) -> float:
    """The standard deviation of the demand of L + 1 periods given the current factor (the scale `lattice_step` resolves), the
    rate linearised in the factor: sqrt((L + 1)(lam + phi lam^2) + lam^2 beta^2 (1 - rho^2) sum_{m=1..L} (1 + rho + ... +
    rho^(m-1))^2) (docs/methods.md, "The DP at real volumes")."""
    own = (lead + 1) * conditional_variance(lam, overdispersion)
    moved = sum(sum(rho**j for j in range(m)) ** 2 for m in range(1, lead + 1))
    return math.sqrt(own + lam * lam * beta * beta * (1.0 - rho * rho) * moved)


def whole_cap(qbar: float, up: bool) -> int:
    """qbar in whole units, rounded up (the relaxed cap ceil(qbar)) or down, values within 1e-9 of an integer taken as it."""
    slack = 1e-9 * max(1.0, qbar)
    return math.ceil(qbar - slack) if up else math.floor(qbar + slack)


def make_lattice(
    x0: float, qbar: float, max_denominator: int = DEFAULT_MAX_DENOMINATOR, integer_cap: bool = False, step: int = 1
) -> Lattice:
    """The 1/m lattice (docs/methods.md, "The DP, derived"), or with `integer_cap` the two classes Z and x0 + Z with
    the cap raised to ceil(qbar) (a relaxation: its optimum is at most the item's optimum). With `step` D > 1
    the coarse lattice x0 + D Z with the cap ceil(qbar) (`integer_cap`) or qbar, kept as it is: its window is the whole
    steps under the cap, and `Lattice.rest` the part beyond them."""
    if step > 1:
        cap = float(whole_cap(qbar, up=True)) if integer_cap else qbar
        return Lattice(np.array([_fraction(x0 / step)]), math.floor(cap / step + 1e-9), cap, False, step)
    if integer_cap:
        offsets = np.unique([0.0, _fraction(x0)])
        cap = float(whole_cap(qbar, up=True))
        return Lattice(offsets, int(cap) * offsets.size, cap, True)
    m = lattice_denominator(x0, qbar, max_denominator)
    if m is not None:
        return Lattice(np.arange(m) / m, int(round(qbar * m)), qbar, True)
    m = max_denominator
    offsets = np.sort(np.mod(_fraction(x0) + np.arange(m) / m, 1.0))
    window = int(math.floor(qbar * m + 1e-9))
    return Lattice(offsets, window, window / m, False)


# ---- the solution --------------------------------------------------------------------------------


@dataclass
class DPSolution:
    """The solved DP of one item over `horizon` evaluation steps at setup cost `setup`: positions [N] (`Lattice.positions`),
    action_value [T_dec, M, N] W_t (t < T_dec = max(T - L, 0)), initial_value [M, N] V_0, and sunk [M] the expected discounted
    cost of the steps s < L from the initial state, by F_0 grid point."""

    instance: Instance
    setup: float
    horizon: int
    lead: int
    grid: FactorGrid
    lattice: Lattice
    positions: np.ndarray
    action_value: np.ndarray
    initial_value: np.ndarray
    sunk: np.ndarray
    initial_index: int
    solve_seconds: float

    @property
    def exact_lattice(self) -> bool:
        return self.lattice.exact

    @property
    def delta(self) -> float:
        """Units of stock per position: the lattice step when the classes are evenly spaced (the 1/m lattices, and
        the coarse lattice's D)."""
        return self.lattice.step / self.lattice.classes

    @property
    def window(self) -> int:
        """The largest order in lattice steps."""
        return self.lattice.window

    @property
    def initial_position(self) -> float:
        return float(self.positions[self.initial_index])

    @property
    def decision_steps(self) -> int:
        """T_dec = max(T - L, 0): the steps whose orders can still affect a counted cost (fewer when solved with
        `stages`)."""
        return self.action_value.shape[0]

    @property
    def cost_by_factor(self) -> np.ndarray:
        """Expected discounted cost over the T steps from the initial state, given F_0 = f_i: [M]."""
        return self.sunk + self.initial_value[:, self.initial_index]

    @property
    def expected_cost(self) -> float:
        """The optimum: E[sum_{t<T} gamma^t C_t] from the initial state, F_0 ~ N(0, 1) on the grid."""
        return float(self.grid.initial @ self.cost_by_factor)

    def summary(self) -> dict:
        """Plain numbers for a results summary (JSON)."""
        return {
            "expected_cost": self.expected_cost,
            "horizon": self.horizon,
            "factor_points": int(self.grid.points.size),
            "factor_width": float(self.grid.points[-1]),
            "lattice_step": self.delta,
            "exact_lattice": bool(self.exact_lattice),
            "positions": int(self.positions.size),
            "solve_seconds": self.solve_seconds,
        }


@dataclass
class _Problem:
    """What the backward pass needs for one item, whatever the setup cost (module docstring)."""

    instance: Instance
    horizon: int
    lead: int
    grid: FactorGrid
    lattice: Lattice
    pmf: np.ndarray  # [M, J+1] one period's demand on the multiples of the lattice step
    sums: list  # H_1..H_{L+1}
    x0: float
    low_unit: int
    upper: float  # the top of the domain (grows when an optimal target reaches it)
    reach_top: float = math.inf  # with `reach`: a top no value at x_0 depends on (docs/methods.md, "The domain's ends")
    tail: LawTail | None = None  # with cut laws: what pmf leaves beyond its points
    means: list | None = None  # with cut laws: the means [M] of H_1..H_{L+1} (units of stock)
    period_mean: np.ndarray | None = None  # with `reach`: one period's mean demand [M] of `demand_law`'s law


@dataclass(frozen=True)
class _Plan:
    """The item's factor grid, rates, dmax, lattice and domain, known before any demand law is built."""

    grid: FactorGrid
    rates: np.ndarray  # [M]
    dmax: int
    lattice: Lattice
    low_unit: int
    span: float  # domain_span: an upper bound on the domain's width
    tail: float  # the demand laws' truncation

    @property
    def widest_positions(self) -> int:
        """The lattice positions of the domain at its widest first size (`span`)."""
        return (math.ceil(self.span / self.lattice.step) + 2) * self.lattice.classes


def _plan(
    instance: Instance,
    factor_points: int = DEFAULT_FACTOR_POINTS,
    factor_width: float = DEFAULT_FACTOR_WIDTH,
    max_denominator: int = DEFAULT_MAX_DENOMINATOR,
    tail: float = DEFAULT_TAIL,
    integer_cap: bool = False,
    floor_periods: int | None = None,
    max_positions: int = MAX_POSITIONS,
    step: int | None = None,
) -> _Plan:
    """Everything about the item's DP that its settings fix before any demand law is built. The settings of `solve`, `expected_costs`,
    `check_item` and `item_span`: the factor grid (`factor_points` over +-`factor_width` stationary standard deviations), the
    lattice (`max_denominator`, `integer_cap`, `max_positions`, or the lattice step `step`: 1 is the exact lattice), the demand
    laws' truncation `tail` and the domain's floor `floor_periods`. Raises CapBelowStep when the cap is below one lattice step."""
    check_single_item(instance.n)
    lam, beta, qbar = (float(getattr(instance, k)[0]) for k in ("lam", "beta", "qbar"))  # beta = |beta_1| with loadings
    lead = int(instance.lead[0])
    x0 = float(instance.mu[0])
    floor_periods = lead + 1 if floor_periods is None else floor_periods
    grid = tauchen_grid(instance.rho, factor_points, factor_width)  # the chain of the item's exposure u_t
    rates = demand_rate(lam, beta, grid.points)
    dmax = demand_top(rates, item_overdispersion(instance), tail)
    cap = float(whole_cap(qbar, up=True)) if integer_cap else qbar
    span = domain_span(x0, cap, dmax, lead, floor_periods)
    if step is None:  # the item's own step, whatever the cap's relaxation and the domain's floor (`lattice_step`)
        spread = lead_time_spread(lam, item_overdispersion(instance), lead, beta, instance.rho)
        whole = whole_cap(qbar, up=True)
        units = domain_span(x0, whole, dmax, lead, 1)
        step = lattice_step(units, whole, spread, validate.integer(max_positions, f"{NAME} max_positions", 1))
    lattice = make_lattice(x0, qbar, max_denominator, integer_cap, validate.integer(step, f"{NAME} lattice step", 1))
    if lattice.window == 0:
        unit = lattice.step / lattice.classes
        raise CapBelowStep(
            f"{NAME}: its order cap qbar {qbar:g} is below one step of its lattice ({unit:g} units), so its DP cannot order; "
            f"give it a cap of at least {unit:g} (the cost table's qbar column, or the instance's items.qbar)"
        )
    low_unit = math.floor((min(x0, 0.0) - floor_periods * dmax) / lattice.step)
    return _Plan(grid, rates, dmax, lattice, low_unit, span, tail)


def item_span(instance: Instance, **settings) -> float:
    """`domain_span` of the item with `settings` (`solve`'s): an upper bound on the units its position domain spans,
    which its exact lattice would cover unit by unit."""
    return _plan(instance, **settings).span


def value_span(instance: Instance, horizon: int, **settings) -> float:
    """An upper bound on the units the domain of the value at x_0 (`expected_costs`, the certificate: `_prepare`'s `reach`)
    spans: `domain_span`, or `reach_ends` where they are narrower."""
    plan = _plan(instance, **settings)
    x0, floor_periods = float(instance.mu[0]), settings.get("floor_periods")
    lead = int(instance.lead[0])
    floor, top = reach_ends(x0, plan.lattice.cap, plan.lattice.step, max(horizon - lead, 0))
    old_floor = min(x0, 0.0) - (lead + 1 if floor_periods is None else floor_periods) * plan.dmax
    return min(plan.span, top - max(floor, old_floor))


def check_item(instance: Instance, horizon: int, setups: int = 1, stages: int | None = 0, **settings) -> Lattice:
    """Refuse (TooLarge), before any demand law or value is built, an item whose DP with `settings` (`solve`'s) would not fit in
    memory for `setups` setup costs at once with W_t kept for the first `stages` decision steps (None: every one), its domain
    at its widest first size (`domain_span`); or whose cap is below one lattice step (CapBelowStep). Returns the item's lattice."""
    validate.integer(horizon, f"{NAME} horizon", 1)
    plan = _plan(instance, **settings)
    positions = plan.widest_positions
    decision_steps = max(horizon - int(instance.lead[0]), 0)
    steps = decision_steps if stages is None else min(stages, decision_steps)
    check_size(instance, plan.grid.points.size, plan.dmax, plan.lattice, positions, setups, steps)
    return plan.lattice


SECONDS_PER_CELL = 1.2e-7
"""Seconds of the backward pass per setup cost x factor point x (position + one period's demand points) x decision
step. This and the three below are twice what this project's development machine (2 CPU cores) took on a warm run
(bench/dp_volumes.py's items: 54-62 ns here): a solve of gigabytes there took up to 1.9 times as long where its memory
was cold (bench/dp_estimate.py), and an estimate errs long, so that a long solve is never silent."""
SECONDS_PER_LAW_POINT = 1.6e-6
"""Seconds of one period's demand law per factor point x law point (two incomplete-beta evaluations each), on an item
of 121 factor points and 49,942 law points (lam 10,000, phi 10, beta 2): 4.7 s warm."""
SECONDS_PER_MIXED_POINT = 2e-9
"""Seconds of the lead-time sums H_2..H_{L+1} per factor point^2 x law point x sum_{j<=L} j (the chain's transition applied
to each longer law), on the same item: 6.8 s warm for L = 4."""
SECONDS_PER_LOSS_POINT = 1.4e-7
"""Seconds of the once-per-solve expected loss over the lead-time law, per factor point x (position + its law's points),
on the same item: about 6.4 s warm at 499,413 positions."""
LONG_SOLVE = 10.0
"""A solve estimated to take longer than this many seconds is announced, with a progress bar (`dp_optimal_policy`)."""


def estimated_seconds(instance: Instance, horizon: int, setups: int = 1, **settings) -> tuple[int, float]:
    """(positions, seconds): the size of the item's DP with `settings` (`solve`'s) at its widest first domain
    (`domain_span`), and about how long a solve takes for `setups` setup costs, every phase counted: the demand law
    (SECONDS_PER_LAW_POINT), the lead-time sums (SECONDS_PER_MIXED_POINT), the expected loss (SECONDS_PER_LOSS_POINT) and the
    backward pass (SECONDS_PER_CELL per setup cost)."""
    plan = _plan(instance, **settings)
    lead, points, positions = int(instance.lead[0]), plan.grid.points.size, plan.widest_positions
    law = -(-plan.dmax // plan.lattice.step) * plan.lattice.classes
    steps = max(horizon - lead, 0)
    seconds = (
        SECONDS_PER_LAW_POINT * points * law
        + SECONDS_PER_MIXED_POINT * points**2 * law * lead * (lead + 1) / 2
        + SECONDS_PER_LOSS_POINT * points * (positions + (lead + 1) * law)
        + SECONDS_PER_CELL * setups * points * (positions + law) * steps
    )
    return positions, seconds


def reach_ends(x0: float, cap: float, step: int, decision_steps: int) -> tuple[float, float]:
    """(floor, top) of the positions on which the value at x_0 is exact with no domain ends (docs/methods.md, "The domain's
    ends"): below -T_dec cap every position the item can still reach is at most 0, so V_t is linear there and the linear
    extrapolation is exact; above x_0 + T_dec cap no position reachable from x_0 lies, and V_0(x_0) depends on none."""
    return min(x0, -decision_steps * cap) - 2 * step, x0 + decision_steps * cap + 2 * step


def _prepare(instance: Instance, horizon: int, reach: bool = False, **settings) -> _Problem:
    """The item's problem. With `reach` (the value at x_0 alone: `expected_costs`, the certificate) the domain stops at
    `reach_ends` where they are narrower, and the demand laws are cut to the domain's width (`LawTail`)."""
    validate.integer(horizon, f"{NAME} horizon", 1)
    plan = _plan(instance, **settings)
    lattice, x0, lead = plan.lattice, float(instance.mu[0]), int(instance.lead[0])
    low_unit, points, reach_top = plan.low_unit, None, math.inf
    if reach:
        floor, reach_top = reach_ends(x0, lattice.cap, lattice.step, max(horizon - lead, 0))
        low_unit = max(low_unit, math.floor(floor / lattice.step))
        points = math.ceil(reach_top / lattice.step) - low_unit + 3  # every shift between two positions, and one more
        if points >= -(-plan.dmax // lattice.step) + 1:
            points = None
    # the domain's part below x_0 alone, one setup cost, no tables: a first check before the demand sums' convolutions
    below_x0 = lattice.positions(low_unit, math.ceil(x0 / lattice.step)).size
    check_size(instance, plan.grid.points.size, plan.dmax, lattice, below_x0, 1, 0)
    overdispersion = item_overdispersion(instance)
    pmf = demand_law(plan.rates, overdispersion, plan.tail, lattice.step, points)  # [M, J+1]
    sums = demand_sums(plan.grid, pmf, lead + 1, points)  # H_1..H_{L+1}
    tail = means = one = None
    if reach:
        one = law_means(plan.rates, overdispersion, plan.tail, lattice.step)
    if points is not None:
        tail, means = LawTail.of(pmf, one, lattice.step), sum_means(plan.grid, one, lead + 1)
    q_top = lattice.step * float(np.searchsorted(np.cumsum(sums[-1][-1]), 1.0 - 1e-9))
    upper = min(max(x0, q_top) + min(lattice.cap, q_top), reach_top)
    return _Problem(instance, int(horizon), lead, plan.grid, lattice, pmf, sums, x0, low_unit, upper, reach_top, tail, means, one)


def _solve(problem: _Problem, setups: np.ndarray, kept: int | None, progress: bool = False):
    """The backward pass for every setup cost at once, widening the domain until no optimal target
    touches its top, keeping W_t for the first `kept` decision steps (None: every one). Returns (positions [N],
    V_0 [G, M, N], W [kept, G, M, N], sunk [M], index of x_0)."""
    p = problem
    h, b = float(p.instance.h[0]), float(p.instance.b[0])
    for _ in range(32):
        positions = p.lattice.positions(p.low_unit, math.ceil(p.upper / p.lattice.step))
        decision_steps = max(p.horizon - p.lead, 0)
        steps = decision_steps if kept is None else min(kept, decision_steps)
        dmax = (p.pmf.shape[1] - 1) * p.lattice.step
        check_size(p.instance, p.grid.points.size, dmax, p.lattice, positions.size, len(setups), steps)
        lead_mean = None if p.means is None else p.means[-1]
        result = _backward(
            positions,
            p.lattice,
            p.grid,
            p.pmf,
            p.sums[-1],
            h,
            b,
            setups,
            p.instance.gamma,
            p.lead,
            decision_steps,
            steps,
            progress,
            p.tail,
            lead_mean,
        )
        if not result[2] or p.upper >= p.reach_top:
            break
        p.upper = min(p.upper + p.lattice.cap, p.reach_top)  # an optimal target touched the top of the domain: widen it and solve again
    else:
        lam, qbar = float(p.instance.lam[0]), float(p.instance.qbar[0])
        cause = (
            f": its order cap qbar {qbar:g} is below its mean demand lam {lam:g} per period, so its backlog grows without bound"
            if qbar < lam
            else ""
        )
        raise NoFiniteOptimum(f"{NAME}: optimal order-up-to positions exceed {p.upper:g}{cause}; the item has no finite optimal policy")
    initial_value, action_value, _ = result
    k0 = int(np.argmin(np.abs(positions - p.x0)))
    sunk = np.zeros(p.grid.points.size)
    for s in range(min(p.lead, p.horizon)):
        mean = None if p.means is None else p.means[s]
        sunk += p.instance.gamma**s * expected_loss(p.sums[s], positions[k0 : k0 + 1], h, b, p.lattice.step, mean)[:, 0]
    return positions, initial_value, action_value, sunk, k0


def solve(instance: Instance, horizon: int, setups=None, stages: int | None = None, progress: bool = False, **settings):
    """Solve the finite-horizon DP (module docstring) of a one-item instance over `horizon` steps from I_0 = lam (L + 1), P_0 = 0
    at setup cost K: a DPSolution, or with `setups` (a sequence of setup costs, one backward pass) a list of them. `settings`
    are `_plan`'s; `integer_cap` solves the relaxation with the cap ceil(qbar) (`make_lattice`), `floor_periods` puts the
    domain's bottom at min(x_0, 0) - floor_periods dmax (default L + 1). `stages` keeps W_t for the first that many decision
    steps only: such a solution is not a policy (DPOptimalPolicy refuses it)."""
    start = time.perf_counter()
    problem = _prepare(instance, horizon, **settings)
    costs = np.atleast_1d(np.asarray(instance.K if setups is None else setups, dtype=np.float64))
    positions, initial_value, action_value, sunk, k0 = _solve(problem, costs, stages, progress)
    seconds = (time.perf_counter() - start) / costs.size
    solutions = [
        DPSolution(
            instance,
            float(k),
            problem.horizon,
            problem.lead,
            problem.grid,
            problem.lattice,
            positions,
            action_value[:, g],
            initial_value[g],
            sunk,
            k0,
            seconds,
        )
        for g, k in enumerate(costs)
    ]
    return solutions[0] if setups is None else solutions


def expected_costs(instance: Instance, horizon: int, setups, **settings) -> np.ndarray:
    """The optimal expected cost for every setup cost in `setups` ([G]), from one backward pass that
    keeps no policy tables (the fast path of `solve`, with its settings)."""
    problem = _prepare(instance, horizon, reach=True, **settings)
    costs = np.atleast_1d(np.asarray(setups, dtype=np.float64))
    _, initial_value, _, sunk, k0 = _solve(problem, costs, 0)
    return (sunk[None, :] + initial_value[:, :, k0]) @ problem.grid.initial


def window_min(values: np.ndarray, window: int, out: np.ndarray | None = None) -> np.ndarray:
    """min of values[..., y] over y in [x, x + window] (clipped at the end) for every x: a running minimum in O(N) per row
    (scipy.ndimage's, its window of window + 1 points starting at x), into `out` if given. values: [..., N]."""
    return minimum_filter1d(values, window + 1, axis=-1, output=out, mode="constant", cval=np.inf, origin=-((window + 1) // 2))


def window_end(values: np.ndarray, window: int, share: float) -> np.ndarray:
    """values interpolated at the point `share` of a lattice step beyond [x, x + window] for every x (the last value
    beyond the domain's top): [..., N]."""
    last = np.concatenate([values[..., window:], np.repeat(values[..., -1:], window + 1, axis=-1)], axis=-1)  # [..., N + 1]
    return (1.0 - share) * last[..., : values.shape[-1]] + share * last[..., 1 : values.shape[-1] + 1]


class DemandExpectation:
    """E[values(.., y - D)] at every lattice position y of the last axis of values [.., N], D ~ pmf[m] ([M, J+1], on multiples
    of the lattice step) for the factor grid point m on the factor axis; positions below the domain extrapolated linearly
    (the slope over its lowest step). The expectation term of W_t (module docstring), for one item and for each axis of
    policies/joint_dp.py's joint lattice; the law's transform is taken once, for every call on N positions. With `tail`
    the law is cut (`LawTail`) where its rest lies below the domain from every position: its part is the extrapolating
    line at the rest's mean."""

    def __init__(self, lattice: Lattice, pmf: np.ndarray, positions: int, tail: LawTail | None = None):
        c, dmax = lattice.classes, pmf.shape[1] - 1
        self.lattice, self.N, self.tail = lattice, positions, tail
        self.pad = dmax * c  # lattice points below the domain that y - d can reach
        below = np.arange(-self.pad, 0)
        self.below = below // c + lattice.offsets[below % c] - lattice.offsets[0]  # [pad] in lattice steps
        # sum_d P(D_t = d | f_i) u(y - d) is a convolution along each class of the lattice: index pad + k = q c + r, and a
        # demand d moves q by d. `length` pads to a multiple of c.
        self.length = -(-(self.pad + positions) // c) * c
        # a circular convolution of Q = length / c points gives the outputs from dmax on exactly (what wraps around lands below)
        self.size = next_fast_len(self.length // c, real=True)  # 5-smooth: the real transforms are fastest there
        self.kernel = rfft(pmf, self.size, axis=1)  # the demand law's transform: [M, F]
        self.work = None  # `_work`'s arrays
        index = np.arange(positions)
        self.ahead = index // c + lattice.offsets[index % c] - lattice.offsets[0]  # [N] y - y0 in lattice steps

    def __call__(self, values: np.ndarray, factor_axis: int, out: np.ndarray | None = None) -> np.ndarray:
        """The expectation [.., N] of values [.., N] whose factor grid points lie along `factor_axis`. With `out` (another
        array than values) it is written there and the transforms reuse the arrays of the call before with the same shape:
        a backward pass allocates them once (without, they are the call's own: a joint DP's axes do not hold them)."""
        N, c, pad = self.N, self.lattice.classes, self.pad
        padded, spectrum, full = self._work(values.shape[:-1], keep=out is not None)  # padded: Q = length / c rows, then zeros
        flat = padded.reshape(*values.shape[:-1], self.size * c)
        flat[..., :pad] = values[..., :1] + (values[..., c : c + 1] - values[..., :1]) * self.below  # linear extrapolation below
        flat[..., pad : pad + N] = values
        shape = [1] * (values.ndim + 1)
        shape[factor_axis % values.ndim], shape[-2] = self.kernel.shape[0], -1
        np.fft.rfft(padded, axis=-2, out=spectrum)
        spectrum *= self.kernel.reshape(shape)  # M on the factor axis: [.., F, 1]
        np.fft.irfft(spectrum, self.size, axis=-2, out=full)
        expectation = full[..., : self.length // c, :].reshape(*values.shape[:-1], self.length)[..., pad : pad + N]
        if out is None:
            out = expectation  # a view of this call's own arrays, which nothing else holds
        else:
            out[...] = expectation
        if self.tail is not None:  # E[u(y - D); D >= J + 1 steps] = u0 P + slope (P (y - y0) - E[D; D >= J + 1]), all in lattice steps
            shape = [1] * values.ndim
            shape[factor_axis % values.ndim] = -1
            mass, moment = self.tail.mass.reshape(shape), self.tail.moment.reshape(shape)
            slope = values[..., c : c + 1] - values[..., :1]
            out += mass * values[..., :1]
            out += slope * (mass * self.ahead - moment)
        return out

    def _work(self, batch: tuple, keep: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The padded values (zero beyond the domain), their spectrum and the inverse transform for values of shape
        [*batch, N]; with `keep`, those of the last call that kept them where the shape is the same, else new ones kept."""
        if keep and self.work is not None and self.work[0].shape[:-2] == batch:
            return self.work
        c = self.lattice.classes
        arrays = (
            np.zeros((*batch, self.size, c)),
            np.empty((*batch, self.size // 2 + 1, c), dtype=np.complex128),
            np.empty((*batch, self.size, c)),
        )
        if keep:
            self.work = arrays
        return arrays


def _backward(
    positions, lattice, grid, pmf, lead_law, h, b, setups, gamma, lead, decision_steps, kept, progress=False, tail=None, lead_mean=None
):
    """The backward recursion on the lattice for every setup cost in `setups` at once (NumPy): [G] constants, or [G, T_dec, M]
    schedules, a setup cost for each decision step and factor grid point (policies/share_schedule.py).
    Returns V_0 [G, M, N], W [kept, G, M, N] (W_t of the first `kept` decision steps), and whether an optimal
    target reached the top of the domain. `tail` and `lead_mean`: the cut laws' rest (`_prepare`'s `reach`)."""
    G, M, N = setups.shape[0], grid.points.size, positions.size
    window = lattice.window
    charge = gamma**lead * expected_loss(lead_law, positions, h, b, lattice.step, lead_mean)  # gamma^L G(y, f): [M, N]
    costs = setups.reshape(G, 1, 1) if setups.ndim == 1 else setups[..., None]  # [G, 1, 1] or [G, T_dec, M, 1]
    edge = slice(max(N - 1 - window, 0), None)  # the positions whose windows reach the top of the domain
    action_value = np.empty((kept, G, M, N))
    # the pass's arrays, allocated once (a fresh array per step costs more in the allocator's page faults than in arithmetic)
    value, mixed, w, best = (np.zeros((G, M, N)) for _ in range(4))
    hit_top = False
    expectation = DemandExpectation(lattice, pmf, N, tail)
    stages = tqdm(range(decision_steps - 1, -1, -1), desc=f"{NAME}: {N:,} positions x {M} factor points", disable=not progress, leave=False)
    for t in stages:
        np.matmul(grid.transition, value, out=mixed)  # E[V_{t+1}(x, F_{t+1}) | F_t = f_i]: [G, M, N]
        expectation(mixed, factor_axis=1, out=w)
        w *= gamma
        w += charge
        window_min(w, window, out=best)
        if lattice.rest:  # the window's end at the cap, between its last lattice point and the next
            np.minimum(best, window_end(w, window, lattice.rest / lattice.step), out=best)
        setup = costs if setups.ndim == 1 else costs[:, t]
        if not hit_top:  # an order opens from a position whose window reaches the top, and the top is its best target
            hit_top = bool(((setup + best[..., edge] < w[..., edge]) & (best[..., edge] == w[..., -1:])).any())
        best += setup  # K + the window's best: the value of ordering
        np.minimum(w, best, out=value)
        if t < kept:
            action_value[t] = w
    return value, action_value, hit_top


# ---- the policy ----------------------------------------------------------------------------------


class DPOptimalPolicy:
    """The DP's decision rule (module docstring) as a policy (state, instance) -> (Y [B], Q [B, 1]), at the item's exposure
    u_t = TensorInstance.exposure(F_t). It counts its calls as the time step: call it once per step in time order and `reset()`
    it before every rollout (the evaluator does both); it never orders at t >= T - L. `interpolate=False` reads W_t at the
    nearest factor grid point instead of interpolating in F. Raises ValueError for a solution solved with `stages`."""

    def __init__(self, solution: DPSolution, interpolate: bool = True):
        if solution.decision_steps < max(solution.horizon - solution.lead, 0):
            kept = solution.decision_steps
            raise ValueError(f"{NAME}: the solution keeps W_t for {kept} decision steps only (solve's `stages`): not a policy")
        self.solution = solution
        self.interpolate = interpolate
        self.t = 0
        self._tables: dict = {}

    def reset(self) -> None:
        self.t = 0

    def _check(self, instance: TensorInstance) -> None:
        check_single_item(instance.n)
        inst = self.solution.instance
        ours = [float(getattr(inst, k)[0]) for k in ("h", "b", "lam", "beta", "lead", "qbar")] + [self.solution.setup, inst.gamma, inst.rho]
        theirs = [float(getattr(instance, k)[0]) for k in ("h", "b", "lam", "beta", "lead", "qbar")]
        theirs += [instance.K, instance.gamma, instance.rho]
        ours, theirs = ours + model_key(inst), theirs + model_key(instance)
        if len(ours) != len(theirs) or not np.allclose(ours, theirs, rtol=1e-5, atol=1e-6):
            raise InputError(f"{NAME}: the policy was solved for another instance ({ours} vs {theirs})")

    def _table(self, device):
        if device not in self._tables:
            sol = self.solution
            self._tables[device] = (
                torch.as_tensor(sol.action_value, device=device),  # [T_dec, M, N] float64
                torch.as_tensor(sol.grid.points, device=device),
                torch.as_tensor(sol.positions, device=device),
            )
        return self._tables[device]

    @torch.no_grad()
    def __call__(self, state: State, instance: TensorInstance):
        if self.t == 0:
            self._check(instance)
        sol = self.solution
        t = self.t
        if t >= sol.horizon:
            raise InputError(
                f"{NAME}: the policy was solved for a horizon of {sol.horizon} steps, called at step {t} (evaluate with "
                f"--horizon <= {sol.horizon}, or solve for a longer one)"
            )
        self.t += 1
        device, dtype = state.inv.device, state.inv.dtype
        batch = state.batch
        if t >= sol.decision_steps:  # an order placed now arrives after the last counted step
            return torch.zeros(batch, device=device, dtype=dtype), torch.zeros(batch, 1, device=device, dtype=dtype)
        table, points, positions = self._table(device)
        W = table[t]  # [M, N]
        M, N = W.shape
        flat = W.reshape(-1)
        position = state.inventory_position()[:, 0].double()  # [B]
        k = _nearest(positions, position)  # [B] nearest lattice point
        idx = k[:, None] + torch.arange(sol.window + 1, device=device)[None, :]  # the window [x, x + qbar]: [B, w+1]
        qbar = float(sol.instance.qbar[0])
        anchor = position.clamp_min(positions[0])  # below the domain: the cap measured from its first position
        inside = (idx < N) & (positions[idx.clamp_max(N - 1)] - anchor[:, None] <= qbar * (1 + 1e-9))  # the item's own cap
        idx = torch.cat([k[:, None], idx.clamp_max(N - 1)], dim=1)  # column 0: no order
        beyond = sol.lattice.step > 1 and qbar > sol.window * sol.lattice.step * (1 + 1e-9)
        if beyond:  # a coarse lattice whose window stops short of the cap: the cap's end, its value interpolated in x
            end = (anchor + qbar).clamp(positions[0], positions[-1])
            above = torch.searchsorted(positions, end).clamp(1, N - 1)
            share = (end - positions[above - 1]) / (positions[above] - positions[above - 1])
            idx = torch.cat([idx, (above - 1)[:, None], above[:, None]], dim=1)
        f = instance.exposure(state.factor)[:, 0].double().clamp(points[0], points[-1])  # [B] the item's exposure u_t
        if M == 1:
            values = flat[idx]
        elif self.interpolate:  # linear in F between the neighbouring grid points
            upper = torch.searchsorted(points, f).clamp(1, M - 1)  # [B]
            a = ((f - points[upper - 1]) / (points[upper] - points[upper - 1]))[:, None]
            values = (1 - a) * flat[(upper - 1)[:, None] * N + idx] + a * flat[upper[:, None] * N + idx]
        else:
            nearest = (f[:, None] - points[None, :]).abs().argmin(1)
            values = flat[nearest[:, None] * N + idx]
        stay = values[:, 0]
        best, offset = values[:, 1 : sol.window + 2].masked_fill(~inside, math.inf).min(1)
        target = positions[(k + offset).clamp_max(N - 1)]
        if beyond:
            at_end = (1 - share) * values[:, -2] + share * values[:, -1]
            target = torch.where(at_end < best, end, target)
            best = torch.minimum(best, at_end)
        opens = instance.K + best < stay
        quantity = torch.where(opens, target - position, torch.zeros_like(position))
        quantity = quantity.clamp(0.0, float(sol.instance.qbar[0]))
        return opens.to(dtype), quantity.to(dtype)[:, None]


def _nearest(positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Index of the lattice position nearest to each x (clamped to the domain): [B]."""
    upper = torch.searchsorted(positions, x).clamp(1, positions.numel() - 1)
    take_lower = (x - positions[upper - 1]) <= (positions[upper] - x)
    return torch.where(take_lower, upper - 1, upper)


def dp_optimal_policy(
    instance: Instance, horizon: int, device="cpu", progress: bool = False, **solve_kwargs
) -> tuple[DPOptimalPolicy, dict]:
    """Solve the DP and return (policy, parameters for the summary), like policies.classical.tuned_policy. With
    `progress`, a solve estimated to take more than LONG_SOLVE seconds says so first and shows its backward pass.
    An InputError for n > 1."""
    long = False
    if progress:
        positions, seconds = estimated_seconds(instance, horizon, **solve_kwargs)
        long = seconds > LONG_SOLVE
        if long:
            tqdm.write(f"{NAME}: a DP of about {positions:,} positions; about {seconds:,.0f} s to solve", file=sys.stderr)
    solution = solve(instance, horizon, progress=long, **solve_kwargs)
    return DPOptimalPolicy(solution), solution.summary()
