"""The backtest (platform/backtest.py, envs/history_replay.py) and its causal factor filter (demand/factor_filter.py):
costs worked out by hand, the replay against the evaluator on the same paths, the filter against a slow reference
(the grid filter, Poisson and negative binomial) and against exact filters (the Gaussian filter against the grid at
k = 1 and a brute-force 2-D grid at k = 2), its causality (the smoother and a filter that peeks as broken controls),
the paired comparison by hand, the report's label, and the backtest of a k = 3 negative-binomial instance."""

import json

import numpy as np
import pyarrow.csv
import pyarrow.parquet as pq
import pytest
import torch
from conftest import INSTANCE, run_script, single_item
from scipy import stats

from demand.factor_filter import GaussianFilter, GridFilter, causal_factor
from demand.factor_smoother import smooth_factor
from demand.sales_history import history_matrix
from demand.simulation import simulate_history
from envs.evaluation import evaluate
from envs.exogenous import ExogenousPaths, sample_paths
from envs.history_replay import check_window, paired_comparisons, replay, window_paths
from envs.instance import Instance, paper_instance, with_factors
from plumbing.errors import InputError
from policies.classical import RULES, make_policy, zero_policy
from policies.dp_optimal import tauchen_grid


def factor_instance(n: int, seed: int, factors: int, overdispersion: float) -> Instance:
    """The paper instance (n, seed) with k factors and overdispersion phi (envs.instance.with_factors); at k = 1 every
    other item's loading is negated, so the loadings are signed there too."""
    instance = with_factors(paper_instance(n, seed), factors, overdispersion, seed)
    if factors > 1:
        return instance
    data = instance.to_dict()
    data["items"]["loadings"] = [[beta * (-1) ** i] for i, beta in enumerate(data["items"].pop("beta"))]
    return Instance.from_dict(data)


def order_two_every_period(state, instance):
    """Y = 1, Q = 2 for every item, whatever the state."""
    return torch.ones(state.batch, dtype=state.inv.dtype), torch.full_like(state.inv, 2.0)


def test_costs_worked_out_by_hand():
    """One item, lead 1 (an order placed at t is on hand at t + 1), lam 2 so I_0 = mu = lam (L + 1) = 4, h 1, b 10, K 5,
    gamma 0.9; demand 3, 1, 4 | 0, 2, 5 | 9 in windows of 3 (the seventh period is no whole window).
    zero, window 1: Z = 1, 0, -4: 1 + 0.9 * 0 + 0.81 * 40 = 33.4; window 2: Z = 4, 2, -3: 4 + 0.9 * 2 + 0.81 * 30 = 30.1.
    Order 2 each period, window 1: Z = 1 (I -> 3), 2 (I -> 4), 0: 6 + 0.9 * 7 + 0.81 * 5 = 16.35; window 2: Z = 4 (I -> 6),
    4 (I -> 6), 1: 9 + 0.9 * 9 + 0.81 * 6 = 21.96."""
    instance = single_item(lead=1).to_torch()
    demand = np.array([[3.0], [1.0], [4.0], [0.0], [2.0], [5.0], [9.0]])
    factor = np.zeros(8)
    zero = replay(zero_policy, instance, demand, factor, window=3)
    ordering = replay(order_two_every_period, instance, demand, factor, window=3)
    assert zero.episodes == (0, 1) and zero.horizon == 3
    np.testing.assert_allclose(zero.discounted_cost, [33.4, 30.1], rtol=1e-6)
    np.testing.assert_allclose(ordering.discounted_cost, [16.35, 21.96], rtol=1e-6)


