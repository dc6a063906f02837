"""The exact optimum of a small joint instance (n = 2 or 3 items under one factor): the finite-horizon DP of
policies/dp_optimal.py over the joint state (y_1, .., y_n, f), a policy and a figure.

Each item keeps its own lead-time reduction: decision t charges sum_i gamma^{L_i} G_i(y_i, F_t) over the items with
t + L_i < T (the others can no longer affect a counted step and do not order), and

    W_t(y, f) = sum_i gamma^{L_i} G_i(y_i, f) + gamma E[V_{t+1}(y - D_t, F_{t+1}) | F_t = f],
    V_t(x, f) = min( W_t(x, f),  K + min_{x <= y <= x + qbar} W_t(y, f) ),

the window a box, one side per item. Given F_t the items' demands are independent, so the expectation is one
convolution along each item's axis in turn, and the box minimum one window minimum along each axis in turn.

Each item lives on the two classes Z and x_0,i + Z with its cap in whole units, which hold the optimum exactly when the
cap is whole (docs/methods.md, "The n = 1 optimum"). A fractional cap would multiply the joint lattice by its classes,
so it is bracketed instead: `cap="raised"` solves with ceil(qbar) (a relaxation: a lower figure), `cap="lowered"` with
floor(qbar) (a policy the real caps allow: an upper figure). With whole caps both are the exact optimum. Each item's
domain is the item DP's (`dp_optimal._prepare`), widened while an optimal target touches its top.
The argument and the figures: docs/methods.md, "The exact joint optimum".
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from envs.dynamics import State
from envs.instance import Instance, TensorInstance
from plumbing import validate
from plumbing.errors import InputError
from policies import dp_optimal
from policies.decomposition import item_instance
from policies.dp_optimal import NAME, FactorGrid, NoFiniteOptimum, TooLarge, whole_cap

MAX_ITEMS = 3
"""The joint lattice grows as the product of the items' domains: beyond three items it does not fit."""
DEFAULT_FACTOR_POINTS = 41
"""Tauchen points of the joint DP (the n = 1 DP's 121 would multiply a joint lattice's size by three)."""
SWEEP_ITEMS = 2
"""A sweep's dp-optimal baseline runs at n <= SWEEP_ITEMS: three items of the paper's volumes exceed this machine's memory."""
CAPS = ("raised", "lowered")
WORK_ARRAYS = 12
"""Joint-state-sized float64 arrays the backward pass holds at once besides its tables (the value, its mixture, the padded
and transformed arrays of one axis's convolution, W, its box minimum, the new value and the top check)."""
SECONDS_PER_STATE = 1.4e-7
"""Seconds of the backward pass per joint state (factor points x positions) and decision step, measured on this
project's development machine (2 CPU cores, `python bench/joint_optimum.py`)."""
WIDENINGS = 8


def decision_steps(instance: Instance, horizon: int) -> int:
    """T_dec = max_i max(T - L_i, 0): the steps at which some item's order can still reach a counted step."""
    return max(max(horizon - int(lead), 0) for lead in instance.lead)


def whole_caps(instance: Instance) -> bool:
    """Whether every cap is a whole number of units (then the joint DP is the exact optimum, module docstring)."""
    return all(whole_cap(float(q), True) == whole_cap(float(q), False) for q in instance.qbar)


def check_joint(instance: Instance) -> None:
    """Refuse an instance the joint DP cannot solve, in one line: more than MAX_ITEMS items, or several factors."""
    if not 1 <= instance.n <= MAX_ITEMS:
        raise InputError(
            f"{NAME}: the exact DP exists for instances of 1 to {MAX_ITEMS} items (its joint lattice is the product of the "
            f"items' domains), got n = {instance.n}; the decomposition bound (platform/bound.py --kind decomposition) bounds larger ones"
        )
    if instance.n > 1 and instance.factors > 1:
        raise InputError(
            f"{NAME}: the joint DP's state holds one factor; this instance has {instance.factors} "
            "(an instance of 2 or 3 items needs one factor, or solve its items one at a time)"
        )


