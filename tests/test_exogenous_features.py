"""Exogenous paths (statistics, common random numbers, the cost range they allow) and the feature tokens."""

import math

import numpy as np
import pytest
import torch
from conftest import single_item

from envs import exogenous
from envs.dynamics import State, initial_state
from envs.exogenous import FactorDemandStream, sample_paths
from envs.features import flat_features, global_token, item_tokens
from envs.instance import Instance, InstanceError, paper_instance


def test_demand_mean_and_factor_autocorrelation():
    inst = paper_instance(4, 0)
    paths = sample_paths(inst, seed=11, episodes=400, horizon=100, dtype=torch.float64)
    f = paths.factor.numpy()
    assert abs(f.mean()) < 0.05 and abs(f.var() - 1) < 0.05
    lag1 = np.mean(f[:, 1:] * f[:, :-1])
    assert lag1 == pytest.approx(inst.rho, abs=0.02)
    mean = paths.demand.numpy().mean(axis=(0, 1))
    # D has variance lam + lam^2 (exp(beta^2) - 1); the factor's autocorrelation inflates the
    # standard error of the mean, so allow a generous 5% tolerance.
    np.testing.assert_allclose(mean, inst.lam, rtol=0.05)


def test_training_stream_statistics():
    inst = paper_instance(4, 0).to_torch(dtype=torch.float64)
    stream = FactorDemandStream(inst, batch=20000, seed=0)
    f0 = stream.initial_factor()
    f1 = stream.next_factor(f0)
    assert torch.mean(f0 * f1).item() == pytest.approx(inst.rho, abs=0.03)
    assert f1.var().item() == pytest.approx(1.0, abs=0.03)
    np.testing.assert_allclose(stream.demand(f0).mean(0).numpy(), inst.lam.numpy(), rtol=0.03)


def test_episode_paths_depend_only_on_seed_and_episode():
    inst = paper_instance(3, 0)
    few = sample_paths(inst, seed=5, episodes=[2, 7], horizon=10)
    many = sample_paths(inst, seed=5, episodes=12, horizon=25)
    for row, e in enumerate((2, 7)):
        torch.testing.assert_close(few.factor[row], many.factor[e, :11])
        torch.testing.assert_close(few.demand[row], many.demand[e, :10])
    other = sample_paths(inst, seed=6, episodes=[2], horizon=10)
    assert not torch.equal(other.demand[0], few.demand[0])


def test_item_and_global_tokens_by_hand():
    inst = Instance(
        h=[1.0, 3.0], b=[9.0, 7.0], lam=[3.0, 8.0], beta=[0.2, 0.5], lead=[1, 3], qbar=[12.0, 32.0], K=20.0, gamma=0.95, rho=0.8
    )
    ti = inst.to_torch(dtype=torch.float64)
    state = State(
        torch.tensor([[4.0, -2.0]], dtype=torch.float64),
        torch.tensor([[[1.0, 2.0, 3.0], [0.0, 5.0, 0.0]]], dtype=torch.float64),
        torch.tensor([0.7], dtype=torch.float64),
    )
    mu = np.array([6.0, 32.0])
    sigma = np.sqrt(mu)
    c_scale = 10.0
    sigma_ref = sigma.mean()
    x = item_tokens(ti, state)[0].numpy()
    expected0 = [
        (4 - 6) / sigma[0],
        1 / sigma[0],
        2 / sigma[0],
        3 / sigma[0],
        0.1,
        0.9,
        math.log(4),
        math.sqrt(3) / sigma_ref,
        12 / sigma[0],
        0.2,
        1,
    ]
    expected1 = [(-2 - 32) / sigma[1], 0, 5 / sigma[1], 0, 0.3, 0.7, math.log(9), math.sqrt(8) / sigma_ref, 32 / sigma[1], 0.5, 3]
    np.testing.assert_allclose(x, [expected0, expected1], rtol=1e-12)
    g = global_token(ti, state)[0].numpy()
    np.testing.assert_allclose(g, [20 / (c_scale * sigma_ref), 0.95, 1 / (100 * 0.05), 0.7], rtol=1e-12)
    assert flat_features(ti, state).shape == (1, 11 * 2 + 4)
    assert ti.c_ref == pytest.approx(20 + 10 * sigma[0] + 10 * sigma[1])


