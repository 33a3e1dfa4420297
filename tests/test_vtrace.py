"""V-trace (``kitae.timesteps.compute_vtrace``): against ``rlax.vtrace_td_error_and_advantage`` on
random inputs, equal to the on-policy n-step return when every importance weight is 1, by hand on a
short trajectory, truncation handled like GAE, under ``jit`` and ``vmap``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from kitae.timesteps import compute_gae, compute_vtrace


def _trajectory(seed, t=32, p_end=0.1):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=t + 1).astype(np.float32)  # V(s_0) .. V(s_T): one episode's values follow on
    return dict(
        rewards=rng.normal(size=t).astype(np.float32),
        values=values[:-1],
        next_values=values[1:],
        terminated=rng.random(t) < p_end,
        log_rhos=rng.normal(scale=0.7, size=t).astype(np.float32),
    )


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("lambda_", "rho_bar", "pg_rho_bar"), [(1.0, 1.0, 1.0), (0.9, 2.0, 0.5), (0.5, 0.8, 3.0)])
def test_vtrace_matches_rlax_on_random_inputs(seed, lambda_, rho_bar, pg_rho_bar):
    x = _trajectory(seed)
    gamma = 0.97
    vs, pg = jax.jit(compute_vtrace, static_argnames=())(
        x["rewards"], x["values"], x["next_values"], x["terminated"], None, x["log_rhos"], gamma,
        lambda_, rho_bar, 1.0, pg_rho_bar,
    )  # fmt: skip
    ref = rlax.vtrace_td_error_and_advantage(
        x["values"],
        x["next_values"],
        x["rewards"],
        jnp.asarray(gamma * (1.0 - x["terminated"]), jnp.float32),
        jnp.exp(x["log_rhos"]),
        lambda_=lambda_,
        clip_rho_threshold=rho_bar,
        clip_pg_rho_threshold=pg_rho_bar,
    )  # rlax's trace clip is 1: c_bar = 1
    np.testing.assert_allclose(vs, ref.errors + x["values"], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(pg, ref.pg_advantage, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_with_every_weight_one_vtrace_is_the_n_step_return(seed):
    x = _trajectory(seed)
    truncated = np.random.default_rng(seed + 10).random(32) < 0.05
    vs, pg = compute_vtrace(
        x["rewards"], x["values"], x["next_values"], x["terminated"], truncated, np.zeros(32, np.float32), 0.99
    )
    advantages, returns = compute_gae(
        x["rewards"], x["values"], x["next_values"], x["terminated"], truncated, 0.99, 1.0
    )
    np.testing.assert_allclose(vs, returns, atol=1e-5)
    np.testing.assert_allclose(pg, advantages, atol=1e-5)


def test_vtrace_by_hand_with_a_truncation():
    # gamma 0.5; steps 0, 1 in one episode (cut at step 1, its final observation worth 4), step 2 the next
    # rho = (2, 0.5, 1): clipped at 1 -> (1, 0.5, 1); c_bar = 1 -> c = (1, 0.5, 1)
    rewards = jnp.array([1.0, 2.0, 3.0])
    values = jnp.array([0.0, 1.0, 2.0])
    next_values = jnp.array([1.0, 4.0, 6.0])
    truncated = jnp.array([False, True, False])
    log_rhos = jnp.log(jnp.array([2.0, 0.5, 1.0]))
    # delta = (1 * (1 + 0.5 - 0), 0.5 * (2 + 2 - 1), 1 * (3 + 3 - 2)) = (1.5, 1.5, 4)
    # A_2 = 4; A_1 = 1.5 (the cut stops the trace); A_0 = 1.5 + 0.5 * 1 * 1.5 = 2.25
    # vs = (2.25, 2.5, 6); q_0 = 1 + 0.5 * vs_1 = 2.25 (lambda 1), q_1 = 2 + 0.5 * 4 = 4, q_2 = 3 + 0.5 * 6 = 6
    # pg = (1 * (2.25 - 0), 0.5 * (4 - 1), 1 * (6 - 2)) = (2.25, 1.5, 4)
    for fn in (compute_vtrace, jax.jit(compute_vtrace)):
        vs, pg = fn(rewards, values, next_values, jnp.zeros(3, bool), truncated, log_rhos, 0.5)
        np.testing.assert_allclose(vs, [2.25, 2.5, 6.0], rtol=1e-6)
        np.testing.assert_allclose(pg, [2.25, 1.5, 4.0], rtol=1e-6)
    # c_bar = 0.25 shortens the trace: A_0 = 1.5 + 0.5 * 0.25 * 1.5
    vs, _ = compute_vtrace(rewards, values, next_values, jnp.zeros(3, bool), truncated, log_rhos, 0.5, c_bar=0.25)
    np.testing.assert_allclose(vs[0], 1.5 + 0.5 * 0.25 * 1.5, rtol=1e-6)
    # vmapped over two environments (time-major columns in a vmap over axis 1)
    both = jax.vmap(lambda r: compute_vtrace(r, values, next_values, jnp.zeros(3, bool), truncated, log_rhos, 0.5)[0])(
        jnp.stack([rewards, rewards + 1.0])
    )
    np.testing.assert_allclose(both[0], [2.25, 2.5, 6.0], rtol=1e-6)
    # rewards + 1: deltas + (1, 0.5, 1) = (2.5, 2, 5); A_1 = 2, A_0 = 2.5 + 0.5 * 2 = 3.5; vs = (3.5, 3, 7)
    np.testing.assert_allclose(both[1], [3.5, 3.0, 7.0], rtol=1e-6)


@pytest.mark.parametrize(("name", "value"), [("rho_bar", 0.0), ("c_bar", -1.0), ("pg_rho_bar", 0.0), ("lambda_", 1.5)])
def test_bad_clips_are_refused(name, value):
    kwargs = {name: value}
    with pytest.raises(ValueError, match=name):
        compute_vtrace(jnp.zeros(3), jnp.zeros(3), jnp.zeros(3), jnp.zeros(3, bool), None, jnp.zeros(3), 0.9, **kwargs)


# ---------------------------------------------------------------------------------------------
# PPO with V-trace, and the asynchronous distributed executor's default
# ---------------------------------------------------------------------------------------------


def _ppo_and_rollout(estimator, t=16, e=3):
    import gymnasium as gym

    import kitae.config as cfg
    from kitae.algos.collections.ppo import PPO, PPOParams
    from kitae.buffer import Experience

    env = gym.make("CartPole-v1")
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=PPOParams(advantage_estimator=estimator, gae_lambda=0.9),
        update_cfg=cfg.UpdateConfig(max_buffer_size=t, batch_size=16),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig("CartPole-v1", env.observation_space, env.action_space, n_envs=e),
    )
    agent = PPO("ppo", config, run_dir="unused")
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(t + 1, e, 4)).astype(np.float32)
    actions = rng.integers(0, 2, size=(t, e))
    done = rng.random((t, e)) < 0.1
    truncated = (rng.random((t, e)) < 0.05) & ~done
    dist = agent.state.actor_critic.apply_fn(agent.state.actor_critic.params, jnp.asarray(obs[:-1]), method="policy")
    on_policy = np.asarray(dist.log_prob(jnp.asarray(actions)))
    rollout = Experience(
        observation=jnp.asarray(obs[:-1]),
        action=jnp.asarray(actions, jnp.int32),
        reward=jnp.asarray(rng.normal(size=(t, e)), jnp.float32),
        done=jnp.asarray(done),
        next_observation=jnp.asarray(obs[1:]),
        log_prob=jnp.asarray(on_policy),
        truncated=jnp.asarray(truncated),
    )
    return agent, rollout, on_policy


def _process(agent, rollout):
    return jax.jit(agent.process_experience_pipeline.run)(agent.state, jax.random.PRNGKey(0), rollout)


def test_ppo_vtrace_on_its_own_rollout_is_gae():
    # with every importance weight 1 (the rollout's log-probs are the current policy's), V-trace's
    # lambda-trace is GAE(lambda): the same targets and advantages
    vtrace_agent, rollout, _ = _ppo_and_rollout("vtrace")
    gae_agent, _, _ = _ppo_and_rollout("gae")
    a, b = _process(vtrace_agent, rollout), _process(gae_agent, rollout)
    np.testing.assert_allclose(a.advantage, b.advantage, atol=1e-5)
    np.testing.assert_allclose(a.return_, b.return_, atol=1e-5)
    np.testing.assert_allclose(a.log_prob, b.log_prob, atol=1e-6)


def test_ppo_vtrace_corrects_a_rollout_of_another_policy():
    agent, rollout, on_policy = _ppo_and_rollout("vtrace")
    behaviour = np.log(np.full(on_policy.shape, 0.5, np.float32))  # a uniform behaviour policy
    processed = _process(agent, rollout._replace(log_prob=jnp.asarray(behaviour)))
    # the batch's reference log-probs are the current policy's, and the targets V-trace's
    np.testing.assert_allclose(np.asarray(processed.log_prob).reshape(16, 3), on_policy, atol=1e-6)  # (T, E) rows
    values = agent.state.actor_critic.apply_fn(agent.state.actor_critic.params, rollout.observation, method="value")
    next_values = agent.state.actor_critic.apply_fn(
        agent.state.actor_critic.params, rollout.next_observation, method="value"
    )
    vs, pg = compute_vtrace(
        rollout.reward, values, next_values, rollout.done, rollout.truncated, on_policy - behaviour, 0.99, 0.9
    )
    np.testing.assert_allclose(np.asarray(processed.return_).reshape(16, 3), vs, atol=1e-5)
    np.testing.assert_allclose(np.asarray(processed.advantage).reshape(16, 3), pg, atol=1e-5)


def test_asynchronous_collection_picks_vtrace_for_ppo_unless_told_otherwise():
    from kitae.algos.collections.ppo import PPOParams
    from kitae.algos.collections.recurrent_ppo import RecurrentPPOParams
    from kitae.algos.collections.rnd_ppo import RNDPPOParams
    from kitae.envs.make import EnvSpec
    from kitae.runs.presets import resolve

    spec, layout = EnvSpec.parse("CartPole-v1"), {"distributed": {"workers": 2, "async_collection": True}}
    assert resolve("ppo", PPOParams, spec, overrides=layout)["algo_params"]["advantage_estimator"] == "vtrace"
    told = resolve("ppo", PPOParams, spec, overrides=layout, sets=["algo_params.advantage_estimator=gae"])
    assert told["algo_params"]["advantage_estimator"] == "gae"
    synchronous = {"distributed": {"workers": 2}}
    assert "advantage_estimator" not in resolve("ppo", PPOParams, spec, overrides=synchronous)["algo_params"]
    rnd = resolve("rnd_ppo", RNDPPOParams, EnvSpec.parse("MountainCar-v0"), overrides=layout)
    assert "advantage_estimator" not in rnd["algo_params"]  # RND-PPO's processing has no V-trace
    with pytest.raises(
        ValueError, match=r"algo_params.advantage_estimator='vtrace' is not allowed; allowed: one of \('gae',\)"
    ):
        RecurrentPPOParams(advantage_estimator="vtrace")
    with pytest.raises(ValueError, match="algo_params.vtrace_c_bar=0.0 is not allowed"):
        PPOParams(vtrace_c_bar=0.0)
