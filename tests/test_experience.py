"""Tests of kitae.algos.experience: helpers and ExperiencePipeline in its four modes."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kitae.algos.experience import (
    ExperiencePipeline,
    dict_to_tuple,
    merge_n_first_dims,
    stack_and_merge_n_first_dims,
    tuple_to_dict,
)
from kitae.modules.pytree import AgentPyTree

T, E, D = 4, 3, 2


class Exp(NamedTuple):
    obs: jax.Array  # (T, [E,] D)
    reward: jax.Array  # (T, [E])


class Out(NamedTuple):
    value: jax.Array
    noise: jax.Array


class ScaleState(AgentPyTree):
    scale: jax.Array


STATE = ScaleState(scale=jnp.asarray(2.0))


def scale_transform(state, key, exp):
    """(T, D), (T,) -> value (T, D) = obs * scale + reward; noise (T,) = uniform(key)."""
    value = exp.obs * state.scale + exp.reward[:, None]
    noise = jax.random.uniform(key, exp.reward.shape)
    return Out(value=value, noise=noise)


def drop_last_transform(state, key, out):
    """Second transform: drops the last step and returns a plain tuple (T - 1 steps)."""
    return (out.value[:-1] + 1.0, out.value[1:, 0] - out.value[:-1, 0])


def make_exp(shape_prefix, offset=0.0):
    n = int(np.prod(shape_prefix))
    obs = jnp.arange(n * D, dtype=jnp.float32).reshape(shape_prefix + (D,)) + offset
    reward = jnp.arange(n, dtype=jnp.float32).reshape(shape_prefix) * 10.0 + offset
    return Exp(obs=obs, reward=reward)


def expected_value(exp):
    """numpy version of scale_transform's value for leaves (T, ..., D) / (T, ...)."""
    return np.asarray(exp.obs) * 2.0 + np.asarray(exp.reward)[..., None]


def maybe_jit(pipeline, jit):
    if jit:
        return jax.jit(lambda s, k, e: pipeline.run(s, k, e))
    return pipeline.run


KEY = jax.random.key(0)
JIT = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def test_merge_n_first_dims_values():
    x = jnp.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    np.testing.assert_array_equal(merge_n_first_dims(x, 1), x)
    m2 = merge_n_first_dims(x, 2)
    assert m2.shape == (6, 4, 5)
    np.testing.assert_array_equal(m2[1 * 3 + 2], x[1, 2])
    m3 = merge_n_first_dims(x, 3)
    assert m3.shape == (24, 5)
    np.testing.assert_array_equal(m3[(1 * 3 + 2) * 4 + 3], x[1, 2, 3])
    assert merge_n_first_dims(x).shape == (6, 4, 5)  # default n=2


def test_merge_n_first_dims_jit_static():
    x = jnp.arange(24.0).reshape(2, 3, 4)
    out = jax.jit(merge_n_first_dims, static_argnums=1)(x, 3)
    np.testing.assert_array_equal(out, x.reshape(24))


def test_merge_n_first_dims_refuses_a_traced_n():
    # Seed 000: "AssertionError - If n is not specified as static when jitting."
    x = jnp.zeros((4, 5, 6))
    with pytest.raises(AssertionError, match="static"):
        jax.jit(merge_n_first_dims)(x, 2)
    with pytest.raises(AssertionError, match="static"):
        jax.jit(stack_and_merge_n_first_dims)([x, x], 2)


@pytest.mark.parametrize("n", [0, -1])
def test_merge_n_first_dims_rejects_non_positive(n):
    with pytest.raises(AssertionError, match=f"n={n}"):
        merge_n_first_dims(jnp.zeros((2, 3)), n)


@JIT
def test_merge_n_first_dims_flattens_arrays_with_fewer_dims(jit):
    merge = jax.jit(merge_n_first_dims, static_argnums=1) if jit else merge_n_first_dims
    x = jnp.arange(6.0)
    np.testing.assert_array_equal(merge(x, 2), x)  # (T,) with n=2: already flat
    np.testing.assert_array_equal(merge(x.reshape(2, 3), 3), x)  # (2, 3) with n=3: flattened
    np.testing.assert_array_equal(merge(jnp.float32(7.0), 2), jnp.array([7.0]))  # a scalar: (1,)


