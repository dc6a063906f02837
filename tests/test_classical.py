"""Classical policies: closed-form demand moments, decisions by hand, batched tuning."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from envs.demand_law import DemandMoments, draw_demand, item_rates
from envs.dynamics import State
from envs.evaluation import evaluate, paired_comparison
from envs.exogenous import HELDOUT_SEED, TUNING_SEED, factor_step, sample_paths
from envs.instance import Instance, paper_instance
from policies import classical
from policies.classical import FAMILIES, RULES, RULES_OF, Parameter, make_policy, refine, tune_family


@pytest.mark.parametrize("factor", [None, 1.2])
def test_demand_moments_match_monte_carlo(factor):
    inst = Instance(h=[1.0, 1.0], b=[9.0, 9.0], lam=[3.0, 6.0], beta=[0.6, 0.3], lead=[1, 4], qbar=[9.0, 9.0], K=1.0, gamma=0.9, rho=0.8)
    periods = 5
    moments = DemandMoments(inst.to_torch(dtype=torch.float64), periods)
    observed = None if factor is None else torch.tensor([factor], dtype=torch.float64)
    rng = np.random.default_rng(0)
    N = 400_000
    f = rng.standard_normal(N) if factor is None else np.full(N, factor)
    total = np.zeros((N, 2))
    for p in range(periods):
        total += rng.poisson(inst.lam * np.exp(inst.beta * f[:, None] - inst.beta**2 / 2))
        if p in (0, 2, 4):
            [(mean, sd)] = moments.over(observed, 1, torch.full((1, 2), p + 1, dtype=torch.long))
            np.testing.assert_allclose(mean[0].numpy(), total.mean(0), rtol=0.01)
            np.testing.assert_allclose(sd[0].numpy() ** 2, total.var(0), rtol=0.03)
        f = inst.rho * f + math.sqrt(1 - inst.rho**2) * rng.standard_normal(N)


def richer_instance(factors: int, n: int = 4, seed: int = 0, **overrides) -> Instance:
    """n items on `factors` factors with loadings of both signs and overdispersion phi_i > 0."""
    rng = np.random.default_rng(seed)
    loadings = rng.uniform(-0.6, 0.6, (n, factors))
    loadings[0] = -np.abs(loadings[0])  # at least one item moves against the factors
    items = dict(h=[1.0] * n, b=[9.0] * n, lam=rng.uniform(2.0, 6.0, n), lead=rng.integers(1, 5, n), qbar=[30.0] * n)
    phi = np.linspace(0.1, 0.6, n)
    return Instance(**(items | overrides), beta=None, loadings=loadings, overdispersion=phi, K=10.0, gamma=0.9, rho=0.7)


def sums_and_moments(inst: Instance, paths, periods: tuple[int, ...], aware: bool, model: Instance | None = None):
    """J-period demand sums from F_0 of the episodes of `paths` (sample_paths of `inst`, at least max(periods) steps;
    [E, n] per J), and the mean and s.d. of them that DemandMoments of `model` (default `inst`) gives, given each
    episode's F_0 (aware) or stationary."""
    demand = paths.demand.double().numpy()
    episodes = demand.shape[0]
    moments = DemandMoments((model or inst).to_torch(dtype=torch.float64), max(periods))
    factor = paths.factor[:, 0].double() if aware else None
    lengths = [torch.full((1, inst.n), p, dtype=torch.long) for p in periods]
    return [(demand[:, :p].sum(1), mean.numpy(), sd.numpy()) for p, (mean, sd) in zip(periods, moments.over(factor, episodes, *lengths))]


