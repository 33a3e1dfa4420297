"""The stateless functional agents of seed 002 (``kitae.functional``).

One implementation, two faces: the functional DQN's ``update`` gives the collection DQN's new
parameters bit for bit on the same parameters and batch. Pure: ``jit()`` changes no result, 8
agents in one ``vmap`` call equal 8 calls, the same inputs give the same outputs. Networks from
Haiku and Flax; every rejected input raises an error that names it.
"""

from __future__ import annotations

import re

import flax.linen as nn
import gymnasium as gym
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import kitae.config as cfg
from kitae.algos.collections import dqn as collection
from kitae.buffer import Experience
from kitae.functional import DQN, BaseAgent, OptimState
from kitae.functional.base import as_key
from kitae.functional.dqn import Params, PolicyState
from kitae.modules.qvalue import qvalue_factory

ENV = gym.make("CartPole-v1")
OBS_SPACE, ACTION_SPACE = ENV.observation_space, ENV.action_space


def haiku_network(action_space):
    return hk.transform(lambda x: hk.nets.MLP([32, int(action_space.n)])(x))


class FlaxQ(nn.Module):
    n: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.n)(nn.relu(nn.Dense(32)(x)))


def flax_network(action_space):
    return FlaxQ(int(action_space.n))


def batch(key, n=16):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    return {
        "obs": jax.random.normal(k1, (n, 4)),
        "action": jax.random.randint(k2, (n,), 0, 2),
        "reward": jax.random.normal(k3, (n,)),
        "terminated": jax.random.bernoulli(k4, 0.2, (n,)),
        "next_obs": jax.random.normal(k4, (n, 4)),
    }


def same(a, b):
    return all(
        bool(jnp.array_equal(x, y))
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    )


def as_experience(data):
    """A functional agent's ``data`` as the collection's ``Experience`` (what its executors store)."""
    return Experience(
        observation=data["obs"],
        action=data["action"],
        reward=data["reward"],
        done=data["terminated"],
        next_observation=data["next_obs"],
        log_prob=data.get("log_prob"),
        truncated=data.get("truncated"),
    )


def fresh(agent, seed=0):
    params = agent.init_params(jax.random.PRNGKey(seed))
    return params, agent.init_policy(jax.random.PRNGKey(1)), agent.init_optimizer(params, jax.random.PRNGKey(2))


# ---- one implementation ----------------------------------------------------------------------


@pytest.mark.parametrize(("double", "count"), [(False, 0), (True, 49)], ids=["dqn", "double-dqn-at-target-copy"])
def test_the_functional_update_gives_the_collection_updates_bits(double, count):
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=collection.DQNParams(gamma=0.97, target_update_interval=50, double_dqn=double, hidden=(32,)),
        update_cfg=cfg.UpdateConfig(learning_rate=1e-2, max_grad_norm=1.0),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig("CartPole-v1", OBS_SPACE, ACTION_SPACE),
    )
    state = collection.train_state_dqn_factory(jax.random.PRNGKey(0), config)
    # a target that differs from the online network, and a step count where the copy is (not) due
    qvalue = state.qvalue.replace(
        step=jnp.asarray(count, jnp.int32),
        target_params=jax.tree_util.tree_map(lambda p: p * 0.5 + 0.1, state.qvalue.params),
    )
    state = state.replace(qvalue=qvalue)
    data = batch(jax.random.PRNGKey(3))
    experience = as_experience(data)
    key = jax.random.PRNGKey(4)
    process, update_step = collection.process_experience_factory(config), collection.update_step_factory(config)
    want, _ = jax.jit(lambda s, k, e: update_step(s, k, process(s, k, e)))(state, key, experience)

    def network(action_space):
        return qvalue_factory(OBS_SPACE, action_space, hidden=(32,), activation="relu")

    agent = DQN(
        network, ENV, 1e-2, discount_factor=0.97, target_update_interval=50, double_dqn=double, max_grad_norm=1.0
    )
    output, params, optimizer_state = agent.update(
        Params(qvalue.params, qvalue.target_params), OptimState(qvalue.step, qvalue.opt_state), data
    )
    assert same(params.policy, want.qvalue.params)
    assert same(params.target, want.qvalue.target_params)
    assert same(optimizer_state.opt_state, want.qvalue.opt_state)
    assert int(optimizer_state.count) == count + 1
    # the copy is due exactly when count + 1 is a multiple of the interval
    assert same(params.target, params.policy) == (count + 1 == 50)
    assert np.isfinite(float(output.loss))


# ---- the seed's DQN --------------------------------------------------------------------------


def test_the_epsilon_schedule_counts_the_policy_state():
    agent = DQN(haiku_network, ENV, 1e-3)  # seed 002's default: 0.9 -> 0.05 over 50,000 steps
    params, _, _ = fresh(agent)
    obs = jnp.zeros((3, 4))
    output, policy_state = agent.predict(params, PolicyState(jnp.int32(25_000)), obs, jax.random.PRNGKey(0))
    np.testing.assert_allclose(float(output.epsilon), 0.9 - 0.85 * 0.5, rtol=1e-6)  # 0.475, by hand
    assert int(policy_state.count) == 25_001
    assert output.actions.shape == (3,) and output.q_values.shape == (3, 2)
    output, after = agent.predict(params, PolicyState(jnp.int32(60_000)), obs, jax.random.PRNGKey(0))
    np.testing.assert_allclose(float(output.epsilon), 0.05, rtol=1e-6)
    greedy, unchanged = agent.predict(params, after, obs, jax.random.PRNGKey(0), evaluation=True)
    assert float(greedy.epsilon) == 0.0 and int(unchanged.count) == int(after.count)
    assert np.array_equal(greedy.actions, jnp.argmax(greedy.q_values, axis=-1))


def test_the_target_is_copied_every_target_update_interval_gradient_steps():
    agent = DQN(flax_network, ENV, 1e-2, target_update_interval=3)
    params, _, optimizer_state = fresh(agent)
    initial = params.target
    data = batch(jax.random.PRNGKey(5))
    for expected_copy in (False, False, True):
        _, params, optimizer_state = agent.update(params, optimizer_state, data)
        assert same(params.target, params.policy) == expected_copy
        if not expected_copy:
            assert same(params.target, initial)
    assert int(optimizer_state.count) == 3


@pytest.mark.parametrize("network", [haiku_network, flax_network], ids=["haiku", "flax"])
def test_haiku_and_flax_networks_give_agents_that_learn_a_fixed_batch(network):
    agent = DQN(network, ENV, 1e-2, discount_factor=0.0)  # targets = rewards: a regression
    params, policy_state, optimizer_state = fresh(agent)
    data = batch(jax.random.PRNGKey(6))
    first, params, optimizer_state = agent.update(params, optimizer_state, data)
    for _ in range(200):
        last, params, optimizer_state = agent.update(params, optimizer_state, data)
    assert float(last.loss) < 0.5 * float(first.loss)
    output, _ = agent.predict(params, policy_state, data["obs"], jax.random.PRNGKey(0), evaluation=True)
    assert output.actions.shape == (16,) and output.actions.dtype == jnp.int32


def test_a_haiku_prng_sequence_is_accepted_as_rng():
    agent = DQN(haiku_network, ENV, 1e-3)
    sequence, keys = hk.PRNGSequence(7), hk.PRNGSequence(7)
    assert same(agent.init_params(sequence), agent.init_params(next(keys)))
    params = agent.init_params(jax.random.PRNGKey(0))
    a, _ = agent.predict(params, agent.init_policy(None), jnp.ones((2, 4)), hk.PRNGSequence(1))
    b, _ = agent.predict(params, agent.init_policy(None), jnp.ones((2, 4)), next(hk.PRNGSequence(1)))
    assert same(a, b)


def test_what_is_not_a_prng_key_is_refused_as_rng():
    """A float array of two numbers was taken as a raw key (any array whose last axis is 2)."""
    assert as_key(jax.random.PRNGKey(3)).shape == (2,) and as_key(jax.random.key(3)).shape == ()
    for rng in (jnp.array([1.0, 2.0]), jnp.zeros(3, jnp.uint32), 7):
        with pytest.raises(TypeError, match=r"allowed: a JAX PRNG key or a haiku.PRNGSequence"):
            as_key(rng)


# ---- pure ------------------------------------------------------------------------------------


