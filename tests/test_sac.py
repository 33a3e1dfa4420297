"""SAC: losses against hand-computed values, the tanh correction, Polyak targets, exploration before
and after ``start_step``, refused spaces and params, updates, determinism and a short training run."""

from __future__ import annotations

import math

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kitae.config as cfg
from kitae.algos.collections import sac
from kitae.algos.collections.sac import (
    SAC,
    SACBatch,
    SACExperience,
    SACParams,
    apply_gradients_factory,
    compute_gradients_factory,
    sac_actor_loss,
    sac_critic_loss,
    sac_td_targets,
    sac_temperature_loss,
)
from kitae.distributions import TanhNormal
from kitae.envs.make import make_vec_env

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT_SPACE = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([1.0, 5.0], np.float32))
SMALL = dict(policy_hidden=(16, 16), q_hidden=(16, 16))
# The tests of the pure maths are chex variants: each runs once under jax.jit and once eagerly.
VARIANTS = dict(with_jit=True, without_jit=True)


def make_config(
    action_space=ACT_SPACE,
    observation_space=OBS_SPACE,
    *,
    seed=0,
    n_envs=1,
    batch_size=8,
    max_buffer_size=1000,
    n_epochs=1,
    learning_rate=1e-3,
    **params,
) -> cfg.AlgoConfig:
    return cfg.AlgoConfig(
        seed=seed,
        algo_params=SACParams(**{**SMALL, **params}),
        update_cfg=cfg.UpdateConfig(
            learning_rate=learning_rate,
            max_grad_norm=None,
            batch_size=batch_size,
            max_buffer_size=max_buffer_size,
            n_epochs=n_epochs,
        ),
        train_cfg=cfg.TrainConfig(n_env_steps=1000),
        env_cfg=cfg.EnvConfig(
            task_name="test", observation_space=observation_space, action_space=action_space, n_envs=n_envs
        ),
    )


def leaves_equal(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb))


def tiny_batch(n=4, seed=0) -> SACBatch:
    rng = np.random.default_rng(seed)
    return SACBatch(
        observation=jnp.asarray(rng.normal(size=(n, 3)), jnp.float32),
        action=jnp.asarray(rng.uniform(-1, 1, size=(n, 2)), jnp.float32),
        reward=jnp.asarray(rng.normal(size=(n,)), jnp.float32),
        done=jnp.asarray([0.0, 1.0, 0.0, 0.0][:n], jnp.float32),
        next_observation=jnp.asarray(rng.normal(size=(n, 3)), jnp.float32),
    )


# ---------------------------------------------------------------------------------------------
# Losses, by hand
# ---------------------------------------------------------------------------------------------


