"""DQN: losses and targets by hand, the target-network rule, the epsilon schedule, refused spaces
and params, determinism, and a short training run."""

from __future__ import annotations

import dataclasses

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kitae.config as cfg
from kitae.algos.collections import dqn
from kitae.algos.collections.dqn import DQN, DQNParams
from kitae.buffer import Experience
from kitae.envs.make import make_vec_env

pytestmark = pytest.mark.timeout(120)  # a hung compilation fails instead of stalling the run
# The tests of the pure maths are chex variants: each runs once under jax.jit and once eagerly.
VARIANTS = dict(with_jit=True, without_jit=True)

BOX2 = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
DISCRETE3 = gym.spaces.Discrete(3)


def make_config(
    algo_params: DQNParams,
    *,
    observation_space: gym.Space = BOX2,
    action_space: gym.Space = DISCRETE3,
    n_envs: int = 1,
    seed: int = 0,
    n_env_steps: int = 1000,
    learning_rate: float = 1e-3,
    batch_size: int = 3,
    n_epochs: int = 1,
    max_buffer_size: int = 1000,
) -> cfg.AlgoConfig:
    return cfg.AlgoConfig(
        seed=seed,
        algo_params=algo_params,
        update_cfg=cfg.UpdateConfig(
            learning_rate=learning_rate,
            max_grad_norm=None,
            max_buffer_size=max_buffer_size,
            batch_size=batch_size,
            n_epochs=n_epochs,
        ),
        train_cfg=cfg.TrainConfig(n_env_steps=n_env_steps),
        env_cfg=cfg.EnvConfig(
            task_name="test",
            observation_space=observation_space,
            action_space=action_space,
            n_envs=n_envs,
        ),
    )


def linear_state(config: cfg.AlgoConfig) -> dqn.DQNState:
    """A linear Q-network (``hidden=()``) on 2-d observations and 3 actions, set by hand.

    online: Q(x) = x @ [[1, 0, 2], [0, 1, -1]]            = [x0, x1, 2 x0 - x1]
    target: Q'(x) = x @ [[0.5, 1, 0], [0, 0, 1]] + [1, 0, 0] = [0.5 x0 + 1, x0, x1]
    """
    state = dqn.train_state_dqn_factory(jax.random.PRNGKey(0), config)
    online = {"params": {"Dense_0": {"kernel": jnp.array([[1.0, 0.0, 2.0], [0.0, 1.0, -1.0]]), "bias": jnp.zeros(3)}}}
    target = {
        "params": {
            "Dense_0": {"kernel": jnp.array([[0.5, 1.0, 0.0], [0.0, 0.0, 1.0]]), "bias": jnp.array([1.0, 0.0, 0.0])}
        }
    }
    return state.replace(qvalue=state.qvalue.replace(params=online, target_params=target))


# Three transitions (gamma = 0.9):
#   1: obs (1, 2), action 2, reward  1.0, not terminated (but truncated: still bootstraps), next (2, 1)
#   2: obs (0, 1), action 0, reward -1.0, terminated,                                      next (1, 3)
#   3: obs (1, 1), action 1, reward  0.5, not terminated,                                  next (1, 3)
EXPERIENCE = Experience(
    observation=jnp.array([[1.0, 2.0], [0.0, 1.0], [1.0, 1.0]]),
    action=jnp.array([2, 0, 1], jnp.int32),
    reward=jnp.array([1.0, -1.0, 0.5]),
    done=jnp.array([False, True, False]),
    next_observation=jnp.array([[2.0, 1.0], [1.0, 3.0], [1.0, 3.0]]),
    log_prob=jnp.zeros(3),
    truncated=jnp.array([True, False, False]),
)
# Online Q of the taken actions: 1: 2*1 - 2 = 0; 2: 0; 3: 1.
# Next states: 1: online [2, 1, 3] (argmax 2), target [2, 2, 1] (max 2, at the online argmax 1)
#              3: online [1, 3, -1] (argmax 1), target [1.5, 1, 3] (max 3, at the online argmax 1)
PLAIN_TARGETS = [1.0 + 0.9 * 2.0, -1.0, 0.5 + 0.9 * 3.0]  # [2.8, -1, 3.2]
DOUBLE_TARGETS = [1.0 + 0.9 * 1.0, -1.0, 0.5 + 0.9 * 1.0]  # [1.9, -1, 1.4]
# TD errors q - target: plain [-2.8, 1, -2.2], double [-1.9, 1, -0.4]
EXPECTED_LOSS = {
    # huber (delta 1): |d| - 0.5 when |d| > 1, else 0.5 d^2
    ("huber", False): (2.3 + 0.5 + 1.7) / 3,  # 1.5
    ("huber", True): (1.4 + 0.5 + 0.5 * 0.16) / 3,  # 0.66
    # l2: 0.5 d^2
    ("l2", False): 0.5 * (7.84 + 1.0 + 4.84) / 3,  # 2.28
    ("l2", True): 0.5 * (3.61 + 1.0 + 0.16) / 3,  # 0.795
}