@pytest.mark.parametrize("factors", [1, 3])
def test_demand_moments_match_sample_paths_with_signed_factors_and_overdispersion(factors):
    # Stationary: F_0 ~ N(0, I), so the sums from t = 0 have the stationary moments; their sample mean and variance
    # must match within 4.5 standard errors (s.e. of the variance from the sums' fourth central moment).
    inst = richer_instance(factors)
    episodes = 10_000
    paths = sample_paths(inst, 3, episodes, 6)  # the episodes of every check below
    for total, mean, sd in sums_and_moments(inst, paths, (1, 3, 6), aware=False):
        centred = total - total.mean(0)
        assert np.all(np.abs(total.mean(0) - mean[0]) <= 4.5 * total.std(0) / math.sqrt(episodes))
        assert np.all(np.abs(centred.var(0) - sd[0] ** 2) <= 4.5 * (centred**2).std(0) / math.sqrt(episodes))
    # Given F_0: each episode's sum standardised by its own conditional moments has mean 0 and variance 1; the broken
    # control (the same model without the overdispersion term phi sum_j E[rate_j^2]) fails the variance check.
    data = inst.to_dict()
    del data["items"]["overdispersion"]
    poisson = Instance.from_dict(data)
    for model, exact in ((inst, True), (poisson, False)):
        for total, mean, sd in sums_and_moments(inst, paths, (1, 3, 6), aware=True, model=model):
            z = (total - mean) / sd
            within = np.abs((z**2).mean(0) - 1) <= 4.5 * (z**2).std(0) / math.sqrt(episodes)
            if exact:
                assert np.all(np.abs(z.mean(0)) <= 4.5 / math.sqrt(episodes)) and np.all(within)
        assert exact or not within[inst.overdispersion >= 0.4].any()  # the clearly overdispersed items


def test_demand_moments_of_repeated_factor_rows_are_each_row_s_own():
    # Tuning runs many candidates per episode, so rows repeat; the moments are computed once per distinct k-vector
    # and must come back to every row that holds it, in the rows' order: also where two distinct rows share their
    # first coordinate (the last row, against the first).
    inst = richer_instance(3)
    moments = DemandMoments(inst.to_torch(dtype=torch.float64), 4)
    rows = torch.tensor(
        [[0.5, -1.0, 2.0], [-0.3, 0.0, 0.1], [0.5, -1.0, 2.0], [1.0, 1.0, -1.0], [-0.3, 0.0, 0.1], [0.5, 0.3, 0.0]], dtype=torch.float64
    )
    for count in (5, 6):
        periods = torch.tensor([[1, 2, 3, 4]] * count)
        [(mean, sd)] = moments.over(rows[:count], count, periods)
        for row in range(count):
            [(own_mean, own_sd)] = moments.over(rows[row : row + 1], 1, periods[row : row + 1])
            torch.testing.assert_close(mean[row], own_mean[0], rtol=0, atol=0)
            torch.testing.assert_close(sd[row], own_sd[0], rtol=0, atol=0)
        assert not torch.equal(mean[0], mean[count - 1])


def test_demand_moments_given_a_factor_vector_match_a_direct_simulation():
    # F_t fixed at a 3-vector: simulate the next 5 periods with factor_step, item_rates and draw_demand (eq.
    # factor_process, conditional_demand_rate and the negative binomial), against the closed form given F_t.
    inst = richer_instance(3)
    observed = np.array([1.1, -0.7, 0.4])
    rng = np.random.default_rng(1)
    draws = 200_000
    factor = np.tile(observed, (draws, 1))
    total = np.zeros((draws, inst.n))
    moments = DemandMoments(inst.to_torch(dtype=torch.float64), 5)
    for p in range(5):
        total += draw_demand(item_rates(inst, factor), inst.overdispersion, rng)
        factor = factor_step(inst.rho, factor, rng.standard_normal(factor.shape))
        [(mean, sd)] = moments.over(torch.tensor(observed)[None], 1, torch.full((1, inst.n), p + 1, dtype=torch.long))
        assert np.all(np.abs(total.mean(0) - mean[0].numpy()) <= 4.5 * total.std(0) / math.sqrt(draws))
        centred = total - total.mean(0)
        assert np.all(np.abs(centred.var(0) - sd[0].numpy() ** 2) <= 4.5 * (centred**2).std(0) / math.sqrt(draws))


