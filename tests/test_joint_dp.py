"""The exact joint optimum of small instances (policies/joint_dp.py) against independently derived numbers: an
exhaustive recursion over the original dynamics (inventories and pipelines, every joint action, items of different
leads), the n = 1 DP at one item, the sum of the items' DPs at K = 0, and the simulated cost of its own policy; and the
decomposition bound below it on random two-item instances."""

from __future__ import annotations

import dataclasses
import itertools
import math
from functools import cache

import numpy as np
import pytest
from scipy import stats

from envs.evaluation import evaluate
from envs.exogenous import sample_paths
from envs.instance import Instance, paper_instance
from plumbing.errors import InputError
from policies import dp_optimal, group_bound, information_bound, joint_dp, share_schedule
from policies.decomposition import DecompositionOptions, item_instance, item_values, search_split

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def exhaustive(inst: Instance, horizon: int, q_step: float, factor_points: int, factor_width: float, tail: float = 1e-4) -> float:
    """min over all policies of E[sum_{t<T} gamma^t C_t] from I_0 = lam (L + 1), P_0 = 0 by a memoised recursion over the
    original state (I_i, in-transit slots of each item, factor index) and every joint action: Y in {0, 1}, each Q_i in
    {0, q_step, .., qbar_i}. One step is the paper's: the cost K Y + sum_i h_i Z_i^+ + b_i Z_i^- on Z = I - D, then the
    slot-1 arrival, the shift, and the order into slot L_i - 1 (into inventory if L_i = 1). The factor chain is Tauchen's
    (tauchen_grid, tested in tests/test_dp_optimal.py); the demands Poisson given F_t, independent across items."""
    n, K, gamma = inst.n, inst.K, inst.gamma
    grid = dp_optimal.tauchen_grid(inst.rho, factor_points, factor_width)
    leads = [int(lead) for lead in inst.lead]
    quantities = [[q_step * j for j in range(int(round(inst.qbar[i] / q_step)) + 1)] for i in range(n)]
    actions = [(0, (0.0,) * n)] + [(1, q) for q in itertools.product(*quantities)]
    pmf = []  # pmf[m][i]: item i's demand law at grid point m
    for f in grid.points:
        rates = inst.lam * np.exp(inst.beta * f - inst.beta**2 / 2)
        pmf.append([stats.poisson.pmf(np.arange(int(stats.poisson.isf(tail, r)) + 2), r) for r in rates])

    @cache
    def following(t, inv, pipes, m):
        """E[J(t, inv, pipes, F_t) | F_{t-1} = f_m]."""
        return sum(grid.transition[m, j] * cost_to_go(t, inv, pipes, j) for j in range(factor_points) if grid.transition[m, j] > 0)

    @cache
    def cost_to_go(t, inv, pipes, m):
        if t == horizon:
            return 0.0
        best = math.inf
        for open_order, q in actions:
            total = K * open_order
            for demand in itertools.product(*(range(p.size) for p in pmf[m])):
                weight = math.prod(pmf[m][i][d] for i, d in enumerate(demand))
                z = tuple(inv[i] - demand[i] for i in range(n))
                stage = sum(inst.h[i] * max(z[i], 0.0) + inst.b[i] * max(-z[i], 0.0) for i in range(n))
                nxt_inv, nxt_pipes = [], []
                for i in range(n):
                    order = open_order * q[i]
                    if leads[i] == 1:
                        nxt_inv.append(z[i] + order)
                        nxt_pipes.append(())
                    else:
                        nxt_inv.append(z[i] + pipes[i][0])
                        nxt_pipes.append(pipes[i][1:] + (order,))
                later = following(t + 1, tuple(nxt_inv), tuple(nxt_pipes), m) if t + 1 < horizon else 0.0
                total += weight * (stage + gamma * later)
            best = min(best, total)
        return best

    inv0 = tuple(float(inst.lam[i] * (leads[i] + 1)) for i in range(n))
    pipes0 = tuple((0.0,) * (leads[i] - 1) for i in range(n))
    return sum(grid.initial[m] * cost_to_go(0, inv0, pipes0, m) for m in range(factor_points))


