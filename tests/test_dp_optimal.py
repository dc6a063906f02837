"""The n = 1 dynamic-programming optimum (policies/dp_optimal.py) against independently derived numbers:
an exhaustive recursion over the original dynamics (no lead-time reduction, no lattice argument,
exact Poisson probabilities), Monte Carlo simulation of its own policy by the shared evaluator, and
the tuned classical policies on common paths."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
import torch
from scipy import stats

from envs.dynamics import initial_state
from envs.errors import InputError
from envs.evaluation import evaluate, paired_comparison
from envs.exogenous import sample_paths
from envs.instance import Instance, paper_instance
from policies.dp_optimal import DPOptimalPolicy, solve

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def item(lead, lam, qbar, beta=0.0, h=1.0, b=6.0, K=3.0, gamma=0.9, rho=0.6) -> Instance:
    return Instance(h=[h], b=[b], lam=[lam], beta=[beta], lead=[lead], qbar=[qbar], K=K, gamma=gamma, rho=rho)


def tauchen(rho: float, points: int, width: float):
    """The documented factor chain, written out again: equally spaced points over [-width, width],
    cells split at midpoints, N(rho f, 1 - rho^2) mass of each cell; F_0 by the N(0, 1) mass."""
    f = np.linspace(-width, width, points)
    cuts = (f[1:] + f[:-1]) / 2
    s = math.sqrt(1 - rho**2)
    trans = np.empty((points, points))
    for i in range(points):
        cdf = np.concatenate([[0.0], stats.norm.cdf((cuts - rho * f[i]) / s), [1.0]])
        trans[i] = np.diff(cdf)
    init = np.diff(np.concatenate([[0.0], stats.norm.cdf(cuts), [1.0]]))
    return f, trans, init


def brute_force(inst: Instance, horizon: int, q_step: float, f, trans, init, tail: float = 1e-16) -> float:
    """min over all policies of E[sum_{t<T} gamma^t C_t] from I_0 = lam (L + 1), P_0 = 0, by a memoised
    exhaustive recursion over the original state (I, P_1..P_{L-1}, factor index) and the actions
    Y in {0, 1}, Q in {0, q_step, ..., qbar}; one step is the paper's: cost on Z = I - D, then
    I' = Z + P_1 (+ O if L = 1), P' = shift(P) + O in slot L - 1. Demand: the exact Poisson pmf on
    0..dmax, dmax where the upper tail is below `tail`."""
    h, b, lam, beta, qbar = (float(getattr(inst, k)[0]) for k in ("h", "b", "lam", "beta", "qbar"))
    lead, K, gamma = int(inst.lead[0]), inst.K, inst.gamma
    quantities = [q_step * j for j in range(int(round(qbar / q_step)) + 1)]
    rates = [lam * math.exp(beta * fi - beta**2 / 2) for fi in f]
    dmax = int(stats.poisson.isf(tail, max(rates))) + 1
    pmf = [stats.poisson.pmf(np.arange(dmax + 1), r) for r in rates]
    assert all(1 - p.sum() < 1e-14 for p in pmf)

    @cache
    def next_value(t: int, inv: float, pipe: tuple, i: int) -> float:
        """E[J(t, inv, pipe, F_t) | F_{t-1} = f_i]."""
        return sum(trans[i, j] * cost_to_go(t, inv, pipe, j) for j in range(len(f)) if trans[i, j] > 0)

    @cache
    def cost_to_go(t: int, inv: float, pipe: tuple, i: int) -> float:
        if t == horizon:
            return 0.0
        best = math.inf
        for open_order, quantity in [(0, 0.0)] + [(1, q) for q in quantities]:
            executed = open_order * quantity
            total = K * open_order
            for d in range(dmax + 1):
                z = inv - d
                if lead == 1:
                    inv_next, pipe_next = z + executed, ()
                else:
                    inv_next, pipe_next = z + pipe[0], pipe[1:] + (executed,)
                stage = h * max(z, 0.0) + b * max(-z, 0.0)
                total += pmf[i][d] * (stage + gamma * next_value(t + 1, inv_next, pipe_next, i))
            best = min(best, total)
        return best

    x0 = lam * (lead + 1)
    return sum(init[i] * cost_to_go(0, x0, (0.0,) * (lead - 1), i) for i in range(len(f)))


# ---- 2. exact optimum on tiny cases ----------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        # lead 1, fractional start and cap: x_0 = qbar = 2.5, the DP's lattice is 0.5 Z; the brute force
        # searches quantities on 0.25 Z (finer than the lattice), the factor is irrelevant (beta = 0)
        dict(inst=item(1, 1.25, 2.5), horizon=4, q_step=0.25, points=1, width=2.0),
        # lead 2 with a moving factor: the demand over the lead time is a mixture along the chain
        dict(inst=item(2, 1.0, 2.0, beta=0.5, rho=0.6), horizon=4, q_step=0.5, points=3, width=1.5),
        # lead 3: the optimal first order (up to 4, Q = 2) is below the cap; quantities searched on 0.5 Z
        dict(inst=item(3, 0.5, 3.0, K=2.0, b=9.0), horizon=5, q_step=0.5, points=1, width=1.0),
    ],
    ids=["lead1-fractional", "lead2-factor", "lead3"],
)
def test_dp_matches_exhaustive_recursion(case):
    inst, horizon, q_step = case["inst"], case["horizon"], case["q_step"]
    points = case["points"]
    f, trans, init = tauchen(inst.rho, points, case["width"]) if points > 1 else (np.zeros(1), np.ones((1, 1)), np.ones(1))
    expected = brute_force(inst, horizon, q_step, f, trans, init)
    # beta = 0: the factor is irrelevant, so the DP may use any grid (it runs with 5 points to exercise the mixing)
    sol = solve(inst, horizon, factor_points=points if inst.beta[0] > 0 else 5, factor_width=case["width"])
    assert sol.exact_lattice
    assert sol.expected_cost == pytest.approx(expected, rel=1e-9)


def test_integer_quantities_alone_are_not_optimal_from_a_fractional_start():
    """The reason for the 1/m lattice: from x_0 = 2.5 integer order quantities keep the position
    fractional, and the optimum over integer quantities is strictly worse than the DP's value."""
    inst = item(1, 1.25, 2.5)
    f, trans, init = np.zeros(1), np.ones((1, 1)), np.ones(1)
    integer_only = brute_force(inst, 4, 1.0, f, trans, init)
    sol = solve(inst, 4, factor_points=1)
    assert sol.delta == 0.5
    assert integer_only > sol.expected_cost + 1e-3