class TestTargetsAndLoss(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_dqn_targets_by_hand(self):
        targets = self.variant(dqn.dqn_targets)
        next_q_target = jnp.array([[2.0, 2.0, 1.0], [1.5, 1.0, 3.0], [1.5, 1.0, 3.0]])
        next_q_online = jnp.array([[2.0, 1.0, 3.0], [1.0, 3.0, -1.0], [1.0, 3.0, -1.0]])
        rewards, terminated = jnp.array([1.0, -1.0, 0.5]), jnp.array([0.0, 1.0, 0.0])
        plain = targets(rewards, terminated, next_q_target, 0.9)
        double = targets(rewards, terminated, next_q_target, 0.9, next_q_online)
        np.testing.assert_allclose(plain, PLAIN_TARGETS, rtol=1e-6)
        np.testing.assert_allclose(double, DOUBLE_TARGETS, rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_dqn_loss_by_hand(self):
        loss_fn = self.variant(dqn.dqn_loss, static_argnames=("loss",))  # loss: a static Python string
        q_values = jnp.array([[5.0, 7.0, 0.0], [0.0, 9.0, 9.0], [4.0, 1.0, 4.0]])  # taken: 0, 0, 1
        actions = jnp.array([2, 0, 1])
        targets = jnp.array([2.8, -1.0, 3.2])  # errors -2.8, 1.0, -2.2
        np.testing.assert_allclose(loss_fn(q_values, actions, targets, loss="huber"), 1.5, rtol=1e-6)
        np.testing.assert_allclose(loss_fn(q_values, actions, targets, loss="l2"), 2.28, rtol=1e-6)
        # inside the quadratic zone huber and l2 agree: error 0.5 -> 0.125
        np.testing.assert_allclose(loss_fn(jnp.array([[1.5]]), jnp.array([0]), jnp.array([1.0])), 0.125)


@pytest.mark.parametrize("loss", ["huber", "l2"])
@pytest.mark.parametrize("double_dqn", [False, True])
def test_td_loss_through_the_factories_by_hand(loss, double_dqn):
    config = make_config(DQNParams(gamma=0.9, hidden=(), loss=loss, double_dqn=double_dqn))
    state = linear_state(config)
    batch = dqn.process_experience_factory(config)(state, jax.random.PRNGKey(1), EXPERIENCE)
    np.testing.assert_allclose(batch.target, DOUBLE_TARGETS if double_dqn else PLAIN_TARGETS, rtol=1e-6)
    np.testing.assert_array_equal(batch.action, [2, 0, 1])
    grads, info = dqn.compute_gradients_factory(config)(state, jax.random.PRNGKey(2), batch)
    np.testing.assert_allclose(info["loss_qvalue"], EXPECTED_LOSS[(loss, double_dqn)], rtol=1e-5)
    np.testing.assert_allclose(info["q_values"], (0.0 + 0.0 + 1.0) / 3, rtol=1e-6)
    if loss == "l2":
        # d(mean 0.5 d^2)/d bias[a] = sum of the errors of transitions that took a, over B = 3
        errors = np.array([0.0, 0.0, 1.0]) - np.array(DOUBLE_TARGETS if double_dqn else PLAIN_TARGETS)
        expected = np.array([errors[1], errors[2], errors[0]]) / 3  # actions 0, 1, 2 were taken by 2, 3, 1
        np.testing.assert_allclose(grads["params"]["Dense_0"]["bias"], expected, rtol=1e-5)


def _tree_equal(a, b) -> bool:
    return all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x, y: bool(jnp.all(x == y)), a, b)))