def test_stack_and_merge_n_first_dims_values():
    arrays = [jnp.arange(T * E, dtype=jnp.float32).reshape(T, E) + 100 * a for a in range(3)]
    s1 = stack_and_merge_n_first_dims(arrays, 1)
    assert s1.shape == (T, 3, E)
    np.testing.assert_array_equal(s1[2, 1], arrays[1][2])
    s2 = stack_and_merge_n_first_dims(arrays)
    assert s2.shape == (T * 3, E)
    np.testing.assert_array_equal(s2[2 * 3 + 1], arrays[1][2])
    s3 = stack_and_merge_n_first_dims(arrays, 3)
    assert s3.shape == (T * 3 * E,)
    assert float(s3[(2 * 3 + 1) * E + 2]) == float(arrays[1][2, 2])


def test_stack_and_merge_rejects_non_positive():
    with pytest.raises(AssertionError, match="n=0"):
        stack_and_merge_n_first_dims([jnp.zeros(2)], 0)


def test_dict_to_tuple_and_back():
    xa, ya, xb, yb = (jnp.full((2,), v) for v in (1.0, 2.0, 3.0, 4.0))
    d = {"a": Exp(xa, ya), "b": Exp(xb, yb)}
    t = dict_to_tuple(d)
    assert type(t) is Exp
    assert list(t.obs.keys()) == ["a", "b"]
    np.testing.assert_array_equal(t.obs["b"], xb)
    np.testing.assert_array_equal(t.reward["a"], ya)
    back = tuple_to_dict(t)
    assert list(back.keys()) == ["a", "b"]
    assert type(back["a"]) is Exp
    np.testing.assert_array_equal(back["b"].reward, yb)
    np.testing.assert_array_equal(back["a"].obs, xa)


def test_dict_to_tuple_plain_tuples():
    t = dict_to_tuple({"b": (1, 2), "a": (3, 4)})
    assert type(t) is tuple
    assert t == ({"b": 1, "a": 3}, {"b": 2, "a": 4})
    assert tuple_to_dict(t) == {"b": (1, 2), "a": (3, 4)}


def test_tuple_to_dict_keeps_first_field_order():
    t = Exp(obs={"z": 1, "a": 2}, reward={"a": 3, "z": 4})
    out = tuple_to_dict(t)
    assert list(out.keys()) == ["z", "a"]
    assert out["a"] == Exp(2, 3)


def test_tuple_to_dict_rejects_mismatched_keys():
    with pytest.raises(ValueError, match="different agent keys"):
        tuple_to_dict(Exp(obs={"a": 1, "b": 2}, reward={"a": 3, "c": 4}))


def test_dict_to_tuple_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="'b'"):
        dict_to_tuple({"a": (1, 2), "b": (1, 2, 3)})


# ---------------------------------------------------------------------------------------------
# Pipeline: single
# ---------------------------------------------------------------------------------------------


@JIT
def test_single_pipe(jit):
    pipe = ExperiencePipeline([scale_transform], vectorized=False, parallel=False)
    exp = make_exp((T,))
    out = maybe_jit(pipe, jit)(STATE, KEY, exp)
    assert isinstance(out, Out)
    assert out.value.shape == (T, D) and out.noise.shape == (T,)
    np.testing.assert_allclose(out.value, expected_value(exp))
    # The single transform gets split(key, 1)[0].
    np.testing.assert_allclose(out.noise, jax.random.uniform(jax.random.split(KEY, 1)[0], (T,)))


@JIT
def test_single_pipe_two_transforms(jit):
    pipe = ExperiencePipeline([scale_transform, drop_last_transform], vectorized=False, parallel=False)
    exp = make_exp((T,))
    out = maybe_jit(pipe, jit)(STATE, KEY, exp)
    assert type(out) is tuple and len(out) == 2
    v = expected_value(exp)
    np.testing.assert_allclose(out[0], v[:-1] + 1.0)
    np.testing.assert_allclose(out[1], v[1:, 0] - v[:-1, 0])


