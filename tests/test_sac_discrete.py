"""Discrete SAC (``kitae train sac`` on a ``Discrete`` space): its target and losses against
hand-computed values under ``jit`` and ``vmap``, the space check, acting, and determinism for a seed
in the host and compiled loops."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kitae.config as cfg
from kitae.algos.collections.sac import SAC, SACParams
from kitae.algos.collections.sac_discrete import (
    discrete_sac_actor_loss,
    discrete_sac_critic_loss,
    discrete_sac_targets,
    discrete_sac_temperature_loss,
    target_entropy,
)
from kitae.cli import main
from kitae.runs import preset_agent
from tests._determinism import assert_trained_and_seeded

LN = math.log
Q = jnp.array([[[1.0, 3.0]], [[2.0, 0.0]]])  # two critics, one state, two actions: (N, B, n)
PROBS = jnp.array([[0.25, 0.75]])


def losses(q, probs):
    targets = discrete_sac_targets(
        jnp.array([1.0]), jnp.array([0.0]), jnp.full((1, 2), 0.5), jnp.log(jnp.full((1, 2), 0.5)),
        jnp.array([[[1.0, 2.0]], [[2.0, 0.0]]]), 0.1, 0.9,
    )  # fmt: skip
    critic = discrete_sac_critic_loss(q, jnp.array([1]), jnp.array([1.5]))
    actor = discrete_sac_actor_loss(probs, jnp.log(probs), q, 0.1)
    temperature = discrete_sac_temperature_loss(jnp.log(0.1), probs, jnp.log(probs), 0.2)
    return targets, critic, actor, temperature


def test_target_and_losses_by_hand_under_jit_and_vmap():
    # target: min_i Q'(s', .) = (1, 0); V = 0.5 (1 - 0.1 ln 0.5) + 0.5 (0 - 0.1 ln 0.5); y = 1 + 0.9 V
    want_target = 1.0 + 0.9 * (0.5 - 0.1 * LN(0.5))
    # critic: action 1 -> Q_1 = 3, Q_2 = 0 against y = 1.5: 0.5 (1.5^2 + 1.5^2) = 2.25
    # actor: min_i Q(s, .) = (1, 0): 0.25 (0.1 ln 0.25 - 1) + 0.75 (0.1 ln 0.75)
    want_actor = 0.25 * (0.1 * LN(0.25) - 1.0) + 0.75 * (0.1 * LN(0.75))
    # temperature: -ln 0.1 (0.25 ln 0.25 + 0.75 ln 0.75 + 0.2)
    want_temperature = -LN(0.1) * (0.25 * LN(0.25) + 0.75 * LN(0.75) + 0.2)
    for fn in (losses, jax.jit(losses)):
        targets, critic, actor, temperature = fn(Q, PROBS)
        np.testing.assert_allclose(np.asarray(targets), [want_target], rtol=1e-6)
        np.testing.assert_allclose(float(critic), 2.25, rtol=1e-6)
        np.testing.assert_allclose(float(actor), want_actor, rtol=1e-6)
        np.testing.assert_allclose(float(temperature), want_temperature, rtol=1e-6)
    _, critics, actors, _ = jax.vmap(losses)(jnp.stack([Q, 2 * Q]), jnp.stack([PROBS, PROBS[:, ::-1]]))
    # doubled critics: Q_1 = 6, Q_2 = 0 -> 0.5 (4.5^2 + 1.5^2) = 11.25; reversed probs (0.75, 0.25),
    # min_i 2Q = (2, 0): 0.75 (0.1 ln 0.75 - 2) + 0.25 (0.1 ln 0.25)
    np.testing.assert_allclose(np.asarray(critics), [2.25, 11.25], rtol=1e-6)
    other = 0.75 * (0.1 * LN(0.75) - 2.0) + 0.25 * (0.1 * LN(0.25))
    np.testing.assert_allclose(np.asarray(actors), [want_actor, other], rtol=1e-6)


def test_the_actor_loss_moves_only_the_policy():
    grads = jax.grad(lambda q: discrete_sac_actor_loss(PROBS, jnp.log(PROBS), q, 0.1))(Q)
    assert float(jnp.abs(grads).sum()) == 0.0


def test_sac_on_a_discrete_space_is_discrete_sac(tmp_path):
    agent, env = preset_agent("sac", "CartPole-v1", steps=400, run_dir=tmp_path)
    assert agent.discrete
    np.testing.assert_allclose(target_entropy(agent.config), 0.3 * LN(2.0), rtol=1e-6)
    acting = agent.acting_params(agent.state)
    obs, _ = env.reset(seed=0)
    actions, log_probs = agent.act(acting, jax.random.PRNGKey(0), obs, 0)  # before start_step: uniform
    assert actions.dtype == jnp.int32 and set(np.asarray(actions).tolist()) <= {0, 1}
    np.testing.assert_allclose(np.asarray(log_probs), LN(0.5), rtol=1e-6)
    greedy, _ = agent.act(acting, jax.random.PRNGKey(0), obs, 10**6, deterministic=True)
    logits = agent.state.policy.apply_fn(agent.state.policy.params, obs).logits
    np.testing.assert_array_equal(np.asarray(greedy), np.argmax(np.asarray(logits), axis=-1))
    env.close()


def test_spaces_sac_cannot_handle_are_refused(tmp_path):
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=SACParams(),
        update_cfg=cfg.UpdateConfig(),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig("x", gym.spaces.Box(-1, 1, (4,)), gym.spaces.MultiDiscrete([2, 2])),
    )
    with pytest.raises(ValueError, match=r"SAC cannot act in the action space MultiDiscrete.*or a Discrete one"):
        SAC("sac", config, run_dir=str(tmp_path))
    with pytest.raises(ValueError, match="algo_params.target_entropy_scale"):
        SACParams(target_entropy_scale=0.0)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnax:CartPole-v1"])
def test_training_is_deterministic_for_a_seed(tmp_path, env_id):
    """Two runs of one seed were compared, their exit codes ignored: runs that failed alike, or
    that did not train, passed. Now each run succeeds, its trained state (the checkpoint the
    summary's fingerprint is of) is not the freshly built one, and another seed builds another
    state. (Not a third run of another seed: one run takes ~10 s.)"""
    fingerprints = []
    for name in ("a", "b"):
        argv = ["train", "sac", env_id, "--steps", "1600", "--run-dir", str(tmp_path / name), "--quiet"]
        assert main([*argv, "--set", "algo_params.start_step=400"]) == 0
        fingerprints.append(json.loads((tmp_path / name / "summary.json").read_text())["state_fingerprint"])
    assert fingerprints[0] == fingerprints[1]
    assert_trained_and_seeded(tmp_path / "a", fingerprints[0], "sac", env_id, 1600, ["algo_params.start_step=400"])