def test_jit_changes_no_result_and_is_safe_twice():
    """``plain`` and ``jitted`` run one compiled program, so equal results held for a ``jit()`` that
    did nothing. Now: ``jit()`` puts the compiled ``predict`` and ``update`` (``jitted_methods``'s)
    on the instance in place of the class's methods and marks it jitted; a second ``jit()`` keeps
    those same functions; and the results are unchanged."""
    plain, jitted = DQN(haiku_network, ENV, 1e-3), DQN(haiku_network, ENV, 1e-3)
    assert jitted.__dict__["_jitted"] is False and not {"predict", "update"} & set(jitted.__dict__)
    jitted.jit()
    assert jitted.__dict__["_jitted"] is True
    predict, update = jitted.__dict__["predict"], jitted.__dict__["update"]
    for fn, name in ((predict, "predict"), (update, "update")):
        assert fn.__qualname__ == f"CollectionAgent.jitted_methods.<locals>.{name}"
    assert jitted.predict is predict and jitted.update is update  # not the class's bound methods
    assert plain.predict.__func__ is DQN.predict and "predict" not in plain.__dict__
    jitted.jit()
    assert jitted.predict is predict and jitted.update is update  # the second call changes nothing
    data, key = batch(jax.random.PRNGKey(8)), jax.random.PRNGKey(9)
    results = []
    for agent in (plain, jitted):
        params, policy_state, optimizer_state = fresh(agent)
        out = agent.predict(params, policy_state, data["obs"], key, evaluation=False)
        for _ in range(3):
            _, params, optimizer_state = agent.update(params, optimizer_state, data)
        results.append((out, params, optimizer_state))
    assert same(results[0], results[1])


def test_the_same_inputs_give_the_same_outputs():
    agent = DQN(flax_network, ENV, 1e-3)
    params, policy_state, optimizer_state = fresh(agent)
    data, key = batch(jax.random.PRNGKey(10)), jax.random.PRNGKey(11)
    assert same(
        agent.predict(params, policy_state, data["obs"], key), agent.predict(params, policy_state, data["obs"], key)
    )
    assert same(agent.update(params, optimizer_state, data), agent.update(params, optimizer_state, data))
    assert not same(agent.init_params(jax.random.PRNGKey(0)), agent.init_params(jax.random.PRNGKey(1)))


def test_eight_agents_in_one_vmap_call_equal_eight_calls():
    agent = DQN(haiku_network, ENV, 1e-3)
    keys = jax.random.split(jax.random.PRNGKey(12), 8)
    data = jax.vmap(batch)(jax.random.split(jax.random.PRNGKey(13), 8))
    params = jax.vmap(agent.init_params)(keys)
    optimizer_state = jax.vmap(agent.init_optimizer)(params, keys)
    _, new_params, new_optimizer_state = jax.jit(jax.vmap(agent.update))(params, optimizer_state, data)
    for i in range(8):
        one_params = agent.init_params(keys[i])
        assert same(one_params, jax.tree_util.tree_map(lambda x, i=i: x[i], params))
        one_data = jax.tree_util.tree_map(lambda x, i=i: x[i], data)
        _, p, o = agent.update(one_params, agent.init_optimizer(one_params, keys[i]), one_data)
        for got, want in zip(
            jax.tree_util.tree_leaves((new_params, new_optimizer_state)), jax.tree_util.tree_leaves((p, o)), strict=True
        ):
            # equal up to float rounding: a batched matmul may sum in another order (1e-10 here)
            np.testing.assert_allclose(np.asarray(got[i]), np.asarray(want), rtol=1e-6, atol=1e-8)