def test_a_window_that_ends_before_any_order_arrives_is_refused():
    """One item, lead 2 (an order placed at t is on hand at t + 2), lam 2 so I_0 = mu = 6, h 1, b 10, K 5, gamma 0.9;
    demand 3, 4, 5, 2, 6, 1. Windows of 2: no order arrives, so ordering 2 every period costs the zero policy's plus
    its setups K (1 + 0.9) = 9.5 in every window: zero Z = 3, -1 | 1, -1 | 0, -1: 3 + 9 = 12, 1 + 9 = 10, 0 + 9 = 9.
    Windows of 3: the order of period 0 is on hand at period 2: zero Z = 3, -1, -6: 3 + 9 + 48.6 = 60.6 | 4, -2, -3:
    4 + 18 + 24.3 = 46.3; ordering Z = 3, -1, -4 (+2): 8 + 0.9 * 15 + 0.81 * 45 = 57.95 | 4, -2, -1: 9 + 0.9 * 25 +
    0.81 * 15 = 43.65. check_window refuses 2 and takes 3, the shortest lead time + 1."""
    instance = single_item(lead=2).to_torch()
    demand = np.array([[3.0], [4.0], [5.0], [2.0], [6.0], [1.0]])
    factor = np.zeros(7)
    np.testing.assert_allclose(replay(zero_policy, instance, demand, factor, window=2).discounted_cost, [12.0, 10.0, 9.0], rtol=1e-6)
    ordering = replay(order_two_every_period, instance, demand, factor, window=2).discounted_cost
    np.testing.assert_allclose(ordering, [21.5, 19.5, 18.5], rtol=1e-6)
    np.testing.assert_allclose(replay(zero_policy, instance, demand, factor, window=3).discounted_cost, [60.6, 46.3], rtol=1e-6)
    np.testing.assert_allclose(
        replay(order_two_every_period, instance, demand, factor, window=3).discounted_cost, [57.95, 43.65], rtol=1e-6
    )
    with pytest.raises(InputError, match=r"^--window 2: no order arrives .* lead times L_i of 2\), .* give --window 3 or more$"):
        check_window(2, np.array([2.0]), "inst.json")
    with pytest.raises(InputError, match=r"lead times L_i of 3 to 4\), .* give --window 4 or more$"):
        check_window(1, np.array([4.0, 3.0, 4.0]), "inst.json")
    check_window(3, np.array([2.0]), "inst.json")


def test_one_window_has_no_standard_error_and_two_have_one():
    """One window: the mean difference, and None (not 0) for its s.e. and interval. Two windows, d = 2, 4: mean 3,
    s.e. sd(d) / sqrt(2) = 1.414214 / 1.414214 = 1, half-width t_0.975 with 1 degree of freedom (12.706205) x 1."""
    (one,) = paired_comparisons({"a": np.array([5.0]), "b": np.array([3.0])})
    assert one == {"a": "a", "b": "b", "mean_difference": 2.0, "se": None, "ci_low": None, "ci_high": None, "windows": 1}
    (two,) = paired_comparisons({"a": np.array([5.0, 7.0]), "b": np.array([3.0, 3.0])})
    assert (two["mean_difference"], two["se"], two["windows"]) == (pytest.approx(3.0), pytest.approx(1.0), 2)
    assert (two["ci_low"], two["ci_high"]) == pytest.approx((3.0 - 12.706205, 3.0 + 12.706205), rel=1e-6)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """A 3-item paper instance, episode 0 of seed 11 over 160 periods (its true factor and demand), and the same demand
    written as a history file by demand.simulation.simulate_history."""
    folder = tmp_path_factory.mktemp("simulated")
    instance = paper_instance(3, 2)
    paths = sample_paths(instance, 11, 1, 160)
    history, _ = simulate_history(instance, 11, 160)
    pyarrow.csv.write_csv(history, folder / "history.csv")
    instance.save(folder / "instance.json")
    return instance, paths, folder


def aware_rule(instance):
    """A factor-aware classical rule with fixed parameters (no tuning): base-stock-factor."""
    return make_policy(instance, RULES["base-stock-factor"], {"reorder_z": 0.5, "cover": 2, "order_up_to_z": 1.0, "cycle_stock": 0.5})


def test_replay_with_the_true_factor_equals_the_evaluator_on_the_same_paths(simulated):
    """The history file read back (demand.sales_history.history_matrix) and replayed with the true factor costs what
    envs.evaluation.evaluate gives on the sampler's own paths: one window of 150 periods is episode 0 of
    sample_paths(seed 11, 150 steps); windows of 50 are its slices, cut here by hand."""
    instance, paths, folder = simulated
    tensors = instance.to_torch()
    demand = history_matrix(folder / "history.csv").demand
    true_factor = paths.factor[0].double().numpy()  # [161]
    whole = replay(aware_rule(tensors), tensors, demand, true_factor, window=150)
    reference = evaluate(aware_rule(tensors), tensors, sample_paths(instance, 11, 1, 150))
    np.testing.assert_allclose(whole.discounted_cost, reference.discounted_cost, rtol=1e-6)

    windows = replay(aware_rule(tensors), tensors, demand, true_factor, window=50)
    sliced = ExogenousPaths(
        torch.cat([paths.factor[:, 50 * w : 50 * w + 51] for w in range(3)]),
        torch.cat([paths.demand[:, 50 * w : 50 * w + 50] for w in range(3)]),
        seed=11,
        episodes=(0, 1, 2),
    )
    np.testing.assert_allclose(windows.discounted_cost, evaluate(aware_rule(tensors), tensors, sliced).discounted_cost, rtol=1e-6)
    assert len(set(np.round(windows.discounted_cost, 3))) == 3  # three different windows, not one repeated


