"""RND-PPO (``kitae train rnd_ppo``): RND's maths (prediction error, intrinsic reward, predictor
loss, non-episodic GAE, two value heads, combined advantages) against hand-computed values under
``jit`` and ``vmap``; the running statistics against numpy and their order around the update; the
update made gradient step by gradient step with the hooks (the distributed executor's road); the
params and spaces it refuses; determinism for a seed and an exact resume."""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kitae.config as cfg
from kitae.algos.collections import get_algorithm, rnd_ppo
from kitae.algos.collections import ppo as ppo_module
from kitae.algos.collections.rnd_ppo import RNDPPO, RNDPPOParams
from kitae.algos.update import epoch_minibatches
from kitae.buffer import Experience
from kitae.cli import main
from kitae.distributed import AgentAlgorithm

pytestmark = pytest.mark.timeout(120)  # a hung compilation fails instead of stalling the run

OBS = gym.spaces.Box(low=np.array([-1.2, -0.07], np.float32), high=np.array([0.6, 0.07], np.float32))
ACTIONS = gym.spaces.Discrete(3)


def _config(params=None, *, observation_space=OBS, action_space=ACTIONS, n_envs=3, buffer=8, batch=8):
    return cfg.AlgoConfig(
        seed=0,
        algo_params=params if params is not None else RNDPPOParams(),
        update_cfg=cfg.UpdateConfig(learning_rate=1e-3, max_buffer_size=buffer, batch_size=batch, n_epochs=2),
        train_cfg=cfg.TrainConfig(n_env_steps=1000),
        env_cfg=cfg.EnvConfig("test", observation_space, action_space, n_envs=n_envs),
    )


def _rollout(seed, t=8, e=3, done_at=None):
    """A rollout ``(T, E, ...)`` of MountainCar-like observations (one end per column at
    ``done_at``, terminated in column 0, truncated in the others)."""
    rng = np.random.default_rng(seed)
    obs = rng.uniform([-1.2, -0.07], [0.6, 0.07], size=(t + 1, e, 2)).astype(np.float32)
    done = np.zeros((t, e), bool)
    truncated = np.zeros((t, e), bool)
    if done_at is not None:
        done[done_at, 0] = True
        truncated[done_at, 1:] = True
    return Experience(
        observation=jnp.asarray(obs[:-1]),
        action=jnp.asarray(rng.integers(0, 3, size=(t, e)), jnp.int32),
        reward=jnp.full((t, e), -1.0, jnp.float32),
        done=jnp.asarray(done),
        next_observation=jnp.asarray(obs[1:]),
        log_prob=jnp.full((t, e), np.log(1 / 3), jnp.float32),
        truncated=jnp.asarray(truncated),
    )


