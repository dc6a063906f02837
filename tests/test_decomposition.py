"""The decomposition lower bound (policies/decomposition.py) against independently derived numbers:
the exact joint optimum of tiny two-item instances from a brute-force joint DP written here, the n = 1
DP optimum, and the best split of known concave functions by exhaustive search."""

import dataclasses
import itertools
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from scipy import stats

from envs.exogenous import ExogenousPaths, sample_paths
from envs.instance import Instance
from plumbing.errors import InputError
from policies import dp_optimal
from policies.decomposition import (
    DecompositionOptions,
    best_split,
    certificate_note,
    check_caps,
    combine,
    item_figures,
    item_instance,
    item_values,
    refine,
    search_split,
    split_upper_bound,
)

TINY = DecompositionOptions(factor_points=5, coarse_points=3, factor_width=1.0, rounds=6, tolerance=1e-6)


def two_items(beta: float = 0.0, K: float = 6.0, rho: float = 0.5) -> Instance:
    """Integer starts (x_0 = lam (L + 1)) and caps, so integer quantities are optimal in the joint problem too."""
    return Instance(h=[1.0, 0.5], b=[6.0, 9.0], lam=[1.0, 2.0], beta=[beta, beta], lead=[1, 1], qbar=[3.0, 4.0], K=K, gamma=0.9, rho=rho)


def serial_values(instance: Instance, horizon: int, points: int, options: DecompositionOptions):
    def values_of(round_, grids):
        return [item_values(instance, i, g, horizon, points, options) if g else [] for i, g in enumerate(grids)]

    return values_of


# ---- the joint optimum by brute force ---------------------------------------------------------------


def joint_optimum(instance: Instance, horizon: int, points: int, width: float = dp_optimal.DEFAULT_FACTOR_WIDTH) -> float:
    """The exact optimum of the two-item JRP with L = 1 on the Tauchen chain of `points` points, from the
    original dynamics: state (I_1, I_2, F), step cost K Y + sum_i h_i [I_i - D_i]^+ + b_i [D_i - I_i]^+, then
    I' = I - D + Y Q with Q_i in {0, .., qbar_i} (integer quantities are optimal here: integer starts and
    caps, costs piecewise linear with integer breakpoints). Every joint action is enumerated on every
    integer state the horizon can reach."""
    assert instance.n == 2 and all(instance.lead == 1)
    grid = dp_optimal.tauchen_grid(instance.rho, points, width)
    caps = instance.qbar.astype(int)
    x0 = (instance.lam * 2).astype(int)
    rates = [instance.lam * np.exp(instance.beta * f - instance.beta**2 / 2) for f in grid.points]  # [M][2]
    dtop = int(max(stats.poisson.isf(1e-14, r).max() for r in rates)) + 1
    lo, hi = x0 - horizon * dtop, x0 + horizon * caps
    size = hi - lo + 1
    I1, I2 = np.meshgrid(np.arange(lo[0], hi[0] + 1), np.arange(lo[1], hi[1] + 1), indexing="ij")
    actions = [(0, 0, 0)] + [(1, q1, q2) for q1 in range(caps[0] + 1) for q2 in range(caps[1] + 1)]
    value = np.zeros((len(grid.points), *size))  # V_T = 0
    for _t in range(horizon - 1, -1, -1):
        new = np.empty_like(value)
        for f in range(len(grid.points)):
            p = [stats.poisson.pmf(np.arange(dtop + 1), rates[f][i]) for i in range(2)]
            following = np.tensordot(grid.transition[f], value, axes=1)  # E[V_{t+1}(., F_{t+1}) | F_t = f]
            padded = np.full((size[0] + dtop, size[1] + dtop), np.nan)
            padded[dtop:, dtop:] = following
            stage = np.zeros(I1.shape)
            after = np.zeros(I1.shape)  # E[V_{t+1}(z - D)] at every post-order level z
            for d1, d2 in itertools.product(range(dtop + 1), repeat=2):
                w = p[0][d1] * p[1][d2]
                stage += w * (
                    instance.h[0] * np.maximum(I1 - d1, 0)
                    + instance.b[0] * np.maximum(d1 - I1, 0)
                    + instance.h[1] * np.maximum(I2 - d2, 0)
                    + instance.b[1] * np.maximum(d2 - I2, 0)
                )
                after += w * padded[dtop - d1 : dtop - d1 + size[0], dtop - d2 : dtop - d2 + size[1]]
            best = np.full(I1.shape, np.inf)
            for y, q1, q2 in actions:
                shifted = np.full(I1.shape, np.nan)  # after[I + q]
                shifted[: size[0] - q1, : size[1] - q2] = after[q1:, q2:]
                best = np.fmin(best, instance.K * y + instance.gamma * shifted)
            new[f] = stage + best
        value = new
    i0 = tuple(x0 - lo)
    return float(grid.initial @ value[:, i0[0], i0[1]])


