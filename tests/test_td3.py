"""TD3: losses and targets by hand, delayed policy updates, Polyak targets, random actions before
``start_step``, refused action spaces, params validation, determinism and a short training run."""

from __future__ import annotations

import dataclasses

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kitae.config as cfg
from kitae.algos.collections import td3
from kitae.algos.collections.td3 import TD3, TD3Batch, TD3Params
from kitae.algos.gradients import update_step_from_gradients
from kitae.buffer import Experience
from kitae.envs.make import make_vec_env

OBS_SPACE = gym.spaces.Box(-8.0, 8.0, (3,), np.float32)
ACT_SPACE = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)  # Pendulum's
# The tests of the pure maths are chex variants: each runs once under jax.jit and once eagerly.
VARIANTS = dict(with_jit=True, without_jit=True)


def _config(
    params: TD3Params | None = None,
    *,
    action_space: gym.Space = ACT_SPACE,
    n_envs: int = 1,
    seed: int = 0,
    batch_size: int = 8,
    max_buffer_size: int = 1000,
) -> cfg.AlgoConfig:
    params = params or TD3Params(actor_hidden=(16, 16), critic_hidden=(16, 16), start_step=10)
    return cfg.AlgoConfig(
        seed=seed,
        algo_params=params,
        update_cfg=cfg.UpdateConfig(
            learning_rate=1e-3, max_grad_norm=None, max_buffer_size=max_buffer_size, batch_size=batch_size
        ),
        train_cfg=cfg.TrainConfig(n_env_steps=1000),
        env_cfg=cfg.EnvConfig(task_name="test", observation_space=OBS_SPACE, action_space=action_space, n_envs=n_envs),
    )


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def _equal(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(_leaves(a), _leaves(b)))


def _batch(key: jax.Array, n: int = 8) -> TD3Batch:
    k1, k2, k3, k4 = jax.random.split(key, 4)
    return TD3Batch(
        observation=jax.random.normal(k1, (n, 3)),
        action=jax.random.uniform(k2, (n, 1), minval=-1.0, maxval=1.0),
        reward=jax.random.normal(k3, (n,)),
        discount=jnp.full((n,), 0.99),
        next_observation=jax.random.normal(k4, (n, 3)),
    )


# ---------------------------------------------------------------------------------------------
# Hand-computed losses and targets, with tiny linear "networks"
# ---------------------------------------------------------------------------------------------


def linear_actor(params, obs):  # (B, 2) @ (2, 1) -> (B, 1)
    return obs @ params


def linear_twin_critic(params, obs, actions):  # (2, 3) @ (3, B) -> (2, B): one row per critic
    return params @ jnp.concatenate([obs, actions], axis=-1).T