def demand_pmf(count, rate, overdispersion):
    """scipy's pmf of D given its rate: Poisson, or (phi > 0) the negative binomial nbinom(r = 1 / phi, p = 1 / (1 + phi
    rate)), of mean r (1 - p) / p = rate and variance r (1 - p) / p^2 = rate + phi rate^2."""
    if overdispersion == 0:
        return stats.poisson.pmf(count, rate)
    return stats.nbinom.pmf(count, 1 / overdispersion, 1 / (1 + overdispersion * rate))


def slow_filter(demand, lam, beta, rho, points, width, overdispersion=None):
    """E[F_t | D_<t] by loops over the grid: the prior p_0 of the grid, then for each t the posterior
    p_t(j) L_t(j) / sum_k p_t(k) L_t(k) with L_t(j) = prod_i pmf(D_i,t; lam_i exp(beta_i f_j - beta_i^2 / 2)) (`demand_pmf`),
    and p_t+1(j) = sum_k posterior(k) P(k, j)."""
    phi = np.zeros(len(lam)) if overdispersion is None else overdispersion
    grid = tauchen_grid(rho, points, width)
    law = list(grid.initial)
    means = []
    for t in range(len(demand)):
        means.append(sum(law[j] * grid.points[j] for j in range(points)))
        posterior = []
        for j in range(points):
            likelihood = 1.0
            for i in range(len(lam)):
                likelihood *= demand_pmf(demand[t][i], lam[i] * np.exp(beta[i] * grid.points[j] - beta[i] ** 2 / 2), phi[i])
            posterior.append(law[j] * likelihood)
        total = sum(posterior)
        law = [sum(posterior[k] / total * grid.transition[k, j] for k in range(points)) for j in range(points)]
    means.append(sum(law[j] * grid.points[j] for j in range(points)))
    return np.array(means)


@pytest.mark.parametrize(
    "beta, overdispersion",
    [([0.4, 0.9], None), ([0.4, -0.9], np.array([0.5, 0.0])), ([-0.6, 0.9], np.array([0.2, 1.5]))],
    ids=["poisson", "signed-mixed", "signed-negative-binomial"],
)
def test_the_filter_matches_a_slow_reference(beta, overdispersion):
    """The grid filter against scipy's pmfs in loops, with signed loadings and negative-binomial items; a Poisson
    filter on the negative-binomial demand (the broken control) is far from the reference."""
    rng = np.random.default_rng(3)
    lam, beta, rho = np.array([2.0, 5.0]), np.array(beta), 0.7
    demand = rng.poisson(3.0, size=(8, 2)).astype(float)
    fast = GridFilter(lam, beta, rho, overdispersion, points=9, width=3.0).predictive_means(demand)
    reference = slow_filter(demand, lam, beta, rho, 9, 3.0, overdispersion)
    np.testing.assert_allclose(fast, reference, rtol=1e-10, atol=1e-12)
    assert fast[0] == pytest.approx(0.0, abs=1e-12) and np.ptp(fast) > 0.1  # the prior's mean, then the data move it
    if overdispersion is not None:
        assert np.abs(GridFilter(lam, beta, rho, points=9, width=3.0).predictive_means(demand) - reference).max() > 0.01


def exact_filter_2d(instance, demand, points=61, width=5.0):
    """E[F_t | D_<t] for k = 2 by brute force on the product grid (points x points): the two coordinates are
    independent AR(1)s, so the grid law moves by P' law P with the 1-D Tauchen matrix P; the likelihood is
    scipy's pmf (`demand_pmf`) at lam_i exp(beta_i . F - |beta_i|^2 / 2)."""
    grid = tauchen_grid(instance.rho, points, width)
    factor = np.stack(np.meshgrid(grid.points, grid.points, indexing="ij"), axis=-1)  # [M, M, 2]
    rates = instance.lam * np.exp(factor @ instance.loadings.T - 0.5 * instance.beta**2)  # [M, M, n]
    phi = np.zeros(instance.n) if instance.overdispersion is None else instance.overdispersion
    law = np.outer(grid.initial, grid.initial)
    means = []
    for t in range(len(demand)):
        means.append(np.einsum("ij,ijk->k", law, factor))
        likelihood = np.prod([demand_pmf(demand[t, i], rates[..., i], phi[i]) for i in range(instance.n)], axis=0)
        posterior = law * likelihood / (law * likelihood).sum()
        law = grid.transition.T @ posterior @ grid.transition
    means.append(np.einsum("ij,ijk->k", law, factor))
    return np.array(means)