# ---- rejected inputs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: DQN("mlp", ENV, 1e-3), TypeError, r"network='mlp' is not allowed; allowed: a callable"),
        (
            lambda: DQN(nn.Dense(2), ENV, 1e-3),
            TypeError,
            r"network=Dense\(\.\.\.\), a Flax module, is not allowed; allowed: a callable network\(action_space\)"
            r".*lambda action_space: module",
        ),
        (
            lambda: DQN(haiku_network(ACTION_SPACE), ENV, 1e-3),
            TypeError,
            r"network=Transformed\(.*is not allowed; allowed: a callable network\(action_space\)",
        ),
        (
            lambda: DQN(lambda space: object(), ENV, 1e-3),
            TypeError,
            r"returned object.*allowed: a Haiku hk.Transformed",
        ),
        (
            lambda: DQN(lambda space: hk.transform_with_state(lambda x: x), ENV, 1e-3),
            TypeError,
            r"returned TransformedWithState",
        ),
        (
            lambda: DQN(haiku_network, gym.make("Pendulum-v1"), 1e-3),
            ValueError,
            r"action_space=Box.*not allowed for DQN",
        ),
        (lambda: DQN(haiku_network, ENV, 0.0), ValueError, r"learning_rate=0.0 is not allowed"),
        (lambda: DQN(haiku_network, ENV, -1e-3), ValueError, r"learning_rate=-0.001 is not allowed"),
        (lambda: DQN(haiku_network, ENV, "1e-3"), TypeError, r"learning_rate='1e-3' has type str; allowed: a float"),
        (lambda: DQN(haiku_network, ENV, True), TypeError, r"learning_rate=True has type bool"),
        (lambda: DQN(haiku_network, "CartPole-v1", 1e-3), TypeError, r"env='CartPole-v1' is not allowed"),
        (lambda: DQN(haiku_network, ENV, 1e-3, discount_factor=1.5), ValueError, r"gamma"),
        (lambda: DQN(haiku_network, ENV, 1e-3, target_update_interval=0), ValueError, r"target_update_interval"),
        (lambda: DQN(haiku_network, ENV, 1e-3, epsilon_schedule=0.1), ValueError, r"epsilon_schedule=0.1"),
    ],
    ids=[
        "network-not-callable",
        "flax-module-not-creator",
        "haiku-transformed-not-creator",
        "creator-returns-other",
        "haiku-with-state",
        "box-actions",
        "zero-lr",
        "negative-lr",
        "string-lr",
        "bool-lr",
        "env-without-spaces",
        "discount",
        "target-interval",
        "epsilon-not-callable",
    ],
)
def test_rejected_inputs_name_what_is_wrong(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_a_learning_rate_schedule_is_accepted():
    agent = DQN(haiku_network, ENV, optax.linear_schedule(1e-3, 0.0, 10))
    params, _, optimizer_state = fresh(agent)
    _, new, _ = agent.update(params, optimizer_state, batch(jax.random.PRNGKey(0)))
    assert not same(new.policy, params.policy)


def test_update_names_missing_data_keys_and_bad_rng():
    agent = DQN(haiku_network, ENV, 1e-3)
    params, _, optimizer_state = fresh(agent)
    data = batch(jax.random.PRNGKey(0))
    del data["next_obs"]
    with pytest.raises(KeyError, match=r"lacks \['next_obs'\]"):
        agent.update(params, optimizer_state, data)
    with pytest.raises(TypeError, match="rng=3 is not allowed"):
        agent.init_params(3)


@pytest.mark.parametrize("jitted", [False, True])
@pytest.mark.parametrize("key,shape", [("action", (16, 1)), ("reward", (16, 1)), ("terminated", (15,))])
def test_update_names_data_of_another_shape(jitted, key, shape):
    """An ``action`` of shape ``(B, 1)`` for a ``Discrete`` space failed inside JAX's
    ``take_along_axis`` ("indices and arr must have the same number of dimensions")."""
    agent = DQN(haiku_network, ENV, 1e-3)
    if jitted:
        agent.jit()
    params, _, optimizer_state = fresh(agent)
    data = batch(jax.random.PRNGKey(0))
    data[key] = jnp.zeros(shape, data[key].dtype)
    expected = f"data[{key!r}] has shape {shape}, which is not allowed; required: (16,)"
    with pytest.raises(ValueError, match=re.escape(expected)):
        agent.update(params, optimizer_state, data)


@pytest.mark.parametrize("jitted", [False, True])
def test_predict_names_observations_of_another_shape(jitted):
    """Checked while tracing, so before and after ``jit()``: not Haiku's "'mlp/~/linear_0/w' with
    retrieved shape (4, 64) does not match shape=[3, 64]" from inside the user's network."""
    agent = DQN(haiku_network, ENV, 1e-3)
    if jitted:
        agent.jit()
    params, policy_state, _ = fresh(agent)
    key = jax.random.PRNGKey(0)
    assert agent.predict(params, policy_state, jnp.ones((2, 4)), key)[0].actions.shape == (2,)
    assert agent.predict(params, policy_state, jnp.ones(4), key)[0].actions.shape == ()
    message = r"does not fit the environment's observation space.*shape \(2, 3\) where \(4,\)"
    with pytest.raises(ValueError, match=message):
        agent.predict(params, policy_state, jnp.ones((2, 3)), key)


# ---- PPO ---------------------------------------------------------------------------------------


def ppo_network(action_space):
    def f(x):
        if isinstance(action_space, gym.spaces.Discrete):
            policy = hk.nets.MLP([32, int(action_space.n)])(x)
        else:
            policy = (
                hk.nets.MLP([32, action_space.shape[0]])(x),
                hk.get_parameter("log_std", (action_space.shape[0],), init=jnp.zeros),
            )
        return policy, hk.nets.MLP([32, 1])(x)

    return hk.without_apply_rng(hk.transform(f))


def rollout(env, key, t=8, e=4):
    obs_dim = env.observation_space.shape[0]
    keys = jax.random.split(key, 6)
    if isinstance(env.action_space, gym.spaces.Discrete):
        action = jax.random.randint(keys[1], (t, e), 0, int(env.action_space.n))
    else:
        action = jax.random.uniform(keys[1], (t, e, env.action_space.shape[0]), minval=-2.0, maxval=2.0)
    return {
        "obs": jax.random.normal(keys[0], (t, e, obs_dim)),
        "action": action,
        "log_prob": -jax.random.uniform(keys[2], (t, e)),
        "reward": jax.random.normal(keys[3], (t, e)),
        "terminated": jax.random.bernoulli(keys[4], 0.1, (t, e)),
        "truncated": jax.random.bernoulli(keys[5], 0.05, (t, e)),
        "next_obs": jax.random.normal(keys[5], (t, e, obs_dim)),
    }


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_the_functional_ppo_update_gives_the_collection_agents_bits(tmp_path, env_id):
    from kitae.algos.collections import ppo
    from kitae.functional import PPO

    env = gym.make(env_id)
    config = cfg.AlgoConfig(
        seed=3,
        algo_params=ppo.PPOParams(hidden_sizes=(32,)),
        update_cfg=cfg.UpdateConfig(learning_rate=1e-3, n_epochs=2, batch_size=16, max_grad_norm=0.5),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig(env_id, env.observation_space, env.action_space, n_envs=4),
    )
    agent = ppo.PPO("functional-check", config, run_dir=str(tmp_path))
    state = agent.state
    data = rollout(env, jax.random.PRNGKey(4))
    key = jax.random.fold_in(jax.random.PRNGKey(0), 0)  # the functional default at count 0
    experience = as_experience(data)
    want, _ = jax.jit(agent.update_fn)(state, key, experience)

    functional = PPO(
        lambda space: ppo._actor_critic_module(config, None), env, 1e-3, n_epochs=2, batch_size=16, max_grad_norm=0.5
    )
    ac = state.actor_critic
    _, params, optimizer_state = functional.update(
        functional.Params(ac.params), OptimState(ac.step, ac.opt_state), data
    )
    assert same(params.network, want.actor_critic.params)
    assert same(optimizer_state.opt_state, want.actor_critic.opt_state)
    assert int(optimizer_state.count) == 2 * (8 * 4 // 16)  # epochs x minibatches


@pytest.mark.parametrize("env_id", ["CartPole-v1"])  # Box actions: the bit-equality test above
def test_functional_ppo_acts_and_updates_purely_under_jit_and_vmap(env_id):
    from kitae.functional import PPO

    env = gym.make(env_id)
    plain, jitted = PPO(ppo_network, env, 1e-3, batch_size=16), PPO(ppo_network, env, 1e-3, batch_size=16)
    jitted.jit()
    data = rollout(env, jax.random.PRNGKey(5))
    results = []
    for agent in (plain, jitted):
        params, policy_state, optimizer_state = fresh(agent)
        out, _ = agent.predict(params, policy_state, data["obs"][0], jax.random.PRNGKey(6))
        _, params, optimizer_state = agent.update(params, optimizer_state, data)
        results.append((out, params, optimizer_state))
    assert same(results[0], results[1])
    out = results[0][0]
    assert out.log_probs.shape == (4,) and out.actions.shape[0] == 4
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    params = jax.vmap(plain.init_params)(keys)
    optimizer_state = jax.vmap(plain.init_optimizer)(params, keys)
    data3 = jax.tree_util.tree_map(lambda x: jnp.stack([x] * 3), data)
    _, vmapped, _ = jax.vmap(plain.update)(params, optimizer_state, data3)
    one = plain.init_params(keys[1])
    _, alone, _ = plain.update(one, plain.init_optimizer(one, keys[1]), data)
    for got, want in zip(jax.tree_util.tree_leaves(vmapped), jax.tree_util.tree_leaves(alone), strict=True):
        np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_functional_ppo_refuses_what_it_cannot_handle():
    from kitae.functional import PPO

    with pytest.raises(
        ValueError,
        match=r"action_space=MultiBinary\(\(2, 2\)\) is not allowed for PPO; allowed: Discrete, a 1-D MultiDiscrete",
    ):
        PPO(ppo_network, _Spaces(gym.spaces.Box(-1, 1, (3,)), gym.spaces.MultiBinary([2, 2])), 1e-3)
    with pytest.raises(ValueError, match="batch_size=0 is not allowed"):
        PPO(ppo_network, ENV, 1e-3, batch_size=0)
    with pytest.raises(ValueError, match="clip_coef"):
        PPO(ppo_network, ENV, 1e-3, clip_coef=-0.1)
    agent = PPO(lambda space: hk.without_apply_rng(hk.transform(lambda x: hk.Linear(2)(x))), ENV, 1e-3)
    with pytest.raises(TypeError, match=r"must return \(policy, value\); it returned an array of shape \(7, 2\)"):
        agent.init_params(jax.random.PRNGKey(0))  # refused when the parameters are made, not at predict


class _Spaces:
    def __init__(self, observation_space, action_space):
        self.observation_space, self.action_space = observation_space, action_space


# ---- SAC and TD3 -------------------------------------------------------------------------------


def actor_critic_network(kind):
    def creator(space):
        d = space.shape[0]

        def actor(x):
            h = hk.nets.MLP([32], activate_final=True)(x)
            if kind == "sac":
                return hk.Linear(d)(h), jnp.clip(hk.Linear(d)(h), -5.0, 2.0)
            return jnp.tanh(hk.Linear(d)(h))

        def critic(x, a):
            return hk.nets.MLP([32, 1])(jnp.concatenate([x, a], -1))

        return hk.without_apply_rng(hk.transform(actor)), hk.without_apply_rng(hk.transform(critic))

    return creator


def off_policy_batch(key, n=16):
    keys = jax.random.split(key, 4)
    return {
        "obs": jax.random.normal(keys[0], (n, 3)),
        "action": jax.random.uniform(keys[1], (n, 1), minval=-2.0, maxval=2.0),
        "reward": jax.random.normal(keys[2], (n,)),
        "terminated": jax.random.bernoulli(keys[3], 0.1, (n,)),
        "next_obs": jax.random.normal(keys[3], (n, 3)),
    }


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_the_functional_sac_and_td3_updates_give_the_collections_bits(algo):
    from kitae.algos.collections import sac, td3
    from kitae.functional import SAC, TD3
    from kitae.modules.policy import policy_factory

    env = gym.make("Pendulum-v1")
    module = sac if algo == "sac" else td3
    params_cls = (
        sac.SACParams(policy_hidden=(32,), q_hidden=(32,))
        if algo == "sac"
        else td3.TD3Params(actor_hidden=(32,), critic_hidden=(32,), policy_delay=1)
    )
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=params_cls,
        update_cfg=cfg.UpdateConfig(learning_rate=3e-3, max_grad_norm=None),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig("Pendulum-v1", env.observation_space, env.action_space),
    )
    factory = sac.train_state_sac_factory if algo == "sac" else td3.train_state_td3_factory
    state = factory(jax.random.PRNGKey(1), config)
    data = off_policy_batch(jax.random.PRNGKey(2))
    experience = as_experience(data)
    process_key, step_key = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(0), 0))
    process, update_step = module.process_experience_factory(config), module.update_step_factory(config)
    # arguments, not closed-over constants: XLA folds constants and may round otherwise
    want, _ = jax.jit(lambda s, pk, sk, e: update_step(s, sk, process(s, pk, e)))(
        state, process_key, step_key, experience
    )

    def networks(space):  # the collection's own modules: the same parameters fit both faces
        kind = "tanh_normal" if algo == "sac" else "deterministic"
        actor = policy_factory(env.observation_space, space, hidden=(32,), kind=kind, activation="relu")
        return actor, qvalue_factory(env.observation_space, space, hidden=(32,), n_critics=2)

    if algo == "sac":
        agent = SAC(networks, env, 3e-3, n_critics=1)
        params = SAC.Params(state.policy.params, state.qvalue.params, state.qvalue.target_params, state.alpha.params)
        opt = {"policy": state.policy.opt_state, "qvalue": state.qvalue.opt_state, "alpha": state.alpha.opt_state}
        _, new, optimizer_state = agent.update(params, OptimState(state.qvalue.step, opt), data)
        assert same(new.policy, want.policy.params) and same(new.alpha, want.alpha.params)
        assert same(new.qvalue, want.qvalue.params) and same(new.qvalue_target, want.qvalue.target_params)
    else:
        agent = TD3(networks, env, 3e-3, policy_delay=1, critic_copies=1)
        params = TD3.Params(
            state.actor.params, state.critic.params, state.actor.target_params, state.critic.target_params
        )
        opt = {"actor": state.actor.opt_state, "critic": state.critic.opt_state}
        _, new, optimizer_state = agent.update(params, OptimState(state.critic.step, opt), data)
        assert same(new.actor, want.actor.params) and same(new.critic, want.critic.params)
        assert same(new.actor_target, want.actor.target_params) and same(new.critic_target, want.critic.target_params)
    assert int(optimizer_state.count) == 1


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_functional_sac_and_td3_are_pure_under_jit_and_vmap(algo):
    from kitae.functional import SAC, TD3

    env = gym.make("Pendulum-v1")
    cls = SAC if algo == "sac" else TD3
    plain, jitted = cls(actor_critic_network(algo), env, 1e-3), cls(actor_critic_network(algo), env, 1e-3)
    jitted.jit()
    jitted.jit()
    data = off_policy_batch(jax.random.PRNGKey(3))
    results = []
    for agent in (plain, jitted):
        params, policy_state, optimizer_state = fresh(agent)
        out, _ = agent.predict(params, policy_state, data["obs"], jax.random.PRNGKey(4))
        for _ in range(2):
            _, params, optimizer_state = agent.update(params, optimizer_state, data)
        results.append((out, params, optimizer_state))
    assert same(results[0], results[1])
    assert results[0][0].actions.shape == (16, 1)
    assert np.all(np.abs(np.asarray(results[0][0].actions)) <= 2.0)  # Pendulum's bounds
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    params = jax.vmap(plain.init_params)(keys)
    _, vmapped, _ = jax.vmap(plain.update)(
        params, jax.vmap(plain.init_optimizer)(params, keys), jax.vmap(off_policy_batch)(keys)
    )
    one = plain.init_params(keys[2])
    _, alone, _ = plain.update(one, plain.init_optimizer(one, keys[2]), off_policy_batch(keys[2]))
    for got, want in zip(jax.tree_util.tree_leaves(vmapped), jax.tree_util.tree_leaves(alone), strict=True):
        np.testing.assert_allclose(np.asarray(got[2]), np.asarray(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_functional_sac_and_td3_refuse_what_they_cannot_handle(algo):
    from kitae.functional import SAC, TD3

    cls = SAC if algo == "sac" else TD3
    refused = _Spaces(ENV.observation_space, gym.spaces.MultiDiscrete([2, 3])) if algo == "sac" else ENV
    name = type(refused.action_space).__name__  # SAC takes Discrete spaces: discrete SAC
    with pytest.raises(ValueError, match=f"action_space={name}.*not allowed for {algo.upper()}"):
        cls(actor_critic_network(algo), refused, 1e-3)
    with pytest.raises(TypeError, match=r"allowed: a pair \(actor, critic\)"):
        cls(haiku_network, gym.make("Pendulum-v1"), 1e-3)
    with pytest.raises(ValueError, match="learning_rate=0 is not allowed"):
        cls(actor_critic_network(algo), gym.make("Pendulum-v1"), 0)
    with pytest.raises(ValueError, match="tau"):
        cls(actor_critic_network(algo), gym.make("Pendulum-v1"), 1e-3, tau=0.0)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_the_functional_a2c_update_gives_the_collection_agents_bits(tmp_path, env_id):
    from kitae.algos.collections import a2c, ppo
    from kitae.functional import A2C

    env = gym.make(env_id)
    config = cfg.AlgoConfig(
        seed=3,
        algo_params=a2c.A2CParams(hidden_sizes=(32,), entropy_coef=0.01),
        update_cfg=cfg.UpdateConfig(learning_rate=1e-3, max_buffer_size=8, batch_size=32, n_epochs=1),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig(env_id, env.observation_space, env.action_space, n_envs=4),
    )
    agent = a2c.A2C("functional-check", config, run_dir=str(tmp_path))
    state, data = agent.state, rollout(env, jax.random.PRNGKey(4))
    experience = as_experience(data)
    want, _ = jax.jit(agent.update_fn)(state, jax.random.fold_in(jax.random.PRNGKey(0), 0), experience)
    functional = A2C(lambda space: ppo._actor_critic_module(config, None), env, 1e-3, entropy_coef=0.01)
    ac = state.actor_critic
    out, params, optimizer_state = functional.update(
        functional.Params(ac.params), OptimState(ac.step, ac.opt_state), data
    )
    assert same(params.network, want.actor_critic.params)
    assert same(optimizer_state.opt_state, want.actor_critic.opt_state)
    assert int(optimizer_state.count) == 1  # one gradient step on the whole rollout
    assert np.isfinite(float(out.loss))


def test_the_functional_ddpg_update_gives_the_collections_bits():
    from kitae.algos.collections import ddpg
    from kitae.functional import DDPG
    from kitae.modules.policy import policy_factory

    env = gym.make("Pendulum-v1")
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=ddpg.DDPGParams(actor_hidden=(32,), critic_hidden=(32,)),
        update_cfg=cfg.UpdateConfig(learning_rate=3e-3, max_grad_norm=None),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig("Pendulum-v1", env.observation_space, env.action_space),
    )
    state = ddpg.train_state_ddpg_factory(jax.random.PRNGKey(1), config)
    data = off_policy_batch(jax.random.PRNGKey(2))
    experience = as_experience(data)
    process_key, step_key = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(0), 0))
    process, update_step = ddpg.process_experience_factory(config), ddpg.update_step_factory(config)
    want, _ = jax.jit(lambda s, pk, sk, e: update_step(s, sk, process(s, pk, e)))(
        state, process_key, step_key, experience
    )

    def networks(space):  # the collection's modules: one critic giving (B,)
        actor = policy_factory(env.observation_space, space, hidden=(32,), kind="deterministic", activation="relu")
        return actor, qvalue_factory(env.observation_space, space, hidden=(32,), n_critics=1)

    agent = DDPG(networks, env, 3e-3)
    params = DDPG.Params(state.actor.params, state.critic.params, state.actor.target_params, state.critic.target_params)
    opt = {"actor": state.actor.opt_state, "critic": state.critic.opt_state}
    _, new, optimizer_state = agent.update(params, OptimState(state.critic.step, opt), data)
    assert same(new.actor, want.actor.params) and same(new.critic, want.critic.params)
    assert same(new.actor_target, want.actor.target_params) and same(new.critic_target, want.critic.target_params)
    out, _ = agent.predict(new, agent.init_policy(None), data["obs"], jax.random.PRNGKey(3))
    assert out.actions.shape == (16, 1) and np.all(np.abs(np.asarray(out.actions)) <= 2.0)


