"""Agents built from the four factories: construction, gating, updates, and learning on CartPole."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import jax
import numpy as np
import pytest
from _agents import (
    TinyA2C,
    TinyA2CParams,
    TinyDQN,
    TinyDQNParams,
    make_config,
    tiny_dqn_explore_factory,
    tiny_dqn_process_factory,
    tiny_dqn_state_factory,
    tiny_dqn_update_factory,
)

import kitae.config as cfg
from kitae.base import BaseAgent, OffPolicyAgent
from kitae.envs.make import make_vec_env
from kitae.types import AlgoType

ROOT = Path(__file__).resolve().parents[1]


def _leaves_equal(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


@pytest.fixture
def cartpole4():
    env = make_vec_env("CartPole-v1", 4)
    yield env
    env.close()


def test_off_policy_update_gating(cartpole4):
    config = make_config(cartpole4, TinyDQNParams(start_step=100, skip_steps=8), batch_size=16)
    agent = TinyDQN("gating", config, run_dir="unused")
    obs, _ = cartpole4.reset(seed=0)
    for _ in range(3):  # 12 transitions stored
        actions, log_probs = agent.explore(obs)
        next_obs, rewards, terms, truncs, _ = cartpole4.step(np.asarray(actions))
        from kitae.buffer import Experience

        agent.buffer.add(Experience(obs, actions, rewards, terms, next_obs, log_probs, truncs))
        obs = next_obs
    assert agent.buffer.n_transitions == 12
    assert not agent.should_update(200, agent.buffer)  # fewer transitions than a batch
    agent.buffer.add(Experience(obs, actions, rewards, terms, next_obs, log_probs, truncs))
    assert agent.buffer.n_transitions == 16
    assert not agent.should_update(96, agent.buffer)  # before start_step
    assert agent.should_update(104, agent.buffer)  # crossed 104 = 13 * 8 in the last 4 steps
    assert not agent.should_update(108, agent.buffer)  # 105..108 crosses no multiple of 8
    assert agent.should_update(112, agent.buffer)


def test_off_policy_update_changes_parameters_and_is_deterministic(cartpole4):
    def one_update(seed):
        config = make_config(cartpole4, TinyDQNParams(), seed=seed, batch_size=8, n_epochs=3)
        agent = TinyDQN("upd", config, run_dir="unused")
        obs, _ = cartpole4.reset(seed=0)
        from kitae.buffer import Experience

        for _ in range(4):
            actions, log_probs = agent.explore(obs)
            next_obs, rewards, terms, truncs, _ = cartpole4.step(np.asarray(actions))
            agent.buffer.add(Experience(obs, actions, rewards, terms, next_obs, log_probs, truncs))
            obs = next_obs
        before = agent.state
        info = agent.update(agent.buffer)
        return before, agent.state, info

    before, after, info = one_update(0)
    assert set(info) == {"loss_qvalue"} and np.isfinite(info["loss_qvalue"])
    assert not _leaves_equal(before.qvalue.params, after.qvalue.params)
    assert not _leaves_equal(before.qvalue.target_params, after.qvalue.target_params)
    _, again, _ = one_update(0)
    assert _leaves_equal(after, again)


def test_on_policy_agent_updates_once_per_full_rollout(cartpole4):
    config = make_config(cartpole4, TinyA2CParams(), max_buffer_size=16, batch_size=16, n_epochs=2)
    agent = TinyA2C("a2c", config, run_dir="unused")
    before = agent.state
    stats = agent.train(cartpole4, 16 * 4 * 3)  # three full rollouts
    assert stats.n_updates == 3
    assert agent.n_updates == 3
    assert agent.buffer.size == 0  # emptied after the last update
    assert not _leaves_equal(before.model.params, agent.state.model.params)
    assert (Path("unused") / "logs").exists()


def test_train_writes_tensorboard_logs(tmp_path, cartpole4):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = make_config(cartpole4, TinyDQNParams(start_step=0), batch_size=16)
    config.train_cfg = cfg.TrainConfig(n_env_steps=10_000, log_frequency=100)
    agent = TinyDQN("logs", config, run_dir=tmp_path / "run")
    agent.train(cartpole4, 402)  # 101 vector steps of 4: the last point is the end of training
    events = EventAccumulator(str(tmp_path / "run" / "logs"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"charts/episodic_return", "charts/episodic_length", "charts/SPS", "losses/loss_qvalue"} <= tags
    steps = [e.step for e in events.Scalars("losses/loss_qvalue")]
    assert steps == [100, 200, 300, 400, 404]


def test_losses_are_logged_as_means_every_log_frequency_steps():
    from kitae.loops.callbacks import LossMeans

    log = LossMeans(10)
    assert log.add(4, {"a": 1.0}) is None
    assert log.add(8, {"a": 3.0}) is None
    assert log.add(12, {"a": 5.0}) == (12, {"a": 3.0})  # crosses 10: the mean of the three
    assert log.flush(14) is None  # nothing since: no point
    assert log.add(16, {"a": 7.0}) is None
    assert log.flush(16) == (16, {"a": 7.0})  # the end of training writes what is left


def test_agent_construction_rejects_bad_inputs(cartpole4):
    config = make_config(cartpole4, TinyDQNParams())
    with pytest.raises(ValueError, match="run_name"):
        TinyDQN("", config)
    with pytest.raises(TypeError, match="config"):
        TinyDQN("x", {"seed": 0})

    class Concrete(OffPolicyAgent):
        explore = select_action = None

    with pytest.raises(TypeError, match="explore_factory"):
        Concrete("x", config, lambda *a, **k: None, "not callable", lambda c: None, lambda c: None)
    with pytest.raises(ValueError, match="experience_type"):
        TinyDQN("x", config, experience_type=tuple)


def test_train_rejects_bad_step_counts(cartpole4):
    agent = TinyDQN("x", make_config(cartpole4, TinyDQNParams()), run_dir="unused")
    with pytest.raises(ValueError, match="n_env_steps"):
        agent.train(cartpole4, 0)


def test_an_agent_that_cannot_act_is_refused(cartpole4):
    from _agents import (
        tiny_dqn_explore_factory,
        tiny_dqn_process_factory,
        tiny_dqn_state_factory,
        tiny_dqn_update_factory,
    )

    class Mute(OffPolicyAgent):
        pass

    with pytest.raises(TypeError, match="defines no way to act"):
        Mute(
            "x",
            make_config(cartpole4, TinyDQNParams()),
            tiny_dqn_state_factory,
            tiny_dqn_explore_factory,
            tiny_dqn_process_factory,
            tiny_dqn_update_factory,
        )


def test_act_is_a_pure_function_of_its_inputs(cartpole4):
    """A guide-style agent (explore written against its attributes) acts as a pure function: the
    same inputs give the same actions, jitted or not, and the agent's own state and key are untouched."""
    agent = TinyDQN("x", make_config(cartpole4, TinyDQNParams(exploration=0.5)), run_dir="unused")
    state, key, block = agent.state, agent.key, agent._key_index
    observation = np.asarray(cartpole4.reset(seed=0)[0])
    act = jax.jit(agent.act, static_argnames="deterministic")
    a1, p1 = act(state, jax.random.PRNGKey(3), observation, np.int32(0))
    a2, p2 = act(state, jax.random.PRNGKey(3), observation, np.int32(0))
    a3, _ = agent.act(state, jax.random.PRNGKey(3), observation, np.int32(0))
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_array_equal(a1, a3)
    greedy, _ = act(state, jax.random.PRNGKey(4), observation, np.int32(0), deterministic=True)
    np.testing.assert_array_equal(greedy, np.argmax(state.qvalue.apply_fn(state.qvalue.params, observation), -1))
    assert agent.state is state and agent.key is key and agent._key_index == block


