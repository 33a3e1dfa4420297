"""Brax environments (``brax:ID``): the adapter's termination / truncation / auto-reset, spaces,
ids, and short PPO and SAC runs in the compiled loop (``kitae/envs/brax_env.py``).

Skipped where brax is not installed (``pip install -e ".[brax]"``). Everything runs on
``inverted_pendulum`` (4 observations, 1 action, small to compile) with the default backend.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("brax")
pytestmark = [
    pytest.mark.filterwarnings("ignore:Brax System, piplines and environments are not actively"),
    pytest.mark.filterwarnings("ignore:JAXopt is no longer maintained"),
    pytest.mark.filterwarnings("ignore:Accessing `ncon` directly"),
]

from kitae.envs.brax_env import BraxEnv, BraxParams, brax_env_names  # noqa: E402
from kitae.envs.jax_env import VecJaxEnv  # noqa: E402
from kitae.envs.make import EnvSpec, make_jax_env  # noqa: E402

ENV = "inverted_pendulum"


@pytest.fixture(scope="module")
def env() -> BraxEnv:
    return BraxEnv(ENV)


@pytest.fixture(scope="module")
def step_fn(env):
    return jax.jit(env.step)


@pytest.fixture(scope="module")
def reset_fn(env):
    return jax.jit(env.reset)


def _leaves_equal(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb))


# ---------------------------------------------------------------------------------------------
# The adapter
# ---------------------------------------------------------------------------------------------


def test_spaces_are_float32_boxes(env, reset_fn):
    assert env.observation_space.shape == (4,) and env.observation_space.dtype == np.float32
    assert env.action_space.shape == (1,) and env.action_space.dtype == np.float32
    # inverted_pendulum.xml: <motor ctrlrange="-3 3">
    np.testing.assert_array_equal(env.action_space.low, [-3.0])
    np.testing.assert_array_equal(env.action_space.high, [3.0])
    assert env.default_params == BraxParams(episode_length=1000)
    obs, _ = reset_fn(jax.random.PRNGKey(0), env.default_params)
    assert obs.shape == (4,) and obs.dtype == jnp.float32
    assert env.observation_space.contains(np.asarray(obs))


def test_time_limit_truncates_with_the_final_observation(env, step_fn, reset_fn):
    params = BraxParams(episode_length=3)
    obs, state = reset_fn(jax.random.PRNGKey(0), params)
    zero = jnp.zeros((1,), jnp.float32)  # no force: the pole stays up for 3 steps
    for t in range(1, 4):
        ts = step_fn(jax.random.PRNGKey(t), state, zero, params)
        assert not bool(ts.terminated)
        if t < 3:
            assert not bool(ts.truncated) and int(ts.state.time) == t
            np.testing.assert_array_equal(ts.observation, ts.next_observation)
        previous, state = state, ts.state
    assert bool(ts.truncated) and not bool(ts.terminated)
    # next_observation is the pre-reset observation: the same step without a time limit shows it
    unlimited = step_fn(jax.random.PRNGKey(3), previous, zero, BraxParams(episode_length=1000))
    assert not bool(unlimited.truncated) and int(unlimited.state.time) == 3
    np.testing.assert_array_equal(ts.next_observation, unlimited.observation)
    # observation is a fresh reset one, drawn from the step's key, and the counter restarts
    fresh_obs, fresh_state = reset_fn(jax.random.PRNGKey(3), params)
    np.testing.assert_allclose(ts.observation, fresh_obs, atol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(ts.state.brax_state), jax.tree_util.tree_leaves(fresh_state.brax_state)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert int(ts.state.time) == 0
    assert not np.array_equal(ts.observation, ts.next_observation)


def test_a_falling_pole_terminates_without_truncation(env, step_fn, reset_fn):
    params = env.default_params
    _, state = reset_fn(jax.random.PRNGKey(0), params)
    push = jnp.full((1,), 3.0, jnp.float32)  # always push one way: the pole falls
    for t in range(1, 200):
        ts = step_fn(jax.random.PRNGKey(t), state, push, params)
        if bool(ts.terminated):
            break
        state = ts.state
    assert bool(ts.terminated) and not bool(ts.truncated), t
    assert abs(float(ts.next_observation[1])) > 0.2  # Brax's rule: |pole angle| > 0.2 ends it
    assert abs(float(ts.observation[1])) <= 0.01 and int(ts.state.time) == 0  # reset noise is +-0.01


def test_termination_wins_over_the_time_limit(env, step_fn, reset_fn):
    """A step that falls exactly at the limit is a termination, never both."""
    _, state = reset_fn(jax.random.PRNGKey(0), env.default_params)
    push = jnp.full((1,), 3.0, jnp.float32)
    for t in range(1, 200):
        ts = step_fn(jax.random.PRNGKey(t), state, push, env.default_params)
        if bool(ts.terminated):
            break
        state = ts.state
    ts = step_fn(jax.random.PRNGKey(t), state, push, BraxParams(episode_length=t))
    assert bool(ts.terminated) and not bool(ts.truncated)


def test_actions_are_clipped_to_the_control_range(env, step_fn, reset_fn):
    _, state = reset_fn(jax.random.PRNGKey(0), env.default_params)
    big = step_fn(jax.random.PRNGKey(1), state, jnp.full((1,), 50.0, jnp.float32), env.default_params)
    edge = step_fn(jax.random.PRNGKey(1), state, jnp.full((1,), 3.0, jnp.float32), env.default_params)
    np.testing.assert_array_equal(big.next_observation, edge.next_observation)


def test_a_step_without_reset_keeps_the_state_it_ends_in(env, step_fn, reset_fn):
    """What a video draws: the step's own state where ``step`` resets; every other field the same."""
    without = jax.jit(env.step_without_reset)
    _, state = reset_fn(jax.random.PRNGKey(0), env.default_params)
    push = jnp.full((1,), 3.0, jnp.float32)
    for t in range(1, 200):
        ts = step_fn(jax.random.PRNGKey(t), state, push, env.default_params)
        kept = without(jax.random.PRNGKey(t), state, push, env.default_params)
        for field in ("reward", "terminated", "truncated", "next_observation"):
            np.testing.assert_array_equal(getattr(ts, field), getattr(kept, field))
        np.testing.assert_array_equal(kept.observation, kept.next_observation)
        assert int(kept.state.time) == t
        if bool(ts.terminated):
            break
        assert _leaves_equal(ts.state, kept.state)
        state = ts.state
    assert bool(kept.terminated) and int(ts.state.time) == 0  # step reset; the kept state is the fallen one
    np.testing.assert_array_equal(kept.state.brax_state.obs, kept.next_observation)