def pair(qbar=(2.0, 2.0), leads=(1, 2), K=3.0, beta=(0.5, 0.3)) -> Instance:
    """Two slow items with whole starts (x_0 = lam (L + 1) = 1: whole quantities are optimal with whole caps), caps of a
    few units, a moving factor."""
    return Instance(
        h=[1.0, 0.5], b=[6.0, 9.0], lam=[0.5, 1 / leads[1]], beta=list(beta), lead=list(leads), qbar=list(qbar), K=K, gamma=0.9, rho=0.6
    )


GRID = {"factor_points": 2, "factor_width": 1.0}


def test_matches_the_exhaustive_recursion_with_different_leads():
    """Whole caps and starts: the joint DP's value is the optimum over every joint action of the original dynamics,
    to the demand laws' truncation (1e-4 here). The domain's floor lies `horizon` periods of demand
    below x_0, so no reachable state is extrapolated. A DP that charged item 2 over item 1's lead, let an item order
    after its last counted step, or skipped one axis's expectation fails here."""
    inst = pair()
    expected = exhaustive(inst, 3, 1.0, **GRID)
    solution = joint_dp.solve(inst, 3, "raised", floor_periods=3, tables=False, **GRID)
    assert solution.whole_caps
    assert solution.expected_cost == pytest.approx(expected, rel=1e-3)
    assert joint_dp.solve(inst, 3, "lowered", floor_periods=3, tables=False, **GRID).expected_cost == pytest.approx(expected, rel=1e-3)


@pytest.mark.slow
def test_fractional_caps_are_bracketed_by_the_two_whole_caps():
    """qbar = 2.5 and 1.5: the optimum over half-unit quantities (an upper figure on the true optimum, at least it)
    lies between the caps raised (a relaxation) and lowered (integer orders within the real caps), which differ by 9%
    (measured 8.648 <= 9.034 <= 9.420)."""
    inst = pair(qbar=(2.5, 1.5), leads=(1, 1))  # x_0 = 1, 1: half units reach every lattice point
    half_units = exhaustive(inst, 2, 0.5, tail=1e-4, **GRID)  # the tail's mass moves it by 2e-4 of its value
    raised = joint_dp.solve(inst, 2, "raised", floor_periods=2, tables=False, **GRID).expected_cost
    lowered = joint_dp.solve(inst, 2, "lowered", floor_periods=2, tables=False, **GRID).expected_cost
    assert raised <= half_units + 1e-9 and half_units <= lowered + 1e-9
    assert lowered - raised > 1e-3


def test_one_item_is_the_item_dp():
    """At n = 1 the joint DP is the n = 1 DP on the same lattice (two classes, the cap raised) and domain."""
    inst = item_instance(paper_instance(4, 0), 2, 40.0)
    joint = joint_dp.solve(inst, 30, "raised", factor_points=11, tables=False)
    item = dp_optimal.solve(inst, 30, factor_points=11, integer_cap=True, floor_periods=1)
    assert joint.expected_cost == pytest.approx(item.expected_cost, rel=1e-12)


def test_zero_setup_cost_is_the_sum_of_the_items_dps():
    """K = 0 separates the items: the joint value is the sum of the item DPs, also for a negative loading and an
    overdispersed item, with different leads."""
    inst = Instance(
        h=[1.0, 0.6], b=[7.0, 9.0], lam=[3.0, 2.0], loadings=[[0.5], [-0.4]], beta=None, lead=[2, 1], qbar=[9.0, 7.5],
        K=0.0, gamma=0.95, rho=0.8, overdispersion=[0.0, 0.5],
    )  # fmt: skip
    joint = joint_dp.solve(inst, 20, "raised", factor_points=11, tables=False).expected_cost
    items = [dp_optimal.solve(item_instance(inst, i, 0.0), 20, factor_points=11, integer_cap=True, floor_periods=1) for i in range(2)]
    assert joint == pytest.approx(sum(s.expected_cost for s in items), rel=1e-10)


def opposed_pair(second: float) -> Instance:
    return Instance(
        h=[1.0, 0.7], b=[8.0, 6.0], lam=[2.0, 1.5], loadings=[[0.5], [second]], beta=None, lead=[1, 2], qbar=[8.0, 6.0], K=12.0,
        gamma=0.95, rho=0.8,
    )  # fmt: skip


