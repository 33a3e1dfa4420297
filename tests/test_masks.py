"""Action masks (kitae.action_masks): masked categorical policies, masked argmax / epsilon-greedy /
TD targets, the Gymnasium info-to-observation wrapper, refusals, and short training runs that
never take an illegal action (host loop: Taxi-v4; compiled loop: a masked gymnax CartPole)."""

from __future__ import annotations

import math

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _obs_envs import IllegalActionCounter, config, env_config, gymnax_cartpole_masked

from kitae.action_masks import allowed_actions, get_action_mask, masked_argmax, masked_max
from kitae.algos.collections.dqn import DQN, DQNParams, dqn_targets
from kitae.algos.collections.ppo import PPO, PPOParams
from kitae.algos.collections.sac import SAC, SACParams
from kitae.algos.collections.td3 import TD3, TD3Params
from kitae.distributions import Categorical, EpsilonGreedy
from kitae.envs.make import make_vec_env
from kitae.envs.wrappers import ActionMaskObservation

N_SAMPLES = 20_000


def _masked_space(n_actions: int = 4, obs_dim: int = 3) -> gym.spaces.Dict:
    return gym.spaces.Dict(
        {
            "observation": gym.spaces.Box(-1.0, 1.0, (obs_dim,), np.float32),
            "action_mask": gym.spaces.Box(0, 1, (n_actions,), np.int8),
        }
    )


def _random_masks(rng: np.random.Generator, batch: int, n: int) -> np.ndarray:
    masks = rng.integers(0, 2, size=(batch, n)).astype(np.int8)
    masks[np.arange(batch), rng.integers(0, n, size=batch)] = 1  # at least one allowed action per row
    return masks


# ---------------------------------------------------------------------------------------------
# Pure functions, hand-computed
# ---------------------------------------------------------------------------------------------


def test_masked_categorical_hand_computed():
    # logits (1, 2, 3, 0), allowed {0, 2}: p0 = 1 / (1 + e^2), p2 = e^2 / (1 + e^2)
    dist = Categorical(jnp.array([1.0, 2.0, 3.0, 0.0]), jnp.array([1, 0, 1, 0], jnp.int8))
    p0, p2 = 1.0 / (1.0 + math.e**2), math.e**2 / (1.0 + math.e**2)
    np.testing.assert_allclose(dist.log_prob(0), -math.log(1.0 + math.e**2), rtol=1e-6)
    np.testing.assert_allclose(dist.log_prob(2), -math.log(1.0 + math.e**-2), rtol=1e-6)
    np.testing.assert_allclose(dist.entropy(), -(p0 * math.log(p0) + p2 * math.log(p2)), rtol=1e-6)
    np.testing.assert_allclose(dist.probs, [p0, 0.0, p2, 0.0], atol=1e-7)
    assert int(dist.mode()) == 2
    # The unmasked best action (2) is allowed here; mask it and the mode moves to the best allowed one.
    assert int(Categorical(dist.logits, jnp.array([True, True, False, False])).mode()) == 1


def test_masked_categorical_never_samples_a_masked_action_under_jit_and_vmap():
    rng = np.random.default_rng(0)
    masks = _random_masks(rng, 64, 5)
    logits = jnp.asarray(rng.normal(size=(64, 5)) * 3.0, jnp.float32)

    @jax.jit
    def draw(logits, masks, keys):
        return jax.vmap(lambda lg, m, k: Categorical(lg, m).sample(k), in_axes=(None, None, 0))(logits, masks, keys)

    samples = np.asarray(draw(logits, masks, jax.random.split(jax.random.key(1), 300)))  # (300, 64)
    assert samples.shape == (300, 64)
    assert np.all(np.take_along_axis(np.broadcast_to(masks, (300, 64, 5)), samples[..., None], -1) == 1)


def test_a_row_that_allows_nothing_counts_as_all_allowed():
    logits = jnp.array([0.5, -1.0, 2.0])
    none = jnp.zeros(3, bool)
    np.testing.assert_array_equal(allowed_actions(none), [True, True, True])
    np.testing.assert_allclose(Categorical(logits, none).probs, jax.nn.softmax(logits), rtol=1e-6)
    assert int(masked_argmax(logits, none)) == 2 and float(masked_max(logits, none)) == 2.0


def test_masked_argmax_and_max_hand_computed():
    q = jnp.array([[3.0, 9.0, 2.0], [4.0, 8.0, 6.0], [1.0, 1.0, 0.0]])
    mask = jnp.array([[1, 0, 1], [0, 0, 1], [0, 1, 1]])
    np.testing.assert_array_equal(masked_argmax(q, mask), [0, 2, 1])
    np.testing.assert_array_equal(masked_max(q, mask), [3.0, 6.0, 1.0])
    np.testing.assert_array_equal(masked_argmax(q, None), [1, 1, 0])
    np.testing.assert_array_equal(jax.jit(jax.vmap(masked_max))(q, mask), [3.0, 6.0, 1.0])


