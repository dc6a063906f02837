"""A proven lower bound on one item's DP optimum from a coarse lattice (docs/methods.md, "The certificate").

The item's problem is policies/dp_optimal.py's with the cap q = ceil(qbar), whose optimum over real order quantities
is its exact-lattice value V. On the positions a_j = j D (D the item's lattice step, dp_optimal.lattice_step) this
module computes numbers l_t(a_j) whose piecewise-linear interpolant L_t satisfies L_t <= T L_{t+1} at every real
position, T the exact Bellman operator; so L_t <= V_t (T is monotone, L = V = 0 after the last decision), and L_0 at
x_0 is a lower bound on V with no estimate in it. The five steps (exact expectations at lattice points, the sag margins
between them `_margins`, the charge, the minimum with the cap's partial step, the domain's ends `_below_floor` and
`_above_top`) are argued in the docs. Shared with the exact DP and so outside what it bounds: the Tauchen chain and the
demand laws' 1e-13 tails.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.fft import next_fast_len, rfft

from envs.demand_law import demand_rate, period_laws
from envs.instance import Instance
from plumbing.errors import InputError
from policies import dp_optimal


class _Expectation:
    """Lower bounds of E[u(z - D_t) | F_t = f_i] at the positions a_0 < ... < a_{N-1} (step D) for functions u [G, M, N]
    continued below a_0 by a line of a given slope: the expectation at the lattice points less the sag margins between
    them (module docstring, points 1-2). Both are convolutions along the positions, of u and of its kinks, done in one
    FFT; the part of a cut law beyond its points (`dp_optimal.LawTail`) lies on the line, at its mean."""

    def __init__(self, split: np.ndarray, open_cells: np.ndarray, positions: int, step: int, tail: dp_optimal.LawTail | None):
        self.J = split.shape[1] - 1  # the (cut) law reaches J lattice steps
        self.N = positions
        self.step = step
        # a circular convolution of J + N points gives the N outputs from J on exactly: what wraps around lands below J
        self.size = next_fast_len(positions + self.J, real=True)
        self.kernels = rfft(np.stack([split, open_cells]), self.size, axis=-1)[:, None]  # [2, 1, M, F]: the law, the open cells
        self.tail = tail
        self.work = None  # `_work`'s arrays

    def __call__(self, values: np.ndarray, slope: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The lower bound at every position: [G, M, N], u = values on the positions and values[..., 0] + slope (x - a_0)
        below (slope [M, 1] per lattice step); into `out` (another array than values) if given."""
        J, N = self.J, self.N
        work, spectrum, full = self._work(values.shape[:-1])
        work[0, ..., :J] = values[..., :1] + slope * np.arange(-J, 0)  # u below a_0
        work[0, ..., J : J + N] = values
        # u's kinks c_k+ (the convex part of its slope changes): at a_0 where the line meets the first cell, then at a_1..a_{N-2}
        work[1, ..., J] = np.clip(values[..., 1] - values[..., 0] - slope[..., 0], 0.0, None) / self.step
        work[1, ..., J + 1 : J + N - 1] = np.clip(values[..., 2:] - 2 * values[..., 1:-1] + values[..., :-2], 0.0, None) / self.step
        np.fft.rfft(work, axis=-1, out=spectrum)
        spectrum *= self.kernels
        np.fft.irfft(spectrum, self.size, axis=-1, out=full)
        expectation, kinks = full[..., J : J + N]
        if self.tail is not None:  # the law's rest beyond J steps: below a_0 from every position, on the line at its mean
            mass, moment = self.tail.mass[:, None], self.tail.moment[:, None]  # [M, 1]
            expectation += mass * values[..., :1]
            expectation += slope * (mass * np.arange(N) - moment)
        return np.subtract(expectation, _margins(kinks, self.step), out=out)

    def _work(self, batch: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The two channels (zero where nothing is written), their spectra and inverse transforms for values of shape
        [*batch, N], kept for the next call of that shape."""
        if self.work is None or self.work[0].shape[1:-1] != batch:
            self.work = (
                np.zeros((2, *batch, self.size)),
                np.empty((2, *batch, self.size // 2 + 1), dtype=np.complex128),
                np.empty((2, *batch, self.size)),
            )
        return self.work


def _margins(kinks: np.ndarray, step: int) -> np.ndarray:
    """How far below its chord E u(z - D_t) can sag in each cell, taken at each lattice point as the larger of its two cells
    ([G, M, N]), from `kinks`, the expectation of u's kinks over the open cells' masses (zeros where D = 1: integer demands
    put no kink inside a unit cell)."""
    sag = 0.25 * step * np.clip(kinks, 0.0, None)  # cell j = (a_j, a_{j+1})
    return np.maximum(sag, np.concatenate([sag[..., :1], sag[..., :-1]], axis=-1))


def open_cell_masses(rates: np.ndarray, overdispersion: float, step: int, cells: int) -> np.ndarray:
    """P(m D < D_t < (m + 1) D | rate) for m = 0..cells - 1 at each rate ([M] -> [M, cells]); zeros for D = 1."""
    if step == 1:
        return np.zeros((rates.size, cells))
    law = period_laws(rates, overdispersion)[0]
    edges = step * np.arange(cells + 1)[None, :]
    return np.clip(law.cdf(edges[:, 1:] - 1) - law.cdf(edges[:, :-1]), 0.0, None)


def _interpolate(values: np.ndarray, positions: np.ndarray, x: float) -> np.ndarray:
    """values [..., N] interpolated linearly at x (inside the positions)."""
    k = int(np.clip(np.searchsorted(positions, x, side="right") - 1, 0, positions.size - 2))
    a = (x - positions[k]) / (positions[k + 1] - positions[k])
    return (1.0 - a) * values[..., k] + a * values[..., k + 1]


def _bellman_min(
    omega: np.ndarray, setups: np.ndarray, window: int, rest: int, step: int, beyond: np.ndarray | None = None
) -> tuple[np.ndarray, bool]:
    """Lower bounds at the lattice points of min(W(x), K + min_{x <= y <= x + q} W(y)) for the interpolant of omega
    [G, M, N], q = window D + rest (module docstring, point 4), and `beyond` [M] a lower bound on W above the top of
    the domain (`_above_top`), taken wherever a window can pass the top (None: windows clipped there, no bound). Returns
    the values and whether an order's best target inside the domain is its top (the domain should grow)."""
    N = omega.shape[-1]
    top = slice(max(N - 1 - window, 0), None)  # windows (and the pieces on either side of a lattice point) that can pass the top
    cost = setups[:, None, None]
    inside = dp_optimal.window_min(omega, window)  # min omega_{j..j+w}
    best = inside
    if rest:
        share = rest / step
        best = np.minimum(inside, dp_optimal.window_end(omega, window, share))  # the window's end a_{j+w} + r
    # the domain should grow where an order's best target inside it is its top (the old criterion: a lower bound
    # `beyond` below the top's values would otherwise call for widening at every step, up to the reach)
    touches = bool(((cost + best[..., top] < omega[..., top]) & (best[..., top] >= omega[..., -1:])).any())
    if beyond is not None:
        np.minimum(best[..., top], beyond[None, :, None], out=best[..., top])
    best += cost
    value = np.minimum(omega, best)
    if rest:
        # the break point p = a_{j+1} - r of cell j, where a_{j+w+1} enters the window
        inner = share * omega[..., :-1] + (1.0 - share) * omega[..., 1:]  # omega(p)
        reach = inside[..., 1:]  # min omega_{j+1..j+w+1}
        if beyond is not None:  # a window from either side of p passes the top where j + w + 1 >= N - 1
            edge = slice(max(N - 2 - window, 0), None)
            np.minimum(reach[..., edge], beyond[None, :, None], out=reach[..., edge])
        at_p = np.minimum(inner, cost + np.minimum(inner, reach))
        line = share * value[..., :-1] + (1.0 - share) * value[..., 1:]
        excess = np.clip(line - at_p, 0.0, None)  # [G, M, N-1] per cell
        lower = np.zeros_like(value)
        lower[..., :-1] = excess
        lower[..., 1:] = np.maximum(lower[..., 1:], excess)
        value -= lower
    return value, touches


def _below_floor(ahead: list[np.ndarray], x: float, b: float, gamma: float, lead: int, cap: float) -> tuple[np.ndarray, np.ndarray]:
    """A lower bound on E[V_{t+1}(x, F_{t+1}) | F_t = f] at x and its left slope ([M] each), V_{t+1} the optimum with
    len(ahead) decisions left: every position after ordering at step t + 1 + n is at most x + (n + 1) q less the demand
    since, so its charge is at least gamma^L b (E[S] - that)^+, and by Jensen's inequality
        B(x) = gamma^L b sum_n gamma^n (E[D_{t+1} + ... + D_{t+1+n+L} | F_t = f] - x - (n + 1) q)^+,
    convex in x: B(x') >= B(x) + B'(x-) (x' - x) below x (docs/methods.md, "The domain's ends"). `ahead` [n] the
    conditional means of those sums."""
    value, slope = np.zeros_like(ahead[0]) if ahead else 0.0, 0.0
    for n, mean in enumerate(ahead):
        gap = mean - x - (n + 1) * cap
        weight = gamma**lead * b * gamma**n
        value = value + weight * np.clip(gap, 0.0, None)
        slope = slope - weight * (gap >= 0)
    return value, slope


def _above_top(means: list[np.ndarray], y: float, h: float, gamma: float, lead: int) -> np.ndarray:
    """A lower bound [M] on W_t(y', f) for every y' >= y: every later position is at least y' less the demand since, so
    W_t(y', f) >= gamma^L h sum_n gamma^n (y - E[D_t + ... + D_{t+n+L} | F_t = f])^+ (Jensen's inequality; increasing
    in y'), `means` [n] the conditional means of those sums."""
    return sum(gamma**lead * h * gamma**n * np.clip(y - mean, 0.0, None) for n, mean in enumerate(means))


CERTIFICATE_TAIL = 1e-6
"""The certificate's domain spans the demand that the factor's stationary law exceeds with at most this probability
(`stationary_quantile`)."""


def stationary_quantile(law: np.ndarray, weights: np.ndarray, step: int) -> float:
    """The least multiple of the step that a demand (law [M, K] on the multiples of `step` given each factor point, the
    factor at its stationary weights [M]) exceeds with probability at most CERTIFICATE_TAIL; infinite where the law's points
    do not reach it (a cut law). The certificate's domain ends there where dp_optimal's reach further: its continuations
    beyond either end are provably low (module docstring), so the ends move how tight it is, never whether it holds."""
    beyond = weights @ (1.0 - np.cumsum(law, axis=1))  # P(demand > k D) for k = 0..K-1
    reached = np.nonzero(beyond <= CERTIFICATE_TAIL)[0]
    return step * float(reached[0]) if reached.size else math.inf


CERTIFICATE_GAP = 0.005
"""`certified_costs` refines the step while its bound lies more than this fraction below the DP's value."""
CERTIFICATE_AIM = 0.75
"""... to the step at which the gap would be this fraction of CERTIFICATE_GAP (`finer_step`)."""
CERTIFICATE_POSITIONS = 40_000
"""... as long as the finer lattice has at most this many positions (five times the most a DP's own lattice has)."""


def finer_step(steps: list[int], gaps: list[float]) -> int | None:
    """The next step of `certified_costs` after bounds `gaps` (fractions of the value) below the value on the lattices of
    `steps`, from gap(D) = a + c D^2: the sag margins shrink with the square of the step, and a, the part that does not (the
    DP's own value is coarse too), is 0 after one step and fitted to the last two after more. The step where the gap would
    be CERTIFICATE_AIM x CERTIFICATE_GAP, at least one unit finer and at least 1; None where a alone is that much."""
    step, gap = steps[-1], gaps[-1]
    floor, curvature = 0.0, gap / step**2
    if len(steps) > 1:
        curvature = (gaps[-2] - gap) / (steps[-2] ** 2 - step**2)
        floor = max(gap - curvature * step**2, 0.0)
    aim = CERTIFICATE_AIM * CERTIFICATE_GAP
    if curvature <= 0.0 or floor >= aim:
        return None
    return max(1, min(step - 1, math.floor(math.sqrt((aim - floor) / curvature))))


def certified_costs(instance: Instance, horizon: int, setups, reference=None, **settings) -> np.ndarray:
    """A lower bound [G] on the item's exact-lattice optimum with its cap raised to ceil(qbar) (the bound's relaxation), for each
    setup cost in `setups`, on the lattice step the item's DP uses with `settings` (dp_optimal.solve's; integer_cap implied).
    The positions are the DP's first domain. With `reference` (the DP's values at `setups`), while the bound is more than
    CERTIFICATE_GAP below them: the domain first grows where an order's best target was its top, then the step is refined
    (`finer_step`; to the exact lattice where refining would not reach it) as long as the finer lattice has at most
    CERTIFICATE_POSITIONS positions."""
    settings = {**settings, "integer_cap": True}
    step = dp_optimal._plan(instance, **settings).lattice.step
    bound, touched = _certified(instance, horizon, setups, {**settings, "step": step}, widen=False)
    if reference is None:
        return bound
    reference = np.atleast_1d(np.asarray(reference, dtype=np.float64))
    units = dp_optimal.value_span(instance, horizon, **settings)

    def gap(bound: np.ndarray) -> float:  # the largest shortfall below the reference, a fraction of it
        return float(np.max((reference - bound) / np.abs(reference)))

    if touched and gap(bound) > CERTIFICATE_GAP:  # an order's best target was the domain's top: first a wider domain
        bound = np.maximum(bound, _certified(instance, horizon, setups, {**settings, "step": step})[0])
    steps, gaps = [step], [gap(bound)]
    while step > 1 and gaps[-1] > CERTIFICATE_GAP:
        finer = finer_step(steps, gaps)
        if finer is None:  # refining does not remove the gap; the exact lattice (step 1: the optimum itself) does
            finer = 1
        if units / finer > CERTIFICATE_POSITIONS:
            break
        step = finer
        steps.append(step)
        # every step's bound is valid: keep the largest
        bound = np.maximum(bound, _certified(instance, horizon, setups, {**settings, "step": step})[0])
        gaps.append(gap(bound))
    return bound


def _certified(instance: Instance, horizon: int, setups, settings: dict, widen: bool = True) -> tuple[np.ndarray, bool]:
    """`certified_costs` on the lattice of settings["step"], and whether an order's best target was the domain's top. With
    `widen` the domain grows while one is (up to `reach_ends`' top): tighter, never needed for the proof."""
    if settings["step"] == 1:  # the exact lattice: its value is the optimum
        return dp_optimal.expected_costs(instance, horizon, setups, **settings), False
    problem = dp_optimal._prepare(instance, horizon, reach=True, **settings)
    step, grid = problem.lattice.step, problem.grid
    h, b, gamma, lead, x0 = float(instance.h[0]), float(instance.b[0]), instance.gamma, problem.lead, problem.x0
    window, rest, cap = problem.lattice.window, problem.lattice.rest, problem.lattice.cap  # the cap ceil(qbar), kept whole
    rates = demand_rate(float(instance.lam[0]), float(instance.beta[0]), grid.points)
    overdispersion = dp_optimal.item_overdispersion(instance)
    open_cells = open_cell_masses(rates, overdispersion, step, problem.pmf.shape[1])
    costs = np.atleast_1d(np.asarray(setups, dtype=np.float64))
    if np.any(costs < 0):
        raise InputError(f"{dp_optimal.NAME}: the certificate needs setup costs >= 0, got {costs.min():g}")
    decision_steps = max(horizon - lead, 0)
    # E[D_t + ... + D_{t+k-1} | F_t] and E[D_{t+1} + ... + D_{t+k} | F_t], k = 1..T_dec + L
    from_now = dp_optimal.sum_means(grid, problem.period_mean, decision_steps + lead + 1)
    from_next = dp_optimal.sum_means(grid, problem.period_mean, decision_steps + lead + 1, first=1)
    # dp_optimal's domain on the multiples of D, its ends drawn in to the stationary law's quantiles: the floor one
    # period's demand below min(x_0, 0), the top as dp_optimal's with the demand over the lead time and one period
    floor = min(x0, 0.0) - stationary_quantile(problem.pmf, grid.initial, step)
    low = problem.low_unit if math.isinf(floor) else max(problem.low_unit, math.floor(floor / step))
    lead_demand = stationary_quantile(problem.sums[-1], grid.initial, step)
    high = math.ceil(min(problem.upper, max(x0, lead_demand) + min(cap, lead_demand)) / step) + 1
    for _ in range(32):
        positions = step * np.arange(low, high + 1, dtype=np.float64)
        pmf, cells, tail = problem.pmf, open_cells, problem.tail
        if positions.size + 2 < pmf.shape[1]:  # what lies beyond every shift between two positions is below a_0 from each
            pmf, cells = pmf[:, : positions.size + 2], open_cells[:, : positions.size + 2]
            tail = dp_optimal.LawTail.of(pmf, problem.period_mean, step)
        dmax = (pmf.shape[1] - 1) * step
        dp_optimal.check_size(instance, grid.points.size, dmax, problem.lattice, positions.size, costs.size, 0)
        expect = _Expectation(pmf, cells, positions.size, step, tail)
        loss = (h * np.clip(positions, 0.0, None) + b * np.clip(-positions, 0.0, None))[None, None, :]  # the kink at 0
        charges = []
        u = np.broadcast_to(loss, (1, grid.points.size, positions.size))
        below = np.full((grid.points.size, 1), -b * step)  # the loss and its expectations are b (E S - z) below 0 > a_0
        for _period in range(lead + 1):
            u = grid.transition @ u if charges else u
            u = expect(u, below)
            charges.append(u[0])  # lower bounds of E[g(y - D_t - ... - D_{t+l})]: [M, N]
        value, mixed, omega = (np.zeros((costs.size, grid.points.size, positions.size)) for _ in range(3))
        charge = gamma**lead * charges[-1][None]
        grows = False
        for t in range(decision_steps - 1, -1, -1):
            np.matmul(grid.transition, value, out=mixed)  # E[L_{t+1}(x, F_{t+1}) | F_t = f_i]
            # below the floor: the line of the bound B's left slope from min(L, B) at a_0 (`_below_floor`)
            left = [from_next[n + lead] for n in range(decision_steps - t - 1)]
            floor_value, floor_slope = _below_floor(left, positions[0], b, gamma, lead, cap)
            if positions[0] > -len(left) * cap:  # above the region where V_{t+1} is linear (there B's slope is its own)
                mixed[..., 0] = np.minimum(mixed[..., 0], floor_value)
            slope = np.broadcast_to(np.asarray(floor_slope, dtype=np.float64) * step, (grid.points.size,))[:, None]
            expect(mixed, slope, out=omega)
            omega *= gamma
            omega += charge
            beyond = _above_top([from_now[n + lead] for n in range(decision_steps - t)], positions[-1], h, gamma, lead)
            value, touches = _bellman_min(omega, costs, window, rest, step, beyond=beyond)
            grows = grows or touches
        if not (grows and widen) or positions[-1] >= problem.reach_top:
            break
        # an optimal target touched the top of the domain: widen it (tighter; the proof does not need it), up to the reach
        high = min(high + math.ceil(cap / step) + 1, math.ceil(problem.reach_top / step) + 1)
    else:
        raise dp_optimal.NoFiniteOptimum(f"{dp_optimal.NAME}: optimal order-up-to positions exceed {positions[-1]:g}; no finite optimum")
    sunk = sum(gamma**s * _interpolate(charges[s], positions, x0) for s in range(min(lead, horizon)))
    start = _interpolate(value, positions, x0)  # [G, M]
    return (start + sunk) @ grid.initial, grows