# ---- the bound ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("beta, points, horizon", [(0.0, 1, 4), (0.6, 3, 3)], ids=["iid-demand", "factor-chain"])
def test_bound_lies_below_the_joint_optimum_and_the_best_split_above_every_other(beta, points, horizon):
    """n = 2, L = 1: every split's value lies below the exact joint optimum (same factor chain: 3 points
    over +-1 s.d.; measured 35.32 against 35.52, and 25.20 against 26.06 with iid demand); the searched
    split is at least as high as equal shares, and every split of a fine scan of k_1 lies at most the
    search's certificate gap above it, whatever round the search stopped at (a certificate that is not an
    upper bound, or chords above the values, fail here)."""
    inst = two_items(beta=beta)
    joint = joint_optimum(inst, horizon, points, width=TINY.factor_width)
    grid_points = points if beta > 0 else 3  # beta = 0: the factor is irrelevant, any grid gives the same values
    for rounds in range(1, TINY.rounds + 1):
        options = replace(TINY, rounds=rounds)
        search = search_split(inst, options, serial_values(inst, horizon, grid_points, options))
        shares = search.split.shares
        assert shares.sum() <= inst.K + 1e-9 and (shares >= 0).all()
        exact = sum(item_values(inst, i, [shares[i]], horizon, grid_points, TINY)[0] for i in range(2))
        assert exact >= search.split.value - 1e-9  # the chords lie below the values
        assert search.upper >= exact - 1e-9
        assert exact <= joint + 1e-9, (exact, joint)
        scan = np.linspace(0.0, inst.K, 25)
        others = item_values(inst, 0, scan, horizon, grid_points, TINY) + item_values(inst, 1, inst.K - scan, horizon, grid_points, TINY)
        assert others.max() - exact <= search.upper - search.split.value + 1e-9
    equal = sum(item_values(inst, i, [inst.K / 2], horizon, grid_points, TINY)[0] for i in range(2))
    assert exact >= equal - 1e-9
    assert joint - exact < 0.25 * joint  # a bound worth having: the relaxation costs less than a quarter here


@pytest.mark.parametrize("beta, points, horizon", [(0.0, 1, 4), (0.6, 3, 3)], ids=["iid-demand", "factor-chain"])
def test_split_search_certifies_its_tolerance_within_its_rounds(beta, points, horizon):
    """The search converges: with a tolerance of 1e-4 (far above rounding, about 1e-15 of the value) it
    certifies within half its 12 rounds (measured: 3 and 4 rounds), and then no split of a fine scan of k_1
    is more than the tolerance above the searched split. A refinement that does not close in on the best
    split (e.g. new shares away from it) stops uncertified and fails here."""
    inst = two_items(beta=beta)
    grid_points = points if beta > 0 else 3
    options = replace(TINY, rounds=12, tolerance=1e-4)
    search = search_split(inst, options, serial_values(inst, horizon, grid_points, options))
    summary = search.summary(options.tolerance)
    assert summary["certified"] and search.rounds <= 6, summary
    exact = sum(item_values(inst, i, [search.split.shares[i]], horizon, grid_points, TINY)[0] for i in range(2))
    scan = np.linspace(0.0, inst.K, 25)
    others = item_values(inst, 0, scan, horizon, grid_points, TINY) + item_values(inst, 1, inst.K - scan, horizon, grid_points, TINY)
    assert exact >= others.max() - options.tolerance * exact