def test_get_action_mask_reads_only_dicts_with_the_key():
    assert get_action_mask(jnp.zeros((2, 3))) is None
    assert get_action_mask({"observation": jnp.zeros((2, 3))}) is None
    mask = get_action_mask({"observation": jnp.zeros((2, 3)), "action_mask": jnp.array([[1, 0], [0, 1]], jnp.int8)})
    assert mask.dtype == jnp.bool_ and mask.shape == (2, 2)


def test_masked_epsilon_greedy_hand_computed():
    # greedy among allowed {1, 2} is 1 (Q 5 > 1); probs = 0.3 * (0, .5, .5, 0) + 0.7 * onehot(1)
    q = jnp.array([10.0, 5.0, 1.0, 7.0])
    mask = jnp.array([False, True, True, False])
    dist = EpsilonGreedy(q, 0.3, mask)
    np.testing.assert_allclose(dist.probs, [0.0, 0.85, 0.15, 0.0], rtol=1e-6)
    np.testing.assert_allclose(dist.log_prob(2), math.log(0.15), rtol=1e-6)
    assert int(dist.mode()) == 1

    @jax.jit
    def draw(keys, epsilon):
        return jax.vmap(lambda k: EpsilonGreedy(q, epsilon, mask).sample(k))(keys)

    keys = jax.random.split(jax.random.key(0), N_SAMPLES)
    samples = np.asarray(draw(keys, 0.3))
    assert set(np.unique(samples)) <= {1, 2}
    np.testing.assert_allclose(np.mean(samples == 2), 0.15, atol=0.01)
    uniform = np.asarray(draw(keys, 1.0))  # epsilon 1: uniform over the allowed actions only
    assert set(np.unique(uniform)) == {1, 2}
    np.testing.assert_allclose(np.mean(uniform == 1), 0.5, atol=0.015)


def test_masked_dqn_targets_hand_computed():
    rewards = jnp.array([1.0, 0.5, 2.0])
    done = jnp.array([0.0, 1.0, 0.0])
    next_q_target = jnp.array([[3.0, 9.0, 2.0], [4.0, 8.0, 6.0], [1.0, 5.0, 7.0]])
    next_q_online = jnp.array([[1.0, 5.0, 2.0], [0.0, 0.0, 0.0], [9.0, 1.0, 3.0]])
    next_mask = jnp.array([[1, 0, 1], [0, 0, 0], [0, 1, 1]], jnp.int8)
    # plain: max over allowed = 3, (done), 7 -> 1 + .9 * 3, 0.5, 2 + .9 * 7
    np.testing.assert_allclose(
        dqn_targets(rewards, done, next_q_target, 0.9, next_mask=next_mask), [3.7, 0.5, 8.3], rtol=1e-6
    )
    # double: online argmax over allowed = 2, -, 2 -> Q_target 2, -, 7
    np.testing.assert_allclose(
        dqn_targets(rewards, done, next_q_target, 0.9, next_q_online, next_mask), [2.8, 0.5, 8.3], rtol=1e-6
    )
    # unmasked for comparison: 1 + .9 * 9
    np.testing.assert_allclose(dqn_targets(rewards, done, next_q_target, 0.9)[0], 9.1, rtol=1e-6)
    batched = jax.jit(jax.vmap(lambda r, d, q, m: dqn_targets(r, d, q, 0.9, next_mask=m)))
    np.testing.assert_allclose(
        batched(rewards[None], done[None], next_q_target[None], next_mask[None])[0], [3.7, 0.5, 8.3], rtol=1e-6
    )


# ---------------------------------------------------------------------------------------------
# The agents' pure functions
# ---------------------------------------------------------------------------------------------


def test_ppo_explore_and_select_action_use_only_allowed_actions():
    space = _masked_space(4)
    agent = PPO(
        "mask", config(space, gym.spaces.Discrete(4), PPOParams(), max_buffer_size=8, batch_size=8), run_dir="unused"
    )
    rng = np.random.default_rng(1)
    obs = {"observation": rng.uniform(-1, 1, (512, 3)).astype(np.float32), "action_mask": _random_masks(rng, 512, 4)}
    actions, log_probs = agent.explore(obs)
    actions = np.asarray(actions)
    assert np.all(obs["action_mask"][np.arange(512), actions] == 1)
    # log-probabilities: log-softmax over the allowed logits only
    ac = agent.state.actor_critic
    logits = np.asarray(ac.apply_fn(ac.params, obs, method="policy").logits, np.float64)
    masked = np.where(obs["action_mask"] == 1, logits, -np.inf)
    log_softmax = masked - np.log(np.sum(np.exp(masked), axis=-1, keepdims=True))
    np.testing.assert_allclose(log_probs, log_softmax[np.arange(512), actions], rtol=1e-4, atol=1e-5)
    greedy, _ = agent.select_action(obs)
    np.testing.assert_array_equal(greedy, np.argmax(masked, axis=-1))