# ---- 1. the DP's value against the simulated cost of its own policy -------------------------------


def test_value_agrees_with_simulated_cost_on_the_paper_instance():
    """Tolerance: 3 Monte Carlo standard errors (4,000 episodes of the evaluator, with continuous F)
    plus 2 |V(41) - V(81)|: the Tauchen error is O(grid step^2), so the error of V(81) is about
    |V(41) - V(81)| / 3 (Richardson; measured: V(41) = 476.52, V(81) = 476.11, V(401) = 476.01); the
    factor 2 also covers the policy's interpolation between grid points (its decision is the DP's
    optimum only at grid points)."""
    inst = paper_instance(1, 0)
    coarse = solve(inst, 50, factor_points=41)
    fine = solve(inst, 50, factor_points=81)
    assert fine.exact_lattice and fine.delta == pytest.approx(0.2)  # x_0 = qbar = 24.8
    discretisation = abs(coarse.expected_cost - fine.expected_cost)
    assert discretisation < 1.0  # measured 0.41 (of ~476)
    paths = sample_paths(inst, 31, 4000, 50)
    result = evaluate(DPOptimalPolicy(fine), inst.to_torch(), paths)
    tolerance = 3 * result.se + 2 * discretisation
    assert abs(result.mean - fine.expected_cost) <= tolerance, (result.mean, result.se, fine.expected_cost, tolerance)