def test_a_search_stopped_at_its_round_limit_says_not_certified_with_its_gap():
    """One round on the iid two-item instance cannot certify 1e-4 (its gap is measured near 0.6%): the
    summary says uncertified with the gap (upper - chords) / chords, and the note printed by bound.py and
    the report says "not certified" with that gap in %; with rounds to spare the same search says certified.
    Breaks if an uncertified search is reported as the best split."""
    inst = two_items()
    stopped = search_split(inst, replace(TINY, rounds=1, tolerance=1e-4), serial_values(inst, 4, 3, TINY))
    summary = stopped.summary(1e-4)
    gap = (stopped.upper - stopped.split.value) / stopped.split.value
    assert not summary["certified"] and summary["relative_gap"] == pytest.approx(gap) and gap > 1e-4
    assert certificate_note(summary) == f"best split not certified (gap {100 * gap:.3g}% at the round limit 1, tolerance 0.0001)"
    done = search_split(inst, replace(TINY, rounds=12, tolerance=1e-4), serial_values(inst, 4, 3, TINY)).summary(1e-4)
    assert done["certified"] and certificate_note(done).startswith("best split certified to ")


def test_best_split_ties_equal_slopes_by_item_and_never_moves_a_share_back():
    """Chord slopes that differ in the last bit (as BLAS and FFT kernels make them differ) are equal to the
    split: ties go to the lower item index, and an item's chords are taken left to right even where its
    slopes rise by a last bit. Breaks if the last bit orders the chords: item 1 would win the tie (shares
    [0, 2]), and item 0's last chord taken before its middle one moves item 0's share back (shares [2, 3],
    chords' value 6 instead of 6.5)."""
    ulp = 2.0**-52
    tie = best_split([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]], [[0.0, 1.0, 2.0], [0.0, 1.0 + ulp, 2.0 + 2 * ulp]], 2.0)
    np.testing.assert_array_equal(tie.shares, [2.0, 0.0])
    rising = best_split([[0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0]], [[0.0, 2.0, 3.0, 4.0 + 4 * ulp], [0.0, 2.0, 2.5, 3.0]], 5.0)
    np.testing.assert_array_equal(rising.shares, [3.0, 2.0])
    assert rising.value == pytest.approx(6.5, rel=1e-12)


def test_an_item_whose_cap_is_below_its_demand_is_refused_by_its_name_and_the_cause():
    """qbar 0.5 against lam 5.39 (a fitted item): the check made before any solve names the item as the instance
    names it and says why; the item's DP, solved anyway over a long horizon, fails naming the item and the same cause
    (not an anonymous 'positions exceed'). A cap equal to the demand passes the check, and an item of an instance
    without names is named by its index."""
    items = dict(h=[1.0, 0.5], b=[9.0, 9.0], lam=[5.39, 2.0], beta=[0.4, 0.0], lead=[3, 1], K=6.0, gamma=0.95, rho=0.8)
    short = Instance(**items, qbar=[0.5, 2.0], source={"item_names": ["widget", "gadget"]})
    with pytest.raises(InputError, match=r"^here: item 'widget': its order cap qbar 0.5 is below its mean demand lam 5.39 per period, so"):
        check_caps(short, "here")
    cause = "its order cap qbar 0.5 is below its mean demand lam 5.39 per period, so its backlog grows without bound"
    with pytest.raises(InputError, match=rf"^item 'widget': dp-optimal: optimal order-up-to positions exceed \d+: {cause}"):
        item_values(short, 0, [1.0], 180, 3, TINY)
    check_caps(Instance(**items, qbar=[5.39, 2.0]), "here")
    with pytest.raises(InputError, match=r"^here: item 0: its order cap"):
        check_caps(Instance(**items, qbar=[0.5, 2.0]), "here")