def test_ppo_update_entropy_is_over_allowed_actions():
    space = _masked_space(4)
    agent = PPO(
        "mask", config(space, gym.spaces.Discrete(4), PPOParams(), max_buffer_size=8, batch_size=8), run_dir="unused"
    )
    rng = np.random.default_rng(2)
    masks = np.zeros((16, 4), np.int8)
    masks[:, 0] = 1  # exactly one allowed action: the entropy is 0 and every log-prob is 0
    obs = {"observation": rng.uniform(-1, 1, (16, 3)).astype(np.float32), "action_mask": masks}
    from kitae.algos.collections.ppo import PPOBatch, compute_gradients_factory

    batch = PPOBatch(obs, jnp.zeros(16, jnp.int32), jnp.zeros(16), jnp.zeros(16), jnp.ones(16), jnp.ones(16))
    _, info = jax.jit(compute_gradients_factory(agent.config))(agent.state, jax.random.key(0), batch)
    np.testing.assert_allclose(info["entropy"], 0.0, atol=1e-6)
    np.testing.assert_allclose(info["approx_kl"], 0.0, atol=1e-6)  # log-prob 0 = stored log-prob 0


def test_dqn_explore_masks_greedy_and_random_actions():
    space = _masked_space(4)
    agent = DQN("mask", config(space, gym.spaces.Discrete(4), DQNParams(hidden=(16,))), run_dir="unused")
    rng = np.random.default_rng(3)
    obs = {"observation": rng.uniform(-1, 1, (2048, 3)).astype(np.float32), "action_mask": _random_masks(rng, 2048, 4)}
    rows = np.arange(2048)
    random_actions, _ = agent.explore_fn(agent.state, jax.random.key(0), obs, exploration=1.0)
    assert np.all(obs["action_mask"][rows, np.asarray(random_actions)] == 1)
    q = np.asarray(agent.state.qvalue.apply_fn(agent.state.qvalue.params, obs))
    greedy, _ = agent.select_action(obs)
    np.testing.assert_array_equal(greedy, np.argmax(np.where(obs["action_mask"] == 1, q, -np.inf), axis=-1))


@pytest.mark.parametrize("algo", ["sac", "td3", "ddpg"])
def test_continuous_algorithms_refuse_a_mask(algo):
    space = gym.spaces.Dict(
        {
            "observation": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
            "action_mask": gym.spaces.Box(0, 1, (2,), np.int8),
        }
    )
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    from kitae.algos.collections.ddpg import DDPG, DDPGParams

    cls, params, name = {
        "sac": (SAC, SACParams(), "SAC"),
        "td3": (TD3, TD3Params(), "TD3"),
        "ddpg": (DDPG, DDPGParams(), "DDPG"),
    }[algo]
    with pytest.raises(ValueError, match=f"{name} does not support action masks.*'action_mask'"):
        cls("refused", config(space, action_space, params), run_dir="unused")


def test_discrete_sac_refuses_a_mask_when_the_agent_is_made():
    """Discrete SAC's policy, warm-up actions and targets read no mask: on masked Taxi it took 597
    illegal actions of 800. It is refused as continuous SAC is, when the agent is made."""
    with pytest.raises(ValueError, match=r"SAC does not support action masks.*'action_mask'"):
        SAC("refused", config(_masked_space(4), gym.spaces.Discrete(4), SACParams()), run_dir="unused")
    env = make_vec_env("Taxi-v4", 2, wrappers=[ActionMaskObservation])
    try:
        with pytest.raises(ValueError, match=r"SAC does not support action masks.*Remove the 'action_mask' key"):
            SAC("sm", env_config(env, SACParams()), run_dir="unused")
    finally:
        env.close()
    SAC("unmasked", config(gym.spaces.Box(-1.0, 1.0, (3,)), gym.spaces.Discrete(4), SACParams()), run_dir="unused")


