"""The host loop: check_env, process_termination, vectorized_train, update_epoch."""

from __future__ import annotations

import warnings
from collections import namedtuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _agents import TinyA2C, TinyA2CParams, TinyDQN, TinyDQNParams, make_config
from gymnasium.vector import AutoresetMode
from tensorboardX import SummaryWriter

from kitae.buffer import buffer_rollout
from kitae.loops.train import check_env, process_termination, vectorized_train
from kitae.loops.update import batchify, update_epoch
from kitae.modules.pytree import AgentPyTree
from kitae.types import AlgoType


class CountEnv(gym.Env):
    """Observation = [episode id * 100 + t]; terminates at t == terminal_at (if set)."""

    observation_space = gym.spaces.Box(-1e6, 1e6, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, terminal_at: int | None = None):
        self.terminal_at = terminal_at
        self.episode = -1
        self.t = 0

    def _obs(self):
        return np.array([self.episode * 100 + self.t], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        terminated = self.terminal_at is not None and self.t == self.terminal_at
        return self._obs(), 1.0, terminated, False, {}


def count_vec_env(specs):
    """specs: list of (terminal_at, max_episode_steps) per sub-environment."""
    thunks = [
        (lambda term=term, limit=limit: gym.wrappers.TimeLimit(CountEnv(term), max_episode_steps=limit))
        for term, limit in specs
    ]
    return gym.vector.SyncVectorEnv(thunks, autoreset_mode=AutoresetMode.SAME_STEP)


# ---------------------------------------------------------------------------------------------
# check_env
# ---------------------------------------------------------------------------------------------


def test_check_env_wraps_a_single_env_into_a_vector_of_one():
    env = check_env(gym.make("CartPole-v1"))
    assert isinstance(env, gym.vector.VectorEnv)
    assert env.num_envs == 1
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    obs, _ = env.reset(seed=0)
    assert obs.shape == (1, 4)
    env.close()


def test_check_env_rejects_next_step_autoreset():
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    with pytest.raises(ValueError, match="SAME_STEP"):
        check_env(env)
    env.close()


def test_check_env_rejects_non_environments():
    with pytest.raises(TypeError, match="gymnasium.Env"):
        check_env("CartPole-v1")


# ---------------------------------------------------------------------------------------------
# process_termination
# ---------------------------------------------------------------------------------------------


def test_process_termination_restores_final_observations_and_logs(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    next_obs = np.array([[0.0], [5.0], [0.0]], dtype=np.float32)
    infos = {
        "final_obs": np.array([np.array([9.0], np.float32), None, np.array([7.0], np.float32)], dtype=object),
        "_final_obs": np.array([True, False, True]),
        "episode": {"r": np.array([10.0, 0.0, 8.0]), "l": np.array([10, 0, 8]), "t": np.zeros(3)},
        "_episode": np.array([True, False, True]),
    }
    writer = SummaryWriter(str(tmp_path))
    real = process_termination(42, next_obs, infos, writer)
    writer.close()
    np.testing.assert_array_equal(real, [[9.0], [5.0], [7.0]])
    np.testing.assert_array_equal(next_obs, [[0.0], [5.0], [0.0]])  # the input is not modified

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    returns = events.Scalars("charts/episodic_return")
    assert [(e.step, e.value) for e in returns] == [(42, 10.0), (42, 8.0)]
    assert [e.value for e in events.Scalars("charts/episodic_length")] == [10.0, 8.0]


def test_process_termination_warns_when_a_writer_gets_no_episode_returns(tmp_path):
    # make_vec_env records no episode statistics: an ended episode with a writer and no
    # `episodes=` would log nothing silently.
    next_obs = np.array([[0.0], [5.0]], dtype=np.float32)
    infos = {
        "final_obs": np.array([np.array([9.0], np.float32), None], dtype=object),
        "_final_obs": np.array([True, False]),
    }
    writer = SummaryWriter(str(tmp_path))
    with pytest.warns(UserWarning, match="episodes="):
        real = process_termination(3, next_obs, infos, writer)
    np.testing.assert_array_equal(real, [[9.0], [5.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        process_termination(3, next_obs, infos, writer, episodes=[(0, 9.0, 9)])
        process_termination(3, next_obs, infos, None)
        process_termination(3, next_obs, {}, writer)
    writer.close()


def test_process_termination_without_episode_end_returns_the_observations():
    obs = np.ones((2, 3))
    assert process_termination(1, obs, {}, None) is obs


# ---------------------------------------------------------------------------------------------
# vectorized_train: transitions, termination vs truncation, determinism
# ---------------------------------------------------------------------------------------------


def test_stored_transitions_never_cross_episode_boundaries():
    # env 0 terminates at t=3, env 1 is truncated by a time limit at t=5
    env = count_vec_env([(3, 100), (None, 5)])
    config = make_config(env, TinyA2CParams(), max_buffer_size=40, batch_size=8, n_env_steps=80)
    agent = TinyA2C("test", config, run_dir="unused")
    agent.update = lambda buffer: {}  # keep the rollout in the buffer to inspect it
    vectorized_train(0, agent, env, 80, AlgoType.ON_POLICY)

    rollout = jax.tree_util.tree_map(np.asarray, buffer_rollout(agent.buffer.state))
    obs, next_obs = rollout.observation[..., 0], rollout.next_observation[..., 0]
    # next_observation is always the real successor: same episode, one step later
    np.testing.assert_array_equal(next_obs, obs + 1)
    t_next = next_obs % 100
    np.testing.assert_array_equal(rollout.done[:, 0], t_next[:, 0] == 3)
    np.testing.assert_array_equal(rollout.truncated[:, 0], np.zeros(40, bool))
    np.testing.assert_array_equal(rollout.truncated[:, 1], t_next[:, 1] == 5)
    np.testing.assert_array_equal(rollout.done[:, 1], np.zeros(40, bool))
    assert rollout.reward.dtype == np.float32


def test_vectorized_train_counts_transitions_over_all_environments():
    env = count_vec_env([(3, 100)] * 4)
    config = make_config(env, TinyDQNParams(start_step=0), max_buffer_size=100, batch_size=8)
    agent = TinyDQN("test", config, run_dir="unused")
    stats = vectorized_train(0, agent, env, 42, AlgoType.OFF_POLICY)
    assert stats.env_steps == 44  # 11 vector steps of 4 environments
    assert agent.buffer.size == 11
    assert stats.episode_returns[:4] == [3.0] * 4
    assert stats.episode_lengths[:4] == [3] * 4


def test_vectorized_train_closes_the_environment():
    env = count_vec_env([(3, 100)] * 2)
    agent = TinyDQN("test", make_config(env, TinyDQNParams(), batch_size=8), run_dir="unused")
    vectorized_train(0, agent, env, 10, AlgoType.OFF_POLICY)
    assert env.closed


def test_vectorized_train_rejects_bad_arguments():
    env = count_vec_env([(3, 100)] * 2)
    agent = TinyDQN("test", make_config(env, TinyDQNParams(), batch_size=8), run_dir="unused")
    with pytest.raises(ValueError, match="n_env_steps"):
        vectorized_train(0, agent, env, 0, AlgoType.OFF_POLICY)
    with pytest.raises(ValueError, match="algo_type"):
        vectorized_train(0, agent, env, 10, AlgoType.ON_POLICY)
    with pytest.raises(ValueError, match="start_step"):
        vectorized_train(0, agent, env, 10, AlgoType.OFF_POLICY, start_step=0)
    other = count_vec_env([(3, 100)] * 3)
    with pytest.raises(ValueError, match="n_envs"):
        vectorized_train(0, agent, other, 10, AlgoType.OFF_POLICY)
    assert other.closed  # closed even when training fails


def _train_dqn(seed: int):
    env = gym.make_vec(
        "CartPole-v1", num_envs=4, vectorization_mode="sync", vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}
    )
    config = make_config(env, TinyDQNParams(start_step=200), seed=seed, max_buffer_size=500, batch_size=32)
    agent = TinyDQN("test", config, run_dir="unused")
    stats = vectorized_train(seed, agent, env, 2000, AlgoType.OFF_POLICY)
    return agent, stats


def test_same_seed_gives_bit_identical_parameters():
    agent_a, stats_a = _train_dqn(3)
    agent_b, stats_b = _train_dqn(3)
    agent_c, _ = _train_dqn(4)
    leaves_a = jax.tree_util.tree_leaves(agent_a.state)
    leaves_b = jax.tree_util.tree_leaves(agent_b.state)
    assert all(np.array_equal(a, b) for a, b in zip(leaves_a, leaves_b))
    assert stats_a.episode_returns == stats_b.episode_returns
    leaves_c = jax.tree_util.tree_leaves(agent_c.state)
    assert not all(np.array_equal(a, c) for a, c in zip(leaves_a, leaves_c))


# ---------------------------------------------------------------------------------------------
# update_epoch
# ---------------------------------------------------------------------------------------------


class SumState(AgentPyTree):
    total: jax.Array
    count: jax.Array
    seen: jax.Array


Pair = namedtuple("Pair", ["x", "y"])


def _sum_step(state: SumState, key, batch: Pair):
    assert isinstance(batch, Pair)
    state.total = state.total + jnp.sum(batch.x)
    state.count = state.count + 1
    state.seen = state.seen.at[batch.y].add(1)
    return state, {"batch_mean": jnp.mean(batch.x)}


@pytest.mark.parametrize("jit", [False, True])
def test_update_epoch_visits_every_transition_once(jit):
    x = jnp.arange(12.0)
    experience = Pair(x, jnp.arange(12))
    state = SumState(jnp.zeros(()), jnp.zeros((), jnp.int32), jnp.zeros(12, jnp.int32))

    def run(state, key):
        return update_epoch(key, state, experience, batchify, _sum_step, experience_type=Pair, batch_size=4)

    run = jax.jit(run) if jit else run
    new_state, info = run(state, jax.random.PRNGKey(0))
    assert float(new_state.total) == 66.0
    assert int(new_state.count) == 3
    np.testing.assert_array_equal(new_state.seen, np.ones(12))
    assert float(info["batch_mean"]) == pytest.approx(66.0 / 12)


def test_update_epoch_shuffles_with_the_key():
    experience = Pair(jnp.arange(8.0), jnp.arange(8))
    state = SumState(jnp.zeros(()), jnp.zeros((), jnp.int32), jnp.zeros(8, jnp.int32))

    def first_batch(key):
        def step(state, key, batch):
            return state, {"first": batch.x[0]}

        return update_epoch(key, state, experience, batchify, step, experience_type=Pair, batch_size=8)[1]["first"]

    firsts = {float(first_batch(jax.random.PRNGKey(k))) for k in range(6)}
    assert len(firsts) > 1


def test_update_epoch_drops_the_remainder_and_rejects_large_batches():
    experience = Pair(jnp.arange(10.0), jnp.arange(10))
    state = SumState(jnp.zeros(()), jnp.zeros((), jnp.int32), jnp.zeros(10, jnp.int32))
    new_state, _ = update_epoch(
        jax.random.PRNGKey(0), state, experience, batchify, _sum_step, experience_type=Pair, batch_size=4
    )
    assert int(new_state.count) == 2
    assert int(new_state.seen.sum()) == 8
    with pytest.raises(ValueError, match="batch_size=11"):
        update_epoch(jax.random.PRNGKey(0), state, experience, batchify, _sum_step, experience_type=Pair, batch_size=11)


def test_update_epoch_with_plain_tuples():
    experience = (jnp.arange(6.0), jnp.arange(6))

    def step(state, key, batch):
        assert type(batch) is tuple
        return state + jnp.sum(batch[0]), {}

    total, _ = update_epoch(
        jax.random.PRNGKey(1), jnp.zeros(()), experience, batchify, step, experience_type=tuple, batch_size=3
    )
    assert float(total) == 15.0


def test_episode_returns_count_every_step_of_every_episode():
    # gymnasium 1.3's vector RecordEpisodeStatistics drops the first reward of later episodes
    # in SAME_STEP mode; kitae's own tracking must not
    env = count_vec_env([(3, 100), (None, 5)])
    config = make_config(env, TinyDQNParams(start_step=10_000), batch_size=8)
    agent = TinyDQN("test", config, run_dir="unused")
    stats = vectorized_train(0, agent, env, 2 * 30, AlgoType.OFF_POLICY)
    by_length = sorted(set(zip(stats.episode_lengths, stats.episode_returns)))
    assert by_length == [(3, 3.0), (5, 5.0)]
    assert stats.episode_lengths.count(3) == 10 and stats.episode_lengths.count(5) == 6


def test_track_episodes_numpy_and_jax_agree():
    from kitae.loops.episodes import track_episodes

    returns, lengths = np.array([1.0, 2.0]), np.array([1, 2])
    rewards, ended = np.array([0.5, 1.0]), np.array([True, False])
    r, n, er, el = track_episodes(np, returns, lengths, rewards, ended)
    np.testing.assert_array_equal(r, [0.0, 3.0])
    np.testing.assert_array_equal(n, [0, 3])
    assert er[0] == 1.5 and el[0] == 2
    jr, jn, jer, jel = jax.jit(lambda *a: track_episodes(jnp, *a))(returns, lengths, rewards, ended)
    np.testing.assert_allclose(jr, r)
    np.testing.assert_array_equal(jn, n)


def test_the_compiled_act_gives_the_same_bits_from_a_prepared_state_and_compiles_once():
    """``compiled_steps(agent).act`` takes the acting parameters as they are or flattened once
    (``CompiledAct.prepare``, what the host loop holds between updates): the same actions,
    log-probabilities and next key, from one program; ``act_step`` unjitted agrees."""
    from kitae.loops.collect import CompiledAct, act_step, compiled_steps

    env = gym.make_vec(
        "CartPole-v1", num_envs=4, vectorization_mode="sync", vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}
    )
    agent = TinyA2C("test", make_config(env, TinyA2CParams(), max_buffer_size=8, batch_size=8), run_dir="unused")
    obs, _ = env.reset(seed=0)
    env.close()
    acting, key, step = agent.acting_params(agent.state), jax.random.PRNGKey(5), np.asarray(8, np.int32)
    act = compiled_steps(agent).act
    prepared = CompiledAct.prepare(acting)
    expected = act_step(agent, acting, key, obs, step)
    for out in (act(acting, key, obs, step), act(prepared, key, obs, step)):
        actions, log_probs, next_key, hidden = out
        np.testing.assert_array_equal(actions, expected[0])
        np.testing.assert_array_equal(log_probs, expected[1])
        np.testing.assert_array_equal(jax.random.key_data(next_key), jax.random.key_data(expected[2]))
        assert hidden is None and log_probs.dtype == jnp.float32
    assert act._cache_size() == 1