@pytest.mark.parametrize("lead", [1, 2, 3, 4])
def test_value_agrees_with_simulation_for_every_lead(lead):
    """The same check at T = 20 on a single item with a strong factor (beta = 0.5), for L = 1..4."""
    inst = item(lead, 3.0, 12.0, beta=0.5, h=1.0, b=9.0, K=8.0, gamma=0.95, rho=0.8)
    coarse = solve(inst, 20, factor_points=21)
    fine = solve(inst, 20, factor_points=41)
    discretisation = abs(coarse.expected_cost - fine.expected_cost)
    result = evaluate(DPOptimalPolicy(fine), inst.to_torch(), sample_paths(inst, 5, 3000, 20))
    assert abs(result.mean - fine.expected_cost) <= 3 * result.se + 2 * discretisation


def test_horizon_handling_and_sunk_costs():
    """With T <= L no order can reach a counted step: the value is the sunk cost of holding I_0
    against the demand, which the policy never changes (it never orders)."""
    inst = item(3, 2.0, 8.0, beta=0.0)
    sol = solve(inst, 3, factor_points=1)
    assert sol.decision_steps == 0
    x0, gamma = 8.0, 0.9
    expected = 0.0
    for s in range(3):  # D_0 + ... + D_s ~ Poisson(2 (s + 1))
        d = np.arange(200)
        p = stats.poisson.pmf(d, 2.0 * (s + 1))
        expected += gamma**s * float(p @ (1.0 * np.clip(x0 - d, 0, None) + 6.0 * np.clip(d - x0, 0, None)))
    assert sol.expected_cost == pytest.approx(expected, rel=1e-10)
    policy = DPOptimalPolicy(sol)
    tinst = inst.to_torch()
    state = initial_state(tinst, torch.zeros(4))
    for _ in range(3):
        open_order, quantity = policy(state, tinst)
        assert open_order.sum() == 0 and quantity.sum() == 0
    with pytest.raises(InputError, match="horizon of 3 steps"):
        policy(state, tinst)
    policy.reset()
    policy(state, tinst)


# ---- 3. against the tuned classical policies, and n > 1 -------------------------------------------


def test_no_worse_than_classical_best_on_common_paths(tuned):
    """At n = 1 the DP is the optimum: on common paths (not the held-out seed) it is not worse than the
    tuned classical-best (paired 95% CI), and its mean is below (measured: -2.55 +- 0.11 on 20,000
    episodes at T = 50)."""
    inst = paper_instance(1, 0)
    tinst = inst.to_torch()
    paths = sample_paths(inst, 41, 2000, 50)
    dp = evaluate(DPOptimalPolicy(solve(inst, 50, factor_points=61)), tinst, paths)
    classical, _ = tuned(inst, "classical-best", 50)
    reference = evaluate(classical, tinst, paths)
    comparison = paired_comparison(dp.discounted_cost, reference.discounted_cost)
    assert comparison.ci_low < 0
    assert comparison.mean_difference < 0, comparison


def test_more_than_one_item_is_refused():
    with pytest.raises(InputError, match=r"^dp-optimal: the exact DP exists for one item \(n = 1\), got n = 4$"):
        solve(paper_instance(4, 0), 50)
    policy = DPOptimalPolicy(solve(paper_instance(1, 0), 5, factor_points=5))
    tinst = paper_instance(4, 0).to_torch()
    with pytest.raises(InputError, match=r"got n = 4"):
        policy(initial_state(tinst, torch.zeros(2)), tinst)


def test_lattice_choice():
    """delta = 1/m for the smallest m making m x_0 and m qbar integers; otherwise a flagged restriction
    to x_0 + 0.1 Z with quantities <= floor(qbar / 0.1) 0.1 (feasible, not proven optimal)."""
    assert solve(item(1, 2.0, 8.0), 3, factor_points=1).delta == 1.0
    assert solve(item(2, 1.25, 5.0), 3, factor_points=1).delta == 0.25  # x_0 = 3.75
    inexact = solve(item(2, 1.234, 4.936), 3, factor_points=1)
    assert not inexact.exact_lattice and inexact.delta == pytest.approx(0.1) and inexact.window == 49
    assert inexact.initial_position == pytest.approx(3 * 1.234)