@pytest.mark.parametrize("overdispersion", [0.0, 0.3], ids=["poisson", "negative-binomial"])
def test_the_gaussian_filter_is_close_to_the_exact_filter_at_one_factor(overdispersion):
    """At k = 1 the Gaussian (Laplace) filter's predictive means lie within 0.03 of the grid filter's (the exact Bayes
    filter) over 300 periods of 8 items with signed loadings (measured: 0.011 Poisson, 0.018 negative binomial);
    the factor they follow moves by far more."""
    instance = factor_instance(8, 1, 1, overdispersion)
    assert instance.loadings is not None and (instance.loadings < 0).any()  # signed: not stored as the paper's beta
    demand = sample_paths(instance, 3, 1, 300).demand[0].double().numpy()
    exact = causal_factor(instance, demand)
    gaussian = GaussianFilter(instance.lam, instance.loadings, instance.rho, instance.overdispersion).predictive_means(demand)
    assert gaussian.shape == (301, 1)
    np.testing.assert_allclose(gaussian[:, 0], exact, atol=0.03)
    assert np.ptp(exact) > 1.0


@pytest.mark.parametrize("overdispersion", [0.0, 0.3], ids=["poisson", "negative-binomial"])
def test_the_gaussian_filter_is_close_to_a_brute_force_grid_at_two_factors(overdispersion):
    """At k = 2 (4 items, 40 periods) causal_factor, the Gaussian filter, lies within 0.1 of the exact filter on a
    61 x 61 grid (measured: 0.071 Poisson, 0.032 negative binomial; the posterior's s.d. is 0.41 to 0.79). A filter
    with the loadings' signs flipped (the broken control) is not."""
    instance = factor_instance(4, 3, 2, overdispersion)
    demand = sample_paths(instance, 3, 1, 40).demand[0].double().numpy()
    exact = exact_filter_2d(instance, demand)
    estimate = causal_factor(instance, demand)
    assert estimate.shape == (41, 2)
    np.testing.assert_allclose(estimate, exact, atol=0.1)
    flipped = GaussianFilter(instance.lam, -instance.loadings, instance.rho, instance.overdispersion).predictive_means(demand)
    assert np.abs(flipped - exact).max() > 0.3


def moved_before(estimate, instance, demand, changes_at) -> list[int]:
    """The periods s at which changing D_s, D_s+1, ... moves an estimate of F_0..F_s (a causal estimate uses D_<t
    only, so none), and the check that it moves F_s+1 (the filter does look at D_s)."""
    before = estimate(instance, demand)
    violations = []
    for s in changes_at:
        changed = demand.copy()
        changed[s:] = 3 * changed[s:] + 4
        after = estimate(instance, changed)
        if not np.array_equal(after[: s + 1], before[: s + 1]):
            violations.append(s)
        elif np.abs(after[s + 1] - before[s + 1]).max() <= 1e-3:
            raise AssertionError(f"changing D_{s} does not move the estimate of F_{s + 1}")
    return violations


def peeking_filter(instance, demand):
    """The broken control: the causal filter run one period ahead, so that its estimate at t uses D_t."""
    return causal_factor(instance, np.concatenate([demand[1:], demand[-1:]]))


@pytest.mark.parametrize("factors, overdispersion", [(1, 0.4), (3, 0.4)], ids=["one-factor-nb", "three-factors-nb"])
def test_the_richer_filters_are_causal_and_a_peeking_one_is_not(factors, overdispersion):
    instance = factor_instance(6, 2, factors, overdispersion)
    demand = sample_paths(instance, 5, 1, 60).demand[0].double().numpy()
    assert moved_before(causal_factor, instance, demand, (0, 20, 59)) == []
    assert moved_before(peeking_filter, instance, demand, (20, 40)) == [20, 40]


def test_the_filter_is_causal_and_the_smoother_is_not():
    """Changing D_t for t >= s leaves the filter's F_hat_0..F_hat_s unchanged (F_hat_t uses D_0..D_t-1) and moves
    F_hat_s+1; the smoother of the fit report (demand.factor_smoother.smooth_factor), the broken control, moves before s."""
    instance = paper_instance(4, 1)
    demand = sample_paths(instance, 5, 1, 120).demand[0].double().numpy()
    before = causal_factor(instance, demand)
    smoothed = smooth_factor(demand, instance.lam, instance.beta, instance.rho)["mean"]
    for s in (0, 30, 119):
        changed = demand.copy()
        changed[s:] = 3 * changed[s:] + 4
        after = causal_factor(instance, changed)
        np.testing.assert_array_equal(after[: s + 1], before[: s + 1])
        assert abs(after[s + 1] - before[s + 1]) > 1e-3
        if s > 0:
            assert np.abs(smooth_factor(changed, instance.lam, instance.beta, instance.rho)["mean"][:s] - smoothed[:s]).max() > 1e-3