def test_single_pipe_no_transform_returns_input():
    exp = make_exp((T,))
    assert ExperiencePipeline([], vectorized=False).run(STATE, KEY, exp) is exp


def test_single_pipe_splits_key_per_transform():
    def noise(state, key, exp):
        return (jax.random.uniform(key, (T,)),)

    def add_noise(state, key, exp):
        return (exp[0], jax.random.uniform(key, (T,)))

    out = ExperiencePipeline([noise, add_noise], vectorized=False).run_single_pipe(STATE, KEY, make_exp((T,)))
    k0, k1 = jax.random.split(KEY, 2)
    np.testing.assert_allclose(out[0], jax.random.uniform(k0, (T,)))
    np.testing.assert_allclose(out[1], jax.random.uniform(k1, (T,)))


# ---------------------------------------------------------------------------------------------
# Pipeline: vectorized
# ---------------------------------------------------------------------------------------------


@JIT
def test_vectorized(jit):
    pipe = ExperiencePipeline([scale_transform], vectorized=True, parallel=False)
    exp = make_exp((T, E))
    out = maybe_jit(pipe, jit)(STATE, KEY, exp)
    assert out.value.shape == (T * E, D) and out.noise.shape == (T * E,)
    v = expected_value(exp)  # (T, E, D)
    np.testing.assert_allclose(out.value, v.reshape(T * E, D))
    np.testing.assert_allclose(out.value[2 * E + 1], v[2, 1])  # row t * E + e
    # One key per env: the noise differs across envs.
    noise = np.asarray(out.noise).reshape(T, E)
    assert not np.allclose(noise[:, 0], noise[:, 1])
    env_keys = jax.random.split(KEY, E)
    expected_noise = np.stack([jax.random.uniform(jax.random.split(env_keys[e], 1)[0], (T,)) for e in range(E)], axis=1)
    np.testing.assert_allclose(noise, expected_noise)


@JIT
def test_vectorized_two_transforms(jit):
    pipe = ExperiencePipeline([scale_transform, drop_last_transform], vectorized=True)
    exp = make_exp((T, E))
    out = maybe_jit(pipe, jit)(STATE, KEY, exp)
    v = expected_value(exp)  # (T, E, D)
    assert out[0].shape == ((T - 1) * E, D) and out[1].shape == ((T - 1) * E,)
    np.testing.assert_allclose(out[0], (v[:-1] + 1.0).reshape((T - 1) * E, D))
    np.testing.assert_allclose(out[1], (v[1:, :, 0] - v[:-1, :, 0]).reshape(-1))


@JIT
def test_vectorized_no_transform_merges(jit):
    exp = make_exp((T, E))
    out = maybe_jit(ExperiencePipeline([], vectorized=True), jit)(STATE, KEY, exp)
    assert isinstance(out, Exp)
    np.testing.assert_array_equal(out.obs, exp.obs.reshape(T * E, D))
    np.testing.assert_array_equal(out.reward, exp.reward.reshape(T * E))


def test_vectorized_legacy_uint32_key():
    """A legacy ``uint32[2]`` key was checked for the output's shape only: one key broadcast to
    every environment passed. Now the noise differs across environments and is that of the split
    keys, computed by hand as in ``test_vectorized``."""
    key = jax.random.PRNGKey(1)
    pipe = ExperiencePipeline([scale_transform], vectorized=True)
    out = pipe.run(STATE, key, make_exp((T, E)))
    assert out.noise.shape == (T * E,)
    noise = np.asarray(out.noise).reshape(T, E)
    assert not np.allclose(noise[:, 0], noise[:, 1]) and not np.allclose(noise[:, 1], noise[:, 2])
    env_keys = jax.random.split(key, E)  # (E, 2) uint32
    expected_noise = np.stack([jax.random.uniform(jax.random.split(env_keys[e], 1)[0], (T,)) for e in range(E)], axis=1)
    np.testing.assert_allclose(noise, expected_noise)


# ---------------------------------------------------------------------------------------------
# Pipeline: parallel
# ---------------------------------------------------------------------------------------------


