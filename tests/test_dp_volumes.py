"""The item DP at real volumes (policies/dp_optimal.py's coarse lattice, docs/methods.md "The DP at real volumes")
against independently derived numbers: the integer demand law split by hand onto the multiples of the step, the
exact lattice's DP value (the certificate must stay below it, the coarse value within its stated error), the DP's
own policy at n = 1 (the lookahead on coarse tables, and on any cap), and the lattice the paper's family keeps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from envs.dynamics import State
from envs.errors import InputError
from envs.evaluation import evaluate, paired_comparison
from envs.exogenous import sample_paths
from envs.instance import LMAX, Instance, paper_instance
from policies import decomposition, dp_optimal, lookahead
from policies.decomposition import DecompositionOptions, check_items, combine, item_figures, item_tables, lattice_error

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HORIZON = 12


def item(lam, phi=0.0, lead=1, qbar=None, h=1.0, b=9.0, K=40.0, beta=0.4) -> Instance:
    return Instance(
        h=[h],
        b=[b],
        lam=[lam],
        beta=[beta],
        lead=[lead],
        qbar=[4.0 * lam if qbar is None else qbar],
        K=K,
        gamma=0.95,
        rho=0.7,
        overdispersion=[phi] if phi else None,
    )


# ---- the demand law on the multiples of the step --------------------------------------------------------


@pytest.mark.parametrize("phi", [0.0, 2.0])
def test_the_coarse_demand_law_splits_each_integer_demand_between_its_neighbours(phi):
    """Every integer demand d's probability goes to the multiples j D <= d < (j + 1) D in the proportions
    ((j + 1) D - d) / D and (d - j D) / D: a loop over the integer pmf (scipy's) gives the same rows, so the law keeps
    the mean. Catches a wrong partial mean (the shape one larger for the negative binomial) or a side swapped."""
    rates, step = np.array([3.0, 40.0]), 5
    law = dp_optimal.demand_law(rates, phi, 1e-13, step)
    dmax = dp_optimal.demand_top(rates, phi, 1e-13)
    reference = np.zeros_like(law)
    for i, rate in enumerate(rates):
        pmf = stats.nbinom.pmf(np.arange(dmax + 1), 1 / phi, 1 / (1 + phi * rate)) if phi else stats.poisson.pmf(np.arange(dmax + 1), rate)
        for d, p in enumerate(pmf):
            j, r = divmod(d, step)
            reference[i, j] += p * (step - r) / step
            if r:
                reference[i, j + 1] += p * r / step
    np.testing.assert_allclose(law, reference, atol=1e-12)
    np.testing.assert_allclose(law @ (step * np.arange(law.shape[1])), rates, rtol=1e-9)


# ---- which lattice ------------------------------------------------------------------------------------


def test_lead_time_spread_is_the_standard_deviation_of_the_lead_time_demand_given_the_factor():
    """Against a simulation of L + 1 periods' negative-binomial demand from u_t = 0, the factor moving as its AR(1):
    within 3% at a small loading (the formula linearises the rate in the factor); the demand's own variance alone
    (the broken control, the factor's innovations left out) is far below at a large volume."""
    rng = np.random.default_rng(5)
    lam, phi, beta, rho, lead, paths = 400.0, 0.01, 0.1, 0.7, 3, 400_000
    u = np.zeros(paths)
    total = np.zeros(paths)
    for step in range(lead + 1):
        if step:
            u = rho * u + math.sqrt(1 - rho * rho) * rng.standard_normal(paths)
        rate = lam * np.exp(beta * u - beta * beta / 2)
        total += rng.negative_binomial(1 / phi, 1 / (1 + phi * rate))
    simulated = float(total.std())
    assert dp_optimal.lead_time_spread(lam, phi, lead, beta, rho) == pytest.approx(simulated, rel=0.03)
    assert dp_optimal.lead_time_spread(lam, phi, lead) < 0.8 * simulated


def test_the_paper_family_keeps_its_exact_lattice_and_retail_volumes_get_a_bounded_one():
    """Every item of a paper instance (lam 2-7) stays on its exact lattice (so their numbers do not move: the frozen
    fixture of tests/test_demand_model.py); an item selling hundreds a period with overdispersion gets a step that
    divides its cap, at most a quarter of its lead-time spread, and a domain of at most 2 MAX_POSITIONS positions
    unless the spread is what limits its step."""
    options = DecompositionOptions()
    paper = paper_instance(16, seed=3)
    for i in range(paper.n):
        assert dp_optimal.check_item(decomposition.item_instance(paper, i, 1.0), 50, **options.dp_settings()).step == 1
    for lam, phi, lead in ((300.0, 2.0, 2), (507.0, 2.5, 3), (10000.0, 0.0, 1), (10000.0, 10.0, 4)):
        one = item(lam, phi, lead)
        lattice = dp_optimal.check_item(one, 50, **options.dp_settings())
        assert lattice.step > 1 and math.ceil(4 * lam) % lattice.step == 0 and lattice.cap == math.ceil(4 * lam)
        spread_limit = dp_optimal.lead_time_spread(lam, phi, lead, 0.4, 0.7) / dp_optimal.RESOLUTION
        assert lattice.step <= spread_limit
        problem = dp_optimal._prepare(one, 50, **options.dp_settings(21))
        positions = problem.lattice.positions(problem.low_unit, math.ceil(problem.upper / problem.lattice.step))
        assert positions.size <= 2 * dp_optimal.MAX_POSITIONS + 2 or 2 * lattice.step >= math.floor(spread_limit), (lam, phi)


# ---- the certificate on coarse lattices ---------------------------------------------------------------


SMALL = DecompositionOptions(factor_points=9, coarse_points=5, max_positions=60)
CASES = [
    dict(lam=12.0, phi=3.0, lead=1),
    dict(lam=40.0, phi=0.0, lead=3),
    dict(lam=25.0, phi=1.0, lead=2, h=9.0, b=1.0),
    dict(lam=60.0, phi=0.0, lead=1, K=400.0),
]


def certified(one: Instance, options: DecompositionOptions) -> tuple[dict, dict, float]:
    """(the bound's figures of the one-item instance at share K, its item record, the exact lattice's DP value on the
    same factor grid)."""
    paths = sample_paths(one, 7, 4, HORIZON)
    record = item_figures(one, 0, {"best": one.K, "equal": one.K}, HORIZON, paths, options)
    exact = dp_optimal.expected_costs(decomposition.item_instance(one, 0, 0.0), HORIZON, [one.K], step=1, **options.dp_settings())
    return combine([record], "best", options), record, float(exact[0])


def test_the_conservative_bound_stays_below_the_exact_lattice_value_on_coarse_lattices():
    """Items forced onto coarse lattices (max_positions 60): the conservative figure is never above the exact
    lattice's DP value, and the coarse value is within its stated error (twice the lattice's estimate) of it, so the
    lattice's term alone covers the lattice's error. The broken control: the coarse value itself is above the exact
    one (a mean-preserving spread of the demand raises the expected loss), so it is no bound without the term."""
    above = []
    for case in CASES:
        figures, record, exact = certified(item(**case), SMALL)
        assert record["lattice_step"] > 1, case
        assert figures["conservative"] <= exact, (case, figures, exact)
        assert abs(figures["value"] - exact) <= 2 * figures["lattice_error"], (case, figures, exact)
        above.append(figures["value"] > exact)
    assert any(above)


@pytest.mark.parametrize("lam", [1.0, 5.0, 30.0, 100.0, 500.0])
def test_the_certificate_across_retail_volumes(lam):
    """lam 1-500, phi 0-10, lead 1-3 at the default lattice sizes, wherever the exact lattice fits (here: a domain of at
    most 120,000 units, on 5 factor points): the coarse value minus twice its estimated lattice error is never above the
    exact lattice's value, and the coarse value is within that error. At lam 1 every item keeps its exact lattice."""
    options = DecompositionOptions(factor_points=9, coarse_points=5)
    settings = options.dp_settings(options.coarse_points)
    compared = 0
    for phi in (0.0, 1.0, 10.0):
        for lead in (1, 3):
            one = decomposition.item_instance(item(lam, phi, lead), 0, 0.0)
            lattice = dp_optimal.check_item(one, HORIZON, **settings)
            if lattice.step == 1 or dp_optimal.item_span(one, **settings) > 120_000:
                continue
            shares = [10.0, 100.0, 1000.0]
            coarse = dp_optimal.expected_costs(one, HORIZON, shares, **settings)
            exact = dp_optimal.expected_costs(one, HORIZON, shares, step=1, **settings)
            error = 2 * lattice_error(item(lam, phi, lead), 0, shares, HORIZON, lattice.step, options)
            assert np.all(coarse - error <= exact) and np.all(np.abs(coarse - exact) <= error), (lam, phi, lead, coarse, exact, error)
            compared += 1
    assert compared >= 2 or lam == 1.0


# ---- the lookahead on coarse tables and on any cap ----------------------------------------------------


def decisions(policy, one: Instance, paths):
    return evaluate(policy, one.to_torch(dtype=torch.float64), paths, trace=True)


def test_the_one_item_lookahead_on_coarse_tables_is_the_dp_policy_and_near_the_exact_lattice():
    """n = 1 on a coarse lattice (positions leave the lattice: integer demands, a step of several units): the
    lookahead's decisions equal dp-optimal's solved on the same lattice on every state of a trace, and its cost is within
    0.3% of the lookahead on the exact lattice, paired on the same episodes."""
    one = item(30.0, 1.0, 2, K=60.0)
    options = DecompositionOptions(factor_points=9, coarse_points=5, max_positions=200)
    items = item_tables(one, HORIZON, options, dtype="float32", forms=("finite",))
    tables = lookahead.LookaheadTables.from_items(items, "finite", HORIZON, "")
    solution = dp_optimal.solve(one, HORIZON, **options.dp_settings())
    assert solution.lattice.step > 1
    paths = sample_paths(one, 3, 64, HORIZON)
    ours = decisions(lookahead.LookaheadPolicy(tables, 1.0), one, paths)
    dp = decisions(dp_optimal.DPOptimalPolicy(solution), one, paths)
    assert 0.05 < ours.trace.open.mean() < 0.95
    np.testing.assert_array_equal(ours.trace.open, dp.trace.open)
    np.testing.assert_allclose(ours.trace.quantity[..., 0] * ours.trace.open, dp.trace.quantity[..., 0] * dp.trace.open, atol=1e-9)
    exact_options = DecompositionOptions(factor_points=9, coarse_points=5, max_positions=10**6)
    exact_tables = item_tables(one, HORIZON, exact_options, dtype="float32", forms=("finite",))
    exact = lookahead.LookaheadPolicy(lookahead.LookaheadTables.from_items(exact_tables, "finite", HORIZON, ""), 1.0)
    many = sample_paths(one, 4, 2000, HORIZON)
    reference = decisions(exact, one, many)
    comparison = paired_comparison(decisions(lookahead.LookaheadPolicy(tables, 1.0), one, many).discounted_cost, reference.discounted_cost)
    assert abs(comparison.mean_difference) <= 0.003 * reference.mean + 2 * comparison.se, comparison


@pytest.mark.parametrize("lam, qbar", [(0.15, 0.6), (2.0, 2.5), (4.0, 12.0)])
def test_the_one_item_lookahead_is_the_dp_optimum_whatever_the_cap(lam, qbar, monkeypatch):
    """A slow mover's cap below one unit, a fractional cap and an integer one: the n = 1 lookahead decides as the DP
    on its tables' lattice (the item's own cap unless ceil(qbar) is within RELAXED_CAP_LIMIT of it), so its cost is
    the DP's optimum. The broken control for the slow mover: tables on the relaxed cap ceil(0.6) = 1 cost more."""
    one = item(lam, 0.0, 2, qbar=qbar, K=20.0)
    options = DecompositionOptions(factor_points=9, coarse_points=5)
    relax = decomposition.tables_relax_cap(qbar)
    solution = dp_optimal.solve(one, HORIZON, **options.dp_settings(integer_cap=relax))
    paths = sample_paths(one, 5, 64, HORIZON)

    def lookahead_run():
        tables = item_tables(one, HORIZON, options, dtype="float32", forms=("finite",))
        return decisions(lookahead.LookaheadPolicy(lookahead.LookaheadTables.from_items(tables, "finite", HORIZON, ""), 1.0), one, paths)

    ours, dp = lookahead_run(), decisions(dp_optimal.DPOptimalPolicy(solution), one, paths)
    assert ours.trace.open.any()
    np.testing.assert_array_equal(ours.trace.open, dp.trace.open)
    np.testing.assert_allclose(ours.discounted_cost, dp.discounted_cost, rtol=1e-12)
    if qbar < 1:
        assert not relax
        monkeypatch.setattr(decomposition, "tables_relax_cap", lambda qbar: True)
        assert lookahead_run().mean > dp.mean * 1.01


def test_a_cap_below_one_lattice_step_is_refused_before_any_solve_naming_the_item():
    """A cap of 0.05 units with a start of 0.026 units has no lattice 1/m (m <= 10) holding both, and the restriction
    to tenths leaves no order: the DP-based policies cannot order under it, so the check every entry point runs first
    refuses naming the item and the least cap."""
    one = Instance(
        h=[1.0, 1.0], b=[9.0, 9.0], lam=[2.0, 0.013], beta=[0.3, 0.3], lead=[1, 1], qbar=[8.0, 0.05], K=10.0, gamma=0.95, rho=0.7
    )
    with pytest.raises(InputError, match=r"^--instance 'i\.json': item 1: dp-optimal: its order cap qbar 0\.05 is below one step"):
        check_items(one, HORIZON, DecompositionOptions(), "--instance 'i.json'", lookahead.FORMS)
    with pytest.raises(dp_optimal.CapBelowStep, match="give it a cap of at least 0.1"):
        dp_optimal.solve(decomposition.item_instance(one, 1, 10.0), HORIZON)


def test_a_backlog_below_the_tables_orders_its_whole_cap():
    """A position far below the DP's domain (a backlog deeper than one period's 1e-13 demand tail, which a history
    the model misdescribes can reach): the one-item lookahead and dp-optimal both open and order the whole cap,
    measuring the cap from the domain's first position. The broken control, the cap measured from the position
    itself, leaves no lattice target within reach, so the item would never order again."""
    one = item(30.0, 1.0, 2, K=60.0)
    options = DecompositionOptions(factor_points=9, coarse_points=5)
    items = item_tables(one, HORIZON, options, dtype="float32", forms=("finite",))
    tables = lookahead.LookaheadTables.from_items(items, "finite", HORIZON, "")
    solution = dp_optimal.solve(one, HORIZON, **options.dp_settings())
    qbar = float(one.qbar[0])
    deep = float(items[0].positions[0]) - 5 * qbar
    assert deep + qbar < items[0].positions[0]  # no lattice point within the cap of the position itself
    tinst = one.to_torch(dtype=torch.float64)
    double = torch.float64
    state = State(torch.tensor([[deep]], dtype=double), torch.zeros(1, 1, LMAX - 1, dtype=double), torch.zeros(1, dtype=double))
    for policy in (lookahead.LookaheadPolicy(tables, 1.0), dp_optimal.DPOptimalPolicy(solution)):
        opens, quantity = policy(state, tinst)
        assert opens.item() == 1.0 and quantity.item() == pytest.approx(qbar), type(policy).__name__