def test_the_filter_tracks_the_true_factor():
    """On a path of the model the predictive mean is closer to F_t than the prior's 0: mean squared error below the
    factor's variance 1 by a margin (a sign error or an off-by-one shift would not be)."""
    instance = paper_instance(4, 3)
    paths = sample_paths(instance, 8, 1, 400)
    estimate = causal_factor(instance, paths.demand[0].double().numpy())
    error = np.mean((estimate[:400] - paths.factor[0, :400].double().numpy()) ** 2)
    assert error < 0.8 * np.mean(paths.factor[0, :400].double().numpy() ** 2)


def test_windows_show_the_filtered_factor_at_each_period():
    """window_paths cuts the policy's factor [T + 1], or [T + 1, k], so that window w's step t shows factor[w W + t]."""
    demand = np.arange(14.0).reshape(7, 2)
    factor = np.arange(8.0) / 10
    paths = window_paths(demand, factor, 3)
    np.testing.assert_allclose(paths.factor.numpy(), [[0.0, 0.1, 0.2, 0.3], [0.3, 0.4, 0.5, 0.6]], rtol=1e-6)
    np.testing.assert_array_equal(paths.demand.numpy(), demand[:6].reshape(2, 3, 2))
    three = np.stack([factor, -factor, 10 * factor], axis=1)  # [8, 3]
    cut = window_paths(demand, three, 3).factor.numpy()
    assert cut.shape == (2, 4, 3)
    np.testing.assert_allclose(cut[1, 2], [0.5, -0.5, 5.0], rtol=1e-6)
    np.testing.assert_allclose(cut[:, :, 1], -paths.factor.numpy(), rtol=1e-6)