class TestLosses(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_critic_loss_by_hand(self):
        q_values = jnp.array([[1.0, 2.0, 0.5], [1.5, 1.0, 0.0]])  # 2 critics, 3 transitions
        rewards = jnp.array([1.0, 0.0, -1.0])
        dones = jnp.array([0.0, 1.0, 0.0])
        next_q = jnp.array([[2.0, 3.0, 1.0], [1.0, 4.0, 2.0]])  # min over critics: 1, 3, 1
        next_log_probs = jnp.array([0.2, -0.4, 1.0])
        alpha, gamma = 0.5, 0.9
        # soft values: 1 - 0.5*0.2 = 0.9, 3 + 0.5*0.4 = 3.2, 1 - 0.5*1 = 0.5
        # targets: 1 + 0.9*0.9 = 1.81, 0 (terminated), -1 + 0.9*0.5 = -0.55
        targets = self.variant(sac_td_targets)(rewards, dones, next_q, next_log_probs, alpha, gamma)
        np.testing.assert_allclose(targets, [1.81, 0.0, -0.55], rtol=1e-6)
        critic_1 = ((1.0 - 1.81) ** 2 + (2.0 - 0.0) ** 2 + (0.5 + 0.55) ** 2) / 3
        critic_2 = ((1.5 - 1.81) ** 2 + (1.0 - 0.0) ** 2 + (0.0 + 0.55) ** 2) / 3
        expected = 0.5 * (critic_1 + critic_2)  # = 1.19286...
        loss = self.variant(sac_critic_loss)(q_values, rewards, dones, next_q, next_log_probs, alpha, gamma)
        np.testing.assert_allclose(loss, expected, rtol=1e-6)
        np.testing.assert_allclose(expected, 1.1928667, rtol=1e-6)
        # the targets carry no gradient: only q_values do
        g_next, g_logp = self.variant(
            jax.grad(lambda nq, lp: sac_critic_loss(q_values, rewards, dones, nq, lp, alpha, gamma), argnums=(0, 1))
        )(next_q, next_log_probs)
        assert not np.any(g_next) and not np.any(g_logp)
        g_q = self.variant(
            jax.grad(lambda q: sac_critic_loss(q, rewards, dones, next_q, next_log_probs, alpha, gamma))
        )(q_values)
        # d/dq 0.5 * mean (q - y)^2 = (q - y) / 3
        np.testing.assert_allclose(g_q[0], np.array([1.0 - 1.81, 2.0, 1.05]) / 3, rtol=1e-5)

    @chex.variants(**VARIANTS)
    def test_actor_loss_by_hand(self):
        log_probs = jnp.array([0.5, -1.0])
        q_values = jnp.array([[1.0, 2.0], [0.5, 3.0]])  # min over critics: 0.5, 2.0
        alpha = 0.2
        # (0.2*0.5 - 0.5 + 0.2*(-1) - 2) / 2 = (-0.4 - 2.2) / 2 = -1.3
        np.testing.assert_allclose(self.variant(sac_actor_loss)(log_probs, q_values, alpha), -1.3, rtol=1e-6)
        g_alpha = self.variant(jax.grad(lambda a: sac_actor_loss(log_probs, q_values, a)))(jnp.float32(alpha))
        assert g_alpha == 0.0  # the temperature is a constant for the actor
        g_logp = self.variant(jax.grad(lambda lp: sac_actor_loss(lp, q_values, alpha)))(log_probs)
        np.testing.assert_allclose(g_logp, [0.1, 0.1], rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_temperature_loss_by_hand(self):
        temperature_loss = self.variant(sac_temperature_loss)
        log_alpha = jnp.float32(math.log(0.5))
        log_probs = jnp.array([0.5, -1.0, 2.0])
        target_entropy = -1.0
        # mean(log_probs + target) = (-0.5 - 2.0 + 1.0) / 3 = -0.5; loss = -log(0.5) * -0.5
        np.testing.assert_allclose(
            temperature_loss(log_alpha, log_probs, target_entropy), -(math.log(0.5) * -0.5), rtol=1e-6
        )
        np.testing.assert_allclose(temperature_loss(log_alpha, log_probs, target_entropy), -0.34657359, rtol=1e-6)
        # entropy 0.5 > target -1: the gradient is +0.5, so gradient descent lowers alpha
        grad = self.variant(jax.grad(sac_temperature_loss))(log_alpha, log_probs, target_entropy)
        np.testing.assert_allclose(grad, 0.5, rtol=1e-6)
        assert not np.any(
            self.variant(jax.grad(lambda lp: sac_temperature_loss(log_alpha, lp, target_entropy)))(log_probs)
        )


# ---------------------------------------------------------------------------------------------
# The pure functions wired together
# ---------------------------------------------------------------------------------------------


def _normal_log_prob(u, loc, scale):
    return -0.5 * ((u - loc) / scale) ** 2 - np.log(scale) - 0.5 * np.log(2 * np.pi)


CONFIG = make_config()  # gamma 0.99, tau 0.005, autotune, policy_frequency 1
FIXED = make_config(autotune=False, alpha=0.2, policy_frequency=2)


@pytest.fixture(scope="module")
def compiled():
    """The pure halves, compiled once for the whole module (one config each)."""
    return {
        name: (jax.jit(compute_gradients_factory(config)), jax.jit(apply_gradients_factory(config)))
        for name, config in (("default", CONFIG), ("fixed", FIXED))
    }


def with_alpha(state, alpha):
    state.alpha = state.alpha.replace(params={"log_alpha": jnp.asarray(math.log(alpha), jnp.float32)})
    return state


def test_actor_loss_uses_the_tanh_corrected_log_prob(compiled):
    compute, _ = compiled["default"]
    state = with_alpha(sac.train_state_sac_factory(jax.random.PRNGKey(0), CONFIG), 0.3)
    batch = tiny_batch()
    key = jax.random.PRNGKey(7)
    grads, info = compute(state, key, batch)

    # Reproduce the actor's sample: compute_gradients splits (next_key, actor_key) and the policy
    # samples u = loc + scale * N(0, 1), a = tanh(u).
    _, actor_key = jax.random.split(key)
    dist = state.policy.apply_fn(state.policy.params, batch.observation)
    assert isinstance(dist, TanhNormal)
    loc, scale = np.asarray(dist.loc, np.float64), np.asarray(dist.scale, np.float64)
    u = loc + scale * np.asarray(jax.random.normal(actor_key, loc.shape), np.float64)
    corrected = np.sum(_normal_log_prob(u, loc, scale) - np.log(1.0 - np.tanh(u) ** 2), axis=-1)
    uncorrected = np.sum(_normal_log_prob(u, loc, scale), axis=-1)
    q = np.asarray(state.qvalue.apply_fn(state.qvalue.params, batch.observation, jnp.asarray(np.tanh(u), jnp.float32)))
    assert q.shape == (2, 4)
    expected = np.mean(0.3 * corrected - q.min(axis=0))
    np.testing.assert_allclose(info["loss_actor"], expected, rtol=1e-4, atol=1e-5)
    assert abs(np.mean(0.3 * uncorrected - q.min(axis=0)) - expected) > 1e-3  # the test can tell them apart
    assert set(grads) == {"qvalue", "policy", "alpha"}
    assert set(info) == {"loss_critic", "loss_actor", "loss_alpha", "alpha"}
    np.testing.assert_allclose(info["alpha"], 0.3, rtol=1e-6)


def test_critic_target_uses_target_critics_and_next_state_entropy(compiled):
    compute, _ = compiled["default"]
    state = with_alpha(sac.train_state_sac_factory(jax.random.PRNGKey(1), CONFIG), 0.5)
    state.qvalue = state.qvalue.replace(target_params=jax.tree_util.tree_map(lambda x: x * 0.5, state.qvalue.params))
    batch = tiny_batch()
    key = jax.random.PRNGKey(3)
    _, info = compute(state, key, batch)
    next_key, _ = jax.random.split(key)
    next_actions, next_log_probs = state.policy.apply_fn(
        state.policy.params, batch.next_observation
    ).sample_and_log_prob(next_key)
    next_q = state.qvalue.apply_fn(state.qvalue.target_params, batch.next_observation, next_actions)
    q = state.qvalue.apply_fn(state.qvalue.params, batch.observation, batch.action)
    y = np.asarray(batch.reward) + 0.99 * (1 - np.asarray(batch.done)) * (
        np.min(np.asarray(next_q), 0) - 0.5 * np.asarray(next_log_probs)
    )
    expected = 0.5 * np.sum(np.mean((np.asarray(q) - y) ** 2, axis=-1))
    np.testing.assert_allclose(info["loss_critic"], expected, rtol=1e-5)


def test_polyak_target_update(compiled):
    _, apply = compiled["default"]
    state = sac.train_state_sac_factory(jax.random.PRNGKey(0), CONFIG)
    state.qvalue = state.qvalue.replace(target_params=jax.tree_util.tree_map(jnp.ones_like, state.qvalue.params))
    zero = jax.tree_util.tree_map(
        jnp.zeros_like,
        {
            "qvalue": state.qvalue.params,
            "policy": state.policy.params,
            "alpha": state.alpha.params,
        },
    )
    new = apply(state, zero)  # zero gradients: Adam leaves the params unchanged
    assert leaves_equal(new.qvalue.params, state.qvalue.params)
    # target <- 0.005 * params + 0.995 * target
    expected = jax.tree_util.tree_map(lambda p: 0.005 * p + 0.995 * 1.0, state.qvalue.params)
    for got, want in zip(jax.tree_util.tree_leaves(new.qvalue.target_params), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_one_update_changes_every_network(compiled):
    compute, apply = compiled["default"]
    state = sac.train_state_sac_factory(jax.random.PRNGKey(0), CONFIG)
    grads, info = compute(state, jax.random.PRNGKey(1), tiny_batch())
    new = apply(state, grads)
    for name in ("policy", "qvalue", "alpha"):
        assert not leaves_equal(getattr(new, name).params, getattr(state, name).params), name
    assert not leaves_equal(new.qvalue.target_params, state.qvalue.target_params)
    assert all(np.isfinite(float(v)) for v in info.values())
    assert int(new.qvalue.step) == 1 and int(new.policy.step) == 1


def test_fixed_alpha_and_policy_frequency(compiled):
    compute, apply = compiled["fixed"]  # autotune=False, alpha=0.2, policy_frequency=2
    state = sac.train_state_sac_factory(jax.random.PRNGKey(0), FIXED)
    grads, info = compute(state, jax.random.PRNGKey(1), tiny_batch())
    np.testing.assert_allclose(info["alpha"], 0.2, rtol=1e-6)
    assert float(info["loss_alpha"]) == 0.0
    first = apply(state, grads)  # critic step 0: critics and actor move, the fixed alpha does not
    assert not leaves_equal(first.policy.params, state.policy.params)
    assert not leaves_equal(first.qvalue.params, state.qvalue.params)
    assert leaves_equal(first.alpha.params, state.alpha.params)
    grads, _ = compute(first, jax.random.PRNGKey(2), tiny_batch())
    second = apply(first, grads)  # critic step 1: critics only
    assert leaves_equal(second.policy.params, first.policy.params)
    assert not leaves_equal(second.qvalue.params, first.qvalue.params)
    third = apply(second, compute(second, jax.random.PRNGKey(3), tiny_batch())[0])  # step 2: the actor again
    assert not leaves_equal(third.policy.params, second.policy.params)


def test_process_unscales_stored_actions():
    config = make_config()
    process = sac.process_experience_factory(config)
    experience = SACExperience(
        observation=jnp.zeros((3, 3)),
        action=jnp.array([[-2.0, 0.0], [1.0, 5.0], [-0.5, 2.5]]),  # low, high, middle
        reward=jnp.array([1.0, 2.0, 3.0]),
        done=jnp.array([False, True, False]),
        next_observation=jnp.ones((3, 3)),
    )
    batch = process(None, jax.random.PRNGKey(0), experience)
    np.testing.assert_allclose(batch.action, [[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0]], atol=1e-6)
    np.testing.assert_array_equal(batch.done, [0.0, 1.0, 0.0])
    assert batch.done.dtype == jnp.float32


# ---------------------------------------------------------------------------------------------
# Exploration
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent():
    return SAC("explore", make_config(start_step=100), run_dir="unused")


def test_random_actions_before_start_step_then_policy_actions(agent):
    low, high = ACT_SPACE.low, ACT_SPACE.high
    obs = np.tile(np.array([[0.1, -0.2, 0.3]], np.float32), (4000, 1))

    agent.env_step = 99
    actions, log_probs = agent.explore(obs)
    actions = np.asarray(actions)
    assert actions.shape == (4000, 2)
    assert np.all(actions >= low) and np.all(actions <= high)
    np.testing.assert_allclose(actions.mean(0), (low + high) / 2, atol=0.1)
    np.testing.assert_allclose(actions.std(0), (high - low) / math.sqrt(12), rtol=0.05)
    np.testing.assert_allclose(log_probs, -2 * math.log(2.0), rtol=1e-6)  # uniform on [-1, 1]^2

    agent.env_step = 100
    actions, log_probs = agent.explore(obs)
    assert np.mean(np.abs(np.asarray(log_probs) + 2 * math.log(2.0)) < 1e-6) < 0.01  # not the uniform density
    # explore_fn with a known key: the policy's sample, scaled to the bounds
    key = jax.random.PRNGKey(5)
    got, got_log_probs = agent.explore_fn(agent.acting_params(agent.state), key, obs, env_step=100, deterministic=False)
    sample_key, _ = jax.random.split(key)
    dist = agent.state.policy.apply_fn(agent.state.policy.params, obs)
    sampled, sampled_log_probs = dist.sample_and_log_prob(sample_key)
    np.testing.assert_allclose(got, low + (np.asarray(sampled) + 1) * 0.5 * (high - low), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_log_probs, sampled_log_probs, rtol=1e-5, atol=1e-5)
    # an untrained policy's samples concentrate around the middle, unlike the uniform ones
    assert np.all(np.asarray(actions).std(0) < 0.9 * (high - low) / math.sqrt(12))


def test_explore_switch_works_with_a_traced_step(agent):
    obs = jnp.zeros((5, 3))

    @jax.jit
    def act(step):
        return agent.explore_fn(agent.acting_params(agent.state), jax.random.PRNGKey(0), obs, env_step=step)[1]

    np.testing.assert_allclose(act(jnp.int32(99)), -2 * math.log(2.0), rtol=1e-6)
    assert not np.allclose(act(jnp.int32(100)), -2 * math.log(2.0))


def test_select_action_is_deterministic_and_explore_is_not(agent):
    agent.env_step = 100
    obs = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    a1, lp = agent.select_action(obs)
    a2, _ = agent.select_action(obs)
    np.testing.assert_array_equal(a1, a2)
    assert not np.any(lp)
    dist = agent.state.policy.apply_fn(agent.state.policy.params, obs)
    low, high = ACT_SPACE.low, ACT_SPACE.high
    np.testing.assert_allclose(a1, low + (np.tanh(dist.loc) + 1) * 0.5 * (high - low), rtol=1e-5, atol=1e-6)
    e1, _ = agent.explore(obs)
    e2, _ = agent.explore(obs)
    assert not np.allclose(e1, e2)


# ---------------------------------------------------------------------------------------------
# Refused inputs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "space, name",
    [
        (gym.spaces.MultiDiscrete([2, 3]), "MultiDiscrete"),  # Discrete: discrete SAC (test_sac_discrete.py)
        (gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), "Box"),
        (gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32), "Box"),
    ],
)
def test_refuses_action_spaces_it_cannot_handle(space, name):
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=SACParams(**SMALL),
        update_cfg=cfg.UpdateConfig(batch_size=8),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig(task_name="test", observation_space=OBS_SPACE, action_space=space),
    )
    with pytest.raises(ValueError, match="SAC") as error:
        SAC("refused", config, run_dir="unused")
    assert name in str(error.value) and "Box" in str(error.value)


