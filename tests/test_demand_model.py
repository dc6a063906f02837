"""The demand model with k factors, signed loadings and overdispersion (docs/model.md, "Several factors and
overdispersion"): the instance's fields, each item's exposure, the moments of the drawn paths and of the training
stream against the model's closed forms, and the paper's model reproducing the numbers frozen before the model grew
(tests/fixtures/paper_model.npz, written by tests/fixtures/make_paper_model.py at the revision before)."""

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from envs.demand_law import item_rates
from envs.dynamics import initial_state
from envs.evaluation import evaluate
from envs.exogenous import FactorDemandStream, sample_paths
from envs.features import check_one_factor, global_token, item_tokens
from envs.instance import Instance, InstanceError, paper_instance, with_factors
from policies.classical import zero_policy
from run_results.records import write_evaluation

FIXTURES = Path(__file__).parent / "fixtures"

ITEMS = {"h": [1.0, 2.0, 1.5], "b": [9.0, 7.0, 8.0], "lam": [3.0, 6.0, 2.0], "lead": [1, 2, 3], "qbar": [12.0, 24.0, 8.0]}
LOADINGS = [[0.3, -0.4, 0.0], [-0.2, 0.1, 0.5], [0.6, 0.0, -0.1]]


def richer(**changes) -> Instance:
    fields = ITEMS | {"beta": None, "loadings": LOADINGS, "overdispersion": [0.0, 0.25, 1.0], "K": 10.0, "gamma": 0.9, "rho": 0.6}
    return Instance(**fields | changes)


# ---- the paper's model is unchanged ---------------------------------------------------------------------------------


