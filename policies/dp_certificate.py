"""A proven lower bound on one item's DP optimum from a coarse lattice (docs/methods.md, "The certificate").

The item's problem is policies/dp_optimal.py's with the cap q = ceil(qbar), whose optimum over real order quantities
is its exact-lattice value V. On the positions a_j = j D (D the item's lattice step, dp_optimal.lattice_step) this
module computes numbers l_t(a_j) whose piecewise-linear interpolant L_t satisfies L_t <= T L_{t+1} at every real
position, T the exact Bellman operator; so L_t <= V_t (T is monotone, L = V = 0 after the last decision), and L_0 at
x_0 is a lower bound on V with no estimate in it. The four steps (exact expectations at lattice points, the sag margins
between them `_margins`, the charge, the minimum with the cap's partial step) are argued in the docs. Shared with the
exact DP and so outside what it bounds: the Tauchen chain, the demand laws' 1e-13 tails, the extrapolation below the
domain and its top.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.fft import irfft, next_fast_len, rfft

from envs.demand_law import demand_rate, period_laws
from envs.instance import Instance
from policies import dp_optimal


class _Expectation:
    """E[u(a_j - D_t) | F_t = f_i] for functions u [G, M, N] on the positions a_0 < ... < a_{N-1} (step D), linear below
    a_0 (extrapolated from the first cell), by FFT along the positions; and the same convolution with the open cells'
    masses for the margins (module docstring, points 1-2)."""

    def __init__(self, split: np.ndarray, open_cells: np.ndarray, positions: int):
        self.J = split.shape[1] - 1  # the demand reaches J lattice steps
        self.N = positions
        self.size = next_fast_len(positions + self.J + split.shape[1])
        self.kernel = rfft(split, self.size, axis=1)[None]  # [1, M, F]
        self.open_kernel = rfft(open_cells, self.size, axis=1)[None]

    def _convolve(self, padded: np.ndarray, kernel: np.ndarray) -> np.ndarray:
        return irfft(rfft(padded, self.size, axis=-1) * kernel, self.size, axis=-1)[..., self.J : self.J + self.N]

    def __call__(self, values: np.ndarray) -> np.ndarray:
        """E u(a_j - D_t) at every position: [G, M, N]."""
        below = np.arange(-self.J, 0)  # lattice steps below a_0
        padded = np.empty(values.shape[:-1] + (self.J + self.N,))
        padded[..., : self.J] = values[..., :1] + (values[..., 1:2] - values[..., :1]) * below
        padded[..., self.J :] = values
        return self._convolve(padded, self.kernel)

    def margins(self, values: np.ndarray, step: int) -> np.ndarray:
        """How far below its chord E u(z - D_t) can sag in each cell, taken at each lattice point as the larger of its
        two cells: [G, M, N] (zeros where D = 1: integer demands put no kink inside a unit cell)."""
        kinks = np.zeros(values.shape[:-1] + (self.J + self.N,))
        convex = np.clip(values[..., 2:] - 2 * values[..., 1:-1] + values[..., :-2], 0.0, None) / step  # c_k+ at a_1..a_{N-2}
        kinks[..., self.J + 1 : self.J + self.N - 1] = convex
        sag = 0.25 * step * np.clip(self._convolve(kinks, self.open_kernel), 0.0, None)  # cell j = (a_j, a_{j+1})
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


def _bellman_min(omega: np.ndarray, setups: np.ndarray, window: int, rest: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower bounds at the lattice points of min(W(x), K + min_{x <= y <= x + q} W(y)) for the interpolant of omega
    [G, M, N], q = window D + rest (module docstring, point 4); windows clipped at the top of the domain. Returns the
    values and where an order's best target is the top of the domain (the domain must grow)."""
    G, M, N = omega.shape
    inside = dp_optimal.window_min(omega.reshape(G * M, N), window).reshape(G, M, N)  # min omega_{j..j+w}
    best = inside
    if rest:
        share = rest / step
        best = np.minimum(best, dp_optimal.window_end(omega, window, share))  # the window's end a_{j+w} + r
    cost = setups[:, None, None]
    value = np.minimum(omega, cost + best)
    if rest:
        # the break point p = a_{j+1} - r of cell j, where a_{j+w+1} enters the window
        inner = share * omega[..., :-1] + (1.0 - share) * omega[..., 1:]  # omega(p)
        reach = inside[..., 1:]  # min omega_{j+1..j+w+1}
        at_p = np.minimum(inner, cost + np.minimum(inner, reach))
        line = share * value[..., :-1] + (1.0 - share) * value[..., 1:]
        excess = np.clip(line - at_p, 0.0, None)  # [G, M, N-1] per cell
        lower = np.zeros_like(value)
        lower[..., :-1] = excess
        lower[..., 1:] = np.maximum(lower[..., 1:], excess)
        value = value - lower
    top = np.arange(N) + window >= N - 1
    touches = (cost + best < omega) & top & (best >= omega[..., -1:])
    return value, touches


