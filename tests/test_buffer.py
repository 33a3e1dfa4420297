"""Tests of kitae.buffer: the pure buffer functions and the host-side Replay/Rollout buffers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kitae.buffer import (
    BufferState,
    Experience,
    ReplayBuffer,
    RolloutBuffer,
    buffer_add,
    buffer_init,
    buffer_reset,
    buffer_rollout,
    buffer_sample,
)

N_ENVS = 3
OBS_SHAPE = (4,)


def _step(value: float, n_envs: int = N_ENVS, np_module=np) -> Experience:
    """One vector step whose every leaf encodes ``value`` (and the env index in observation)."""
    envs = np_module.arange(n_envs)
    obs = value + 0.01 * envs[:, None] + np_module.zeros((n_envs, *OBS_SHAPE))
    return Experience(
        observation=np_module.asarray(obs, dtype=np_module.float32),
        action=np_module.asarray(np_module.full((n_envs,), value), dtype=np_module.int32),
        reward=np_module.asarray(np_module.full((n_envs,), value), dtype=np_module.float32),
        done=np_module.asarray(np_module.zeros((n_envs,)), dtype=bool),
        next_observation=np_module.asarray(obs + 1, dtype=np_module.float32),
        log_prob=np_module.asarray(np_module.full((n_envs,), -value), dtype=np_module.float32),
        truncated=np_module.asarray(np_module.zeros((n_envs,)), dtype=bool),
    )


def _dict_step(value: float, n_envs: int = N_ENVS, agents=("a0", "a1")) -> Experience:
    """A multi-agent step: every field is a dict keyed by agent, leaves ``(E, ...)``."""
    base = _step(value, n_envs)
    return Experience(
        *({agent: leaf + i for i, agent in enumerate(agents)} if leaf is not None else None for leaf in base)
    )


_jit_add = jax.jit(buffer_add)
_jit_sample = jax.jit(buffer_sample, static_argnums=2)


def _filled(values, capacity: int) -> BufferState:
    state = buffer_init(_step(0.0), capacity)
    for v in values:
        state = _jit_add(state, _step(float(v)))
    return state


# ---------------------------------------------------------------------------------------------
# buffer_init
# ---------------------------------------------------------------------------------------------


def test_init_shapes_and_dtypes():
    state = buffer_init(_step(1.0), 7)
    assert state.capacity == 7 and state.n_envs == N_ENVS
    assert state.data.observation.shape == (7, N_ENVS, *OBS_SHAPE)
    assert state.data.observation.dtype == jnp.float32
    assert state.data.action.shape == (7, N_ENVS) and state.data.action.dtype == jnp.int32
    assert state.data.reward.shape == (7, N_ENVS) and state.data.reward.dtype == jnp.float32
    assert state.data.done.shape == (7, N_ENVS) and state.data.done.dtype == jnp.bool_
    assert state.data.next_observation.shape == (7, N_ENVS, *OBS_SHAPE)
    assert state.data.truncated.dtype == jnp.bool_
    assert int(state.position) == 0 and int(state.size) == 0
    assert state.position.dtype == jnp.int32 and state.size.dtype == jnp.int32
    # the arrays are empty (zeros), not a copy of the example
    assert not np.any(np.asarray(state.data.reward))


def test_init_dict_leaves():
    state = buffer_init(_dict_step(1.0), 5)
    assert set(state.data.observation) == {"a0", "a1"}
    for agent in ("a0", "a1"):
        assert state.data.observation[agent].shape == (5, N_ENVS, *OBS_SHAPE)
        assert state.data.action[agent].dtype == jnp.int32
        assert state.data.done[agent].shape == (5, N_ENVS)
    assert state.capacity == 5 and state.n_envs == N_ENVS


@pytest.mark.parametrize("capacity", [0, -1, "3", 2.0, True, None])
def test_init_rejects_bad_capacity(capacity):
    with pytest.raises(ValueError, match=r"capacity"):
        buffer_init(_step(0.0), capacity)


def test_init_rejects_leaf_without_env_axis():
    step = _step(0.0)._replace(reward=jnp.float32(1.0))
    with pytest.raises(ValueError, match=r"environment axis"):
        buffer_init(step, 4)


def test_init_rejects_differing_env_sizes():
    step = _step(0.0)._replace(reward=jnp.zeros((N_ENVS + 1,)))
    with pytest.raises(ValueError, match=r"same leading"):
        buffer_init(step, 4)


def test_init_rejects_differing_env_sizes_between_agents():
    step = _dict_step(0.0)
    step.observation["a1"] = jnp.zeros((N_ENVS + 2, *OBS_SHAPE))
    with pytest.raises(ValueError, match=r"same leading"):
        buffer_init(step, 4)


# ---------------------------------------------------------------------------------------------
# buffer_add
# ---------------------------------------------------------------------------------------------


def test_add_counters_and_values():
    state = buffer_init(_step(0.0), 4)
    state = buffer_add(state, _step(5.0))
    assert int(state.position) == 1 and int(state.size) == 1
    np.testing.assert_allclose(state.data.reward[0], [5.0] * N_ENVS)
    np.testing.assert_allclose(state.data.observation[0], np.asarray(_step(5.0).observation))
    np.testing.assert_array_equal(state.data.action[0], [5] * N_ENVS)
    np.testing.assert_allclose(state.data.log_prob[0], [-5.0] * N_ENVS)
    assert not np.any(np.asarray(state.data.reward[1:]))  # other rows untouched
    state = buffer_add(state, _step(6.0))
    assert int(state.position) == 2 and int(state.size) == 2
    np.testing.assert_allclose(state.data.reward[:2, 0], [5.0, 6.0])


def test_add_wraps_and_overwrites_oldest():
    state = _filled([1, 2, 3], capacity=3)
    assert int(state.position) == 0 and int(state.size) == 3
    state = buffer_add(state, _step(4.0))
    assert int(state.position) == 1 and int(state.size) == 3
    np.testing.assert_allclose(state.data.reward[:, 0], [4.0, 2.0, 3.0])
    state = buffer_add(state, _step(5.0))
    assert int(state.position) == 2 and int(state.size) == 3
    np.testing.assert_allclose(state.data.reward[:, 0], [4.0, 5.0, 3.0])


def test_add_casts_to_buffer_dtype():
    state = buffer_init(_step(0.0), 2)
    step = _step(0.0)._replace(reward=np.full((N_ENVS,), 2.5, np.float64), action=np.full((N_ENVS,), 7, np.int64))
    state = buffer_add(state, step)
    assert state.data.reward.dtype == jnp.float32 and state.data.action.dtype == jnp.int32
    np.testing.assert_allclose(state.data.reward[0], 2.5)


def test_add_dict_leaves():
    state = buffer_init(_dict_step(0.0), 3)
    state = buffer_add(state, _dict_step(2.0))
    np.testing.assert_allclose(state.data.reward["a0"][0], 2.0)
    np.testing.assert_allclose(state.data.reward["a1"][0], 3.0)


def test_add_under_jit_and_scan():
    add = jax.jit(buffer_add)
    state = buffer_init(_step(0.0), 4)
    for v in range(6):
        state = add(state, _step(float(v)))
    assert int(state.position) == 2 and int(state.size) == 4
    np.testing.assert_allclose(state.data.reward[:, 0], [4.0, 5.0, 2.0, 3.0])

    # the same inside a compiled loop
    def body(state, v):
        return buffer_add(state, _step(v, np_module=jnp)), None

    scanned, _ = jax.jit(lambda s: jax.lax.scan(body, s, jnp.arange(6.0)))(buffer_init(_step(0.0), 4))
    np.testing.assert_allclose(scanned.data.reward, state.data.reward)
    assert int(scanned.position) == 2 and int(scanned.size) == 4


# ---------------------------------------------------------------------------------------------
# buffer_sample
# ---------------------------------------------------------------------------------------------


def test_sample_shapes():
    state = _filled([1, 2], capacity=5)
    batch = _jit_sample(state, jax.random.PRNGKey(0), 11)
    assert isinstance(batch, Experience)
    assert batch.observation.shape == (11, *OBS_SHAPE)
    assert batch.reward.shape == (11,) and batch.action.shape == (11,) and batch.done.shape == (11,)
    assert batch.action.dtype == jnp.int32


def test_sample_dict_shapes():
    state = buffer_init(_dict_step(0.0), 4)
    state = buffer_add(state, _dict_step(1.0))
    batch = _jit_sample(state, jax.random.PRNGKey(0), 6)
    assert batch.observation["a1"].shape == (6, *OBS_SHAPE)
    assert batch.reward["a0"].shape == (6,)


def test_sample_only_filled_rows():
    state = _filled([11, 22, 33], capacity=10)
    batch = _jit_sample(state, jax.random.PRNGKey(1), 1000)
    rewards = np.asarray(batch.reward)
    assert set(np.unique(rewards)) <= {11.0, 22.0, 33.0}
    assert set(np.unique(rewards)) == {11.0, 22.0, 33.0}  # and each of them is reached
    # transitions stay whole: the observation sampled belongs to the same row/env as the reward
    obs = np.asarray(batch.observation)
    env = np.round((obs[:, 0] - rewards) / 0.01)
    assert set(np.unique(env)) == set(range(N_ENVS))
    np.testing.assert_allclose(obs[:, 0], rewards + 0.01 * env, atol=1e-4)
    np.testing.assert_allclose(np.asarray(batch.log_prob), -rewards)
    np.testing.assert_allclose(np.asarray(batch.next_observation), obs + 1)


def test_sample_is_uniform_over_transitions():
    size, n_envs, n = 4, N_ENVS, 24_000
    state = _filled(range(1, size + 1), capacity=8)
    batch = _jit_sample(state, jax.random.PRNGKey(42), n)
    rows = np.asarray(batch.reward).astype(int) - 1
    envs = np.round((np.asarray(batch.observation)[:, 0] - np.asarray(batch.reward)) / 0.01).astype(int)
    counts = np.bincount(rows * n_envs + envs, minlength=size * n_envs)
    assert counts.size == size * n_envs
    expected = n / (size * n_envs)
    chi2 = float(np.sum((counts - expected) ** 2 / expected))
    # 11 degrees of freedom: the 0.999 quantile is about 31.3
    assert chi2 < 31.3, (chi2, counts)


def test_sample_after_wrap_covers_all_rows():
    state = _filled(range(1, 8), capacity=5)  # rows hold 6, 7, 3, 4, 5
    batch = _jit_sample(state, jax.random.PRNGKey(3), 500)
    assert set(np.unique(np.asarray(batch.reward))) == {3.0, 4.0, 5.0, 6.0, 7.0}


def test_sample_same_key_same_sample_different_key_different():
    state = _filled(range(1, 6), capacity=5)
    a = _jit_sample(state, jax.random.PRNGKey(7), 64)
    b = _jit_sample(state, jax.random.PRNGKey(7), 64)
    c = _jit_sample(state, jax.random.PRNGKey(8), 64)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.observation, c.observation)


def test_sample_under_jit_matches_eager():
    state = _filled([1, 2, 3], capacity=6)
    key = jax.random.PRNGKey(5)
    jitted = jax.jit(buffer_sample, static_argnums=2)(state, key, 32)
    eager = buffer_sample(state, key, 32)
    for x, y in zip(jitted, eager):
        np.testing.assert_array_equal(x, y)
    assert set(np.unique(np.asarray(jitted.reward))) <= {1.0, 2.0, 3.0}


# ---------------------------------------------------------------------------------------------
# buffer_rollout / buffer_reset
# ---------------------------------------------------------------------------------------------


def test_rollout_full_in_order():
    state = _filled([1, 2, 3, 4], capacity=4)
    rollout = buffer_rollout(state)
    assert rollout.observation.shape == (4, N_ENVS, *OBS_SHAPE)
    np.testing.assert_allclose(rollout.reward[:, 0], [1, 2, 3, 4])


def test_rollout_after_wrap_oldest_first():
    state = _filled([1, 2, 3, 4, 5, 6], capacity=4)  # rows hold 5, 6, 3, 4; position 2
    rollout = buffer_rollout(state)
    np.testing.assert_allclose(rollout.reward[:, 0], [3, 4, 5, 6])
    np.testing.assert_allclose(rollout.observation[:, 1, 0], np.array([3, 4, 5, 6]) + 0.01)
    np.testing.assert_allclose(rollout.log_prob[:, 2], [-3, -4, -5, -6])
    jitted = jax.jit(buffer_rollout)(state)
    np.testing.assert_allclose(jitted.reward[:, 0], [3, 4, 5, 6])


def test_rollout_partial_buffer_stored_rows_first():
    state = _filled([1, 2], capacity=4)
    rollout = buffer_rollout(state)
    np.testing.assert_allclose(rollout.reward[:2, 0], [1, 2])


def test_rollout_dict_leaves():
    state = buffer_init(_dict_step(0.0), 2)
    for v in (1.0, 2.0, 3.0):
        state = buffer_add(state, _dict_step(v))
    rollout = buffer_rollout(state)
    np.testing.assert_allclose(rollout.reward["a0"][:, 0], [2, 3])
    np.testing.assert_allclose(rollout.reward["a1"][:, 0], [3, 4])


def test_reset_zeroes_counters_and_refills_from_row_zero():
    state = _filled([1, 2, 3], capacity=5)
    state = buffer_reset(state)
    assert int(state.position) == 0 and int(state.size) == 0
    assert state.position.dtype == jnp.int32 and state.size.dtype == jnp.int32
    assert state.data.observation.shape == (5, N_ENVS, *OBS_SHAPE)
    state = buffer_add(state, _step(9.0))
    assert int(state.size) == 1
    batch = _jit_sample(state, jax.random.PRNGKey(0), 200)
    assert set(np.unique(np.asarray(batch.reward))) == {9.0}  # stale rows are never sampled


# ---------------------------------------------------------------------------------------------
# Host-side buffers
# ---------------------------------------------------------------------------------------------


def test_host_add_converts_64_bit_dtypes():
    buffer = ReplayBuffer(4)
    buffer.add(
        _step(1.0, np_module=np)._replace(
            observation=np.ones((N_ENVS, *OBS_SHAPE), np.float64),
            reward=np.ones((N_ENVS,), np.float64),
            action=np.ones((N_ENVS,), np.int64),
        )
    )
    data = buffer.state.data
    assert data.observation.dtype == jnp.float32
    assert data.reward.dtype == jnp.float32
    assert data.action.dtype == jnp.int32
    assert data.done.dtype == jnp.bool_
    # a second add with 64-bit values lands in the same (32-bit) arrays
    buffer.add(_step(2.0, np_module=np)._replace(reward=np.full((N_ENVS,), 2.0, np.float64)))
    assert buffer.state.data.reward.dtype == jnp.float32
    np.testing.assert_allclose(buffer.state.data.reward[:2, 0], [1.0, 2.0])


def test_host_add_converts_64_bit_dtypes_even_with_x64_enabled():
    """With x64 off JAX would truncate anyway; with it on, only the host conversion keeps 32 bits."""
    with jax.enable_x64(True):
        buffer = ReplayBuffer(2)
        buffer.add(
            _step(1.0)._replace(
                observation=np.ones((N_ENVS, *OBS_SHAPE), np.float64),
                reward=np.ones((N_ENVS,), np.float64),
                action=np.ones((N_ENVS,), np.int64),
            )
        )
        data = buffer.state.data
        assert data.observation.dtype == jnp.float32
        assert data.reward.dtype == jnp.float32
        assert data.action.dtype == jnp.int32
        assert buffer.sample(jax.random.PRNGKey(0), 4).action.dtype == jnp.int32


def test_host_size_and_n_transitions():
    buffer = ReplayBuffer(3)
    assert buffer.size == 0 and len(buffer) == 0 and buffer.n_transitions == 0
    for i, v in enumerate([1.0, 2.0, 3.0, 4.0, 5.0]):
        buffer.add(_step(v, np_module=np))
        assert buffer.size == min(i + 1, 3) and len(buffer) == buffer.size
        assert buffer.n_transitions == buffer.size * N_ENVS


def test_host_n_transitions_counts_agents():
    buffer = ReplayBuffer(4)
    buffer.add(_dict_step(1.0, agents=("a", "b", "c")))
    buffer.add(_dict_step(2.0, agents=("a", "b", "c")))
    assert buffer.size == 2
    assert buffer.n_transitions == 2 * N_ENVS * 3


@pytest.mark.parametrize("cls", [ReplayBuffer, RolloutBuffer])
@pytest.mark.parametrize("capacity", [0, "3", True])
def test_host_rejects_bad_capacity(cls, capacity):
    with pytest.raises(ValueError, match=r"capacity"):
        cls(capacity)


def test_replay_sample_empty_raises():
    buffer = ReplayBuffer(4)
    with pytest.raises(RuntimeError, match=r"empty"):
        buffer.sample(jax.random.PRNGKey(0), 2)


def test_replay_sample_after_reset_raises():
    buffer = ReplayBuffer(4)
    buffer.add(_step(1.0, np_module=np))
    buffer.reset()
    assert buffer.size == 0 and buffer.n_transitions == 0
    with pytest.raises(RuntimeError, match=r"empty"):
        buffer.sample(jax.random.PRNGKey(0), 2)


def test_replay_sample_shapes_values_and_determinism():
    buffer = ReplayBuffer(5)
    for v in (1.0, 2.0, 3.0):
        buffer.add(_step(v, np_module=np))
    key = jax.random.PRNGKey(11)
    a = buffer.sample(key, 16)
    b = buffer.sample(key, 16)
    assert a.observation.shape == (16, *OBS_SHAPE) and a.reward.shape == (16,)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert set(np.unique(np.asarray(a.reward))) <= {1.0, 2.0, 3.0}
    c = buffer.sample(jax.random.PRNGKey(12), 16)
    assert not np.array_equal(a.observation, c.observation)


def test_rollout_buffer_full_rollout_reset():
    buffer = RolloutBuffer(3)
    assert not buffer.full
    for v in (1.0, 2.0):
        buffer.add(_step(v, np_module=np))
        assert not buffer.full
    buffer.add(_step(3.0, np_module=np))
    assert buffer.full and buffer.size == 3 and buffer.n_transitions == 3 * N_ENVS
    rollout = buffer.rollout()
    assert rollout.observation.shape == (3, N_ENVS, *OBS_SHAPE)
    np.testing.assert_allclose(rollout.reward[:, 0], [1.0, 2.0, 3.0])
    buffer.reset()
    assert buffer.size == 0 and not buffer.full
    # the rollout handed out before the reset stays readable
    np.testing.assert_allclose(np.asarray(rollout.reward[:, 0]), [1.0, 2.0, 3.0])
    for v in (4.0, 5.0, 6.0):
        buffer.add(_step(v, np_module=np))
    assert buffer.full
    np.testing.assert_allclose(buffer.rollout().reward[:, 0], [4.0, 5.0, 6.0])


def test_rollout_buffer_empty_raises():
    buffer = RolloutBuffer(2)
    with pytest.raises(RuntimeError, match=r"empty"):
        buffer.rollout()
    buffer.add(_step(1.0, np_module=np))
    buffer.reset()
    with pytest.raises(RuntimeError, match=r"empty"):
        buffer.rollout()


def test_rollout_buffer_overfilled_keeps_time_order():
    buffer = RolloutBuffer(3)
    for v in (1.0, 2.0, 3.0, 4.0):
        buffer.add(_step(v, np_module=np))
    assert buffer.full
    np.testing.assert_allclose(buffer.rollout().reward[:, 0], [2.0, 3.0, 4.0])


# ---------------------------------------------------------------------------------------------
# The guide's six-field Experience
# ---------------------------------------------------------------------------------------------


def test_experience_with_the_guides_six_fields_leaves_truncated_none():
    step = _step(1.0)
    six = Experience(step.observation, step.action, step.reward, step.done, step.next_observation, step.log_prob)
    assert six.truncated is None
    # It is stored, sampled and rolled out like the full one (the missing field has no arrays).
    state = buffer_add(buffer_init(six, 4), six)
    assert state.data.truncated is None
    sample = buffer_sample(state, jax.random.PRNGKey(0), 5)
    assert sample.truncated is None and sample.reward.shape == (5,)
    buffer = RolloutBuffer(2)
    buffer.add(six)
    buffer.add(six)
    assert buffer.rollout().truncated is None


def test_gae_reads_a_missing_truncated_field_as_never_truncated():
    from kitae.timesteps import compute_gae

    rewards = jnp.array([1.0, 1.0, 1.0])
    values = jnp.array([0.5, 0.4, 0.3])
    next_values = jnp.array([0.4, 0.3, 0.2])
    done = jnp.array([False, True, False])
    expected = compute_gae(rewards, values, next_values, done, jnp.zeros(3, bool), 0.9, 0.8)
    for got in (
        compute_gae(rewards, values, next_values, done, None, 0.9, 0.8),
        jax.jit(lambda d: compute_gae(rewards, values, next_values, d, None, 0.9, 0.8))(done),
    ):
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("buffer_cls", [ReplayBuffer, RolloutBuffer])
def test_add_rows_stores_the_steps_in_order(buffer_cls):
    rows = {"x": np.arange(3 * 2 * 4, dtype=np.float32).reshape(3, 2, 4), "done": np.zeros((3, 2), bool)}
    at_once, one_by_one = buffer_cls(5), buffer_cls(5)
    at_once.add_rows(rows)
    for t in range(3):
        one_by_one.add({k: v[t] for k, v in rows.items()})
    assert at_once.size == one_by_one.size == 3
    for a, b in zip(jax.tree_util.tree_leaves(at_once.state), jax.tree_util.tree_leaves(one_by_one.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("buffer_cls", [ReplayBuffer, RolloutBuffer])
def test_host_rows_take_the_first_rows_dtypes_and_are_stored_as_converted(buffer_cls):
    """float64 is stored as float32 and int64 as int32 in every row (the rollout buffer converts
    only its first row and lets NumPy's assignment cast the later ones: the same values)."""
    rows = [
        {"x": np.array([0.1, 1e-8 + 1.0], np.float64), "a": np.array([3, -(2**31) - 5], np.int64), "j": jnp.ones(2)}
        for _ in range(3)
    ]
    rows[1]["x"] = np.array([1 / 3, 2 / 3])
    buffer = buffer_cls(3)
    for row in rows:
        buffer.add(row)
    data = buffer.state.data
    assert data["x"].dtype == np.float32 and data["a"].dtype == np.int32 and data["j"].dtype == np.float32
    for t, row in enumerate(rows):
        np.testing.assert_array_equal(np.asarray(data["x"][t]), row["x"].astype(np.float32))
        np.testing.assert_array_equal(np.asarray(data["a"][t]), row["a"].astype(np.int32))


def test_a_rollout_row_of_another_structure_is_refused():
    buffer = RolloutBuffer(3)
    buffer.add({"x": np.zeros(2), "done": np.zeros(2, bool)})
    with pytest.raises(ValueError, match=r"the experience has 1 arrays .* the rollout's first step had 2"):
        buffer.add({"x": np.zeros(2)})
    assert buffer.size == 1