def test_base_agent_is_abstract(cartpole4):
    """``BaseAgent("x", None, ...)`` raised a TypeError for its ``config=None`` alone, so the test
    passed with no abstract method at all. Now: the abstract methods by name, and the refusal of a
    ``BaseAgent`` built from a valid config and the guide's factories."""
    assert issubclass(OffPolicyAgent, BaseAgent)
    assert OffPolicyAgent.algo_type is AlgoType.OFF_POLICY
    assert BaseAgent.__abstractmethods__ == {"make_buffer", "_make_update_fn", "update_data"}
    assert OffPolicyAgent.__abstractmethods__ == frozenset()  # the kinds of agent define them
    config = make_config(cartpole4, TinyDQNParams())
    factories = (tiny_dqn_state_factory, tiny_dqn_explore_factory, tiny_dqn_process_factory, tiny_dqn_update_factory)
    with pytest.raises(TypeError, match="Can't instantiate abstract class BaseAgent") as error:
        BaseAgent("x", config, *factories, run_dir="unused")
    assert all(name in str(error.value) for name in ("make_buffer", "_make_update_fn", "update_data"))


def test_interact_keys_per_agent_in_parallel_mode(cartpole4):
    agent = TinyDQN("x", make_config(cartpole4, TinyDQNParams()), run_dir="unused")
    key = agent.interact_keys(np.zeros((4, 4)))
    assert key.shape == (2,)
    agent.parallel = True
    keys = agent.interact_keys({"a": np.zeros((4, 4)), "b": np.zeros((4, 4))})
    assert set(keys) == {"a", "b"} and not np.array_equal(keys["a"], keys["b"])