@dataclass
class _Axis:
    """One item's axis of the joint lattice: its DP problem (lattice with the chosen cap, domain, and demand laws on the
    joint factor grid: reversed for a negative loading) and its costs h, b."""

    problem: dp_optimal._Problem
    h: float
    b: float

    @property
    def lattice(self) -> dp_optimal.Lattice:
        return self.problem.lattice

    def positions(self) -> np.ndarray:
        return self.lattice.positions(self.problem.low_unit, math.ceil(self.problem.upper / self.lattice.step))


def _axes(instance: Instance, horizon: int, cap: str, factor_points: int, factor_width: float, floor_periods: int) -> list[_Axis]:
    """Each item's axis: the item DP's plan with its cap raised to whole units, then lowered where `cap` says so."""
    directions = instance.directions
    settings = {
        "factor_points": factor_points,
        "factor_width": factor_width,
        "integer_cap": True,
        "floor_periods": floor_periods,
        "step": 1,
    }
    axes = []
    for i in range(instance.n):
        problem = dp_optimal._prepare(item_instance(instance, i, 0.0), horizon, **settings)
        if cap == "lowered":
            whole = whole_cap(float(instance.qbar[i]), up=False)
            if whole < 1:
                raise dp_optimal.CapBelowStep(
                    f"{NAME}: {instance.item_name(i)}: its order cap qbar {instance.qbar[i]:g} is below one unit, so the joint "
                    "DP with whole-unit orders cannot order; give it a cap of at least 1"
                )
            lattice = dataclasses.replace(problem.lattice, cap=float(whole), window=whole * problem.lattice.classes)
            problem = dataclasses.replace(problem, lattice=lattice)
        if directions is not None and directions[i, 0] < 0:  # u_i = -F: on the symmetric grid, point j of u is point M-1-j of F
            problem = dataclasses.replace(problem, pmf=problem.pmf[::-1].copy(), sums=[s[::-1].copy() for s in problem.sums])
        axes.append(_Axis(problem, float(instance.h[i]), float(instance.b[i])))
    return axes


@dataclass
class JointSolution:
    """The solved joint DP over `horizon` steps: positions [n] arrays [N_i], action_value [T_dec, M, N_1, .., N_n] W_t in
    float32, half of float64's memory at a relative rounding of 6e-8 (None when solved without tables), initial_value
    [M, N_1, .., N_n] V_0, sunk [M] the expected discounted cost of every item's steps s < L_i from the initial state, by
    F_0 grid point, and `cap` ("raised" or "lowered", module docstring)."""

    instance: Instance
    horizon: int
    cap: str
    grid: FactorGrid
    positions: list[np.ndarray]
    windows: list[int]
    action_value: np.ndarray | None
    initial_value: np.ndarray
    sunk: np.ndarray
    initial_index: tuple[int, ...]
    solve_seconds: float

    @property
    def whole_caps(self) -> bool:
        """Every cap is a whole number of units: both caps' solutions are the exact optimum."""
        return whole_caps(self.instance)

    @property
    def decision_steps(self) -> int:
        return decision_steps(self.instance, self.horizon)

    @property
    def expected_cost(self) -> float:
        """E[sum_{t<T} gamma^t C_t] from the initial state under the DP's optimal policy, F_0 ~ N(0, 1) on the grid."""
        return float(self.grid.initial @ (self.sunk + self.initial_value[(slice(None), *self.initial_index)]))

    @property
    def states(self) -> int:
        return int(self.grid.points.size * np.prod([p.size for p in self.positions]))

    def summary(self) -> dict:
        return {
            "expected_cost": self.expected_cost,
            "caps": self.cap,
            "exact": self.whole_caps,
            "horizon": self.horizon,
            "factor_points": int(self.grid.points.size),
            "factor_width": float(self.grid.points[-1]),
            "states": self.states,
            "solve_seconds": self.solve_seconds,
        }


