"""Dict and image observations: encoder choice, uint8 scaling, frame stacking, and short training
runs of every algorithm on real dict-observation environments (host and compiled loops) and on
real image environments (CartPole pixels in the host loop, MinAtar Breakout in the compiled loop)."""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _obs_envs import (
    PIXELS_SHAPE,
    cartpole_dict,
    cartpole_pixels,
    env_config,
    gymnax_dict,
    pendulum_dict,
)

from kitae.algos.collections.dqn import DQN, DQNParams
from kitae.algos.collections.ppo import PPO, PPOParams
from kitae.algos.collections.sac import SAC, SACParams
from kitae.algos.collections.td3 import TD3, TD3Params
from kitae.buffer import Experience, ReplayBuffer
from kitae.envs.make import make_jax_env, make_vec_env
from kitae.envs.wrappers import frame_stack
from kitae.loops.compiled import compiled_train
from kitae.loops.train import process_termination
from kitae.modules.encoders import DictEncoder, MinAtarCNN, NatureCNN, encoder_factory, image_to_float

# ---------------------------------------------------------------------------------------------
# Encoders
# ---------------------------------------------------------------------------------------------


def test_encoder_factory_picks_the_cnn_by_image_size():
    assert isinstance(encoder_factory(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)), NatureCNN)
    assert isinstance(encoder_factory(gym.spaces.Box(0, 1, (10, 10, 4), np.float32)), MinAtarCNN)
    assert isinstance(encoder_factory(gym.spaces.Box(0, 255, (36, 35, 3), np.uint8)), MinAtarCNN)
    with pytest.raises(ValueError, match=r"must be >= 3.*MinAtarCNN"):
        encoder_factory(gym.spaces.Box(0, 255, (2, 8, 3), np.uint8))
    with pytest.raises(ValueError, match=r"looks channels-first.*transpose"):
        encoder_factory(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8))  # EnvPool's Atari layout


def test_dict_encoder_never_encodes_the_action_mask():
    space = gym.spaces.Dict(
        {
            "observation": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
            "action_mask": gym.spaces.Box(0, 1, (5,), np.int8),
        }
    )
    encoder = encoder_factory(space, hidden=())
    assert isinstance(encoder, DictEncoder) and tuple(encoder.keys) == ("observation",)
    obs = {"observation": jnp.ones((2, 3)), "action_mask": jnp.ones((2, 5), jnp.int8)}
    np.testing.assert_array_equal(encoder.apply({}, obs), np.ones((2, 3)))  # identity MLP: the mask is not in it
    with pytest.raises(ValueError, match="nothing to encode"):
        encoder_factory(gym.spaces.Dict({"action_mask": gym.spaces.Box(0, 1, (5,), np.int8)}))


def test_image_to_float_scales_uint8_only():
    np.testing.assert_allclose(image_to_float(jnp.array([0, 51, 255], jnp.uint8)), [0.0, 0.2, 1.0], rtol=1e-6)
    np.testing.assert_array_equal(image_to_float(jnp.array([True, False])), [1.0, 0.0])  # 0/1 planes stay 0/1
    np.testing.assert_array_equal(image_to_float(jnp.array([0.5, 2.0])), [0.5, 2.0])


def test_minatar_cnn_shapes_and_uint8_scaling():
    cnn = MinAtarCNN()
    frames = jax.random.randint(jax.random.key(0), (2, 5, 10, 10, 4), 0, 256).astype(jnp.uint8)
    params = cnn.init(jax.random.key(1), jnp.zeros((1, 10, 10, 4)))
    assert params["params"]["Conv_0"]["kernel"].shape == (3, 3, 4, 16)
    assert params["params"]["Dense_0"]["kernel"].shape == (8 * 8 * 16, 128)
    out = cnn.apply(params, frames)
    assert out.shape == (2, 5, 128)
    np.testing.assert_allclose(out, cnn.apply(params, frames.astype(jnp.float32) / 255.0), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Frame stacking
# ---------------------------------------------------------------------------------------------


class _Counter(gym.Env):
    """Frames filled with the step count (uint8), of any shape."""

    def __init__(self, shape):
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.shape = shape

    def _frame(self):
        frame = np.full(self.shape, self.t, np.uint8)
        if len(self.shape) == 3:  # channel c holds 10 * c + t, to check the channel order
            frame = frame + (10 * np.arange(self.shape[-1], dtype=np.uint8))
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        return self._frame(), 0.0, False, False, {}


def test_frame_stack_is_channels_last_oldest_frame_first():
    env = frame_stack(_Counter((4, 5, 2)), 3)
    assert env.observation_space.shape == (4, 5, 6) and env.observation_space.dtype == np.uint8
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs[0, 0], [0, 10, 0, 10, 0, 10])  # padded with the reset frame
    env.step(0)
    obs, *_ = env.step(0)
    assert obs.shape == (4, 5, 6) and obs.dtype == np.uint8
    np.testing.assert_array_equal(obs[3, 4], [0, 10, 1, 11, 2, 12])  # frame f, channel c at f * C + c

    gray = frame_stack(_Counter((4, 5)), 2)
    assert gray.observation_space.shape == (4, 5, 2)
    gray.reset(seed=0)
    np.testing.assert_array_equal(gray.step(0)[0][0, 0], [0, 1])
    vectors = frame_stack(_Counter((3,)), 2)
    vectors.reset(seed=0)
    np.testing.assert_array_equal(vectors.step(0)[0], [0, 0, 0, 1, 1, 1])