def poisson_instance():
    # beta = 0: demand is i.i.d. Poisson(lam), so p-period demand has mean = variance = lam p.
    return Instance(h=[1.0, 1.0], b=[9.0, 9.0], lam=[4.0, 1.0], beta=[0.0, 0.0], lead=[1, 3], qbar=[3.0, 50.0], K=10.0, gamma=0.9, rho=0.8)


def state_of(inv):
    inv = torch.tensor(inv, dtype=torch.float64)
    return State(inv, torch.zeros(*inv.shape, 3, dtype=torch.float64), torch.zeros(inv.shape[0], dtype=torch.float64))


def test_base_stock_and_can_order_decisions_by_hand():
    inst = poisson_instance()
    ti = inst.to_torch(dtype=torch.float64)
    # s_i = lam (L+1) + 0 * sd = [8, 4]; S_i (cover 2: L+2 periods) = lam (L+2) + 1 * sqrt(lam (L+2)) + 0.5 EOQ_i
    # with EOQ_i = sqrt(2 (K / n) lam_i / h_i) = sqrt(2 * 5 * [4, 1]) = [sqrt(40), sqrt(10)].
    up_to = np.array([12 + math.sqrt(12) + 0.5 * math.sqrt(40), 5 + math.sqrt(5) + 0.5 * math.sqrt(10)])
    base = make_policy(ti, RULES["base-stock"], {"reorder_z": 0.0, "cover": 2, "order_up_to_z": 1.0, "cycle_stock": 0.5})
    y, q = base(state_of([[7.0, 4.5], [8.5, 4.5], [8.5, 3.0]]), ti)
    assert y.tolist() == [1, 0, 1]
    np.testing.assert_allclose(
        q.numpy(), [[3.0, up_to[1] - 4.5], [3.0, up_to[1] - 4.5], [3.0, up_to[1] - 3.0]]
    )  # item 0 capped at qbar = 3
    # can-order: c = s + 0.5 (S - s) = [8 + (S_0 - 8)/2, 4 + (S_1 - 4)/2] = [., 5.0 + 1.118 + 0.395]; item 1 at 6.6 is above c_1.
    can_order_level = 4 + (up_to[1] - 4) / 2
    can = make_policy(
        ti, RULES["can-order"], {"reorder_z": 0.0, "can_order_fraction": 0.5, "cover": 2, "order_up_to_z": 1.0, "cycle_stock": 0.5}
    )
    y, q = can(state_of([[7.0, can_order_level + 0.05], [7.0, can_order_level - 0.05], [9.0, 5.5]]), ti)
    assert y.tolist() == [1, 1, 0]
    assert q[0, 1].item() == 0 and q[1, 1].item() == pytest.approx(up_to[1] - can_order_level + 0.05)


def test_fraction_trigger_by_hand():
    inst = Instance(h=[1.0] * 4, b=[9.0] * 4, lam=[4.0] * 4, beta=[0.0] * 4, lead=[1] * 4, qbar=[50.0] * 4, K=10.0, gamma=0.9, rho=0.8)
    ti = inst.to_torch(dtype=torch.float64)
    # s_i = 8 (z = 0 over L + 1 = 2 periods); open when at least half of the 4 items are below 8.
    policy = make_policy(
        ti, RULES["fraction-trigger"], {"reorder_z": 0.0, "trigger_fraction": 0.5, "cover": 1, "order_up_to_z": 0.0, "cycle_stock": 0.0}
    )
    y, q = policy(state_of([[7.0, 9.0, 9.0, 9.0], [7.0, 7.9, 9.0, 9.0], [7.0, 7.0, 7.0, 9.0]]), ti)
    assert y.tolist() == [0, 1, 1]
    np.testing.assert_allclose(q[1].numpy(), [1.0, 0.1, 0.0, 0.0])  # raise to S = 8
    # fraction 0: like base-stock, any item below opens; no item below never opens
    anyone = make_policy(
        ti, RULES["fraction-trigger"], {"reorder_z": 0.0, "trigger_fraction": 0.0, "cover": 1, "order_up_to_z": 0.0, "cycle_stock": 0.0}
    )
    assert anyone(state_of([[7.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]]), ti)[0].tolist() == [1, 0]


