"""Bit flipping (``BitFlipping-v0``, Gymnasium and gymnax:) and the goal rewards HER recomputes."""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from kitae.envs.goals import BitFlippingEnv, JaxBitFlipping, bit_flipping_reward, goal_reward_fn
from kitae.envs.make import make_jax_env, make_vec_env


def test_the_gymnasium_environment_passes_gymnasiums_checker_and_plays_by_hand():
    check_env(BitFlippingEnv(5), skip_render_check=True)
    env = gym.make("BitFlipping-v0", n_bits=4)
    obs, _ = env.reset(seed=3)
    assert set(obs) == {"observation", "achieved_goal", "desired_goal"}
    assert not np.array_equal(obs["achieved_goal"], obs["desired_goal"])  # never solved at the start
    differing = np.flatnonzero(obs["achieved_goal"] != obs["desired_goal"])
    for i, bit in enumerate(differing):
        obs, reward, terminated, truncated, info = env.step(int(bit))
        last = i == len(differing) - 1
        assert reward == (0.0 if last else -1.0) and terminated == last and not truncated
        assert info["is_success"] == last
    np.testing.assert_array_equal(obs["achieved_goal"], obs["desired_goal"])
    assert np.array_equal(obs["observation"], obs["achieved_goal"])


def test_an_episode_is_cut_after_n_steps():
    env = BitFlippingEnv(3)
    env.reset(seed=0)
    outcomes = [env.step(0)[1:4] for _ in range(3)]  # flipping one bit back and forth: never the goal (differs)
    rewards, terminated, truncated = zip(*outcomes)
    assert truncated == (False, False, True) and not any(terminated) and set(rewards) == {-1.0}
    with pytest.raises(ValueError, match=r"action=3 is not allowed; allowed: an int in \[0, 3\)"):
        env.step(3)
    with pytest.raises(ValueError, match="n_bits=0 is not allowed"):
        BitFlippingEnv(0)


def test_the_goal_reward_is_vectorised_and_the_same_in_numpy_and_jax():
    achieved = np.array([[0, 1, 1], [1, 1, 1]], np.float32)
    desired = np.array([[0, 1, 1], [0, 1, 1]], np.float32)
    np.testing.assert_array_equal(bit_flipping_reward(achieved, desired), [0.0, -1.0])
    np.testing.assert_array_equal(
        jax.jit(bit_flipping_reward)(jnp.asarray(achieved), jnp.asarray(desired)), [0.0, -1.0]
    )
    np.testing.assert_array_equal(BitFlippingEnv(3).compute_reward(achieved, desired, None), [0.0, -1.0])
    space = BitFlippingEnv(3).observation_space
    assert goal_reward_fn("BitFlipping-v0", space) is bit_flipping_reward
    assert goal_reward_fn("gymnax:BitFlipping-v0", space) is bit_flipping_reward
    with pytest.raises(ValueError, match="replay.her is not allowed for gymnax:CartPole-v1"):
        goal_reward_fn("gymnax:CartPole-v1", space)


def test_a_gymnasium_goal_environments_compute_reward_runs_through_a_host_callback():
    class Tolerant(BitFlippingEnv):  # a goal environment kitae knows nothing about
        def compute_reward(self, achieved_goal, desired_goal, info=None):
            return -np.sum(np.abs(achieved_goal - desired_goal), axis=-1)

    gym.register("TolerantBits-v0", entry_point=lambda: Tolerant(3))
    try:
        reward_fn = goal_reward_fn("TolerantBits-v0", Tolerant(3).observation_space)
        got = jax.jit(reward_fn)(jnp.array([[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]]), jnp.zeros((2, 3)))
        np.testing.assert_array_equal(got, [-2.0, -3.0])
    finally:
        gym.registry.pop("TolerantBits-v0")


def test_the_jax_environment_plays_the_same_task_and_resets_itself():
    env = JaxBitFlipping(4)
    obs, state = jax.jit(env.reset, static_argnums=1)(jax.random.PRNGKey(0), None)
    assert not np.array_equal(obs["achieved_goal"], obs["desired_goal"])
    differing = np.flatnonzero(np.asarray(obs["achieved_goal"]) != np.asarray(obs["desired_goal"]))
    step = jax.jit(env.step, static_argnums=3)
    for i, bit in enumerate(differing):
        out = step(jax.random.PRNGKey(i + 1), state, jnp.asarray(bit), None)
        last = i == len(differing) - 1
        assert float(out.reward) == (0.0 if last else -1.0) and bool(out.terminated) == last
        state = out.state
    # the final observation is the goal reached; the next one a new episode's start
    np.testing.assert_array_equal(out.next_observation["achieved_goal"], out.next_observation["desired_goal"])
    assert int(out.state.steps) == 0
    vec = make_jax_env("gymnax:BitFlipping-v0", 8, n_bits=5)
    obs, states = vec.reset(jax.random.PRNGKey(1))
    assert obs["desired_goal"].shape == (8, 5)
    assert np.all(np.any(np.asarray(obs["achieved_goal"]) != np.asarray(obs["desired_goal"]), axis=-1))
    ended = np.zeros(8, bool)
    for t in range(5):  # flipping bit 0 five times: every copy's first episode ends by step 5
        out = vec.step(jax.random.PRNGKey(t), states, jnp.zeros(8, jnp.int32))
        truncated, terminated = np.asarray(out.truncated), np.asarray(out.terminated)
        assert not np.any(truncated & ended) and (t == 4 or not np.any(truncated))  # cut only at step 5
        ended |= truncated | terminated
        states = out.state
    assert np.all(ended) and int(jnp.max(states.steps)) < 5
    assert make_vec_env("BitFlipping-v0", 2).single_observation_space["desired_goal"].shape == (15,)