def test_the_paper_model_reproduces_the_numbers_frozen_before_the_model_grew():
    """Paths, training draws, tokens, two rules' costs and the n = 1 DP optimum as the revision before several factors
    computed them. Catches any change to the paper model's draws (e.g. drawing its factor as [T, 1] noise or a gamma
    multiplier of 1 that still consumes the demand stream) or to its arithmetic."""
    from fixtures.make_paper_model import RULES as FROZEN_RULES

    from policies.classical import RULES, make_policy
    from policies.dp_optimal import solve

    frozen = np.load(FIXTURES / "paper_model.npz")
    instance = paper_instance(6, seed=11)
    assert instance.content_hash() == str(frozen["content_hash"])
    tinst = instance.to_torch(dtype=torch.float64)
    paths = sample_paths(instance, seed=5, episodes=4, horizon=25, dtype=torch.float64)
    np.testing.assert_array_equal(paths.demand.numpy(), frozen["demand"])
    np.testing.assert_allclose(paths.factor.numpy(), frozen["factor"], rtol=1e-12, atol=1e-12)
    stream = FactorDemandStream(tinst, batch=8, seed=9)
    f0 = stream.initial_factor()
    d0 = stream.demand(f0)
    f1 = stream.next_factor(f0)
    d1 = stream.demand(f1)
    np.testing.assert_allclose(torch.stack([f0, f1]).numpy(), frozen["stream_factor"], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(torch.stack([d0, d1]).numpy(), frozen["stream_demand"])
    state = initial_state(tinst, paths.factor[:, 0])
    np.testing.assert_allclose(item_tokens(tinst, state).numpy(), frozen["item_tokens"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(global_token(tinst, state).numpy(), frozen["global_token"], rtol=1e-12, atol=1e-12)
    for name, params in FROZEN_RULES.items():
        cost = evaluate(make_policy(tinst, RULES[name], params), tinst, paths).discounted_cost
        np.testing.assert_allclose(cost, frozen[f"cost:{name}"], rtol=1e-9)
    assert solve(paper_instance(1, seed=11), horizon=12).expected_cost == pytest.approx(float(frozen["dp_value"]), rel=1e-9)


def test_one_non_negative_loading_column_and_zero_overdispersion_are_the_paper_model():
    """The same problem written two ways is one instance: same fields, same hash (a hash over the written form
    would tell them apart and split results)."""
    paper = Instance(**ITEMS, beta=[0.2, 0.0, 0.5], K=10.0, gamma=0.9, rho=0.6)
    written = Instance(**ITEMS, beta=None, loadings=[[0.2], [0.0], [0.5]], overdispersion=[0, 0, 0], K=10.0, gamma=0.9, rho=0.6)
    assert written.paper_model and written.loadings is None and written.overdispersion is None
    assert written.content_hash() == paper.content_hash()
    np.testing.assert_array_equal(written.beta, paper.beta)


# ---- the instance's fields -------------------------------------------------------------------------------------------


def test_the_paper_family_with_several_factors_keeps_each_items_marginal_law():
    """with_factors keeps |beta_i| (so each item's exposure has the paper's law), draws unit directions of both signs,
    and at k = 1 without overdispersion is the paper's instance itself."""
    paper = paper_instance(16, seed=2)
    assert with_factors(paper, 1, 0.0, seed=2).content_hash() == paper.content_hash()
    richer3 = with_factors(paper, 3, 0.3, seed=2)
    np.testing.assert_allclose(richer3.beta, paper.beta, rtol=1e-12)
    assert richer3.factors == 3 and (richer3.loadings < 0).any() and (richer3.loadings > 0).any()
    np.testing.assert_array_equal(richer3.overdispersion, np.full(16, 0.3))
    assert (
        with_factors(paper, 3, 0.3, seed=2).content_hash() == richer3.content_hash() != with_factors(paper, 3, 0.3, seed=3).content_hash()
    )
    with pytest.raises(InstanceError, match=r"factors: expected an integer in \[1, 16\], got 17"):
        with_factors(paper, 17, 0.0, seed=2)


def test_loadings_give_norms_directions_and_round_trip(tmp_path):
    inst = richer()
    assert inst.factors == 3 and not inst.paper_model
    norms = np.sqrt((np.asarray(LOADINGS) ** 2).sum(1))
    np.testing.assert_allclose(inst.beta, norms)
    np.testing.assert_allclose(inst.directions * norms[:, None], LOADINGS)
    assert inst.demand_model() == "3 factors, signed loadings, negative-binomial demand"
    inst.save(tmp_path / "i.json")
    back = Instance.load(tmp_path / "i.json")
    assert back.content_hash() == inst.content_hash() and back.content_hash() != richer(overdispersion=None).content_hash()
    np.testing.assert_array_equal(back.loadings, inst.loadings)
    pq.write_table(inst.item_table(), tmp_path / "items.parquet")
    table = Instance.from_table(tmp_path / "items.parquet", K=10.0, gamma=0.9, rho=0.6)
    assert table.content_hash() == inst.content_hash()
    columns = pq.read_table(tmp_path / "items.parquet").column_names
    assert columns == ["h", "b", "lam", "lead", "qbar", "loading1", "loading2", "loading3", "overdispersion"]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"beta": [0.1, 0.1, 0.1]}, r"'beta': expected absent when 'loadings' is given"),
        ({"loadings": [[0.1, 0.2], [0.1], [0.3, 0.0]]}, r"'loadings': expected the same number k of loadings .*, got lengths \[1, 2\]"),
        ({"loadings": [[1.5, 1.5, 0.0], [0.1, 0, 0], [0.2, 0, 0]]}, r"'loadings' \(the norm of an item's loadings\).*2\.12132 \(item 0\)"),
        ({"loadings": [[0.1] * 17] * 3}, r"'loadings': expected k = 1\.\.16 loadings per item, got k = 17"),
        ({"loadings": [[0.1, "x", 0.0]] * 3}, r"'loadings': expected numbers, got .*item 0"),
        ({"overdispersion": [0.1, -0.2, 0.0]}, r"'overdispersion'.*-0\.2 \(item 1\)"),
        ({"overdispersion": [0.1, 0.2]}, r"'overdispersion': expected 3 values"),
        ({"loadings": [[0.1, 0.2], [0.3, 0.0]]}, r"'loadings': expected 3 rows \(one per item, like 'h'\), got 2"),
    ],
)
def test_bad_model_fields_are_one_error_naming_the_field(changes, message):
    with pytest.raises(InstanceError, match=message):
        richer(**changes)


