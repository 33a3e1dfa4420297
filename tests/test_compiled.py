"""The compiled loop: JAX environments, whole runs in one program, seeds in parallel, sharding."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _agents import TinyA2C, TinyA2CParams, TinyDQN, TinyDQNParams, make_config

from kitae.envs.jax_env import GymnaxEnv, VecJaxEnv
from kitae.envs.make import make_jax_env
from kitae.loops.compiled import compiled_train, make_loop_functions
from kitae.loops.state import payload_from_agent

ROOT = Path(__file__).resolve().parents[1]


def _leaves_close(a, b, **tol) -> bool:
    return all(np.allclose(x, y, **tol) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def _leaves_equal(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


# ---------------------------------------------------------------------------------------------
# The gymnax adapter
# ---------------------------------------------------------------------------------------------


def test_gymnax_adapter_keeps_final_observations_and_separates_truncation():
    env = GymnaxEnv("CartPole-v1")
    params = env.default_params.replace(max_steps_in_episode=5)
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    step = jax.jit(env.step)
    for t in range(1, 6):
        ts = step(jax.random.PRNGKey(t), state, jnp.int32(t % 2), params)
        if t < 5:
            assert not ts.truncated and not ts.terminated
            np.testing.assert_array_equal(ts.observation, ts.next_observation)
        state = ts.state
    assert bool(ts.truncated) and not bool(ts.terminated)
    assert not np.array_equal(ts.observation, ts.next_observation)  # reset obs vs final obs
    assert env.observation_space.shape == (4,) and env.action_space.n == 2


def test_gymnax_adapter_terminates_without_truncation():
    env = GymnaxEnv("CartPole-v1")
    params = env.default_params
    _, state = env.reset(jax.random.PRNGKey(0), params)
    step = jax.jit(env.step)
    for t in range(200):  # always push right: the pole falls
        ts = step(jax.random.PRNGKey(t), state, jnp.int32(1), params)
        if ts.terminated:
            break
        state = ts.state
    assert bool(ts.terminated) and not bool(ts.truncated)
    assert abs(float(ts.next_observation[2])) > 0.2 or abs(float(ts.next_observation[0])) > 2.4


def test_a_gymnax_step_without_reset_keeps_the_state_the_episode_ends_in():
    """What a video draws: ``step``'s fields from the same key, the reached state where it resets."""
    env = GymnaxEnv("CartPole-v1")
    params = env.default_params.replace(max_steps_in_episode=5)
    _, state = env.reset(jax.random.PRNGKey(0), params)
    step, without = jax.jit(env.step), jax.jit(env.step_without_reset)
    for t in range(1, 6):
        ts, kept = (
            step(jax.random.PRNGKey(t), state, jnp.int32(t % 2), params),
            without(jax.random.PRNGKey(t), state, jnp.int32(t % 2), params),
        )
        for field in ("reward", "terminated", "truncated", "next_observation"):
            np.testing.assert_array_equal(getattr(ts, field), getattr(kept, field))
        np.testing.assert_array_equal(kept.observation, kept.next_observation)
        assert int(kept.state.time) == t
        state = ts.state
    assert bool(kept.truncated) and int(ts.state.time) == 0  # step reset; the kept state is the last one


def test_a_minatar_state_is_drawn_by_gymnaxs_visualizer_and_others_are_refused():
    env = GymnaxEnv("Breakout-MinAtar")
    _, state = env.reset(jax.random.PRNGKey(0), env.default_params)
    moved = env.step_without_reset(jax.random.PRNGKey(1), state, jnp.int32(1), env.default_params).state
    try:
        first, second = env.render(state), env.render(moved)
    finally:
        env.close()
    assert first.shape == second.shape == (500, 600, 3) and first.dtype == np.uint8
    assert first.std() > 5 and not np.array_equal(first, second)  # a drawing; the title's step moved
    assert env.filmable and env.render_fps == 10.0 and GymnaxEnv("CartPole-v1").render_fps == 20.0
    bandit = GymnaxEnv("SimpleBandit-bsuite")
    assert not bandit.filmable
    with pytest.raises(ValueError, match="'SimpleBandit-bsuite' cannot be drawn; allowed: Acrobot-v1"):
        bandit.render(None)


def test_make_jax_env_rejects_unknown_ids():
    with pytest.raises(ValueError, match="unknown gymnax environment"):
        make_jax_env("gymnax:NotAnEnv-v0", 2)
    with pytest.raises(ValueError, match="not a JAX environment"):
        make_jax_env("CartPole-v1", 2)
    with pytest.raises(ValueError, match="n_envs"):
        VecJaxEnv(GymnaxEnv("CartPole-v1"), 0)


# ---------------------------------------------------------------------------------------------
# Compiled runs
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def a2c_setup():
    env = make_jax_env("gymnax:CartPole-v1", 4)
    config = make_config(
        env, TinyA2CParams(), max_buffer_size=16, batch_size=32, n_epochs=2, task_name="gymnax:CartPole-v1"
    )
    return env, config


def test_on_policy_compiled_run(a2c_setup):
    env, config = a2c_setup
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = dataclasses.replace(config, train_cfg=dataclasses.replace(config.train_cfg, log_frequency=64))
    agent = TinyA2C("c", config, run_dir="run")
    initial = agent.state
    result = agent.train(env, 4 * 16 * 10)  # a JAX environment: the compiled loop
    assert result.executor == "compiled"
    events = EventAccumulator("run/logs")
    events.Reload()
    assert {"charts/episodic_return", "losses/loss_value", "charts/SPS"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("losses/loss_value")] == [64 * (i + 1) for i in range(10)]
    assert result.metrics.env_step.tolist() == [64 * (i + 1) for i in range(10)]
    assert result.metrics.updated.all()
    assert result.metrics.episodes.sum() > 0
    assert set(result.metrics.info) == {"loss_policy", "loss_value", "entropy"}
    assert agent.env_step == 640 and agent.n_updates == 10
    assert not _leaves_equal(initial.model.params, agent.state.model.params)
    assert result.compile_seconds > 0 and result.train_seconds > 0