def parallel_exp(shape_prefix, agents=("a0", "a1", "a2")):
    per_agent = {agent: make_exp(shape_prefix, offset=1000.0 * i) for i, agent in enumerate(agents)}
    return per_agent, dict_to_tuple(per_agent)


@JIT
def test_parallel(jit):
    pipe = ExperiencePipeline([scale_transform], vectorized=False, parallel=True)
    per_agent, exp = parallel_exp((T,))
    n_agents = len(per_agent)
    out = maybe_jit(pipe, jit)(STATE, KEY, exp)
    assert isinstance(out, Out)
    assert out.value.shape == (T * n_agents, D) and out.noise.shape == (T * n_agents,)
    expected = stack_and_merge_n_first_dims([jnp.asarray(expected_value(e)) for e in per_agent.values()], 2)
    np.testing.assert_allclose(out.value, expected)
    np.testing.assert_allclose(out.value[2 * n_agents + 1], expected_value(per_agent["a1"])[2])
    # One key per agent.
    noise = np.asarray(out.noise).reshape(T, n_agents)
    assert not np.allclose(noise[:, 0], noise[:, 1])
    agent_keys = jax.random.split(KEY, n_agents)
    np.testing.assert_allclose(noise[:, 2], jax.random.uniform(jax.random.split(agent_keys[2], 1)[0], (T,)))


@JIT
def test_parallel_two_transforms(jit):
    pipe = ExperiencePipeline([scale_transform, drop_last_transform], vectorized=False, parallel=True)
    per_agent, exp = parallel_exp((T,))
    out = maybe_jit(pipe, jit)(STATE, KEY, exp)
    vs = [expected_value(e) for e in per_agent.values()]
    np.testing.assert_allclose(out[0], stack_and_merge_n_first_dims([jnp.asarray(v[:-1] + 1.0) for v in vs]))
    np.testing.assert_allclose(out[1], stack_and_merge_n_first_dims([jnp.asarray(v[1:, 0] - v[:-1, 0]) for v in vs]))


@JIT
def test_parallel_no_transform_merges(jit):
    per_agent, exp = parallel_exp((T,))
    out = maybe_jit(ExperiencePipeline([], vectorized=False, parallel=True), jit)(STATE, KEY, exp)
    np.testing.assert_array_equal(out.obs, stack_and_merge_n_first_dims([e.obs for e in per_agent.values()]))
    np.testing.assert_array_equal(out.reward, stack_and_merge_n_first_dims([e.reward for e in per_agent.values()]))


def test_parallel_rejects_different_shapes():
    exp = dict_to_tuple({"a0": make_exp((T,)), "a1": make_exp((T + 1,))})
    pipe = ExperiencePipeline([scale_transform], vectorized=False, parallel=True)
    with pytest.raises(ValueError, match=r"'a0' has shapes .*'a1' has shapes"):
        pipe.run(STATE, KEY, exp)


def test_parallel_rejects_mismatched_agent_keys():
    exp = Exp(obs={"a0": jnp.zeros((T, D)), "a1": jnp.zeros((T, D))}, reward={"a0": jnp.zeros(T)})
    pipe = ExperiencePipeline([scale_transform], vectorized=False, parallel=True)
    with pytest.raises(ValueError, match="different agent keys"):
        pipe.run(STATE, KEY, exp)


# ---------------------------------------------------------------------------------------------
# Pipeline: parallel and vectorized
# ---------------------------------------------------------------------------------------------