def test_the_functional_actor_critic_agents_refuse_a_mask():
    from kitae.functional import SAC as FunctionalSAC
    from kitae.functional import TD3 as FunctionalTD3

    class Spaces:
        def __init__(self, observation_space, action_space):
            self.observation_space, self.action_space = observation_space, action_space

    def never_called(action_space):
        raise AssertionError("the spaces are refused before the networks are made")

    with pytest.raises(ValueError, match=r"SAC does not support action masks"):
        FunctionalSAC(never_called, Spaces(_masked_space(4), gym.spaces.Discrete(4)), 1e-3)
    box = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    with pytest.raises(ValueError, match=r"TD3 does not support action masks"):
        FunctionalTD3(never_called, Spaces(_masked_space(4), box), 1e-3)


def test_a_mask_of_the_wrong_size_or_for_continuous_ppo_is_refused():
    with pytest.raises(ValueError, match=r"DQN: observation_space\['action_mask'\].*allowed: .*shape \(4,\)"):
        DQN("refused", config(_masked_space(3), gym.spaces.Discrete(4), DQNParams()), run_dir="unused")
    with pytest.raises(ValueError, match=r"PPO: observation_space\['action_mask'\].*Discrete action spaces only"):
        PPO("refused", config(_masked_space(2), gym.spaces.Box(-1.0, 1.0, (2,)), PPOParams()), run_dir="unused")


# ---------------------------------------------------------------------------------------------
# The Gymnasium wrapper
# ---------------------------------------------------------------------------------------------


def test_action_mask_observation_moves_taxi_masks_into_observations():
    env = ActionMaskObservation(gym.make("Taxi-v4"))
    assert set(env.observation_space.spaces) == {"observation", "action_mask"}
    assert env.observation_space["action_mask"].shape == (6,)
    obs, info = env.reset(seed=0)
    np.testing.assert_array_equal(obs["action_mask"], info["action_mask"])
    assert obs["action_mask"].dtype == np.int8 and env.observation_space.contains(obs)
    obs, _, _, _, info = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
    np.testing.assert_array_equal(obs["action_mask"], info["action_mask"])


def test_action_mask_observation_rejects_envs_without_masks():
    env = ActionMaskObservation(gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="without 'action_mask'"):
        env.reset(seed=0)
    with pytest.raises(ValueError, match="Discrete action space"):
        ActionMaskObservation(gym.make("Pendulum-v1"))
    with pytest.raises(ValueError, match="observation_key='action_mask'"):
        ActionMaskObservation(gym.make("Taxi-v4"), observation_key="action_mask")


# ---------------------------------------------------------------------------------------------
# Training runs that never take an illegal action
# ---------------------------------------------------------------------------------------------


def _taxi(n_envs: int):
    IllegalActionCounter.illegal = IllegalActionCounter.taken = 0
    return make_vec_env("Taxi-v4", n_envs, wrappers=[IllegalActionCounter, ActionMaskObservation])


def test_ppo_trains_on_taxi_with_masks_and_never_acts_illegally():
    env = _taxi(4)
    agent = PPO("taxi", env_config(env, PPOParams(), max_buffer_size=32, batch_size=64), run_dir="runs/taxi")
    stats = agent.train(env, 4 * 32 * 3)
    assert stats.n_updates == 3
    assert IllegalActionCounter.taken == 4 * 32 * 3 and IllegalActionCounter.illegal == 0
    assert set(agent.buffer.state.data.observation) == {"observation", "action_mask"}


def test_dqn_trains_on_taxi_with_masks_and_never_acts_illegally():
    env = _taxi(2)
    params = DQNParams(start_step=64, skip_steps=8, hidden=(32,), exploration_fraction=0.5)
    agent = DQN(
        "taxi",
        env_config(env, params, max_buffer_size=256, batch_size=32, n_epochs=2, n_env_steps=400),
        run_dir="runs/taxi",
    )
    stats = agent.train(env, 400)
    assert stats.n_updates >= 10
    assert IllegalActionCounter.taken == 400 and IllegalActionCounter.illegal == 0
    assert agent.buffer.state.data.next_observation["action_mask"].dtype == np.int8


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_masks_in_the_compiled_loop(algo):
    """gymnax CartPole whose mask only ever allows action 1: every action of the run must be 1."""
    from kitae.loops.compiled import compiled_train

    env = gymnax_cartpole_masked(4, allowed=(0, 1))
    if algo == "ppo":
        agent = PPO("masked", env_config(env, PPOParams(), max_buffer_size=16, batch_size=32), run_dir="unused")
    else:
        params = DQNParams(start_step=32, skip_steps=16, hidden=(16,), exploration=0.5, exploration_fraction=0.0)
        agent = DQN("masked", env_config(env, params, max_buffer_size=64, batch_size=32), run_dir="unused")
    run = compiled_train(agent, env, 4 * 16 * 4)
    assert int(np.sum(run.metrics.updated)) >= 2
    actions = np.asarray(run.state.buffer.data.action)
    assert actions.size >= 64 and np.all(actions == 1)