def test_compiled_runs_are_deterministic_and_seeds_match_single_runs(a2c_setup):
    env, config = a2c_setup
    agent = TinyA2C("c", config, run_dir="unused")
    steps = 4 * 16 * 3
    batched = compiled_train(agent, env, steps, seeds=[0, 5], use_cache=False)
    single = {}
    for seed in (0, 5):
        seed_config = make_config(env, TinyA2CParams(), seed=seed, max_buffer_size=16, batch_size=32, n_epochs=2)
        single[seed] = compiled_train(TinyA2C("c", seed_config, run_dir="unused"), env, steps, use_cache=False)
    again = compiled_train(TinyA2C("c", config, run_dir="unused"), env, steps, use_cache=False)
    assert _leaves_equal(single[0].state.agent_state, again.state.agent_state)
    for i, seed in enumerate((0, 5)):
        per_seed = jax.tree_util.tree_map(lambda x, i=i: x[i], batched.state.agent_state)
        assert _leaves_close(per_seed, single[seed].state.agent_state, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(batched.metrics.return_sum[i], single[seed].metrics.return_sum, rtol=1e-5)
    assert not _leaves_close(single[0].state.agent_state, single[5].state.agent_state)


def test_single_seed_initial_state_is_the_agents(a2c_setup):
    env, config = a2c_setup
    agent = TinyA2C("c", config, run_dir="unused")
    fresh, attach, _ = make_loop_functions(agent, env)
    loop_state = jax.jit(fresh)(jnp.uint32(config.seed))
    assert _leaves_equal(loop_state.agent_state, agent.state)
    np.testing.assert_array_equal(loop_state.agent_key, agent.key)
    attached = jax.jit(attach)(payload_from_agent(agent).state, jnp.uint32(config.seed))
    assert _leaves_equal(attached, loop_state)  # a fresh agent facade starts where the seed does


def test_off_policy_compiled_run_respects_start_step():
    env = make_jax_env("gymnax:CartPole-v1", 2)
    config = make_config(env, TinyDQNParams(start_step=40, skip_steps=4), max_buffer_size=100, batch_size=16)
    agent = TinyDQN("c", config, run_dir="unused")
    result = compiled_train(agent, env, 100, use_cache=False)
    steps, updated = result.metrics.env_step, result.metrics.updated
    assert steps[0] == 4 and steps[-1] == 100  # 2 vector steps of 2 envs per iteration
    np.testing.assert_array_equal(updated, steps >= 40)
    assert np.all(result.metrics.info["loss_qvalue"][~updated] == 0)


def test_the_guide_agent_trains_compiled_without_changes():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import custom_dqn
    finally:
        sys.path.pop(0)
    import kitae.config as cfg

    env = make_jax_env("gymnax:CartPole-v1", 4)
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=custom_dqn.DQNParams(exploration=0.1, gamma=0.99, skip_steps=4, start_step=64),
        update_cfg=cfg.UpdateConfig(learning_rate=3e-4, max_buffer_size=64, batch_size=32),
        train_cfg=cfg.TrainConfig(n_env_steps=400),
        env_cfg=cfg.EnvConfig("gymnax:CartPole-v1", env.single_observation_space, env.single_action_space, n_envs=4),
    )
    agent = custom_dqn.DQN("guide", config)
    before = agent.state
    result = compiled_train(agent, env, 400, use_cache=False)
    assert result.metrics.updated.sum() == (400 - 64) // 4 + 1
    assert not _leaves_equal(before, agent.state)


def test_compiled_train_rejects_bad_arguments(a2c_setup):
    env, config = a2c_setup
    agent = TinyA2C("c", config, run_dir="unused")
    with pytest.raises(ValueError, match="n_env_steps"):
        compiled_train(agent, env, 0)
    with pytest.raises(ValueError, match="seed"):
        compiled_train(agent, env, 64, seeds=[-1])
    with pytest.raises(ValueError, match="n_envs"):
        compiled_train(agent, make_jax_env("gymnax:CartPole-v1", 3), 64)


@pytest.mark.slow
def test_sharded_seeds_match_unsharded(tmp_path):
    """4 virtual CPU devices: the seed axis sharded across them gives the unsharded result."""
    script = textwrap.dedent(f"""
        import os, sys
        # appended: the suite's XLA level (tests/conftest.py) stays
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
        sys.path.insert(0, {str(ROOT / "tests")!r})
        import jax, numpy as np
        from _agents import TinyA2C, TinyA2CParams, make_config
        from kitae.envs.make import make_jax_env
        from kitae.loops.compiled import compiled_train
        assert jax.device_count() == 4
        env = make_jax_env("gymnax:CartPole-v1", 4)
        config = make_config(env, TinyA2CParams(), max_buffer_size=16, batch_size=32, n_epochs=2)
        agent = TinyA2C("c", config, run_dir="unused")
        sharded = compiled_train(agent, env, 192, seeds=[0, 1, 2, 3], shard=True, use_cache=False)
        leaf = jax.tree_util.tree_leaves(sharded.state.agent_state)[0]
        assert len(leaf.sharding.device_set) == 4, leaf.sharding
        plain = compiled_train(agent, env, 192, seeds=[0, 1, 2, 3], shard=False, use_cache=False)
        for a, b in zip(jax.tree_util.tree_leaves(sharded.state.agent_state),
                        jax.tree_util.tree_leaves(plain.state.agent_state)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
        print("OK")
    """)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