def _along(values: np.ndarray, axis: int, apply) -> np.ndarray:
    """`apply` ([R, N] -> [R, N]) along `axis` of `values`."""
    moved = np.moveaxis(values, axis, -1)
    shape = moved.shape
    return np.moveaxis(apply(moved.reshape(-1, shape[-1])).reshape(shape), -1, axis)


def _expectation(values: np.ndarray, axis: int, expectation: dp_optimal.DemandExpectation) -> np.ndarray:
    """E[values(.., y_a - D_a, ..) | F_t = f_m] along item a's axis (`axis` = 1 + a of [M, N_1, ..]), D_a ~ its law at f_m:
    the n = 1 DP's expectation (`expectation`, on that axis's lattice and law) along that axis."""
    return np.moveaxis(expectation(np.moveaxis(values, axis, -1), factor_axis=0), -1, axis)


def _box_min(values: np.ndarray, windows: list[int]) -> np.ndarray:
    """min of values over the box [x, x + windows] (clipped at the domain's top) for every x: one window minimum per axis."""
    for a, window in enumerate(windows):
        if window > 0:
            values = _along(values, 1 + a, lambda rows, w=window: dp_optimal.window_min(rows, w))
    return values


def plan_size(axes: list[_Axis], points: int, kept: int) -> tuple[int, int]:
    """(joint states, bytes) of a backward pass on `axes` with `points` factor points keeping `kept` steps' tables."""
    states = points * int(np.prod([axis.positions().size for axis in axes]))
    return states, 8 * states * WORK_ARRAYS + 4 * states * kept


def _check_size(instance: Instance, axes: list[_Axis], points: int, kept: int) -> None:
    states, need = plan_size(axes, points, kept)
    memory = dp_optimal.physical_memory()
    if need > memory / 2:
        sides = " x ".join(f"{axis.positions().size:,}" for axis in axes)
        raise TooLarge(
            f"{NAME}: the joint DP of {instance.n} items needs about {need / 2**30:.1f} GiB ({sides} positions x {points} factor points"
            f"{f' x {kept} steps of tables' if kept else ''}), above half of this machine's {memory / 2**30:.1f} GiB; fewer factor "
            "points or a shorter horizon make it fit"
        )


def estimated_seconds(
    instance: Instance, horizon: int, factor_points: int = DEFAULT_FACTOR_POINTS, factor_width: float = dp_optimal.DEFAULT_FACTOR_WIDTH
) -> tuple[int, float]:
    """(joint states, seconds): the size of the joint DP and about how long one backward pass takes (SECONDS_PER_STATE)."""
    check_joint(instance)
    states = plan_size(_axes(instance, horizon, CAPS[0], factor_points, factor_width, 1), factor_points, 0)[0]
    steps = decision_steps(instance, horizon)
    return states, SECONDS_PER_STATE * states * steps


