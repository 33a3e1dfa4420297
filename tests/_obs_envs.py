"""Real environments with dict, image and masked observations, and a config helper, shared by
``test_masks.py`` and ``test_observations.py``."""

from __future__ import annotations

import gymnasium as gym
import jax.numpy as jnp
import numpy as np
from _agents import config_from_spaces

import kitae.config as cfg
from kitae.envs.jax_env import GymnaxEnv, VecJaxEnv
from kitae.envs.jax_wrappers import JaxTransformObservation


def config(
    observation_space,
    action_space,
    algo_params,
    *,
    n_envs=1,
    max_buffer_size=64,
    batch_size=32,
    n_epochs=2,
    n_env_steps=1_000,
    learning_rate=1e-3,
    seed=0,
) -> cfg.AlgoConfig:
    """An ``AlgoConfig`` for small smoke runs (smaller buffers and runs than ``_agents``' defaults)."""
    return config_from_spaces(
        observation_space,
        action_space,
        algo_params,
        n_envs=n_envs,
        max_buffer_size=max_buffer_size,
        batch_size=batch_size,
        n_epochs=n_epochs,
        n_env_steps=n_env_steps,
        learning_rate=learning_rate,
        seed=seed,
    )


def env_config(env, algo_params, **kwargs) -> cfg.AlgoConfig:
    """``config`` from a (Gymnasium or JAX) vector environment's single spaces."""
    return config(env.single_observation_space, env.single_action_space, algo_params, n_envs=env.num_envs, **kwargs)


# ---------------------------------------------------------------------------------------------
# Gymnasium (host loop)
# ---------------------------------------------------------------------------------------------


def split_box(env: gym.Env, parts: dict[str, slice]) -> gym.Env:
    """A 1-D ``Box`` observation split into a ``Dict`` of named ``Box`` parts (Gymnasium's
    ``TransformObservation``): CartPole's ``[x, x_dot, theta, theta_dot]`` with
    ``{"cart": slice(0, 2), "pole": slice(2, 4)}`` becomes ``{"cart": (2,), "pole": (2,)}``."""
    box = env.observation_space
    space = gym.spaces.Dict(
        {name: gym.spaces.Box(box.low[part], box.high[part], dtype=box.dtype) for name, part in parts.items()}
    )
    return gym.wrappers.TransformObservation(env, lambda obs: {name: obs[part] for name, part in parts.items()}, space)


def cartpole_dict(env: gym.Env) -> gym.Env:
    """CartPole with ``{"cart": (2,), "pole": (2,)}`` observations."""
    return split_box(env, {"cart": slice(0, 2), "pole": slice(2, 4)})


def pendulum_dict(env: gym.Env) -> gym.Env:
    """Pendulum with ``{"angle": (cos, sin), "velocity": (1,)}`` observations."""
    return split_box(env, {"angle": slice(0, 2), "velocity": slice(2, 3)})


PIXELS_SHAPE = (40, 60, 3)


def cartpole_pixels(env: gym.Env) -> gym.Env:
    """CartPole seen through its rendering: ``uint8`` frames ``(400, 600, 3)`` subsampled to
    ``(40, 60, 3)`` (every 10th pixel: cheap, no image library needed). The env must be made with
    ``render_mode="rgb_array"``."""
    env = gym.wrappers.AddRenderObservation(env, render_only=True)
    space = gym.spaces.Box(0, 255, PIXELS_SHAPE, np.uint8)
    return gym.wrappers.TransformObservation(env, lambda frame: np.ascontiguousarray(frame[::10, ::10]), space)


class IllegalActionCounter(gym.Wrapper):
    """Counts actions taken that the previous ``info["action_mask"]`` did not allow (put it UNDER
    ``ActionMaskObservation``: it reads the environment's own infos)."""

    illegal = 0
    taken = 0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._mask = np.asarray(info["action_mask"])
        return obs, info

    def step(self, action):
        type(self).taken += 1
        if not self._mask[int(action)]:
            type(self).illegal += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._mask = np.asarray(info["action_mask"])
        return obs, reward, terminated, truncated, info


# ---------------------------------------------------------------------------------------------
# JAX (compiled loop)
# ---------------------------------------------------------------------------------------------


def gymnax_dict(name: str, parts: dict[str, slice], n_envs: int) -> VecJaxEnv:
    """A gymnax environment with its 1-D observation split into a ``Dict`` (``JaxTransformObservation``)."""
    base = GymnaxEnv(name)
    box = base.observation_space
    space = gym.spaces.Dict(
        {key: gym.spaces.Box(box.low[part], box.high[part], dtype=box.dtype) for key, part in parts.items()}
    )
    env = JaxTransformObservation(base, lambda obs: {key: obs[part] for key, part in parts.items()}, space)
    return VecJaxEnv(env, n_envs)


def gymnax_cartpole_masked(n_envs: int, allowed=(0, 1)) -> VecJaxEnv:
    """gymnax CartPole with ``{"observation": obs, "action_mask": allowed}`` observations (a fixed
    mask: gymnax environments have none of their own)."""
    base = GymnaxEnv("CartPole-v1")
    mask = np.asarray(allowed, np.int8)
    space = gym.spaces.Dict(
        {
            "observation": base.observation_space,
            "action_mask": gym.spaces.Box(0, 1, (2,), np.int8),
        }
    )
    env = JaxTransformObservation(base, lambda obs: {"observation": obs, "action_mask": jnp.asarray(mask)}, space)
    return VecJaxEnv(env, n_envs)