@JIT
def test_parallel_vectorized(jit):
    pipe = ExperiencePipeline([scale_transform], vectorized=True, parallel=True)
    per_agent, exp = parallel_exp((T, E))
    n_agents = len(per_agent)
    out = maybe_jit(pipe, jit)(STATE, KEY, exp)
    assert out.value.shape == (T * E * n_agents, D) and out.noise.shape == (T * E * n_agents,)
    # Order (T', A, E), as documented and as stack_and_merge_n_first_dims(..., n=3) lays it out:
    # row (t * A + a) * E + e.
    v = np.stack([expected_value(e) for e in per_agent.values()], axis=1)  # (T, A, E, D)
    np.testing.assert_allclose(out.value, v.reshape(T * n_agents * E, D))
    np.testing.assert_allclose(out.value[(3 * n_agents + 1) * E + 2], expected_value(per_agent["a1"])[3, 2])
    stacked = stack_and_merge_n_first_dims([expected_value(e) for e in per_agent.values()], 3)
    np.testing.assert_allclose(out.value, stacked)
    # Reshaping back to (T, A, E, ...) gives each agent's rows in each environment.
    for a, agent in enumerate(per_agent):
        np.testing.assert_allclose(
            np.asarray(out.value).reshape(T, n_agents, E, D)[:, a], expected_value(per_agent[agent])
        )
    # One key per agent and env: all (a, e) noise columns differ.
    noise = np.asarray(out.noise).reshape(T, n_agents * E)
    for i in range(E * n_agents):
        for j in range(i + 1, E * n_agents):
            assert not np.allclose(noise[:, i], noise[:, j])
    keys = jax.random.split(KEY, (n_agents, E))
    np.testing.assert_allclose(
        np.asarray(out.noise).reshape(T, n_agents, E)[:, 2, 1],
        jax.random.uniform(jax.random.split(keys[2, 1], 1)[0], (T,)),
    )


@JIT
def test_parallel_vectorized_two_transforms(jit):
    pipe = ExperiencePipeline([scale_transform, drop_last_transform], vectorized=True, parallel=True)
    per_agent, exp = parallel_exp((T, E), agents=("x", "y"))
    out = maybe_jit(pipe, jit)(STATE, KEY, exp)
    v = np.stack([expected_value(e) for e in per_agent.values()], axis=1)  # (T, A, E, D)
    assert out[0].shape == ((T - 1) * E * 2, D)
    np.testing.assert_allclose(out[0], (v[:-1] + 1.0).reshape(-1, D))
    np.testing.assert_allclose(out[1], (v[1:, ..., 0] - v[:-1, ..., 0]).reshape(-1))


@JIT
def test_parallel_vectorized_no_transform_merges(jit):
    per_agent, exp = parallel_exp((T, E))
    out = maybe_jit(ExperiencePipeline([], vectorized=True, parallel=True), jit)(STATE, KEY, exp)
    obs = np.stack([np.asarray(e.obs) for e in per_agent.values()], axis=1)  # (T, A, E, D)
    np.testing.assert_array_equal(out.obs, obs.reshape(-1, D))


def test_parallel_vectorized_rejects_different_shapes():
    exp = dict_to_tuple({"a0": make_exp((T, E)), "a1": make_exp((T, E + 1))})
    pipe = ExperiencePipeline([scale_transform], vectorized=True, parallel=True)
    with pytest.raises(ValueError, match=r"'a0' has shapes .*'a1' has shapes"):
        jax.jit(lambda s, k, e: pipe.run(s, k, e))(STATE, KEY, exp)


def test_pipeline_dispatch():
    calls = []

    class Spy(ExperiencePipeline):
        def run_single_pipe(self, *a):
            calls.append("single")
            return super().run_single_pipe(*a)

        def run_vectorized(self, *a):
            calls.append("vectorized")
            return super().run_vectorized(*a)

        def run_parallel(self, *a):
            calls.append("parallel")
            return super().run_parallel(*a)

        def run_parallel_vectorized(self, *a):
            calls.append("parallel_vectorized")
            return super().run_parallel_vectorized(*a)

    Spy([], vectorized=False, parallel=False).run(STATE, KEY, make_exp((T,)))
    Spy([], vectorized=True, parallel=False).run(STATE, KEY, make_exp((T, E)))
    Spy([], vectorized=False, parallel=True).run(STATE, KEY, parallel_exp((T,))[1])
    Spy([], vectorized=True, parallel=True).run(STATE, KEY, parallel_exp((T, E))[1])
    assert [c for c in calls if c != "single"] == ["vectorized", "parallel", "parallel_vectorized"]
    assert calls[0] == "single"


def test_pipeline_defaults():
    pipe = ExperiencePipeline([scale_transform])
    assert pipe.vectorized is True and pipe.parallel is False