def test_frame_stack_rejects_bad_inputs():
    with pytest.raises(ValueError, match="frame_stack=0 is not allowed"):
        frame_stack(_Counter((3,)), 0)
    with pytest.raises(ValueError, match="needs a Box observation space"):
        frame_stack(gym.make("Taxi-v4"), 4)
    with pytest.raises(ValueError, match="frame_stack=0 is not allowed"):
        make_vec_env("CartPole-v1", 1, frame_stack=0)
    with pytest.raises(ValueError, match="wrappers contains 3"):
        make_vec_env("CartPole-v1", 1, wrappers=[3])


def test_make_vec_env_stacks_frames():
    env = make_vec_env("CartPole-v1", 2, frame_stack=4)
    assert env.single_observation_space.shape == (16,)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 16)
    np.testing.assert_array_equal(obs[:, :4], obs[:, 12:])  # reset padding: four copies
    env.close()


# ---------------------------------------------------------------------------------------------
# Host-loop plumbing for dict observations
# ---------------------------------------------------------------------------------------------


def test_process_termination_substitutes_final_dict_observations():
    next_obs = {"a": np.zeros((3, 2), np.float32), "b": np.zeros((3,), np.int64)}
    final = np.full(3, None, object)
    final[1] = {"a": np.array([5.0, 6.0], np.float32), "b": np.int64(7)}
    infos = {"final_obs": final, "_final_obs": np.array([False, True, False])}
    real = process_termination(10, next_obs, infos, None)
    np.testing.assert_array_equal(real["a"], [[0, 0], [5, 6], [0, 0]])
    np.testing.assert_array_equal(real["b"], [0, 7, 0])
    assert np.all(next_obs["a"] == 0)  # the environment's batch is not modified


def test_a_single_agent_dict_buffer_counts_transitions_per_environment():
    buffer = ReplayBuffer(8)
    obs = {"x": np.zeros((4, 2), np.float32), "y": np.zeros((4, 3), np.float32), "z": np.zeros((4,), np.int32)}
    buffer.add(
        Experience(
            obs,
            np.zeros(4, np.int32),
            np.zeros(4, np.float32),
            np.zeros(4, bool),
            obs,
            np.zeros(4, np.float32),
            np.zeros(4, bool),
        )
    )
    assert buffer.n_transitions == 4  # not 4 * 3 keys


# ---------------------------------------------------------------------------------------------
# Dict observations: every algorithm, both loops
# ---------------------------------------------------------------------------------------------


def _algo(algo: str, env, n_env_steps: int):
    """A small agent of each algorithm for ``env`` (updates within a few hundred steps)."""
    if algo == "ppo":
        return PPO(
            "dict",
            env_config(env, PPOParams(hidden_sizes=(32,)), max_buffer_size=16, batch_size=32, n_env_steps=n_env_steps),
            run_dir="runs/dict",
        )
    if algo == "dqn":
        params = DQNParams(start_step=64, skip_steps=16, hidden=(32,))
        return DQN("dict", env_config(env, params, max_buffer_size=128, n_env_steps=n_env_steps), run_dir="runs/dict")
    if algo == "sac":
        params = SACParams(start_step=64, skip_steps=16, policy_hidden=(32,), q_hidden=(32,))
        return SAC("dict", env_config(env, params, max_buffer_size=128, n_env_steps=n_env_steps), run_dir="runs/dict")
    params = TD3Params(start_step=64, skip_steps=16, actor_hidden=(32,), critic_hidden=(32,))
    return TD3("dict", env_config(env, params, max_buffer_size=128, n_env_steps=n_env_steps), run_dir="runs/dict")


@pytest.mark.parametrize("algo", ["ppo", "dqn", "sac", "td3"])
def test_dict_observations_train_in_the_host_loop(algo):
    continuous = algo in ("sac", "td3")
    env = make_vec_env(
        "Pendulum-v1" if continuous else "CartPole-v1", 4, wrappers=[pendulum_dict if continuous else cartpole_dict]
    )
    assert isinstance(env.single_observation_space, gym.spaces.Dict)
    agent = _algo(algo, env, 256)
    stats = agent.train(env, 256)
    assert stats.n_updates >= 2
    stored = agent.buffer.state.data.observation
    assert set(stored) == set(env.single_observation_space.spaces)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree_util.tree_leaves(agent.state))


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_dict_observations_train_in_the_compiled_loop(algo):
    if algo == "sac":
        env = gymnax_dict("Pendulum-v1", {"angle": slice(0, 2), "velocity": slice(2, 3)}, 4)
    else:
        env = gymnax_dict("CartPole-v1", {"cart": slice(0, 2), "pole": slice(2, 4)}, 4)
    agent = _algo(algo, env, 256)
    run = compiled_train(agent, env, 256)
    assert int(np.sum(run.metrics.updated)) >= 2
    assert set(run.state.buffer.data.next_observation) == set(env.single_observation_space.spaces)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree_util.tree_leaves(agent.state))