# ---- MPO ---------------------------------------------------------------------------------------


def mpo_networks(observation_space):
    """The collection's own MPO modules: the same parameters fit both faces."""
    from kitae.algos.collections.mpo import MPOPolicy
    from kitae.modules.encoders import encoder_factory

    def networks(space):
        actor = MPOPolicy(encoder_factory(observation_space, hidden=()), (32,), space.shape[0], 0.5, 1e-3)
        return actor, qvalue_factory(observation_space, space, hidden=(32,), n_critics=1)

    return networks


def test_the_functional_mpo_update_gives_the_collections_bits():
    from kitae.algos.collections import mpo
    from kitae.functional import MPO

    env = gym.make("Pendulum-v1")
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=mpo.MPOParams(actor_hidden=(32,), critic_hidden=(32,), n_action_samples=4),
        update_cfg=cfg.UpdateConfig(learning_rate=3e-3, max_grad_norm=None),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig("Pendulum-v1", env.observation_space, env.action_space),
    )
    state = mpo.train_state_mpo_factory(jax.random.PRNGKey(1), config)
    data = off_policy_batch(jax.random.PRNGKey(2))
    experience = as_experience(data)
    process_key, step_key = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(0), 0))
    process, update_step = mpo.process_experience_factory(config), mpo.update_step_factory(config)
    want, _ = jax.jit(lambda s, pk, sk, e: update_step(s, sk, process(s, pk, e)))(
        state, process_key, step_key, experience
    )
    agent = MPO(mpo_networks(env.observation_space), env, 3e-3, n_action_samples=4)
    fresh_params = agent.init_params(jax.random.PRNGKey(1))
    assert same(fresh_params.dual, state.dual.params)  # the duals start where the collection's do
    params = MPO.Params(
        state.actor.params,
        state.critic.params,
        state.actor.target_params,
        state.critic.target_params,
        state.dual.params,
    )
    opt = {"policy": state.actor.opt_state, "critic": state.critic.opt_state, "dual": state.dual.opt_state}
    out, new, optimizer_state = agent.update(params, OptimState(state.critic.step, opt), data)
    assert same(new.policy, want.actor.params) and same(new.critic, want.critic.params)
    assert same(new.policy_target, want.actor.target_params) and same(new.critic_target, want.critic.target_params)
    assert same(new.dual, want.dual.params) and int(optimizer_state.count) == 1
    assert float(out.kl_mean) < 1e-6  # online = target before the step
    actions, _ = agent.predict(new, agent.init_policy(None), data["obs"], jax.random.PRNGKey(3))
    assert actions.actions.shape == (16, 1) and np.all(np.abs(np.asarray(actions.actions)) <= 2.0)
    mean_actions, _ = agent.predict(new, agent.init_policy(None), data["obs"], jax.random.PRNGKey(3), evaluation=True)
    mean, _ = want.actor.apply_fn(want.actor.params, data["obs"])
    np.testing.assert_allclose(np.asarray(mean_actions.actions), 2.0 * np.asarray(mean), atol=1e-6)  # bounds +-2


