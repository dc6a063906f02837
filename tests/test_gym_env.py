"""Gymnasium interfaces over the batched step."""

import numpy as np
from gymnasium.utils.env_checker import check_env

from envs.gym_env import JRPEnv, JRPVectorEnv
from envs.instance import paper_instance


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