def test_hard_target_update_every_n_gradient_steps():
    config = make_config(DQNParams(hidden=(4,), target_update_interval=3, tau=1.0))
    state = dqn.train_state_dqn_factory(jax.random.PRNGKey(0), config)
    apply_fn = jax.jit(dqn.apply_gradients_factory(config))
    grads = jax.tree_util.tree_map(jnp.ones_like, state.qvalue.params)
    assert _tree_equal(state.qvalue.params, state.qvalue.target_params)
    for step in range(1, 8):
        previous_target = state.qvalue.target_params
        state = apply_fn(state, grads)
        assert int(state.qvalue.step) == step
        assert not _tree_equal(state.qvalue.params, previous_target)  # the online network moved
        if step % 3 == 0:
            assert _tree_equal(state.qvalue.target_params, state.qvalue.params)
        else:
            assert _tree_equal(state.qvalue.target_params, previous_target)


@pytest.mark.parametrize("interval", [1, 2])
def test_polyak_target_update(interval):
    config = make_config(DQNParams(hidden=(4,), target_update_interval=interval, tau=0.25))
    state = dqn.train_state_dqn_factory(jax.random.PRNGKey(0), config)
    apply_fn = jax.jit(dqn.apply_gradients_factory(config))
    grads = jax.tree_util.tree_map(jnp.ones_like, state.qvalue.params)
    for step in range(1, 5):
        old = state.qvalue.target_params
        state = apply_fn(state, grads)
        if step % interval == 0:
            expected = jax.tree_util.tree_map(lambda p, t: 0.25 * p + 0.75 * t, state.qvalue.params, old)
        else:
            expected = old
        for got, want in zip(
            jax.tree_util.tree_leaves(state.qvalue.target_params), jax.tree_util.tree_leaves(expected)
        ):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