def test_the_functional_mpo_is_pure_under_jit_and_vmap():
    from kitae.functional import MPO

    env = gym.make("Pendulum-v1")
    plain, jitted = (MPO(mpo_networks(env.observation_space), env, 1e-3, n_action_samples=4) for _ in range(2))
    jitted.jit()
    data = off_policy_batch(jax.random.PRNGKey(3))
    results = []
    for agent in (plain, jitted):
        params, policy_state, optimizer_state = fresh(agent)
        out, _ = agent.predict(params, policy_state, data["obs"], jax.random.PRNGKey(4))
        for _ in range(2):
            _, params, optimizer_state = agent.update(params, optimizer_state, data)
        results.append((out, params, optimizer_state))
    assert same(results[0], results[1])
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    params = jax.vmap(plain.init_params)(keys)
    _, vmapped, _ = jax.vmap(plain.update)(
        params, jax.vmap(plain.init_optimizer)(params, keys), jax.vmap(off_policy_batch)(keys)
    )
    one = plain.init_params(keys[2])
    _, alone, _ = plain.update(one, plain.init_optimizer(one, keys[2]), off_policy_batch(keys[2]))
    for got, want in zip(jax.tree_util.tree_leaves(vmapped), jax.tree_util.tree_leaves(alone), strict=True):
        np.testing.assert_allclose(np.asarray(got[2]), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_the_functional_mpo_refuses_what_it_cannot_handle():
    from kitae.functional import MPO

    pendulum = gym.make("Pendulum-v1")
    with pytest.raises(ValueError, match="action_space=Discrete.*not allowed for MPO"):
        MPO(mpo_networks(ENV.observation_space), ENV, 1e-3)
    with pytest.raises(ValueError, match="epsilon_mean"):
        MPO(mpo_networks(pendulum.observation_space), pendulum, 1e-3, epsilon_mean=0.0)
    agent = MPO(actor_critic_network("td3"), pendulum, 1e-3)  # an actor that returns actions only
    with pytest.raises(TypeError, match=r"MPO's actor returned .* allowed: \(mean \(B, 1\), L \(B, 1, 1\)\)"):
        agent.init_params(jax.random.PRNGKey(0))  # refused when the parameters are made, not at predict


# ---- discrete SAC ------------------------------------------------------------------------------


def discrete_sac_networks(observation_space, hidden=(32,), n_critics=2):
    """The collection's discrete-SAC modules (a categorical policy, ``Q(s, .)`` critics)."""
    from kitae.modules.policy import policy_factory

    def networks(space):
        actor = policy_factory(observation_space, space, hidden=hidden, activation="relu")
        return actor, qvalue_factory(observation_space, space, hidden=hidden, n_critics=n_critics)

    return networks


def cartpole_batch(key, n=16):
    keys = jax.random.split(key, 4)
    return {
        "obs": jax.random.normal(keys[0], (n, 4)),
        "action": jax.random.randint(keys[1], (n,), 0, 2),
        "reward": jax.random.normal(keys[2], (n,)),
        "terminated": jax.random.bernoulli(keys[3], 0.1, (n,)),
        "next_obs": jax.random.normal(keys[3], (n, 4)),
    }


def test_the_functional_sac_on_a_discrete_space_gives_the_collections_discrete_sac_bits():
    from kitae.algos.collections import sac, sac_discrete
    from kitae.functional import SAC

    config = cfg.AlgoConfig(
        seed=0,
        algo_params=sac.SACParams(policy_hidden=(32,), q_hidden=(32,), target_entropy_scale=0.3),
        update_cfg=cfg.UpdateConfig(learning_rate=3e-3, max_grad_norm=None),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig("CartPole-v1", ENV.observation_space, ENV.action_space),
    )
    state = sac_discrete.train_state_factory(jax.random.PRNGKey(1), config)
    data = cartpole_batch(jax.random.PRNGKey(2))
    experience = as_experience(data)
    process_key, step_key = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(0), 0))
    process, update_step = sac_discrete.process_experience_factory(config), sac_discrete.update_step_factory(config)
    want, want_info = jax.jit(lambda s, pk, sk, e: update_step(s, sk, process(s, pk, e)))(
        state, process_key, step_key, experience
    )
    # the collection's twin critics are one ensemble module: one copy of it here
    agent = SAC(discrete_sac_networks(ENV.observation_space), ENV, 3e-3, n_critics=1, target_entropy_scale=0.3)
    assert agent.discrete
    params = SAC.Params(state.policy.params, state.qvalue.params, state.qvalue.target_params, state.alpha.params)
    opt = {"policy": state.policy.opt_state, "qvalue": state.qvalue.opt_state, "alpha": state.alpha.opt_state}
    out, new, optimizer_state = agent.update(params, OptimState(state.qvalue.step, opt), data)
    assert same(new.policy, want.policy.params) and same(new.alpha, want.alpha.params)
    assert same(new.qvalue, want.qvalue.params) and same(new.qvalue_target, want.qvalue.target_params)
    assert float(out.critic_loss) == float(want_info["loss_critic"]) and int(optimizer_state.count) == 1
    output, _ = agent.predict(new, agent.init_policy(None), data["obs"], jax.random.PRNGKey(3))
    assert output.actions.shape == (16,) and output.actions.dtype == jnp.int32
    assert set(np.unique(np.asarray(output.actions))) <= {0, 1}
    best, _ = agent.predict(new, agent.init_policy(None), data["obs"], jax.random.PRNGKey(3), evaluation=True)
    logits = want.policy.apply_fn(want.policy.params, data["obs"]).logits
    np.testing.assert_array_equal(np.asarray(best.actions), np.argmax(np.asarray(logits), -1))