def test_cost_trigger_by_hand():
    inst = poisson_instance()  # b = 9, K = 10; D over L + 1 periods: mean = var = [8, 4]
    ti = inst.to_torch(dtype=torch.float64)
    position = np.array([[7.0, 3.0], [9.0, 5.0], [12.0, 8.0]])
    mean, sd = np.array([8.0, 4.0]), np.sqrt([8.0, 4.0])
    # E[(D - x)^+] for a normal D, by numerical integration of the density (independent of the closed form)
    shortfall = np.array(
        [
            [stats.norm(m, s).expect(lambda d, x=x: max(d - x, 0.0), lb=x, ub=m + 12 * s) for x, m, s in zip(row, mean, sd)]
            for row in position
        ]
    )
    backlog_cost = 9.0 * shortfall.sum(1)
    theta = float(backlog_cost[1]) / 10.0 * 1.001  # just above row 1's cost: rows 0 opens, 1 does not
    policy = make_policy(ti, RULES["cost-trigger"], {"theta": theta, "cover": 1, "order_up_to_z": 0.0, "cycle_stock": 0.0})
    y, q = policy(state_of(position.tolist()), ti)
    assert backlog_cost[0] > backlog_cost[1] > backlog_cost[2]
    assert y.tolist() == [1, 0, 0]
    np.testing.assert_allclose(q[0].numpy(), [1.0, 1.0])  # raise to S = mean over L + 1 = [8, 4]
    at_row_2 = make_policy(
        ti, RULES["cost-trigger"], {"theta": float(backlog_cost[2]) / 10.0 * 0.999, "cover": 1, "order_up_to_z": 0.0, "cycle_stock": 0.0}
    )
    assert at_row_2(state_of(position.tolist()), ti)[0].tolist() == [1, 1, 1]


def test_periodic_review_orders_every_r_periods():
    ti = poisson_instance().to_torch(dtype=torch.float64)
    policy = make_policy(ti, RULES["periodic"], {"period": 3, "order_up_to_z": 0.0, "cycle_stock": 0.0})
    policy.reset()
    opens = [policy(state_of([[0.0, 0.0]]), ti)[0].item() for _ in range(7)]
    assert opens == [1, 0, 0, 1, 0, 0, 1]
    _, q = policy(state_of([[0.0, 0.0]]), ti)
    np.testing.assert_allclose(q.numpy(), [[3.0, 6.0]])  # S = lam (L + R) = [16, 6], item 0 capped at 3


def test_batched_tuning_equals_one_by_one_evaluation(monkeypatch):
    inst = paper_instance(3, 0)
    grid = {"reorder_z": (-1.0, 0.0, 1.0), "cover": (1, 3), "order_up_to_z": (0.0, 1.0), "cycle_stock": (0.0,)}
    monkeypatch.setitem(FAMILIES, "base-stock", {k: Parameter(v, 0.5) for k, v in grid.items()})
    tuned = tune_family(inst, RULES["base-stock-factor"], episodes=16, horizon=20, max_elements=40, refinement=False)  # several chunks
    ti = inst.to_torch()
    paths = sample_paths(inst, TUNING_SEED, 16, 20)
    means = {}
    for rz in grid["reorder_z"]:
        for cover in grid["cover"]:
            for uz in grid["order_up_to_z"]:
                params = {"reorder_z": rz, "cover": cover, "order_up_to_z": uz, "cycle_stock": 0.0}
                means[(rz, cover, uz)] = evaluate(make_policy(ti, RULES["base-stock-factor"], params), ti, paths).mean
    best = min(means, key=means.get)
    assert (tuned.params["reorder_z"], tuned.params["cover"], tuned.params["order_up_to_z"]) == best
    assert tuned.tuning_mean == pytest.approx(means[best], rel=1e-6)
    assert tuned.candidates == 12
    # the refinement starts from that point and keeps a parameter set whose own evaluation is its reported cost
    refined = tune_family(inst, RULES["base-stock-factor"], episodes=16, horizon=20)
    assert refined.candidates > 12
    own = evaluate(make_policy(ti, RULES["base-stock-factor"], refined.params), ti, paths).mean
    assert refined.tuning_mean == pytest.approx(own, rel=1e-6) and own <= means[best]


