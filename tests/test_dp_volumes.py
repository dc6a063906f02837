"""The item DP at real volumes (policies/dp_optimal.py's coarse lattice, docs/methods.md "The DP at real volumes") and
its certificate (policies/dp_certificate.py) against independently derived numbers: the integer demand law split by
hand onto the multiples of the step, the exact lattice's DP value (the certificate never above it and within 1% of it
on random items, and above it without its margins), the DP's own policy at n = 1 (the lookahead on coarse tables, and
on any cap, within 0.3% of its exact-lattice self), one lattice for every entry point, and the lattice the paper's
family keeps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from envs import demand_law
from envs.dynamics import State
from envs.evaluation import evaluate, paired_comparison
from envs.exogenous import sample_paths
from envs.instance import LMAX, Instance, paper_instance
from plumbing.errors import InputError
from policies import decomposition, dp_certificate, dp_optimal, lookahead
from policies.decomposition import DecompositionOptions, check_items, combine, item_figures, item_tables

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
    dmax = demand_law.demand_top(rates, phi, 1e-13)
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
    fixture of tests/test_demand_model.py); an item selling hundreds a period with overdispersion gets a step of at most
    half its cap and a twentieth of its lead-time spread, unless that would take more than SPREAD_POSITIONS x
    MAX_POSITIONS positions (lam 10,000 at phi 10: a 1e-13 tail of millions of units), and its domain stays within
    twice that many positions."""
    options = DecompositionOptions()
    paper = paper_instance(16, seed=3)
    for i in range(paper.n):
        assert dp_optimal.check_item(decomposition.item_instance(paper, i, 1.0), 50, **options.dp_settings()).step == 1
    largest = dp_optimal.SPREAD_POSITIONS * dp_optimal.MAX_POSITIONS
    for lam, phi, lead in ((300.0, 2.0, 2), (507.0, 2.5, 3), (10000.0, 0.0, 1), (10000.0, 10.0, 4)):
        one = item(lam, phi, lead)
        lattice = dp_optimal.check_item(one, 50, **options.dp_settings())
        cap = math.ceil(4 * lam)
        assert 1 < lattice.step <= cap // 2 and lattice.cap == cap
        span = dp_optimal.item_span(one, **options.dp_settings())
        spread_limit = dp_optimal.lead_time_spread(lam, phi, lead, 0.4, 0.7) / dp_optimal.RESOLUTION
        assert lattice.step <= max(spread_limit, math.ceil(span / largest)), (lam, phi, lattice.step, spread_limit)
        problem = dp_optimal._prepare(one, 50, **options.dp_settings(21))
        positions = problem.lattice.positions(problem.low_unit, math.ceil(problem.upper / problem.lattice.step))
        assert positions.size <= 2 * largest + 2, (lam, phi, positions.size)


# ---- the certificate: a proven lower bound on the exact lattice's value --------------------------------------


PRIMES = (7, 11, 13, 31, 61, 127, 131, 211, 509, 1009, 2003, 4001)


def random_items(seed: int, count: int, largest_lam: float) -> list[tuple[Instance, float]]:
    """(item, setup cost) pairs drawn as a user's catalogue might hold them: lam log-uniform in [0.5, largest_lam], phi 0
    or uniform in [0, 10], lead 1-4, loading 0-0.6, rho 0-0.9, h/b from 1/50 to 9/1, and a cap that is a prime at or
    above lam, just above lam (2-30%) or 4 lam; setup costs from a tenth of lam to 100 lam."""
    rng = np.random.default_rng(seed)
    items = []
    while len(items) < count:
        lam = float(np.exp(rng.uniform(math.log(0.5), math.log(largest_lam))))
        primes = [p for p in PRIMES if p > lam + 1]
        caps = [math.ceil(lam * rng.uniform(1.02, 1.3)), math.ceil(4 * lam)] + ([int(rng.choice(primes))] if primes else [])
        cap = max(int(rng.choice(caps)), math.floor(lam) + 1)
        h, b = [(1.0, 9.0), (9.0, 1.0), (1.0, 50.0), (1.0, 1.0)][rng.integers(4)]
        phi = float(rng.choice([0.0, rng.uniform(0.0, 10.0)]))
        one = Instance(
            h=[h],
            b=[b],
            lam=[lam],
            beta=[float(rng.uniform(0.0, 0.6))],
            lead=[int(rng.integers(1, 5))],
            qbar=[float(cap)],
            K=0.0,
            gamma=0.95,
            rho=float(rng.uniform(0.0, 0.9)),
            overdispersion=[phi] if phi else None,
        )
        items.append((one, float(lam * 10 ** rng.uniform(-1, 2))))
    return items