def test_policy_costs_its_value_in_simulation():
    """Items with opposite loadings (demands moving against each other): the joint policy's simulated cost (1,000 episodes,
    continuous factor) lies within 3 s.e. plus twice the factor grid's Richardson estimate |V(11) - V(21)| of its value
    (measured 173.68 +- 0.82 against 174.82, tolerance 9.3). The control: the same pair with both loadings positive, which a
    DP that read the negative loading's laws unreversed would solve, is worth 161.12, outside that tolerance."""
    inst = opposed_pair(-0.5)
    coarse = joint_dp.solve(inst, 20, factor_points=11, tables=False)
    fine = joint_dp.solve(inst, 20, factor_points=21)
    result = evaluate(joint_dp.JointDPPolicy(fine), inst.to_torch(), sample_paths(inst, 5, 1000, 20))
    tolerance = 3 * result.se + 2 * abs(coarse.expected_cost - fine.expected_cost)
    assert abs(result.mean - fine.expected_cost) <= tolerance, (result.mean, result.se, fine.expected_cost)
    unreversed = joint_dp.solve(opposed_pair(0.5), 20, factor_points=21, tables=False).expected_cost
    assert abs(result.mean - unreversed) > tolerance


def test_refusals():
    four = paper_instance(4, 0)
    with pytest.raises(InputError, match="1 to 3 items.*n = 4"):
        joint_dp.solve(four, 10)
    two_factors = Instance(
        h=[1.0, 1.0], b=[6.0, 6.0], lam=[2.0, 2.0], loadings=[[0.3, 0.1], [0.1, 0.3]], beta=None, lead=[1, 1], qbar=[6.0, 6.0],
        K=5.0, gamma=0.9, rho=0.5,
    )  # fmt: skip
    with pytest.raises(InputError, match="one factor; this instance has 2"):
        joint_dp.solve(two_factors, 10)
    with pytest.raises(InputError, match="cap qbar 0.5 is below one unit"):
        joint_dp.solve(pair(qbar=(0.5, 2.0)), 3, "lowered")


def test_a_joint_dp_beyond_half_the_memory_is_refused_before_it_is_built(monkeypatch):
    monkeypatch.setattr(dp_optimal, "physical_memory", lambda: 2**26)
    with pytest.raises(dp_optimal.TooLarge, match=r"joint DP of 2 items needs about .* GiB \(.* positions x 41 factor points"):
        joint_dp.solve(paper_instance(2, 0), 50)


def random_pair(rng: np.random.Generator) -> Instance:
    lam = rng.uniform(0.3, 1.5, 2).round(1)
    lead = rng.integers(1, 3, 2)
    return Instance(
        h=rng.uniform(0.5, 2.0, 2), b=rng.uniform(4.0, 12.0, 2), lam=lam, beta=rng.uniform(0.0, 0.6, 2), lead=lead,
        qbar=np.maximum(np.ceil(rng.uniform(1.5, 4.0, 2) * lam), 1.0), K=rng.uniform(1.0, 15.0), gamma=0.9, rho=rng.uniform(0.0, 0.9),
    )  # fmt: skip


SMALL = DecompositionOptions(factor_points=5, coarse_points=3, factor_width=2.0, rounds=4, tolerance=1e-4)
"""The bounds' settings on the random pairs: 5 factor points over +-2 s.d., the split searched on the same grid."""
SMALL_HORIZON = 8


def pairs_with_optimum(seed: int, count: int):
    """`count` seeded random pairs, each with its exact optimum (the joint DP, caps raised, on SMALL's grid) and the
    decomposition bound's searched split there: (instance, V*, split)."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        inst = random_pair(rng)
        exact = joint_dp.solve(inst, SMALL_HORIZON, "raised", 5, SMALL.factor_width, tables=False).expected_cost

        def values_of(round_, grids, inst=inst):
            return [item_values(inst, i, g, SMALL_HORIZON, 5, SMALL) if g else [] for i, g in enumerate(grids)]

        yield inst, exact, search_split(inst, SMALL, values_of).split


def split_value(inst: Instance, shares) -> float:
    """sum_i V_i(k_i) on SMALL's grid."""
    return sum(item_values(inst, i, [shares[i]], SMALL_HORIZON, 5, SMALL)[0] for i in range(inst.n))