@pytest.fixture(scope="module")
def backtest_run(simulated):
    """platform/backtest.py with zero and base-stock-factor on the simulated history (windows of 50: 3 windows, 10
    periods left over)."""
    _, _, folder = simulated
    out = folder / "bt"
    result = run_script(
        "backtest.py", "--history", folder / "history.csv", "--instance", folder / "instance.json",
        "--policy", "zero", "--policy", "base-stock-factor", "--policy", "periodic", "--out", out,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return out, result


def test_the_paired_comparison_by_hand(backtest_run):
    """backtest.json's and the printed comparisons: from the per-window costs in costs.parquet, d = a - b per window,
    mean, s.e. = sd(d, ddof 1) / sqrt(3), half-width t_0.975 with 2 degrees of freedom (4.302653) x s.e."""
    out, result = backtest_run
    record = json.loads((out / "backtest.json").read_text())
    cost = {
        row["folder"]: pq.read_table(out / row["folder"] / "costs.parquet").column("discounted_cost").to_numpy()
        for row in record["policies"]
    }
    assert [row["folder"] for row in record["policies"]] == ["zero", "base-stock-factor", "periodic"]
    assert [(row["a"], row["b"]) for row in record["comparisons"]] == [
        ("zero", "base-stock-factor"), ("zero", "periodic"), ("base-stock-factor", "periodic")
    ]  # fmt: skip
    for row in record["comparisons"]:
        d = cost[row["a"]] - cost[row["b"]]
        mean, se = d.sum() / 3, np.sqrt(((d - d.sum() / 3) ** 2).sum() / 2 / 3)
        assert row["windows"] == 3
        assert row["mean_difference"] == pytest.approx(mean, rel=1e-12)
        assert row["se"] == pytest.approx(se, rel=1e-12)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((mean - 4.302653 * se, mean + 4.302653 * se), rel=1e-6)
        assert f"{row['a']} - {row['b']}: {mean:+.2f} ± {se:.2f} (s.e.)" in result.stdout
    assert record["windows"] == 3 and record["periods"] == 160 and record["periods_replayed"] == 150
    assert "the last 10 periods" in result.stdout


def test_each_folder_is_an_evaluation_labelled_as_a_backtest(backtest_run, simulated):
    """Every policy's folder is an evaluation folder (read by platform/report.py) of one row per window, labelled
    backtest:<policy> with kind backtest; its costs are the replay's with the filtered factor."""
    instance, _, folder = simulated
    out, _ = backtest_run
    summary = json.loads((out / "base-stock-factor" / "summary.json").read_text())
    assert summary["policy"] == "backtest:base-stock-factor" and summary["kind"] == "backtest"
    assert summary["episodes"] == 3 and summary["horizon"] == 50 and summary["window_starts"] == ["2024-01-01", "2024-02-20", "2024-04-10"]
    zero = pq.read_table(out / "zero" / "costs.parquet").column("discounted_cost").to_numpy()
    demand = history_matrix(folder / "history.csv").demand
    expected = replay(zero_policy, instance.to_torch(), demand, causal_factor(instance, demand), 50).discounted_cost
    np.testing.assert_allclose(zero, expected, rtol=1e-6)
    report = run_script("report.py", out / "zero", out / "base-stock-factor")
    assert report.returncode == 0, report.stderr
    assert f"backtest on {folder / 'history.csv'}: 3 windows x 50 periods" in report.stdout
    assert "| backtest:base-stock-factor |" in report.stdout


def test_the_report_refuses_a_backtest_beside_an_evaluation(backtest_run, simulated, tmp_path):
    out, _ = backtest_run
    _, _, folder = simulated
    run_script(
        "evaluate.py", "--instance", folder / "instance.json", "--policy", "zero", "--episodes", 3, "--out", tmp_path / "ev", check=True
    )
    result = run_script("report.py", out / "zero", tmp_path / "ev")
    assert (
        result.returncode == 2 and "a backtest on the history" in result.stderr and "compare backtests with backtests only" in result.stderr
    )


def test_a_backtest_of_one_window_writes_no_standard_error(simulated, tmp_path):
    """--window 160 on the 160-period history: one window, whose means and mean difference backtest.json holds (from the
    window costs in costs.parquet), with null for every s.e. and interval; the console says there is none, never
    "± 0.00", and so does report.py on the policies' folders (no s.e. of 0.00, no interval of zero width)."""
    _, _, folder = simulated
    out = tmp_path / "bt"
    result = run_script(
        "backtest.py", "--history", folder / "history.csv", "--instance", folder / "instance.json", "--policy", "zero",
        "--policy", "base-stock", "--window", 160, "--out", out, check=True,
    )  # fmt: skip
    record = json.loads((out / "backtest.json").read_text())
    cost = {name: pq.read_table(out / name / "costs.parquet").column("discounted_cost").to_numpy() for name in ("zero", "base-stock")}
    assert record["windows"] == 1 and all(cost[name].shape == (1,) for name in cost)
    assert [(row["folder"], row["mean"], row["se"]) for row in record["policies"]] == [
        ("zero", pytest.approx(cost["zero"][0], rel=1e-12), None), ("base-stock", pytest.approx(cost["base-stock"][0], rel=1e-12), None)
    ]  # fmt: skip
    (row,) = record["comparisons"]
    assert row["mean_difference"] == pytest.approx(cost["zero"][0] - cost["base-stock"][0], rel=1e-12)
    assert (row["se"], row["ci_low"], row["ci_high"], row["windows"]) == (None, None, None, 1)
    assert "±" not in result.stdout and result.stdout.count("(no s.e.: one window)") == 2
    assert result.stdout.startswith(  # a paper instance records no period length: which the backtest takes is said
        f"note: the instance '{folder / 'instance.json'}' records no period length (source.step: it was not fitted by "
        f"fit.py), so its demand rates are taken as per period of the history '{folder / 'history.csv'}', 1 day\n"
    ), result.stdout
    assert "(no s.e. or CI: one window) over the same 1 window" in result.stdout
    report = run_script("report.py", out / "base-stock", out / "zero", "--reference", out / "zero", check=True).stdout
    rows = [line for line in report.splitlines() if line.startswith("| backtest:")]
    assert len(rows) == 2 and all("| none (one episode) |" in line for line in rows), report
    assert "1 window x 160 periods of the history" in report, report
    difference = cost["base-stock"][0] - cost["zero"][0]
    assert f"| {difference:+.2f} (no CI: one episode) |" in report, report


def test_a_history_shorter_than_the_fit_needs_is_backtested_in_whole_windows(simulated, tmp_path):
    """The first 40 periods of the history with --window 10: 4 windows replayed (the fit's 50-period rule is the fit's,
    not the backtest's), each of them the same 10 periods as in the whole history's first 40 (same costs); a window
    longer than the 40 periods is refused with the backtest's own reason."""
    _, _, folder = simulated
    lines = (folder / "history.csv").read_text().splitlines()
    periods = sorted({line.split(",")[1] for line in lines[1:]})[:40]
    kept = [lines[0]] + [line for line in lines[1:] if line.split(",")[1] in set(periods)]
    (tmp_path / "short.csv").write_text("\n".join(kept) + "\n")
    args = ["--instance", folder / "instance.json", "--policy", "zero", "--window", 10]
    run_script("backtest.py", "--history", tmp_path / "short.csv", *args, "--out", tmp_path / "short", check=True)
    run_script("backtest.py", "--history", folder / "history.csv", *args, "--out", tmp_path / "whole", check=True)
    short, whole = (pq.read_table(tmp_path / run / "zero" / "costs.parquet")["discounted_cost"].to_numpy() for run in ("short", "whole"))
    assert short.shape == (4,) and json.loads((tmp_path / "short" / "backtest.json").read_text())["windows"] == 4
    np.testing.assert_allclose(short, whole[:4], rtol=1e-12)
    refused = run_script("backtest.py", "--history", tmp_path / "short.csv", *args[:-1], 50, "--out", tmp_path / "long")
    assert refused.returncode == 2 and "50 periods is longer than the history" in refused.stderr and "(40 periods)" in refused.stderr


def test_the_history_must_have_the_step_the_instance_was_fitted_on(simulated, tmp_path):
    """The daily history against an instance recording source.step '7 days' (as fit.py writes it for weekly data): one
    `error:` line naming both steps, nothing written; recording '1 day', it is backtested."""
    instance, _, folder = simulated
    args = ["--history", folder / "history.csv", "--policy", "zero", "--window", 80]
    for step in ("7 days", "1 day"):
        Instance.from_dict(instance.to_dict() | {"source": {"step": step}}).save(tmp_path / f"{step}.json")
    refused = run_script("backtest.py", *args, "--instance", tmp_path / "7 days.json", "--out", tmp_path / "weekly")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"error: history '{folder / 'history.csv'}' has periods of 1 day, while the instance '{tmp_path / '7 days.json'}' was "
        "fitted on periods of 7 days (source.step), so its demand rates are per 7 days: backtest a history of periods of 7 "
        "days, or fit an instance on this history's periods"
    ]
    assert not (tmp_path / "weekly").exists()
    run_script("backtest.py", *args, "--instance", tmp_path / "1 day.json", "--out", tmp_path / "daily", check=True)
    assert json.loads((tmp_path / "daily" / "backtest.json").read_text())["step"] == "1 day"


