"""Gymnasium interfaces over the batched step."""

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envs.gym_env import JRPEnv, JRPVectorEnv
from envs.instance import Instance, InstanceError, paper_instance
from trainers import registry


def test_single_env_passes_the_gymnasium_checker():
    check_env(JRPEnv(paper_instance(3, 0), horizon=5), skip_render_check=True)


def test_vector_env_steps_a_batch_and_resets_together():
    inst = paper_instance(4, 0)
    env = JRPVectorEnv(inst, num_envs=6, horizon=3)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (6, 11 * 4 + 4) and env.observation_space.contains(obs)
    inventory0 = obs[:, 0:44:11] * np.sqrt(inst.lam * (inst.lead + 1))  # (I - mu) / sigma = 0 at the start
    np.testing.assert_allclose(inventory0, 0, atol=1e-5)
    never = (np.zeros(6, dtype=np.int64), np.ones((6, 4), dtype=np.float32))
    truncations = []
    for _ in range(3):
        obs, reward, terminated, truncated, _ = env.step(never)
        assert np.all(reward < 0) and not terminated.any()
        # with no orders the in-transit slots stay empty
        np.testing.assert_array_equal(obs[:, 1:44:11], 0)
        truncations.append(truncated.all())
    assert truncations == [False, False, True]
    obs, reward, _, truncated, _ = env.step(never)  # the autoreset step
    assert np.all(reward == 0) and not truncated.any()
    np.testing.assert_allclose(obs[:, 0:44:11], 0, atol=1e-6)


def test_vector_env_is_reproducible_from_its_seed():
    inst = paper_instance(2, 1)
    rewards = []
    for _ in range(2):
        env = JRPVectorEnv(inst, num_envs=3, horizon=4)
        env.reset(seed=42)
        action = (np.ones(3, dtype=np.int64), np.full((3, 2), 0.5, dtype=np.float32))
        rewards.append([env.step(action)[1] for _ in range(4)])
    np.testing.assert_array_equal(rewards[0], rewards[1])


def test_vector_env_draws_signed_one_factor_negative_binomial_demand():
    # Leads >= 2 and no order: after one step I_1 = mu - D_0, so the observation's (I - mu) / sigma gives D_0, and the
    # reset observation's last entry is F_0. Given F_0, D_i,0 has mean lam_i exp(beta_i F_0 - beta_i^2 / 2) (beta_i
    # signed) and variance mean + phi_i mean^2: the standardised draws have mean 0 and variance 1, and the same draws
    # standardised with the Poisson variance (the broken control) are visibly overdispersed.
    inst = Instance(
        h=[1.0] * 3,
        b=[9.0] * 3,
        lam=[3.0, 5.0, 4.0],
        beta=None,
        lead=[2, 3, 2],
        qbar=[10.0] * 3,
        loadings=[[0.6], [-0.4], [0.3]],
        overdispersion=[0.5, 0.2, 0.0],
        K=10.0,
        gamma=0.9,
        rho=0.8,
    )
    envs = 20_000
    env = JRPVectorEnv(inst, num_envs=envs, horizon=2)
    obs, _ = env.reset(seed=3)
    factor = obs[:, -1].astype(np.float64)
    obs, *_ = env.step((np.zeros(envs, dtype=np.int64), np.zeros((envs, 3), dtype=np.float32)))
    demand = -obs[:, 0:33:11].astype(np.float64) * np.sqrt(inst.mu)
    np.testing.assert_allclose(demand, np.round(demand), atol=1e-3)
    signed = inst.loadings[:, 0]
    mean = inst.lam * np.exp(signed * factor[:, None] - signed**2 / 2)
    z = (demand - mean) / np.sqrt(mean + inst.overdispersion * mean**2)
    assert np.all(np.abs(z.mean(0)) <= 4.5 / np.sqrt(envs))
    assert np.all(np.abs((z**2).mean(0) - 1) <= 4.5 * (z**2).std(0) / np.sqrt(envs))
    poisson = (demand - mean) ** 2 / mean
    assert np.all(poisson.mean(0)[:2] > 1.5)


def test_two_factors_are_refused_by_the_env_and_by_ppo_before_anything_is_built(tmp_path):
    inst = Instance(
        h=[1.0, 1.0],
        b=[9.0, 9.0],
        lam=[3.0, 4.0],
        beta=None,
        lead=[1, 2],
        qbar=[10.0, 10.0],
        loadings=[[0.5, 0.1], [-0.2, 0.4]],
        K=10.0,
        gamma=0.9,
        rho=0.8,
    )
    with pytest.raises(InstanceError, match=r"^the gym environment .* this instance has 2 factors, signed loadings, Poisson demand;"):
        JRPVectorEnv(inst, num_envs=2, horizon=3)
    with pytest.raises(InstanceError, match=r"^method 'ppo': .* 2 factors"):
        registry.train(registry.method_config("ppo", "cpu"), inst, tmp_path / "run")
    assert not list(tmp_path.iterdir())