def test_one_item_bound_is_the_dp_optimum():
    """At n = 1 the best split gives the item all of K, and the bound is the n = 1 DP optimum (exact lattice:
    integer start and cap, so raising the cap to ceil(qbar) changes nothing)."""
    inst = Instance(h=[1.0], b=[9.0], lam=[3.0], beta=[0.4], lead=[2], qbar=[12.0], K=8.0, gamma=0.95, rho=0.8)
    options = DecompositionOptions(factor_points=9, coarse_points=5)
    search = search_split(inst, options, serial_values(inst, 12, options.coarse_points, options))
    assert search.split.shares[0] == pytest.approx(inst.K)
    paths = sample_paths(inst, 3, 16, 12)
    record = item_figures(inst, 0, {"best": search.split.shares[0]}, 12, paths, options)
    exact = dp_optimal.solve(inst, 12, factor_points=9)
    assert exact.exact_lattice
    assert record["best"]["value"] == pytest.approx(exact.expected_cost, rel=1e-9)
    assert record["best"]["coarse_value"] == pytest.approx(dp_optimal.solve(inst, 12, factor_points=5).expected_cost, rel=1e-9)


def test_integer_cap_relaxation_lies_below_the_exact_item_optimum():
    """From x_0 = 2.5 with cap 2.5 the relaxation (cap 3, positions Z and 0.5 + Z) is cheaper than the
    1/2-lattice optimum of the item itself, and equal to the optimum with the cap set to 3 outright."""
    inst = Instance(h=[1.0], b=[9.0], lam=[1.25], beta=[0.0], lead=[1], qbar=[2.5], K=4.0, gamma=0.9, rho=0.5)
    relaxed = dp_optimal.solve(inst, 8, factor_points=1, integer_cap=True)
    exact = dp_optimal.solve(inst, 8, factor_points=1)
    raised = dp_optimal.solve(
        Instance(h=[1.0], b=[9.0], lam=[1.25], beta=[0.0], lead=[1], qbar=[3.0], K=4.0, gamma=0.9, rho=0.5), 8, factor_points=1
    )
    assert relaxed.expected_cost <= exact.expected_cost + 1e-12
    assert relaxed.expected_cost == pytest.approx(raised.expected_cost, rel=1e-10)
    assert list(np.unique(np.mod(relaxed.positions, 1.0))) == [0.0, 0.5] and relaxed.window == 6


def test_batched_setup_costs_equal_one_solve_each():
    """One backward pass over several setup costs gives each one's own solve, values and tables alike."""
    inst = Instance(h=[1.2], b=[8.0], lam=[2.3], beta=[0.5], lead=[3], qbar=[9.2], K=5.0, gamma=0.95, rho=0.8)
    setups = [0.0, 2.5, 11.0]
    batch = dp_optimal.solve(inst, 10, factor_points=7, setups=setups)
    fast = dp_optimal.expected_costs(inst, 10, setups, factor_points=7)
    for k, solution, value in zip(setups, batch, fast):
        alone = dp_optimal.solve(item_instance(inst, 0, k), 10, factor_points=7)
        assert solution.expected_cost == pytest.approx(alone.expected_cost, rel=1e-12) == value
        np.testing.assert_allclose(solution.action_value, alone.action_value, rtol=1e-12)


def test_values_are_concave_in_the_setup_cost_with_the_order_count_as_slope():
    """V(k) is concave and its slope is the expected discounted number of orders of the optimal policy:
    the finite difference against a simulation of the policy with many episodes."""
    inst = Instance(h=[1.0], b=[9.0], lam=[3.0], beta=[0.4], lead=[2], qbar=[12.0], K=8.0, gamma=0.95, rho=0.8)
    ks = np.linspace(0.0, 20.0, 9)
    v = dp_optimal.expected_costs(inst, 20, ks, factor_points=9)
    assert (np.diff(v, 2) <= 1e-9).all() and (np.diff(v) > 0).all()
    slope = (dp_optimal.expected_costs(inst, 20, [8.25], factor_points=9) - dp_optimal.expected_costs(inst, 20, [7.75], factor_points=9))[
        0
    ] / 0.5
    record = item_figures(inst, 0, {"k": 8.0}, 20, sample_paths(inst, 5, 2000, 20), DecompositionOptions(factor_points=9, coarse_points=5))
    assert record["k"]["discounted_orders"] == pytest.approx(slope, rel=0.05)