def solve(
    instance: Instance,
    horizon: int,
    cap: str = CAPS[1],
    factor_points: int = DEFAULT_FACTOR_POINTS,
    factor_width: float = dp_optimal.DEFAULT_FACTOR_WIDTH,
    floor_periods: int = 1,
    tables: bool = True,
    progress: bool = False,
) -> JointSolution:
    """Solve the joint DP (module docstring) of an instance of 1 to MAX_ITEMS items under one factor over `horizon` steps from
    I_0 = lam (L + 1), P_0 = 0 at setup cost K, with each cap `cap` ("raised" or "lowered") to whole units and each domain's
    bottom floor_periods periods of demand below min(x_0, 0). `tables` keeps W_t for a policy. Raises TooLarge, with the
    figures, before allocating a pass that would take more than half of this machine's memory."""
    start = time.perf_counter()
    check_joint(instance)
    validate.integer(horizon, f"{NAME} horizon", 1)
    if cap not in CAPS:
        raise InputError(f"{NAME} cap: expected one of {list(CAPS)}, got {cap!r}")
    axes = _axes(instance, horizon, cap, factor_points, factor_width, floor_periods)
    grid = axes[0].problem.grid
    leads = [int(lead) for lead in instance.lead]
    steps = decision_steps(instance, horizon)
    for _ in range(WIDENINGS):
        _check_size(instance, axes, grid.points.size, steps if tables else 0)
        positions = [axis.positions() for axis in axes]
        value, action_value, hit = _backward(instance, axes, positions, grid, horizon, tables, progress)
        if not hit:
            break
        for a in hit:
            axes[a].problem.upper += axes[a].lattice.cap
    else:
        raise NoFiniteOptimum(f"{NAME}: optimal order-up-to positions keep reaching the top of the joint domain; no finite optimal policy")
    index = tuple(int(np.argmin(np.abs(p - axis.problem.x0))) for p, axis in zip(positions, axes))
    sunk = np.zeros(grid.points.size)
    for axis, p, k, lead in zip(axes, positions, index, leads):
        for s in range(min(lead, horizon)):
            sunk += instance.gamma**s * dp_optimal.expected_loss(axis.problem.sums[s], p[k : k + 1], axis.h, axis.b)[:, 0]
    windows = [axis.lattice.window for axis in axes]
    return JointSolution(instance, horizon, cap, grid, positions, windows, action_value, value, sunk, index, time.perf_counter() - start)


def _backward(instance, axes, positions, grid, horizon, tables, progress):
    """The backward recursion over the joint lattice. Returns V_0 [M, N_1, ..], W [T_dec, M, N_1, ..] (or None) and the axes
    on which an optimal target reached the top of the domain."""
    n, M, gamma, K = instance.n, grid.points.size, instance.gamma, instance.K
    shape = (M, *(p.size for p in positions))
    leads = [int(lead) for lead in instance.lead]
    last = decision_steps(instance, horizon)
    charges = []  # gamma^L_i G_i(y_i, f), shaped to broadcast along its axis: [M, 1.., N_i, 1..]
    for a, (axis, p) in enumerate(zip(axes, positions)):
        loss = dp_optimal.expected_loss(axis.problem.sums[leads[a]], p, axis.h, axis.b)
        charges.append((gamma ** leads[a] * loss).reshape(M, *(p.size if j == a else 1 for j in range(n))))
    expectations = [dp_optimal.DemandExpectation(axis.lattice, axis.problem.pmf, p.size) for axis, p in zip(axes, positions)]
    action_value = np.empty((last, *shape), dtype=np.float32) if tables else None
    value = np.zeros(shape)
    hit: set[int] = set()
    steps = tqdm(range(last - 1, -1, -1), desc=f"{NAME}: {np.prod(shape):,} joint states", disable=not progress, leave=False)
    for t in steps:
        active = [t + lead < horizon for lead in leads]
        mixed = np.tensordot(grid.transition, value, axes=(1, 0))  # E[V_{t+1}(y, F_{t+1}) | F_t = f_m]
        for a, expectation in enumerate(expectations):
            mixed = _expectation(mixed, 1 + a, expectation)
        w = gamma * mixed
        for a in range(n):
            if active[a]:
                w += charges[a]
        windows = [axis.lattice.window if on else 0 for axis, on in zip(axes, active)]
        best = _box_min(w, windows)
        opens = K + best < w
        value = np.where(opens, K + best, w)
        if tables:
            action_value[t] = w
        for a, window in enumerate(windows):  # a target strictly better on the domain's top along axis a than below it
            if window and a not in hit:
                N = shape[1 + a]
                slab = np.take(w, np.arange(max(N - 1 - window, 0), N), axis=1 + a)  # the states whose box reaches the top
                others = [0 if j == a else wj for j, wj in enumerate(windows)]
                face = _box_min(np.take(slab, [-1], axis=1 + a), others)
                inner = np.flip(np.take(slab, np.arange(slab.shape[1 + a] - 1), axis=1 + a), 1 + a)
                below = _box_min(np.flip(np.minimum.accumulate(inner, axis=1 + a), 1 + a), others)  # min over [x_a, top - 1]
                if (np.take(opens, np.arange(max(N - 1 - window, 0), N - 1), axis=1 + a) & (face < below)).any():
                    hit.add(a)
    return value, action_value, sorted(hit)


