"""MultiDiscrete and MultiBinary action spaces: ``kitae.distributions.MultiCategorical`` against
hand-computed values (under ``jit`` and ``vmap``), the policy head, PPO's action map and space
checks, and PPO acting and training in the host loop (on ``examples/multi_discrete.py``'s
``Match``, which refuses any action outside its space) and in the compiled loop (on a JAX version
of it, which pays -10 for an action outside its space)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kitae.algos.collections.ppo import _action_map, check_spaces
from kitae.distributions import MultiCategorical, multi_categorical_valid
from kitae.envs.jax_env import JaxTimeStep, VecJaxEnv
from kitae.loops.compiled import compiled_train
from kitae.modules.policy import MultiCategoricalHead, multi_discrete_nvec, policy_factory
from kitae.runs import preset_agent
from kitae.runs.rundir import state_fingerprint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
try:
    import multi_discrete  # noqa: F401  (registers Match-v0 with Gymnasium)
finally:
    sys.path.pop(0)

NVEC = (3, 2)


def _distribution() -> MultiCategorical:
    logits = jnp.asarray([[0.0, 1.0, 2.0], [0.5, -0.5, 7.0]])  # component 1 has 2 classes: 7.0 is not one
    return MultiCategorical(logits, multi_categorical_valid(NVEC))


def test_log_prob_entropy_and_mode_are_the_sums_over_components_by_hand():
    dist = _distribution()
    z0 = math.log(1 + math.e + math.e**2)
    z1 = math.log(math.exp(0.5) + math.exp(-0.5))
    expected = (2.0 - z0) + (-0.5 - z1)  # action (2, 1)
    p0 = np.exp(np.asarray([0.0, 1.0, 2.0]) - z0)
    p1 = np.exp(np.asarray([0.5, -0.5]) - z1)
    entropy = -np.sum(p0 * np.log(p0)) - np.sum(p1 * np.log(p1))
    for log_prob, ent, mode in (
        (dist.log_prob(jnp.asarray([2, 1])), dist.entropy(), dist.mode()),
        jax.jit(lambda d: (d.log_prob(jnp.asarray([2, 1])), d.entropy(), d.mode()))(dist),
    ):
        np.testing.assert_allclose(log_prob, expected, rtol=1e-6)
        np.testing.assert_allclose(ent, entropy, rtol=1e-6)
        np.testing.assert_array_equal(mode, [2, 0])  # never the missing class of component 1


def test_samples_stay_in_each_component_and_batch_under_vmap():
    dist = _distribution()
    samples = jax.vmap(dist.sample)(jax.random.split(jax.random.PRNGKey(0), 2000))
    assert samples.shape == (2000, 2) and samples.dtype == jnp.int32
    assert set(np.unique(samples[:, 0])) == {0, 1, 2} and set(np.unique(samples[:, 1])) == {0, 1}
    batched = MultiCategorical(jnp.zeros((5, 2, 3)), multi_categorical_valid(NVEC))
    actions, log_probs = batched.sample_and_log_prob(jax.random.PRNGKey(1))
    assert actions.shape == (5, 2) and log_probs.shape == (5,)
    np.testing.assert_allclose(log_probs, math.log(1 / 3) + math.log(1 / 2), rtol=1e-6)


def test_the_head_and_policy_factory_build_one_categorical_per_component():
    head = MultiCategoricalHead(NVEC)
    params = head.init(jax.random.PRNGKey(0), jnp.zeros((4, 8)))
    dist = head.apply(params, jnp.ones((4, 8)))
    assert isinstance(dist, MultiCategorical) and dist.logits.shape == (4, 2, 3)
    assert multi_discrete_nvec(gym.spaces.MultiBinary(4)) == (2, 2, 2, 2)
    assert multi_discrete_nvec(gym.spaces.MultiDiscrete([[2, 3], [2, 3]])) is None  # two axes
    box = gym.spaces.Box(-1, 1, (5,))
    policy = policy_factory(box, gym.spaces.MultiDiscrete([4, 2]), hidden=(8,))
    out = policy.apply(policy.init(jax.random.PRNGKey(0), jnp.zeros((1, 5))), jnp.zeros((3, 5)))
    assert out.logits.shape == (3, 2, 4) and out.sample(jax.random.PRNGKey(0)).shape == (3, 2)
    with pytest.raises(ValueError, match="kind='normal' does not fit action space MultiDiscrete"):
        policy_factory(box, gym.spaces.MultiDiscrete([4, 2]), kind="normal")


def test_the_action_map_adds_each_components_start_and_gives_multibinary_its_dtype():
    space = gym.spaces.MultiDiscrete([3, 2, 4], start=[1, -1, 5])
    to_env, from_env = _action_map(space)
    policy_actions = jnp.asarray([[0, 1, 3], [2, 0, 0]])
    env_actions = to_env(policy_actions)
    np.testing.assert_array_equal(env_actions, [[1, 0, 8], [3, -1, 5]])
    assert all(space.contains(np.asarray(a, np.int64)) for a in env_actions)
    np.testing.assert_array_equal(from_env(env_actions), policy_actions)
    to_env, _ = _action_map(gym.spaces.MultiBinary(3))
    assert to_env(jnp.asarray([1, 0, 1])).dtype == jnp.int8


def _config_with(action_space, observation_space=None):
    agent, env = preset_agent("ppo", "Match-v0", steps=256, run_dir="unused")
    env.close()
    env_cfg = agent.config.env_cfg
    object.__setattr__(env_cfg, "action_space", action_space)
    if observation_space is not None:
        object.__setattr__(env_cfg, "observation_space", observation_space)
    return agent.config


def test_ppo_accepts_one_dimensional_multi_discrete_spaces_and_refuses_others():
    check_spaces(_config_with(gym.spaces.MultiBinary(3)))
    with pytest.raises(ValueError, match=r"PPO cannot act in the action space MultiDiscrete\(\[\[2 3\]"):
        check_spaces(_config_with(gym.spaces.MultiDiscrete([[2, 3], [2, 3]])))
    masked = gym.spaces.Dict({"obs": gym.spaces.Box(0, 1, (9,)), "action_mask": gym.spaces.MultiBinary(5)})
    with pytest.raises(ValueError, match="action masks apply to Discrete action spaces only"):
        check_spaces(_config_with(gym.spaces.MultiDiscrete([3, 2]), masked))


@pytest.mark.parametrize(("algo", "runs"), [("ppo", 2), ("a2c", 1), ("ppo_lstm", 1)])
def test_the_host_loop_trains_in_a_multi_discrete_environment_and_one_seed_decides(tmp_path, algo, runs):
    """``Match`` raises on any action outside its space, so a run that ends acted within it; PPO
    twice: the same bits."""
    prints = []
    for name in ("a", "b")[:runs]:
        agent, env = preset_agent(algo, "Match-v0", steps=1024, run_dir=tmp_path / name)
        result = agent.train(env)
        assert result.env_steps >= 1024 and result.n_updates >= 1
        prints.append(state_fingerprint(agent.state))
    assert len(set(prints)) == 1
    loaded = type(agent).unserialize(agent.run_dir)
    assert state_fingerprint(loaded.state) == prints[-1]


class JaxMatch:
    """``examples/multi_discrete.py``'s ``Match`` in JAX: the compiled loop's version, paying -10
    for an action outside ``MultiDiscrete(nvec)`` instead of raising."""

    def __init__(self, nvec=(3, 2, 4)):
        self.nvec = jnp.asarray(nvec)
        self.action_space = gym.spaces.MultiDiscrete(nvec)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (int(sum(nvec)),), np.float32)
        self.default_params = None
        self._offsets = jnp.asarray(np.concatenate([[0], np.cumsum(nvec)[:-1]]))

    def _observation(self, target):
        return jnp.zeros(self.observation_space.shape, jnp.float32).at[self._offsets + target].set(1.0)

    def reset(self, key, params):
        target = jax.random.randint(key, self.nvec.shape, 0, self.nvec)
        return self._observation(target), (target, jnp.int32(0))

    def step(self, key, state, action, params):
        target, t = state
        valid = jnp.all((action >= 0) & (action < self.nvec))
        reward = jnp.where(valid, jnp.mean((action == target).astype(jnp.float32)), -10.0)
        t = t + 1
        new_target = jax.random.randint(key, self.nvec.shape, 0, self.nvec)
        truncated = t >= 8
        observation = self._observation(new_target)
        state = (new_target, jnp.where(truncated, 0, t))
        return JaxTimeStep(observation, state, reward, jnp.bool_(False), truncated, observation)


def test_the_compiled_loop_trains_in_a_multi_discrete_jax_environment(tmp_path):
    env = VecJaxEnv(JaxMatch(), 8)
    agent, host_env = preset_agent("ppo", "Match-v0", steps=16384, n_envs=8, run_dir=tmp_path / "c")
    host_env.close()
    result = compiled_train(agent, env, 16384, use_cache=False)
    episodes = result.episodes[0]
    assert int(np.sum(episodes.count)) == 16384 // 8 and np.all(episodes.return_ >= 0)  # no action outside it
    assert episodes.return_[-2:].mean() > episodes.return_[:2].mean() + 0.5  # it learns already


@pytest.mark.parametrize("name", ["PPO", "A2C", "RNDPPO"])
def test_the_functional_agents_act_and_update_in_a_multi_discrete_space(name):
    """Seed 002's API: the network's policy output is one row of logits per component (RND-PPO's
    values: extrinsic and intrinsic columns)."""
    import haiku as hk

    import kitae.functional

    values = 2 if name == "RNDPPO" else 1

    def network(action_space):
        nvec = multi_discrete_nvec(action_space)

        def f(x):
            logits = hk.nets.MLP([32, len(nvec) * max(nvec)])(x).reshape(x.shape[0], len(nvec), max(nvec))
            return logits, hk.nets.MLP([32, values])(x)

        return hk.without_apply_rng(hk.transform(f))

    env = gym.vector.SyncVectorEnv([lambda: gym.make("Match-v0")] * 4)
    agent = getattr(kitae.functional, name)(network, env, 1e-3, **({} if name == "A2C" else {"batch_size": 16}))
    key = jax.random.PRNGKey(0)
    params, policy_state = agent.init_params(key), agent.init_policy(key)
    optimizer_state = agent.init_optimizer(params, key)
    observation, _ = env.reset(seed=0)
    rows = {k: [] for k in ("obs", "action", "log_prob", "reward", "terminated", "truncated", "next_obs")}
    for t in range(8):
        out, policy_state = agent.predict(params, policy_state, observation, jax.random.fold_in(key, t))
        assert out.actions.shape == (4, 3) and out.log_probs.shape == (4,)
        next_observation, reward, terminated, truncated, _ = env.step(np.asarray(out.actions))  # Match checks them
        for name, value in zip(rows, (observation, out.actions, out.log_probs, reward, terminated, truncated)):
            rows[name].append(np.asarray(value))
        rows["next_obs"].append(next_observation)  # Match's episodes end at step 8: no autoreset before
        observation = next_observation
    data = {name: jnp.stack(values) for name, values in rows.items()}
    result, new_params, _ = agent.update(params, optimizer_state, data)
    assert np.isfinite(float(result.loss)) and not all(
        np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(new_params))
    )
    env.close()


def test_agents_sharing_parameters_act_in_a_multi_discrete_parallel_env():
    """PettingZoo's Parallel API with MultiDiscrete actions: each agent's component actions reach
    the environment as one row of ints, and the buffer holds what each agent sent, copy by copy."""
    import functools

    import kitae.config as cfg
    from kitae.algos.collections.ppo import PPO, PPOParams
    from kitae.envs.parallel import SyncVecParallelEnv
    from kitae.loops.train import vectorized_train

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        from _parallel_envs import CountParallelEnv
    finally:
        sys.path.pop(0)

    class MultiDiscreteCount(CountParallelEnv):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self._action_space = gym.spaces.MultiDiscrete([3, 2])

    env = SyncVecParallelEnv([functools.partial(MultiDiscreteCount, limit=4)] * 3)
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=PPOParams(),
        update_cfg=cfg.UpdateConfig(max_buffer_size=10, batch_size=6),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig("md", env.single_observation_space, env.single_action_space, n_envs=3, n_agents=2),
    )
    agent = PPO("md", config)
    stats = vectorized_train(0, agent, env, 30, agent.algo_type)  # one rollout of 10 vector steps, one update
    assert agent.n_updates == 1 and stats.agent_episode_returns == {"a0": [4.0] * 6, "a1": [8.0] * 6}
    rows = agent.buffer._rows
    for i, copy in enumerate(env.copies):
        for name in ("a0", "a1"):
            sent = np.stack([actions[name] for actions in copy.env.actions])
            assert sent.shape == (10, 2) and sent.dtype.kind == "i"
            assert ((sent >= 0) & (sent < [3, 2])).all()
            np.testing.assert_array_equal(rows.action[name][:10, i], sent)
    sent = np.concatenate([np.stack([a[n] for a in c.env.actions]) for c in env.copies for n in ("a0", "a1")])
    assert len({tuple(row) for row in sent}) > 3  # both components vary
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree_util.tree_leaves(agent.state))