CERTIFY = dict(factor_points=5, integer_cap=True, floor_periods=1)
"""The bound's DP settings (policies.decomposition.DecompositionOptions.dp_settings) on a small factor grid."""


def exact_value(one: Instance, setup: float, horizon: int) -> float:
    return float(dp_optimal.expected_costs(one, horizon, [setup], step=1, **CERTIFY)[0])


def forced_cases(count: int) -> list[tuple[Instance, float, int]]:
    """Items of `random_items` with small exact lattices, each on a coarse step drawn from 2 to half its cap (below
    the step their spread would ask for, and often not a divisor of the cap)."""
    cases = []
    for k, (one, setup) in enumerate(random_items(11, count, 60.0)):
        cap = int(one.qbar[0])
        if cap >= 4:
            cases.append((one, setup, 2 + k % (cap // 2 - 1)))
    return cases


def violations(cases, horizon: int = 8) -> list:
    """The cases whose certificate on their forced step is above their exact lattice's value."""
    above = []
    for one, setup, step in cases:
        certificate = float(dp_certificate.certified_costs(one, horizon, [setup], step=step, **CERTIFY)[0])
        exact = exact_value(one, setup, horizon)
        if certificate > exact + 1e-9 * abs(exact):
            above.append((one, setup, step, certificate, exact))
    return above


def test_the_certificate_is_never_above_the_exact_lattice_whatever_the_step():
    """80 random items (lam 0.5-60, phi 0-10, lead 1-4, prime and tight caps, h/b 1/50 to 9/1; the slow test takes
    300) on coarse steps up to half their cap, most of them far coarser than the lattice rule would choose and many not
    dividing the cap: the certificate is never above the exact lattice's optimum on the same factor grid. The broken
    controls find items above it: the sag margins dropped (the interpolant of the coarse values alone), and the cap's
    last partial step dropped (the window rounded down to whole steps)."""
    cases = forced_cases(80)
    assert sum(int(one.qbar[0]) % step != 0 for one, _, step in cases) >= 20
    assert violations(cases) == []
    original_margins, original_min = dp_certificate._margins, dp_certificate._bellman_min
    try:
        dp_certificate._margins = lambda kinks, step: np.zeros_like(kinks)
        assert len(violations(cases)) >= 10
        dp_certificate._margins = original_margins
        dp_certificate._bellman_min = lambda omega, setups, window, rest, step, **top: original_min(omega, setups, window, 0, step, **top)
        assert len(violations(cases)) >= 3
    finally:
        dp_certificate._margins, dp_certificate._bellman_min = original_margins, original_min


@pytest.mark.slow
def test_the_certificate_is_never_above_the_exact_lattice_on_300_random_items():
    cases = forced_cases(360)
    assert len(cases) >= 300 and violations(cases) == []


def tightness(items, horizon: int, largest_span: float) -> tuple[int, float]:
    """(how many items sat on a coarse lattice, the largest relative shortfall of the certificate) over the items whose
    exact domain spans at most `largest_span` units, each on the lattice the item's DP chooses; asserts validity."""
    coarse, worst = 0, 0.0
    for one, setup in items:
        if dp_optimal.item_span(one, **CERTIFY) > largest_span:
            continue
        value = dp_optimal.expected_costs(one, horizon, [setup], **CERTIFY)
        certificate = float(dp_certificate.certified_costs(one, horizon, [setup], value, **CERTIFY)[0])
        exact = exact_value(one, setup, horizon)
        assert certificate <= exact + 1e-9 * abs(exact), (one, setup, certificate, exact)
        worst = max(worst, (exact - certificate) / exact)
        coarse += dp_optimal.check_item(one, horizon, **CERTIFY).step > 1
    return coarse, worst


def test_the_certificate_is_within_one_percent_on_the_lattice_each_item_gets():
    """Random items across lam 0.5-2,000 (the first 120 of the slow test's 300 whose exact lattice spans at most 40,000
    units): on the lattice the item's DP chooses (a twentieth of its lead-time spread), the certificate is never above
    the exact lattice's optimum and within 1% of it."""
    coarse, worst = tightness(random_items(12, 120, 2000.0), 12, 40_000)
    assert coarse >= 8 and worst <= 0.01, (coarse, worst)


@pytest.mark.slow
def test_the_certificate_is_within_one_percent_on_300_random_items():
    """As above over all 300 items whose exact lattice spans at most 1,000,000 units (its DP takes up to about a minute
    and a few GB there; the rest, heavy tails of lam in the thousands, span up to tens of millions)."""
    coarse, worst = tightness(random_items(12, 300, 2000.0), 12, 1_000_000)
    assert coarse >= 40 and worst <= 0.01, (coarse, worst)


def test_the_certificate_domain_ends_at_the_stationary_law_quantile(monkeypatch):
    """stationary_quantile by hand: factor weights 0.8 and 0.2, one period's demand {0, 1} with 1/2 each and {1, 2, 3, 4}
    with 0.2, 0.3, 0.3, 0.2 (lattice steps of 2 units): P(D > k steps) = 0.6, 0.16, 0.1, 0.04, 0 for k = 0..4, so a tail of
    0.05 ends it at 3 steps (6 units), 0.12 at 2 (4 units); a law cut before its tail is reached ends nowhere (infinite)."""
    weights = np.array([0.8, 0.2])
    law = np.array([[0.5, 0.5, 0.0, 0.0, 0.0], [0.0, 0.2, 0.3, 0.3, 0.2]])
    monkeypatch.setattr(dp_certificate, "CERTIFICATE_TAIL", 0.05)
    assert dp_certificate.stationary_quantile(law, weights, 2) == 6.0
    assert dp_certificate.stationary_quantile(law[:, :4], weights, 2) == 6.0  # 0.04 beyond 3 steps: reached at its last point
    monkeypatch.setattr(dp_certificate, "CERTIFICATE_TAIL", 0.01)
    assert dp_certificate.stationary_quantile(law[:, :4], weights, 2) == math.inf
    monkeypatch.setattr(dp_certificate, "CERTIFICATE_TAIL", 0.12)
    assert dp_certificate.stationary_quantile(law, weights, 2) == 4.0


def test_the_certificate_grows_its_domain_only_while_it_is_short_of_its_gap(monkeypatch):
    """A Poisson retail item (lam 300, lead 2: bench/dp_volumes.py's) whose first pass has an order's best target at the
    domain's top but lies within CERTIFICATE_GAP of the DP's value: one pass, its bound. The control: with every bound
    short of its gap (CERTIFICATE_GAP -1, refining stopped at once) the same step runs again on a growing domain."""
    one = Instance(h=[1.0], b=[9.0], lam=[300.0], beta=[0.4], lead=[2], qbar=[1200.0], K=100.0, gamma=0.95, rho=0.8)
    options = DecompositionOptions()
    settings = options.dp_settings(options.coarse_points)
    setups = [5.0, 20.0, 80.0, 320.0, 1280.0]
    value = dp_optimal.expected_costs(one, 50, setups, **settings)
    passes, certified = [], dp_certificate._certified

    def counted(instance, horizon, costs, settings, widen=True):
        passes.append((settings["step"], widen))
        return certified(instance, horizon, costs, settings, widen)

    monkeypatch.setattr(dp_certificate, "_certified", counted)
    bound = dp_certificate.certified_costs(one, 50, setups, value, **settings)
    step = dp_optimal.check_item(one, 50, **settings).step
    first, touched = certified(one, 50, setups, {**settings, "integer_cap": True, "step": step}, widen=False)
    assert touched and passes == [(step, False)] and np.array_equal(bound, first)
    assert np.max((value - bound) / value) <= dp_certificate.CERTIFICATE_GAP
    passes.clear()
    monkeypatch.setattr(dp_certificate, "CERTIFICATE_GAP", -1.0)
    monkeypatch.setattr(dp_certificate, "CERTIFICATE_POSITIONS", 0)
    dp_certificate.certified_costs(one, 50, setups, value, **settings)
    assert passes == [(step, False), (step, True)]


def test_the_certificate_refines_its_step_until_it_is_within_its_gap():
    """finer_step aims the gap at 3/4 of the gap allowed: after one step all of it is taken for sag margins (square of
    the step), 240 * sqrt(0.75 * 0.005 / 0.00584) = 192.07 -> 192; after two the part that does not shrink is fitted:
    2.645% at step 62 and 0.779% at 23 leave 0.48% that no step removes (a fitted item's DP, the bound's settings), so
    it stops; 0.584% at 240 and 0.45% at 204 leave 0.101%, so sqrt((0.375 - 0.101)% / c) = 180.7 -> 180. At most one
    unit finer, never below 1. A retail item (lam 5, phi 10, lead 4, cap 20; the bound's settings) whose certificate on
    its DP's own step, 5 units, lies more than 0.5% below the DP's value ends within 0.5% of it on a finer step, and at
    least at the first step's bound (it keeps the largest of valid bounds)."""
    assert dp_certificate.finer_step([240], [0.00584]) == 192
    assert dp_certificate.finer_step([62, 23], [0.02645, 0.00779]) is None
    assert dp_certificate.finer_step([240, 204], [0.00584, 0.0045]) == 180
    assert dp_certificate.finer_step([5], [0.0051]) == 4 and dp_certificate.finer_step([2], [1.0]) == 1
    one = Instance(h=[1.0], b=[9.0], lam=[5.0], beta=[0.4], lead=[4], qbar=[20.0], K=100.0, gamma=0.95, rho=0.8, overdispersion=[10.0])
    options = DecompositionOptions()
    settings = options.dp_settings(options.coarse_points)
    setups = [5.0, 20.0, 80.0, 320.0, 1280.0]  # bench/dp_volumes.py's
    value = dp_optimal.expected_costs(one, 50, setups, **settings)
    assert dp_optimal.check_item(one, 50, **settings).step == 5
    first = dp_certificate.certified_costs(one, 50, setups, **settings)  # no reference: the DP's own step alone
    refined = dp_certificate.certified_costs(one, 50, setups, value, **settings)
    assert np.max((value - first) / value) > dp_certificate.CERTIFICATE_GAP  # the control: the first step is not enough
    assert np.max((value - refined) / value) <= dp_certificate.CERTIFICATE_GAP and np.all(refined >= first)


ISSUE_ITEM = dict(h=[1.0], b=[9.0], lam=[5.0], beta=[0.2], lead=[2], qbar=[6.0], gamma=0.95, rho=0.8, overdispersion=[10.0])


@pytest.mark.parametrize("K", [2.0, 25.0])
def test_the_conservative_figure_of_a_heavy_tailed_item_with_a_tight_cap_is_below_its_exact_optimum(K):
    """lam 5, phi 10, cap 6 at the default options: its lattice keeps single units (a step of 6, the whole cap, left it
    only all-or-nothing orders and a conservative figure 0.9 above the exact optimum at K = 2), its conservative figure
    is at most the exact optimum and within 1% of it."""
    one = Instance(**ISSUE_ITEM, K=K)
    options = DecompositionOptions()
    record = item_figures(one, 0, {"best": K, "equal": K}, 50, sample_paths(one, 7, 4, 50), options)
    figures = combine([record], "best", options)
    exact = dp_optimal.expected_costs(decomposition.item_instance(one, 0, 0.0), 50, [K], step=1, **options.dp_settings())[0]
    assert record["lattice_step"] < 6
    assert 0.99 * exact <= figures["conservative"] <= figures["certified"] <= exact + 1e-9 * exact


def test_the_bound_certifies_coarse_items_below_their_exact_lattice():
    """Items forced onto coarse lattices through the bound's own option (max_positions 60): each record's certified
    value is at most its exact lattice's value and below its coarse value, and the conservative figure below both."""
    options = DecompositionOptions(factor_points=9, coarse_points=5, max_positions=60)
    for case in (dict(lam=60.0, phi=3.0, lead=1), dict(lam=400.0, phi=0.0, lead=3, qbar=1601.0)):
        one = item(**case)
        record = item_figures(one, 0, {"best": one.K, "equal": one.K}, HORIZON, sample_paths(one, 7, 4, HORIZON), options)
        figures = combine([record], "best", options)
        exact = dp_optimal.expected_costs(decomposition.item_instance(one, 0, 0.0), HORIZON, [one.K], step=1, **options.dp_settings())[0]
        assert record["lattice_step"] > 1, case
        assert figures["conservative"] <= figures["certified"] <= exact + 1e-9 * exact, (case, figures, exact)
        assert figures["certified"] < figures["value"], (case, figures)


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


# ---- the lattice keeps the problem ---------------------------------------------------------------------------


def test_every_entry_point_puts_an_item_on_one_lattice_that_orders_less_than_its_cap():
    """dp-optimal with its defaults (121 factor points, its own cap, a floor of L + 1 periods), the bound (41 points,
    the cap ceil(qbar), a floor of one period) and the lookahead's tables choose the same step for every random item
    (they differed for lam 30, phi 2, qbar 120: steps 24 and 16), and no step is more than half the cap (lam 5, phi 10,
    qbar 6 had the step 6: only all-or-nothing orders)."""
    options = DecompositionOptions()
    for one, _ in random_items(13, 60, 2000.0) + [(item(30.0, 2.0, 2, qbar=120.0), 0.0), (Instance(**ISSUE_ITEM, K=2.0), 0.0)]:
        steps = {
            dp_optimal.check_item(one, 50, stages=None).step,
            dp_optimal.check_item(one, 50, **options.dp_settings()).step,
            dp_optimal.check_item(one, 50, **options.dp_settings(integer_cap=decomposition.tables_relax_cap(float(one.qbar[0])))).step,
        }
        assert len(steps) == 1, (one, steps)
        assert steps.pop() <= max(1, math.ceil(float(one.qbar[0])) // 2), one


def test_a_cap_the_step_does_not_divide_is_kept_exactly():
    """lam 100, phi 0.5 and a prime cap of 131 on a coarse lattice (step 6): dp-optimal's value is within 0.3% of the
    exact lattice's (the cap rounded down to 120 cost 23%, rounded up in the bound 19% below), and from a deep backlog its
    policy orders exactly 131."""
    one = item(100.0, 0.5, 2, qbar=131.0, K=500.0, beta=0.2)
    settings = dict(factor_points=9)
    coarse = dp_optimal.solve(one, HORIZON, **settings)
    assert coarse.lattice.step > 1 and 131 % coarse.lattice.step != 0
    exact = dp_optimal.expected_costs(one, HORIZON, [500.0], step=1, **settings)[0]
    assert abs(coarse.expected_cost - exact) <= 0.003 * exact, (coarse.expected_cost, exact)
    state = State(
        torch.tensor([[-400.0]], dtype=torch.float64), torch.zeros(1, 1, LMAX - 1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    )
    opens, quantity = dp_optimal.DPOptimalPolicy(coarse)(state, one.to_torch(dtype=torch.float64))
    assert opens.item() == 1.0 and quantity.item() == pytest.approx(131.0)


LOOKAHEAD_CASES = {
    "lam 30, phi 2, cap 120": (item(30.0, 2.0, 2, qbar=120.0, K=150.0, beta=0.2), False),
    "lam 100, phi 0.5, prime cap 131": (item(100.0, 0.5, 2, qbar=131.0, K=500.0, beta=0.2), False),
    "lam 10, phi 2, lead 3, h 9, b 1": (item(10.0, 2.0, 3, h=9.0, b=1.0, K=450.0, beta=0.2), True),
    "lam 500, phi 2, lead 4, prime cap 2003": (item(500.0, 2.0, 4, qbar=2003.0, K=2000.0), True),
    "lam 2000, Poisson, tight cap 2081, h 1, b 50": (item(2000.0, 0.0, 1, qbar=2081.0, b=50.0, K=5000.0), True),
    "lam 1, phi 10, lead 4, cap 9": (item(1.0, 10.0, 4, qbar=9.0, K=30.0), True),
    "lam 300, phi 10, lead 1, cap 1201": (item(300.0, 10.0, 1, qbar=1201.0, K=3000.0), True),
}


@pytest.mark.parametrize(
    "case", [pytest.param(name, marks=[pytest.mark.slow] if slow else []) for name, (_, slow) in LOOKAHEAD_CASES.items()]
)
def test_the_one_item_lookahead_is_within_three_per_mille_of_its_exact_lattice_self(case):
    """The one-item lookahead on the lattice its item gets against the lookahead on the exact lattice, paired over 2,000
    episodes (9 factor points, T = 12): within 0.3% of the exact one's cost (plus two paired standard errors); the
    issue's three cases (+1.3%, +1.8% and +14.6% before) and items of lam 1-2,000, phi 0-10, lead 1-4, prime and tight
    caps, b/h up to 50 (slow)."""
    one = LOOKAHEAD_CASES[case][0]
    policies = []
    for max_positions in (dp_optimal.MAX_POSITIONS, 10**9):
        options = DecompositionOptions(factor_points=9, coarse_points=5, max_positions=max_positions)
        items = item_tables(one, HORIZON, options, dtype="float32", forms=("finite",))
        policies.append(lookahead.LookaheadPolicy(lookahead.LookaheadTables.from_items(items, "finite", HORIZON, ""), 1.0))
    paths = sample_paths(one, 4, 2000, HORIZON)
    ours, reference = (decisions(policy, one, paths) for policy in policies)
    comparison = paired_comparison(ours.discounted_cost, reference.discounted_cost)
    assert comparison.mean_difference <= 0.003 * reference.mean + 2 * comparison.se, (case, comparison, reference.mean)


def test_a_long_solve_says_its_size_and_time_before_it_starts(capsys, monkeypatch):
    """dp-optimal with progress on an item whose DP is estimated above LONG_SOLVE seconds (the limit lowered to 0 here)
    writes its positions and estimated seconds before the solve, then a bar over the backward pass; a solve below the
    limit, or without progress, writes nothing. The estimate counts every phase: a second setup cost adds one backward
    pass (the estimate at horizon = lead, no decision step, is the preparation alone), and a horizon of no decision step
    still costs its preparation."""
    one = item(300.0, 2.0, 2)
    positions, seconds = dp_optimal.estimated_seconds(one, HORIZON, factor_points=9)
    preparation = dp_optimal.estimated_seconds(one, 2, factor_points=9)[1]
    assert positions > 100 and 0 < preparation < seconds
    assert dp_optimal.estimated_seconds(one, HORIZON, 2, factor_points=9)[1] == pytest.approx(2 * seconds - preparation)
    dp_optimal.dp_optimal_policy(one, HORIZON, progress=True, factor_points=9)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(dp_optimal, "LONG_SOLVE", 0.0)
    dp_optimal.dp_optimal_policy(one, HORIZON, progress=False, factor_points=9)
    assert capsys.readouterr().err == ""
    dp_optimal.dp_optimal_policy(one, HORIZON, progress=True, factor_points=9)
    err = capsys.readouterr().err
    assert err.startswith(f"dp-optimal: a DP of about {positions:,} positions; about ") and "factor points" in err, err


# ---- the domain's ends: the value at x_0 exact, the certificate sound whatever its ends ----------------------------------


def reachable_value(one: Instance, horizon: int, setup: float, points: int = 5) -> float:
    """The item's optimum on the chain (integer start and cap: the exact lattice is the integers) computed over the positions
    reachable from x_0 alone: V_t at x_0 - t dmax..x_0 + t q, W_t up to one cap higher, with no floor, no top and nothing
    extrapolated (NaN elsewhere: reading one fails); the laws by scipy, the lead-time law by direct convolution."""
    lam, beta, cap, lead = float(one.lam[0]), float(one.beta[0]), math.ceil(one.qbar[0]), int(one.lead[0])
    h, b, gamma, phi = float(one.h[0]), float(one.b[0]), one.gamma, dp_optimal.item_overdispersion(one)
    x0 = round(float(one.mu[0]))
    grid = dp_optimal.tauchen_grid(one.rho, points)
    rates = lam * np.exp(beta * grid.points - beta * beta / 2)
    law = stats.nbinom(1 / phi, 1 / (1 + phi * rates[:, None])) if phi else stats.poisson(rates[:, None])
    dmax = int(law.isf(1e-13)[-1, 0]) + 1  # the DP's truncation at the largest rate
    pmf = law.pmf(np.arange(dmax + 1)[None, :])
    pmf[:, -1] += 1 - pmf.sum(1)
    sums = [pmf]
    for _ in range(lead):
        sums.append(np.stack([np.convolve(p, q) for p, q in zip(pmf, grid.transition @ sums[-1])]))

    def loss(law_s, y):  # E[h (y - S)^+ + b (S - y)^+] at positions y [N]: [M, N]
        s = np.arange(law_s.shape[1])
        return ((h * np.clip(y[:, None] - s, 0, None) + b * np.clip(s - y[:, None], 0, None)) @ law_s.T).T

    steps = max(horizon - lead, 0)
    lo = x0 - steps * dmax
    y = np.arange(lo, x0 + steps * cap + 1)
    charge = gamma**lead * loss(sums[lead], y)  # [M, N]
    value = np.zeros((points, y.size))
    for t in range(steps - 1, -1, -1):
        mixed = grid.transition @ value
        w = np.full_like(value, np.nan)
        k = np.nonzero((y >= x0 - t * dmax) & (y <= x0 + (t + 1) * cap))[0]
        w[:, k] = charge[:, k] + gamma * sum(pmf[:, [d]] * mixed[:, k - d] for d in range(dmax + 1))
        value = np.full_like(value, np.nan)
        x = np.nonzero((y >= x0 - t * dmax) & (y <= x0 + t * cap))[0]
        windows = np.lib.stride_tricks.sliding_window_view(w, cap + 1, axis=1)[:, x]  # [M, |x|, cap + 1]: y in [x, x + cap]
        value[:, x] = np.minimum(w[:, x], setup + windows.min(2))
    sunk = sum(gamma**s * loss(sums[s], np.array([x0]))[:, 0] for s in range(min(lead, horizon)))
    start = value[:, x0 - lo]
    assert not np.isnan(start).any()
    return float(grid.initial @ (sunk + start))


END_ITEMS = {  # a large loading over a small cap (the ends far inside the old ones), a heavy tail, a moderate item
    "lam 2, beta 1.2, cap 3": dict(lam=2.0, phi=0.0, lead=1, qbar=3.0, K=10.0, beta=1.2),
    "lam 2, phi 2, cap 12, lead 2": dict(lam=2.0, phi=2.0, lead=2, qbar=12.0, K=30.0, beta=0.3),
    "lam 4, phi 0.5, cap 9, lead 2": dict(lam=4.0, phi=0.5, lead=2, qbar=9.0, K=3.0, beta=0.4),
}


@pytest.mark.parametrize("name", list(END_ITEMS))
def test_the_value_at_the_start_is_exact_on_the_reach_ends_and_the_certificate_below_it_whatever_its_ends(name, monkeypatch):
    """On the domain `reach_ends` gives (below -T_dec q the value is linear; above x_0 + T_dec q nothing reachable lies),
    the exact lattice's value at x_0 is the optimum over the reachable positions (`reachable_value`, to 1e-10); the
    certificate on coarse steps is below it, and stays below with ends far too narrow (a top below x_0: the bound above
    the top carries it). Broken controls: ends a cap from x_0 move the DP's value; the narrow top without the bound above
    it puts the certificate above the optimum."""
    case = dict(END_ITEMS[name])
    one = item(**case)
    setup, horizon = case["K"], 8
    optimum = reachable_value(one, horizon, setup)
    assert dp_optimal.expected_costs(one, horizon, [setup], step=1, **CERTIFY)[0] == pytest.approx(optimum, rel=1e-10)
    for step in (2, 3):
        assert dp_certificate.certified_costs(one, horizon, [setup], step=step, **CERTIFY)[0] <= optimum + 1e-9 * optimum
    own = dp_optimal.reach_ends
    monkeypatch.setattr(dp_optimal, "reach_ends", lambda x0, cap, step, n: (min(x0, 0.0) - 2 * step, x0 + cap + 2 * step))
    assert abs(dp_optimal.expected_costs(one, horizon, [setup], step=1, **CERTIFY)[0] - optimum) > 1e-4 * optimum
    monkeypatch.setattr(dp_optimal, "reach_ends", lambda x0, cap, step, n: (own(x0, cap, step, n)[0], x0 - 2 * step))
    certificates = [dp_certificate.certified_costs(one, horizon, [setup], step=step, **CERTIFY)[0] for step in (2, 3)]
    assert max(certificates) <= optimum
    monkeypatch.setattr(dp_certificate, "_above_top", lambda means, y, h, gamma, lead: np.full(means[0].shape, np.inf))
    certificates = [dp_certificate.certified_costs(one, horizon, [setup], step=step, **CERTIFY)[0] for step in (2, 3)]
    assert max(certificates) > optimum


def test_the_certificate_grows_its_domain_only_where_a_best_target_inside_it_is_its_top():
    """dp_certificate._bellman_min asks for a wider domain where an order's best target inside the domain is its top
    point, not where the lower bound above the top (`beyond`, a holding-cost bound far below the values) is the least:
    that bound is below the values at every step, so asking there widened a retail item's domain 32 times and refused it
    (item-040 of docs/fitting.md's 55-item example: lam 142.5, qbar 571, step 3). omega with its minimum inside asks
    for nothing; omega falling to the top asks for more; the control, the criterion that counts `beyond`, asks in both."""
    setups, beyond = np.array([1.0]), np.array([0.5])
    valley = np.array([5.0, 4.0, 3.0, 4.0, 5.0, 6.0])[None, None, :]
    falling = np.array([6.0, 5.0, 4.0, 3.0, 2.0, 1.0])[None, None, :]
    assert not dp_certificate._bellman_min(valley, setups, 2, 0, 1, beyond)[1]
    assert dp_certificate._bellman_min(falling, setups, 2, 0, 1, beyond)[1]

    def counting_beyond(omega):  # the control: the best target taken with `beyond`, as the widening test
        top = np.arange(omega.shape[-1]) + 2 >= omega.shape[-1] - 1
        best = np.where(
            top, np.minimum(dp_optimal.window_min(omega[0], 2)[None], beyond[None, :, None]), dp_optimal.window_min(omega[0], 2)[None]
        )
        return (setups[:, None, None] + best < omega) & top & (best >= np.minimum(omega[..., -1:], beyond[None, :, None]))

    assert counting_beyond(valley).any() and counting_beyond(falling).any()