# ---- the split search ----------------------------------------------------------------------------


def test_best_split_and_its_certificate_on_known_concave_functions():
    """V_i(k) = a_i (1 - exp(-k / c_i)) on grids: best_split is the exact optimum of the chords (an
    exhaustive scan of the piecewise-linear functions), and the upper bound lies above the true optimum
    of the V_i (an exhaustive scan of the functions themselves)."""
    a, c, K = np.array([10.0, 6.0, 3.0]), np.array([2.0, 5.0, 1.0]), 6.0
    grids = [np.array([0.0, 1.0, 2.5, 4.0, 6.0]), np.array([0.5, 1.5, 3.0, 6.0]), np.array([0.0, 0.5, 1.0, 2.0, 3.0])]
    values = [a[i] * (1 - np.exp(-g / c[i])) for i, g in enumerate(grids)]
    split = best_split([list(g) for g in grids], [list(v) for v in values], K)
    step = 0.01
    k1, k2 = np.meshgrid(np.arange(0, K + step / 2, step), np.arange(0, K + step / 2, step), indexing="ij")
    k3 = K - k1 - k2
    ok = k3 >= 0
    chords = sum(np.interp(k, g, v, right=np.nan, left=np.nan) for k, g, v in zip((k1, k2, k3), grids, values))
    assert split.value == pytest.approx(np.nanmax(np.where(ok, chords, np.nan)), abs=0.02)
    assert split.shares.sum() == pytest.approx(K) and (split.shares >= 0).all()
    truth = np.where(ok, sum(a[i] * (1 - np.exp(-k / c[i])) for i, k in enumerate((k1, k2, k3))), np.nan)
    assert split_upper_bound([list(g) for g in grids], [list(v) for v in values], K) >= np.nanmax(truth) - 1e-9
    assert np.nanmax(truth) >= split.value


def test_refine_adds_points_beside_the_share():
    assert refine([1.0, 2.0, 4.0], 2.0, 10.0) == [1.5, 3.0]
    assert refine([1.0, 2.0, 4.0], 4.0, 10.0) == [3.0, 6.0]
    assert refine([1.0, 2.0, 4.0], 1.0, 10.0) == [0.5, 1.5]
    assert refine([1.0, 2.0, 4.0], 3.0, 10.0) == [3.0, 2.5, 3.5]
    assert refine([1.0, 2.0, 8.0], 8.0, 10.0) == [5.0, 10.0]


def test_conservative_figure_is_the_certified_value_less_twice_the_estimated_grid_error():
    """Grid steps in the ratio r = 2: the remaining error is |coarse - fine| / 3 (Richardson, O(step^2)); the items'
    certified values (item 1 on a coarse lattice, 0.25 below its value; item 2 0.5 below) add up, and the conservative
    figure is their sum less twice the grid's error, not the fine value less it. Each item's error counts on its own: with
    item 2's coarse value 3 below its fine one, the summed difference is 0 (an error that cancels), the items' 6 / 3 = 2."""
    records = [
        {
            "item": 0,
            "best": {"value": 100.0, "coarse_value": 103.0, "certified_value": 100.0, "costs": [1.0, 2.0], "cumulative": [1.0, 1.5]},
        },
        {"item": 1, "best": {"value": 50.0, "coarse_value": 50.0, "certified_value": 49.75, "costs": [3.0, 5.0], "cumulative": [2.0, 4.0]}},
        {"item": 2, "best": {"value": 0.0, "coarse_value": 0.0, "certified_value": -0.5, "costs": [0.0, 0.0], "cumulative": [0.0, 0.0]}},
    ]
    figures = combine(records, "best", DecompositionOptions(factor_points=41, coarse_points=21))
    assert figures["value"] == 150.0 and figures["extrapolated"] == pytest.approx(149.0) and figures["certified"] == 149.25
    assert figures["conservative"] == pytest.approx(149.25 - 2.0)
    records[2]["best"] |= {"value": 3.0, "coarse_value": 0.0}
    figures = combine(records, "best", DecompositionOptions(factor_points=41, coarse_points=21))
    assert figures["coarse_value"] == figures["value"] == 153.0 and figures["conservative"] == pytest.approx(149.25 - 2 * 6.0 / 3.0)
    np.testing.assert_array_equal(figures["costs"], [4.0, 7.0])
    np.testing.assert_array_equal(figures["cumulative"], [3.0, 5.5])


