"""kitae.modules.recurrent: the LSTM and GRU cores with an explicit hidden state, and the reset rule
(where an episode starts, the core reads the initial state), pinned with values; and
CartPole without velocities (kitae.envs.memory)."""

from __future__ import annotations

import chex
import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from kitae.modules.recurrent import RecurrentCore, initial_hidden, reset_hidden, run_core


def _core(kind, features=5, batch=3, dim=2):
    core = RecurrentCore(kind, features)
    hidden = initial_hidden(kind, features, batch)
    params = core.init(jax.random.PRNGKey(0), hidden, jnp.zeros((batch, dim)), jnp.zeros(batch, bool))
    return core, params, hidden


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_core_is_flaxs_cell_with_the_state_outside(kind):
    core, params, hidden = _core(kind)
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 2))
    new, y = core.apply(params, hidden, x, jnp.zeros(3, bool))
    cell = nn.OptimizedLSTMCell(5) if kind == "lstm" else nn.GRUCell(5)
    want_hidden, want_y = cell.apply({"params": params["params"]["cell"]}, hidden, x)
    chex.assert_trees_all_close(new, want_hidden, atol=1e-6)
    np.testing.assert_allclose(y, want_y, atol=1e-6)
    assert y.shape == (3, 5)
    assert jax.tree_util.tree_map(jnp.shape, new) == jax.tree_util.tree_map(jnp.shape, hidden)


def test_reset_sets_the_flagged_rows_to_the_initial_state():
    hidden = (jnp.ones((3, 2)), 2 * jnp.ones((3, 2)))
    out = reset_hidden(hidden, jnp.array([False, True, False]))
    np.testing.assert_array_equal(out[0], [[1, 1], [0, 0], [1, 1]])
    np.testing.assert_array_equal(out[1], [[2, 2], [0, 0], [2, 2]])


class TestResetRule(chex.TestCase):
    """An episode ends at step t in row 0 (its next observation, at t + 1, starts a new one): the
    output at t + 1 is exactly the output of a fresh core on that observation; row 1, not reset,
    carries its memory on. Run jitted and eagerly."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters("lstm", "gru")
    def test_where_an_episode_starts_the_core_reads_the_initial_state(self, kind):
        core, params, hidden = _core(kind, batch=2)
        xs = jax.random.normal(jax.random.PRNGKey(2), (6, 2, 2))
        resets = jnp.zeros((6, 2), bool).at[0].set(True).at[4, 0].set(True)  # row 0's episode ended at t = 3
        _, ys = self.variant(lambda h, x, r: run_core(core.apply, params, h, x, r))(hidden, xs, resets)
        _, fresh = core.apply(params, initial_hidden(kind, 5, 2), xs[4], jnp.zeros(2, bool))
        np.testing.assert_array_equal(ys[4, 0], fresh[0])
        assert not np.allclose(ys[4, 1], fresh[1])  # row 1 remembers


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_sequence_equals_stepping_one_step_at_a_time(kind):
    core, params, hidden = _core(kind)
    xs = jax.random.normal(jax.random.PRNGKey(3), (7, 3, 2))
    resets = jax.random.bernoulli(jax.random.PRNGKey(4), 0.3, (7, 3))
    last, ys = jax.jit(lambda h: run_core(core.apply, params, h, xs, resets))(hidden)
    h = hidden
    for t in range(7):
        h, y = core.apply(params, h, xs[t], resets[t])
        np.testing.assert_allclose(ys[t], y, rtol=1e-6, atol=1e-6)
    chex.assert_trees_all_close(last, h, rtol=1e-6, atol=1e-6)


def test_the_core_vmaps_over_agents():
    core, params, hidden = _core("gru")
    stacked = jnp.stack([hidden, hidden + 1.0])  # two agents
    xs = jnp.ones((2, 3, 2))
    out, _ = jax.vmap(lambda h, x: core.apply(params, h, x, jnp.zeros(3, bool)))(stacked, xs)
    np.testing.assert_allclose(out[0], core.apply(params, hidden, xs[0], jnp.zeros(3, bool))[0], rtol=1e-6)


@pytest.mark.parametrize("kind", ["rnn", "", "LSTM"])
def test_unknown_cores_are_refused(kind):
    with pytest.raises(ValueError, match="allowed: lstm, gru"):
        initial_hidden(kind, 4, 2)
    with pytest.raises(ValueError, match="allowed: lstm, gru"):
        RecurrentCore(kind, 4).init(jax.random.PRNGKey(0), jnp.zeros((2, 4)), jnp.zeros((2, 3)), jnp.zeros(2, bool))


def test_cartpole_without_velocities_keeps_position_and_angle():
    from kitae.envs.make import make_jax_env, make_vec_env

    full, novel = make_vec_env("CartPole-v1", 2), make_vec_env("CartPoleNoVel-v1", 2)
    a, _ = full.reset(seed=3)
    b, _ = novel.reset(seed=3)
    np.testing.assert_array_equal(b, a[:, [0, 2]])
    assert novel.single_observation_space == gym.spaces.Box(
        np.array([-4.8, -0.41887903], np.float32), np.array([4.8, 0.41887903], np.float32), dtype=np.float32
    )
    for _ in range(30):
        a, *_ = full.step(np.array([0, 1]))
        b, *_ = novel.step(np.array([0, 1]))
        np.testing.assert_array_equal(b, a[:, [0, 2]])
    full.close()
    novel.close()
    assert gym.make("CartPoleNoVel-v1").spec.max_episode_steps == 500

    jax_full, jax_novel = make_jax_env("gymnax:CartPole-v1", 2), make_jax_env("gymnax:CartPoleNoVel-v1", 2)
    key = jax.random.PRNGKey(0)
    (o1, s1), (o2, s2) = jax_full.reset(key), jax_novel.reset(key)
    np.testing.assert_array_equal(o2, o1[:, jnp.array([0, 2])])
    t1, t2 = jax_full.step(key, s1, jnp.array([0, 1])), jax_novel.step(key, s2, jnp.array([0, 1]))
    np.testing.assert_array_equal(t2.next_observation, t1.next_observation[:, jnp.array([0, 2])])
    assert jax_novel.single_observation_space.shape == (2,)