def test_render_draws_one_state_as_an_rgb_frame(env, reset_fn, monkeypatch):
    from kitae.envs.make import offscreen_gl

    if offscreen_gl() is None:
        pytest.skip("this machine has neither an EGL nor an OSMesa library to draw MuJoCo off screen")
    monkeypatch.setenv("MUJOCO_GL", offscreen_gl())
    _, state = reset_fn(jax.random.PRNGKey(0), env.default_params)
    fallen, step = state, jax.jit(env.step_without_reset)
    for _ in range(30):  # push until the pole leans
        fallen = step(jax.random.PRNGKey(0), fallen, jnp.full((1,), 3.0, jnp.float32), env.default_params).state
    try:
        upright, leaning = env.render(state), env.render(fallen)
        small = env.render(state, width=64, height=48)
    finally:
        env.close()
    assert upright.shape == leaning.shape == (240, 320, 3) and upright.dtype == np.uint8 and small.shape == (48, 64, 3)
    assert upright.std() > 5 and np.abs(upright.astype(int) - leaning).sum() > 0  # a drawing, and the pole moved
    assert env.render_fps == pytest.approx(25.0)  # inverted_pendulum's dt is 0.04 s


def test_make_jax_env_builds_a_vectorized_brax_env():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vec = make_jax_env(f"brax:{ENV}", 3, episode_length=2)
    assert not [w for w in caught if "not actively being maintained" in str(w.message)]  # said once in docs
    assert isinstance(vec, VecJaxEnv) and vec.num_envs == 3 and vec.params == BraxParams(episode_length=2)
    assert isinstance(vec.env, BraxEnv) and vec.env.backend == "generalized"
    assert vec.single_observation_space.shape == (4,) and vec.single_action_space.shape == (1,)


def test_bad_ids_and_arguments_fail_clearly():
    names = brax_env_names()
    assert ENV in names and "ant" in names
    with pytest.raises(ValueError, match="unknown Brax environment 'not_an_env'; available: .*inverted_pendulum"):
        make_jax_env("brax:not_an_env", 2)
    with pytest.raises(ValueError, match="unknown Brax environment 'hoper'; did you mean 'hopper'\\?; available"):
        make_jax_env("brax:hoper", 2)
    # named as given: --set env_kwargs.backend=warp
    with pytest.raises(ValueError, match="^env_kwargs.backend='warp' is not allowed; allowed: generalized, positional"):
        BraxEnv(ENV, backend="warp")
    with pytest.raises(ValueError, match="^env_kwargs.episode_length=0 is not allowed; allowed: an int >= 1"):
        BraxEnv(ENV, episode_length=0)
    # Brax took n_frames=0 (dt 0: a system that never moves; --video then divided by zero)
    for n_frames in (0, -1):
        with pytest.raises(ValueError, match=f"^env_kwargs.n_frames={n_frames} is not allowed; allowed: an int >= 1"):
            make_jax_env(f"brax:{ENV}", 2, n_frames=n_frames)