def test_the_functional_discrete_sac_is_pure_under_jit_and_vmap_with_independent_critic_copies():
    from kitae.functional import SAC

    def make():
        return SAC(discrete_sac_networks(ENV.observation_space, n_critics=1), ENV, 1e-3)  # two copies of one Q(s, .)

    plain, jitted = make(), make()
    jitted.jit()
    data = cartpole_batch(jax.random.PRNGKey(3))
    results = []
    for agent in (plain, jitted):
        params, policy_state, optimizer_state = fresh(agent)
        out, _ = agent.predict(params, policy_state, data["obs"], jax.random.PRNGKey(4))
        for _ in range(2):
            _, params, optimizer_state = agent.update(params, optimizer_state, data)
        results.append((out, params, optimizer_state))
    assert same(results[0], results[1])
    first, second = (jax.tree_util.tree_map(lambda x, i=i: x[i], results[0][1].qvalue) for i in (0, 1))
    assert not same(first, second)  # the copies were initialised apart
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    params = jax.vmap(plain.init_params)(keys)
    _, vmapped, _ = jax.vmap(plain.update)(
        params, jax.vmap(plain.init_optimizer)(params, keys), jax.vmap(cartpole_batch)(keys)
    )
    one = plain.init_params(keys[2])
    _, alone, _ = plain.update(one, plain.init_optimizer(one, keys[2]), cartpole_batch(keys[2]))
    for got, want in zip(jax.tree_util.tree_leaves(vmapped), jax.tree_util.tree_leaves(alone), strict=True):
        np.testing.assert_allclose(np.asarray(got[2]), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_the_functional_sac_refuses_spaces_neither_sac_takes():
    from kitae.functional import SAC

    env = _Spaces(ENV.observation_space, gym.spaces.MultiDiscrete([2, 3]))
    with pytest.raises(ValueError, match=r"action_space=MultiDiscrete.*not allowed for SAC.*or a Discrete one"):
        SAC(discrete_sac_networks(ENV.observation_space), env, 1e-3)
    with pytest.raises(ValueError, match="target_entropy_scale"):
        SAC(discrete_sac_networks(ENV.observation_space), ENV, 1e-3, target_entropy_scale=0.0)


# ---- RND-PPO -----------------------------------------------------------------------------------


def test_the_functional_rnd_ppo_update_gives_the_collection_agents_bits(tmp_path):
    from kitae.algos.collections import ppo, rnd_ppo
    from kitae.functional import RNDPPO

    env = gym.make("MountainCar-v0")
    config = cfg.AlgoConfig(
        seed=3,
        algo_params=rnd_ppo.RNDPPOParams(hidden_sizes=(32,), rnd_hidden_sizes=(16,), rnd_feature_size=8),
        update_cfg=cfg.UpdateConfig(learning_rate=1e-3, n_epochs=2, batch_size=16, max_grad_norm=0.5),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig("MountainCar-v0", env.observation_space, env.action_space, n_envs=4),
    )
    agent = rnd_ppo.RNDPPO("functional-check", config, run_dir=str(tmp_path))
    state = agent.state
    data = rollout(env, jax.random.PRNGKey(4))
    key = jax.random.fold_in(jax.random.PRNGKey(0), 0)  # the functional default at count 0
    want, _ = jax.jit(agent.update_fn)(state, key, as_experience(data))

    def network(space):  # the collection's own module: the same parameters fit both faces
        return ppo._actor_critic_module(config, None, rnd_ppo.ExtrinsicIntrinsicValueHead())

    functional = RNDPPO(
        network, env, 1e-3, n_envs=4, rnd_hidden_sizes=(16,), rnd_feature_size=8, n_epochs=2, batch_size=16
    )
    params = RNDPPO.Params(
        state.actor_critic.params,
        state.rnd_predictor.params,
        state.rnd_target_params,
        state.rnd_observation_statistics,
        state.intrinsic_return_statistics,
        state.intrinsic_discounted_returns,
    )
    opt = {"network": state.actor_critic.opt_state, "rnd_predictor": state.rnd_predictor.opt_state}
    out, new, optimizer_state = functional.update(params, OptimState(state.actor_critic.step, opt), data)
    assert same(new.network, want.actor_critic.params) and same(new.rnd_predictor, want.rnd_predictor.params)
    assert same(new.rnd_target, state.rnd_target_params)  # never trained
    assert same(new.rnd_observation_statistics, want.rnd_observation_statistics)
    assert same(new.intrinsic_return_statistics, want.intrinsic_return_statistics)
    assert same(new.intrinsic_discounted_returns, want.intrinsic_discounted_returns)
    assert float(new.rnd_observation_statistics.count) == 8 * 4  # the rollout's next observations went in
    assert int(optimizer_state.count) == 2 * (8 * 4 // 16) and np.isfinite(float(out.rnd_loss))
    actions, _ = functional.predict(new, functional.init_policy(None), data["obs"][0], jax.random.PRNGKey(1))
    assert actions.actions.shape == (4,)


def test_the_functional_rnd_ppo_is_pure_and_refuses_what_it_cannot_handle():
    from kitae.functional import RNDPPO

    env = gym.make("MountainCar-v0")

    def network(space):
        def forward(obs):
            h = hk.nets.MLP([32], activate_final=True)(obs)
            return hk.Linear(space.n)(h), hk.Linear(2)(h)

        return hk.without_apply_rng(hk.transform(forward))

    plain, jitted = (RNDPPO(network, env, 1e-3, n_envs=4, batch_size=16) for _ in range(2))
    jitted.jit()
    data = rollout(env, jax.random.PRNGKey(5))
    results = []
    for agent in (plain, jitted):
        params, policy_state, optimizer_state = fresh(agent)
        for _ in range(2):
            _, params, optimizer_state = agent.update(params, optimizer_state, data)
        results.append((params, optimizer_state))
    assert same(results[0], results[1])
    assert float(results[0][0].rnd_observation_statistics.count) == 2 * 8 * 4
    params, _, optimizer_state = fresh(plain)
    with pytest.raises(ValueError, match=r"data\['reward'\] has shape \(8, 3\).*allowed: \(T, 4\)"):
        plain.update(params, optimizer_state, rollout(env, jax.random.PRNGKey(5), e=3))
    with pytest.raises(ValueError, match="n_envs=0 is not allowed"):
        RNDPPO(network, env, 1e-3, n_envs=0)
    with pytest.raises(ValueError, match="intrinsic_gamma"):
        RNDPPO(network, env, 1e-3, intrinsic_discount_factor=2.0)
    with pytest.raises(ValueError, match=r"RND-PPO cannot read the observation space Discrete\(5\)"):
        RNDPPO(network, _Spaces(gym.spaces.Discrete(5), env.action_space), 1e-3)


# ---- networks whose outputs do not fit the action space --------------------------------------


def _hk(f):
    return hk.without_apply_rng(hk.transform(f))


def _two_heads(policy, value):
    """An actor-critic creator: ``(Linear(policy)(x), Linear(value)(x))``."""
    return lambda space: _hk(lambda x: (hk.Linear(policy)(x), hk.Linear(value)(x)))


def _gaussian_heads(d):
    return lambda space: _hk(lambda x: ((hk.Linear(d)(x), jnp.zeros(d)), hk.Linear(1)(x)))


def _sac_pair(actor_out, critic_out, discrete=False):
    def actor(o):
        return hk.Linear(actor_out)(o) if discrete else (hk.Linear(actor_out)(o), jnp.zeros(actor_out))

    def critic(o, a=None):
        return hk.Linear(critic_out)(o if a is None else jnp.concatenate([o, a], -1))

    return lambda space: (_hk(actor), _hk(critic if not discrete else lambda o: hk.Linear(critic_out)(o)))


def _td3_pair(actor_out, critic_out):
    return lambda space: (
        _hk(lambda o: jnp.tanh(hk.Linear(actor_out)(o))),
        _hk(lambda o, a: hk.Linear(critic_out)(jnp.concatenate([o, a], -1))),
    )


def _make_bad_agent(case):
    from kitae.functional import A2C, DDPG, MPO, PPO, RNDPPO, SAC, TD3

    pendulum = gym.make("Pendulum-v1")
    return {
        "dqn": lambda: DQN(lambda s: _hk(lambda x: hk.nets.MLP([32, 5])(x)), ENV, 1e-3),
        "ppo-logits": lambda: PPO(_two_heads(5, 1), ENV, 1e-3),
        "ppo-values": lambda: PPO(_two_heads(2, 3), ENV, 1e-3),
        "ppo-box": lambda: PPO(_gaussian_heads(3), pendulum, 1e-3),
        "a2c-logits": lambda: A2C(_two_heads(5, 1), ENV, 1e-3),
        "rnd-ppo-values": lambda: RNDPPO(_two_heads(2, 1), ENV, 1e-3),
        "sac-actor": lambda: SAC(_sac_pair(3, 1), pendulum, 1e-3),
        "sac-critic": lambda: SAC(_sac_pair(1, 4), pendulum, 1e-3),
        "discrete-sac-actor": lambda: SAC(_sac_pair(5, 2, discrete=True), ENV, 1e-3),
        "discrete-sac-critic": lambda: SAC(_sac_pair(2, 5, discrete=True), ENV, 1e-3),
        "td3-actor": lambda: TD3(_td3_pair(2, 1), pendulum, 1e-3),
        "td3-critic": lambda: TD3(_td3_pair(1, 3), pendulum, 1e-3),
        "ddpg-actor": lambda: DDPG(_td3_pair(2, 1), pendulum, 1e-3),
        "mpo-critic": lambda: MPO(
            lambda space: (mpo_networks(pendulum.observation_space)(space)[0], _td3_pair(1, 3)(space)[1]),
            pendulum,
            1e-3,
        ),
    }[case]()


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("dqn", r"DQN's network \(Q-values\) returned shape \(7, 5\).*required: shape \(7, 2\).*n_actions=2"),
        ("ppo-logits", r"PPO's network \(the policy\) returned shape \(7, 5\).*required: shape \(7, 2\)"),
        ("ppo-values", r"PPO's network \(the values\) returned shape \(7, 3\).*required: shape \(7,\)"),
        ("ppo-box", r"PPO's network \(the policy\) returned shape \(7, 3\).*required: shape \(7, 1\).*d=1"),
        ("a2c-logits", r"A2C's network \(the policy\) returned shape \(7, 5\).*required: shape \(7, 2\)"),
        ("rnd-ppo-values", r"RNDPPO's network \(the values\) returned shape \(7,\).*required: shape \(7, 2\)"),
        ("sac-actor", r"SAC's actor returned shape \(7, 3\).*required: shape \(7, 1\)"),
        ("sac-critic", r"critic returned shape \(7, 4\).*required: Q-values of shape \(7,\) or \(7, 1\)"),
        ("discrete-sac-actor", r"SAC's actor returned shape \(7, 5\).*required: shape \(7, 2\)"),
        ("discrete-sac-critic", r"SAC's critic returned shape \(7, 5\).*required: shape \(7, 2\)"),
        ("td3-actor", r"TD3's actor returned shape \(7, 2\).*required: shape \(7, 1\)"),
        ("td3-critic", r"critic returned shape \(7, 3\).*required: Q-values of shape \(7,\) or \(7, 1\)"),
        ("ddpg-actor", r"DDPG's actor returned shape \(7, 2\).*required: shape \(7, 1\)"),
        ("mpo-critic", r"critic returned shape \(7, 3\).*required: Q-values of shape \(7,\) or \(7, 1\)"),
    ],
)
def test_init_params_refuses_a_network_whose_outputs_do_not_fit_the_action_space(case, match):
    """Before, a DQN network with 5 outputs on Discrete(2) acted 0..4; now ``init_params`` (also
    under ``vmap``) names the shape found and the one required."""
    agent = _make_bad_agent(case)
    with pytest.raises(TypeError, match=match):
        agent.init_params(jax.random.PRNGKey(0))
    with pytest.raises(TypeError, match=match):
        jax.vmap(agent.init_params)(jax.random.split(jax.random.PRNGKey(0), 2))