def test_the_decomposition_bound_never_exceeds_the_joint_optimum_on_random_pairs():
    """50 seeded two-item instances at small volumes (lam 0.3-1.5, caps whole, leads 1-2, K 1-15): the decomposition bound's
    searched split lies below the exact optimum on the same chain and lattice (the bound's own relaxed caps); the control,
    the separable optimum at K = 0 plus K, lies above it on some instance (a bound that counts K once per period whether
    or not anything orders would pass the first check)."""
    gaps, above = [], 0
    for inst, exact, split in pairs_with_optimum(54, 50):
        assert split.value <= exact + 1e-9 * exact, (inst, split.value, exact)
        gaps.append(1 - split.value / exact)
        above += split_value(inst, [0.0, 0.0]) + inst.K * sum(inst.gamma**t for t in range(SMALL_HORIZON)) > exact
    assert max(gaps) > 1e-3 and above > 0


# ---- shares that depend on the period and the factor ------------------------------------------------------


def test_schedule_bound_lies_between_the_constant_split_and_the_joint_optimum_on_random_pairs():
    """50 seeded two-item instances: the schedule search's value is at least the constant split it starts from (it keeps its
    best) and at most the exact optimum on the same chain and lattice; it gains on some instance. The broken control, each
    item given all of K at every (t, f) (shares summing to 2 K, no longer a relaxation), lies above the optimum on some
    instance and is caught by the same check."""
    gains, caught = [], 0
    for inst, exact, split in pairs_with_optimum(5454, 50):
        search = share_schedule.search_schedule(inst, SMALL_HORIZON, split.shares, dataclasses.replace(SMALL, schedule_rounds=6))
        constant = split_value(inst, split.shares)
        assert search.start_value == pytest.approx(constant, rel=1e-12)
        assert constant - 1e-9 <= search.value <= exact + 1e-9 * exact, (inst, constant, search.value, exact)
        gains.append(search.value - constant)
        full = np.full((share_schedule.decision_steps(inst, SMALL_HORIZON), 5), inst.K)
        broken = sum(share_schedule.item_result(inst, i, full, SMALL_HORIZON, SMALL).value for i in range(2))
        caught += broken > exact + 1e-9 * exact
    assert max(gains) > 1e-3 and caught > 0


def test_order_frequencies_are_the_simulated_order_rates_of_the_item_policy():
    """The supergradient: the carried-forward law's discounted order probability, summed over (t, f), equals the mean
    discounted number of orders of the same item DP's policy simulated on the Tauchen chain itself (20,000 episodes, within
    4 s.e.), and a constant schedule's value moves by it to first order (a finite difference of the setup cost)."""
    inst = item_instance(paper_instance(4, 0), 1, 0.0)
    options = DecompositionOptions(factor_points=7, coarse_points=3)
    horizon, share = 20, 6.0
    steps = share_schedule.decision_steps(inst, horizon)
    schedule = np.full((steps, 7), share)
    result = share_schedule.item_result(inst, 0, schedule, horizon, options)
    step = 0.05
    above = share_schedule.item_result(inst, 0, schedule + step, horizon, options).value
    below = share_schedule.item_result(inst, 0, schedule - step, horizon, options).value
    assert (above - below) / (2 * step) == pytest.approx(result.frequencies.sum(), rel=0.02)
    sim = simulate_orders(inst, horizon, share, options)
    assert abs(sim[0] - result.frequencies.sum()) <= 4 * sim[1], (sim, result.frequencies.sum())