# ---------------------------------------------------------------------------------------------
# Compiled runs
# ---------------------------------------------------------------------------------------------


def _agent(algo: str, n_envs: int, sets: list[str]):
    from kitae.algos.collections import get_algorithm
    from kitae.runs.presets import build_config, resolve

    agent_cls, params_cls = get_algorithm(algo)
    spec = EnvSpec.parse(f"brax:{ENV}")
    resolved = resolve(algo, params_cls, spec, sets=sets, overrides={"n_envs": n_envs})
    env = make_jax_env(spec, n_envs, episode_length=50)
    config = build_config(params_cls, spec, env, resolved)
    return agent_cls(f"test-{algo}", config), env


PPO_SETS = [
    "update_cfg.max_buffer_size=16",
    "update_cfg.batch_size=32",
    "update_cfg.n_epochs=2",
    "algo_params.hidden_sizes=[16, 16]",
]
SAC_SETS = [
    "algo_params.start_step=32",
    "algo_params.skip_steps=8",
    "update_cfg.batch_size=16",
    "update_cfg.max_buffer_size=512",
    "algo_params.policy_hidden=[16]",
    "algo_params.q_hidden=[16]",
]


@pytest.mark.slow  # compiles a whole training program with Brax physics: tens of seconds
def test_ppo_trains_in_the_compiled_loop_and_one_seed_decides_the_run():
    from kitae.loops.compiled import compiled_train

    agent, env = _agent("ppo", 2, PPO_SETS)
    first = compiled_train(agent, env, 2 * 16 * 3, seeds=[0, 0, 1])  # 3 rollouts, seeds 0, 0, 1
    assert first.env_steps == 96 and first.metrics.updated.shape == (3, 3) and first.metrics.updated.all()
    assert first.metrics.info and all(np.all(np.isfinite(v)) for v in first.metrics.info.values())
    assert first.metrics.episodes.sum() > 0  # the pole falls under a random policy within 50 steps
    params = first.state.agent_state
    pick = lambda i: jax.tree_util.tree_map(lambda x: x[i], params)
    assert _leaves_equal(pick(0), pick(1))  # the same seed twice: identical parameters
    assert not _leaves_equal(pick(0), pick(2))


@pytest.mark.slow  # compiles a whole training program with Brax physics: tens of seconds
def test_sac_trains_in_the_compiled_loop():
    from kitae.loops.compiled import compiled_train

    agent, env = _agent("sac", 1, SAC_SETS)
    result = compiled_train(agent, env, 96)
    assert result.env_steps == 96
    assert result.metrics.updated.sum() == 96 // 8 - 32 // 8 + 1  # updates from step 32 on, every 8
    assert all(np.all(np.isfinite(v)) for v in result.metrics.info.values())


@pytest.mark.slow  # compiles a whole training program with Brax physics: tens of seconds
def test_kitae_train_on_a_brax_env(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kitae.cli",
            "train",
            "ppo",
            f"brax:{ENV}",
            "--steps",
            "64",
            "--n-envs",
            "2",
            "--run-dir",
            str(run_dir),
            "--quiet",
            *sum((["--set", s] for s in PPO_SETS), []),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env"] == f"brax:{ENV}" and summary["steps"] == 64
    from kitae.envs.make import offscreen_gl

    filmed = offscreen_gl() is not None  # MuJoCo draws Brax's models off screen through EGL or OSMesa
    headless = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL")}
    evaluated = subprocess.run(
        [sys.executable, "-m", "kitae.cli", "eval", str(run_dir), "--episodes", "2", *(["--video"] if filmed else [])],
        capture_output=True,
        text=True,
        timeout=280,
        env=headless,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_episodes"] == 2 and 1.0 <= summary["eval_return"] <= 1000.0
    if filmed:  # the video plays the deterministic policy; inverted_pendulum pays 1 a step
        from moviepy import VideoFileClip

        from kitae.loops.evaluate import play_episode
        from kitae.runs.load import load_agent

        video = run_dir / "videos" / "eval-step64-episode-0.mp4"
        assert evaluated.stdout.strip().endswith(f"video: {video}")
        steps = play_episode(load_agent(run_dir), BraxEnv(ENV), seed=0)
        assert steps == int(steps) and 1 <= steps < 1000  # the untrained pole falls
        clip = VideoFileClip(str(video))
        assert clip.fps == 25 and clip.size == [320, 240]
        assert clip.n_frames == int(steps) + 1  # the reset's frame and each step's
        clip.close()
    bad = subprocess.run(
        [sys.executable, "-m", "kitae.cli", "train", "ppo", "brax:not_an_env", "--steps", "10"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "unknown Brax environment 'not_an_env'; available:" in bad.stderr
    assert "Traceback" not in bad.stderr