def test_refuses_other_params():
    from _agents import TinyDQNParams

    config = make_config()
    config.algo_params = TinyDQNParams()
    with pytest.raises(TypeError, match="algo_params"):
        SAC("wrong", config, run_dir="unused")


@pytest.mark.parametrize(
    "field, value",
    [
        ("gamma", 1.5),
        ("gamma", -0.1),
        ("tau", 0.0),
        ("tau", 1.5),
        ("start_step", -1),
        ("skip_steps", 0),
        ("policy_frequency", 0),
        ("alpha", 0.0),
        ("alpha", float("inf")),
        ("target_entropy", float("nan")),
        ("policy_learning_rate", 0.0),
        ("q_learning_rate", -1e-3),
        ("alpha_learning_rate", 0.0),
        ("policy_learning_rate", float("inf")),  # the optimizer's float32 maths: NaN parameters
        ("q_learning_rate", 1e39),
        ("alpha_learning_rate", float("inf")),
        ("policy_hidden", (0,)),
        ("q_hidden", (256, 0)),
        ("q_hidden", (1.5,)),
        ("n_critics", 0),
    ],
)
def test_rejects_bad_params(field, value):
    with pytest.raises(ValueError, match=f"algo_params.{field}="):
        SACParams(**{field: value})


def test_empty_hidden_sizes_make_linear_networks_as_in_every_other_algorithm():
    """``()`` hidden sizes (linear heads on the observation) were refused by SAC alone."""
    agent = SAC("t", make_config(policy_hidden=(), q_hidden=()))
    assert agent.config.algo_params.policy_hidden == () and agent.config.algo_params.q_hidden == ()
    kernels = [leaf.shape for leaf in jax.tree_util.tree_leaves(agent.state.policy.params) if leaf.ndim == 2]
    assert len(kernels) == 2, kernels  # the mean's and the log-std's heads, on the observation


