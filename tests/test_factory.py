"""Tests of kitae.algos.factory: fn_parallel and explore_general_factory."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kitae.algos.factory import explore_general_factory, fn_parallel
from kitae.modules.pytree import AgentPyTree

D, N_ACTIONS, E = 3, 64, 5
AGENTS = ("agent_0", "agent_1")


class QState(AgentPyTree):
    weights: jax.Array  # (D, N_ACTIONS)


STATE = QState(weights=jax.random.normal(jax.random.key(42), (D, N_ACTIONS)))


def explore_fn(state, key, observation, exploration=0.0):
    """Epsilon-greedy on a linear Q function, batched: observation (B, D) -> actions (B,), log_probs (B,).

    With exploration >= 1 the action is ``randint(key, (B,), 0, N_ACTIONS)`` exactly.
    """
    q = observation @ state.weights  # (B, N_ACTIONS)
    greedy = jnp.argmax(q, axis=-1)
    k_explore, k_random = jax.random.split(key)
    random_actions = jax.random.randint(k_random, greedy.shape, 0, N_ACTIONS)
    explore = jax.random.uniform(k_explore, greedy.shape) < exploration
    actions = jnp.where(explore, random_actions, greedy)
    log_probs = jnp.take_along_axis(jax.nn.log_softmax(q), actions[:, None], axis=-1)[:, 0]
    return actions, log_probs


def expected_greedy(obs):
    """numpy greedy actions and log-probs for obs (..., D)."""
    q = np.asarray(obs) @ np.asarray(STATE.weights)
    actions = q.argmax(-1)
    log_softmax = q - np.log(np.exp(q - q.max(-1, keepdims=True)).sum(-1, keepdims=True)) - q.max(-1, keepdims=True)
    return actions, np.take_along_axis(log_softmax, actions[..., None], axis=-1)[..., 0]


def expected_random(key, batch_shape):
    _, k_random = jax.random.split(key)
    return np.asarray(jax.random.randint(k_random, batch_shape, 0, N_ACTIONS))


def obs_for(batch_shape, seed):
    return jax.random.normal(jax.random.key(seed), batch_shape + (D,))


JIT = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])


def maybe_jit(fn, jit):
    return jax.jit(fn) if jit else fn


# ---------------------------------------------------------------------------------------------
# fn_parallel
# ---------------------------------------------------------------------------------------------


@JIT
def test_fn_parallel_tuple_outputs(jit):
    keys = {a: jax.random.key(i) for i, a in enumerate(AGENTS)}
    obs = {a: obs_for((E,), 10 + i) for i, a in enumerate(AGENTS)}
    f = maybe_jit(lambda s, k, o: fn_parallel(explore_fn)(s, k, o, exploration=0.0), jit)
    actions, log_probs = f(STATE, keys, obs)
    assert isinstance(actions, dict) and isinstance(log_probs, dict)
    assert list(actions.keys()) == list(AGENTS) and list(log_probs.keys()) == list(AGENTS)
    for a in AGENTS:
        exp_actions, exp_log_probs = expected_greedy(obs[a])
        assert actions[a].shape == (E,)
        np.testing.assert_array_equal(actions[a], exp_actions)
        np.testing.assert_allclose(log_probs[a], exp_log_probs, rtol=1e-5, atol=1e-5)


@JIT
def test_fn_parallel_agents_get_their_own_key(jit):
    keys = {a: jax.random.key(i) for i, a in enumerate(AGENTS)}
    same_obs = obs_for((E,), 0)
    obs = dict.fromkeys(AGENTS, same_obs)
    f = maybe_jit(lambda s, k, o: fn_parallel(explore_fn)(s, k, o, exploration=1.0), jit)
    actions, _ = f(STATE, keys, obs)
    for a in AGENTS:
        np.testing.assert_array_equal(actions[a], expected_random(keys[a], (E,)))
    assert not np.array_equal(actions["agent_0"], actions["agent_1"])
    # Same key for both agents -> same sample.
    actions_same, _ = f(STATE, dict.fromkeys(AGENTS, keys["agent_0"]), obs)
    np.testing.assert_array_equal(actions_same["agent_0"], actions_same["agent_1"])


def test_fn_parallel_single_output_and_pytrees():
    class Obs(NamedTuple):
        x: jax.Array
        y: jax.Array

    def fn(state, obs, bias, factor=1.0):
        return {"sum": (obs.x + obs.y) * factor + bias, "w": state.weights[0, 0] * jnp.ones(())}

    trees = {"b": Obs(jnp.ones(2), jnp.full(2, 2.0)), "a": Obs(jnp.zeros(2), jnp.full(2, 5.0))}
    bias = {"a": jnp.asarray(1.0), "b": jnp.asarray(-1.0)}
    out = fn_parallel(fn)(STATE, trees, bias, factor=10.0)
    assert isinstance(out, dict) and list(out.keys()) == ["b", "a"]
    np.testing.assert_allclose(out["b"]["sum"], [29.0, 29.0])
    np.testing.assert_allclose(out["a"]["sum"], [51.0, 51.0])
    np.testing.assert_allclose(out["a"]["w"], STATE.weights[0, 0])


def test_fn_parallel_traced_hyperparameter():
    def fn(state, x, scale=1.0):
        return x * scale

    f = jax.jit(lambda x, scale: fn_parallel(fn)(STATE, x, scale=scale))
    out = f({"a": jnp.ones(3), "b": jnp.full(3, 2.0)}, jnp.asarray(3.0))
    np.testing.assert_allclose(out["a"], 3.0)
    np.testing.assert_allclose(out["b"], 6.0)


def test_fn_parallel_legacy_uint32_keys():
    keys = {a: jax.random.PRNGKey(i) for i, a in enumerate(AGENTS)}
    obs = {a: obs_for((E,), i) for i, a in enumerate(AGENTS)}
    actions, _ = fn_parallel(explore_fn)(STATE, keys, obs, exploration=1.0)
    for a in AGENTS:
        np.testing.assert_array_equal(actions[a], expected_random(keys[a], (E,)))


def test_fn_parallel_rejects_mismatched_agents():
    keys = {"agent_0": jax.random.key(0), "agent_1": jax.random.key(1)}
    obs = {"agent_0": obs_for((E,), 0), "agent_2": obs_for((E,), 1)}
    with pytest.raises(ValueError, match=r"mismatched agent keys.*agent_1.*agent_2"):
        fn_parallel(explore_fn)(STATE, keys, obs)


def test_fn_parallel_rejects_non_dict():
    with pytest.raises(ValueError, match="dict keyed by agent"):
        fn_parallel(explore_fn)(STATE, jax.random.key(0), {"a": obs_for((E,), 0)})


# ---------------------------------------------------------------------------------------------
# explore_general_factory
# ---------------------------------------------------------------------------------------------


def call(fn, jit, exploration):
    """Optionally jits fn with exploration as a traced argument."""
    if jit:
        return lambda s, k, o: jax.jit(lambda s, k, o, eps: fn(s, k, o, exploration=eps))(
            s, k, o, jnp.asarray(exploration)
        )
    return lambda s, k, o: fn(s, k, o, exploration=exploration)


@JIT
def test_explore_vectorized(jit):
    fn = explore_general_factory(explore_fn, vectorized=True, parallel=False)
    assert fn is explore_fn
    obs = obs_for((E,), 1)
    actions, log_probs = call(fn, jit, 0.0)(STATE, jax.random.key(0), obs)
    exp_actions, exp_log_probs = expected_greedy(obs)
    assert actions.shape == (E,) and log_probs.shape == (E,)
    np.testing.assert_array_equal(actions, exp_actions)
    np.testing.assert_allclose(log_probs, exp_log_probs, rtol=1e-5, atol=1e-5)
    key = jax.random.key(3)
    actions, _ = call(fn, jit, 1.0)(STATE, key, obs)
    np.testing.assert_array_equal(actions, expected_random(key, (E,)))


@JIT
def test_explore_single(jit):
    fn = explore_general_factory(explore_fn, vectorized=False, parallel=False)
    obs = obs_for((), 2)  # (D,), no batch axis
    actions, log_probs = call(fn, jit, 0.0)(STATE, jax.random.key(0), obs)
    exp_actions, exp_log_probs = expected_greedy(obs)
    assert actions.shape == () and log_probs.shape == ()
    assert int(actions) == int(exp_actions)
    np.testing.assert_allclose(log_probs, exp_log_probs, rtol=1e-5, atol=1e-5)
    key = jax.random.key(7)
    actions, _ = call(fn, jit, 1.0)(STATE, key, obs)
    assert int(actions) == int(expected_random(key, (1,))[0])


@JIT
@pytest.mark.parametrize("vectorized", [True, False], ids=["vectorized", "single"])
def test_explore_parallel(jit, vectorized):
    fn = explore_general_factory(explore_fn, vectorized=vectorized, parallel=True)
    batch_shape = (E,) if vectorized else ()
    keys = {a: jax.random.key(100 + i) for i, a in enumerate(AGENTS)}
    obs = {a: obs_for(batch_shape, 20 + i) for i, a in enumerate(AGENTS)}

    actions, log_probs = call(fn, jit, 0.0)(STATE, keys, obs)
    assert list(actions.keys()) == list(AGENTS) and list(log_probs.keys()) == list(AGENTS)
    for a in AGENTS:
        exp_actions, exp_log_probs = expected_greedy(obs[a])
        assert actions[a].shape == batch_shape and log_probs[a].shape == batch_shape
        np.testing.assert_array_equal(actions[a], exp_actions)
        np.testing.assert_allclose(log_probs[a], exp_log_probs, rtol=1e-5, atol=1e-5)

    # Stochastic: each agent samples with its own key.
    same_obs = {a: obs_for(batch_shape, 0) for a in AGENTS}
    actions, _ = call(fn, jit, 1.0)(STATE, keys, same_obs)
    for a in AGENTS:
        expected = expected_random(keys[a], (E,) if vectorized else (1,))
        np.testing.assert_array_equal(actions[a], expected if vectorized else expected[0])
    assert not np.array_equal(actions["agent_0"], actions["agent_1"])


def test_explore_parallel_rejects_mismatched_agents():
    fn = explore_general_factory(explore_fn, vectorized=True, parallel=True)
    keys = {"agent_0": jax.random.key(0), "agent_1": jax.random.key(1)}
    obs = {"agent_0": obs_for((E,), 0)}
    with pytest.raises(ValueError, match="mismatched agent keys"):
        fn(STATE, keys, obs, exploration=0.1)