def test_permuting_items_permutes_item_tokens_only():
    rng = np.random.default_rng(0)
    inst = paper_instance(9, 2)
    perm = rng.permutation(inst.n)
    permuted = Instance(
        **{k: getattr(inst, k)[perm] for k in ("h", "b", "lam", "beta", "lead", "qbar")}, K=inst.K, gamma=inst.gamma, rho=inst.rho
    )
    ti, tp = inst.to_torch(dtype=torch.float64), permuted.to_torch(dtype=torch.float64)
    state = State(torch.tensor(rng.normal(0, 5, (3, 9))), torch.tensor(rng.uniform(0, 5, (3, 9, 3))), torch.tensor(rng.normal(size=3)))
    state_p = State(state.inv[:, perm], state.pipe[:, perm], state.factor)
    torch.testing.assert_close(item_tokens(tp, state_p), item_tokens(ti, state)[:, perm])
    torch.testing.assert_close(global_token(tp, state_p), global_token(ti, state))


def test_initial_state_is_mean_lead_time_demand():
    inst = paper_instance(5, 0)
    ti = inst.to_torch(dtype=torch.float64)
    s0 = initial_state(ti, torch.tensor([0.3, -1.0], dtype=torch.float64))
    np.testing.assert_allclose(s0.inv.numpy(), np.tile(inst.lam * (inst.lead + 1), (2, 1)))
    assert torch.all(s0.pipe == 0) and s0.factor.tolist() == [0.3, -1.0]


def test_the_cost_range_over_the_horizon_by_hand(monkeypatch):
    # one item, beta = 0 (the demand rate is lam at any factor), L = 1: mu = 2 lam = 4 and within T steps
    # |Z| <= 4 + T (qbar + lam) = 4 + 14 T, so C_t <= K + max(h, b) (4 + 14 T) = 5 + 10 (4 + 14 T) = 45 + 140 T
    monkeypatch.setattr(exogenous, "COST_LIMIT", 45 + 140 * 10)
    inst = single_item(lead=1, lam=2.0, h=1.0, b=10.0, K=5.0, qbar=12.0)
    exogenous.check_cost_range(inst, 10)  # exactly at the limit
    with pytest.raises(InstanceError, match=r"instance field 'qbar' \(item 0\).*that 11 steps can reach.*up to 1585"):
        exogenous.check_cost_range(inst, 11)  # the 14 units a step (qbar 12 of them) outweigh the rate 10
    with pytest.raises(InstanceError, match=r"instance field 'b' \(item 0\): a cost of max\(h_0, b_0\) = 100 "):
        exogenous.check_cost_range(single_item(lead=1, lam=2.0, h=1.0, b=100.0, K=5.0, qbar=12.0), 10)
    with pytest.raises(InstanceError, match="instance field 'K'"):
        exogenous.check_cost_range(single_item(lead=1, K=2000.0), 1)


def test_an_instance_whose_costs_overflow_float32_is_refused_before_any_path(monkeypatch):
    """Issue 16: h = 1e308 evaluated to a NaN mean (inf * 0 in float32). The field bounds refuse it now, and every
    fixed-horizon simulation starts with check_cost_range (sample_paths), the backstop over the horizon."""
    with pytest.raises(InstanceError, match="instance field 'h'"):
        Instance(
            h=[1e308, 1e308], b=[8.6, 6.5], lam=[6.2, 5.6], beta=[0.27, 0.45], lead=[2, 3], qbar=[24.8, 22.4], K=20.0, gamma=0.95, rho=0.8
        )
    paper = paper_instance(2, 0)
    with monkeypatch.context() as patch:
        patch.setattr(exogenous, "COST_LIMIT", 100.0)
        with pytest.raises(InstanceError, match="that 5 steps can reach"):
            sample_paths(paper, 0, 4, 5)
    exogenous.check_cost_range(paper_instance(42_075, 0), 1000)  # the largest paper instance stays far inside the limit