# ---- on the solver pool ------------------------------------------------------------------------------


def test_pool_run_writes_both_splits_resumes_and_refuses_other_settings(tmp_path, ray_session):
    """The bound on the Ray pool: the results folder at the best split and at equal shares, per-episode
    values equal to each item's policy simulated alone; a re-run resumes from the journal without
    solving again; other settings are refused."""
    from plumbing.errors import InputError
    from run_results.records import read_evaluation
    from solver_workers.solver_run import EQUAL_SHARES, SolverRun, decomposition_journal, run_decomposition_bound

    inst = Instance(h=[1.0, 0.7], b=[9.0, 6.0], lam=[2.0, 3.0], beta=[0.3, 0.5], lead=[1, 2], qbar=[8.0, 12.0], K=6.0, gamma=0.95, rho=0.8)
    options = DecompositionOptions(factor_points=7, coarse_points=4, schedule_rounds=6)
    out = tmp_path / "run"
    run = SolverRun(out, seed=3, episodes=5, horizon=8, workers=2)
    summary = run_decomposition_bound(run, inst, decomposition_journal(run, inst, options), options)
    best, equal = read_evaluation(out), read_evaluation(out / EQUAL_SHARES)
    assert summary["kind"] == "lower-bound" and summary["search"]["certified"]
    assert summary["dp_value"] >= equal["summary"]["dp_value"] - 1e-9
    assert summary["conservative_value"] <= summary["dp_value"] and summary["search"]["grid_points"] >= 2 * 5
    paths = sample_paths(inst, 3, 5, 8)
    split = pq.read_table(out / "split.parquet").to_pydict()
    alone = sum(np.array(item_figures(inst, i, {"k": split["best_share"][i]}, 8, paths, options)["k"]["costs"]) for i in range(2))
    np.testing.assert_allclose(best["cost"], alone, rtol=1e-12)
    assert summary["cumulative_cost"][-1] == pytest.approx(best["cost"].mean(), rel=1e-12) and len(summary["cumulative_cost"]) == 8
    # the schedule search on the pool is the in-process search (policies.share_schedule), from the same split
    from policies.share_schedule import search_schedule

    schedule = summary["search"]["schedule"]
    alone = search_schedule(inst, 8, np.array(split["best_share"]), options)
    assert schedule["value"] == pytest.approx(alone.value, rel=1e-9) and schedule["rounds"] == len(alone.values)
    assert schedule["constant_split_value"] == pytest.approx(summary["dp_value"], rel=1e-9)
    assert schedule["gain"] > 0.005  # 0.94% after 6 rounds here
    # two items: the joint optimum with the caps raised, on the same grid, is solved too, and it is the tightest
    from policies import joint_dp

    exact = joint_dp.solve(inst, 8, "raised", 7, options.factor_width, tables=False).expected_cost
    assert summary["search"]["exact"]["value"] == pytest.approx(exact, rel=1e-12) and exact >= schedule["value"] - 1e-9
    assert summary["tightest_bound"] == {"value": summary["search"]["exact"]["value"], "relaxation": "exact optimum"}
    lines = (out / "split.jsonl").read_text().splitlines()
    again = run_decomposition_bound(run, inst, decomposition_journal(run, inst, options), options)
    assert (out / "split.jsonl").read_text().splitlines() == lines and again["dp_value"] == summary["dp_value"]
    assert again["tightest_bound"] == summary["tightest_bound"]  # the schedule search as journalled
    with pytest.raises(InputError, match="coarse_points 4 there, 5 here"):
        decomposition_journal(run, inst, DecompositionOptions(factor_points=7, coarse_points=5, schedule_rounds=6))