@pytest.mark.parametrize("field, value", [("gamma", "0.99"), ("start_step", 1.5), ("autotune", 1)])
def test_rejects_params_of_the_wrong_type(field, value):
    with pytest.raises(TypeError, match=f"algo_params.{field}="):
        SACParams(**{field: value})


def test_params_round_trip_through_yaml():
    config = make_config(q_hidden=(32, 32), target_entropy=-0.5)
    again = cfg.AlgoConfig.from_yaml(config.to_yaml())
    assert again.algo_params == config.algo_params
    assert again.algo_params.q_hidden == (32, 32)


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def _train(seed: int, n_steps: int = 2000, name: str = "a"):
    env = make_vec_env("Pendulum-v1", 2)
    config = make_config(
        env.single_action_space,
        env.single_observation_space,
        seed=seed,
        n_envs=2,
        batch_size=32,
        start_step=200,
    )
    agent = SAC(f"train-{seed}", config, run_dir=f"run-{name}")
    stats = agent.train(env, n_steps)
    return agent, stats


def test_short_training_run_is_deterministic_and_compiles_once():
    agent, stats = _train(seed=3)
    assert stats.env_steps == 2000
    assert stats.n_updates == (2000 - 200) // 2 + 1  # one update per vector step from step 200 on
    assert len(stats.episode_returns) == 10 and all(np.isfinite(stats.episode_returns))  # 1000 steps per env
    assert int(agent.state.qvalue.step) == stats.n_updates
    # crossing start_step and the changing env_step recompiled nothing
    from kitae.loops.collect import compiled_steps

    assert compiled_steps(agent).act._cache_size() == 1
    assert compiled_steps(agent).update._cache_size() == 1
    again, _ = _train(seed=3, name="b")
    assert leaves_equal(agent.state, again.state)