class TestTargetsAndLosses(chex.TestCase):
    """The apply functions are static arguments under jit (``static_argnums``)."""

    @chex.variants(**VARIANTS)
    def test_target_actions_no_noise_only_clips(self):
        next_actions = jnp.array([[0.5], [2.0], [-3.0]])
        out = self.variant(td3.td3_target_actions)(
            jax.random.PRNGKey(0), next_actions, policy_noise=0.0, noise_clip=0.5
        )
        np.testing.assert_allclose(out, [[0.5], [1.0], [-1.0]])

    @chex.variants(**VARIANTS)
    def test_target_actions_noise_is_clipped(self):
        target_actions = self.variant(td3.td3_target_actions)
        key = jax.random.PRNGKey(3)
        next_actions = jnp.zeros((1000, 1))
        # a huge policy_noise: almost every noise value is clipped to +-noise_clip
        out = np.asarray(target_actions(key, next_actions, policy_noise=100.0, noise_clip=0.3))
        assert np.all(np.abs(out) <= 0.3 + 1e-7)
        assert np.mean(np.isclose(np.abs(out), 0.3)) > 0.95
        # the same key gives the same noise: policy_noise * N(0, 1) clipped, then the sum clipped to [-1, 1]
        normal = np.asarray(jax.random.normal(key, (1000, 1)))
        out = target_actions(key, jnp.full((1000, 1), 0.9), policy_noise=0.2, noise_clip=0.5)
        np.testing.assert_allclose(out, np.clip(0.9 + np.clip(0.2 * normal, -0.5, 0.5), -1.0, 1.0), rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_targets_by_hand(self):
        actor_target = jnp.array([[0.5], [0.25]])
        critic_target = jnp.array([[1.0, 0.0, 2.0], [0.0, 1.0, -1.0]])
        next_obs = jnp.array([[1.0, 0.0], [0.0, 8.0]])
        # a' = [0.5, 8 * 0.25 = 2 -> clipped to 1]
        # sample 1: x = [1, 0, 0.5]: Q1 = 1 + 0 + 1 = 2, Q2 = 0 + 0 - 0.5 = -0.5 -> min -0.5
        # sample 2: x = [0, 8, 1]:   Q1 = 0 + 0 + 2 = 2, Q2 = 0 + 8 - 1 = 7    -> min 2
        # y = [1 + 0.9 * -0.5, -1 + 0 * 2] = [0.55, -1]
        y = self.variant(td3.td3_targets, static_argnums=(1, 3))(
            jax.random.PRNGKey(0),
            linear_actor,
            actor_target,
            linear_twin_critic,
            critic_target,
            next_obs,
            jnp.array([1.0, -1.0]),
            jnp.array([0.9, 0.0]),
            policy_noise=0.0,
            noise_clip=0.5,
        )
        np.testing.assert_allclose(y, [0.55, -1.0], rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_critic_loss_by_hand(self):
        critic = jnp.array([[1.0, 0.0, 2.0], [0.0, 1.0, -1.0]])
        obs = jnp.array([[1.0, 2.0], [0.0, 1.0]])
        actions = jnp.array([[0.5], [-1.0]])
        targets = jnp.array([0.55, -1.0])
        # s1: x = [1, 2, 0.5]: Q1 = 1 + 0 + 1 = 2,  Q2 = 0 + 2 - 0.5 = 1.5
        # s2: x = [0, 1, -1]:  Q1 = 0 + 0 - 2 = -2, Q2 = 0 + 1 + 1 = 2
        # critic 1: ((2 - 0.55)^2 + (-2 + 1)^2) / 2 = (2.1025 + 1) / 2 = 1.55125
        # critic 2: ((1.5 - 0.55)^2 + (2 + 1)^2) / 2 = (0.9025 + 9) / 2 = 4.95125
        critic_loss = self.variant(td3.td3_critic_loss, static_argnums=(1,))
        loss, info = critic_loss(critic, linear_twin_critic, obs, actions, targets)
        np.testing.assert_allclose(loss, 1.55125 + 4.95125, rtol=1e-6)
        np.testing.assert_allclose(info["loss_critic"], 6.5025, rtol=1e-6)
        np.testing.assert_allclose(info["qvalue"], (2 + 1.5 - 2 + 2) / 4, rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_actor_loss_by_hand(self):
        actor = jnp.array([[0.5], [0.25]])
        critic = jnp.array([[1.0, 0.0, 2.0], [0.0, 1.0, -1.0]])
        obs = jnp.array([[1.0, 2.0], [0.0, 1.0]])
        # pi(s) = [1 * 0.5 + 2 * 0.25, 1 * 0.25] = [1.0, 0.25]
        # Q1 = [1 + 0 + 2 * 1.0, 0 + 0 + 2 * 0.25] = [3, 0.5]; loss = -(3 + 0.5) / 2 = -1.75 (Q2 unused)
        actor_loss = self.variant(td3.td3_actor_loss, static_argnums=(1, 3))
        loss, info = actor_loss(actor, linear_actor, critic, linear_twin_critic, obs)
        np.testing.assert_allclose(loss, -1.75, rtol=1e-6)
        np.testing.assert_allclose(info["loss_actor"], -1.75, rtol=1e-6)
        # d loss / d W = -(1/2) * sum_b dQ1/da * s_b = -(1/2) * 2 * ([1, 2] + [0, 1]) = [-1, -3]
        grads = self.variant(
            jax.grad(lambda w: td3.td3_actor_loss(w, linear_actor, critic, linear_twin_critic, obs)[0])
        )(actor)
        np.testing.assert_allclose(grads, [[-1.0], [-3.0]], rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_is_policy_update_step(self):
        is_policy_step = self.variant(td3.is_policy_update_step, static_argnums=(1,))  # policy_delay: static
        assert [bool(is_policy_step(s, 2)) for s in range(6)] == [False, True] * 3
        assert [bool(is_policy_step(s, 3)) for s in range(6)] == [False, False, True] * 2
        assert all(bool(is_policy_step(s, 1)) for s in range(4))


def test_process_unscales_actions_and_discounts_at_termination():
    config = _config(TD3Params(gamma=0.9, actor_hidden=(4,), critic_hidden=(4,)))
    process = td3.process_experience_factory(config)
    experience = Experience(
        observation=jnp.zeros((3, 3)),
        action=jnp.array([[2.0], [-1.0], [0.0]]),
        reward=jnp.array([1.0, 2.0, 3.0]),
        done=jnp.array([False, True, False]),
        next_observation=jnp.ones((3, 3)),
        log_prob=jnp.zeros(3),
        truncated=jnp.array([False, False, True]),
    )
    batch = process(None, jax.random.PRNGKey(0), experience)
    np.testing.assert_allclose(batch.action, [[1.0], [-0.5], [0.0]])  # [-2, 2] -> [-1, 1]
    np.testing.assert_allclose(batch.discount, [0.9, 0.0, 0.9])  # truncation still bootstraps
    np.testing.assert_allclose(batch.reward, [1.0, 2.0, 3.0])


# ---------------------------------------------------------------------------------------------
# Delayed policy updates and Polyak targets
# ---------------------------------------------------------------------------------------------


def test_delayed_policy_update_and_polyak_targets():
    tau = 0.1
    config = _config(TD3Params(tau=tau, policy_delay=2, actor_hidden=(8,), critic_hidden=(8,)))
    state = td3.train_state_td3_factory(jax.random.PRNGKey(0), config)
    compute = jax.jit(td3.compute_gradients_factory(config))
    apply = jax.jit(td3.apply_gradients_factory(config))
    update = update_step_from_gradients(compute, apply)  # what update_step_factory composes

    # step 0: the critic is updated, the actor and both targets are not
    batch = _batch(jax.random.PRNGKey(1))
    grads, info = compute(state, jax.random.PRNGKey(2), batch)
    assert set(grads) == {"critic", "actor"}
    assert set(info) == {"loss_critic", "qvalue", "loss_actor"}
    assert all(not np.any(g) for g in _leaves(grads["actor"]))  # not computed on a skipped step
    new = apply(state, grads)
    assert int(new.critic.step) == 1 and int(new.actor.step) == 0
    assert not _equal(new.critic.params, state.critic.params)
    assert not _equal(new.critic.opt_state, state.critic.opt_state)
    assert _equal(new.actor.params, state.actor.params)
    assert _equal(new.actor.opt_state, state.actor.opt_state)  # the optimizer state does not advance
    assert _equal(new.actor.target_params, state.actor.target_params)
    assert _equal(new.critic.target_params, state.critic.target_params)
    # the composed update step does the same
    same, _ = update(state, jax.random.PRNGKey(2), batch)
    assert _equal(same, new)

    # step 1: a policy step: actor updated, both targets Polyak-averaged with tau
    before = new
    grads, _ = compute(before, jax.random.PRNGKey(3), _batch(jax.random.PRNGKey(4)))
    assert any(np.any(g) for g in _leaves(grads["actor"]))
    after = apply(before, grads)
    assert int(after.critic.step) == 2 and int(after.actor.step) == 1
    assert not _equal(after.actor.params, before.actor.params)
    assert not _equal(after.actor.opt_state, before.actor.opt_state)
    assert not _equal(after.critic.params, before.critic.params)
    for name in ("actor", "critic"):
        new_ts, old_ts = getattr(after, name), getattr(before, name)
        for target, params, old_target in zip(
            _leaves(new_ts.target_params), _leaves(new_ts.params), _leaves(old_ts.target_params)
        ):
            np.testing.assert_allclose(target, tau * params + (1 - tau) * old_target, rtol=1e-5, atol=1e-7)

    # over more steps: the actor is updated once every policy_delay critic updates
    key = jax.random.PRNGKey(5)
    for i in range(4):
        key, k1, k2 = jax.random.split(key, 3)
        previous = after
        after, _ = update(after, k1, _batch(k2))
        assert _equal(after.actor.params, previous.actor.params) == (i % 2 == 0)
    assert int(after.critic.step) == 6 and int(after.actor.step) == 3


# ---------------------------------------------------------------------------------------------
# Exploration
# ---------------------------------------------------------------------------------------------


def test_random_actions_before_start_step_without_recompiling():
    config = _config(TD3Params(start_step=100, exploration_noise=0.0, actor_hidden=(8,), critic_hidden=(8,)))
    state = td3.train_state_td3_factory(jax.random.PRNGKey(0), config)
    explore_fn = td3.explore_factory(config)
    obs = jnp.zeros((2000, 3))  # the same observation: the policy gives one action
    key = jax.random.PRNGKey(1)

    random_actions, log_probs = explore_fn(state, key, obs, exploration_noise=np.float32(0.0), env_step=np.int32(99))
    assert random_actions.shape == (2000, 1) and log_probs.shape == (2000,)
    assert np.all(np.asarray(log_probs) == 0.0)
    a = np.asarray(random_actions)
    assert np.all((a >= -2.0) & (a <= 2.0))
    assert abs(a.mean()) < 0.15 and abs(a.std() - 4.0 / np.sqrt(12.0)) < 0.1  # uniform on [-2, 2]

    policy_actions, _ = explore_fn(state, key, obs, exploration_noise=np.float32(0.0), env_step=np.int32(100))
    p = np.asarray(policy_actions)
    assert np.all(p == p[0])  # no noise: the policy's action everywhere

    # a traced env_step works, and the flag flipping does not recompile
    assert explore_fn._cache_size() == 1
    traced = jax.jit(lambda s: explore_fn(state, key, obs, exploration_noise=0.0, env_step=s)[0])
    np.testing.assert_array_equal(traced(jnp.int32(5)), a)
    np.testing.assert_array_equal(traced(jnp.int32(500)), p)


def test_explore_and_select_action_in_env_units():
    config = _config(TD3Params(start_step=0, exploration_noise=0.5, actor_hidden=(8,), critic_hidden=(8,)))
    agent = TD3("td3-explore", config, run_dir="unused")
    obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    greedy1, lp = agent.select_action(obs)
    greedy2, _ = agent.select_action(obs)
    assert greedy1.shape == (5, 1) and lp.shape == (5,)
    np.testing.assert_array_equal(greedy1, greedy2)  # deterministic
    pi = agent.state.actor.apply_fn(agent.state.actor.params, obs)
    np.testing.assert_allclose(greedy1, 2.0 * pi, rtol=1e-6)  # [-1, 1] scaled to [-2, 2]
    agent.env_step = 10
    noisy, _ = agent.explore(obs)
    assert not np.allclose(noisy, greedy1)
    assert np.all(np.abs(np.asarray(noisy)) <= 2.0)
    agent.env_step = 20  # a different step does not recompile
    agent.explore(obs)
    assert agent._act_jit._cache_size() == 2  # one exploring, one deterministic


# ---------------------------------------------------------------------------------------------
# Refusals and validation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Discrete(3),
        gym.spaces.MultiDiscrete([2, 3]),
        gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32),
        gym.spaces.Box(-np.inf, np.inf, (1,), np.float32),
    ],
)
def test_refuses_action_space(space):
    config = _config(action_space=space)
    with pytest.raises(ValueError, match="TD3") as error:
        TD3("td3-refuse", config, run_dir="unused")
    assert str(space) in str(error.value) and "Box" in str(error.value)


def test_refuses_other_params():
    config = _config()
    config.algo_params = dataclasses.make_dataclass("Other", [("gamma", float, 0.9)])()
    with pytest.raises(TypeError, match="algo_params"):
        TD3("td3-refuse", config, run_dir="unused")


@pytest.mark.parametrize(
    "field,value",
    [
        ("gamma", 1.5),
        ("gamma", -0.1),
        ("tau", 0.0),
        ("tau", 1.5),
        ("exploration_noise", -0.1),
        ("exploration_noise", float("inf")),  # NaN losses from the first update
        ("policy_noise", -0.2),
        ("policy_noise", float("inf")),
        ("noise_clip", -0.5),
        ("policy_delay", 0),
        ("start_step", -1),
        ("skip_steps", 0),
        ("actor_hidden", (0, 8)),
        ("critic_hidden", (8, -1)),
    ],
)
def test_rejects_params_value(field, value):
    with pytest.raises(ValueError, match=f"algo_params.{field}"):
        TD3Params(**{field: value})


def test_an_infinite_noise_clip_means_no_clipping():
    assert TD3Params(noise_clip=float("inf")).noise_clip == float("inf")
    out = td3.td3_target_actions(jax.random.PRNGKey(0), jnp.zeros((1000, 1)), policy_noise=0.3, noise_clip=float("inf"))
    assert np.all(np.isfinite(out)) and 0.1 < float(np.std(out)) < 0.5  # N(0, 0.3) clipped to [-1, 1] only


@pytest.mark.parametrize("field,value", [("policy_delay", 1.5), ("gamma", "0.9"), ("actor_hidden", 64)])
def test_rejects_params_type(field, value):
    with pytest.raises(TypeError, match=f"algo_params.{field}"):
        TD3Params(**{field: value})


def test_config_yaml_round_trip():
    config = _config(TD3Params(actor_hidden=(32, 16), policy_delay=3))
    loaded = cfg.AlgoConfig.from_yaml(config.to_yaml())
    assert loaded.algo_params == config.algo_params


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def _pendulum_config(env, seed: int, n_env_steps: int) -> cfg.AlgoConfig:
    params = TD3Params(start_step=200, actor_hidden=(32, 32), critic_hidden=(32, 32))
    return cfg.AlgoConfig(
        seed=seed,
        algo_params=params,
        update_cfg=cfg.UpdateConfig(learning_rate=1e-3, max_grad_norm=None, max_buffer_size=5000, batch_size=32),
        train_cfg=cfg.TrainConfig(n_env_steps=n_env_steps),
        env_cfg=cfg.EnvConfig(
            task_name="Pendulum-v1",
            observation_space=env.single_observation_space,
            action_space=gym.make("Pendulum-v1").action_space,  # make_vec_env's ClipAction hides the bounds
            n_envs=env.num_envs,
        ),
    )


@pytest.mark.slow
def test_training_smoke_run_is_deterministic():
    def run(name):
        env = make_vec_env("Pendulum-v1", 2)
        agent = TD3("td3-smoke", _pendulum_config(env, seed=3, n_env_steps=1200), run_dir=f"smoke-{name}")
        return agent, agent.train(env, 1200)

    (a, stats_a), (b, stats_b) = run("a"), run("b")
    assert stats_a.env_steps == 1200
    assert stats_a.n_updates == 501  # at steps 200, 202, ..., 1200
    assert int(a.state.critic.step) == 501 and int(a.state.actor.step) == 250  # every second critic update
    assert len(stats_a.episode_returns) == 6  # 600 steps per env: three 200-step episodes each
    assert np.all(np.isfinite(stats_a.episode_returns))
    assert all(np.all(np.isfinite(x)) for x in _leaves(a.state))
    assert stats_a.episode_returns == stats_b.episode_returns
    assert _equal(a.state, b.state)  # the same seed: bit-identical parameters