class TestTargetRuleAndSchedule(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_update_target_hand_values(self):
        # the interval and tau are static; the step (a leaf of the TrainState) is traced under jit
        update_target = self.variant(dqn.update_target, static_argnums=(1, 2))
        state = dqn.train_state_dqn_factory(jax.random.PRNGKey(0), make_config(DQNParams(hidden=())))
        ts = state.qvalue.replace(params={"w": jnp.array([4.0])}, target_params={"w": jnp.array([0.0])})
        assert float(update_target(ts.replace(step=2), 2, 0.5).target_params["w"][0]) == 2.0
        assert float(update_target(ts.replace(step=3), 2, 0.5).target_params["w"][0]) == 0.0
        assert float(update_target(ts.replace(step=4), 2, 1.0).target_params["w"][0]) == 4.0

    @chex.variants(**VARIANTS)
    def test_epsilon_schedule_values(self):
        params = DQNParams(exploration=1.0, exploration_final=0.1, exploration_fraction=0.5, start_step=0)
        schedule = self.variant(dqn.epsilon_schedule(params, n_env_steps=1000))  # decays over 500 transitions
        for step, expected in [(0, 1.0), (250, 0.55), (500, 0.1), (1000, 0.1)]:
            np.testing.assert_allclose(schedule(step), expected, rtol=1e-6)
        # a JAX integer step (traced under jit)
        np.testing.assert_allclose(schedule(jnp.int32(100)), 1.0 - 0.9 * 100 / 500, rtol=1e-6)

        # random actions (epsilon 1) before start_step; the decay still counts from step 0
        warm = self.variant(dqn.epsilon_schedule(dataclasses.replace(params, start_step=100), 1000))
        np.testing.assert_allclose(warm(99), 1.0)
        np.testing.assert_allclose(warm(100), 0.82, rtol=1e-6)

        constant = self.variant(
            dqn.epsilon_schedule(DQNParams(exploration=0.3, exploration_fraction=0.0, start_step=0), 1000)
        )
        np.testing.assert_allclose([constant(0), constant(10_000)], [0.3, 0.3], rtol=1e-6)

        fn = self.variant(dqn.epsilon_schedule(DQNParams(exploration=lambda s: 1.0 / (1.0 + s), start_step=0), 1000))
        np.testing.assert_allclose([fn(0), fn(3), fn(jnp.int32(4))], [1.0, 0.25, 0.2], rtol=1e-6)


def test_the_epsilon_schedule_of_a_swept_exploration_fraction_is_the_concrete_ones():
    """``kitae sweep --grid algo_params.exploration_fraction=...`` traces the fraction (one row
    per value, vmapped): the horizon is then traced too. It failed with JAX's "Abstract tracer
    value encountered" (``int()`` of it); each row now follows the schedule of its value."""
    steps = jnp.asarray([0, 100, 250, 499, 500, 900])
    fractions = jnp.asarray([0.1, 0.5, 0.0])

    base = make_config(DQNParams(exploration=1.0, exploration_final=0.1, start_step=0))

    def swept(fraction):  # as a sweep builds each row's config: kitae.config.traced_config
        params = cfg.traced_config(base, {"algo_params.exploration_fraction": fraction}).algo_params
        return jax.vmap(dqn.epsilon_schedule(params, n_env_steps=1000))(steps)

    got = jax.jit(jax.vmap(swept))(fractions)
    for row, fraction in zip(got, [0.1, 0.5, 0.0], strict=True):
        params = DQNParams(exploration=1.0, exploration_final=0.1, exploration_fraction=fraction, start_step=0)
        want = [dqn.epsilon_schedule(params, n_env_steps=1000)(int(step)) for step in steps]
        np.testing.assert_allclose(row, want, rtol=1e-6)


def test_explore_follows_the_schedule_and_select_action_is_greedy():
    params = DQNParams(exploration=1.0, exploration_final=0.0, exploration_fraction=0.5, start_step=0, hidden=(8,))
    config = make_config(params, n_envs=3000)
    agent = DQN("dqn-explore", config, run_dir="runs/x")
    obs = jnp.tile(jnp.array([[0.3, -0.7]]), (3000, 1))
    greedy, log_probs = agent.select_action(obs)
    again, _ = agent.select_action(obs)
    np.testing.assert_array_equal(greedy, again)
    np.testing.assert_array_equal(log_probs, 0.0)
    q = agent.state.qvalue.apply_fn(agent.state.qvalue.params, obs[:1])
    assert int(greedy[0]) == int(jnp.argmax(q[0]))

    agent.env_step = 0  # epsilon 1: uniform over the 3 actions
    actions, _ = agent.explore(obs)
    counts = np.bincount(np.asarray(actions), minlength=3) / 3000
    np.testing.assert_allclose(counts, 1 / 3, atol=0.04)

    agent.env_step = 500  # epsilon 0 after the decay: greedy
    actions, _ = agent.explore(obs)
    np.testing.assert_array_equal(actions, greedy)


def test_discrete_action_space_with_start():
    config = make_config(DQNParams(hidden=(4,), start_step=0), action_space=gym.spaces.Discrete(3, start=-1))
    agent = DQN("dqn-start", config, run_dir="runs/x")
    agent.env_step = 0
    actions, _ = agent.explore(jnp.zeros((1, 2)))
    assert -1 <= int(actions[0]) <= 1
    experience = EXPERIENCE._replace(action=jnp.array([1, -1, 0], jnp.int32))
    batch = agent.process_experience_fn(agent.state, jax.random.PRNGKey(0), experience)
    np.testing.assert_array_equal(batch.action, [2, 0, 1])


@pytest.mark.parametrize(
    "space", [gym.spaces.Box(-1.0, 1.0, (2,)), gym.spaces.MultiDiscrete([2, 2]), gym.spaces.MultiBinary(3)]
)
def test_refuses_non_discrete_action_spaces(space):
    config = make_config(DQNParams(), action_space=space)
    with pytest.raises(ValueError, match="DQN") as error:
        DQN("dqn-refused", config, run_dir="runs/x")
    assert type(space).__name__ in str(error.value) and "Discrete" in str(error.value)
    # what to use instead, for each kind (it named SAC or TD3 for every space, which refuse these two)
    instead = "for Box actions: SAC, TD3, DDPG, MPO or PPO; for MultiDiscrete or MultiBinary: PPO or A2C"
    assert instead in str(error.value)
    with pytest.raises(ValueError, match="DQN"):
        dqn.train_state_dqn_factory(jax.random.PRNGKey(0), config)


def test_refuses_other_params():
    @dataclasses.dataclass
    class Other:
        gamma: float = 0.99

    with pytest.raises(TypeError, match="DQNParams"):
        DQN("dqn-other", make_config(Other()), run_dir="runs/x")


@pytest.mark.parametrize(
    "field, value",
    [
        ("gamma", 1.5),
        ("gamma", -0.1),
        ("exploration", 1.5),
        ("exploration", "high"),
        ("exploration_final", -0.1),
        ("exploration_fraction", 2.0),
        ("start_step", -1),
        ("skip_steps", 0),
        ("target_update_interval", 0),
        ("tau", 0.0),
        ("tau", 1.5),
        ("loss", "mse"),
        ("hidden", (0,)),
        ("activation", "nope"),
        ("double_dqn", "yes"),
        ("skip_steps", 2.5),
    ],
)
def test_rejected_params_name_the_field(field, value):
    with pytest.raises((ValueError, TypeError), match=rf"algo_params\.{field}"):
        DQNParams(**{field: value})


def test_config_round_trips_through_yaml_and_refuses_a_callable_schedule():
    config = make_config(DQNParams(hidden=(32, 16), double_dqn=True, loss="l2", exploration_fraction=0.2))
    loaded = cfg.AlgoConfig.from_yaml(config.to_yaml())
    assert loaded.algo_params == config.algo_params
    with pytest.raises(TypeError, match=r"algo_params\.exploration"):
        make_config(DQNParams(exploration=lambda s: 0.1)).to_yaml()


def test_image_observations_use_nature_cnn():
    space = gym.spaces.Box(0, 255, (36, 36, 1), np.uint8)
    config = make_config(DQNParams(), observation_space=space)
    state = jax.eval_shape(lambda key: dqn.train_state_dqn_factory(key, config), jax.random.PRNGKey(0))
    assert "Conv_0" in str(jax.tree_util.tree_structure(state.qvalue.params))
    q = jax.eval_shape(state.qvalue.apply_fn, state.qvalue.params, jnp.zeros((2, 36, 36, 1), jnp.uint8))
    assert q.shape == (2, 3)


def test_one_update_changes_the_parameters():
    config = make_config(DQNParams(hidden=(8,)), batch_size=3)
    agent = DQN("dqn-update", config, run_dir="runs/x")
    for i in range(3):
        agent.buffer.add(jax.tree_util.tree_map(lambda x, i=i: np.asarray(x[i : i + 1]), EXPERIENCE))
    before = agent.state.qvalue.params
    info = agent.update(agent.buffer)
    assert set(info) == {"loss_qvalue", "q_values"} and np.isfinite(info["loss_qvalue"])
    assert not _tree_equal(before, agent.state.qvalue.params)
    assert int(agent.state.qvalue.step) == 1


def _cartpole_agent(seed: int, name: str = "a") -> tuple[DQN, gym.vector.VectorEnv]:
    env = make_vec_env("CartPole-v1", 2)
    params = DQNParams(start_step=200, skip_steps=50, target_update_interval=10, hidden=(32,))
    config = make_config(
        params,
        observation_space=env.single_observation_space,
        action_space=env.single_action_space,
        n_envs=2,
        seed=seed,
        n_env_steps=1000,
        batch_size=32,
        n_epochs=4,
        max_buffer_size=1000,
    )
    return DQN(f"dqn-{seed}", config, run_dir=f"runs/dqn-{name}"), env


def test_short_training_run_and_same_seed_gives_identical_parameters():
    agent_a, env_a = _cartpole_agent(3)
    stats = agent_a.train(env_a, 1000)
    assert stats.env_steps == 1000
    assert stats.n_updates == (1000 - 200) // 50 + 1 and len(stats.episode_returns) > 0
    assert int(agent_a.state.qvalue.step) == 4 * stats.n_updates

    agent_b, env_b = _cartpole_agent(3, "b")
    agent_b.train(env_b, 1000)
    for a, b in zip(jax.tree_util.tree_leaves(agent_a.state), jax.tree_util.tree_leaves(agent_b.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_trains_in_the_compiled_loop_with_a_traced_step():
    from kitae.envs.make import make_jax_env
    from kitae.loops.compiled import compiled_train

    env = make_jax_env("gymnax:CartPole-v1", 2)
    params = DQNParams(start_step=40, skip_steps=8, target_update_interval=4, hidden=(16,))
    config = make_config(
        params,
        observation_space=env.single_observation_space,
        action_space=env.single_action_space,
        n_envs=2,
        n_env_steps=120,
        batch_size=16,
        n_epochs=2,
        max_buffer_size=100,
    )
    agent = DQN("dqn-compiled", config, run_dir="runs/x")
    before = agent.state
    result = compiled_train(agent, env, 120, use_cache=False)
    steps, updated = result.metrics.env_step, result.metrics.updated
    np.testing.assert_array_equal(updated, steps >= 40)
    assert int(agent.state.qvalue.step) == 2 * int(updated.sum())
    assert not _tree_equal(before.qvalue.params, agent.state.qvalue.params)