# ---------------------------------------------------------------------------------------------
# Images: CartPole pixels (host loop, uint8, frame stacking) and MinAtar (compiled loop)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_pixel_observations_train_in_the_host_loop_and_stay_uint8(algo):
    env = make_vec_env(
        "CartPole-v1", 2, env_kwargs={"render_mode": "rgb_array"}, wrappers=[cartpole_pixels], frame_stack=2
    )
    height, width, channels = PIXELS_SHAPE
    assert env.single_observation_space.shape == (height, width, 2 * channels)
    assert env.single_observation_space.dtype == np.uint8
    if algo == "ppo":
        # one epoch: a convolution's backward pass is most of this test's time (it only has to run)
        config = env_config(env, PPOParams(), max_buffer_size=16, batch_size=16, n_epochs=1)
        agent = PPO("pixels", config, run_dir="runs/px")
    else:
        params = DQNParams(start_step=32, skip_steps=16)
        agent = DQN("pixels", env_config(env, params, max_buffer_size=64, batch_size=16), run_dir="runs/px")
    kernels = [x.shape for x in jax.tree_util.tree_leaves(agent.state)]
    assert (8, 8, 2 * channels, 32) in kernels  # NatureCNN's first convolution, picked by size
    stats = agent.train(env, 64)
    assert stats.n_updates >= 2
    stored = agent.buffer.state.data.observation
    assert stored.dtype == np.uint8 and stored.shape[-3:] == (height, width, 2 * channels)


def test_minatar_trains_in_the_compiled_loop():
    env = make_jax_env("gymnax:Breakout-MinAtar", 4)
    assert env.single_observation_space.shape == (10, 10, 4)
    agent = PPO("minatar", env_config(env, PPOParams(), max_buffer_size=16, batch_size=32), run_dir="unused")
    params = agent.state.actor_critic.params["params"]
    assert params["policy_encoder"]["Conv_0"]["kernel"].shape == (3, 3, 4, 16)  # MinAtarCNN, picked by size
    run = compiled_train(agent, env, 4 * 16 * 3)
    assert int(np.sum(run.metrics.updated)) == 3
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree_util.tree_leaves(agent.state))


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_board_observation_trains_in_the_compiled_loop(algo):
    """bsuite's Catch observes a (10, 5) int32 board: flattened into the MLP (``FlattenMLP``), in the
    rollout and in the replay buffer."""
    env = make_jax_env("gymnax:Catch-bsuite", 4)
    assert env.single_observation_space.shape == (10, 5)
    if algo == "ppo":
        agent = PPO("catch", env_config(env, PPOParams(), max_buffer_size=16, batch_size=32), run_dir="unused")
        network = agent.state.actor_critic.params
    else:
        params = DQNParams(start_step=32, skip_steps=4)
        agent = DQN("catch", env_config(env, params, max_buffer_size=64, batch_size=32), run_dir="unused")
        network = agent.state.qvalue.params
    first = [x.shape for x in jax.tree_util.tree_leaves(network) if x.ndim == 2 and x.shape[0] == 50]
    assert first, "a first layer reading the board flattened (50 inputs)"
    run = compiled_train(agent, env, 4 * 16 * 3)
    assert int(np.sum(run.metrics.updated)) >= 3
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree_util.tree_leaves(agent.state))


_RENDER_SCRIPT = """
import os, sys
from kitae.envs.make import make_vec_env
env = make_vec_env("CartPole-v1", 1, env_kwargs={"render_mode": "human"})  # a window: SDL left alone
env.close()
assert "SDL_VIDEODRIVER" not in os.environ, os.environ["SDL_VIDEODRIVER"]
env = make_vec_env("CartPole-v1", 1, env_kwargs={"render_mode": "rgb_array"})
env.reset(seed=0)
frame = env.envs[0].render()
env.close()
print(frame.shape, os.environ.get("SDL_AUDIODRIVER"), os.environ.get("SDL_VIDEODRIVER"))
"""


@pytest.mark.parametrize("audio", [None, "disk"])
def test_a_rendering_environment_renders_off_screen_and_keeps_the_users_sdl_settings(audio):
    """``render_mode="rgb_array"``: pygame starts with SDL's dummy drivers, so a headless machine
    prints no ALSA or XDG_RUNTIME_DIR errors; a driver the user chose is kept, and ``"human"``
    (a window) leaves the drivers alone."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SDL_", "PYGAME_"))}
    if audio is not None:
        env["SDL_AUDIODRIVER"] = audio
    done = subprocess.run([sys.executable, "-c", _RENDER_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(400,", "600,", "3)", audio or "dummy", "dummy"]
    assert "ALSA" not in done.stderr and "XDG_RUNTIME_DIR" not in done.stderr, done.stderr
