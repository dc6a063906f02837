"""The n = 1 dynamic-programming optimum (policies/dp_optimal.py) against independently derived numbers:
an exhaustive recursion over the original dynamics (no lead-time reduction, no lattice argument,
exact Poisson probabilities), Monte Carlo simulation of its own policy by the shared evaluator, and
the tuned classical policies on common paths."""

from __future__ import annotations

import dataclasses
import math
from functools import cache

import numpy as np
import pytest
import torch
from scipy import stats

from envs.dynamics import State, initial_state
from envs.evaluation import evaluate, paired_comparison
from envs.exogenous import sample_paths
from envs.instance import LMAX, Instance, paper_instance, with_factors
from plumbing.errors import InputError
from policies import dp_optimal
from policies.classical import RULES_OF
from policies.decomposition import DecompositionOptions, check_items, item_instance, item_values
from policies.dp_optimal import DPOptimalPolicy, solve

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def item(lead, lam, qbar, beta=0.0, h=1.0, b=6.0, K=3.0, gamma=0.9, rho=0.6, phi=None) -> Instance:
    overdispersion = None if phi is None else [phi]
    return Instance(
        h=[h], b=[b], lam=[lam], beta=[beta], lead=[lead], qbar=[qbar], K=K, gamma=gamma, rho=rho, overdispersion=overdispersion
    )