def test_refinement_finds_the_minimum_between_grid_points():
    # cost (x - 0.37)^2 + (log theta - log 2.3)^2 + (c - 3)^2 per "episode": the grid holds none of the optimum's values
    spec = [Parameter((0.0, 1.0), 0.5), Parameter((0.1, 1.0, 10.0), 0.5, "log", 1e-3), Parameter((1, 5), 1, "integer", 1, 8)]
    calls = []

    def simulate(points):
        calls.append(len(points))
        p = np.array(points)
        cost = (p[:, 0] - 0.37) ** 2 + (np.log(p[:, 1]) - math.log(2.3)) ** 2 + (p[:, 2] - 3) ** 2
        return np.repeat(cost[:, None], 2, axis=1)

    point, costs = refine(simulate, (0.0, 1.0, 5.0), simulate([(0.0, 1.0, 5.0)])[0], spec, rounds=40, halvings=5)
    assert point[2] == 3 and abs(point[0] - 0.37) <= 0.5 / 2**5 and abs(math.log(point[1] / 2.3)) <= 0.5 / 2**5
    assert costs.mean() == pytest.approx(simulate([point])[0].mean())
    assert max(calls[1:]) <= 6  # one batch of at most two moves per parameter per round


def test_tuning_refuses_the_heldout_seed():
    with pytest.raises(ValueError, match="held-out"):
        tune_family(paper_instance(2, 0), RULES["periodic"], seed=HELDOUT_SEED)


def test_factor_aware_base_stock_beats_static_on_heldout():
    inst = paper_instance(4, 0)
    ti = inst.to_torch()
    paths = sample_paths(inst, HELDOUT_SEED, 128, 50)
    costs = {}
    for name in ("base-stock", "base-stock-factor"):
        tuned = tune_family(inst, RULES[name], episodes=32)
        costs[name] = evaluate(make_policy(ti, RULES[name], tuned.params), ti, paths).discounted_cost
    comparison = paired_comparison(costs["base-stock-factor"], costs["base-stock"])
    assert comparison.ci_high < 0


def three_factor_instance() -> Instance:
    """n = 8 items on k = 3 persistent factors (rho 0.9) with signed loadings of norms 0.4..1.2 and phi = 0.3."""
    rng = np.random.default_rng(0)
    n = 8
    return Instance(
        h=[1.0] * n,
        b=[9.0] * n,
        lam=rng.uniform(2.0, 6.0, n),
        beta=None,
        lead=rng.integers(1, 4, n),
        qbar=[40.0] * n,
        loadings=rng.uniform(-0.8, 0.8, (n, 3)),
        overdispersion=np.full(n, 0.3),
        K=20.0,
        gamma=0.95,
        rho=0.9,
    )


def test_tuned_rules_on_three_negative_binomial_factors_beat_zero_and_the_factor_aware_one_beats_static():
    # Each item's exposure u_i,t is persistent: a rule that reads it (through F_t) forecasts demand the static one
    # cannot, so on held-out paths its paired CI lies below the static rule's, which itself lies far below never ordering.
    inst = three_factor_instance()
    ti = inst.to_torch()
    paths = sample_paths(inst, HELDOUT_SEED, 64, 50)
    costs = {"zero": evaluate(classical.zero_policy, ti, paths).discounted_cost}
    for name in ("base-stock", "base-stock-factor"):
        costs[name] = evaluate(make_policy(ti, RULES[name], tune_family(inst, RULES[name], episodes=16).params), ti, paths).discounted_cost
    assert paired_comparison(costs["base-stock"], costs["zero"]).ci_high < 0
    assert paired_comparison(costs["base-stock-factor"], costs["base-stock"]).ci_high < 0


