"""DDPG (``kitae train ddpg``): its target and losses against hand-computed values under ``jit`` and
``vmap`` (TD3's functions with one critic, no smoothing, no delay), the Ornstein-Uhlenbeck noise
and its reset at episode starts, the spaces and settings it refuses, determinism for a seed."""

from __future__ import annotations

import json

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kitae.config as cfg
from kitae.algos.collections import td3
from kitae.algos.collections.ddpg import DDPG, DDPGParams, ou_noise_step
from kitae.cli import main
from kitae.loops.collect import compiled_steps
from kitae.loops.host import HostCollector
from kitae.runs import preset_agent
from tests._determinism import assert_trained_and_seeded
from tests._small import small

P = DDPGParams()

# Hand-computed (see test_target_and_losses_by_hand): a linear actor pi(s) = w * s and a linear
# critic Q(s, a) = alpha * s + beta * a.
S = jnp.array([[1.0], [2.0]])
A = jnp.array([[0.5], [-0.5]])
S_NEXT = jnp.array([[0.0], [1.0]])
R = jnp.array([1.0, 2.0])
DISCOUNT = jnp.array([0.9, 0.0])  # the second transition terminated


def actor_apply(params, observations):
    return params["w"] * observations


def critic_apply(params, observations, actions):
    return (params["alpha"] * observations + params["beta"] * actions)[:, 0][None]  # one critic: (1, B)


def losses(actor, critic, actor_target, critic_target):
    targets = td3.td3_targets(
        jax.random.PRNGKey(0), actor_apply, actor_target, critic_apply, critic_target, S_NEXT, R, DISCOUNT,
        P.policy_noise, P.noise_clip,
    )  # fmt: skip
    critic_loss, _ = td3.td3_critic_loss(critic, critic_apply, S, A, targets)
    actor_loss, _ = td3.td3_actor_loss(actor, actor_apply, critic, critic_apply, S)
    return targets, critic_loss, actor_loss


ACTOR, CRITIC = {"w": jnp.array(0.2)}, {"alpha": jnp.array(0.5), "beta": jnp.array(1.0)}
ACTOR_T, CRITIC_T = {"w": jnp.array(0.5)}, {"alpha": jnp.array(1.0), "beta": jnp.array(2.0)}