def _same_bits(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


@pytest.fixture(scope="module")
def agent():
    params = RNDPPOParams(normalize_observations=True, normalize_rewards=True, gamma=0.99)
    return RNDPPO("rnd", _config(params), run_dir="unused")


# ---------------------------------------------------------------------------------------------
# RND's maths, by hand, under jit and vmap
# ---------------------------------------------------------------------------------------------


def _both(fn, **jit_kwargs):
    return (fn, jax.jit(fn, **jit_kwargs))


def test_prediction_error_intrinsic_reward_and_predictor_loss_by_hand():
    predicted = jnp.array([[1.0, 2.0], [0.0, 0.0], [1.0, 1.0]])
    target = jnp.array([[0.0, 0.0], [1.0, 1.0], [-1.0, 1.0]])
    want_errors = np.array([(1 + 4) / 2, (1 + 1) / 2, (4 + 0) / 2])  # mean over features of squares
    statistics = ppo_module.RunningStatistics(jnp.float32(3.0), jnp.float32(4.0), jnp.float32(10.0))
    for error, normalize, loss in zip(
        *(_both(f) for f in (rnd_ppo.rnd_prediction_error, rnd_ppo.normalize_intrinsic_rewards, rnd_ppo.rnd_loss))
    ):
        errors = error(predicted, target)
        np.testing.assert_allclose(errors, want_errors, rtol=1e-6)
        # divided by the std of the intrinsic returns, sqrt(4 + 1e-8); the mean (3) is not subtracted
        np.testing.assert_allclose(normalize(errors, statistics), want_errors / 2.0, rtol=1e-6)
        np.testing.assert_allclose(loss(errors, jnp.array([True, False, True])), (2.5 + 2.0) / 2, rtol=1e-6)
        assert float(loss(errors, jnp.zeros(3, bool))) == 0.0  # no row kept: no loss
    # a batch of two minibatches under vmap: each row's own error and loss
    stacked_pred, stacked_target = jnp.stack([predicted, 2 * predicted]), jnp.stack([target, target])
    errors = jax.vmap(rnd_ppo.rnd_prediction_error)(stacked_pred, stacked_target)
    np.testing.assert_allclose(errors[1], [(4 + 16) / 2, (1 + 1) / 2, (9 + 1) / 2], rtol=1e-6)
    losses = jax.vmap(rnd_ppo.rnd_loss)(errors, jnp.array([[True, True, False], [False, True, True]]))
    np.testing.assert_allclose(losses, [(2.5 + 1.0) / 2, (1.0 + 5.0) / 2], rtol=1e-6)


def test_the_predictor_gradient_flows_only_through_the_kept_rows():
    predicted, target = jnp.array([[1.0, 2.0], [3.0, 0.0]]), jnp.zeros((2, 2))
    grad = jax.grad(lambda x: rnd_ppo.rnd_loss(rnd_ppo.rnd_prediction_error(x, target), jnp.array([True, False])))
    g = grad(predicted)
    np.testing.assert_allclose(g, [[1.0, 2.0], [0.0, 0.0]], rtol=1e-6)  # d/dx mean(x^2) = x (2 features)


def test_intrinsic_gae_by_hand_never_cuts():
    # next values V'_t = (1.0, 0.0, 2.0): values[1:] then the last next value; gamma = lambda = 0.5
    # delta_2 = 2 + 0.5 * 2 - 0 = 3;        A_2 = 3
    # delta_1 = 0 + 0.5 * 0 - 1 = -1;       A_1 = -1 + 0.25 * 3 = -0.25
    # delta_0 = 1 + 0.5 * 1 - 0.5 = 1;      A_0 = 1 + 0.25 * -0.25 = 0.9375
    rewards, values = jnp.array([1.0, 0.0, 2.0]), jnp.array([0.5, 1.0, 0.0])
    for fn in _both(rnd_ppo.intrinsic_gae):
        advantages, returns = fn(rewards, values, jnp.float32(2.0), 0.5, 0.5)
        np.testing.assert_allclose(advantages, [0.9375, -0.25, 3.0], rtol=1e-6)
        np.testing.assert_allclose(returns, [1.4375, 0.75, 3.0], rtol=1e-6)
    advantages, _ = jax.vmap(lambda r, v, last: rnd_ppo.intrinsic_gae(r, v, last, 0.5, 0.5))(
        jnp.stack([rewards, jnp.zeros(3)]), jnp.stack([values, jnp.zeros(3)]), jnp.array([2.0, 4.0])
    )
    # the second row: next values (0, 0, 4), rewards and values 0: A = (0.25 * 0.5, 0.25 * 2, 0.5 * 4)
    np.testing.assert_allclose(advantages, [[0.9375, -0.25, 3.0], [0.125, 0.5, 2.0]], rtol=1e-6)


def test_two_value_heads_and_combined_advantages_by_hand():
    p = RNDPPOParams(value_coef=0.5, entropy_coef=0.01, clip_coef=0.2)
    log_probs = jnp.array([-1.0, -0.5])  # ratios 1: the policy loss is -mean(advantages)
    inputs = dict(
        entropies=jnp.array([0.5, 0.7]),
        values=jnp.array([[1.0, 0.5], [2.0, 1.0]]),
        old_log_probs=log_probs,
        old_values=jnp.array([[0.5, 0.0], [2.1, 3.0]]),
        returns=jnp.array([[2.0, 1.5], [1.0, 0.0]]),
        advantages=jnp.array([1.0, 3.0]),
    )
    # extrinsic head clipped by 0.2 around the old values: clipped (0.7, 2.0); squared errors
    # max(1, 1.69) and max(1, 1): 0.5 * mean = 0.6725. The intrinsic head is not clipped (clipped it
    # would be 0.5 * mean(1.69, 7.84)): 0.5 * mean(1, 1) = 0.5.
    want_total = -2.0 + 0.5 * 0.6725 - 0.01 * 0.6 + 0.5 * 0.5
    for fn in _both(lambda *a: rnd_ppo.rnd_ppo_loss(p, 0.2, *a)):
        total, info = fn(log_probs, *inputs.values())
        np.testing.assert_allclose(total, want_total, rtol=1e-6)
        np.testing.assert_allclose(info["loss_value"], 0.6725, rtol=1e-6)
        np.testing.assert_allclose(info["loss_value_intrinsic"], 0.5, rtol=1e-6)
        np.testing.assert_allclose(info["loss_policy"], -2.0, rtol=1e-6)
        np.testing.assert_allclose(info["loss_total"], want_total, rtol=1e-6)
    doubled = {k: jnp.stack([v, v]) for k, v in inputs.items()}
    doubled["advantages"] = doubled["advantages"].at[1].set(jnp.array([-1.0, 1.0]))  # policy loss 0
    totals, _ = jax.vmap(lambda lp, *a: rnd_ppo.rnd_ppo_loss(p, 0.2, lp, *a))(
        jnp.stack([log_probs, log_probs]), *doubled.values()
    )
    np.testing.assert_allclose(totals, [want_total, want_total + 2.0], rtol=1e-6)
    for fn in _both(rnd_ppo.combine_advantages):
        np.testing.assert_allclose(fn(jnp.array([1.0, -2.0]), jnp.array([0.5, 3.0]), 2.0, 1.0), [2.5, -1.0])
        np.testing.assert_allclose(fn(jnp.array([1.0, -2.0]), jnp.array([0.5, 3.0]), 0.0, 0.5), [0.25, 1.5])


# ---------------------------------------------------------------------------------------------
# Processing and statistics on the agent's own networks
# ---------------------------------------------------------------------------------------------


def test_processing_intrinsic_returns_ignore_episode_ends_extrinsic_ones_do_not(agent):
    state = jax.jit(agent.prepare_update)(agent.state, _rollout(1))  # statistics that are not the identity
    process = jax.jit(agent.process_experience_fn)
    column = jax.tree_util.tree_map(lambda x: x[:, 0], _rollout(2, t=6, e=1, done_at=2))
    uncut = column._replace(done=jnp.zeros_like(column.done), truncated=jnp.zeros_like(column.truncated))
    with_end, without = process(state, jax.random.PRNGKey(0), column), process(state, jax.random.PRNGKey(0), uncut)
    np.testing.assert_array_equal(with_end.return_[:, 1], without.return_[:, 1])  # intrinsic: not cut
    assert not np.allclose(with_end.return_[:, 0], without.return_[:, 0])  # extrinsic: cut at the end
    # the intrinsic part by hand from the network's own values and errors
    p = agent.config.algo_params
    values = np.asarray(with_end.value)
    errors, _ = rnd_ppo._rnd_errors(agent.config)(state, column.next_observation)
    rewards = np.asarray(errors) / np.sqrt(float(state.intrinsic_return_statistics.var) + 1e-8)
    ac = state.actor_critic
    last = ac.apply_fn(
        ac.params,
        ppo_module.normalize_with_statistics(column.next_observation[-1:], state.observation_statistics, 10.0),
        method="value",
    )[0, 1]
    next_values = np.append(values[1:, 1], float(last))
    advantages = np.zeros(6)
    running, gamma, lambda_ = 0.0, p.intrinsic_gamma, p.gae_lambda
    for t in reversed(range(6)):
        running = rewards[t] + gamma * next_values[t] - values[t, 1] + gamma * lambda_ * running
        advantages[t] = running
    np.testing.assert_allclose(with_end.return_[:, 1], advantages + values[:, 1], rtol=1e-4, atol=1e-5)
    ext_advantages = np.asarray(with_end.return_[:, 0]) - values[:, 0]
    np.testing.assert_allclose(with_end.advantage, 2.0 * ext_advantages + advantages, rtol=1e-4, atol=1e-5)


def test_running_statistics_match_numpy_over_two_rollouts(agent):
    errors_fn = rnd_ppo._rnd_errors(agent.config)
    update = jax.jit(lambda s, obs: rnd_ppo.update_rnd_statistics(s, obs, errors_fn, 0.9))
    state, seen_obs, seen_returns, running = agent.state, [], [], np.zeros(3)
    for seed in (3, 4):
        rollout = _rollout(seed, t=5, done_at=1)  # an episode end: the intrinsic return runs on
        state = update(state, rollout.next_observation)
        seen_obs.append(np.asarray(rollout.next_observation).reshape(-1, 2))
        np.testing.assert_allclose(state.rnd_observation_statistics.mean, np.concatenate(seen_obs).mean(0), rtol=1e-5)
        np.testing.assert_allclose(state.rnd_observation_statistics.var, np.concatenate(seen_obs).var(0), rtol=1e-4)
        errors, _ = errors_fn(state, rollout.next_observation)  # with the statistics just merged
        for t in range(5):
            running = 0.9 * running + np.asarray(errors[t])
            seen_returns.append(running.copy())
        np.testing.assert_allclose(state.intrinsic_discounted_returns, running, rtol=1e-5)
        returns = np.concatenate(seen_returns)
        np.testing.assert_allclose(state.intrinsic_return_statistics.mean, returns.mean(), rtol=1e-4)
        np.testing.assert_allclose(state.intrinsic_return_statistics.var, returns.var(), rtol=1e-3)
        assert float(state.intrinsic_return_statistics.count) == len(returns)


def test_hooks_order_rnd_statistics_before_the_update_the_policys_after(agent):
    rollout = _rollout(5)
    prepared = jax.jit(agent.prepare_update)(agent.state, rollout)
    # before processing: RND's statistics and PPO's reward statistics; not the policy's observations
    assert float(prepared.rnd_observation_statistics.count) == 24.0
    assert float(prepared.intrinsic_return_statistics.count) == 24.0
    assert float(prepared.return_statistics.count) == 24.0
    assert float(prepared.observation_statistics.count) == 0.0
    finished = jax.jit(agent.finish_update)(prepared, rollout)
    assert float(finished.observation_statistics.count) == 24.0
    assert _same_bits(finished.rnd_observation_statistics, prepared.rnd_observation_statistics)
    fused, info = jax.jit(agent.update_fn)(agent.state, jax.random.PRNGKey(0), rollout)
    assert _same_bits(fused.rnd_observation_statistics, prepared.rnd_observation_statistics)
    assert _same_bits(fused.observation_statistics, finished.observation_statistics)
    assert not _same_bits(fused.rnd_predictor.params, agent.state.rnd_predictor.params)  # the predictor trains
    assert _same_bits(fused.rnd_target_params, agent.state.rnd_target_params)  # the target never does
    assert {"loss_rnd", "loss_value_intrinsic", "loss_policy", "loss_total"} <= set(info)


def test_the_update_step_by_step_with_the_hooks_follows_the_fused_update(agent):
    """The distributed executor's road (``AgentAlgorithm``: prepare, process, steps, finish) ends
    where the fused update does: the statistics bit for bit, the parameters to float rounding (the
    fused update's scan sums some gradients in another order: see test_distributed_algorithm)."""
    rollout, key = _rollout(6), jax.random.PRNGKey(7)
    fused, _ = jax.jit(agent.update_fn)(agent.state, key, rollout)
    algorithm = AgentAlgorithm(agent)
    algorithm.prepare_update(rollout)
    processed, epoch_keys = algorithm.process_rollout(rollout, key)
    for epoch_key in epoch_keys:
        step_keys, batches = epoch_minibatches(epoch_key, processed, algorithm.mini_batch_size)
        for j, step_key in enumerate(step_keys):
            grads, _ = algorithm.compute_gradients(jax.tree_util.tree_map(lambda x, j=j: x[j], batches), key=step_key)
            algorithm.apply_gradients(grads)
    algorithm.finish_update(rollout)
    assert algorithm.n_gradient_steps == 2 * (8 * 3 // 8)
    for name in ("rnd_observation_statistics", "intrinsic_return_statistics", "observation_statistics"):
        assert _same_bits(getattr(algorithm.state, name), getattr(fused, name)), name
    for got, want in zip(jax.tree_util.tree_leaves(algorithm.state), jax.tree_util.tree_leaves(fused)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_acting_reads_ppos_state_without_rnd(agent):
    acting = agent.acting_params(agent.state)
    assert type(acting) is ppo_module.PPOState and acting.actor_critic.opt_state is None
    actions, log_probs = agent.act(acting, jax.random.PRNGKey(0), np.zeros((3, 2), np.float32), 0)
    assert actions.shape == (3,) and log_probs.shape == (3,)
    assert get_algorithm("rnd_ppo") == (RNDPPO, RNDPPOParams)


def test_acting_step_reports_both_heads_values(agent):
    """Seed 003's ``other``: the log-probability and the two heads' values of the observations,
    normalised with the actor-critic's statistics as acting does."""
    algorithm = AgentAlgorithm(agent)
    obs = np.array([[-0.5, 0.01], [0.3, -0.05], [-1.0, 0.0]], np.float32)
    _, _, _, other = algorithm.acting_step(obs, None, np.zeros(3))
    assert sorted(other) == ["log_prob", "value", "value_intrinsic"]
    ac, stats = agent.state.actor_critic, agent.state.observation_statistics
    normalized = np.clip((obs - stats.mean) / np.sqrt(stats.var + 1e-8), -10.0, 10.0)
    values = np.asarray(ac.apply_fn(ac.params, normalized, method="value"))
    assert values.shape == (3, 2)
    np.testing.assert_allclose(other["value"], values[:, 0], rtol=1e-6)
    np.testing.assert_allclose(other["value_intrinsic"], values[:, 1], rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# What it refuses
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("intrinsic_gamma", 1.5),
        ("extrinsic_coef", -1.0),
        ("intrinsic_coef", float("inf")),
        ("update_proportion", 0.0),
        ("update_proportion", 1.5),
        ("rnd_hidden_sizes", (64, 0)),
        ("rnd_feature_size", 0),
        ("rnd_activation", "nope"),
        ("rnd_observation_clip", 0.0),
        ("gamma", 1.5),  # PPO's checks hold too
    ],
)
def test_bad_params_name_the_field_and_value(field, value):
    with pytest.raises(ValueError, match=rf"algo_params\.{field}=.* is not allowed; allowed: "):
        RNDPPOParams(**{field: value})


@pytest.mark.parametrize(
    ("spaces", "match"),
    [
        (
            {"action_space": gym.spaces.MultiBinary([3, 2])},
            r"RND-PPO cannot act in the action space MultiBinary\(\(3, 2\)\)",
        ),
        ({"action_space": gym.spaces.Box(-1, 1, (2, 2))}, r"RND-PPO cannot act in the action space Box"),
        ({"observation_space": gym.spaces.Discrete(5)}, r"RND-PPO cannot read the observation space Discrete\(5\)"),
    ],
)
def test_spaces_rnd_ppo_cannot_handle_are_refused(spaces, match):
    with pytest.raises(ValueError, match=match):
        RNDPPO("rnd", _config(**spaces), run_dir="unused")


def test_other_params_classes_are_refused():
    config = dataclasses.replace(_config(), algo_params=ppo_module.PPOParams())
    with pytest.raises(TypeError, match="algo_params=PPOParams is not allowed for RND-PPO"):
        RNDPPO("rnd", config, run_dir="unused")


# ---------------------------------------------------------------------------------------------
# Whole runs: determinism and resume
# ---------------------------------------------------------------------------------------------


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_host_training_is_deterministic_for_a_seed(tmp_path):
    """Only two runs of one seed were compared: a seed that changed nothing passed. Now a run of
    another seed gives other bits."""
    args = ["train", "rnd_ppo", "MountainCar-v0", "--steps", "1024", "--n-envs", "4", "--quiet"]
    for name, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        assert main([*args, "--seed", seed, "--run-dir", str(tmp_path / name)]) == 0
    a, b, c = _summary(tmp_path / "a"), _summary(tmp_path / "b"), _summary(tmp_path / "c")
    assert a["steps"] == c["steps"] == 1024 and a["state_fingerprint"] == b["state_fingerprint"]
    assert c["state_fingerprint"] != a["state_fingerprint"]


def test_compiled_training_is_deterministic_and_resumes_to_the_same_bits(tmp_path):
    args = ["rnd_ppo", "gymnax:MountainCar-v0", "--quiet", "--n-envs", "4"]
    whole, again, cut = tmp_path / "whole", tmp_path / "again", tmp_path / "cut"
    for run_dir in (whole, again):
        assert main(["train", *args, "--steps", "1024", "--run-dir", str(run_dir)]) == 0
    # the preset's learning rate is constant: the cut run's schedule is the whole one's
    assert main(["train", *args, "--steps", "512", "--run-dir", str(cut)]) == 0
    assert main(["resume", str(cut), "--steps", "1024", "--quiet"]) == 0
    a, b, c = _summary(whole), _summary(again), _summary(cut)
    assert a["steps"] == c["steps"] == 1024 and c["resumed_from"] == 512
    assert a["state_fingerprint"] == b["state_fingerprint"] == c["state_fingerprint"]