def simulate_orders(inst: Instance, horizon: int, share: float, options: DecompositionOptions, episodes: int = 20_000):
    """Mean and s.e. of sum_t gamma^t 1{order at t} of the item DP's own decisions (W_t at grid points, the window's first
    minimiser) on paths of the Tauchen chain and the DP's demand laws, written out here."""
    one = dataclasses.replace(inst, K=share)
    solution = dp_optimal.solve(one, horizon, **options.dp_settings())
    grid, window = solution.grid, solution.window
    rates = inst.lam[0] * np.exp(inst.beta[0] * grid.points - inst.beta[0] ** 2 / 2)
    rng = np.random.default_rng(3)
    m = rng.choice(grid.points.size, size=episodes, p=grid.initial)
    x = np.full(episodes, solution.initial_index)
    total = np.zeros(episodes)
    for t in range(solution.decision_steps):
        W = solution.action_value[t][m]  # [E, N]
        padded = np.concatenate([W, np.full((episodes, window), np.inf)], axis=1)
        index = x[:, None] + np.arange(window + 1)[None, :]
        candidates = np.take_along_axis(padded, index, axis=1)
        best = candidates.min(1)
        opens = share + best < W[np.arange(episodes), x]
        total += inst.gamma**t * opens
        x = np.where(opens, x + candidates.argmin(1), x)
        demand = rng.poisson(rates[m])
        x = np.maximum(x - demand * solution.lattice.classes, 0)
        m = np.minimum((rng.random(episodes)[:, None] > np.cumsum(grid.transition, axis=1)[m]).sum(1), grid.points.size - 1)
    return total.mean(), total.std(ddof=1) / math.sqrt(episodes)


# ---- groups instead of items ----------------------------------------------------------------------------


def test_group_bound_lies_between_the_item_split_and_the_joint_optimum():
    """Two seeded instances of three slow items, grouped (0, 1) and (2,): the group bound is at least the decomposition
    bound's split over items on the same grid and at most the exact optimum of the three items (the joint DP, caps raised
    as the groups' are); it gains over the items on some instance. One group of both items of a pair is its exact optimum."""
    rng = np.random.default_rng(3)
    options = DecompositionOptions(factor_points=5, coarse_points=3, factor_width=2.0, rounds=6, tolerance=1e-5)
    horizon, gains = 5, []
    for _ in range(2):
        pair, other = random_pair(rng), random_pair(rng)
        three = Instance(
            **{name: np.concatenate([getattr(pair, name), getattr(other, name)[:1]]) for name in ("h", "b", "lam", "beta", "lead", "qbar")},
            K=pair.K, gamma=0.9, rho=pair.rho,
        )  # fmt: skip
        result = group_bound.group_bound(three, horizon, options, [(0, 1), (2,)], search_points=5)
        assert result.shares.sum() <= three.K + 1e-9
        assert result.value >= result.search_value - 1e-9  # on the same grid the chords lie below the values

        def values_of(round_, grids, three=three):
            return [item_values(three, i, g, horizon, 5, options) if g else [] for i, g in enumerate(grids)]

        items = search_split(three, options, values_of).split.value
        exact = joint_dp.solve(three, horizon, "raised", 5, 2.0, tables=False).expected_cost
        assert items - 1e-9 <= result.value <= exact + 1e-9 * exact, (three, items, result.value, exact)
        gains.append(result.value - items)
    assert max(gains) > 1e-3
    whole = group_bound.group_bound(pair, horizon, options, [(0, 1)], search_points=5).value
    exact = joint_dp.solve(pair, horizon, "raised", 5, 2.0, tables=False).expected_cost
    assert whole == pytest.approx(exact, rel=1e-8)  # its share is K to the search's rounding


# ---- the information relaxation ------------------------------------------------------------------------


def penalty_one_point_off(item_paths):
    """information_bound.item_paths with W_t (which holds the penalty's conditional expectation) read one factor grid point
    off the path's: a penalty whose mean is not zero."""

    def broken(*args, **kwargs):
        tables, demand = item_paths(*args, **kwargs)
        tables.W = np.roll(tables.W, -1, axis=1)
        return tables, demand

    return broken