def test_target_and_losses_by_hand_under_jit_and_vmap():
    # pi_targ(s') = (0, 0.5); Q_targ(s', pi_targ(s')) = (0 + 0, 1 + 1) = (0, 2)
    # y = r + discount * Q_targ = (1 + 0.9 * 0, 2 + 0 * 2) = (1, 2)
    # Q(s, a) = (0.5 + 0.5, 1 - 0.5) = (1, 0.5): critic loss mean(0^2, 1.5^2) = 1.125
    # pi(s) = (0.2, 0.4); Q(s, pi(s)) = (0.7, 1.4): actor loss -1.05
    assert (P.n_critics, P.policy_noise, P.noise_clip, P.policy_delay) == (1, 0.0, 0.0, 1)
    for fn in (losses, jax.jit(losses)):
        targets, critic_loss, actor_loss = fn(ACTOR, CRITIC, ACTOR_T, CRITIC_T)
        np.testing.assert_allclose(np.asarray(targets), [1.0, 2.0], rtol=1e-6)
        np.testing.assert_allclose(float(critic_loss), 1.125, rtol=1e-6)
        np.testing.assert_allclose(float(actor_loss), -1.05, rtol=1e-6)
    doubled = [jax.tree_util.tree_map(lambda x: jnp.stack([x, 2 * x]), t) for t in (ACTOR, CRITIC, ACTOR_T, CRITIC_T)]
    _, critic_losses, actor_losses = jax.vmap(losses)(*doubled)
    # doubled parameters: y = (1, 2 + 0) = (1, 2) again (the discount-0 row) but pi_targ(s') = (0, 1),
    # Q_targ(s', .) = 2 * 1 + 4 * 1 = 6 for row 2 (discount 0: unused): y = (1, 2);
    # Q(s, a) = (1 + 1, 2 - 1) = (2, 1): critic loss mean(1, 1) = 1; pi(s) = (0.4, 0.8),
    # Q(s, pi(s)) = (1 + 0.8, 2 + 1.6) = (1.8, 3.6): actor loss -2.7
    np.testing.assert_allclose(np.asarray(critic_losses), [1.125, 1.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(actor_losses), [-1.05, -2.7], rtol=1e-6)


def test_the_ornstein_uhlenbeck_step():
    x = jnp.array([[1.0], [2.0]])
    no_noise = ou_noise_step(jax.random.PRNGKey(0), x, jnp.array([False, False]), 0.0, 0.15, 0.01)
    np.testing.assert_allclose(np.asarray(no_noise), [[1.0 - 0.0015], [2.0 - 0.003]], rtol=1e-6)  # x (1 - theta dt)
    restarted = ou_noise_step(jax.random.PRNGKey(0), x, jnp.array([True, False]), 0.0, 0.15, 0.01)
    np.testing.assert_allclose(np.asarray(restarted), [[0.0], [2.0 - 0.003]], rtol=1e-6)
    draws = ou_noise_step(jax.random.PRNGKey(1), jnp.zeros((20_000, 1)), jnp.zeros(20_000, bool), 0.3, 0.15, 0.01)
    np.testing.assert_allclose(float(jnp.std(draws)), 0.3 * 0.1, rtol=0.03)  # sigma sqrt(dt) from rest


def _agent(tmp_path, env_id="Pendulum-v1", sets=(), n_envs=2):
    return preset_agent("ddpg", env_id, steps=400, n_envs=n_envs, run_dir=tmp_path, sets=list(sets))


def test_ornstein_uhlenbeck_noise_is_carried_and_starts_from_rest_at_episode_starts(tmp_path):
    agent, env = _agent(tmp_path, sets=["algo_params.noise_type=ornstein_uhlenbeck", "algo_params.start_step=0"])
    assert agent.recurrent and agent.initial_hidden(2).shape == (2, 1)
    acting = agent.acting_params(agent.state)
    obs, _ = env.reset(seed=0)
    key = jax.random.PRNGKey(3)
    from_rest = agent.act_recurrent(acting, key, obs, jnp.zeros((2, 1)), jnp.ones(2, bool), 0)
    from_anything = agent.act_recurrent(acting, key, obs, jnp.full((2, 1), 5.0), jnp.ones(2, bool), 0)
    for a, b in zip(from_rest, from_anything, strict=True):  # where an episode starts, the old noise is gone
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    carried = agent.act_recurrent(acting, key, obs, jnp.full((2, 1), 5.0), jnp.zeros(2, bool), 0)
    assert not np.allclose(np.asarray(carried[2]), np.asarray(from_rest[2]))
    collector = HostCollector(agent, env, False)
    collector.reset(0)
    act, state = compiled_steps(agent).act, {"key": jax.random.PRNGKey(1)}
    for t in range(210):  # Pendulum's episodes end (truncated) at 200 steps
        experience, _, state["key"] = collector.step(act, acting, state["key"], 2 * t, 2 * t + 2)
        ended = np.logical_or(experience.done, experience.truncated)
        assert np.array_equal(np.asarray(collector.memory.start), ended)
    env.close()


def test_what_ddpg_cannot_handle_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"DDPG cannot act in action space Discrete\(2\)"):
        _agent(tmp_path, "CartPole-v1")
    env = gym.make("Pendulum-v1")
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=DDPGParams(noise_type="ornstein_uhlenbeck"),
        update_cfg=cfg.UpdateConfig(),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig("two-pendulums", env.observation_space, env.action_space, n_agents=2),
    )
    with pytest.raises(ValueError, match="noise_type='ornstein_uhlenbeck' is not allowed in a multi-agent"):
        DDPG("ddpg", config, run_dir=str(tmp_path / "ma"))
    inf = float("inf")
    for field, value in (
        ("noise_type", "pink"),
        ("ou_dt", 0.0),
        ("tau", 0.0),
        ("exploration_noise", -1.0),
        ("exploration_noise", inf),  # NaN losses from the first update
        ("ou_theta", inf),
    ):
        with pytest.raises(ValueError, match=f"algo_params.{field}"):
            DDPGParams(**{field: value})


def test_ddpg_acts_without_its_hidden_state_only_with_normal_noise(tmp_path):
    agent, env = _agent(tmp_path, sets=["algo_params.noise_type=ornstein_uhlenbeck"])
    with pytest.raises(TypeError, match="acts with act_recurrent"):
        agent.act(agent.acting_params(agent.state), jax.random.PRNGKey(0), np.zeros((2, 3)), 0)
    env.close()


@pytest.mark.parametrize(("env_id", "noise"), [("Pendulum-v1", "normal"), ("gymnax:Pendulum-v1", "ornstein_uhlenbeck")])
def test_training_is_deterministic_for_a_seed(tmp_path, env_id, noise):
    """Two runs of one seed were compared, their exit codes ignored: runs that failed alike, or
    that did not train, passed. Now each run succeeds, its trained state (the checkpoint the
    summary's fingerprint is of) is not the freshly built one, and another seed builds another
    state. (Not a third run of another seed: one run of the gymnax OU case takes ~11 s.)"""
    sets = ["algo_params.start_step=200", f"algo_params.noise_type={noise}"]
    sets += [s for s in small("ddpg") if s != "--set"]
    fingerprints = []
    for name in ("a", "b"):
        argv = ["train", "ddpg", env_id, "--steps", "600", "--run-dir", str(tmp_path / name), "--quiet"]
        assert main([*argv, *(arg for s in sets for arg in ("--set", s))]) == 0
        fingerprints.append(json.loads((tmp_path / name / "summary.json").read_text())["state_fingerprint"])
    assert fingerprints[0] == fingerprints[1]
    assert_trained_and_seeded(tmp_path / "a", fingerprints[0], "ddpg", env_id, 600, sets)