def test_an_instance_file_with_both_beta_and_loadings_is_refused():
    data = richer().to_dict()
    data["items"]["beta"] = [0.1, 0.2, 0.3]
    with pytest.raises(InstanceError, match="one of 'beta' .* and 'loadings' .*, got both"):
        Instance.from_dict(data)


@pytest.mark.parametrize("name", ["loadings", "overdispersion"])
def test_a_null_model_field_in_an_instance_file_is_refused_naming_it(name):
    """null is not "absent": a file that writes the key means to give it (it would load as the paper's model)."""
    data = richer().to_dict()
    data["items"][name] = None
    with pytest.raises(InstanceError, match=f"instance field '{name}': expected a list with one entry per item, got null"):
        Instance.from_dict(data)


def test_exposure_by_hand():
    """u_i = beta_i . F / |beta_i|, and the rate lam_i exp(beta_i . F - |beta_i|^2 / 2) computed from the loadings
    directly (not through the exposure)."""
    inst = richer()
    factor = np.array([[0.5, -1.0, 2.0]])
    loadings = np.asarray(LOADINGS)
    expected_u = loadings @ factor[0] / np.sqrt((loadings**2).sum(1))
    np.testing.assert_allclose(inst.to_torch(dtype=torch.float64).exposure(torch.tensor(factor))[0].numpy(), expected_u)
    direct = inst.lam * np.exp(loadings @ factor[0] - 0.5 * (loadings**2).sum(1))
    np.testing.assert_allclose(item_rates(inst, factor)[0], direct)
    signed = Instance(**ITEMS, beta=None, loadings=[[0.3], [-0.4], [0.0]], K=1.0, gamma=0.9, rho=0.5)
    by_hand = signed.lam * np.exp(np.array([0.3, -0.4, 0.0]) * 1.5 - 0.5 * np.array([0.09, 0.16, 0.0]))
    np.testing.assert_allclose(item_rates(signed, np.array([1.5]))[0], by_hand)


# ---- the drawn paths follow the model --------------------------------------------------------------------------------


def model_moments(inst: Instance) -> tuple[np.ndarray, np.ndarray]:
    """E D_i = lam_i; Var D_i = lam_i + lam_i^2 ((1 + phi_i) e^{|beta_i|^2} - 1); Cov(D_i,t, D_j,t+1) =
    lam_i lam_j (e^{rho beta_i . beta_j} - 1): the law of total variance over the gamma multiplier and the factor."""
    loadings, phi = inst.loadings, inst.overdispersion
    variance = inst.lam + inst.lam**2 * ((1 + phi) * np.exp(inst.beta**2) - 1)
    lag1 = np.outer(inst.lam, inst.lam) * (np.exp(inst.rho * loadings @ loadings.T) - 1)
    return variance, lag1


def within(observed_by_episode: np.ndarray, expected: np.ndarray, sds: float = 4.5) -> None:
    """Per-episode statistics [E, ...] (independent episodes) average to `expected` within `sds` standard errors."""
    mean = observed_by_episode.mean(0)
    se = observed_by_episode.std(0, ddof=1) / np.sqrt(observed_by_episode.shape[0])
    assert np.all(np.abs(mean - expected) <= sds * se + 1e-9), (mean, expected, se)


def test_paths_have_the_model_mean_variance_and_lagged_cross_covariance():
    """Against the closed forms of `model_moments`; a factor drawn with one coordinate for all items, loadings taken
    unsigned, or the gamma multiplier left out each moves some moment by tens of standard errors."""
    inst = richer()
    paths = sample_paths(inst, seed=3, episodes=3000, horizon=12, dtype=torch.float64)
    demand = paths.demand.numpy()  # [E, T, n]
    lam = inst.lam
    variance, lag1 = model_moments(inst)
    # each episode's F_0 is stationary, so every step is; statistics per episode about the known mean
    within(demand.mean(1), lam)
    within(((demand - lam) ** 2).mean(1), variance)
    cross = np.einsum("eti,etj->eij", demand[:, :-1] - lam, demand[:, 1:] - lam) / (demand.shape[1] - 1)
    within(cross, lag1)
    assert paths.factor.shape == (3000, 13, 3)