def test_information_bound_stays_below_the_joint_optimum_and_a_biased_penalty_is_caught(monkeypatch):
    """50 seeded two-item instances, 60 paths of the chain each: the bound (the decomposition's value plus the per-path
    ascent's mean gain) lies at most 4 s.e. above the exact optimum and at least at the decomposition bound; its plain mean
    over paths, without the control variate, agrees with it (the penalty has mean zero). The broken control, the penalty's
    conditional expectation read one factor grid point off the path's factor, drives the plain mean above the optimum by
    more than 4 of its s.e. on some instance."""
    gains, caught = [], 0
    for inst, exact, split in pairs_with_optimum(5455, 50):
        bound = information_bound.information_bound(inst, SMALL_HORIZON, split.shares, SMALL, paths=60, rounds=10)
        decomposition = split_value(inst, split.shares)
        assert bound.start == pytest.approx(decomposition, rel=1e-9)
        assert decomposition - 1e-9 <= bound.value <= exact + 4 * bound.se, (inst, decomposition, bound.summary(), exact)
        assert abs(bound.plain - bound.value) <= 4 * bound.plain_se
        gains.append(bound.value - decomposition)
        with monkeypatch.context() as patch:
            patch.setattr(information_bound, "item_paths", penalty_one_point_off(information_bound.item_paths))
            broken = information_bound.information_bound(inst, SMALL_HORIZON, split.shares, SMALL, paths=60, rounds=1)
        caught += broken.plain - 4 * broken.plain_se > exact
    assert max(gains) > 1.0 and caught > 0


@pytest.mark.slow
def test_the_exact_policy_costs_no_more_than_the_lookahead_or_classical_best():
    """Three seeded two-item instances (whole caps, so the joint DP's policy is optimal on its chain), 600 common held-out
    episodes of 12 steps: the exact policy's cost minus the decomposition lookahead's and minus classical-best's is never
    above 3 s.e. of the paired difference. A policy that ordered by the wrong item's table would fail here."""
    from envs.evaluation import paired_comparison
    from policies.classical import RULES_OF, tuned_policy
    from policies.decomposition import lookahead_policy

    rng = np.random.default_rng(77)
    horizon = 12
    for _ in range(3):
        inst = random_pair(rng)
        paths = sample_paths(inst, 11, 600, horizon)
        exact = evaluate(joint_dp.JointDPPolicy(joint_dp.solve(inst, horizon, factor_points=21)), inst.to_torch(), paths)
        others = (lookahead_policy(inst, horizon)[0], tuned_policy(inst, "classical-best", RULES_OF["classical-best"], horizon)[0])
        for policy in others:
            paired = paired_comparison(exact.discounted_cost, evaluate(policy, inst.to_torch(), paths).discounted_cost)
            assert paired.mean_difference <= 3 * paired.se, (inst, paired)


@pytest.mark.slow
def test_the_two_item_optimum_answers_decisions_as_at_its_first_period():
    """dp-optimal on two items as a Decider (decide.py, the service): each batch gets the joint DP's rule at t = 0, the
    answer of a fresh policy; a backlogged item makes it order, a full one does not."""
    from envs.dynamics import State
    from serving.decisions import load_decider, read_states

    inst = Instance(h=[1.0, 0.7], b=[8.0, 6.0], lam=[1.5, 1.2], beta=[0.4, 0.3], lead=[1, 2], qbar=[5.0, 4.0], K=8.0, gamma=0.9, rho=0.6)
    decider = load_decider("dp-optimal", inst)
    states = [
        {"inventory": [-3, 8], "in_transit": [[0, 0, 0], [0, 0, 0]], "factor": 0.5},
        {"inventory": [9, 9], "in_transit": [[0, 0, 0], [2, 0, 0]], "factor": -1},
    ]
    batch = read_states(states, inst, "request body")
    answer = decider.decide(batch)
    assert answer.open.tolist() == [1, 0] and answer.order[0, 0] > 0 and answer.order[1].sum() == 0
    fresh = joint_dp.JointDPPolicy(decider.policy.solution)
    opens, quantity = fresh(State(batch.inv, batch.pipe, batch.factor), inst.to_torch())
    np.testing.assert_array_equal(answer.order, (quantity * opens[:, None]).numpy())
    assert decider.info["parameters"]["caps"] == "lowered" and decider.info["parameters"]["exact"]


def test_groups_are_neighbours_in_share_order():
    assert group_bound.groups_by_share(np.array([17.7, 6.4, 3.0, 13.0])) == [(0, 3), (1, 2)]
    assert group_bound.groups_by_share(np.array([1.0, 5.0, 3.0])) == [(1, 2), (0,)]