def gamma_poisson_pmf(mean: float, phi: float, tail: float) -> np.ndarray:
    """P(D = d) of Poisson(mean G), G ~ Gamma(shape 1/phi, scale phi), from the mixture's closed form
    Gamma(d + r) / (Gamma(r) d!) (r / (r + mean))^r (mean / (r + mean))^d with r = 1/phi, on 0..dmax where the
    upper tail is below `tail` or the terms below 1e-30 (no scipy parameterisation involved)."""
    r = 1.0 / phi
    pmf = []
    while not pmf or (1.0 - sum(pmf) > tail and pmf[-1] > 1e-30):
        d = len(pmf)
        log_pmf = math.lgamma(d + r) - math.lgamma(r) - math.lgamma(d + 1) + r * math.log(r / (r + mean)) + d * math.log(mean / (r + mean))
        pmf.append(math.exp(log_pmf))
    return np.array(pmf)


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
    I' = Z + P_1 (+ O if L = 1), P' = shift(P) + O in slot L - 1. Demand: the exact Poisson pmf, or with
    overdispersion the gamma-Poisson mixture's (`gamma_poisson_pmf`), on 0..dmax, dmax where the upper tail is
    below `tail`."""
    h, b, lam, beta, qbar = (float(getattr(inst, k)[0]) for k in ("h", "b", "lam", "beta", "qbar"))
    lead, K, gamma = int(inst.lead[0]), inst.K, inst.gamma
    quantities = [q_step * j for j in range(int(round(qbar / q_step)) + 1)]
    rates = [lam * math.exp(beta * fi - beta**2 / 2) for fi in f]
    if inst.overdispersion is None:
        dmax = int(stats.poisson.isf(tail, max(rates))) + 1
        pmf = [stats.poisson.pmf(np.arange(dmax + 1), r) for r in rates]
    else:  # negative binomial: the gamma-Poisson mixture, on a common support
        laws = [gamma_poisson_pmf(r, float(inst.overdispersion[0]), tail) for r in rates]
        dmax = max(p.size for p in laws) - 1
        pmf = [np.pad(p, (0, dmax + 1 - p.size)) for p in laws]
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


@pytest.mark.parametrize(
    "case",
    [
        # lead 1, i.i.d. demand (beta = 0), six steps: the DP's law against the mixture's closed form
        dict(inst=item(1, 0.8, 2.0, phi=1.0), horizon=6, q_step=0.5, points=1, width=1.0),
        # lead 2 with a moving factor: the mixture along the chain over the lead time
        dict(inst=item(2, 1.0, 2.0, beta=0.5, rho=0.6, phi=0.5), horizon=4, q_step=0.5, points=3, width=1.5),
    ],
    ids=["lead1-iid", "lead2-factor"],
)
def test_negative_binomial_dp_matches_exhaustive_recursion(case):
    """Overdispersion phi: the DP's value equals the exhaustive recursion with the gamma-Poisson mixture's pmf
    (written from its closed form, not scipy's (n, p)). Fails on a DP that keeps Poisson demand, swaps nbinom's
    p and 1 - p, takes phi for the shape 1/phi, or truncates the heavier tail at the Poisson's dmax (the mixture's
    1e-13 tail at lam 0.8, phi 1 lies near 28, the Poisson's near 15)."""
    inst, horizon, q_step, points = case["inst"], case["horizon"], case["q_step"], case["points"]
    f, trans, init = tauchen(inst.rho, points, case["width"]) if points > 1 else (np.zeros(1), np.ones((1, 1)), np.ones(1))
    pmf = gamma_poisson_pmf(2.0, 0.5, 1e-16)
    d = np.arange(pmf.size)
    assert pmf @ d == pytest.approx(2.0) and pmf @ (d - 2.0) ** 2 == pytest.approx(2.0 + 0.5 * 2.0**2)  # mean, rate + phi rate^2
    expected = brute_force(inst, horizon, q_step, f, trans, init)
    grid = {"factor_points": points if inst.beta[0] > 0 else 5, "factor_width": case["width"]}
    sol = solve(inst, horizon, **grid)
    assert sol.expected_cost == pytest.approx(expected, rel=1e-9)
    poisson = solve(dataclasses.replace(inst, overdispersion=None), horizon, **grid)
    assert sol.expected_cost > 1.05 * poisson.expected_cost  # the control: overdispersion costs, so Poisson demand would fail above


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
    classical, _ = tuned(inst, "classical-best", RULES_OF["classical-best"], 50)
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


# ---- 4. overdispersion and several factors -------------------------------------------------------


def test_overdispersion_tending_to_zero_is_the_poisson_dp():
    """phi -> 0: the negative binomial tends to the Poisson law, and the DP's value to the Poisson DP's (phi = 1e-7:
    within 1e-5 relative); phi = 0 is stored as Poisson and gives the Poisson DP's tables bit for bit. Fails on a
    law that is not continuous at phi = 0 (e.g. shape phi in place of 1/phi, or variance rate + phi rate)."""
    base = dict(lead=2, lam=3.0, qbar=10.0, beta=0.5, K=8.0, rho=0.7)
    poisson = solve(item(**base), 12, factor_points=9)
    assert solve(item(**base, phi=1e-7), 12, factor_points=9).expected_cost == pytest.approx(poisson.expected_cost, rel=1e-5)
    np.testing.assert_array_equal(solve(item(**base, phi=0.0), 12, factor_points=9).action_value, poisson.action_value)


def signed_item(phi: float | None) -> Instance:
    """One item on k = 3 factors with signed loadings of norm 0.5, h 1, b 9, lam 3, lead 2, qbar 12."""
    return Instance(
        h=[1.0],
        b=[9.0],
        lam=[3.0],
        beta=None,
        loadings=[[0.3, -0.4, 0.0]],
        lead=[2],
        qbar=[12.0],
        K=8.0,
        gamma=0.95,
        rho=0.8,
        overdispersion=None if phi is None else [phi],
    )


def test_signed_loadings_on_three_factors_solve_the_one_factor_item_at_its_exposure():
    """k = 3, loadings (0.3, -0.4, 0): the item sees the factors through u = (0.6, -0.8, 0) . F, an AR(1) with the
    same rho, so its DP is the one-factor DP with beta = 0.5 (tables equal), and the policy on states with F in R^3
    decides as the one-factor policy at factor u (the slow reference here). Fails on a policy that reads F_1, the
    loadings' sum or |u|, and the one-factor policy is refused on the k = 3 instance (its model differs)."""
    several = signed_item(0.3)
    one = item(2, 3.0, 12.0, beta=0.5, b=9.0, K=8.0, gamma=0.95, rho=0.8, phi=0.3)
    sol = solve(several, 10, factor_points=11)
    np.testing.assert_array_equal(sol.action_value, solve(one, 10, factor_points=11).action_value)
    generator = torch.Generator().manual_seed(0)
    factor = torch.randn(256, 3, generator=generator, dtype=torch.float64)
    inventory = torch.randint(-4, 16, (256, 1), generator=generator).double()
    pipe = torch.zeros(256, 1, LMAX - 1, dtype=torch.float64)
    exposure = factor @ torch.tensor([0.6, -0.8, 0.0], dtype=torch.float64)
    ours = DPOptimalPolicy(sol)(State(inventory, pipe, factor), several.to_torch(dtype=torch.float64))
    theirs = DPOptimalPolicy(solve(one, 10, factor_points=11))(State(inventory, pipe, exposure), one.to_torch(dtype=torch.float64))
    assert 0.1 < ours[0].mean() < 0.9  # both kinds of decision
    torch.testing.assert_close(ours[0], theirs[0], rtol=0, atol=0)
    torch.testing.assert_close(ours[1], theirs[1], rtol=0, atol=0)
    with pytest.raises(InputError, match="solved for another instance"):
        DPOptimalPolicy(solve(one, 10, factor_points=11))(State(inventory, pipe, factor), several.to_torch(dtype=torch.float64))


def test_negative_binomial_value_agrees_with_simulation_on_three_factors():
    """k = 3 signed loadings, phi = 0.3: the DP's value equals the mean cost of its own policy on paths drawn by the
    simulator (F in R^3, the gamma-Poisson draw of envs.demand_law.draw_demand) within 3 s.e. plus twice the grid's
    error, as in the Poisson checks above. Fails when the DP's law, or the factor the policy reads, is not the
    simulator's (measured: value 169.3, simulated 171.8 +- 1.9; the Poisson DP's value 137.2)."""
    inst = signed_item(0.3)
    coarse = solve(inst, 20, factor_points=21)
    fine = solve(inst, 20, factor_points=41)
    discretisation = abs(coarse.expected_cost - fine.expected_cost)
    result = evaluate(DPOptimalPolicy(fine), inst.to_torch(), sample_paths(inst, 5, 3000, 20))
    assert abs(result.mean - fine.expected_cost) <= 3 * result.se + 2 * discretisation, (result.mean, result.se, fine.expected_cost)
    poisson = solve(signed_item(None), 20, factor_points=41)
    assert result.mean - poisson.expected_cost > 3 * result.se + 2 * discretisation  # the control: the Poisson DP fails the check


def test_expected_loss_equals_the_dense_sum():
    """The cumulative-sum form of E[h (y - S)^+ + b (S - y)^+] against the direct sum over the support, at positions
    below, inside and above the support and at fractional ones (an off-by-one in k(y) shifts every integer position)."""
    rng = np.random.default_rng(3)
    law = rng.random((3, 40))
    law /= law.sum(1, keepdims=True)
    positions = np.sort(np.concatenate([rng.uniform(-20.0, 60.0, 50), np.arange(-3.0, 45.0)]))
    gap = positions[:, None] - np.arange(40.0)[None, :]
    dense = law @ (2.0 * np.clip(gap, 0.0, None) + 7.0 * np.clip(-gap, 0.0, None)).T
    np.testing.assert_allclose(dp_optimal.expected_loss(law, positions, 2.0, 7.0), dense, rtol=1e-12, atol=1e-10)


def test_a_dp_larger_than_half_the_memory_is_refused_before_it_is_built(monkeypatch):
    """With the machine's memory taken as 64 MiB, a negative-binomial item's DP on its exact lattice (phi = 5: one
    period's demand reaches thousands of units) is refused in one error naming its overdispersion, while its coarse
    lattice (the default) fits; with 1 MiB the bound's check of every item (before Ray starts) refuses naming the item
    and what to change; the same item without overdispersion still solves on its exact lattice."""
    monkeypatch.setattr(dp_optimal, "physical_memory", lambda: 64 * 2**20)
    heavy = with_factors(paper_instance(2, seed=11), 1, 5.0, 0)
    one = item_instance(heavy, 1, 10.0)
    with pytest.raises(
        dp_optimal.TooLarge,
        match=r"above half of this machine's 0\.1 GiB: with lam .* and overdispersion phi 5 one period's demand reaches",
    ):
        dp_optimal.solve(one, horizon=12, factor_points=21, step=1)
    assert dp_optimal.check_item(one, 12, factor_points=21).step > 1
    assert dp_optimal.solve(one, horizon=12, factor_points=21).expected_cost > 0
    monkeypatch.setattr(dp_optimal, "physical_memory", lambda: 2**20)
    with pytest.raises(InputError, match=r"^--instance 'i\.json': item 0: dp-optimal: its DP needs about .* fewer factor points"):
        check_items(heavy, 12, DecompositionOptions(), "--instance 'i.json'")
    with pytest.raises(InputError, match=r"^item 1: dp-optimal: its DP needs about"):
        item_values(heavy, 1, [10.0], 12, 21, DecompositionOptions())
    monkeypatch.setattr(dp_optimal, "physical_memory", lambda: 64 * 2**20)
    poisson = dp_optimal.solve(item_instance(paper_instance(2, seed=11), 1, 10.0), horizon=12, factor_points=21)
    assert poisson.exact_lattice and poisson.expected_cost > 0