# ---- the policy ----------------------------------------------------------------------------------

GATHER_LIMIT = 1 << 24
"""A decision reads at most this many table values at once (the batch is cut into chunks)."""


class JointDPPolicy:
    """The joint DP's decision rule as a policy (state, instance) -> (Y [B], Q [B, n]): the box minimum of W_t, linear in F
    between grid points, at the nearest lattice point of each item's position. Like policies.dp_optimal.DPOptimalPolicy it
    counts its calls as the time step: `reset()` it before every rollout (the evaluator does)."""

    def __init__(self, solution: JointSolution):
        if solution.action_value is None:
            raise ValueError(f"{NAME}: the solution was solved without tables (solve's `tables`): not a policy")
        self.solution = solution
        self.t = 0
        self._tables: dict = {}

    def reset(self) -> None:
        self.t = 0

    def _check(self, instance: TensorInstance) -> None:
        ours = self.solution.instance
        same = instance.n == ours.n and all(
            np.allclose(getattr(instance, k).cpu().numpy(), getattr(ours, k), rtol=1e-5, atol=1e-6)
            for k in ("h", "b", "lam", "beta", "lead", "qbar")
        )
        same = same and np.allclose([instance.K, instance.gamma, instance.rho], [ours.K, ours.gamma, ours.rho], rtol=1e-5)
        theirs = None if instance.overdispersion is None else instance.overdispersion.cpu().numpy()
        same = same and (theirs is None) == (ours.overdispersion is None) and (theirs is None or np.allclose(theirs, ours.overdispersion))
        theirs = None if instance.directions is None else instance.directions.cpu().numpy()
        same = same and (theirs is None) == (ours.directions is None) and (theirs is None or np.allclose(theirs, ours.directions))
        if not same:
            raise InputError(f"{NAME}: the policy was solved for another instance")

    def _table(self, device):
        if device not in self._tables:
            sol = self.solution
            self._tables[device] = (
                torch.as_tensor(sol.action_value, device=device).reshape(sol.action_value.shape[0], sol.grid.points.size, -1),
                torch.as_tensor(sol.grid.points, device=device),
                [torch.as_tensor(p, device=device) for p in sol.positions],
            )
        return self._tables[device]

    @torch.no_grad()
    def __call__(self, state: State, instance: TensorInstance):
        if self.t == 0:
            self._check(instance)
        sol, t = self.solution, self.t
        if t >= sol.horizon:
            raise InputError(f"{NAME}: the policy was solved for a horizon of {sol.horizon} steps, called at step {t}")
        self.t += 1
        device, dtype, batch, n = state.inv.device, state.inv.dtype, state.batch, sol.instance.n
        if t >= sol.decision_steps:
            return torch.zeros(batch, device=device, dtype=dtype), torch.zeros(batch, n, device=device, dtype=dtype)
        table, points, positions = self._table(device)
        windows = [w if t + int(lead) < sol.horizon else 0 for w, lead in zip(sol.windows, sol.instance.lead)]
        box = torch.tensor(list(itertools.product(*(range(w + 1) for w in windows))), device=device)  # [P, n], row 0: no order
        position = state.inventory_position().double()  # [B, n]
        f = state.factor.double().clamp(points[0], points[-1])  # [B]
        opens = torch.zeros(batch, dtype=torch.bool, device=device)
        target = position.clone()
        chunk = max(1, GATHER_LIMIT // box.shape[0])
        for rows in torch.split(torch.arange(batch, device=device), chunk):
            opens[rows], target[rows] = self._decide(table[t], points, positions, box, position[rows], f[rows], float(sol.instance.K))
        qbar = torch.as_tensor(sol.instance.qbar, device=device)
        quantity = torch.where(opens[:, None], target - position, torch.zeros_like(position)).clamp(min=0.0).minimum(qbar)
        return opens.to(dtype), quantity.to(dtype)

    def _decide(self, W, points, positions, box, position, f, K):
        """(opens [b], targets [b, n]) of one chunk of states: W [M, prod N] at step t."""
        M = W.shape[0]
        sizes = [p.numel() for p in positions]
        strides = [int(np.prod(sizes[a + 1 :])) for a in range(len(sizes))]
        flat = torch.zeros(position.shape[0], box.shape[0], dtype=torch.long, device=position.device)
        inside = torch.ones_like(flat, dtype=torch.bool)
        index = []
        for a, p in enumerate(positions):
            k = dp_optimal._nearest(p, position[:, a].contiguous())
            idx = k[:, None] + box[None, :, a]  # [b, P]
            inside &= idx < sizes[a]
            idx = idx.clamp_max(sizes[a] - 1)
            index.append(idx)
            flat += idx * strides[a]
        if M == 1:
            values = W[0][flat]
        else:
            upper = torch.searchsorted(points, f).clamp(1, M - 1)
            share = ((f - points[upper - 1]) / (points[upper] - points[upper - 1]))[:, None]
            values = (1 - share) * W[upper - 1][torch.arange(f.shape[0])[:, None], flat] + share * W[upper][
                torch.arange(f.shape[0])[:, None], flat
            ]
        stay = values[:, 0]
        best, choice = values.masked_fill(~inside, math.inf).min(1)
        rows = torch.arange(choice.shape[0], device=choice.device)
        target = torch.stack([p[idx[rows, choice]] for p, idx in zip(positions, index)], dim=1)
        return K + best < stay, target


def lower_figure(parameters: dict) -> float | None:
    """What a dp-optimal summary's parameters prove below the optimum on its factor chain: the relaxation's value where caps
    are fractional (relaxed_expected_cost, the caps raised), else the optimum itself (the joint DP with whole caps; the item
    DP on its exact lattice, which keeps a fractional cap exactly); None for an item DP on a coarse lattice (an approximation)."""
    if "relaxed_expected_cost" in parameters:
        return float(parameters["relaxed_expected_cost"])
    if parameters.get("exact") or parameters.get("exact_lattice"):
        return float(parameters["expected_cost"])
    return None


def optimal_policy(instance: Instance, horizon: int, device="cpu", progress: bool = False):
    """(policy, parameters for a summary) of dp-optimal on `instance`: the n = 1 DP (policies.dp_optimal) for one item, the
    joint DP (`joint_optimal_policy`) for 2 to MAX_ITEMS; an InputError, with the sizes, for more."""
    if instance.n == 1:
        return dp_optimal.dp_optimal_policy(instance, horizon, device, progress=progress)
    return joint_optimal_policy(instance, horizon, progress=progress)


def joint_optimal_policy(instance: Instance, horizon: int, progress: bool = False, **settings) -> tuple[JointDPPolicy, dict]:
    """Solve the joint DP with the caps lowered (a policy the real caps allow) and return (policy, parameters for a summary):
    its value, and where a cap is fractional the relaxation's lower figure beside it (the caps raised). With `progress`, a solve
    estimated to take more than dp_optimal.LONG_SOLVE seconds says so first and shows its backward pass."""
    long, solves = False, 1 if whole_caps(instance) else 2
    if progress:
        states, seconds = estimated_seconds(instance, horizon, **settings)
        long = solves * seconds > dp_optimal.LONG_SOLVE
        if long:
            what = "one solve" if solves == 1 else "two solves: the caps lowered for the policy, raised for its lower figure"
            tqdm.write(f"{NAME}: a joint DP of about {states:,} states; about {solves * seconds:,.0f} s ({what})", file=sys.stderr)
    solution = solve(instance, horizon, CAPS[1], progress=long, **settings)
    summary = solution.summary()
    if solves == 2:
        summary["relaxed_expected_cost"] = solve(instance, horizon, CAPS[0], tables=False, progress=long, **settings).expected_cost
    return JointDPPolicy(solution), summary