CERTIFICATE_GAP = 0.005
"""`certified_costs` halves the step while its bound lies more than this fraction below the DP's value."""
CERTIFICATE_POSITIONS = 40_000
"""... as long as the finer lattice has at most this many positions (five times the most a DP's own lattice has)."""


def certified_costs(instance: Instance, horizon: int, setups, reference=None, **settings) -> np.ndarray:
    """A lower bound [G] on the item's exact-lattice optimum with its cap raised to ceil(qbar) (the bound's relaxation), for each
    setup cost in `setups`, on the lattice step the item's DP uses with `settings` (dp_optimal.solve's; integer_cap implied).
    With `reference` (the DP's values at `setups`), the step is halved while the bound is more than CERTIFICATE_GAP below them
    and the finer lattice has at most CERTIFICATE_POSITIONS positions."""
    settings = {**settings, "integer_cap": True}
    step = dp_optimal._plan(instance, **settings).lattice.step
    bound = _certified(instance, horizon, setups, {**settings, "step": step})
    if reference is None:
        return bound
    reference = np.atleast_1d(np.asarray(reference, dtype=np.float64))
    units = dp_optimal.item_span(instance, **settings)
    while step > 1 and np.any(reference - bound > CERTIFICATE_GAP * np.abs(reference)) and units / (step // 2) <= CERTIFICATE_POSITIONS:
        step //= 2
        # every step's bound is valid, and the sag margins shrink with the square of the step: keep the largest
        bound = np.maximum(bound, _certified(instance, horizon, setups, {**settings, "step": step}))
    return bound


def _certified(instance: Instance, horizon: int, setups, settings: dict) -> np.ndarray:
    """`certified_costs` on the lattice of settings["step"]."""
    if settings["step"] == 1:  # the exact lattice: its value is the optimum
        return dp_optimal.expected_costs(instance, horizon, setups, **settings)
    problem = dp_optimal._prepare(instance, horizon, **settings)
    step, grid = problem.lattice.step, problem.grid
    h, b, gamma, lead, x0 = float(instance.h[0]), float(instance.b[0]), instance.gamma, problem.lead, problem.x0
    window, rest, cap = problem.lattice.window, problem.lattice.rest, problem.lattice.cap  # the cap ceil(qbar), kept whole
    rates = demand_rate(float(instance.lam[0]), float(instance.beta[0]), grid.points)
    open_cells = open_cell_masses(rates, dp_optimal.item_overdispersion(instance), step, problem.pmf.shape[1])
    costs = np.atleast_1d(np.asarray(setups, dtype=np.float64))
    low, high = problem.low_unit, math.ceil(problem.upper / step) + 1  # dp_optimal's domain, on the multiples of D
    decision_steps = max(horizon - lead, 0)
    for _ in range(32):
        positions = step * np.arange(low, high + 1, dtype=np.float64)
        dmax = (problem.pmf.shape[1] - 1) * step
        dp_optimal.check_size(instance, grid.points.size, dmax, problem.lattice, positions.size, costs.size, 0)
        expect = _Expectation(problem.pmf, open_cells, positions.size)
        loss = (h * np.clip(positions, 0.0, None) + b * np.clip(-positions, 0.0, None))[None, None, :]  # the kink at 0
        charges = []
        u = np.broadcast_to(loss, (1, grid.points.size, positions.size))
        for _period in range(lead + 1):
            u = grid.transition @ u if charges else u
            u = expect(u) - expect.margins(u, step)
            charges.append(u[0])  # lower bounds of E[g(y - D_t - ... - D_{t+l})]: [M, N]
        value = np.zeros((costs.size, grid.points.size, positions.size))
        grows = False
        for _t in range(decision_steps - 1, -1, -1):
            mixed = grid.transition @ value  # E[L_{t+1}(x, F_{t+1}) | F_t = f_i]
            omega = gamma**lead * charges[-1][None] + gamma * (expect(mixed) - expect.margins(mixed, step))
            value, touches = _bellman_min(omega, costs, window, rest, step)
            grows = grows or bool(touches.any())
        if not grows:
            break
        high += math.ceil(cap / step) + 1  # an optimal target touched the top of the domain: widen it and start again
    else:
        raise dp_optimal.NoFiniteOptimum(f"{dp_optimal.NAME}: optimal order-up-to positions exceed {positions[-1]:g}; no finite optimum")
    sunk = sum(gamma**s * _interpolate(charges[s], positions, x0) for s in range(min(lead, horizon)))
    start = _interpolate(value, positions, x0)  # [G, M]
    return (start + sunk) @ grid.initial