def test_a_dqn_shaped_agent_learns_cartpole():
    """The guide's shape (16 environments, epsilon-greedy Q-learning) on CartPole-v1: returns rise."""
    env = make_vec_env("CartPole-v1", 16)
    config = make_config(
        env, TinyDQNParams(exploration=0.1, tau=0.05), learning_rate=1e-3, max_buffer_size=1000, batch_size=128, seed=0
    )
    agent = TinyDQN("learn", config, run_dir="unused")
    stats = agent.train(env, 40_000)
    first = float(np.mean(stats.episode_returns[:20]))
    last = stats.mean_return(20)
    assert first < 30
    assert last > 100, (first, last)


@pytest.mark.slow
def test_the_guide_example_runs_as_written(tmp_path):
    """examples/custom_dqn.py is the custom-agent guide of docs/custom_agents.md verbatim (plus
    flax's import and its registration as a command-line algorithm)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "custom_dqn.py"), "8192"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    *_, line, reloaded = result.stdout.strip().splitlines()
    # 32 updates (every 256 steps) of 128 gradient steps: returns rise from about 9 to about 200
    assert reloaded.startswith("reloaded from runs/example-dqn at step 8192") and reloaded.endswith("True"), reloaded
    first = float(line.split("first 10 ")[1].split(",")[0])
    last = float(line.split("last 10 ")[1])
    assert last > 2 * first, line
    assert (tmp_path / "runs" / "example-dqn" / "logs").is_dir()


def test_explore_fn_is_lifted_for_single_observations():
    """Shapes only were checked (and a tautology, ``isinstance(Discrete(2), gym.Space)``): an
    explore that dropped the observation passed. Now, without exploration, each single
    observation's action is the argmax of its own Q-values, and the observations chosen lead to
    both actions."""
    from kitae.algos.factory import explore_general_factory

    env = make_vec_env("CartPole-v1", 1)
    config = make_config(env, TinyDQNParams())
    agent = TinyDQN("x", config, run_dir="unused")
    env.close()
    single = explore_general_factory(tiny_dqn_explore_factory(config), vectorized=False, parallel=False)
    observations = 3.0 * np.asarray(jax.random.normal(jax.random.PRNGKey(1), (8, 4)), np.float32)
    qvalues = np.asarray(agent.state.qvalue.apply_fn(agent.state.qvalue.params, observations))  # (8, 2)
    actions = []
    for i, observation in enumerate(observations):
        action, log_prob = single(agent.state, jax.random.PRNGKey(i), observation, exploration=0.0)
        assert action.shape == () and log_prob.shape == ()
        assert int(action) == int(np.argmax(qvalues[i])), (i, qvalues[i])
        assert float(log_prob) == pytest.approx(0.0, abs=1e-6)  # the greedy action, probability 1
        actions.append(int(action))
    assert set(actions) == {0, 1}, qvalues  # the observation decides the action


def test_observation_mismatch_reads_shapes_only():
    from kitae.envs.spaces import observation_mismatch

    box = gym.spaces.Box(-1.0, 1.0, (4,))
    assert observation_mismatch(box, np.zeros(4)) is None  # one observation
    assert observation_mismatch(box, np.zeros((8, 4))) is None  # a batch
    assert observation_mismatch(box, [[0.0] * 4] * 2) is None  # nested lists
    assert observation_mismatch(box, np.zeros((8, 3))) == (
        "shape (8, 3) where (4,) (one observation) or (N, 4) (a batch) was expected"
    )
    assert observation_mismatch(box, np.zeros((2, 8, 4))) is not None  # one batch axis, not two
    assert observation_mismatch(box, [[0.0] * 4, [0.0] * 3]) == "a ragged list where arrays of shape (4,) were expected"
    assert observation_mismatch(gym.spaces.Discrete(3), np.zeros(5, np.int32)) is None
    assert observation_mismatch(gym.spaces.Discrete(3), np.zeros((5, 2), np.int32)) is not None
    assert observation_mismatch(gym.spaces.MultiDiscrete([2, 3]), np.zeros((5, 2))) is None
    nested = gym.spaces.Dict({"a": box, "b": gym.spaces.Tuple([gym.spaces.Discrete(2), box])})
    assert observation_mismatch(nested, {"a": np.zeros((3, 4)), "b": (np.zeros(3), np.zeros((3, 4)))}) is None
    assert observation_mismatch(nested, {"a": np.zeros((3, 4)), "b": (np.zeros(3), np.zeros((3, 5)))}) == (
        "shape (3, 5) where (4,) (one observation) or (N, 4) (a batch) was expected at ['b'][1]"
    )
    assert observation_mismatch(nested, {"a": np.zeros(4)}) == "keys ['a'] where ['a', 'b'] were expected"
    assert observation_mismatch(nested, np.zeros(4)) == "a ndarray where a dict with keys ['a', 'b'] was expected"
    traced = jax.jit(lambda x: observation_mismatch(box, x) is None)  # shapes of tracers: usable under jit
    assert traced(np.zeros((2, 4)))


def test_an_observation_that_does_not_fit_is_refused_by_name(cartpole4):
    """A built-in agent handed observations of another shape says so, instead of failing inside the
    network ("ScopeParamShapeError ... (3, 64) ... (4, 64)" from Flax); one observation or a batch act."""
    from kitae.runs import preset_agent

    agent, env = preset_agent("ppo", "CartPole-v1", run_dir="unused")
    env.close()
    observations = np.asarray(cartpole4.reset(seed=0)[0])
    assert agent.select_action(observations)[0].shape == (4,)
    assert agent.explore(observations[0])[0].shape == ()
    message = r"does not fit env_cfg.observation_space, which the agent was built for: shape \(4, 3\) where \(4,\)"
    for act in (agent.select_action, agent.explore):
        with pytest.raises(ValueError, match=message):
            act(observations[:, :3])
    # multi-agent mode: a dict keyed by agent, each entry checked against one agent's space
    from kitae.envs.spaces import check_observation

    check_observation(agent.config.env_cfg.observation_space, {"a": observations, "b": observations}, parallel=True)
    with pytest.raises(ValueError, match=r"shape \(4, 3\) where \(4,\) .* at \['b'\]"):
        check_observation(
            agent.config.env_cfg.observation_space, {"a": observations, "b": observations[:, :3]}, parallel=True
        )