@pytest.mark.slow
def test_classical_best_on_three_negative_binomial_factors_chooses_a_factor_aware_rule():
    inst = three_factor_instance()
    ti = inst.to_torch()
    paths = sample_paths(inst, HELDOUT_SEED, 128, 50)
    policy, parameters = classical.tuned_policy(inst, "classical-best", RULES_OF["classical-best"], 50, episodes=32)
    static = make_policy(ti, RULES["base-stock"], tune_family(inst, RULES["base-stock"], episodes=32).params)
    assert parameters["family"].endswith("-factor")
    best, base = (evaluate(p, ti, paths).discounted_cost for p in (policy, static))
    assert paired_comparison(best, base).ci_high < 0


def test_paired_comparison_by_hand():
    result = paired_comparison(np.array([3.0, 4.0, 6.0, 7.0]), np.array([2.0, 2.0, 3.0, 3.0]))
    # differences 1, 2, 3, 4: mean 2.5, sd sqrt(5/3), se sd/2
    se = math.sqrt(5 / 3) / 2
    half = stats.t.ppf(0.975, 3) * se
    assert (result.mean_difference, result.se) == pytest.approx((2.5, se))
    assert (result.ci_low, result.ci_high) == pytest.approx((2.5 - half, 2.5 + half))
    assert result.significant


def test_tuning_candidates_are_the_grid_and_at_most_the_refinement_moves(monkeypatch, capsys):
    # by hand: base-stock's grid is 4 x 1 x 3 x 3 = 36 points; two pattern searches of 12 rounds of at most 2 moves
    # for each of its 4 parameters add at most 192; classical-best tunes the 5 families twice (static, factor-aware):
    # grids 2 (36 + 72 + 108 + 36 + 45) = 594, moves at most 2 (192 + 240 + 240 + 192 + 144) = 2016
    assert classical.tuning_candidates(classical.RULES["base-stock"]) == (36, 228)
    assert classical.tuning_candidates(classical.RULES["periodic-factor"], refinement=False) == (45, 45)
    inst = paper_instance(2, 0)
    best = classical.TuningClock("classical-best", classical.RULES_OF["classical-best"], inst, 64, 50)
    assert (best.fewest, best.most) == (594, 594 + 2016)
    assert tune_family(inst, RULES["base-stock"], episodes=4, horizon=5, refinement=False).candidates == 36
    assert 36 < tune_family(inst, RULES["base-stock"], episodes=4, horizon=5).candidates <= 228
    # a tuning longer than LONG_TUNING prints its estimate once, after its first simulations
    monkeypatch.setattr(classical, "LONG_TUNING", 0.0)
    classical.tuned_policy(inst, "base-stock", RULES_OF["base-stock"], 5, progress=True, episodes=4)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tuning base-stock")]
    assert len(lines) == 1 and "36 to 228 candidate simulations of 4 episodes x 5 steps x 2 items; the first took" in lines[0], lines


def test_the_tuning_bar_counts_the_pattern_search_as_well_as_the_grid(monkeypatch):
    """A variant's bar ends at every simulation it ran, the search's included, so its time covers the whole step
    (a bar over the grid alone finished in a tenth of the step). Catches the search left out of the count."""
    bars = []

    class Recorded(classical.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(classical, "tqdm", Recorded)
    tuned = tune_family(paper_instance(2, 0), RULES["base-stock"], episodes=8, horizon=10, progress=True)
    grid = math.prod(len(p.grid) for p in FAMILIES["base-stock"].values())
    (bar,) = bars
    assert tuned.candidates > grid  # the search ran
    assert bar.n == bar.total == tuned.candidates