def test_overwrite_replaces_the_whole_backtest(simulated, tmp_path):
    """A second backtest into the same --out is refused; with --overwrite it replaces the first, whose policy folders
    not in the second are removed with it."""
    _, _, folder = simulated
    args = ["--history", folder / "history.csv", "--instance", folder / "instance.json", "--window", 80]
    run_script("backtest.py", *args, "--policy", "zero", "--policy", "periodic", "--out", tmp_path / "bt", check=True)
    again = run_script("backtest.py", *args, "--policy", "zero", "--out", tmp_path / "bt")
    assert again.returncode == 2 and "holds a backtest (backtest.json)" in again.stderr
    run_script("backtest.py", *args, "--policy", "zero", "--out", tmp_path / "bt", "--overwrite", check=True)
    assert sorted(p.name for p in (tmp_path / "bt").iterdir()) == ["backtest.json", "zero"]


def test_overwrite_clears_a_policy_folder_that_holds_a_run_of_another_kind(simulated, tmp_path):
    """A policy's folder under --out that holds a decomposition bound's files is refused, and with --overwrite is
    cleared before the backtest writes there: the folder holds the backtest alone."""
    _, _, folder = simulated
    args = ["--history", folder / "history.csv", "--instance", folder / "instance.json", "--window", 80]
    (tmp_path / "bt" / "zero" / "lookahead").mkdir(parents=True)
    (tmp_path / "bt" / "zero" / "split.jsonl").write_text("{}\n")
    refused = run_script("backtest.py", *args, "--policy", "zero", "--out", tmp_path / "bt")
    assert refused.returncode == 2 and "split.jsonl" in refused.stderr
    run_script("backtest.py", *args, "--policy", "zero", "--out", tmp_path / "bt", "--overwrite", check=True)
    assert sorted(p.name for p in (tmp_path / "bt" / "zero").iterdir()) == ["costs.parquet", "summary.json"]