# ---- several factors and overdispersion ---------------------------------------------------------------


def three_factor_items(signed: bool = True) -> Instance:
    """Three items on k = 3 factors with signed loadings (norms 0.5, 0.3, 0.6) and negative-binomial demand; with
    `signed` False, the one-factor instance with beta_i = |beta_i| and the same phi_i."""
    loadings = np.array([[0.3, -0.4, 0.0], [0.0, 0.0, -0.3], [-0.2, 0.4, 0.4]])
    model = {"loadings": loadings, "beta": None} if signed else {"beta": np.sqrt((loadings**2).sum(1))}
    return Instance(
        h=[1.0, 0.5, 1.2], b=[6.0, 9.0, 8.0], lam=[1.0, 2.0, 1.5], lead=[1, 2, 1], qbar=[3.0, 5.0, 4.0], K=6.0, gamma=0.9, rho=0.6,
        overdispersion=[0.4, 0.2, 0.0], **model,
    )  # fmt: skip


def test_each_item_of_three_signed_factors_is_the_one_factor_item_at_its_exposure():
    """The per-item problem depends only on the law of u_i: item i's values on a k = 3 signed instance equal those
    of the one-factor instance with beta_i = |beta_i| and the same phi_i, and its relaxed policy's cost on each
    held-out episode equals the one-factor item's on that episode's exposure path u_i,t = loadings_i . F_t / |beta_i|
    (a slow loop here) with the same demands. Fails when an item's DP takes beta_i's sign or first column, drops
    phi_i, or its policy runs on F_t (or one coordinate of it) in place of u_i,t."""
    several, one = three_factor_items(), three_factor_items(signed=False)
    assert several.factors == 3 and one.factors == 1 and several.content_hash() != one.content_hash()
    setups = [0.5, 2.0, 6.0]
    paths = sample_paths(several, 3, 16, 8)
    exposure = np.empty((16, 9, 3))
    for e, t, i in itertools.product(range(16), range(9), range(3)):
        exposure[e, t, i] = sum(several.loadings[i, j] * float(paths.factor[e, t, j]) for j in range(3)) / one.beta[i]
    for i in range(3):
        np.testing.assert_array_equal(item_values(several, i, setups, 8, 5, TINY), item_values(one, i, setups, 8, 5, TINY))
        theirs_paths = ExogenousPaths(torch.as_tensor(exposure[..., i]).float(), paths.demand, paths.seed, paths.episodes)
        ours = item_figures(several, i, {"best": 2.0}, 8, paths, TINY)["best"]
        theirs = item_figures(one, i, {"best": 2.0}, 8, theirs_paths, TINY)["best"]
        assert ours["value"] == theirs["value"]
        np.testing.assert_allclose(ours["costs"], theirs["costs"], rtol=1e-6)
    poisson = dataclasses.replace(one, overdispersion=None)
    assert item_values(poisson, 0, setups, 8, 5, TINY)[0] < item_values(one, 0, setups, 8, 5, TINY)[0]  # phi_0 = 0.4 counts


def test_the_tightest_bound_is_the_highest_figure_the_run_holds_named():
    """The constant split alone; a schedule that gained; the joint optimum of two items above both; a joint optimum that was
    not run (its reason recorded, no value) leaves the schedule's figure; a schedule below the split does not count."""
    from policies.decomposition import tightest_bound

    assert tightest_bound(100.0, None) == {"value": 100.0, "relaxation": "constant split"}
    assert tightest_bound(100.0, {"value": 101.0}) == {"value": 101.0, "relaxation": "shares by period and factor"}
    assert tightest_bound(100.0, {"value": 101.0}, {"value": 103.0}) == {"value": 103.0, "relaxation": "exact optimum"}
    assert tightest_bound(100.0, {"value": 101.0}, {"value": None, "not_run": "too large"})["relaxation"] == "shares by period and factor"
    assert tightest_bound(100.0, {"value": 99.0}) == {"value": 100.0, "relaxation": "constant split"}