def test_the_training_stream_draws_the_same_law():
    """One step of B independent rollouts: mean, variance and the same-step cross-covariance
    lam_i lam_j (e^{beta_i . beta_j} - 1) (i != j); a stream that dropped the overdispersion fails the variance."""
    inst = richer()
    stream = FactorDemandStream(inst.to_torch(dtype=torch.float64), batch=200_000, seed=1)
    factor = stream.initial_factor()
    assert factor.shape == (200_000, 3)
    demand = stream.demand(factor).numpy()
    variance, _ = model_moments(inst)
    within(demand, inst.lam)
    within((demand - inst.lam) ** 2, variance)
    same_step = np.outer(inst.lam, inst.lam) * (np.exp(inst.loadings @ inst.loadings.T) - 1)
    pairs = np.einsum("bi,bj->bij", demand - inst.lam, demand - inst.lam)
    off = ~np.eye(3, dtype=bool)
    within(pairs[:, off], same_step[off])
    again = FactorDemandStream(inst.to_torch(dtype=torch.float64), batch=1000, seed=1)
    first = FactorDemandStream(inst.to_torch(dtype=torch.float64), batch=1000, seed=1)
    torch.testing.assert_close(again.demand(again.initial_factor()), first.demand(first.initial_factor()), rtol=0, atol=0)


def test_a_longer_horizon_extends_the_same_paths_under_overdispersion():
    """Episode e's path depends on (instance, seed, e) only and a longer horizon extends it (envs.exogenous.sample_paths),
    with k factors and negative-binomial demand too. Catches gamma multipliers drawn from the Poisson draws' stream,
    which shifts every Poisson draw by the horizon's number of multipliers."""
    inst = richer()
    short = sample_paths(inst, seed=7, episodes=[1, 4], horizon=10, dtype=torch.float64)
    long = sample_paths(inst, seed=7, episodes=6, horizon=25, dtype=torch.float64)
    for row, e in enumerate((1, 4)):
        torch.testing.assert_close(short.factor[row], long.factor[e, :11], rtol=0, atol=0)
        torch.testing.assert_close(short.demand[row], long.demand[e, :10], rtol=0, atol=0)


# ---- what reads a factor of k coordinates ----------------------------------------------------------------------------


def test_a_traced_evaluation_with_k_factors_writes_one_column_per_factor(tmp_path):
    inst = richer()
    paths = sample_paths(inst, seed=0, episodes=2, horizon=5)
    evaluation = evaluate(zero_policy, inst.to_torch(), paths, trace=True)
    write_evaluation(tmp_path, "zero", evaluation, 0, {}, instance=inst)
    steps = pq.read_table(tmp_path / "steps.parquet")
    assert [c for c in steps.column_names if c.startswith("factor")] == ["factor1", "factor2", "factor3"]
    np.testing.assert_allclose(steps.column("factor2").to_numpy(), paths.factor[:, :-1, 1].double().numpy().ravel(), rtol=1e-6)


def test_networks_refuse_several_factors_and_take_one_signed_factor():
    """The tokens hold one factor: k = 2 is one error naming the model; k = 1 with a negative loading puts the signed
    loading in the item token's beta feature (index 9), so the network can tell the item's direction."""
    with pytest.raises(InstanceError, match="this instance has 3 factors, signed loadings, negative-binomial demand"):
        check_one_factor(richer(), "method 'or-transformer'")
    signed = Instance(**ITEMS, beta=None, loadings=[[0.3], [-0.4], [0.0]], K=1.0, gamma=0.9, rho=0.5).to_torch(dtype=torch.float64)
    state = initial_state(signed, torch.tensor([0.5], dtype=torch.float64))
    np.testing.assert_allclose(item_tokens(signed, state)[0, :, 9].numpy(), [0.3, -0.4, 0.0])