def test_a_checkpoint_is_backtested_like_a_named_policy(trained, tmp_path):
    """checkpoint:PATH (the session's tiny or-transformer run on INSTANCE) gets its folder under its method's label, and
    its window costs are the replay of the resolver's policy with the filtered factor."""
    from trainers.resolver import resolve

    checkpoint = trained["or-transformer"].checkpoint
    history, _ = simulate_history(INSTANCE, 4, 100)
    pyarrow.csv.write_csv(history, tmp_path / "history.csv")
    INSTANCE.save(tmp_path / "instance.json")
    run_script(
        "backtest.py", "--history", tmp_path / "history.csv", "--instance", tmp_path / "instance.json",
        "--policy", f"checkpoint:{checkpoint}", "--policy", "zero", "--out", tmp_path / "bt", check=True,
    )  # fmt: skip
    summary = json.loads((tmp_path / "bt" / "or-transformer-greedy" / "summary.json").read_text())
    assert summary["policy"] == "backtest:or-transformer-greedy" and summary["parameters"]["checkpoint"] == str(checkpoint)
    demand = history_matrix(tmp_path / "history.csv").demand
    policy = resolve(f"checkpoint:{checkpoint}", INSTANCE).policy
    expected = replay(policy, INSTANCE.to_torch(), demand, causal_factor(INSTANCE, demand), 50).discounted_cost
    written = pq.read_table(tmp_path / "bt" / "or-transformer-greedy" / "costs.parquet").column("discounted_cost").to_numpy()
    np.testing.assert_allclose(written, expected, rtol=1e-5)


@pytest.fixture(scope="module")
def three_factor_history(tmp_path_factory):
    """A k = 3 negative-binomial instance of 4 items with signed loadings and 120 periods of its history
    (demand.simulation.simulate_history), written as files."""
    folder = tmp_path_factory.mktemp("three_factors")
    instance = factor_instance(4, 5, 3, 0.4)
    history, _ = simulate_history(instance, 7, 120)
    pyarrow.csv.write_csv(history, folder / "history.csv")
    instance.save(folder / "instance.json")
    return instance, folder


def test_a_three_factor_negative_binomial_history_is_backtested(three_factor_history):
    """platform/backtest.py on the k = 3 history (windows of 40): every window's steps show the Gaussian filter's
    estimate [T + 1, 3] at their period (the trace's factor1..factor3), and the window costs are the replay's with it."""
    instance, folder = three_factor_history
    out = folder / "bt"
    run_script(
        "backtest.py", "--history", folder / "history.csv", "--instance", folder / "instance.json",
        "--policy", "zero", "--policy", "base-stock", "--window", 40, "--trace", "--out", out, check=True,
    )  # fmt: skip
    summary = json.loads((out / "base-stock" / "summary.json").read_text())
    assert summary["episodes"] == 3 and "Gaussian (Laplace) approximation of the filter of 3 factors" in summary["factor"]
    demand = history_matrix(folder / "history.csv").demand
    factor = causal_factor(instance, demand)
    assert factor.shape == (121, 3)
    steps = pq.read_table(out / "base-stock" / "steps.parquet").to_pydict()
    shown = np.stack([steps[f"factor{j}"] for j in (1, 2, 3)], axis=1)  # [3 windows x 40 steps, 3]
    np.testing.assert_allclose(shown, factor[:120], rtol=1e-6, atol=1e-7)
    zero = pq.read_table(out / "zero" / "costs.parquet").column("discounted_cost").to_numpy()
    np.testing.assert_allclose(zero, replay(zero_policy, instance.to_torch(), demand, factor, 40).discounted_cost, rtol=1e-6)


def test_a_checkpoint_on_a_three_factor_instance_is_refused_in_one_line_before_any_work(trained, three_factor_history, tmp_path):
    """A checkpoint (the session's tiny or-transformer, trained at n = 2) backtested on a k = 3 instance of 2 items: one
    `error:` line naming the checkpoint and the demand model, exit status 2, before classical-best is tuned (nothing
    under --out)."""
    checkpoint = trained["or-transformer"].checkpoint
    instance = factor_instance(2, 5, 3, 0.4)
    history, _ = simulate_history(instance, 7, 60)
    pyarrow.csv.write_csv(history, tmp_path / "history.csv")
    instance.save(tmp_path / "instance.json")
    result = run_script(
        "backtest.py", "--history", tmp_path / "history.csv", "--instance", tmp_path / "instance.json",
        "--policy", "classical-best", "--policy", f"checkpoint:{checkpoint}", "--out", tmp_path / "bt",
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: checkpoint '{checkpoint}'")
    assert "3 factors, signed loadings, negative-binomial demand" in lines[0]
    assert not (tmp_path / "bt").exists() or not any((tmp_path / "bt").iterdir())