def test_a_one_critic_ensemble_on_a_batch_of_one_is_read_as_an_ensemble():
    """``(k, B)`` with ``B = 1`` is an ensemble of ``k``, not one critic over ``k`` rows."""
    from kitae.functional.base import Network, critic_ensemble

    ensemble = critic_ensemble(Network(lambda *_: {}, lambda params, obs, action: jnp.zeros((2, action.shape[0]))), 1)
    assert ensemble.apply({}, jnp.zeros((1, 3)), jnp.zeros((1, 1))).shape == (2, 1)
    one = critic_ensemble(Network(lambda *_: {}, lambda params, obs, action: jnp.zeros((action.shape[0], 1))), 1)
    assert one.apply({}, jnp.zeros((1, 3)), jnp.zeros((1, 1))).shape == (1, 1)
    column = critic_ensemble(Network(lambda *_: {}, lambda params, obs, action: jnp.zeros((2, action.shape[0], 1))), 1)
    assert column.apply({}, jnp.zeros((4, 3)), jnp.zeros((4, 1))).shape == (2, 4)


# ---- an agent of your own, and what the audit found ------------------------------------------


class LinearQAgent(BaseAgent):
    """Seed 002's subclass: the five public methods, nothing of kitae's internals. ``predict``
    branches on ``evaluation`` in Python, so it only compiles with ``evaluation`` static."""

    traces = 0

    def init_params(self, rng):
        return self.network.init(as_key(rng), jnp.zeros((1, 4)))

    def init_policy(self, rng):
        return jnp.zeros((), jnp.int32)

    def init_optimizer(self, params, rng):
        return OptimState(jnp.zeros((), jnp.int32), optax.sgd(self.learning_rate).init(params))

    def predict(self, params, policy_state, obs, key, evaluation=False):
        type(self).traces += 1  # counts Python runs: under jit, traces only
        q = self.network.apply(params, obs)
        if evaluation:
            return jnp.argmax(q, -1), policy_state
        return jax.random.randint(key, q.shape[:1], 0, q.shape[1]), policy_state + 1

    def update(self, params, optimizer_state, data):
        def loss(p):
            q = jnp.take_along_axis(self.network.apply(p, data["obs"]), data["action"][:, None], 1)[:, 0]
            return jnp.mean((q - data["reward"]) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = optax.sgd(self.learning_rate).update(grads, optimizer_state.opt_state)
        return value, optax.apply_updates(params, updates), OptimState(optimizer_state.count + 1, opt_state)


def test_a_subclass_that_defines_the_seeds_five_methods_works_and_jit_compiles_them():
    """It failed with "Can't instantiate abstract class ... with abstract methods _predict, _update"."""
    plain, jitted = LinearQAgent(haiku_network, ENV, 0.1), LinearQAgent(haiku_network, ENV, 0.1)
    jitted.jit()
    data, key = batch(jax.random.PRNGKey(20)), jax.random.PRNGKey(21)
    results = []
    for agent in (plain, jitted):
        params, policy_state, optimizer_state = fresh(agent)
        acted = [agent.predict(params, policy_state, data["obs"], key, evaluation) for evaluation in (False, True)]
        loss, params, optimizer_state = agent.update(params, optimizer_state, data)
        results.append((acted, loss, params, optimizer_state))
    assert int(results[1][0][0][1]) == 1 and int(results[1][0][1][1]) == 0  # evaluation leaves the count alone
    assert int(results[1][3].count) == 1 and not same(results[1][2], fresh(jitted)[0])  # one step made
    for got, want in zip(jax.tree_util.tree_leaves(results[1]), jax.tree_util.tree_leaves(results[0]), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    LinearQAgent.traces = 0
    for _ in range(3):  # compiled once per evaluation value: the user's predict is traced, not rerun
        jitted.predict(params, policy_state, data["obs"], hk.PRNGSequence(0), evaluation=True)
    assert LinearQAgent.traces == 0
    jitted.predict(params, policy_state, data["obs"][:3], key, True)
    assert LinearQAgent.traces == 1


class ScaledLinearQAgent(LinearQAgent):
    """Seed 002's ``**kwargs``: a keyword of the subclass's own (a loss scale, traced)."""

    def update(self, params, optimizer_state, data, scale=1.0):
        return super().update(params, optimizer_state, {**data, "reward": data["reward"] * scale})


@pytest.mark.parametrize("jitted", [False, True])
def test_keyword_arguments_reach_a_subclass_and_are_refused_by_the_built_in_agents(jitted):
    agent = ScaledLinearQAgent(haiku_network, ENV, 0.1)
    if jitted:
        agent.jit()
    data = batch(jax.random.PRNGKey(20))
    params, _, optimizer_state = fresh(agent)
    doubled = agent.update(params, optimizer_state, data, scale=2.0)
    by_hand = agent.update(params, optimizer_state, {**data, "reward": data["reward"] * 2.0})
    np.testing.assert_allclose(np.asarray(doubled[0]), np.asarray(by_hand[0]), rtol=1e-6)

    dqn = DQN(haiku_network, ENV, 1e-3)
    if jitted:
        dqn.jit()
    params, policy_state, optimizer_state = fresh(dqn)
    with pytest.raises(TypeError, match=r"DQN.predict got keyword arguments \['foo'\]; allowed: none"):
        dqn.predict(params, policy_state, data["obs"], jax.random.PRNGKey(0), False, foo=1)
    with pytest.raises(TypeError, match=r"DQN.update got keyword arguments \['foo'\]; allowed: none"):
        dqn.update(params, optimizer_state, data, foo=1)


def test_a_subclass_missing_a_seed_method_is_refused_by_name():
    class NoUpdate(BaseAgent):
        init_params = LinearQAgent.init_params
        init_policy = LinearQAgent.init_policy
        init_optimizer = LinearQAgent.init_optimizer
        predict = LinearQAgent.predict

    with pytest.raises(TypeError, match=r"abstract method '?update'?$"):
        NoUpdate(haiku_network, ENV, 0.1)


@pytest.mark.parametrize("jitted", [False, True])
@pytest.mark.parametrize(
    ("action", "shown"), [(7, "7"), (-1, "-1"), (1.7, "1.7"), (float("nan"), "nan")], ids=["7", "-1", "1.7", "nan"]
)
def test_update_refuses_actions_outside_a_discrete_space(jitted, action, shown):
    """7 on Discrete(2) gave a NaN loss, -1 was read as action 1, 1.7 as 1: silently."""
    agent = DQN(haiku_network, ENV, 1e-3)
    if jitted:
        agent.jit()
    params, _, optimizer_state = fresh(agent)
    data = batch(jax.random.PRNGKey(0))
    data["action"] = np.array(data["action"], np.float32 if isinstance(action, float) else np.int32)
    data["action"][3] = action
    expected = (
        f"DQN.update: data['action'] holds {shown} (at index 3), outside Discrete(2); allowed: integers in [0, 2)"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        agent.update(params, optimizer_state, data)


def test_update_takes_integral_float_actions_as_their_integers():
    agent = DQN(haiku_network, ENV, 1e-3)
    params, _, optimizer_state = fresh(agent)
    data = batch(jax.random.PRNGKey(0))
    as_floats = {**data, "action": np.asarray(data["action"], np.float32)}
    assert same(agent.update(params, optimizer_state, data), agent.update(params, optimizer_state, as_floats))


def test_discrete_sac_and_ppo_refuse_actions_outside_the_space():
    from kitae.functional import PPO, SAC

    sac = SAC(discrete_sac_networks(OBS_SPACE), ENV, 1e-3)
    params, _, optimizer_state = fresh(sac)
    data = cartpole_batch(jax.random.PRNGKey(0))
    data["action"] = data["action"].at[0].set(2)
    with pytest.raises(ValueError, match=re.escape("SAC.update: data['action'] holds 2 (at index 0), outside")):
        sac.update(params, optimizer_state, data)
    ppo = PPO(ppo_network, ENV, 1e-3, batch_size=16)
    params, _, optimizer_state = fresh(ppo)
    data = rollout(ENV, jax.random.PRNGKey(0))
    data["action"] = data["action"].at[2, 1].set(-1)
    with pytest.raises(ValueError, match=re.escape("PPO.update: data['action'] holds -1 (at index (2, 1)), outside")):
        ppo.update(params, optimizer_state, data)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_update_refuses_box_actions_outside_the_bounds(algo):
    from kitae.functional import SAC, TD3

    agent = (SAC if algo == "sac" else TD3)(actor_critic_network(algo), gym.make("Pendulum-v1"), 1e-3)
    params, _, optimizer_state = fresh(agent)
    data = off_policy_batch(jax.random.PRNGKey(0))
    data["action"] = data["action"].at[:2, 0].set(jnp.asarray([2.0, -2.0]))  # on the bounds: taken
    agent.update(params, optimizer_state, data)
    for bad in (2.5, float("nan")):
        data["action"] = data["action"].at[5, 0].set(bad)
        name = type(agent).__name__
        with pytest.raises(ValueError, match=rf"{name}.update: data\['action'\] holds {bad} \(at index \(5, 0\)\).*"
                           r"allowed: finite values in \[low, high\]"):  # fmt: skip
            agent.update(params, optimizer_state, data)


def test_predict_under_jax_jit_asks_for_a_static_evaluation():
    """``jax.jit(agent.predict)(..., True)`` failed inside JAX: "Non-hashable static arguments are
    not supported ... DynamicJaxprTracer"."""
    agent = DQN(haiku_network, ENV, 1e-3)
    params, policy_state, _ = fresh(agent)
    obs, key = batch(jax.random.PRNGKey(0))["obs"], jax.random.PRNGKey(1)
    message = r"evaluation is a traced value.*allowed: a Python bool.*agent\.jit\(\).*static_argnames='evaluation'"
    with pytest.raises(TypeError, match=message):
        jax.jit(agent.predict)(params, policy_state, obs, key, True)
    with pytest.raises(TypeError, match=r"evaluation is an array"):
        agent.predict(params, policy_state, obs, key, jnp.asarray(True))
    static = jax.jit(agent.predict, static_argnames="evaluation")
    for evaluation in (False, True):
        assert same(
            static(params, policy_state, obs, key, evaluation),
            agent.predict(params, policy_state, obs, key, evaluation),
        )
    agent.jit()
    with pytest.raises(TypeError, match=message):
        jax.jit(agent.predict)(params, policy_state, obs, key, True)


@pytest.mark.parametrize("jitted", [False, True])
@pytest.mark.parametrize(
    ("key", "shape", "required"),
    [("obs", (16, 5), "(B, 4)"), ("obs", (4,), "(B, 4)"), ("next_obs", (16, 3), "(16, 4)")],
)
def test_update_names_observations_of_another_shape(jitted, key, shape, required):
    """A ``(B, 5)`` obs on CartPole failed inside the user's Haiku network."""
    agent = DQN(haiku_network, ENV, 1e-3)
    if jitted:
        agent.jit()
    params, _, optimizer_state = fresh(agent)
    data = batch(jax.random.PRNGKey(0))
    data[key] = jnp.zeros(shape)
    expected = f"DQN.update: data[{key!r}] has shape {shape}, which is not allowed; required: {required}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        agent.update(params, optimizer_state, data)


def test_ppo_update_names_a_rollout_of_observations_of_another_shape():
    from kitae.functional import PPO

    agent = PPO(ppo_network, ENV, 1e-3, batch_size=16)
    params, _, optimizer_state = fresh(agent)
    data = rollout(ENV, jax.random.PRNGKey(0))
    data["obs"] = data["obs"].reshape(32, 4)  # T * E rows: not a rollout
    with pytest.raises(
        ValueError,
        match=re.escape("PPO.update: data['obs'] has shape (32, 4), which is not allowed; required: (T, E, 4)"),
    ):
        agent.update(params, optimizer_state, data)


@pytest.mark.parametrize("input_shapes", [(4,), [4], 4, {"x": (4,)}], ids=["a-shape", "ints", "int", "dict"])
def test_init_params_names_input_shapes_that_are_not_a_list_of_shapes(input_shapes):
    """``init_params(key, nn.Dense(2), (4,))`` failed with "Value after * must be an iterable, not int"."""
    from kitae.modules.modules import init_params

    with pytest.raises(
        TypeError, match=rf"input_shapes={re.escape(repr(input_shapes))} is not allowed.*allowed: a list of shapes"
    ):
        init_params(jax.random.PRNGKey(0), nn.Dense(2), input_shapes)
    assert init_params(jax.random.PRNGKey(0), nn.Dense(2), [(4,)])["params"]["kernel"].shape == (4, 2)
